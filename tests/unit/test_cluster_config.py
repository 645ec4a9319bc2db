"""The configuration `make cluster` gives a node (pynode_cluster.node): the pod network on the node's pod CIDR,
and one KubeletConfiguration per kubelet that the kubelet itself accepts."""
from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import struct
import tarfile
import tomllib
import warnings
from pathlib import Path

import psutil
import pytest
from cryptography import x509

from pykubelet import config as kubelet_config
from pynode_cluster import cluster, components, coredns, hosts, pki
from pynode_cluster.node import CNI_BRIDGE, Node, containerd_config, pod_network
from tests.kit import coredns as kit_coredns


def test_pod_network_is_the_default_conflist_on_the_pod_cidr(tmp_path: Path) -> None:
    conf = pod_network("10.244.3.0/24", tmp_path / "ipam")
    bridge = conf["plugins"][0]
    assert conf["cniVersion"] == "1.0.0"  # containerd 1.6 refuses a 1.1.0 result
    assert bridge["type"] == "pybridge" and bridge["bridge"] == CNI_BRIDGE and bridge["isDefaultGateway"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")


def test_containerds_runc_gets_its_binary_and_the_systemd_driver_only_when_asked(tmp_path: Path) -> None:
    """A table of runc's options only with something in it, and both options in the one table (TOML refuses a
    table defined twice)."""
    def runc_options(**kw) -> dict | None:
        config = tomllib.loads(containerd_config(tmp_path, tmp_path / "sock", tmp_path / "bin", tmp_path / "net.d",
                                                 **kw))
        runc = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
        assert runc["runtime_type"] == "io.containerd.runc.v2"
        return runc.get("options")
    assert runc_options() is None
    assert runc_options(oci_runtime="/usr/bin/pyruntime") == {"BinaryName": "/usr/bin/pyruntime"}
    assert runc_options(systemd_cgroup=True) == {"SystemdCgroup": True}
    assert runc_options(oci_runtime="/x/pyruntime", systemd_cgroup=True) == {
        "BinaryName": "/x/pyruntime", "SystemdCgroup": True}


def test_write_network_replaces_the_file_whole(tmp_path: Path) -> None:
    node = Node("node-1", "10.203.0.21", tmp_path / "node", tmp_path / "run")
    node.cni_conf.mkdir(parents=True)
    path = node.write_network("10.244.0.0/24")
    assert json.loads(path.read_text())["plugins"][0]["ipam"]["ranges"][0][0]["subnet"] == "10.244.0.0/24"
    assert [p.name for p in node.cni_conf.iterdir()] == ["10-pynode.conflist"]


def test_pykubelet_accepts_its_configuration(tmp_path: Path) -> None:
    node = Node("node-1", "10.203.0.21", tmp_path / "node", tmp_path / "run", cluster_dns=components.DNS_IP)
    argv = node.kubelet_argv(tmp_path / "kubelet.kubeconfig", tmp_path / "pki")
    settings = kubelet_config.load_file(Path(argv[argv.index("--config") + 1]))
    assert settings["cgroup_root"] == "/pynode-cluster-node-1"
    assert settings["container_runtime_endpoint"] == f"unix://{tmp_path}/run/cri.sock"
    assert settings["address"] == "10.203.0.21"
    assert settings["cluster_dns"] == ["10.96.0.10"] and settings["cluster_domain"] == "cluster.local"


def test_a_cluster_node_gets_the_cluster_dns_and_the_clusters_resolv_conf(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cluster, "RESOLV_CONF", tmp_path / "resolv.conf")
    record = cluster.NodeRecord("node-1", "10.203.0.21", "pync-n1", "kubelet", "containerd")
    config = record.node().kubelet_config(tmp_path / "pki")
    assert config["clusterDNS"] == [components.DNS_IP] and config["clusterDomain"] == components.CLUSTER_DOMAIN
    assert config["resolvConf"] == str(tmp_path / "resolv.conf")
    mine = cluster.NodeRecord("node-2", "10.203.0.22", "pync-n2", "pykubelet", "pyruntime-cri").node()
    assert mine.kubelet_config(tmp_path / "pki")["resolvConf"] == str(tmp_path / "resolv.conf")  # pykubelet's too
    # the lab runs no cluster DNS: its nodes' pods keep the host's
    assert "clusterDNS" not in Node("n", "10.0.0.2", tmp_path, tmp_path).kubelet_config(tmp_path)


def test_coredns_is_kubeadms_add_on_at_the_clusterdns_address() -> None:
    items = {(o["kind"], o["metadata"]["name"]): o for o in coredns.manifests(components.DNS_IP, "cluster.local")}
    assert set(items) == {("ConfigMap", "coredns"), ("ClusterRole", "system:coredns"),
                          ("ClusterRoleBinding", "system:coredns"), ("ServiceAccount", "coredns"),
                          ("Deployment", "coredns"), ("Service", "kube-dns")}
    service = items["Service", "kube-dns"]
    assert service["spec"]["clusterIP"] == "10.96.0.10" and service["metadata"]["namespace"] == "kube-system"
    assert {(p["port"], p["protocol"]) for p in service["spec"]["ports"]} == {(53, "UDP"), (53, "TCP"), (9153, "TCP")}
    deployment = items["Deployment", "coredns"]
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2 and spec["dnsPolicy"] == "Default"
    assert spec["serviceAccountName"] == "coredns" and service["spec"]["selector"] == {"k8s-app": "kube-dns"}
    assert spec["containers"][0]["image"] == "registry.k8s.io/coredns/coredns:v1.14.6"
    corefile = items["ConfigMap", "coredns"]["data"]["Corefile"]
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa {" in corefile
    assert "forward . /etc/resolv.conf {" in corefile and "disable denial cluster.local" in corefile


def static_elf(path: Path, marker: int = 0) -> bytes:
    """The smallest ELF that elf_interpreter reads as static: a 64-bit header and no program headers."""
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, marker, 0, 0, 0, 64, 0, 0,
                                                                    0, 0, 0)
    path.write_bytes(header)
    return header


def test_the_coredns_image_is_the_one_static_binary(tmp_path: Path, monkeypatch) -> None:
    binary = tmp_path / "coredns"
    header = static_elf(binary)
    monkeypatch.setattr(kit_coredns, "LAYOUTS", tmp_path / "layouts")
    layout = kit_coredns.cached_layout(binary)
    assert kit_coredns.cached_layout(binary) == layout  # kept for the same binary ...
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "v1.14.6"
    blob = layout / "blobs" / "sha256"
    manifest = json.loads((blob / index["manifests"][0]["digest"].split(":")[1]).read_text())
    config = json.loads((blob / manifest["config"]["digest"].split(":")[1]).read_text())
    assert config["config"]["Entrypoint"] == ["/coredns"] and "User" not in config["config"]
    (layer,) = manifest["layers"]
    with tarfile.open(blob / layer["digest"].split(":")[1]) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.mode) == ("coredns", 0o755)
        assert tar.extractfile(member).read() == header  # type: ignore[union-attr]  # a regular file has a reader
    static_elf(binary, marker=1)
    assert kit_coredns.cached_layout(binary) != layout and not layout.exists()  # ... and made again for another


