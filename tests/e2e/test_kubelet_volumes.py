"""pykubelet's volumes and env, end to end through a stock kube-apiserver and containerd: configMap and
secret volumes carry the right files and modes and follow a `kubectl apply` of the object without a
container restart; an emptyDir is shared between two containers and medium Memory is a tmpfs; hostPath
types are checked; the downward API (volume and env), configMap/secret env, envFrom and resourceFieldRef
reach the container; the service account token the admission plugin projects is valid (a TokenReview
says so); ClusterTrustBundles are projected and followed; a subPath that escapes its volume through a
symlink is refused; with fsGroup an emptyDir and a missing subPath made in it get the kubelet's modes
(02777, 03777 on tmpfs); a missing configMap gives CreateContainerConfigError; and a deleted pod leaves
nothing under the root dir, tmpfs unmounted.

What a container sees is read through CRI ExecSync (the `runtime` fixture): `kubectl exec` needs the
kubelet's :10250 server."""
from __future__ import annotations

import base64
import datetime
import json
import os
import stat

import pytest

from proto import api_pb2
from pykubelet.volumes import mount, trustbundles
from tests.kit.kubelet_node import BUSYBOX, HTTPD, apply, delete, get_pod, on_node, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec
from tests.kit.trust_anchors import ca_pem, new_ca

NODE = "pynode-e2e-volumes"
NODE_IP = "10.201.0.31"
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]


def pod_spec(name: str, container: dict, **spec) -> dict:
    return kit_pod_spec(NODE, name, container, **spec)


def sleeper(name: str, **fields) -> dict:
    return {"name": name, "image": BUSYBOX, "command": SLEEP, **fields}


def running(cp, name: str) -> dict:
    return wait_pod(cp, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running"
                    and all(cs.get("ready") for cs in p["status"].get("containerStatuses", [])))


def container_id(runtime, uid: str, name: str) -> str:
    _, containers = on_node(runtime, uid)
    return next(c.id for c in containers if c.metadata.name == name and c.state == api_pb2.CONTAINER_RUNNING)


def sh(runtime, cid: str, script: str) -> str:
    out, err, code = runtime.exec_sync(cid, ["sh", "-c", script], timeout=10)
    assert code == 0, (script, out, err)
    return out.decode()


def config_map(cp, tmp, name: str, data: dict[str, str]) -> None:
    apply(cp, tmp, {"metadata": {"name": name, "namespace": "default"}, "data": data}, kind="ConfigMap")


def secret(cp, tmp, name: str, data: dict[str, str]) -> None:
    apply(cp, tmp, {"metadata": {"name": name, "namespace": "default"}, "type": "Opaque",
                    "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}, kind="Secret")


def remove(cp, kind: str, *names: str) -> None:
    cp.kubectl("delete", kind, *names, "--ignore-not-found", check=False)


def review(cp, tmp, token: str, audiences: list[str] | None = None) -> dict:
    """A TokenReview of `token` through admin kubectl: its status."""
    path = tmp / "review.json"
    path.write_text(json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                "spec": {"token": token, **({"audiences": audiences} if audiences else {})}}))
    return json.loads(cp.kubectl("create", "-f", str(path), "-o", "json").stdout)["status"]


def pod_root(kubelet, uid: str):
    return kubelet.work / "root" / "pods" / uid


def gone_from_node(kubelet, uid: str) -> None:
    """Nothing of pod `uid` is left under the kubelet's root dir, and nothing is mounted there."""
    assert not pod_root(kubelet, uid).exists(), list(pod_root(kubelet, uid).rglob("*"))
    assert not mount.mounts_under(kubelet.work / "root"), mount.mounts_under(kubelet.work / "root")


