"""The pure parts of a one-machine kubeadm node (pynode_cluster/kubeadm_node.py, nodeinit.py): the kubelet's
command line as kubeadm's systemd drop-in builds it, the join command kubeadm prints, the configuration given to
kubeadm, the systemctl answers kubeadm reads (the node's init with no process started), and the pair of each
node."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pynode_cluster import cluster, kubeadm_config, nodeinit
from pynode_cluster.kubeadm_node import KubeadmNode, parse_join_command
from pynode_cluster.node import Node

HASH = "sha256:" + "ab" * 32


def test_kubeadm_flags_env_is_split_as_systemd_splits_it(tmp_path):
    flags = tmp_path / "kubeadm-flags.env"
    flags.write_text('KUBELET_KUBEADM_ARGS="--hostname-override=node-2 --node-ip=10.203.0.22 '
                     '--register-with-taints=a=b:NoSchedule"\n')
    assert nodeinit.kubeadm_args(flags) == ["--hostname-override=node-2", "--node-ip=10.203.0.22",
                                            "--register-with-taints=a=b:NoSchedule"]
    flags.write_text('KUBELET_KUBEADM_ARGS=""\n')
    assert nodeinit.kubeadm_args(flags) == []
    assert nodeinit.kubeadm_args(tmp_path / "missing") == []


def test_the_kubelet_waits_for_kubeadms_config(tmp_path, monkeypatch):
    monkeypatch.setattr(nodeinit, "KUBELET_CONFIG", tmp_path / "config.yaml")
    monkeypatch.setattr(nodeinit, "KUBEADM_FLAGS", tmp_path / "kubeadm-flags.env")
    assert nodeinit.kubelet_argv("/usr/bin/kubelet") is None
    (tmp_path / "config.yaml").write_text("{}")
    (tmp_path / "kubeadm-flags.env").write_text('KUBELET_KUBEADM_ARGS="--node-ip=10.0.0.1"\n')
    argv = nodeinit.kubelet_argv("/usr/bin/kubelet")
    assert argv is not None
    assert argv[0] == "/usr/bin/kubelet" and argv[-1] == "--node-ip=10.0.0.1"
    assert "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf" in argv
    assert "--kubeconfig=/etc/kubernetes/kubelet.conf" in argv


def test_parse_join_command():
    printed = f"kubeadm join 10.203.0.21:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash {HASH} \n"
    assert parse_join_command(printed) == ("10.203.0.21:6443", "abcdef.0123456789abcdef", HASH)
    with pytest.raises(ValueError, match="not a kubeadm join command"):
        parse_join_command("error: the server has asked for the client to provide credentials")


def node(tmp_path: Path) -> KubeadmNode:
    return KubeadmNode(Node("node-2", "10.203.0.22", tmp_path / "node-2", tmp_path / "run"), "pync-n2",
                       tmp_path / "mnt" / "node-2")


def test_join_config_names_the_node_its_address_socket_and_cgroup_root(tmp_path):
    kn = node(tmp_path)
    config = yaml.safe_load(kn.join_config(
        f"kubeadm join 10.203.0.21:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash {HASH}"))
    assert config["kind"] == "JoinConfiguration"
    assert config["discovery"]["bootstrapToken"] == {"apiServerEndpoint": "10.203.0.21:6443",
                                                     "token": "abcdef.0123456789abcdef", "caCertHashes": [HASH]}
    registration = config["nodeRegistration"]
    assert registration["name"] == "node-2"
    assert registration["criSocket"] == f"unix://{tmp_path}/run/cri.sock"
    assert registration["kubeletExtraArgs"] == [{"name": "node-ip", "value": "10.203.0.22"}]
    patch = Path(config["patches"]["directory"]) / "kubeletconfiguration+merge.yaml"
    assert yaml.safe_load(patch.read_text()) == {"cgroupRoot": "/pynode-cluster-node-2"}


def test_init_config_keeps_kube_proxy_off_the_hosts_conntrack_table(tmp_path):
    docs = {d["kind"]: d for d in yaml.safe_load_all(node(tmp_path).init_config(tmp_path / "resolv.conf"))}
    assert docs["InitConfiguration"]["localAPIEndpoint"]["advertiseAddress"] == "10.203.0.22"
    assert docs["ClusterConfiguration"]["networking"]["podSubnet"] == "10.244.0.0/16"
    assert docs["KubeProxyConfiguration"]["conntrack"] == {"maxPerCore": 0}
    assert docs["KubeletConfiguration"]["resolvConf"] == str(tmp_path / "resolv.conf")


def test_only_systemverification_is_ignored_and_only_on_cgroup_v1(monkeypatch):
    monkeypatch.setattr(kubeadm_config, "cgroup_v1", lambda: True)
    assert kubeadm_config.ignored_preflight() == ["SystemVerification"]
    monkeypatch.setattr(kubeadm_config, "cgroup_v1", lambda: False)
    assert kubeadm_config.ignored_preflight() == []


def test_systemctl_answers_as_systemd_for_units_the_node_lacks(tmp_path):
    init = nodeinit.Init(tmp_path / "init", tmp_path / "logs", ["true"], "kubelet")
    assert init.command("daemon-reload", "") == (0, "")
    assert init.command("is-active", "firewalld") == (3, "inactive\n")
    rc, out = init.command("status", "firewalld")
    assert rc == 4 and "could not be found" in out
    assert init.command("is-enabled", "kubelet.service") == (0, "enabled\n")
    assert init.command("is-active", "kubelet") == (3, "activating\n")  # wanted, not running: kubeadm's "active"


def test_a_stopped_unit_stays_stopped_across_an_init_restart(tmp_path):
    init = nodeinit.Init(tmp_path / "init", tmp_path / "logs", ["true"], "kubelet")
    (tmp_path / "init").mkdir()
    assert init.command("stop", "kubelet") == (0, "")
    again = nodeinit.Init(tmp_path / "init", tmp_path / "logs", ["true"], "kubelet")
    assert again.wanted == {"runtime": True, "kubelet": False}
    assert again.command("is-active", "kubelet") == (3, "inactive\n")


def test_a_pair_per_node_only_for_kubeadm_clusters_and_one_for_each_node():
    assert cluster.node_pairs(2, "pykubelet", "pyruntime-cri", False) == [("pykubelet", "pyruntime-cri")] * 2
    assert cluster.node_pairs(2, "pykubelet,kubelet", "pyruntime-cri,containerd", True) == [
        ("pykubelet", "pyruntime-cri"), ("kubelet", "containerd")]
    with pytest.raises(cluster.ClusterError, match="a pair per node is for KUBEADM=1 clusters"):
        cluster.node_pairs(2, "pykubelet,kubelet", "pyruntime-cri", False)
    with pytest.raises(cluster.ClusterError, match="a list names the pair of each of the 3 nodes"):
        cluster.node_pairs(3, "pykubelet,kubelet", "pyruntime-cri,containerd", True)
    with pytest.raises(cluster.ClusterError, match="a runtime one of pyruntime-cri, containerd"):
        cluster.node_pairs(1, "pykubelet", "crio", True)