def test_the_stock_kubelet_gets_what_this_machine_needs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("pynode_cluster.node.peer", lambda name: f"/peers/{name}")
    node = Node("node-1", "10.203.0.21", tmp_path / "node", tmp_path / "run", kubelet="kubelet")
    argv = node.kubelet_argv(tmp_path / "kubelet.kubeconfig", tmp_path / "pki")
    assert argv[0] == "/peers/kubelet"
    config = json.loads(Path(argv[argv.index("--config") + 1]).read_text())
    assert config["failCgroupV1"] is False and config["failSwapOn"] is False
    assert config["cgroupDriver"] == "cgroupfs" and config["resolvConf"] == ""  # no resolv.conf given


def test_unknown_pairs_are_refused_by_name() -> None:
    with pytest.raises(cluster.ClusterError, match="KUBELET=crio"):
        cluster.up(kubelet="crio")


def test_the_record_round_trips(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cluster, "STATE", tmp_path)
    record = cluster.Record(nodes=[cluster.NodeRecord("node-1", "10.203.0.21", "pync-n1", "pykubelet",
                                                      "pyruntime-cri", "10.244.0.0/24")],
                            netns=["pync-cp", "pync-n1"], routes=["10.244.0.0/24 via 10.203.0.21"])
    record.save()
    assert cluster.Record.load() == record


def test_a_daemon_killed_restarts_as_it_was_started(tmp_path: Path) -> None:
    """Daemons.restart: the same command line, log and environment after a kill -9; a live one is left alone."""
    daemons = hosts.Daemons(tmp_path / "pids")
    log = tmp_path / "sleeper.log"
    argv = ["sh", "-c", "echo started $SLEEPER; exec sleep 60"]
    with warnings.catch_warnings():  # a daemon's Popen goes while it runs: detached on purpose
        warnings.simplefilter("ignore", ResourceWarning)
        restarted(daemons, argv, log)


def restarted(daemons: hosts.Daemons, argv: list[str], log: Path) -> None:
    first = daemons.start("sleeper", argv, log, env={"SLEEPER": "one"})
    try:
        assert daemons.restart("sleeper") == first
        hosts.wait_for("the first start logged", lambda: log.exists() and "started one" in log.read_text(), 10)
        os.kill(first, signal.SIGKILL)
        hosts.ended(psutil.Process(first), 10)
        second = daemons.restart("sleeper")
        assert second != first and getattr(daemons.process("sleeper"), "pid", None) == second
        assert json.loads((daemons.dir / "sleeper.json").read_text())["argv"] == argv
        hosts.wait_for("both starts logged", lambda: log.read_text().count("started one") == 2, 10)
    finally:
        daemons.stop("sleeper", grace=1)


