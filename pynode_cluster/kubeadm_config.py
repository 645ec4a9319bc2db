"""kubeadm's configuration for nodes of ours, the same for `make cluster KUBEADM=1` (kubeadm_node.py) and the
kubeadm lab (lab_kubeadm.py): the release kubeadm is, the API of its configuration files, and how a node of ours
registers.

Preflight runs whole; the one check ignored is SystemVerification on a cgroup v1 host (this VM), which fails there
for any kubelet from 1.35 on and whose message asks for exactly that. On a cgroup v2 host nothing is ignored.
Light on imports: the lab's VMs load it from the installed wheel, without the test extra.
"""
from __future__ import annotations

from pynode_os import cgroups, mounts

KUBERNETES_VERSION = "v1.37.2"
KUBEADM_API = "kubeadm.k8s.io/v1beta4"


def cgroup_v1() -> bool:
    return cgroups.version(mounts.statfs_type) == cgroups.V1


def ignored_preflight() -> list[str]:
    """What kubeadm's preflight must not fail on, on this host: SystemVerification on cgroup v1 (a host fact:
    kubeadm fails it for kubelet >= 1.35 and says to skip it explicitly)."""
    return ["SystemVerification"] if cgroup_v1() else []


def registration(name: str, address: str, cri_socket: str) -> dict:
    """kubeadm's nodeRegistration for a node of ours: its name, the CRI socket (kubeadm knows only containerd's,
    CRI-O's and cri-dockerd's), and the address the kubelet reports (kubeadm guesses none from a host without a
    default route, and the API server reaches the kubelet there)."""
    return {"name": name, "criSocket": cri_socket, "kubeletExtraArgs": [{"name": "node-ip", "value": address}],
            "ignorePreflightErrors": ignored_preflight()}
