"""The volume code's pure parts: the AtomicWriter layout and its updates, hostPath type checks, the
subPath escape checks (before any mount), the payloads of configMap/secret/downwardAPI/projected volumes
and the token refresh rule. API objects come from a small in-memory stand-in for the lightkube client."""
from __future__ import annotations

import base64
import datetime
import os
import socket
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.core.selector import build_selector
from lightkube.models.certificates_v1 import ClusterTrustBundleSpec
from lightkube.models.meta_v1 import ObjectMeta, Status
from lightkube.resources.certificates_v1 import ClusterTrustBundle
from lightkube.resources.core_v1 import ConfigMap, Secret

from pykubelet.api.podmodel import Pod, Volume, VolumeSource, parse_pod
from pykubelet.config import Settings
from pykubelet.volumes import atomic, hostpath, mount, objects, ownership, subpath, trustbundles
from pykubelet.volumes.errors import ContainerConfigError, VolumeError
from pykubelet.volumes.manager import VolumeManager
from pynode_os import mountinfo
from tests.kit.trust_anchors import ca_pem


class FakeClient:
    """configMaps and secrets by (kind, namespace, name); TokenRequests answered with a counter."""

    def __init__(self, objs: dict | None = None, ttl: int = 3600, clock=lambda: 1_000_000.0,
                 bundles: dict[str, list] | None = None) -> None:
        self.objs = objs or {}
        self.bundles = bundles or {}
        self.tokens = 0
        self.ttl, self.clock = ttl, clock

    def get(self, kind, name, namespace=None):
        key = (kind.__name__, namespace, name)
        if key not in self.objs:
            raise ApiError(status=Status(code=404, message=f"{name} not found"))
        return self.objs[key]

    def list(self, kind, labels=None):
        """ClusterTrustBundles: what the API server would answer to the label selector it receives."""
        assert kind is ClusterTrustBundle
        return self.bundles[build_selector(labels or [])]

    def create(self, request, name, namespace=None):
        self.tokens += 1
        self.last_request = (request, name, namespace)
        expires = datetime.datetime.fromtimestamp(self.clock() + self.ttl, datetime.UTC)
        return SimpleNamespace(status=SimpleNamespace(token=f"token-{self.tokens}", expirationTimestamp=expires),
                               spec=SimpleNamespace(expirationSeconds=self.ttl))


def cm(name: str, data: dict, binary: dict | None = None, namespace: str = "ns"):
    return {("ConfigMap", namespace, name): ConfigMap(data=data, binaryData=binary)}


def sec(name: str, data: dict, namespace: str = "ns"):
    return {("Secret", namespace, name): Secret(data={k: base64.b64encode(v).decode() for k, v in data.items()})}


RAW: dict = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"b": "2", "a": 'q"x'}},
             "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                      "containers": [{"name": "c", "image": "i",
                                      "resources": {"limits": {"memory": "64Mi", "cpu": "250m"}}}]}}
POD = parse_pod(RAW)


def pod_with(*containers: dict, **spec) -> Pod:
    """RAW with `spec`'s fields and, if given, `containers` (an image each) in place of its own, parsed."""
    if containers:
        spec["containers"] = [{"image": "i", **c} for c in containers]
    return parse_pod({**RAW, "spec": {**RAW["spec"], **spec}})


def volume(raw: dict) -> Volume:
    return pod_with(volumes=[raw]).spec.volumes[0]


def source(kind: str, raw: dict) -> VolumeSource:
    return volume({"name": "v", kind: raw}).source


# --- AtomicWriter ----------------------------------------------------------------------------------------