@pytest.fixture
def peers(tmp_path: Path, monkeypatch) -> None:
    """Stand-ins for the Go-built peers the command lines name (the unit tests run without them)."""
    monkeypatch.setattr(components, "PEERS", tmp_path / "peers")
    for name in ("kube-apiserver", "metrics-server"):
        (tmp_path / "peers").mkdir(exist_ok=True)
        (tmp_path / "peers" / name).write_text("")
        (tmp_path / "peers" / name).chmod(0o755)


def test_metrics_server_is_verified_by_the_cluster_ca_under_the_services_name(tmp_path: Path, peers) -> None:
    """The aggregator checks metrics-server's cert against the APIService's caBundle for the name
    SERVICE.NAMESPACE.svc; the kubelets' certs against the CA metrics-server is given."""
    ca = pki.CA(tmp_path)
    assert ca.ensure(pki.metrics_server_serving("10.203.0.10"))
    cert = x509.load_pem_x509_certificate((tmp_path / "metrics-server-serving.crt").read_bytes())
    cert.verify_directly_issued_by(ca.cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["metrics-server.kube-system.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.203.0.10"]
    objects = {o["kind"]: o for o in components.metrics_server_objects("10.203.0.10", ca.pair.cert.read_bytes())}
    api = objects["APIService"]["spec"]
    assert base64.b64decode(api["caBundle"]) == ca.pair.cert.read_bytes() and "insecureSkipTLSVerify" not in api
    service = api["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in components.METRICS_SERVER_NAMES
    endpoints = objects["EndpointSlice"]
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == service["name"]
    assert endpoints["endpoints"][0]["addresses"] == ["10.203.0.10"]
    assert endpoints["ports"][0]["port"] == components.METRICS_SERVER_PORT
    argv = components.metrics_server_argv(kubeconfig=tmp_path / "m.kubeconfig", address="10.203.0.10",
                                          pki=tmp_path)
    assert Path(argv[argv.index("--tls-cert-file") + 1]).exists()
    assert argv[argv.index("--kubelet-certificate-authority") + 1] == str(ca.pair.cert)
    assert "--kubelet-insecure-tls" not in argv


def test_the_aggregator_proxies_with_the_front_proxy_client(tmp_path: Path, peers) -> None:
    """kube-apiserver's requestheader flags name the files pki.front_proxy writes, and its client cert is
    the front-proxy CA's, not the cluster CA's."""
    front = pki.front_proxy(tmp_path / "front-proxy")
    argv = components.apiserver_argv(etcd="http://127.0.0.1:2379", address="10.203.0.10", port=6443,
                                     pki=tmp_path, front_proxy=front.dir)
    flags = {a: b for a, b in itertools.pairwise(argv) if a.startswith("--")}
    client = x509.load_pem_x509_certificate(Path(flags["--proxy-client-cert-file"]).read_bytes())
    client.verify_directly_issued_by(front.cert)
    assert Path(flags["--requestheader-client-ca-file"]) == front.pair.cert
    assert Path(flags["--proxy-client-key-file"]).exists()
    assert client.subject.rfc4514_string() == f"CN={flags['--requestheader-allowed-names']}"
    assert "--enable-aggregator-routing=true" in argv
    without = components.apiserver_argv(etcd="http://127.0.0.1:2379", address="10.203.0.10", port=6443, pki=tmp_path)
    assert not any(a.startswith(("--requestheader", "--proxy-client", "--enable-aggregator")) for a in without)


def test_routes_into_the_cluster_networks_are_named():
    """The Vagrant lab's host route to a node's pods (10.244.1.0/24) is what made a second `up` fail halfway
    with "File exists": `up` names it first. The default route and unrelated routes are the host's own."""
    routes = [{"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
              {"dst": "192.0.2.0/24", "dev": "eth0"},
              {"dst": "10.244.1.0/24", "gateway": "10.207.0.21", "dev": "pynodelab0"},
              {"dst": "10.0.0.0/8", "dev": "wg0"}]
    assert cluster.routes_into(routes) == [
        "10.244.1.0/24 via 10.207.0.21 dev pynodelab0 overlaps 10.244.0.0/16, the pods' CIDRs",
        "10.0.0.0/8 dev wg0 overlaps 10.203.0.0/24, the hosts' subnet",
        "10.0.0.0/8 dev wg0 overlaps 10.244.0.0/16, the pods' CIDRs",
        "10.0.0.0/8 dev wg0 overlaps 10.96.0.0/16, the Services' CIDR"]
    assert cluster.routes_into(routes[:2]) == []