def test_configmap_and_secret_volumes_carry_files_and_update(control_plane, kubelet, runtime, kubepods, tmp_path):
    config_map(control_plane, tmp_path, "cfg", {"greeting": "hello", "other": "x"})
    secret(control_plane, tmp_path, "sec", {"password": "s3cret"})
    volumes = [{"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "greeting", "path": "dir/greet",
                                                                      "mode": 0o600}]}},
               {"name": "all", "configMap": {"name": "cfg"}},
               {"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o400}},
               {"name": "opt", "secret": {"secretName": "absent", "optional": True}}]
    mounts = [{"name": "cfg", "mountPath": "/cfg"}, {"name": "all", "mountPath": "/all"},
              {"name": "sec", "mountPath": "/sec"}, {"name": "opt", "mountPath": "/opt-secret"}]
    apply(control_plane, tmp_path, pod_spec("cfgpod", sleeper("app", volumeMounts=mounts), volumes=volumes))
    try:
        pod = running(control_plane, "cfgpod")
        uid = pod["metadata"]["uid"]
        cid = container_id(runtime, uid, "app")
        assert sh(runtime, cid, "cat /cfg/dir/greet") == "hello"
        assert sh(runtime, cid, "stat -L -c %a /cfg/dir/greet /all/other /sec/password").split() == ["600", "644",
                                                                                                   "400"]
        assert sh(runtime, cid, "cat /sec/password") == "s3cret"
        assert sh(runtime, cid, "ls /opt-secret") == ""  # an optional object that is absent: no files
        assert sorted(sh(runtime, cid, "ls /all").split()) == ["greeting", "other"]
        assert sh(runtime, cid, "readlink /all/greeting").strip() == "..data/greeting"
        assert "Read-only" in sh(runtime, cid, "touch /all/new 2>&1 || true")
        volumes_dir = pod_root(kubelet, uid) / "volumes"
        assert mount.fs_type(volumes_dir / "kubernetes.io~secret" / "sec") == "tmpfs"
        assert mount.fs_type(volumes_dir / "kubernetes.io~configmap" / "all") is None  # on disk
        config_map(control_plane, tmp_path, "cfg", {"greeting": "bonjour", "added": "y"})
        secret(control_plane, tmp_path, "sec", {"password": "changed"})
        wait_for("the configMap update in the container", lambda: sh(runtime, cid, "cat /cfg/dir/greet") == "bonjour",
                 timeout=40)
        wait_for("the secret update", lambda: sh(runtime, cid, "cat /sec/password") == "changed", timeout=20)
        assert sorted(sh(runtime, cid, "ls /all").split()) == ["added", "greeting"]
        assert container_id(runtime, uid, "app") == cid  # updated in place: no restart
        assert get_pod(control_plane, "cfgpod")["status"]["containerStatuses"][0]["restartCount"] == 0
    finally:
        delete(control_plane, "cfgpod")
        remove(control_plane, "configmap", "cfg")
        remove(control_plane, "secret", "sec")
    gone_from_node(kubelet, uid)


