"""Which sysctls a namespace makes private, and where a sysctl is under /proc/sys.

A sysctl set for a pod or a container must be one its own namespace holds, else writing it changes the
host for every process on it. The kernel namespaces kernel.sem and the kernel.shm*, kernel.msg* and
fs.mqueue.* families (the IPC namespace), net.* (the network namespace), and kernel.hostname and
kernel.domainname (the UTS namespace): the table of runc's validator and the kubelet's sysctl admission,
kept once here. Each layer puts its own policy on top: the CRI's pods may set no UTS sysctl (a pod's host
name is its sandbox config's), and the kubelet admits only its safe set and what the admin allowed.

Names are dotted (net.ipv4.ip_forward) or slashed (net/ipv4/ip_forward). `normalize` gives the dotted form
as the kubelet's NormalizeName does: a name whose first separator is a slash has its dots and slashes
swapped, so that a dot inside an interface name (eth0.100) stays a part of it; `proc_path` undoes that.
"""
from __future__ import annotations

IPC, NET, UTS = "ipc", "net", "uts"  # as /proc/PID/ns names the namespaces
_EXACT = {"kernel.sem": IPC, "kernel.hostname": UTS, "kernel.domainname": UTS}
_PREFIXES = (("kernel.shm", IPC), ("kernel.msg", IPC), ("fs.mqueue.", IPC), ("net.", NET))
_SWAP = str.maketrans("./", "/.")


def normalize(name: str) -> str:
    """The dotted form of a sysctl name (the kubelet's NormalizeName)."""
    first = next((c for c in name if c in "./"), ".")
    return name if first == "." else name.translate(_SWAP)


def namespace_of(name: str) -> str:
    """The namespace (IPC, NET, UTS) that holds the sysctl of dotted name `name`, or "" when none does."""
    if name in _EXACT:
        return _EXACT[name]
    return next((ns for prefix, ns in _PREFIXES if name.startswith(prefix)), "")


def proc_path(name: str) -> str:
    """The file under /proc/sys of a sysctl named with dots or with slashes."""
    return "/proc/sys/" + normalize(name).translate(_SWAP)
