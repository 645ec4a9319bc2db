"""Pod sysctls: which of spec.securityContext.sysctls the node lets a pod set, as the stock kubelet's
sysctl admission (pkg/kubelet/sysctl).

A sysctl is safe when it is namespaced (the pod's own network or IPC namespace) and isolated (it cannot
starve or reconfigure another pod): the kubelet's fixed list, plus three that are namespaced only from a
kernel version on. Every other sysctl, namespaced or not, is unsafe: kernel.msgmax, kernel.shmmax,
kernel.sem and net.core.somaxconn let one pod take what the node shares (IPC memory, socket backlogs).
An admin may allow some with KubeletConfiguration.allowedUnsafeSysctls (names, or prefixes ending in *),
but only namespaced ones (net.*, kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*): anything else stops
start-up. A pod sharing the host's network (hostNetwork) may set no net.* sysctl and one sharing the host's
IPC (hostIPC) no IPC sysctl, safe or allowed: it would change the host's. A pod with any other sysctl is
rejected at admission (phase Failed, reason SysctlForbidden, the kubelet's "forbidden sysctl: ..."), so
nothing of it reaches the runtime.

Names are compared in the dotted form: a name whose first separator is a slash (net/ipv4/ip_forward) has
its dots and slashes swapped first (a dot inside an interface name stays a part of it), as the kubelet's
NormalizeName. Which namespace holds which sysctl is the node's one table, pynode_os.sysctl.
"""
from __future__ import annotations

import os
import re

from pykubelet.api.podmodel import Pod
from pynode_os.sysctl import IPC, NET, UTS, namespace_of, normalize

FORBIDDEN_REASON = "SysctlForbidden"

# always safe (the kubelet's legacy list: never dropped, whatever the kernel)
SAFE = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes")
# safe from the kernel version that made them namespaced
SAFE_FROM_KERNEL = (("net.ipv4.ip_local_reserved_ports", (3, 16)), ("net.ipv4.tcp_rmem", (4, 15)),
                    ("net.ipv4.tcp_wmem", (4, 15)))

_MAX_LENGTH = 253
# the API's sysctl pattern (policy validation's IsValidSysctlPattern): dot or slash separated segments,
# the last of which may end in (or be) *
_SEGMENT = r"[a-z0-9]([-_a-z0-9]*[a-z0-9])?"
_PATTERN = re.compile(rf"({_SEGMENT}[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]")


def namespaced_by(name: str) -> str:
    """The namespace ("ipc", "net") a dotted sysctl name lives in, or "" when it is not namespaced. The UTS
    namespace's sysctls count as not namespaced, as in the kubelet's list: a pod's host name is its spec's."""
    ns = namespace_of(name)
    return "" if ns == UTS else ns


def kernel_version(release: str) -> tuple[int, ...]:
    """The leading numbers of a kernel release ("6.1.0-18-amd64" -> (6, 1, 0))."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", release)
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def safe_sysctls(release: str | None = None) -> list[str]:
    """The kubelet's safe set on a kernel of `release` (this one's by default)."""
    version = kernel_version(release if release is not None else os.uname().release)
    return list(SAFE) + [name for name, since in SAFE_FROM_KERNEL if version >= since]


class Allowlist:
    """Sysctl names and prefixes (a pattern ending in *) a pod may set; each known to be namespaced."""

    def __init__(self, patterns: list[str]) -> None:
        self.names: dict[str, str] = {}
        self.prefixes: dict[str, str] = {}
        for pattern in patterns:
            check_pattern(pattern)
            name = normalize(pattern)
            if name.endswith("*"):
                self.prefixes[name[:-1]] = namespaced_by(name[:-1])
            else:
                self.names[name] = namespaced_by(name)

    @classmethod
    def for_node(cls, allowed_unsafe: list[str], release: str | None = None) -> Allowlist:
        """The kubelet's: the safe set and the admin's allowedUnsafeSysctls."""
        return cls(safe_sysctls(release) + list(allowed_unsafe))

    def refusal(self, sysctl: str, host_net: bool, host_ipc: bool) -> str | None:
        """Why a pod may not set `sysctl` (the kubelet's validateSysctl), or None."""
        name = normalize(sysctl)
        ns = self.names.get(name)
        if ns is None:
            ns = next((n for p, n in self.prefixes.items() if name.startswith(p)), None)
        if ns is None:
            return f'"{name}" not allowlisted'
        if (ns == IPC and host_ipc) or (ns == NET and host_net):
            return f'"{name}" not allowed with host {ns} enabled'
        return None

    def admit(self, pod: Pod) -> str | None:
        """The message a pod is rejected with for its first forbidden sysctl, or None to admit it."""
        spec = pod.spec
        for name, _value in spec.security_context.sysctls:
            why = self.refusal(name, spec.host_network, spec.host_ipc)
            if why is not None:
                return f"forbidden sysctl: {why}"
        return None


def check_pattern(pattern: str) -> None:
    """Raises ValueError, as the kubelet's start-up refuses them, for an allowedUnsafeSysctls entry that is
    not a sysctl name or prefix, or that names no namespaced sysctl."""
    if len(pattern) > _MAX_LENGTH or not _PATTERN.fullmatch(pattern):
        raise ValueError(f"sysctl {pattern!r} must have at most {_MAX_LENGTH} characters and be a sysctl name "
                         "or a prefix ending in * (lower-case segments separated by . or /)")
    name = normalize(pattern)
    if not namespaced_by(name[:-1] if name.endswith("*") else name):
        raise ValueError(f"sysctl {pattern!r} is not known to be namespaced (only net.*, kernel.shm*, kernel.msg*, "
                         "kernel.sem and fs.mqueue.* are)")
