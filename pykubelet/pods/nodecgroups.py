"""The kubelet's cgroups with their limits (what they are is pykubelet/pods/cgroupconfig.py's): kubepods by node
allocatable and the QoS cgroups at start, the system- and kube-reserved cgroups when enforceNodeAllocatable
names them, and each pod's cgroup before its sandbox and after an in-place resize, as the stock kubelet's
container manager (createNodeAllocatableCgroups, qosContainerManager, podContainerManager.EnsureExists).

Under the cgroupfs driver the cgroups are directories, made and written here in the cpu, memory and pids
hierarchies (cgroup v1) or in the one hierarchy with those controllers enabled down to them (v2); the runtime
makes the rest of the pod's cgroup path, in every other hierarchy, as the cgroup parent it is given. Under
the systemd driver they are slices (pykubelet/pods/slices.py), started with the limits as unit properties and
changed through SetUnitProperties: systemd owns their files.
"""
from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pykubelet.api.podmodel import Pod
from pykubelet.config import Settings
from pykubelet.node import hostfacts
from pykubelet.pods import cgroupconfig
from pykubelet.pods.cgroupconfig import ResourceConfig
from pykubelet.pods.podspec import qos_class
from pykubelet.pods.slices import PodSlices, kubepods, pod_cgroup_name
from pynode_os import cgroups, mounts

log = logging.getLogger(__name__)

CONTROLLERS = ("cpu", "memory", "pids")


def machine_capacity() -> dict[str, int]:
    """What the kubepods cgroup is limited from: cpu in millicores, memory in bytes, pid the kernel's
    pid_max or threads-max, whichever is less (the kubelet's pidlimit)."""
    return {"cpu": hostfacts.cpu_count() * 1000, "memory": hostfacts.meminfo()["MemTotal"],
            "pid": min(hostfacts.pid_max(), hostfacts.threads_max())}


