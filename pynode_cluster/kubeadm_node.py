"""A kubeadm node on one machine (`make cluster KUBEADM=1`): kind without containers. kubeadm works on fixed paths
(/etc/kubernetes, /var/lib/kubelet, /var/lib/etcd, the pods' logs), so several nodes on one host each get a mount
namespace of their own beside their network namespace, in which those directories are private bind mounts of the
node's own (under its directory, where the host reads them: admin.conf among them). Everything else is the host's.

In those namespaces run the node's init (nodeinit.py: the runtime and the kubelet units, as systemd runs them on
a kubeadm host), and kubeadm itself, with the node's bin directory first on PATH: `kubelet` is the node's kubelet
(preflight runs `kubelet --version`), `systemctl` reaches the node's init. kubeadm's configuration is the one a
lab writes for kubeadm: the node's name and address (netns share the host's hostname and have no default route
for kubeadm to guess from), the CRI socket, and a patch giving each node a cgroup root of its own (the
cluster-wide KubeletConfiguration cannot), so that `down` finds every cgroup a node made.

Preflight runs whole but for what kubeadm_config.ignored_preflight says of this host.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from pynode_cluster.components import CLUSTER_CIDR, CLUSTER_DOMAIN, SERVICE_CIDR, peer
from pynode_cluster.hosts import NETNS_DIR
from pynode_cluster.kubeadm_config import KUBEADM_API, KUBERNETES_VERSION, cgroup_v1, registration
from pynode_cluster.node import STOCK_EVICTION_HARD, Node, launcher

# kubeadm's paths: private to each node
PRIVATE_DIRS = ("/etc/kubernetes", "/var/lib/kubelet", "/var/lib/etcd", "/var/log/pods", "/var/log/containers")
# what kube-proxy's DaemonSet mounts from the host, created (and on `down` removed) by the cluster if missing,
# rather than by the runtime (a missing hostPath source becomes a directory) where `down` would not know of it
HOST_PATHS = {"/usr/lib/modules": "dir", "/run/xtables.lock": "file"}


@dataclass
class KubeadmNode:
    """`node`: the node's runtime and dirs (node.py); `mntns`: its mount namespace's file; `netns`: its network
    namespace's name."""
    node: Node
    netns: str
    mntns: Path

    @property
    def root(self) -> Path:
        """Where the node's private directories live on the host: root/etc/kubernetes ..."""
        return self.node.dir / "root"

    def private(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    @property
    def bin(self) -> Path:
        return self.node.dir / "bin"

    @property
    def init_dir(self) -> Path:
        return self.node.run / "init"

    @property
    def patches(self) -> Path:
        return self.node.dir / "patches"

    def enter(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", f"--mount={self.mntns}", "--", *argv]

    def make_mount_namespace(self, etc_hosts: Path) -> None:
        """The node's mount namespace, held by a bind mount of it at `mntns` (which, as `ip netns`'s files,
        must sit on a private mount: the cluster's run dir is made one), with the private directories bound in
        (their mount points exist on the host: the cluster made the missing ones), and `etc_hosts` as
        /etc/hosts: the nodes' names resolve, as kubeadm's Hostname check and the API server's Hostname address
        type want, while the host's own file stays as it is."""
        self.mntns.touch()
        binds = [f"mount --bind {shlex.quote(str(etc_hosts))} /etc/hosts"]
        for path in PRIVATE_DIRS:
            source = self.private(path)
            source.mkdir(parents=True, exist_ok=True)
            binds.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(path)}")
        subprocess.run(["unshare", f"--mount={self.mntns}", "--propagation", "private", "sh", "-ec",
                        " && ".join(binds)], check=True, capture_output=True, text=True)

    def write_bin(self) -> None:
        """`kubelet` (the node's: pykubelet or the stock one) and `systemctl` as kubeadm finds them on PATH."""
        self.bin.mkdir(parents=True, exist_ok=True)
        binary = peer("kubelet") if self.node.kubelet == "kubelet" else launcher("pykubelet")
        scripts = {"kubelet": f"exec {shlex.quote(binary)} \"$@\"",
                   "systemctl": f"exec {shlex.quote(sys.executable)} -m pynode_cluster.nodeinit systemctl "
                                f"{shlex.quote(str(self.init_dir / 'init.sock'))} \"$@\""}
        for name, line in scripts.items():
            path = self.bin / name
            path.write_text(f"#!/bin/sh\n{line}\n")
            path.chmod(0o755)

    def init_argv(self, hosts_dir: Path, logs: Path) -> list[str]:
        """The node's init, in the node's namespaces (nsenter execs it: its pid is the init's), its units'
        logs in `logs`."""
        runtime = self.node.runtime_argv(hosts_dir)
        self.init_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        return self.enter([sys.executable, "-m", "pynode_cluster.nodeinit", "run", str(self.init_dir), str(logs),
                           str(self.bin / "kubelet"), "--", *runtime])

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}

    def kubeadm(self, *args: str, log: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        """kubeadm in the node's namespaces, its output appended to `log` and returned."""
        argv = self.enter([peer("kubeadm"), *args])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, **self.env()})
        with open(log, "a") as f:
            f.write(f"$ kubeadm {' '.join(args)}\n{result.stdout}{result.stderr}(exit {result.returncode})\n")
        return result

    def kubelet_patch(self) -> dict:
        """What the node's KubeletConfiguration changes from the cluster's: its own cgroup root; and for the
        stock kubelet, what `make cluster` gives it on this host too (node.py): the driver of containerd 1.6,
        which has no RuntimeConfig to say it, volume plugins under the node's dir, not the host's
        /usr/libexec, and eviction thresholds a shared test host's disk does not cross."""
        patch: dict = {"cgroupRoot": self.node.cgroup_root}
        if self.node.kubelet == "kubelet":
            patch |= {"volumePluginDir": str(self.node.dir / "volume-plugins"), "evictionHard": STOCK_EVICTION_HARD}
        if self.node.runtime == "containerd":
            patch["cgroupDriver"] = "cgroupfs"
        return patch

    def write_patches(self) -> Path:
        """kubeadm's patches directory for the node: kubelet_patch on top of the cluster's configuration."""
        self.patches.mkdir(parents=True, exist_ok=True)
        (self.patches / "kubeletconfiguration+merge.yaml").write_text(yaml.safe_dump(self.kubelet_patch()))
        return self.patches

    def registration(self) -> dict:
        return registration(self.node.name, self.node.address, self.node.endpoint)

    def init_config(self, resolv_conf: Path) -> str:
        """kubeadm init's configuration: this node the first control plane, the cluster's networks those of
        `make cluster`, kube-proxy without conntrack sizing (a node's netns shares the host's conntrack
        table, which is not its to size), the kubelets' upstream DNS the cluster's (resolv_conf)."""
        docs: list[dict] = [
            {"apiVersion": KUBEADM_API, "kind": "InitConfiguration",
             "localAPIEndpoint": {"advertiseAddress": self.node.address, "bindPort": 6443},
             "nodeRegistration": self.registration(), "patches": {"directory": str(self.write_patches())}},
            {"apiVersion": KUBEADM_API, "kind": "ClusterConfiguration", "kubernetesVersion": KUBERNETES_VERSION,
             "networking": {"podSubnet": CLUSTER_CIDR, "serviceSubnet": SERVICE_CIDR, "dnsDomain": CLUSTER_DOMAIN}},
            {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
             "resolvConf": str(resolv_conf), **({"failCgroupV1": False} if cgroup_v1() else {})},
            {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
             "conntrack": {"maxPerCore": 0}},
        ]
        return yaml.safe_dump_all(docs)

    def join_config(self, join_command: str) -> str:
        """kubeadm join's configuration from the command `kubeadm token create --print-join-command` printed."""
        endpoint, token, ca_hash = parse_join_command(join_command)
        return yaml.safe_dump({
            "apiVersion": KUBEADM_API, "kind": "JoinConfiguration",
            "discovery": {"bootstrapToken": {"apiServerEndpoint": endpoint, "token": token,
                                             "caCertHashes": [ca_hash]}},
            "nodeRegistration": self.registration(), "patches": {"directory": str(self.write_patches())}})


def parse_join_command(text: str) -> tuple[str, str, str]:
    """(API server endpoint, token, CA cert hash) of `kubeadm join HOST:PORT --token T
    --discovery-token-ca-cert-hash sha256:H`."""
    match = re.search(r"kubeadm join (\S+) --token (\S+)\s+--discovery-token-ca-cert-hash (sha256:[0-9a-f]{64})",
                      text)
    if match is None:
        raise ValueError(f"not a kubeadm join command: {text.strip()!r}")
    return match.group(1), match.group(2), match.group(3)
