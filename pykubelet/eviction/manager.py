"""The eviction manager: every MONITORING_PERIOD it measures the node (memory, the kubelet root's and the
image filesystems, inodes, pids) and each pod's use of them, and acts on what pykubelet/eviction/policy.py
decides: it sets the node's MemoryPressure / DiskPressure / PIDPressure conditions, turns pods away at
admission while they hold, evicts every pod past its own local-storage limits, and, when a threshold is
met, evicts one pod (the first of the policy's ranking that is not critical) and waits for it to be gone
before the next cycle, as the kubelet's manager does.

Threat model: without it, one pod fills the node's disk (an emptyDir or its writable layer has no quota
here), its memory or its pid table, and every other pod and the kubelet itself fail with it. The
measurements are the node's own (statvfs, /proc, the pod's cgroup) or the runtime's (CRI
ContainerStats: working set, writable layer), never the pod's word. A du of a pod's emptyDir stays on
its filesystem and never follows a symlink, so a pod can't make the kubelet count (or walk) the host's
files; a pod that keeps making files only makes its own usage larger. Eviction kills with grace 0 for a
hard threshold and a local-storage limit, and at most evictionMaxPodGracePeriod for a soft one, so a
pod's long grace period does not keep the node short.
"""
from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pykubelet import runtime as cri
from pykubelet.api.podmodel import EmptyDirSource, Pod
from pykubelet.config import Settings, eviction_thresholds
from pykubelet.events import WARNING, EventRecorder, node_ref
from pykubelet.eviction import policy
from pykubelet.node import hostfacts
from pykubelet.pods.podspec import is_critical
from pynode_os import cgroups, mounts

log = logging.getLogger(__name__)

MONITORING_PERIOD = 10.0  # the kubelet's evictionMonitoringPeriod (its housekeeping interval)
CLEANUP_TIMEOUT = 30.0  # the kubelet's podCleanupTimeout: how long an eviction is waited for
TERMINAL = ("Succeeded", "Failed")


# --- reading the node -------------------------------------------------------------------------------

def memory_observation(info: dict[str, int]) -> policy.Observation:
    """memory.available as the kubelet computes it: capacity less the working set, the memory in use less
    the inactive file cache (which the kernel can drop)."""
    capacity = info["MemTotal"]
    working_set = max(0, capacity - info["MemFree"] - info.get("Inactive(file)", 0))
    return policy.Observation(capacity - working_set, capacity)


def pid_observation(pid_max: int, tasks: int) -> policy.Observation:
    return policy.Observation(pid_max - tasks, pid_max)


def fs_observations(prefix: str, path: str) -> dict[str, policy.Observation]:
    st = os.statvfs(path)
    return {f"{prefix}.available": policy.Observation(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize),
            f"{prefix}.inodesFree": policy.Observation(st.f_ffree, st.f_files)}


def du(path: Path) -> int:
    """Bytes of disk the tree at `path` takes (allocated blocks, each inode once), on its own filesystem and
    without following symlinks: the kubelet's du of a volume with no quota."""
    try:
        top = os.lstat(path)
    except OSError:
        return 0
    seen: set[int] = set()
    total = 0
    stack = [str(path)]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != top.st_dev or st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return total + top.st_blocks * 512


