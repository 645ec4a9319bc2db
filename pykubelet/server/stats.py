"""/stats/summary: the Summary API (stats/v1alpha1), and the numbers /metrics/resource (metrics.py) serves
to metrics-server and `kubectl top`, built once here for both. The node's are the root cgroup's, as the
stock kubelet's (cadvisor's "/"): its cpu.stat and memory.stat on cgroup v2, /proc/stat and /proc/meminfo
where the root has none (cgroup v1); statvfs of the kubelet's root and log directories. Pods' come from
the CRI (ListPodSandbox for who they are, ListContainerStats for their containers; a pod's cpu, memory
and swap are its containers' sums, as upstream's CRI stats provider does when the runtime gives no
pod-level stats).

Times are kept as epoch seconds until the summary is rendered: the Summary API's JSON has whole seconds
(metav1.Time), the resource metrics carry milliseconds and the containers' exact start times.
The CPU rate (usageNanoCores) is the change of the cumulative usage since the previous summary, as
upstream computes it; the first summary has none. Missing numbers are left out, never made up.
"""
from __future__ import annotations

import datetime
import os
import threading
import time
from pathlib import Path
from typing import Any

from proto import api_pb2
from pykubelet.config import Settings
from pykubelet.node import hostfacts

USER_HZ = os.sysconf("SC_CLK_TCK")
CGROUP_ROOT = Path("/sys/fs/cgroup")
TIME_KEYS = ("time", "startTime")  # the Summary API's metav1.Time fields


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _keyed(path: Path) -> dict[str, int] | None:
    """A flat keyed cgroup file (cpu.stat, memory.stat), None where the root cgroup has none (v1)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return {k: int(v) for k, _, v in (line.partition(" ") for line in text.splitlines()) if v}


def _proc_stat() -> tuple[int, float]:
    """Cumulative CPU use of the machine (ns, all cores) and its boot time (epoch seconds), by /proc/stat."""
    used, boot = 0, 0.0
    with open("/proc/stat") as f:
        for line in f:
            fields = line.split()
            if fields[0] == "cpu":  # user nice system idle iowait irq softirq steal ...
                used = sum(int(v) for i, v in enumerate(fields[1:9]) if i not in (3, 4))
            elif fields[0] == "btime":
                boot = float(fields[1])
    return used * 1_000_000_000 // USER_HZ, boot


def boot_time() -> float:
    return _proc_stat()[1]


def _cpu_and_boot(root: Path = CGROUP_ROOT) -> tuple[int, float]:
    """Cumulative CPU use of the machine (ns, all cores) and its boot time (epoch seconds)."""
    used, boot = _proc_stat()
    cpu = _keyed(root / "cpu.stat")
    if cpu is not None and "usage_usec" in cpu:
        return cpu["usage_usec"] * 1000, boot
    return used, boot


def _node_memory(now: float, mem: dict[str, int], root: Path = CGROUP_ROOT) -> dict:
    """The root cgroup's usage and working set as runc and cadvisor count them on cgroup v2 (anon + file,
    less inactive file), from /proc/meminfo where the root has no memory.stat."""
    available = mem.get("MemAvailable", mem["MemFree"])
    out: dict[str, Any] = {"time": now, "availableBytes": available}
    stat = _keyed(root / "memory.stat")
    if stat is not None and "anon" in stat:
        usage = stat["anon"] + stat.get("file", 0)
        out.update(usageBytes=usage, workingSetBytes=max(0, usage - stat.get("inactive_file", 0)),
                   rssBytes=stat["anon"], pageFaults=stat.get("pgfault", 0), majorPageFaults=stat.get("pgmajfault", 0))
    else:
        out.update(usageBytes=mem["MemTotal"] - mem["MemFree"], workingSetBytes=mem["MemTotal"] - available)
    return out


def _node_swap(now: float, mem: dict[str, int]) -> dict | None:
    if "SwapTotal" not in mem:
        return None
    free = mem.get("SwapFree", 0)
    return {"time": now, "swapAvailableBytes": free, "swapUsageBytes": mem["SwapTotal"] - free}


def fs_stats(path: Path) -> dict:
    st = os.statvfs(path)
    return {"time": time.time(), "availableBytes": st.f_bavail * st.f_frsize,
            "capacityBytes": st.f_blocks * st.f_frsize, "usedBytes": (st.f_blocks - st.f_bfree) * st.f_frsize,
            "inodesFree": st.f_ffree, "inodes": st.f_files, "inodesUsed": st.f_files - st.f_ffree}


def _value(wrapper) -> int | None:
    """The number of a CRI UInt64Value field, None when the runtime did not set it."""
    return wrapper.value if wrapper is not None and wrapper.ByteSize() else None


def _fields(message, names: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The Summary API's keys of the CRI message's UInt64Value fields that the runtime set."""
    out: dict[str, Any] = {"time": message.timestamp / 1e9}
    for key, field in names:
        v = _value(getattr(message, field)) if message.HasField(field) else None
        if v is not None:
            out[key] = v
    return out