def test_atomic_write_layout_and_modes(tmp_path):
    assert atomic.write(tmp_path, {"a": (b"1", 0o644), "dir/b": (b"2", 0o600)})
    data = tmp_path / atomic.DATA
    assert data.is_symlink() and os.readlink(data).startswith("..20")
    assert os.readlink(tmp_path / "a") == "..data/a" and os.readlink(tmp_path / "dir") == "..data/dir"
    assert (tmp_path / "dir" / "b").read_bytes() == b"2"
    assert stat.S_IMODE((tmp_path / "dir" / "b").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o644
    assert not (tmp_path / atomic.DATA_TMP).exists()


def test_atomic_write_is_a_noop_when_unchanged_and_swaps_on_change(tmp_path):
    atomic.write(tmp_path, {"a": (b"1", 0o644), "b": (b"2", 0o644)})
    first = os.readlink(tmp_path / atomic.DATA)
    assert not atomic.write(tmp_path, {"a": (b"1", 0o644), "b": (b"2", 0o644)})
    assert atomic.write(tmp_path, {"a": (b"1", 0o600), "b": (b"2", 0o644)})  # a mode change is a change
    assert atomic.write(tmp_path, {"a": (b"new", 0o644), "c": (b"3", 0o644)})
    assert os.readlink(tmp_path / atomic.DATA) != first and not (tmp_path / first).exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("..")) == ["a", "c"]
    assert (tmp_path / "a").read_bytes() == b"new"
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("..20")]) == 1


@pytest.mark.parametrize("path", ["/abs", "../up", "a/../../b", "..hidden", ""])
def test_atomic_write_refuses_paths_outside_or_reserved(tmp_path, path):
    with pytest.raises(VolumeError):
        atomic.write(tmp_path / "v", {path: (b"x", 0o644)})
    assert not (tmp_path / "up").exists()


# --- hostPath -------------------------------------------------------------------------------------------

def test_hostpath_types(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    assert hostpath.check("spec.volumes[0].hostPath", str(tmp_path), "Directory") == tmp_path
    assert hostpath.check("spec.volumes[0].hostPath", str(f), "File") == f
    assert hostpath.check("spec.volumes[0].hostPath", "/nonexistent/x", None) == Path("/nonexistent/x")
    made = hostpath.check("f", str(tmp_path / "new" / "dir"), "DirectoryOrCreate")
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o755
    created = hostpath.check("f", str(tmp_path / "sub" / "file"), "FileOrCreate")
    assert created.is_file() and created.read_text() == ""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        assert hostpath.check("f", str(tmp_path / "sock"), "Socket")


def test_hostpath_mismatch_names_field_and_kind(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(VolumeError, match=r"spec.volumes\[2\].hostPath: .* is not a socket, it's a file"):
        hostpath.check("spec.volumes[2].hostPath", str(f), "Socket")
    with pytest.raises(VolumeError, match="is not a directory, it's a file"):
        hostpath.check("v", str(f), "DirectoryOrCreate")
    with pytest.raises(VolumeError, match="is not a file: No such file"):
        hostpath.check("v", str(tmp_path / "missing"), "File")
    with pytest.raises(VolumeError, match=r"v.type: 'Weird' is an invalid hostPath type"):
        hostpath.check("v", str(f), "Weird")


# --- subPath --------------------------------------------------------------------------------------------

@pytest.fixture
def binds(monkeypatch):
    """Records bind mounts instead of making them (mounting needs root)."""
    made: list[tuple[str, Path, str]] = []
    monkeypatch.setattr(mount, "bind", lambda source, target: made.append((source, target,
                                                                          os.readlink(source))))
    monkeypatch.setattr(mount, "fs_type", lambda path: None)
    return made


def test_subpath_escape_through_symlink_is_refused(tmp_path, binds):
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "escape").symlink_to("/")
    (volume / "inner").symlink_to("sub")
    (volume / "sub").mkdir()
    with pytest.raises(ContainerConfigError, match=r"f.subPath: subPath 'escape' resolves to /, outside volume"):
        subpath.bind_subpath("f.subPath", "data", volume, "escape", tmp_path / "t0")
    with pytest.raises(ContainerConfigError, match=r"must not contain '\.\.'"):
        subpath.bind_subpath("f.subPath", "data", volume, "sub/../../x", tmp_path / "t1")
    with pytest.raises(ContainerConfigError, match="must be a relative path"):
        subpath.bind_subpath("f.subPathExpr", "data", volume, "/etc", tmp_path / "t2")
    assert binds == []
    # a symlink that stays inside the volume is followed, as upstream's
    assert subpath.bind_subpath("f", "data", volume, "inner", tmp_path / "t3") == tmp_path / "t3"
    assert binds[0][2] == str(volume / "sub") and (tmp_path / "t3").is_dir()


def test_subpath_missing_is_made_and_a_file_gets_a_file_target(tmp_path, binds):
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "f").write_text("x")
    subpath.bind_subpath("f", "data", volume, "a/b", tmp_path / "t")
    assert (volume / "a" / "b").is_dir() and binds[-1][2] == str(volume / "a" / "b")
    subpath.bind_subpath("f", "data", volume, "f", tmp_path / "tf")
    assert (tmp_path / "tf").is_file()