def _write(path: str, value: str) -> None:
    """A cgroup control file is written in place: it is the kernel's, not a file to replace."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    except OSError as e:
        raise OSError(e.errno, f"write {value!r} to {path}: {os.strerror(e.errno or 0)}") from None
    finally:
        os.close(fd)


class NodeCgroups:
    """`slices`: the systemd driver's (None under cgroupfs); `active_pods`: the pods running now, of which the
    burstable QoS cgroup's shares are summed; `root`: the cgroup mount root (tests: a directory)."""

    def __init__(self, settings: Settings, slices: PodSlices | None, active_pods: Callable[[], list[Pod]],
                 root: str = cgroups.CGROUP_ROOT, version: str | None = None) -> None:
        self.settings, self.slices, self.active_pods, self.root = settings, slices, active_pods, root
        self.v2 = (version or cgroups.version(mounts.statfs_type, root)) == cgroups.V2

    # --- deciding, from the settings -----------------------------------------------------------------------

    def pod_config(self, pod: Pod) -> ResourceConfig:
        return cgroupconfig.pod_config(pod, self.settings.pod_pids_limit)

    def kubepods_config(self, capacity: dict[str, int]) -> ResourceConfig:
        s = self.settings
        return cgroupconfig.kubepods_config(capacity, s.enforce_node_allocatable, s.system_reserved, s.kube_reserved)

    # --- doing ---------------------------------------------------------------------------------------------

    def ensure_node(self, capacity: dict[str, int] | None = None) -> None:
        """kubepods with node allocatable's limits, the QoS cgroups, and the reserved cgroups enforced; before
        any pod. Raises OSError or SystemdError: the kubelet cannot run pods."""
        top = kubepods(self.settings)
        self._apply(top, self.kubepods_config(capacity or machine_capacity()), update=True)
        for qos, rc in cgroupconfig.qos_configs(self.active_pods()).items():
            self._apply(top + [qos], rc, update=True)
        enforce = self.settings.enforce_node_allocatable
        for key, cgroup, reserved in (("system-reserved", self.settings.system_reserved_cgroup,
                                       self.settings.system_reserved),
                                      ("kube-reserved", self.settings.kube_reserved_cgroup,
                                       self.settings.kube_reserved)):
            if key in enforce or f"{key}-compressible" in enforce:
                rc = cgroupconfig.reserved_config(reserved, compressible_only=key not in enforce)
                self._existing(cgroup, rc)
                log.info("enforced %s on %s", key, cgroup)

    def ensure_pod(self, pod: Pod) -> None:
        """The pod's cgroup with its limits, before its sandbox, and the burstable QoS cgroup's shares with the
        pod counted, as SyncPod's UpdateQOSCgroups and EnsureExists."""
        self.update_qos((pod,))
        self._apply(pod_cgroup_name(pod.uid, qos_class(pod), self.settings), self.pod_config(pod), update=False)

    def update_pod(self, pod: Pod, leave: frozenset[str] = frozenset()) -> None:
        """The pod's cgroup to the pod's resources, those of `leave` ("cpu", "memory") as they are: at an
        in-place resize, what grows before its containers do and what shrinks after."""
        rc = self.pod_config(pod)
        if "cpu" in leave:
            rc = replace(rc, cpu_shares=None, cpu_quota=None, cpu_period=None)
        if "memory" in leave:
            rc = replace(rc, memory=None)
        self._apply(pod_cgroup_name(pod.uid, qos_class(pod), self.settings), rc, update=True)

    def update_qos(self, more: tuple[Pod, ...] = ()) -> None:
        pods = {p.uid: p for p in [*self.active_pods(), *more]}
        rc = cgroupconfig.qos_configs(pods.values())["burstable"]
        self._apply(kubepods(self.settings) + ["burstable"], rc, update=True)

    def _apply(self, name: list[str], rc: ResourceConfig, update: bool) -> None:
        if self.slices is not None:
            self.slices.apply(name, cgroupconfig.systemd_properties(rc, self.v2), update=update)
            return
        relative = "/".join(name)
        if self.v2:
            self._make_v2(relative)
            for _controller, file, value in cgroupconfig.v2_files(rc):
                _write(os.path.join(self.root, relative, file), value)
            return
        for controller in CONTROLLERS:
            os.makedirs(os.path.join(self.root, controller, relative), mode=0o755, exist_ok=True)
        for controller, file, value in cgroupconfig.v1_files(rc):
            _write(os.path.join(self.root, controller, relative, file), value)

    def _make_v2(self, relative: str) -> None:
        """Each level made, and its parent's controllers enabled for it (cgroup.subtree_control), as runc's fs2
        CreateCgroupPath: a limit's file is there only with its controller enabled."""
        current = self.root
        for part in relative.split("/"):
            available = Path(current, "cgroup.controllers").read_text().split()
            wanted = " ".join(f"+{c}" for c in CONTROLLERS if c in available)
            if wanted:
                try:
                    _write(os.path.join(current, "cgroup.subtree_control"), wanted)
                except OSError as e:
                    if e.errno != errno.EBUSY:  # a cgroup with processes in it: the root's are enabled already
                        raise
            current = os.path.join(current, part)
            os.makedirs(current, mode=0o755, exist_ok=True)

    def _existing(self, cgroup: str, rc: ResourceConfig) -> None:
        """systemReservedCgroup, kubeReservedCgroup: the cgroup is the operator's and must exist (Validate)."""
        if self.slices is not None:
            self.slices.update_unit(os.path.basename(cgroup.rstrip("/")),
                                    cgroupconfig.systemd_properties(rc, self.v2))
            return
        relative = cgroup.strip("/")
        if self.v2:
            files = [(os.path.join(self.root, relative), f, v) for _c, f, v in cgroupconfig.v2_files(rc)]
        else:
            files = [(os.path.join(self.root, c, relative), f, v) for c, f, v in cgroupconfig.v1_files(rc)]
        for directory, file, value in files:
            if not os.path.isdir(directory):
                raise OSError(errno.ENOENT, f"cgroup {cgroup} does not exist: {directory}")
            _write(os.path.join(directory, file), value)