def container_stats(stats: api_pb2.ContainerStats, created: float | None) -> dict:
    out: dict = {"name": stats.attributes.metadata.name}
    if created:
        out["startTime"] = created
    if stats.HasField("cpu"):
        out["cpu"] = _fields(stats.cpu, (("usageCoreNanoSeconds", "usage_core_nano_seconds"),
                                         ("usageNanoCores", "usage_nano_cores")))
    if stats.HasField("memory"):
        out["memory"] = _fields(stats.memory, (
            ("workingSetBytes", "working_set_bytes"), ("availableBytes", "available_bytes"),
            ("usageBytes", "usage_bytes"), ("rssBytes", "rss_bytes"), ("pageFaults", "page_faults"),
            ("majorPageFaults", "major_page_faults")))
    if stats.HasField("swap"):
        out["swap"] = _fields(stats.swap, (("swapAvailableBytes", "swap_available_bytes"),
                                           ("swapUsageBytes", "swap_usage_bytes")))
    if stats.HasField("writable_layer"):
        layer = stats.writable_layer
        out["rootfs"] = {"time": layer.timestamp / 1e9, "usedBytes": layer.used_bytes.value,
                         "inodesUsed": layer.inodes_used.value}
    return out


def _sum(containers: list[dict], kind: str, keys: tuple[str, ...]) -> dict | None:
    parts = [c[kind] for c in containers if kind in c]
    if not parts:
        return None
    out = {"time": max(p["time"] for p in parts)}
    for key in keys:
        values = [p[key] for p in parts if key in p]
        if values:
            out[key] = sum(values)
    return out


def rendered(value: Any) -> Any:
    """`value` with its times (epoch seconds) as the Summary API's RFC 3339 strings."""
    if isinstance(value, dict):
        return {k: rfc3339(v) if k in TIME_KEYS else rendered(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rendered(v) for v in value]
    return value


class Summary:
    """Builds summaries; keeps the previous CPU sample for the node's rate. `full=False` gives only what
    /metrics/resource serves (the stock kubelet's GetCPUAndMemoryStats): cpu, memory and swap, without
    the file systems, log directory sizes and rlimits."""

    def __init__(self, runtime, settings: Settings) -> None:
        self.runtime, self.settings = runtime, settings
        self._last: tuple[float, int] | None = None
        self._lock = threading.Lock()

    def node(self, full: bool = True) -> dict:
        now = time.time()
        cpu_ns, boot = _cpu_and_boot()
        with self._lock:
            last, self._last = self._last, (now, cpu_ns)
        cpu: dict = {"time": now, "usageCoreNanoSeconds": cpu_ns}
        if last is not None and now > last[0]:
            cpu["usageNanoCores"] = max(0, int((cpu_ns - last[1]) / (now - last[0])))
        mem = hostfacts.meminfo()
        out = {"nodeName": self.settings.node_name, "startTime": boot, "cpu": cpu,
               "memory": _node_memory(now, mem)}
        swap = _node_swap(now, mem)
        if swap is not None:
            out["swap"] = swap
        if not full:
            return out
        out.update(fs=fs_stats(hostfacts.existing(self.settings.root_dir)),
                   rlimit={"time": now, "maxpid": hostfacts.pid_max(),
                           "curproc": sum(1 for n in os.listdir("/proc") if n.isdigit())})
        try:
            image_fs = self.runtime.image_fs_info().image_filesystems
        except Exception:  # a runtime without image fs stats leaves the field out
            image_fs = []
        if image_fs:
            fs = image_fs[0]
            where = Path(fs.fs_id.mountpoint) if fs.fs_id.mountpoint else self.settings.root_dir
            stats = fs_stats(hostfacts.existing(where))
            stats.update(usedBytes=fs.used_bytes.value, inodesUsed=fs.inodes_used.value)
            out["runtime"] = {"imageFs": stats}
        return out

    def pods(self, full: bool = True) -> list[dict]:
        sandboxes = {s.id: s for s in self.runtime.list_pod_sandbox()
                     if s.state == api_pb2.SANDBOX_READY}
        containers = {c.id: c for c in self.runtime.list_containers()}
        by_pod: dict[str, list[dict]] = {sid: [] for sid in sandboxes}
        for stats in self.runtime.list_container_stats():
            c = containers.get(stats.attributes.id)
            if c is None or c.pod_sandbox_id not in by_pod or c.state != api_pb2.CONTAINER_RUNNING:
                continue
            by_pod[c.pod_sandbox_id].append(container_stats(stats, c.created_at / 1e9))
        logs_fs = fs_stats(hostfacts.existing(self.settings.pod_logs_dir)) if full else {}
        out = []
        for sid, sandbox in sandboxes.items():
            meta = sandbox.metadata
            pod: dict = {"podRef": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
                         "startTime": sandbox.created_at / 1e9,
                         "containers": sorted(by_pod[sid], key=lambda c: c["name"])}
            for kind, keys in (("cpu", ("usageCoreNanoSeconds", "usageNanoCores")),
                               ("memory", ("workingSetBytes", "usageBytes", "rssBytes", "pageFaults",
                                           "majorPageFaults")),
                               ("swap", ("swapUsageBytes",))):
                total = _sum(pod["containers"], kind, keys)
                if total is not None:
                    pod[kind] = total
            if full:
                for c in pod["containers"]:
                    c["logs"] = dict(logs_fs, usedBytes=_dir_size(
                        self.settings.pod_logs_dir / f"{meta.namespace}_{meta.name}_{meta.uid}" / c["name"]))
            out.append(pod)
        return sorted(out, key=lambda p: (p["podRef"]["namespace"], p["podRef"]["name"]))

    def summary(self) -> dict:
        """The Summary API's JSON document."""
        return rendered({"node": self.node(), "pods": self.pods()})

    def cpu_and_memory(self) -> dict:
        """The numbers of /metrics/resource, times as epoch seconds."""
        return {"node": self.node(full=False), "pods": self.pods(full=False)}


def _dir_size(path) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0