def test_subpath_missing_gets_the_volume_roots_mode_whatever_the_umask(tmp_path, binds):
    """As the kubelet's SafeMakeDir with the volume's mode: under an emptyDir given to an fsGroup on tmpfs
    (03777) each directory made is 03777 (spec: EmptyDir volumes when FSGroup is specified "nonexistent volume
    subPath should have the correct mode and owner using FSGroup" wants dgtrwxrwxrwx); one that exists is
    left as it is."""
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "kept").mkdir(mode=0o700)
    os.chmod(volume, 0o3777)
    old = os.umask(0o077)
    try:
        subpath.bind_subpath("f", "data", volume, "a/b", tmp_path / "t")
        subpath.bind_subpath("f", "data", volume, "kept/c", tmp_path / "t2")
    finally:
        os.umask(old)
    for made in ("a", "a/b", "kept/c"):
        assert stat.S_IMODE(os.stat(volume / made).st_mode) == 0o3777, made
    assert stat.S_IMODE(os.stat(volume / "kept").st_mode) == 0o700


def test_subpath_symlink_swapped_in_is_refused(tmp_path):
    """The element-wise open: a symlink at any step (put there after resolution) is refused."""
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "link").symlink_to("/")
    fd = os.open(volume, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(ContainerConfigError, match="element 'link' is a symlink"):
            subpath._walk(fd, ("link",), "f", "link", create=None)
    finally:
        os.close(fd)


# --- mountinfo ------------------------------------------------------------------------------------------

def test_mounts_under_reads_mountinfo(tmp_path, monkeypatch):
    base = tmp_path / "root dir"
    info = (
        f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        f"2 1 0:5 / {str(base).replace(' ', chr(92) + '040')}/pods/u/v rw shared:1 - tmpfs tmpfs rw\n"
        f"3 2 0:6 / {str(base).replace(' ', chr(92) + '040')}/pods/u/v/sub rw - tmpfs tmpfs rw\n"
        f"4 1 0:7 / {str(tmp_path).replace(' ', chr(92) + '040')}/root\\040dirx rw - tmpfs tmpfs rw\n")
    monkeypatch.setattr(mountinfo, "read", lambda: mountinfo.parse(info))
    found = mount.mounts_under(base)
    assert found == [(base / "pods/u/v/sub", "tmpfs"), (base / "pods/u/v", "tmpfs")]
    assert mount.fs_type(base / "pods/u/v") == "tmpfs" and mount.fs_type(base / "pods") is None


# --- payloads -------------------------------------------------------------------------------------------

def manager(tmp_path, objs=None, **kw) -> VolumeManager:
    return VolumeManager(FakeClient(objs, **kw), Settings(root_dir=tmp_path, node_ip="10.0.0.1"),
                         allocatable=lambda: {"cpu": "4", "memory": "8Gi"})


def test_configmap_payload_items_modes_optional(tmp_path):
    m = manager(tmp_path, {**cm("c", {"k1": "v1", "k2": "v2"}, {"bin": base64.b64encode(b"\0\1").decode()})})
    assert m._payload(POD, source("configMap", {"name": "c", "defaultMode": 0o640}), "f") == {
        "k1": (b"v1", 0o640), "k2": (b"v2", 0o640), "bin": (b"\0\1", 0o640)}
    assert m._payload(POD, source("configMap", {"name": "c", "items": [{"key": "k2", "path": "x/y", "mode": 0o400}]}),
                      "f") == {"x/y": (b"v2", 0o400)}
    with pytest.raises(VolumeError, match="configmap references non-existent config key: nope"):
        m._payload(POD, source("configMap", {"name": "c", "items": [{"key": "nope", "path": "p"}]}), "f")
    assert m._payload(POD, source("configMap", {"name": "c", "optional": True,
                                         "items": [{"key": "nope", "path": "p"}]}), "f") == {}
    with pytest.raises(objects.ObjectError, match='configmap "gone" not found'):
        m._payload(POD, source("configMap", {"name": "gone"}), "f")
    assert m._payload(POD, source("configMap", {"name": "gone", "optional": True}), "f") == {}


def test_secret_downward_and_projected_payloads(tmp_path):
    m = manager(tmp_path, {**sec("s", {"pw": b"x"}), **cm("kube-root-ca.crt", {"ca.crt": "CA"})})
    assert m._payload(POD, source("secret", {"secretName": "s", "defaultMode": 0o400}), "f") == {"pw": (b"x", 0o400)}
    items = [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
             {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory",
                                                  "divisor": "1Mi"}},
             {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "requests.cpu",
                                                  "divisor": "1m"}}]
    assert m._payload(POD, source("downwardAPI", {"items": items}), "f") == {
        "labels": (b'a="q\\"x"\nb="2"', 0o644), "mem": (b"64", 0o644), "cpu": (b"250", 0o644)}
    sources = [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
               {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
               {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]
    assert m._payload(POD, source("projected", {"sources": sources, "defaultMode": 0o644}), "f") == {
        "token": (b"token-1", 0o644), "ca.crt": (b"CA", 0o644), "namespace": (b"ns", 0o644)}
    request, account, namespace = m.client.last_request
    assert (account, namespace) == ("sa", "ns") and request.spec.expirationSeconds == 3607
    assert request.spec.boundObjectRef.kind == "Pod" and request.spec.boundObjectRef.uid == "u-1"
    with pytest.raises(VolumeError, match=r"f.sources\[0\]: \['futureSource'\] projections are not"):
        m._payload(POD, source("projected", {"sources": [{"futureSource": {}}]}), "f")


def bundle(name: str, signer: str, pems: list[bytes], labels: dict | None = None):
    return ClusterTrustBundle(metadata=ObjectMeta(name=name, labels=labels),
                              spec=ClusterTrustBundleSpec(signerName=signer, trustBundle=b"".join(pems).decode()))


def test_trust_bundle_projection_is_each_anchor_once(tmp_path):
    """By name, or the bundles of a signer its selector matches: one PEM file, each certificate once in the
    order of its DER bytes (so a sync that reads the same anchors writes nothing), a missing bundle an error
    unless optional (then an empty file), and with an fsGroup mode 0600 as upstream's."""
    a, b, c = ca_pem("a"), ca_pem("b"), ca_pem("c")
    one, two = bundle("s.one", "example.com/s", [b, a], {"alive": "true"}), bundle("s.two", "example.com/s", [c, a])
    other_pem = ca_pem("d")
    other = bundle("other", "example.com/other", [other_pem], {"alive": "true"})
    client = FakeClient({("ClusterTrustBundle", None, x.metadata.name): x for x in (one, two, other)}, bundles={
        "": [one, two, other], "alive=true": [one, other], "!alive,x notin (1,2)": [two], "alive=no": [other]})
    m = VolumeManager(client, Settings(root_dir=tmp_path, node_ip="10.0.0.1"), allocatable=dict)

    def file(*ctbs: dict, pod: Pod = POD, mode: int = 0o644) -> bytes:
        payload = m._payload(pod, source("projected", {"sources": [{"clusterTrustBundle": {"path": "ca.pem", **x}}
                                                                   for x in ctbs]}), "f")
        assert payload["ca.pem"][1] == mode
        return payload["ca.pem"][0]

    def ordered(*pems: bytes) -> bytes:
        ders = sorted(trustbundles.certificates(p)[0] for p in pems)
        return b"".join(p for d in ders for p in pems if trustbundles.certificates(p) == [d])

    assert file({"name": "s.one"}) == ordered(a, b)  # cryptography writes PEM as Go does: byte for byte
    assert file({"signerName": "example.com/s", "labelSelector": {}}) == ordered(a, b, c)
    assert file({"signerName": "example.com/s", "labelSelector": {"matchLabels": {"alive": "true"}}}) == ordered(a, b)
    assert file({"signerName": "example.com/other", "labelSelector": {"matchLabels": {"alive": "true"}}}) == other_pem
    assert file({"signerName": "example.com/s", "labelSelector": {"matchExpressions": [
        {"key": "alive", "operator": "DoesNotExist"}, {"key": "x", "operator": "NotIn", "values": ["1", "2"]}]}}) \
        == ordered(a, c)
    assert file({"signerName": "example.com/s", "optional": True}) == b""  # no selector matches no bundle
    assert file({"name": "gone", "optional": True}) == b""
    with pytest.raises(objects.ObjectError, match=r'clustertrustbundle\.certificates\.k8s\.io "gone" not found'):
        file({"name": "gone"})
    with pytest.raises(objects.ObjectError, match="signerName and labelSelector matched zero ClusterTrustBundles"):
        file({"signerName": "example.com/s", "labelSelector": {"matchLabels": {"alive": "no"}}})
    assert file({"name": "s.two"}, pod=pod_with(securityContext={"fsGroup": 1234}), mode=0o600) == ordered(a, c)


def test_projected_volume_of_every_component_as_the_combined_spec(tmp_path, monkeypatch):
    """[sig-storage] Projected combined "should project all components that make up the projection API": one
    projected volume of a downwardAPI item, a whole secret and a whole configMap (the API server's defaultMode
    420), set up by a pod sync, holds the three files through ..data with the default mode, and the pod's
    container mounts it read-only (the spec's volumeMount says readOnly false, as upstream ignores for
    projected)."""
    monkeypatch.setattr(mount, "fs_type", lambda path: "tmpfs")  # the tmpfs is the root tests': here a directory
    m = manager(tmp_path, {**sec("secret-projected-all-test-volume-1", {"secret-data": b"secret-value-1"}),
                           **cm("configmap-projected-all-test-volume-1", {"configmap-data": "configmap-value-1"})})
    sources = [{"downwardAPI": {"items": [{"path": "podname",
                                           "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}]}},
               {"secret": {"name": "secret-projected-all-test-volume-1"}},
               {"configMap": {"name": "configmap-projected-all-test-volume-1"}}]
    pod = pod_with({"name": "projected-all-volume-test", "volumeMounts": [
        {"name": "podinfo", "mountPath": "/all", "readOnly": False}]},
        volumes=[{"name": "podinfo", "projected": {"sources": sources, "defaultMode": 420}}], restartPolicy="Never")
    m.mount_pod(pod)
    path = m.volume_path(pod, pod.spec.volumes[0])
    assert {f: (path / f).read_text() for f in ("podname", "secret-data", "configmap-data")} == {
        "podname": "p", "secret-data": "secret-value-1", "configmap-data": "configmap-value-1"}
    assert all(os.readlink(path / f) == f"..data/{f}" and stat.S_IMODE(os.stat(path / f).st_mode) == 0o644
               for f in ("podname", "secret-data", "configmap-data"))
    (out,) = m.mounts(pod, pod.spec.containers[0], {})
    assert (out.container_path, out.host_path, out.readonly) == ("/all", str(path), True)


def test_volume_paths_follow_the_kubelet_layout(tmp_path):
    m = manager(tmp_path)
    plugins = tmp_path / "pods/u-1/volumes"
    assert m.volume_path(POD, volume({"name": "d", "emptyDir": {}})) == plugins / "kubernetes.io~empty-dir/d"
    assert m.volume_path(POD, volume({"name": "s", "secret": {}})) == plugins / "kubernetes.io~secret/s"
    assert m.volume_path(POD, volume({"name": "h", "hostPath": {"path": "/srv"}})) == Path("/srv")
    assert m.volume_path(POD, volume({"name": "x"})) == plugins / "kubernetes.io~empty-dir/x"
    with pytest.raises(VolumeError, match="persistentVolumeClaim volumes are not supported"):
        m.volume_path(POD, volume({"name": "x", "persistentVolumeClaim": {"claimName": "c"}}))


def test_mounts_readonly_propagation_and_unknown_volume(tmp_path):
    m = manager(tmp_path)
    volumes = [{"name": "cfg", "configMap": {"name": "c"}}, {"name": "h", "hostPath": {"path": "/srv"}}]
    pod = pod_with({"name": "c", "volumeMounts": [
        {"name": "cfg", "mountPath": "/cfg"},
        {"name": "h", "mountPath": "/h", "mountPropagation": "HostToContainer"},
        {"name": "h", "mountPath": "/h2", "readOnly": True}]}, volumes=volumes)
    out = m.mounts(pod, pod.spec.containers[0], {})
    assert [(x.container_path, x.host_path, x.readonly, x.propagation) for x in out] == [
        ("/cfg", str(tmp_path / "pods/u-1/volumes/kubernetes.io~configmap/cfg"), True, 0),
        ("/h", "/srv", False, 1), ("/h2", "/srv", True, 0)]
    with pytest.raises(ContainerConfigError, match=r"spec.containers\[0\].volumeMounts\[0\].name: volume 'x'"):
        unknown = pod_with({"name": "c", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}, volumes=volumes)
        m.mounts(unknown, unknown.spec.containers[0], {})


def test_an_image_volume_is_the_runtimes_to_mount_read_only(tmp_path):
    """Nothing on the node's side (no directory, no host path): the CRI mount names the image the sync pulled,
    read-only whatever the volumeMount says, its subPath (subPathExpr expanded) as the image_sub_path."""
    m = manager(tmp_path)
    pod = pod_with({"name": "c", "env": [{"name": "DIR", "value": "etc"}], "volumeMounts": [
        {"name": "img", "mountPath": "/volume", "readOnly": False},
        {"name": "img", "mountPath": "/etc-of-image", "subPathExpr": "$(DIR)"}]},
        volumes=[{"name": "img", "image": {"reference": "registry.example/kitten:1.8"}}])
    m.mount_pod(pod)
    assert not (tmp_path / "pods").exists()
    out = m.mounts(pod, pod.spec.containers[0], {"DIR": "etc"}, {"img": "sha256:kitten"})
    assert [(x.container_path, x.host_path, x.readonly, x.image.image, x.image.user_specified_image,
             x.image_sub_path) for x in out] == [
        ("/volume", "", True, "sha256:kitten", "registry.example/kitten:1.8", ""),
        ("/etc-of-image", "", True, "sha256:kitten", "registry.example/kitten:1.8", "etc")]
    with pytest.raises(ContainerConfigError, match=r"image volume 'registry\.example/kitten:1\.8' has not been pulled"):
        m.mounts(pod, pod.spec.containers[0], {"DIR": "etc"})
    for sub in ("../up", "/abs", "a/../../b"):
        with pytest.raises(ContainerConfigError, match=r"volumeMounts\[1\].subPathExpr: .* must be a relative path"):
            m.mounts(pod, pod.spec.containers[0], {"DIR": sub}, {"img": "sha256:kitten"})


# --- tokens ---------------------------------------------------------------------------------------------

def test_token_refreshed_at_80_percent_of_its_life():
    now = [1_000_000.0]
    client = FakeClient(ttl=1000, clock=lambda: now[0])
    tokens = objects.TokenManager(client, clock=lambda: now[0])
    assert tokens.get(POD, "sa", "", 1000) == "token-1"
    now[0] += 799
    assert tokens.get(POD, "sa", "", 1000) == "token-1"
    assert tokens.get(POD, "sa", "aud", 1000) == "token-2"  # another audience, another token
    now[0] += 2
    assert tokens.get(POD, "sa", "", 1000) == "token-3"
    tokens.forget("u-1")
    assert tokens.get(POD, "sa", "", 1000) == "token-4"


def test_projected_token_file_is_refreshed_at_80_percent_of_its_life(tmp_path, monkeypatch):
    """What the container reads, not only the cache: every pod sync sets the projected volume up again, and
    once 80% of the token's life has passed its file holds a new token (the API server's shortest life is
    600 s, so the clock is injected)."""
    now = [1_000_000.0]
    m = manager(tmp_path, ttl=1000, clock=lambda: now[0])
    m.tokens = objects.TokenManager(m.client, clock=lambda: now[0])
    monkeypatch.setattr(mount, "fs_type", lambda path: "tmpfs")  # the tmpfs is the root tests': here a directory
    pod = pod_with(volumes=[{"name": "sa", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 1000}}]}}])
    token = m.volume_path(pod, pod.spec.volumes[0]) / "token"
    m.mount_pod(pod)
    assert token.read_text() == "token-1"
    now[0] += 799
    m.mount_pod(pod)
    assert token.read_text() == "token-1" and m.client.tokens == 1
    now[0] += 2
    m.mount_pod(pod)
    assert token.read_text() == "token-2"
    request, _, _ = m.client.last_request
    assert request.spec.expirationSeconds == 1000 and request.spec.boundObjectRef.uid == "u-1"


def test_fs_group_ownership_as_set_volume_ownership(tmp_path):
    """Group, group permissions (read-write, or read-only for API data), setgid on directories; symlinks
    changed but never followed; OnRootMismatch skips a root that is already right."""
    gid = os.getgid()  # a group an unprivileged test may give files to
    outside = tmp_path / "outside"
    outside.write_text("node file")
    os.chmod(outside, 0o600)
    vol = tmp_path / "vol"
    (vol / "sub").mkdir(parents=True)
    (vol / "sub" / "f").write_text("x")
    os.chmod(vol / "sub" / "f", 0o600)
    os.chmod(vol, 0o700)
    os.symlink(outside, vol / "link")
    (tmp_path / "outdir").mkdir(mode=0o700)
    os.symlink(tmp_path / "outdir", vol / "dirlink")
    assert ownership.requires_change(vol, gid, readonly=False)
    assert ownership.set_ownership(vol, gid, readonly=False)
    assert stat.S_IMODE(os.stat(vol / "sub" / "f").st_mode) == 0o660
    assert stat.S_IMODE(os.stat(vol / "sub").st_mode) & (stat.S_ISGID | 0o070) == stat.S_ISGID | 0o070
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o600  # the links' targets are not touched
    assert stat.S_IMODE(os.stat(tmp_path / "outdir").st_mode) == 0o700
    assert not ownership.requires_change(vol, gid, readonly=False)
    assert not ownership.set_ownership(vol, gid, readonly=False, policy="OnRootMismatch")
    ro = tmp_path / "ro"
    atomic.write(ro, {"key": (b"v", 0o400)})
    os.chmod(ro, 0o755)
    assert ownership.set_ownership(ro, gid, readonly=True)
    assert stat.S_IMODE(os.stat(ro / "key").st_mode) == 0o440 and os.stat(ro / "key").st_gid == gid
    assert not ownership.requires_change(ro, gid, readonly=True)


def test_empty_dir_set_up_once_as_the_kubelets(tmp_path, monkeypatch):
    """The kubelet's emptyDir SetUpAt: 0777, and with fsGroup the group and setgid (02777); on tmpfs the mount
    takes no mode, so its root keeps tmpfs's 1777 and ends 03777 (the stand-in tmpfs here is the directory made
    1777); a ready file marks it, and a later sync leaves a mode the container changed."""
    tmpfs: list[tuple[Path, int | None]] = []

    def mount_tmpfs(path, size=None, mode=None):
        assert mode is None
        tmpfs.append((path, size))
        os.chmod(path, 0o1777)

    monkeypatch.setattr(mount, "mount_tmpfs", mount_tmpfs)
    monkeypatch.setattr(mount, "fs_type", lambda path: "tmpfs" if any(p == path for p, _ in tmpfs) else None)
    m = manager(tmp_path)
    gid = os.getgid()
    pod = pod_with(volumes=[{"name": "disk", "emptyDir": {}},
                            {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
                   securityContext={"fsGroup": gid})
    disk, mem = (m.volume_path(pod, v) for v in pod.spec.volumes)
    old = os.umask(0o077)
    try:
        m.mount_pod(pod)
    finally:
        os.umask(old)
    assert tmpfs == [(mem, 1 << 20)]
    assert stat.S_IMODE(os.stat(disk).st_mode) == 0o2777 and os.stat(disk).st_gid == gid
    assert stat.S_IMODE(os.stat(mem).st_mode) == 0o3777 and os.stat(mem).st_gid == gid
    ready = tmp_path / "pods/u-1/plugins/kubernetes.io~empty-dir"
    assert (ready / "disk/ready").is_file() and (ready / "mem/ready").is_file()
    os.chmod(disk, 0o700)
    m.mount_pod(pod)
    assert stat.S_IMODE(os.stat(disk).st_mode) == 0o700 and len(tmpfs) == 1
    plain = pod_with(volumes=[{"name": "plain", "emptyDir": {}}])
    m.mount_pod(plain)
    assert stat.S_IMODE(os.stat(m.volume_path(plain, plain.spec.volumes[0])).st_mode) == 0o777
