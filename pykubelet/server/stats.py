"""/stats/summary: the Summary API (stats/v1alpha1) that metrics-server and `kubectl top` read, from the
machine (/proc, statvfs of the kubelet's root and log directories) for the node and from the CRI for pods
(ListPodSandbox for who they are, ListContainerStats for their containers; a pod's cpu and memory are
its containers' sums, as upstream's CRI stats provider does when the runtime gives no pod-level stats).

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
from pykubelet.node.status import _existing, _meminfo  # the node status's readers of the same numbers

USER_HZ = os.sysconf("SC_CLK_TCK")


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cpu_and_boot() -> tuple[int, float]:
    """Cumulative CPU use of the machine (ns, all cores) and its boot time (epoch seconds)."""
    used, boot = 0, 0.0
    with open("/proc/stat") as f:
        for line in f:
            fields = line.split()
            if fields[0] == "cpu":  # user nice system idle iowait irq softirq steal ...
                used = sum(int(v) for i, v in enumerate(fields[1:9]) if i not in (3, 4))
            elif fields[0] == "btime":
                boot = float(fields[1])
    return used * 1_000_000_000 // USER_HZ, boot


def fs_stats(path: Path) -> dict:
    st = os.statvfs(path)
    return {"time": rfc3339(time.time()), "availableBytes": st.f_bavail * st.f_frsize,
            "capacityBytes": st.f_blocks * st.f_frsize, "usedBytes": (st.f_blocks - st.f_bfree) * st.f_frsize,
            "inodesFree": st.f_ffree, "inodes": st.f_files, "inodesUsed": st.f_files - st.f_ffree}


def _value(wrapper) -> int | None:
    """The number of a CRI UInt64Value field, None when the runtime did not set it."""
    return wrapper.value if wrapper is not None and wrapper.ByteSize() else None


def container_stats(stats: api_pb2.ContainerStats, created: float | None) -> dict:
    out: dict = {"name": stats.attributes.metadata.name}
    if created:
        out["startTime"] = rfc3339(created)
    if stats.HasField("cpu"):
        cpu: dict[str, Any] = {"time": rfc3339(stats.cpu.timestamp / 1e9)}
        for key, field in (("usageCoreNanoSeconds", "usage_core_nano_seconds"), ("usageNanoCores", "usage_nano_cores")):
            v = _value(getattr(stats.cpu, field)) if stats.cpu.HasField(field) else None
            if v is not None:
                cpu[key] = v
        out["cpu"] = cpu
    if stats.HasField("memory"):
        mem: dict[str, Any] = {"time": rfc3339(stats.memory.timestamp / 1e9)}
        for key, field in (("workingSetBytes", "working_set_bytes"), ("availableBytes", "available_bytes"),
                           ("usageBytes", "usage_bytes"), ("rssBytes", "rss_bytes"), ("pageFaults", "page_faults"),
                           ("majorPageFaults", "major_page_faults")):
            v = _value(getattr(stats.memory, field)) if stats.memory.HasField(field) else None
            if v is not None:
                mem[key] = v
        out["memory"] = mem
    if stats.HasField("writable_layer"):
        layer = stats.writable_layer
        out["rootfs"] = {"time": rfc3339(layer.timestamp / 1e9), "usedBytes": layer.used_bytes.value,
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


class Summary:
    """Builds summaries; keeps the previous CPU sample for the node's rate."""

    def __init__(self, runtime, settings: Settings) -> None:
        self.runtime, self.settings = runtime, settings
        self._last: tuple[float, int] | None = None
        self._lock = threading.Lock()

    def node(self) -> dict:
        now = time.time()
        cpu_ns, boot = _cpu_and_boot()
        with self._lock:
            last, self._last = self._last, (now, cpu_ns)
        cpu: dict = {"time": rfc3339(now), "usageCoreNanoSeconds": cpu_ns}
        if last is not None and now > last[0]:
            cpu["usageNanoCores"] = max(0, int((cpu_ns - last[1]) / (now - last[0])))
        mem = _meminfo()
        available = mem.get("MemAvailable", mem["MemFree"])
        out = {"nodeName": self.settings.node_name, "startTime": rfc3339(boot), "cpu": cpu,
               "memory": {"time": rfc3339(now), "availableBytes": available,
                          "usageBytes": mem["MemTotal"] - mem["MemFree"],
                          "workingSetBytes": mem["MemTotal"] - available},
               "fs": fs_stats(_existing(self.settings.root_dir)),
               "rlimit": {"time": rfc3339(now), "maxpid": int(Path("/proc/sys/kernel/pid_max").read_text()),
                          "curproc": sum(1 for n in os.listdir("/proc") if n.isdigit())}}
        try:
            image_fs = self.runtime.image_fs_info().image_filesystems
        except Exception:  # a runtime without image fs stats leaves the field out
            image_fs = []
        if image_fs:
            fs = image_fs[0]
            stats = fs_stats(_existing(Path(fs.fs_id.mountpoint) if fs.fs_id.mountpoint else self.settings.root_dir))
            stats.update(usedBytes=fs.used_bytes.value, inodesUsed=fs.inodes_used.value)
            out["runtime"] = {"imageFs": stats}
        return out

    def pods(self) -> list[dict]:
        sandboxes = {s.id: s for s in self.runtime.list_pod_sandbox()
                     if s.state == api_pb2.SANDBOX_READY}
        containers = {c.id: c for c in self.runtime.list_containers()}
        by_pod: dict[str, list[dict]] = {sid: [] for sid in sandboxes}
        for stats in self.runtime.list_container_stats():
            c = containers.get(stats.attributes.id)
            if c is None or c.pod_sandbox_id not in by_pod or c.state != api_pb2.CONTAINER_RUNNING:
                continue
            by_pod[c.pod_sandbox_id].append(container_stats(stats, c.created_at / 1e9))
        logs_fs = fs_stats(_existing(self.settings.pod_logs_dir))
        out = []
        for sid, sandbox in sandboxes.items():
            meta = sandbox.metadata
            pod: dict = {"podRef": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
                         "startTime": rfc3339(sandbox.created_at / 1e9),
                         "containers": sorted(by_pod[sid], key=lambda c: c["name"])}
            for kind, keys in (("cpu", ("usageCoreNanoSeconds", "usageNanoCores")),
                               ("memory", ("workingSetBytes", "usageBytes", "rssBytes", "pageFaults",
                                           "majorPageFaults"))):
                total = _sum(pod["containers"], kind, keys)
                if total is not None:
                    pod[kind] = total
            for c in pod["containers"]:
                c["logs"] = dict(logs_fs, usedBytes=_dir_size(self.settings.pod_logs_dir /
                                                              f"{meta.namespace}_{meta.name}_{meta.uid}" / c["name"]))
            out.append(pod)
        return sorted(out, key=lambda p: (p["podRef"]["namespace"], p["podRef"]["name"]))

    def summary(self) -> dict:
        return {"node": self.node(), "pods": self.pods()}


def _dir_size(path) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0
