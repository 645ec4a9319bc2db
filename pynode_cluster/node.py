"""What one node runs and how it is configured: a CRI runtime (pyruntime-cri or containerd), a kubelet (pykubelet
or the stock one), both with our CNI plugins, and the stock kube-proxy. The interop matrix of issue 11 is every
pair of kubelet and runtime, so both sides are interchangeable here behind the same paths. Every node is wired
here: `make cluster`'s and the lab's (Node), and `pynode run`'s, which has no API server (StandaloneNode).

The pod network is written only once the controller manager has given the node its pod CIDR (the runtimes
read the CNI conf dir again when it changes; until then they report NetworkReady false and the node stays
NotReady, so nothing is scheduled onto a network that does not exist yet).

All of a node's files live under its own directory and its pods' cgroups under a cgroup root of its own, so
several nodes share one machine and `down` finds everything a node made.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from cni_plugins.install import DEFAULT_CONFLIST, install
from pynode_cluster.components import CLUSTER_DOMAIN, peer
from pyruntime.settings import DEFAULT_HOSTS_DIR

KUBELETS = ("pykubelet", "kubelet")
RUNTIMES = ("pyruntime-cri", "containerd")
SANDBOX_IMAGE = "registry.k8s.io/pause:3.6"  # containerd 1.6's default sandbox image
CNI_BRIDGE = "cni0"  # inside the node's network namespace, so every node may use the name
# the stock kubelet's eviction thresholds here: ones the disk of a shared test host does not cross
STOCK_EVICTION_HARD = {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"}

CONTAINERD_CONFIG = """version = 2
root = "{dir}/root"
state = "{dir}/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  enable_selinux = false
  # this VM withholds CAP_SYS_RESOURCE, so the sandbox may not lower its OOM score below ours
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
"""
RUNC_OPTIONS = """      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
"""


def containerd_config(work: Path, sock: Path, cni_bin: Path, cni_conf: Path, hosts: Path | str = "",
                      sandbox_image: str = SANDBOX_IMAGE, oci_runtime: Path | str = "",
                      systemd_cgroup: bool = False) -> str:
    """containerd 1.6's config with CRI on, its root and state under `work`; `oci_runtime`: the binary its
    runc shim runs instead of runc; `systemd_cgroup`: runc's systemd cgroup driver (SystemdCgroup, as on kubeadm's
    hosts), each container a transient scope in the slice the kubelet gives as the pod's cgroup parent."""
    text = CONTAINERD_CONFIG.format(dir=work, sock=sock, sandbox_image=sandbox_image, cni_bin=cni_bin,
                                    cni_conf=cni_conf, hosts=hosts)
    options = ([f'BinaryName = "{oci_runtime}"'] if oci_runtime else []) + \
        (["SystemdCgroup = true"] if systemd_cgroup else [])
    return text + (RUNC_OPTIONS + "".join(f"        {line}\n" for line in options) if options else "")


def install_plugins(bin_dir: Path) -> None:
    """Our CNI plugins in `bin_dir`, with `loopback` (which a CRI server calls for the sandbox's lo) being
    pyloopback."""
    install(bin_dir)
    if not (bin_dir / "loopback").exists():
        os.symlink(bin_dir / "pyloopback", bin_dir / "loopback")


def pod_network(pod_cidr: str, data_dir: Path, bridge_name: str = CNI_BRIDGE) -> dict:
    """The project's default network (cni_plugins/10-pynode.conflist) on the node's pod CIDR, at CNI 1.0.0:
    containerd 1.6's libcni refuses a 1.1.0 result."""
    conf = json.loads(DEFAULT_CONFLIST.read_text())
    conf["cniVersion"] = "1.0.0"
    bridge = conf["plugins"][0]
    bridge["bridge"] = bridge_name
    bridge["ipam"]["ranges"] = [[{"subnet": pod_cidr}]]
    bridge["ipam"]["dataDir"] = str(data_dir)
    return conf


