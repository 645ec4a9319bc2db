"""The pod's hostname and /etc/hosts as the kubelet makes them (GeneratePodHostNameAndDomain with 1.37's
hostnameOverride, GetNodenameForKernel, managedHostsFileContent, nodeHostsFileContent with hostAliases), and
the sync's mounts: the kubelet's hosts file at /etc/hosts unless the container mounts that path, and a new
world-writable termination message file per container."""
from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from pykubelet.api.fields import FieldError
from pykubelet.api.podmodel import HostAlias, Pod, parse_pod
from pykubelet.config import Settings
from pykubelet.pods import hosts
from pykubelet.pods.criconfig import sandbox_config
from tests.kit.fake_cri import FakeCRI

UID = "0b5d2e3c-1111-2222-3333-444455556666"


def pod(name: str = "web", **spec) -> Pod:
    return parse_pod({"metadata": {"name": name, "namespace": "ns", "uid": UID},
                      "spec": {"containers": [{"name": "c", "image": "img:1"}], **spec}})


@pytest.mark.parametrize("spec, expected", [
    ({}, ("web", "")),
    ({"hostname": "custom-host"}, ("custom-host", "")),
    ({"subdomain": "t"}, ("web", "t.ns.svc.cluster.local")),
    ({"hostname": "h", "subdomain": "t"}, ("h", "t.ns.svc.cluster.local")),
    # the upstream specs of "Override hostname of Pod": the override whatever hostname and subdomain say
    ({"hostnameOverride": "override.example.host"}, ("override.example.host", "")),
    ({"hostname": "custom-host", "hostnameOverride": "override-host"}, ("override-host", "")),
    ({"subdomain": "t", "hostnameOverride": "override-host"}, ("override-host", "")),
])
def test_hostname_and_domain_as_generate_pod_host_name_and_domain(spec, expected):
    assert hosts.hostname_and_domain(pod(**spec), "cluster.local") == expected


def test_a_long_name_is_cut_to_63_without_a_trailing_dash_or_dot():
    name = "a" * 62 + "-b"
    assert hosts.hostname_and_domain(pod(name), "") == ("a" * 62, "")
    assert hosts.hostname_and_domain(pod(hostnameOverride="x" * 62 + ".y"), "")[0] == "x" * 62


@pytest.mark.parametrize("spec, message", [
    ({"hostnameOverride": "Not-RFC1123"}, "spec.hostnameOverride: 'Not-RFC1123' is not a valid DNS subdomain"),
    ({"hostname": "a.b"}, "spec.hostname: 'a.b' is not a valid DNS label"),
    ({"subdomain": "A"}, "spec.subdomain: 'A' is not a valid DNS label"),
])
def test_invalid_names_are_refused_naming_the_field(spec, message):
    with pytest.raises(hosts.HostnameError, match=re.escape(message)):
        hosts.hostname_and_domain(pod(**spec), "cluster.local")


def test_kernel_hostname_and_the_sandbox_config():
    assert hosts.kernel_hostname(pod(hostNetwork=True), "cluster.local") == ""
    assert hosts.kernel_hostname(pod(subdomain="t"), "cluster.local") == "web"
    assert hosts.kernel_hostname(pod(subdomain="t", setHostnameAsFQDN=True), "cluster.local") == \
        "web.t.ns.svc.cluster.local"
    with pytest.raises(hosts.HostnameError, match=r"FQDN .* is too long"):
        hosts.kernel_hostname(pod("w" * 60, subdomain="t", setHostnameAsFQDN=True), "cluster.local")
    settings = Settings(cluster_domain="cluster.local")
    assert sandbox_config(pod(hostname="h", hostnameOverride="override-host"), settings).hostname == "override-host"
    assert sandbox_config(pod(hostNetwork=True), settings).hostname == ""


def test_host_aliases_are_parsed_with_errors_naming_the_field():
    p = pod(hostAliases=[{"ip": "123.45.67.89", "hostnames": ["foo.local", "bar.local"]}, {"ip": "::1"}])
    assert p.spec.host_aliases == (HostAlias("123.45.67.89", ("foo.local", "bar.local")), HostAlias("::1"))
    with pytest.raises(FieldError, match=r"spec.hostAliases\[0\].ip: required"):
        pod(hostAliases=[{"hostnames": ["a"]}])
    with pytest.raises(FieldError, match=r"spec.hostAliases\[0\].hostnames\[1\]: must be a string"):
        pod(hostAliases=[{"ip": "1.2.3.4", "hostnames": ["a", 1]}])
    with pytest.raises(FieldError, match=r"spec\.hostnameOverride: must be a string"):
        pod(hostnameOverride=5)