class EvictionManager:
    """`bind(pods, evict)` before run(): `pods()` the kubelet's pods with the phase they last reported,
    `evict(uid, message, grace)` kills one and marks it Evicted, True once done."""

    def __init__(self, runtime: cri.CRIRuntime, settings: Settings, events: EventRecorder | None = None,
                 clock: Callable[[], float] = time.monotonic, on_change: Callable[[], None] = lambda: None) -> None:
        self.runtime, self.settings, self.events, self.clock = runtime, settings, events, clock
        self.on_change = on_change  # the pressure conditions changed: the node status reports them now
        self.thresholds = eviction_thresholds(settings)
        self.state = policy.PressureState()
        self._conditions: list[str] = []
        self._lock = threading.Lock()
        self._pods: Callable[[], list[Pod]] = list
        self._evict: Callable[[str, str, int], bool] = lambda _uid, _message, _grace: False

    def bind(self, pods: Callable[[], list[Pod]], evict: Callable[[str, str, int], bool]) -> None:
        self._pods, self._evict = pods, evict

    def conditions(self) -> list[str]:
        with self._lock:
            return list(self._conditions)

    def admit(self, pod: Pod) -> str | None:
        """The admission's eviction handler: the rejection message, or None."""
        return policy.admit(pod, self.conditions())

    # --- measuring ------------------------------------------------------------------------------

    def observe(self) -> dict[str, policy.Observation]:
        out = {"memory.available": memory_observation(hostfacts.meminfo())}
        root = hostfacts.existing(self.settings.root_dir)
        out.update(fs_observations("nodefs", str(root)))
        image_fs = str(root)
        try:
            filesystems = self.runtime.image_fs_info().image_filesystems
            if filesystems and filesystems[0].fs_id.mountpoint:
                image_fs = filesystems[0].fs_id.mountpoint
        except cri.CRIError as e:
            log.debug("eviction: image filesystem unknown, taken as the root's: %s", e)
        out.update(fs_observations("imagefs", hostfacts.existing(Path(image_fs)).as_posix()))
        pid_max = hostfacts.pid_max()
        tasks = int(Path("/proc/loadavg").read_text().split()[3].partition("/")[2])
        out["pid.available"] = pid_observation(pid_max, tasks)
        return out

    def usage(self, pods: list[Pod]) -> dict[str, policy.PodUsage]:
        """Each pod's use of memory (its containers' working sets), disk (writable layers, logs, local
        volumes) and pids (its cgroup's count), for the pods that have containers."""
        from pykubelet.pods.criconfig import log_directory
        from pykubelet.pods.labels import CONTAINER_NAME, POD_UID
        from pykubelet.volumes.manager import PLUGIN_DIRS, pod_dir

        by_uid = {p.uid: p for p in pods}
        out: dict[str, policy.PodUsage] = {}
        names: dict[str, tuple[str, str]] = {}
        for c in self.runtime.list_containers():
            uid = c.labels.get(POD_UID, "")
            if uid in by_uid:
                names[c.id] = (uid, c.labels.get(CONTAINER_NAME, ""))
                out.setdefault(uid, policy.PodUsage())
        for s in self.runtime.list_container_stats():
            if s.attributes.id not in names:
                continue
            uid, name = names[s.attributes.id]
            cu = out[uid].containers.setdefault(name, policy.ContainerUsage())
            if s.HasField("memory") and s.memory.HasField("working_set_bytes"):
                cu.memory = (cu.memory or 0) + s.memory.working_set_bytes.value
            if s.HasField("writable_layer"):
                cu.disk = (cu.disk or 0) + s.writable_layer.used_bytes.value
        for uid, usage in out.items():
            pod = by_uid[uid]
            logs = log_directory(pod, self.settings)
            for spec in pod.spec.all_containers:
                cu = usage.containers.setdefault(spec.name, policy.ContainerUsage())
                cu.disk = (cu.disk or 0) + du(logs / spec.name)
            base = pod_dir(self.settings.root_dir, uid) / "volumes"
            for v in pod.spec.volumes:  # the kubelet's local ephemeral volumes
                if v.kind == "configMap" or (isinstance(v.source, EmptyDirSource) and v.source.medium != "Memory"):
                    usage.volumes[v.name] = du(base / PLUGIN_DIRS[v.kind] / v.name)
            memories = [cu.memory for cu in usage.containers.values() if cu.memory is not None]
            usage.memory = sum(memories) if memories else None
            usage.disk = sum(cu.disk or 0 for cu in usage.containers.values()) + sum(usage.volumes.values())
            usage.pids = self._pids(pod)
        return out

    def _pids(self, pod: Pod) -> int | None:
        from pykubelet.pods.criconfig import cgroup_parent

        parent = cgroup_parent(pod, self.settings)  # with systemd, the slice's expanded path
        try:
            v2 = cgroups.version(mounts.statfs_type) == cgroups.V2
        except OSError:
            return None
        root = Path(cgroups.CGROUP_ROOT)
        path = (root if v2 else root / "pids") / parent.strip("/") / "pids.current"
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    # --- acting ---------------------------------------------------------------------------------

    def _active(self) -> list[Pod]:
        return [p for p in self._pods() if p.status.phase not in TERMINAL and not p.metadata.deletion_timestamp]

    def _evict_pod(self, pod: Pod, message: str, grace: int) -> bool:
        if is_critical(pod):
            log.warning("eviction: cannot evict the critical pod %s", pod.key)
            return False
        log.info("eviction: evicting pod %s (grace %d s): %s", pod.key, grace, message)
        if not self._evict(pod.uid, message, grace):
            log.warning("eviction: pod %s not gone after %.0f s", pod.key, CLEANUP_TIMEOUT)
        return True

    def synchronize(self) -> Pod | None:
        """One cycle; returns the pod it evicted for a node threshold, if any."""
        observations = self.observe()
        decision = self.state.step(self.thresholds, observations, self.clock(),
                                   self.settings.eviction_pressure_transition_period)
        with self._lock:
            changed, self._conditions = self._conditions != decision.conditions, decision.conditions
        if changed:
            log.info("eviction: node conditions now %s", decision.conditions or "none")
            self.on_change()
        active = self._active()
        usage = self.usage(active)
        evicted = False
        for pod in active:  # local storage: each pod against its own limits, whatever the node's
            u = usage.get(pod.uid)
            message = policy.local_storage_violation(pod, u) if u is not None else None
            if message is not None:
                evicted = self._evict_pod(pod, message, 0) or evicted
        if evicted or not decision.act_on:
            return None
        threshold = decision.act_on[0]
        obs = observations.get(threshold.signal)
        if self.events is not None and obs is not None:
            self.events.event(node_ref(self.settings.node_name), WARNING, "EvictionThresholdMet",
                              f"Attempting to reclaim {threshold.resource}")
        for pod in policy.rank([p for p in active if p.uid in usage], usage, threshold.resource):
            message = policy.eviction_message(pod, threshold, obs, usage.get(pod.uid))
            if self._evict_pod(pod, message, policy.grace_period(threshold, pod,
                                                                 self.settings.eviction_max_pod_grace_period)):
                return pod
        log.warning("eviction: no pod to evict for %s", threshold.signal)
        return None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.synchronize()
            except (cri.CRIError, OSError) as e:
                log.warning("eviction: %s", e)
            stop.wait(MONITORING_PERIOD)