def launcher(name: str) -> str:
    """This checkout's launcher (next to the interpreter), else the one on PATH."""
    own = Path(sys.executable).with_name(name)
    return str(own) if own.exists() else (shutil.which(name) or name)


@dataclass
class Node:
    """One node: `dir` holds its files (persistent), `run` its sockets and volatile state."""
    name: str
    address: str
    dir: Path
    run: Path
    kubelet: str = "pykubelet"
    runtime: str = "pyruntime-cri"
    cluster_dns: str = ""  # the kubelets' clusterDNS (the kube-dns Service's address); "": none
    resolv_conf: Path | None = None  # the kubelets' resolvConf (dnsPolicy Default's DNS); None: the stock one ""

    @property
    def sock(self) -> Path:
        return self.run / "cri.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.sock}"

    @property
    def cni_conf(self) -> Path:
        return self.dir / "net.d"

    @property
    def cni_bin(self) -> Path:
        return self.dir / "cni-bin"

    @property
    def cgroup_root(self) -> str:
        return f"/pynode-cluster-{self.name}"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"

    @property
    def cri_root(self) -> Path:
        return self.dir / "cri-root"

    @property
    def cri_state(self) -> Path:
        return self.run / "cri-state"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    def runtime_argv(self, hosts_dir: Path) -> list[str]:
        """The CRI server, with an empty CNI conf dir until write_network()."""
        install_plugins(self.cni_bin)
        self.cni_conf.mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        if self.runtime == "containerd":
            work = self.dir / "containerd"
            work.mkdir(parents=True, exist_ok=True)
            (work / "containerd.toml").write_text(containerd_config(work, self.sock, self.cni_bin, self.cni_conf,
                                                                    hosts_dir))
        return self.runtime_command(hosts_dir)

    def runtime_command(self, hosts_dir: Path) -> list[str]:
        """The CRI server's command line alone (runtime_argv writes the files it reads)."""
        if self.runtime == "pyruntime-cri":
            return [launcher("pyruntime-cri"), "--listen", self.endpoint, "--root", str(self.cri_root),
                    "--state", str(self.cri_state), "--cni-conf-dir", str(self.cni_conf),
                    "--cni-bin-dir", str(self.cni_bin), "--registry-config-dir", str(hosts_dir)]
        if self.runtime == "containerd":
            config = self.dir / "containerd" / "containerd.toml"
            return [shutil.which("containerd") or "/usr/bin/containerd", "--config", str(config)]
        raise ValueError(f"runtime {self.runtime!r}: not one of {', '.join(RUNTIMES)}")

    @property
    def network_file(self) -> Path:
        return self.cni_conf / "10-pynode.conflist"

    def network(self, pod_cidr: str, bridge: str = CNI_BRIDGE) -> str:
        """The text of the node's pod network on `pod_cidr`."""
        return json.dumps(pod_network(pod_cidr, self.dir / "ipam", bridge), indent=2)

    def write_network(self, pod_cidr: str, bridge: str = CNI_BRIDGE) -> Path:
        path = self.network_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.network(pod_cidr, bridge))
        tmp.rename(path)
        return path

    @property
    def kubelet_config_file(self) -> Path:
        return self.dir / "kubelet.json"

    def kubelet_argv(self, kubeconfig: Path, pki: Path) -> list[str]:
        """The kubelet for this node (kubelet_command), its configuration written."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.kubelet_config_file.write_text(json.dumps(self.kubelet_config(pki), indent=2))
        return self.kubelet_command(kubeconfig)

    def kubelet_config(self, pki: Path) -> dict:
        """The KubeletConfiguration: serving on the node's address with a cert of the cluster CA, authorizing
        the apiserver's calls by webhook as kubeadm's kubelets do."""
        config: dict = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": self.endpoint, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "podLogsDir": str(self.pod_logs), "address": self.address, "port": 10250,
            "tlsCertFile": str(pki / f"kubelet-{self.name}-serving.crt"),
            "tlsPrivateKeyFile": str(pki / f"kubelet-{self.name}-serving.key"),
            "authentication": {"x509": {"clientCAFile": str(pki / "ca.crt")}, "anonymous": {"enabled": False},
                               "webhook": {"enabled": True}},
            "authorization": {"mode": "Webhook"},
            "failSwapOn": False, "failCgroupV1": False, "syncFrequency": "10s",
        }
        if self.cluster_dns:
            config |= {"clusterDNS": [self.cluster_dns], "clusterDomain": CLUSTER_DOMAIN}
        if self.resolv_conf:
            config["resolvConf"] = str(self.resolv_conf)
        if self.kubelet == "kubelet":
            # the stock kubelet on hybrid (v1) cgroups, its files kept under the node's directory
            config |= {"volumePluginDir": str(self.dir / "volume-plugins"),
                       "resolvConf": str(self.resolv_conf) if self.resolv_conf else "",
                       "healthzBindAddress": "127.0.0.1", "readOnlyPort": 0, "evictionHard": STOCK_EVICTION_HARD}
        elif self.kubelet != "pykubelet":
            raise ValueError(f"kubelet {self.kubelet!r}: not one of {', '.join(KUBELETS)}")
        return config

    def kubelet_command(self, kubeconfig: Path) -> list[str]:
        """The kubelet's command line, reading kubelet_config_file."""
        if self.kubelet == "kubelet":
            binary = peer("kubelet")
        elif self.kubelet == "pykubelet":
            binary = launcher("pykubelet")
        else:
            raise ValueError(f"kubelet {self.kubelet!r}: not one of {', '.join(KUBELETS)}")
        return [binary, "--config", str(self.kubelet_config_file), "--kubeconfig", str(kubeconfig),
                "--hostname-override", self.name, "--node-ip", self.address, "--root-dir", str(self.kubelet_root),
                "-v", "2" if self.kubelet == "kubelet" else "0"]