ALIASES = (HostAlias("123.45.67.89", ("foo.local", "bar.local")), HostAlias("456.78.90.123", ("park.local",)))


def test_managed_hosts_file_as_the_kubelets():
    assert hosts.managed_hosts(["10.0.0.9", "fd00::9"], "web", "t.ns.svc.cluster.local", ALIASES).decode() == (
        "# Kubernetes-managed hosts file.\n"
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "fe00::0\tip6-localnet\n"
        "fe00::0\tip6-mcastprefix\n"
        "fe00::1\tip6-allnodes\n"
        "fe00::2\tip6-allrouters\n"
        "10.0.0.9\tweb.t.ns.svc.cluster.local\tweb\n"
        "fd00::9\tweb.t.ns.svc.cluster.local\tweb\n"
        "\n"
        "# Entries added by HostAliases.\n"
        "123.45.67.89\tfoo.local\tbar.local\n"
        "456.78.90.123\tpark.local\n")
    assert hosts.managed_hosts(["10.0.0.9"], "override-host", "", ()).decode().endswith(
        "fe00::2\tip6-allrouters\n10.0.0.9\toverride-host\n")


def test_host_network_hosts_file_is_the_nodes_with_the_aliases():
    assert hosts.node_hosts(b"127.0.0.1 localhost\n", ALIASES[:1]) == (
        b"# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        b"\n# Entries added by HostAliases.\n123.45.67.89\tfoo.local\tbar.local\n")
    assert hosts.node_hosts(b"x\n", ()) == b"# Kubernetes-managed hosts file (host network).\nx\n"


def test_which_containers_get_the_hosts_file():
    plain = pod()
    assert hosts.mounts_hosts(plain, plain.spec.containers[0], ["10.0.0.9"])
    assert not hosts.mounts_hosts(plain, plain.spec.containers[0], [])  # no IP yet
    host = pod(hostNetwork=True)
    assert hosts.mounts_hosts(host, host.spec.containers[0], [])
    own = pod(containers=[{"name": "c", "image": "img:1",
                           "volumeMounts": [{"name": "v", "mountPath": "/etc/hosts"}]}],
              volumes=[{"name": "v", "emptyDir": {}}])
    assert not hosts.mounts_hosts(own, own.spec.containers[0], ["10.0.0.9"])


def started_config(p: Pod, tmp_path: Path):
    """The ContainerConfig of the pod's first container after one sync pass on the fake runtime."""
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer

    rt = FakeCRI()
    rt.add_image("sha256:i", "img:1")
    PodSyncer(rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs", cluster_domain="cluster.local")).sync(
        p, observe(rt, UID))
    (config,) = [c[2] for c in rt.calls if c[0] == "CreateContainer"]
    return config


def test_the_sync_mounts_the_kubelets_hosts_file_and_a_termination_message_file(tmp_path: Path):
    p = pod(hostnameOverride="override-host", hostAliases=[{"ip": "123.45.67.89", "hostnames": ["foo.local"]}])
    config = started_config(p, tmp_path)
    mounts = {m.container_path: m for m in config.mounts}
    etc_hosts = Path(mounts["/etc/hosts"].host_path)
    assert etc_hosts == tmp_path / "pods" / UID / "etc-hosts" and not mounts["/etc/hosts"].readonly
    text = etc_hosts.read_text()
    assert "10.0.0.9\toverride-host\n" in text and text.endswith("123.45.67.89\tfoo.local\n")
    message = Path(mounts["/dev/termination-log"].host_path)
    assert message.parent == tmp_path / "pods" / UID / "containers" / "c"
    assert message.read_bytes() == b"" and stat.S_IMODE(message.stat().st_mode) == 0o666


def test_a_container_that_mounts_etc_hosts_itself_keeps_its_own(tmp_path: Path):
    p = pod(containers=[{"name": "c", "image": "img:1", "terminationMessagePath": "/tmp/msg",
                         "volumeMounts": [{"name": "v", "mountPath": "/etc/hosts"}]}],
            volumes=[{"name": "v", "hostPath": {"path": str(tmp_path / "own")}}])
    config = started_config(p, tmp_path)
    assert [m.container_path for m in config.mounts] == ["/tmp/msg"]  # no volume manager in this sync
    assert not (tmp_path / "pods" / UID / "etc-hosts").exists()