def test_emptydir_hostpath_and_downward_api(control_plane, kubelet, runtime, kubepods, tmp_path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "from-host").write_text("node file")
    created = tmp_path / "made" / "here"
    volumes = [{"name": "shared", "emptyDir": {}},
               {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
               {"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}},
               {"name": "made", "hostPath": {"path": str(created), "type": "DirectoryOrCreate"}},
               {"name": "info", "downwardAPI": {"items": [
                   {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                   {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                   {"path": "mem_limit", "resourceFieldRef": {"containerName": "writer", "resource": "limits.memory",
                                                              "divisor": "1Mi"}}]}}]
    writer = sleeper("writer", command=["sh", "-c", "echo shared-data > /shared/x; echo w > /made/w; " + SLEEP[2]],
                     volumeMounts=[{"name": "shared", "mountPath": "/shared"}, {"name": "mem", "mountPath": "/mem"},
                                   {"name": "made", "mountPath": "/made"}],
                     resources={"limits": {"memory": "64Mi", "cpu": "200m"}})
    reader = sleeper("reader", volumeMounts=[{"name": "shared", "mountPath": "/data", "readOnly": True},
                                             {"name": "host", "mountPath": "/host"},
                                             {"name": "info", "mountPath": "/etc/podinfo"}])
    spec = pod_spec("dirs", writer, volumes=volumes)
    spec["metadata"]["labels"] = {"app": "dirs", "tier": "test"}
    spec["spec"]["containers"].append(reader)
    apply(control_plane, tmp_path, spec)
    try:
        pod = running(control_plane, "dirs")
        uid = pod["metadata"]["uid"]
        reader_id, writer_id = container_id(runtime, uid, "reader"), container_id(runtime, uid, "writer")
        wait_for("the writer's file",
                 lambda: sh(runtime, reader_id, "cat /data/x 2>/dev/null || true") == "shared-data\n")
        assert "Read-only" in sh(runtime, reader_id, "touch /data/y 2>&1 || true")
        assert sh(runtime, reader_id, "cat /host/from-host") == "node file"
        assert (created / "w").read_text() == "w\n" and stat.S_IMODE(os.stat(created).st_mode) == 0o755
        assert sh(runtime, reader_id, "cat /etc/podinfo/name") == "dirs"
        assert sh(runtime, reader_id, "cat /etc/podinfo/labels") == 'app="dirs"\ntier="test"'
        assert sh(runtime, reader_id, "cat /etc/podinfo/mem_limit") == "64"
        volumes_dir = pod_root(kubelet, uid) / "volumes" / "kubernetes.io~empty-dir"
        assert mount.fs_type(volumes_dir / "mem") == "tmpfs"
        assert mount.fs_type(volumes_dir / "shared") is None
        assert "tmpfs" in sh(runtime, writer_id, "grep ' /mem ' /proc/mounts")
        assert "size=8192k" in sh(runtime, writer_id, "grep ' /mem ' /proc/mounts")
    finally:
        delete(control_plane, "dirs")
    gone_from_node(kubelet, uid)
    assert (host_dir / "from-host").read_text() == "node file"  # a hostPath is the node's: it stays


def test_hostpath_type_mismatch_is_reported(control_plane, kubelet, kubepods, tmp_path):
    not_a_socket = tmp_path / "plain"
    not_a_socket.write_text("")
    apply(control_plane, tmp_path, pod_spec("badhost", sleeper("app", volumeMounts=[
        {"name": "sock", "mountPath": "/sock"}]), volumes=[
        {"name": "sock", "hostPath": {"path": str(not_a_socket), "type": "Socket"}}]))
    try:
        pod = wait_pod(control_plane, "badhost", "the FailedMount wait", lambda p: "is not a socket" in json.dumps(
            p.get("status", {}).get("containerStatuses", [])))
        waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["reason"] == "ContainerCreating"
        assert "spec.volumes[0].hostPath" in waiting["message"] and "it's a file" in waiting["message"]
        events = json.loads(control_plane.kubectl("get", "events", "--field-selector",
                                                  "involvedObject.name=badhost", "-o", "json").stdout)["items"]
        assert any(e["reason"] == "FailedMount" for e in events)
    finally:
        delete(control_plane, "badhost")


def test_env_from_every_source(control_plane, kubelet, runtime, kubepods, tmp_path):
    config_map(control_plane, tmp_path, "envcm", {"color": "blue", "size": "L"})
    secret(control_plane, tmp_path, "envsec", {"token": "t0k3n"})
    env = [{"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "envcm", "key": "color"}}},
           {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "envsec", "key": "token"}}},
           {"name": "NOPE", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}}},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
           {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
           {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
           {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
           {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
           {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
           {"name": "GREETING", "value": "$(COLOR)-$(POD_NAME)-$(UNDEFINED)-$$(COLOR)"}]
    container = sleeper("app", env=env, envFrom=[{"configMapRef": {"name": "envcm"}, "prefix": "CM_"},
                                                 {"secretRef": {"name": "envsec"}}],
                        resources={"requests": {"cpu": "150m", "memory": "32Mi"}, "limits": {"memory": "48Mi"}},
                        command=["sh", "-c", "echo 'cmd:$(COLOR)'; " + SLEEP[2]])
    spec = pod_spec("envpod", container)
    spec["metadata"]["labels"] = {"app": "envy"}
    apply(control_plane, tmp_path, spec)
    try:
        pod = running(control_plane, "envpod")
        uid = pod["metadata"]["uid"]
        cid = container_id(runtime, uid, "app")
        seen = dict(line.split("=", 1) for line in sh(runtime, cid, "env").splitlines() if "=" in line)
        expected = {"COLOR": "blue", "TOKEN": "t0k3n", "POD_NAME": "envpod", "POD_NS": "default", "POD_UID": uid,
                    "APP": "envy", "NODE_NAME": NODE, "SA": "default", "HOST_IP": NODE_IP,
                    "POD_IP": pod["status"]["podIP"], "MEM_MI": "48", "CPU_M": "150",
                    "GREETING": "blue-envpod-$(UNDEFINED)-$(COLOR)", "CM_color": "blue", "CM_size": "L",
                    "token": "t0k3n"}
        assert {k: seen.get(k) for k in expected} == expected
        assert "NOPE" not in seen
        log = kubelet.pods_dir / f"default_envpod_{uid}" / "app" / "0.log"
        assert "cmd:blue" in log.read_text()  # $(VAR) in the command, too
    finally:
        delete(control_plane, "envpod")
        remove(control_plane, "configmap", "envcm")
        remove(control_plane, "secret", "envsec")


def test_missing_configmap_gives_create_container_config_error(control_plane, kubelet, kubepods, tmp_path):
    container = sleeper("app", env=[{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "later", "key": "x"}}}])
    apply(control_plane, tmp_path, pod_spec("nocm", container))
    try:
        pod = wait_pod(control_plane, "nocm", "CreateContainerConfigError", lambda p: any(
            cs["state"].get("waiting", {}).get("reason") == "CreateContainerConfigError"
            for cs in p.get("status", {}).get("containerStatuses", [])))
        assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == 'configmap "later" not found'
        config_map(control_plane, tmp_path, "later", {"x": "1"})
        running(control_plane, "nocm")  # retried: it starts once the configMap is there
    finally:
        delete(control_plane, "nocm")
        remove(control_plane, "configmap", "later")


def test_subpath_escape_is_refused(control_plane, kubelet, runtime, kubepods, tmp_path):
    prep = {"name": "prep", "image": BUSYBOX, "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "command": ["sh", "-c", "mkdir -p /data/ok && echo fine > /data/ok/f && ln -s / /data/escape"]}
    good = sleeper("good", env=[{"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                   volumeMounts=[{"name": "data", "mountPath": "/sub", "subPath": "ok"},
                                 {"name": "data", "mountPath": "/expr", "subPathExpr": "made/$(NAME)"}])
    bad = sleeper("bad", volumeMounts=[{"name": "data", "mountPath": "/host", "subPath": "escape"}])
    spec = pod_spec("subpath", good, volumes=[{"name": "data", "emptyDir": {}}], initContainers=[prep])
    spec["spec"]["containers"].append(bad)
    apply(control_plane, tmp_path, spec)
    try:
        pod = wait_pod(control_plane, "subpath", "bad refused, good running", lambda p: {
            cs["name"]: (next(iter(cs["state"])), cs["state"].get("waiting", {}).get("reason"))
            for cs in p.get("status", {}).get("containerStatuses", [])} == {
            "good": ("running", None), "bad": ("waiting", "CreateContainerConfigError")})
        uid = pod["metadata"]["uid"]
        message = next(cs for cs in pod["status"]["containerStatuses"] if cs["name"] == "bad")["state"]["waiting"][
            "message"]
        assert "spec.containers[1].volumeMounts[0].subPath" in message and "outside volume" in message, message
        cid = container_id(runtime, uid, "good")
        assert sh(runtime, cid, "cat /sub/f") == "fine\n"
        sh(runtime, cid, "echo via-expr > /expr/file")
        data = pod_root(kubelet, uid) / "volumes" / "kubernetes.io~empty-dir" / "data"
        assert (data / "made" / "subpath" / "file").read_text() == "via-expr\n"
    finally:
        delete(control_plane, "subpath")
    gone_from_node(kubelet, uid)


def test_service_account_token_is_projected_and_valid(control_plane, kubelet, runtime, kubepods, tmp_path):
    ca = control_plane.ca.pair.cert.read_text()
    config_map(control_plane, tmp_path, "kube-root-ca.crt", {"ca.crt": ca})  # no controller-manager here
    secret(control_plane, tmp_path, "projsec", {"k": "secret-value"})
    projected = {"name": "proj", "projected": {"defaultMode": 0o440, "sources": [
        {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 600, "path": "vault-token"}},
        {"secret": {"name": "projsec", "items": [{"key": "k", "path": "s/k", "mode": 0o400}]}},
        {"configMap": {"name": "kube-root-ca.crt"}},
        {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}]}}
    apply(control_plane, tmp_path, pod_spec("sa", sleeper("app", volumeMounts=[{"name": "proj", "mountPath": "/proj"}]),
                                            automountServiceAccountToken=True, volumes=[projected]))
    try:
        pod = running(control_plane, "sa")
        uid = pod["metadata"]["uid"]
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
        cid = container_id(runtime, uid, "app")
        base = "/var/run/secrets/kubernetes.io/serviceaccount"
        assert sh(runtime, cid, f"cat {base}/namespace") == "default"
        assert sh(runtime, cid, f"cat {base}/ca.crt") == ca
        status = review(control_plane, tmp_path, sh(runtime, cid, f"cat {base}/token"))
        assert status["authenticated"], status
        assert status["user"]["username"] == "system:serviceaccount:default:default"
        assert status["user"]["extra"]["authentication.kubernetes.io/pod-uid"] == [uid]
        # a projected volume of every source kind, with its own audience and life
        assert sh(runtime, cid, "cat /proj/s/k /proj/name") == "secret-valuesa"
        assert sh(runtime, cid, "cat /proj/ca.crt") == ca
        assert sh(runtime, cid, "stat -L -c %a /proj/s/k /proj/name /proj/vault-token").split() == ["400", "440", "440"]
        vault_token = sh(runtime, cid, "cat /proj/vault-token")
        claims = json.loads(base64.urlsafe_b64decode(vault_token.split(".")[1] + "=="))
        assert claims["aud"] == ["vault"] and claims["exp"] - claims["iat"] == 600
        status = review(control_plane, tmp_path, vault_token, audiences=["vault"])
        assert status["authenticated"] and status["audiences"] == ["vault"], status
        volumes_dir = pod_root(kubelet, uid) / "volumes" / "kubernetes.io~projected"
        assert mount.fs_type(volumes_dir / volume["name"]) == "tmpfs" and mount.fs_type(volumes_dir / "proj") == "tmpfs"
    finally:
        delete(control_plane, "sa")
        remove(control_plane, "configmap", "kube-root-ca.crt")
        remove(control_plane, "secret", "projsec")
    gone_from_node(kubelet, uid)


def test_service_env_vars(control_plane, kubelet, runtime, kubepods, tmp_path):
    """The kubelet's service env: KUBERNETES_SERVICE_HOST/PORT always, FOO_SERVICE_HOST and the Docker link
    variables of the namespace's Services unless enableServiceLinks is false; an explicit env wins."""
    apply(control_plane, tmp_path, {"metadata": {"name": "foo", "namespace": "default"},
                                    "spec": {"selector": {"app": "foo"}, "ports": [{"name": "web", "port": 8080}]}},
          kind="Service")
    master = json.loads(control_plane.kubectl("get", "service", "kubernetes", "-o", "json").stdout)["spec"]
    foo = json.loads(control_plane.kubectl("get", "service", "foo", "-o", "json").stdout)["spec"]["clusterIP"]
    own = [{"name": "FOO_SERVICE_PORT", "value": "mine"}, {"name": "URL", "value": "$(FOO_SERVICE_HOST):1"}]
    apply(control_plane, tmp_path, pod_spec("links", sleeper("app", env=own)))
    apply(control_plane, tmp_path, pod_spec("nolinks", sleeper("app"), enableServiceLinks=False))
    try:
        seen = {}
        for name in ("links", "nolinks"):
            uid = running(control_plane, name)["metadata"]["uid"]
            seen[name] = dict(line.split("=", 1) for line in sh(runtime, container_id(runtime, uid, "app"), "env")
                              .splitlines() if "=" in line)
        kubernetes = {"KUBERNETES_SERVICE_HOST": master["clusterIP"], "KUBERNETES_SERVICE_PORT": "443",
                      "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": f"tcp://{master['clusterIP']}:443",
                      "KUBERNETES_PORT_443_TCP_ADDR": master["clusterIP"]}
        links = {**kubernetes, "FOO_SERVICE_HOST": foo, "FOO_SERVICE_PORT": "mine", "FOO_SERVICE_PORT_WEB": "8080",
                 "FOO_PORT": f"tcp://{foo}:8080", "FOO_PORT_8080_TCP_PROTO": "tcp", "URL": f"{foo}:1"}
        assert {k: seen["links"].get(k) for k in links} == links
        assert {k: seen["nolinks"].get(k) for k in kubernetes} == kubernetes
        assert not [k for k in seen["nolinks"] if k.startswith("FOO_")]
    finally:
        delete(control_plane, "links")
        delete(control_plane, "nolinks")
        remove(control_plane, "service", "foo")


def test_fs_group_owns_the_volumes(control_plane, kubelet, runtime, kubepods, tmp_path):
    """A pod running as user 1000 with fsGroup 2000: its process has group 2000, it can write its emptyDir,
    and the secret volume's files are group 2000 and group-readable (not world-readable: mode 0440)."""
    secret(control_plane, tmp_path, "fssec", {"key": "v"})
    container = sleeper("app", volumeMounts=[{"name": "scratch", "mountPath": "/scratch"},
                                             {"name": "sec", "mountPath": "/sec"}])
    apply(control_plane, tmp_path, pod_spec(
        "fsgroup", container, securityContext={"runAsUser": 1000, "fsGroup": 2000, "supplementalGroups": [3000]},
        volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "sec", "secret": {"secretName": "fssec",
                                                                                "defaultMode": 0o400}}]))
    try:
        uid = running(control_plane, "fsgroup")["metadata"]["uid"]
        cid = container_id(runtime, uid, "app")
        assert sh(runtime, cid, "id -u").strip() == "1000"
        assert {"2000", "3000"} <= set(sh(runtime, cid, "id -G").split())
        assert sh(runtime, cid, "echo hi > /scratch/f && mkdir /scratch/d && stat -c '%g' /scratch/f /scratch/d"
                  ).split() == ["2000", "2000"]
        assert sh(runtime, cid, "stat -L -c '%g %a' /sec/key; cat /sec/key").split() == ["2000", "440", "v"]
        host = pod_root(kubelet, uid) / "volumes" / "kubernetes.io~empty-dir" / "scratch"
        assert os.stat(host).st_gid == 2000 and os.stat(host).st_mode & stat.S_ISGID
    finally:
        delete(control_plane, "fsgroup")
        remove(control_plane, "secret", "fssec")


def test_fs_group_emptydir_and_missing_subpath_modes(control_plane, kubelet, runtime, kubepods, tmp_path):
    """What the [NodeConformance] specs "EmptyDir volumes when FSGroup is specified" read with mounttest, as a
    user 1001 with fsGroup 123: a missing subPath of a tmpfs emptyDir is made root:123 with the volume root's
    mode, setgid and sticky bits included (drwxrwsrwt, "nonexistent volume subPath should have the correct mode
    and owner using FSGroup"), the tmpfs root is 03777 and the disk one 02777 ("volume on tmpfs/default medium
    should have the correct mode using FSGroup"), and a file made there gets group 123."""
    volumes = [{"name": "mem", "emptyDir": {"medium": "Memory"}}, {"name": "disk", "emptyDir": {}}]
    container = sleeper("app", volumeMounts=[{"name": "mem", "mountPath": "/test-volume", "subPath": "test-sub"},
                                             {"name": "mem", "mountPath": "/mem-root"},
                                             {"name": "disk", "mountPath": "/disk"}])
    apply(control_plane, tmp_path, pod_spec("fsgroup-subpath", container,
                                            volumes=volumes, securityContext={"runAsUser": 1001, "fsGroup": 123}))
    try:
        uid = running(control_plane, "fsgroup-subpath")["metadata"]["uid"]
        cid = container_id(runtime, uid, "app")
        assert sh(runtime, cid, "stat -c '%A %u %g' /test-volume").split() == ["drwxrwsrwt", "0", "123"]
        assert sh(runtime, cid, "stat -c '%a %g' /mem-root /disk").split() == ["3777", "123", "2777", "123"]
        assert "tmpfs" in sh(runtime, cid, "grep ' /test-volume ' /proc/mounts")
        assert sh(runtime, cid, "echo x > /test-volume/f && stat -c %g /test-volume/f").strip() == "123"
        plugins = pod_root(kubelet, uid) / "plugins" / "kubernetes.io~empty-dir"
        assert (plugins / "mem" / "ready").is_file() and (plugins / "disk" / "ready").is_file()
    finally:
        delete(control_plane, "fsgroup-subpath")
    gone_from_node(kubelet, uid)


def trust_bundle(cp, tmp, name: str, pems: list[bytes], labels: dict[str, str] | None = None) -> None:
    path = tmp / f"ctb-{name}.json"
    path.write_text(json.dumps({
        "apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"signerName": "example.com/e2e", "trustBundle": b"".join(pems).decode()}}))
    cp.kubectl("apply", "-f", str(path))


def test_trust_bundles_are_projected_and_follow_their_bundles(control_plane, kubelet, runtime, kubepods, tmp_path):
    """clusterTrustBundle sources, by name and by signer and labels: the container reads each bundle's anchors
    as PEM, each once; a changed bundle reaches the running container without a restart; a bundle that does not
    exist keeps a pod's container from starting and its Ready condition says ContainersNotReady, as the
    [Conformance] specs of ClusterTrustBundleProjection check; an optional one is an empty file."""
    a, b, c = ca_pem("e2e-a"), ca_pem("e2e-b"), ca_pem("e2e-c")
    trust_bundle(control_plane, tmp_path, "example.com:e2e:one", [a, b], {"live": "yes"})
    trust_bundle(control_plane, tmp_path, "example.com:e2e:two", [b], {"live": "no"})

    def anchors(text: str) -> set[bytes]:
        return set(trustbundles.certificates(text.encode()))

    def projected(*sources: dict) -> dict:
        return {"name": "ca", "projected": {"sources": [{"clusterTrustBundle": s} for s in sources]}}

    volume = projected({"name": "example.com:e2e:one", "path": "one.pem"},
                       {"signerName": "example.com/e2e", "labelSelector": {}, "path": "all.pem"},
                       {"signerName": "example.com/e2e", "labelSelector": {"matchExpressions": [
                           {"key": "live", "operator": "In", "values": ["no"]}]}, "path": "dead.pem"},
                       {"name": "absent", "optional": True, "path": "none.pem"})
    apply(control_plane, tmp_path, pod_spec("ctbpod", sleeper("app", volumeMounts=[
        {"name": "ca", "mountPath": "/ca"}]), volumes=[volume]))
    missing = projected({"name": "absent", "path": "ca.pem"})
    apply(control_plane, tmp_path, pod_spec("ctbmissing", sleeper("app", volumeMounts=[
        {"name": "ca", "mountPath": "/ca"}]), volumes=[missing]))
    try:
        uid = running(control_plane, "ctbpod")["metadata"]["uid"]
        cid = container_id(runtime, uid, "app")
        assert anchors(sh(runtime, cid, "cat /ca/one.pem")) == set(trustbundles.certificates(a + b))
        all_pem = sh(runtime, cid, "cat /ca/all.pem")
        assert all_pem.count("BEGIN CERTIFICATE") == 2 and anchors(all_pem) == anchors((a + b).decode())
        assert anchors(sh(runtime, cid, "cat /ca/dead.pem")) == anchors(b.decode())
        assert sh(runtime, cid, "stat -L -c '%a %s' /ca/none.pem /ca/one.pem").split()[:2] == ["644", "0"]
        trust_bundle(control_plane, tmp_path, "example.com:e2e:one", [c], {"live": "yes"})
        wait_for("the changed bundle in the container", lambda: anchors(sh(runtime, cid, "cat /ca/one.pem"))
                 == anchors(c.decode()), timeout=40)
        assert container_id(runtime, uid, "app") == cid
        pod = wait_pod(control_plane, "ctbmissing", "ContainersNotReady", lambda p: any(
            x["type"] == "Ready" and x.get("reason") == "ContainersNotReady"
            for x in p["status"].get("conditions", [])))
        assert pod["status"]["phase"] == "Pending", pod["status"]
        _, containers = on_node(runtime, pod["metadata"]["uid"])
        assert not containers
    finally:
        delete(control_plane, "ctbpod")
        delete(control_plane, "ctbmissing")
        remove(control_plane, "clustertrustbundle", "example.com:e2e:one", "example.com:e2e:two")
    gone_from_node(kubelet, uid)


def issue_pod_certificate(cp, tmp, ca: tuple) -> dict:
    """Signs the first PodCertificateRequest of the default namespace that has no answer, as a signer would
    (a leaf for its stub request's public key, one hour long, refresh due in half an hour), and returns it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    requests = json.loads(cp.kubectl("get", "podcertificaterequests", "-o", "json").stdout)["items"]
    request = next(r for r in requests if not r.get("status", {}).get("conditions"))
    stub = x509.load_der_x509_csr(base64.b64decode(request["spec"]["stubPKCS10Request"]))
    key, cert = ca
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(cert.subject)
            .public_key(stub.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(
                f"spiffe://cluster.local/ns/default/sa/{request['spec']['serviceAccountName']}")]), critical=False)
            .sign(key, hashes.SHA256()))

    def stamp(t: datetime.datetime) -> str:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")
    request["status"] = {
        "conditions": [{"type": "Issued", "status": "True", "reason": "Signed", "message": "signed by the test",
                        "lastTransitionTime": stamp(now)}],
        "certificateChain": (leaf.public_bytes(serialization.Encoding.PEM)
                             + cert.public_bytes(serialization.Encoding.PEM)).decode(),
        "notBefore": stamp(now), "beginRefreshAt": stamp(now + datetime.timedelta(minutes=30)),
        "notAfter": stamp(now + datetime.timedelta(hours=1))}
    path = tmp / "pcr-status.json"
    path.write_text(json.dumps(request))
    cp.kubectl("replace", "--subresource=status", "-f", str(path))
    return request


def test_a_pod_certificate_is_the_pods_key_and_its_issued_chain(control_plane, kubelet, runtime, kubepods,
                                                                tmp_path):
    """A podCertificate source: the node asks with a PodCertificateRequest for the pod (its UID, its service
    account's, the node's, a stub request signed by a key of the asked type), the pod waits in
    ContainerCreating until a signer issues, then reads the key, the chain and both as a bundle; the key is
    the one the leaf was issued to. As the [Conformance] Projected PodCertificate specs, with the test as
    the signer."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    volume = {"name": "cert", "projected": {"sources": [{"podCertificate": {
        "signerName": "example.com/e2e-signer", "keyType": "ED25519", "credentialBundlePath": "bundle.pem",
        "keyPath": "key.pem", "certificateChainPath": "chain.pem"}}]}}
    apply(control_plane, tmp_path, pod_spec("certpod", sleeper("app", volumeMounts=[
        {"name": "cert", "mountPath": "/cert"}]), volumes=[volume]))
    try:
        request = wait_for("the node's PodCertificateRequest", lambda: json.loads(control_plane.kubectl(
            "get", "podcertificaterequests", "-o", "json").stdout)["items"], timeout=30)[0]
        pod = get_pod(control_plane, "certpod")
        uid = pod["metadata"]["uid"]
        spec = request["spec"]
        assert (spec["podName"], spec["podUID"], spec["nodeName"], spec["signerName"], spec["serviceAccountName"]) \
            == ("certpod", uid, NODE, "example.com/e2e-signer", "default")
        assert request["metadata"]["ownerReferences"][0]["uid"] == uid
        waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["reason"] == "ContainerCreating" and "not issued" in waiting.get("message", ""), waiting
        assert not on_node(runtime, uid)[1]  # no container before the chain
        ca = new_ca("e2e-signer")
        issued = issue_pod_certificate(control_plane, tmp_path, ca)
        running(control_plane, "certpod")
        cid = container_id(runtime, uid, "app")
        key, chain = sh(runtime, cid, "cat /cert/key.pem"), sh(runtime, cid, "cat /cert/chain.pem")
        assert chain == issued["status"]["certificateChain"]
        assert sh(runtime, cid, "cat /cert/bundle.pem") == key + chain
        leaf = x509.load_pem_x509_certificate(chain.encode())
        public = serialization.load_pem_private_key(key.encode(), None).public_key()
        assert public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == \
            leaf.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        volumes_dir = pod_root(kubelet, uid) / "volumes" / "kubernetes.io~projected"
        assert mount.fs_type(volumes_dir / "cert") == "tmpfs"  # the key never on a disk
    finally:
        delete(control_plane, "certpod")
        control_plane.kubectl("delete", "podcertificaterequests", "--all", check=False)
    gone_from_node(kubelet, uid)


def test_an_image_volume_mounts_an_image_read_only(cri, control_plane, kubelet, runtime, kubepods, tmp_path):
    """An image volume (GA in 1.36, the ImageVolume [Conformance] spec): the kubelet pulls the image with the
    volume's pull policy and the runtime mounts its root read-only, whole or a subPath of it."""
    if cri.name != "pyruntime-cri":
        pytest.skip("containerd 1.6 has no image volumes (CRI Mount.image came with containerd 2.1)")
    volume = {"name": "img", "image": {"reference": HTTPD, "pullPolicy": "IfNotPresent"}}
    apply(control_plane, tmp_path, pod_spec("imgpod", sleeper("app", volumeMounts=[
        {"name": "img", "mountPath": "/image"},
        {"name": "img", "mountPath": "/site", "subPath": "usr/local/apache2/htdocs"}]), volumes=[volume]))
    try:
        uid = running(control_plane, "imgpod")["metadata"]["uid"]
        cid = container_id(runtime, uid, "app")
        assert "httpd-foreground" in sh(runtime, cid, "ls /image/usr/sbin")
        assert "It works!" in sh(runtime, cid, "cat /site/index.html")
        assert "Read-only" in sh(runtime, cid, "touch /image/new /site/new 2>&1 || true")
        status = runtime.container_status(cid).status
        assert [m.image.user_specified_image for m in status.mounts if m.image.image] == [HTTPD, HTTPD]
    finally:
        delete(control_plane, "imgpod")
    gone_from_node(kubelet, uid)


def test_projected_combined_as_the_spec(control_plane, kubelet, runtime, kubepods, tmp_path):
    """[sig-storage] Projected combined "should project all components that make up the projection API": the
    spec's pod as it sends it (RestartPolicy Never, the service account's own projected volume beside it) reads
    its name, a secret's and a configMap's value from one projected volume, and Succeeds with them in its log."""
    ca = control_plane.ca.pair.cert.read_text()
    config_map(control_plane, tmp_path, "kube-root-ca.crt", {"ca.crt": ca})  # no controller-manager here
    secret(control_plane, tmp_path, "secret-projected-all-test-volume", {"secret-data": "secret-value-1"})
    config_map(control_plane, tmp_path, "configmap-projected-all-test-volume", {"configmap-data": "configmap-value-1"})
    projected = {"name": "podinfo", "projected": {"sources": [
        {"downwardAPI": {"items": [{"path": "podname", "fieldRef": {"apiVersion": "v1",
                                                                    "fieldPath": "metadata.name"}}]}},
        {"secret": {"name": "secret-projected-all-test-volume"}},
        {"configMap": {"name": "configmap-projected-all-test-volume"}}]}}
    container = {"name": "projected-all-volume-test", "image": BUSYBOX,
                 "command": ["sh", "-c", "cat /all/podname && cat /all/secret-data && cat /all/configmap-data"],
                 "volumeMounts": [{"name": "podinfo", "mountPath": "/all", "readOnly": False}]}
    apply(control_plane, tmp_path, pod_spec("projected-volume", container, volumes=[projected],
                                            restartPolicy="Never", automountServiceAccountToken=True))
    try:
        pod = wait_pod(control_plane, "projected-volume", "Succeeded",
                       lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"))
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        uid = pod["metadata"]["uid"]
        log = (kubelet.pods_dir / f"default_projected-volume_{uid}" / "projected-all-volume-test" / "0.log").read_text()
        content = "".join(line.split(" ", 3)[3] for line in log.splitlines())
        assert content == "projected-volumesecret-value-1configmap-value-1", log
    finally:
        delete(control_plane, "projected-volume")
        remove(control_plane, "configmap", "kube-root-ca.crt", "configmap-projected-all-test-volume")
        remove(control_plane, "secret", "secret-projected-all-test-volume")
    # a finished pod's object goes at once (the API server deletes a terminal pod without grace), before the
    # kubelet has cleaned up after it
    wait_for("the pod's directory to go", lambda: not pod_root(kubelet, uid).exists(), timeout=30)
    gone_from_node(kubelet, uid)