@dataclass
class StandaloneNode:
    """A node without an API server (`pynode run`): pykubelet alone runs the static pods of `manifests` on
    pyruntime-cri. Its files, its CRI server's command line and its pod network are a cluster node's (`node`),
    but it lives in the host's network namespace and no controller manager gives it a pod CIDR: so its
    bridge, subnet and cgroup root are names of its own, which nothing else on the host uses, and which its
    removal finds again."""
    node: Node
    bridge: str
    subnet: str
    cgroup_root: str

    @property
    def manifests(self) -> Path:
        return self.node.dir / "manifests"

    def runtime_argv(self) -> list[str]:
        """pyruntime-cri, its CNI plugins and its pod network written. Registries are configured as for any
        pyruntime-cri on this host (its default hosts dir): the node's own pods pull nothing."""
        argv = self.node.runtime_argv(Path(DEFAULT_HOSTS_DIR))
        self.node.write_network(self.subnet, self.bridge)
        return argv

    def kubelet_config(self) -> dict:
        """Static pods only. Its HTTPS server listens on the node's address (loopback) and, without an API
        server, has no webhook to ask, so it refuses every request (a client certificate and
        authorization.mode AlwaysAllow would open it)."""
        return {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                "containerRuntimeEndpoint": self.node.endpoint, "cgroupRoot": self.cgroup_root,
                "podLogsDir": str(self.node.pod_logs), "staticPodPath": str(self.manifests),
                "fileCheckFrequency": "20s", "address": self.node.address}

    def kubelet_argv(self) -> list[str]:
        """pykubelet without a kubeconfig, its configuration written."""
        self.node.dir.mkdir(parents=True, exist_ok=True)
        self.node.kubelet_config_file.write_text(json.dumps(self.kubelet_config(), indent=2))
        return [launcher("pykubelet"), "--config", str(self.node.kubelet_config_file), "--hostname-override",
                self.node.name, "--root-dir", str(self.node.kubelet_root), "-v", "0"]
