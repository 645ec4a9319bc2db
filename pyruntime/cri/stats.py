"""Container and pod figures as the kubelet reads them from a CRI runtime (ContainerStats, PodSandboxStats,
and the cadvisor-named metrics of ListPodSandboxMetrics).

The figures come from the cgroups (pyruntime's runc-style stats of a container, the same reader on the
pod's cgroup parent), from /proc/net/dev as the pod's network namespace sees it, and from a walk
of a container's writable layer. The kubelet evicts pods and scales them on these numbers, so they are
computed as cadvisor and containerd compute them: the working set is usage minus inactive file pages
(what the kernel can't drop), usage_nano_cores is the CPU time used between this sample and the previous
one of the same container divided by the wall time between them (no figure on a first sample rather than
a made-up one). Works on cgroup v1 and v2: the v2 reader reports the same keys, the memory.stat names
differ and are read by both spellings.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from proto import api_pb2
from pynode_os.proc import process_start_time
from pyruntime.cri.model import ContainerRecord, Layout, SandboxRecord, decode_pb
from pyruntime.errors import PyRuntimeError
from pyruntime.linux.syscalls import CLONE_NEWNET, Syscalls

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.runtime import Runtime

log = logging.getLogger(__name__)
_samples: dict[str, tuple[int, int]] = {}  # key -> (timestamp ns, cpu usage ns) of the last sample
_samples_lock = threading.Lock()


def disk_usage(path: str) -> tuple[int, int]:
    """(bytes allocated, inodes) under `path`, each hard-linked inode once, not crossing into other mounts
    (a mounted rootfs inside is not ours to count); a missing path uses nothing."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return 0, 0
    seen: set[int] = set()
    used = 0

    def count(st: os.stat_result) -> None:
        nonlocal used
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            used += st.st_blocks * 512

    count(top)
    for dirpath, dirnames, filenames in os.walk(path):
        keep = []
        for name in dirnames + filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if st.st_dev != top.st_dev:
                continue
            count(st)
            if name in dirnames:
                keep.append(name)
        dirnames[:] = keep
    return used, len(seen)


def _u64(message: object, field: str, value: int) -> None:
    getattr(message, field).value = max(0, int(value))


def nano_cores(key: str, timestamp: int, usage: int) -> int | None:
    """CPU use in billionths of a core since the previous sample of `key`; None on the first one."""
    with _samples_lock:
        previous = _samples.get(key)
        _samples[key] = (timestamp, usage)
    if previous is None or timestamp <= previous[0] or usage < previous[1]:
        return None
    return (usage - previous[1]) * 1_000_000_000 // (timestamp - previous[0])


def forget(key: str) -> None:
    """Drops the previous sample of a removed container or pod."""
    with _samples_lock:
        _samples.pop(key, None)


def cpu_usage(key: str, data: dict, timestamp: int) -> api_pb2.CpuUsage:
    """From the `data` of a runc stats record (pyruntime's CgroupManager.stats())."""
    usage = int(((data.get("cpu") or {}).get("usage") or {}).get("total", 0))
    out = api_pb2.CpuUsage(timestamp=timestamp)
    _u64(out, "usage_core_nano_seconds", usage)
    cores = nano_cores(key, timestamp, usage)
    if cores is not None:
        _u64(out, "usage_nano_cores", cores)
    return out


def _limit(value: int) -> int | None:
    """A memory limit, None when unlimited (v2 "max" reads as UINT64_MAX, v1 as a page-rounded huge number)."""
    return value if 0 < value < 1 << 62 else None


def memory_usage(data: dict, timestamp: int) -> api_pb2.MemoryUsage:
    memory = data.get("memory") or {}
    raw = memory.get("raw") or {}
    usage = int((memory.get("usage") or {}).get("usage", 0))

    def stat(v1: str, v2: str) -> int:
        return int(raw.get(v1, raw.get(v2, 0)))

    inactive_file = stat("total_inactive_file", "inactive_file")
    working_set = max(0, usage - inactive_file)
    out = api_pb2.MemoryUsage(timestamp=timestamp)
    _u64(out, "usage_bytes", usage)
    _u64(out, "working_set_bytes", working_set)
    _u64(out, "rss_bytes", stat("total_rss", "anon"))
    _u64(out, "page_faults", stat("total_pgfault", "pgfault"))
    _u64(out, "major_page_faults", stat("total_pgmajfault", "pgmajfault"))
    limit = _limit(int((memory.get("usage") or {}).get("limit", 0)))
    if limit is not None:
        _u64(out, "available_bytes", limit - working_set)
    return out


def swap_usage(data: dict, timestamp: int) -> api_pb2.SwapUsage | None:
    memory = data.get("memory") or {}
    swap = memory.get("swap")
    if not swap:
        return None
    usage = int(swap.get("usage", 0))
    limit = _limit(int(swap.get("limit", 0)))
    if "raw" in memory and "anon" in memory["raw"]:  # v2: memory.swap.current is swap alone
        swapped = usage
    else:  # v1: memsw counts memory plus swap
        swapped = usage - int((memory.get("usage") or {}).get("usage", 0))
        limit = None if limit is None else limit - int((memory.get("usage") or {}).get("limit", 0))
    out = api_pb2.SwapUsage(timestamp=timestamp)
    _u64(out, "swap_usage_bytes", swapped)
    if limit is not None:
        _u64(out, "swap_available_bytes", limit - swapped)
    return out


def writable_layer(container_id: str, layout: Layout, timestamp: int) -> api_pb2.FilesystemUsage:
    """The container's own writes: the overlay upper dir of its snapshot (the whole copy for the copy
    snapshotter), under the image store's root."""
    cdir = os.path.join(layout.images, "containers", container_id)
    upper = os.path.join(cdir, "upper")
    used, inodes = disk_usage(upper if os.path.isdir(upper) else os.path.join(cdir, "rootfs"))
    out = api_pb2.FilesystemUsage(timestamp=timestamp, fs_id=api_pb2.FilesystemIdentifier(mountpoint=layout.images))
    _u64(out, "used_bytes", used)
    _u64(out, "inodes_used", inodes)
    return out


def _attributes(record: ContainerRecord) -> api_pb2.ContainerAttributes:
    config = decode_pb(api_pb2.ContainerConfig, record.config)
    return api_pb2.ContainerAttributes(id=record.id, metadata=config.metadata, labels=config.labels,
                                       annotations=config.annotations)


def _runtime_data(runtime: Runtime, container_id: str) -> dict | None:
    """The container's cgroup figures; None when it has no cgroup any more (exited, deleted)."""
    try:
        return runtime.stats(container_id).get("data") or {}
    except PyRuntimeError:
        return None


def _container_stats(record: ContainerRecord, runtime: Runtime,
                     layout: Layout) -> tuple[api_pb2.ContainerStats, dict | None]:
    now = time.time_ns()
    out = api_pb2.ContainerStats(attributes=_attributes(record), writable_layer=writable_layer(record.id, layout, now))
    data = _runtime_data(runtime, record.id)
    if data is not None:
        out.cpu.CopyFrom(cpu_usage(record.id, data, now))
        out.memory.CopyFrom(memory_usage(data, now))
        swap = swap_usage(data, now)
        if swap is not None:
            out.swap.CopyFrom(swap)
    return out, data


def container_stats(record: ContainerRecord, runtime: Runtime, layout: Layout) -> api_pb2.ContainerStats:
    """A container's figures; only its attributes and writable layer once it has no cgroup (not running)."""
    return _container_stats(record, runtime, layout)[0]


def _pod_cgroup_data(parent: str, runtime: Runtime) -> dict | None:
    """The pod cgroup's figures read with the runtime's own cgroup reader (through the runtime's syscall
    layer); None without a pod cgroup, or a runtime that was given no syscall layer. A systemd slice (the
    kubelet gives its name or its expanded path) is read at its expanded path."""
    if not parent or runtime.kernel is None:
        return None
    from pynode_os.systemd import expand_slice
    from pyruntime.linux.cgroups import CgroupError, manager
    if parent.endswith(".slice"):
        try:
            parent = expand_slice(parent.rstrip("/").rsplit("/", 1)[-1])
        except ValueError:
            return None
    elif "/" not in parent:
        return None
    try:
        cgroup = manager(parent if parent.startswith("/") else "/" + parent, "pod", runtime.kernel)
        return cgroup.stats() if cgroup.exists() else None
    except (CgroupError, ValueError):
        return None


def _sum(datas: list[dict]) -> dict:
    """A pod's figures as the sum of its containers', for a pod without a cgroup of its own."""
    cpu = sum(int(((d.get("cpu") or {}).get("usage") or {}).get("total", 0)) for d in datas)
    usage = sum(int(((d.get("memory") or {}).get("usage") or {}).get("usage", 0)) for d in datas)
    raw: dict[str, int] = {}
    for d in datas:
        for k, v in ((d.get("memory") or {}).get("raw") or {}).items():
            raw[k] = raw.get(k, 0) + int(v)
    pids = sum(int((d.get("pids") or {}).get("current", 0)) for d in datas)
    return {"cpu": {"usage": {"total": cpu}}, "memory": {"usage": {"usage": usage}, "raw": raw},
            "pids": {"current": pids}}


def network_usage(net_dev: str, timestamp: int) -> api_pb2.NetworkUsage:
    """The interfaces of a /proc/net/dev text (pod_net_dev's)."""
    lines = net_dev.splitlines()[2:]
    out = api_pb2.NetworkUsage(timestamp=timestamp)
    for line in lines:
        name, _, figures = line.partition(":")
        values = figures.split()
        name = name.strip()
        if name == "lo" or len(values) < 16:
            continue
        iface = api_pb2.NetworkInterfaceUsage(name=name)
        _u64(iface, "rx_bytes", int(values[0]))
        _u64(iface, "rx_errors", int(values[2]))
        _u64(iface, "tx_bytes", int(values[8]))
        _u64(iface, "tx_errors", int(values[10]))
        out.interfaces.append(iface)
        if name == "eth0" or not out.HasField("default_interface"):
            out.default_interface.CopyFrom(iface)
    return out


def _pause_alive(sandbox: SandboxRecord) -> bool:
    """The recorded pause pid names that process still (pid and start time), not a reused pid. Read by
    oci.state's reader, as bytes: a comm is any 15 bytes, not always UTF-8 (one that was not made
    ListPodSandboxStats fail)."""
    if sandbox.pause_pid <= 0:
        return False
    start = process_start_time(sandbox.pause_pid)
    return start is not None and (not sandbox.pause_start_time or start == sandbox.pause_start_time)


def pod_net_dev(sandbox: SandboxRecord, kernel: Syscalls | None) -> str | None:
    """/proc/net/dev as the pod's network namespace sees it: through its pause when one runs, else read by a
    short-lived thread that joins the namespace through its pin. setns of a network namespace changes only
    the calling thread, so the daemon's other threads are untouched, and the thread's end drops its hold
    on the namespace. None for a pod in the host's network, or whose namespace is gone."""
    if "net" not in sandbox.namespaces:
        return None
    if sandbox.pause_pid > 0:
        return _read_text(f"/proc/{sandbox.pause_pid}/net/dev") if _pause_alive(sandbox) else None
    if kernel is None:
        return None
    pin, got = sandbox.namespaces["net"], []

    def read() -> None:
        try:
            fd = os.open(pin, os.O_RDONLY | os.O_CLOEXEC)
            try:
                kernel.setns(fd, CLONE_NEWNET, pin)
            finally:
                os.close(fd)
        except (OSError, PyRuntimeError):
            return
        got.append(_read_text("/proc/thread-self/net/dev"))

    reader = threading.Thread(target=read, name=f"net-dev {sandbox.id[:12]}")
    reader.start()
    reader.join()
    return got[0] if got else None


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def sandbox_stats(sandbox: SandboxRecord, containers: list[ContainerRecord], runtime: Runtime,
                  layout: Layout) -> api_pb2.PodSandboxStats:
    now = time.time_ns()
    config = decode_pb(api_pb2.PodSandboxConfig, sandbox.config)
    out = api_pb2.PodSandboxStats(attributes=api_pb2.PodSandboxAttributes(
        id=sandbox.id, metadata=config.metadata, labels=config.labels, annotations=config.annotations))
    linux = out.linux
    datas = []
    for record in containers:
        stats, data = _container_stats(record, runtime, layout)
        linux.containers.append(stats)
        if data is not None:
            datas.append(data)
    pod = _pod_cgroup_data(sandbox.cgroup_parent, runtime)
    if pod is None:
        pod = _sum(datas)
    linux.cpu.CopyFrom(cpu_usage("pod:" + sandbox.id, pod, now))
    linux.memory.CopyFrom(memory_usage(pod, now))
    linux.process.timestamp = now
    _u64(linux.process, "process_count", int((pod.get("pids") or {}).get("current", 0)))
    net_dev = pod_net_dev(sandbox, runtime.kernel)
    if net_dev is not None:
        linux.network.CopyFrom(network_usage(net_dev, now))
    return out


# ---- ListMetricDescriptors / ListPodSandboxMetrics: cadvisor's names for the same figures --------------------
# The kubelet's /metrics/cadvisor is built from these when it reads metrics from the runtime, so the names and
# units are cadvisor's (a CRI value is a uint64: seconds are whole seconds); the labels are the container's
# (id, name, image) plus, where cadvisor splits a figure, the interface or the page-fault kind and scope.
# Every name here is reported for a running container (the pod's network once, on the pod): a descriptor
# without values leaves a hole in the kubelet's output. Block-device I/O (blkio, fs reads/writes) is described
# but has no values: the cgroup reader does not collect it, and cadvisor has none on overlay-on-virtual-disk
# hosts either.

LABELS = ["id", "name", "image"]
_COUNTER, _GAUGE = api_pb2.COUNTER, api_pb2.GAUGE
_DESCRIPTORS: dict[str, tuple[str, api_pb2.MetricType, list[str]]] = {  # name -> help, type, label keys after LABELS
    "container_blkio_device_usage_total": ("Blkio Device bytes usage", _COUNTER,
                                           ["device", "major", "minor", "operation"]),
    "container_cpu_cfs_periods_total": ("Number of elapsed enforcement period intervals.", _COUNTER, []),
    "container_cpu_cfs_throttled_periods_total": ("Number of throttled period intervals.", _COUNTER, []),
    "container_cpu_cfs_throttled_seconds_total": ("Total time duration the container has been throttled.",
                                                  _COUNTER, []),
    "container_cpu_system_seconds_total": ("Cumulative system cpu time consumed in seconds.", _COUNTER, []),
    "container_cpu_usage_seconds_total": ("Cumulative cpu time consumed in seconds.", _COUNTER, []),
    "container_cpu_user_seconds_total": ("Cumulative user cpu time consumed in seconds.", _COUNTER, []),
    "container_file_descriptors": ("Number of open file descriptors for the container.", _GAUGE, []),
    "container_fs_inodes_free": ("Number of available Inodes", _GAUGE, []),
    "container_fs_inodes_total": ("Number of Inodes", _GAUGE, []),
    "container_fs_limit_bytes": ("Number of bytes that can be consumed by the container on this filesystem.",
                                 _GAUGE, []),
    "container_fs_reads_bytes_total": ("Cumulative count of bytes read", _COUNTER, []),
    "container_fs_reads_total": ("Cumulative count of reads completed", _COUNTER, []),
    "container_fs_usage_bytes": ("Number of bytes that are consumed by the container on this filesystem.",
                                 _GAUGE, []),
    "container_fs_writes_bytes_total": ("Cumulative count of bytes written", _COUNTER, []),
    "container_fs_writes_total": ("Cumulative count of writes completed", _COUNTER, []),
    "container_last_seen": ("Last time a container was seen by the exporter", _GAUGE, []),
    "container_memory_cache": ("Number of bytes of page cache memory.", _GAUGE, []),
    "container_memory_failcnt": ("Number of memory usage hits limits", _COUNTER, []),
    "container_memory_failures_total": ("Cumulative count of memory allocation failures.", _COUNTER,
                                        ["failure_type", "scope"]),
    "container_memory_kernel_usage": ("Size of kernel memory allocated in bytes.", _GAUGE, []),
    "container_memory_mapped_file": ("Size of memory mapped files in bytes.", _GAUGE, []),
    "container_memory_max_usage_bytes": ("Maximum memory usage recorded in bytes", _GAUGE, []),
    "container_memory_rss": ("Size of RSS in bytes.", _GAUGE, []),
    "container_memory_swap": ("Container swap usage in bytes.", _GAUGE, []),
    "container_memory_usage_bytes": ("Current memory usage in bytes, including all memory regardless of when "
                                     "it was accessed", _GAUGE, []),
    "container_memory_working_set_bytes": ("Current working set in bytes.", _GAUGE, []),
    "container_network_receive_bytes_total": ("Cumulative count of bytes received", _COUNTER, ["interface"]),
    "container_network_receive_errors_total": ("Cumulative count of errors encountered while receiving",
                                               _COUNTER, ["interface"]),
    "container_network_receive_packets_dropped_total": ("Cumulative count of packets dropped while receiving",
                                                        _COUNTER, ["interface"]),
    "container_network_receive_packets_total": ("Cumulative count of packets received", _COUNTER, ["interface"]),
    "container_network_transmit_bytes_total": ("Cumulative count of bytes transmitted", _COUNTER, ["interface"]),
    "container_network_transmit_errors_total": ("Cumulative count of errors encountered while transmitting",
                                                _COUNTER, ["interface"]),
    "container_network_transmit_packets_dropped_total": ("Cumulative count of packets dropped while "
                                                         "transmitting", _COUNTER, ["interface"]),
    "container_network_transmit_packets_total": ("Cumulative count of packets transmitted", _COUNTER,
                                                 ["interface"]),
    "container_oom_events_total": ("Count of out of memory events observed for the container", _COUNTER, []),
    "container_processes": ("Number of processes running inside the container.", _GAUGE, []),
    "container_sockets": ("Number of open sockets for the container.", _GAUGE, []),
    "container_spec_cpu_period": ("CPU period of the container.", _GAUGE, []),
    "container_spec_cpu_shares": ("CPU share of the container.", _GAUGE, []),
    "container_spec_memory_limit_bytes": ("Memory limit for the container.", _GAUGE, []),
    "container_spec_memory_swap_limit_bytes": ("Memory swap limit for the container.", _GAUGE, []),
    "container_start_time_seconds": ("Start time of the container since unix epoch in seconds.", _GAUGE, []),
    "container_threads": ("Number of threads running inside the container", _GAUGE, []),
    "container_threads_max": ("Maximum number of threads allowed inside the container, infinity if value is "
                              "zero", _GAUGE, []),
}
# /proc/net/dev columns: name -> index among the 16 figures after "iface:"
_NET_DEV = {"receive_bytes": 0, "receive_packets": 1, "receive_errors": 2, "receive_packets_dropped": 3,
            "transmit_bytes": 8, "transmit_packets": 9, "transmit_errors": 10, "transmit_packets_dropped": 11}

Sample = tuple[str, list[str], int]  # metric name, label values after LABELS, value


def metric_descriptors() -> list[api_pb2.MetricDescriptor]:
    return [api_pb2.MetricDescriptor(name=name, help=text, label_keys=LABELS + extra)
            for name, (text, _, extra) in _DESCRIPTORS.items()]


def process_figures(pids: list[int]) -> tuple[int, int, int]:
    """(threads, open fds, open sockets) of `pids`; a process that ended meanwhile counts nothing."""
    threads = fds = sockets = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                threads += next((int(line.split()[1]) for line in f if line.startswith("Threads:")), 0)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                fds += 1
                try:
                    sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
                except OSError:
                    pass
        except OSError:
            continue
    return threads, fds, sockets


def cgroup_samples(data: dict) -> list[Sample]:
    """The figures of a runc stats record's `data` (cgroup v1 or v2 spelling) under cadvisor's names."""
    cpu = data.get("cpu") or {}
    usage, throttling = cpu.get("usage") or {}, cpu.get("throttling") or {}
    memory = data.get("memory") or {}
    mem_usage, raw = memory.get("usage") or {}, memory.get("raw") or {}
    v2 = "anon" in raw

    def stat(v1: str, v2_name: str) -> int:
        return int(raw.get(v1, raw.get(v2_name, 0)))

    kernel = int(raw.get("kernel", 0)) if v2 else int((memory.get("kernel") or {}).get("usage", 0))
    # v2: memory.swap.current is swap alone; v1's memsw counts memory too, memory.stat has swap alone
    swapped = int((memory.get("swap") or {}).get("usage", 0)) if v2 else int(raw.get("total_swap", raw.get("swap", 0)))
    working_set = max(0, int(mem_usage.get("usage", 0)) - stat("total_inactive_file", "inactive_file"))
    out: list[Sample] = [
        ("container_cpu_usage_seconds_total", [], int(usage.get("total", 0)) // 1_000_000_000),
        ("container_cpu_system_seconds_total", [], int(usage.get("kernel", 0)) // 1_000_000_000),
        ("container_cpu_user_seconds_total", [], int(usage.get("user", 0)) // 1_000_000_000),
        ("container_cpu_cfs_periods_total", [], int(throttling.get("periods", 0))),
        ("container_cpu_cfs_throttled_periods_total", [], int(throttling.get("throttledPeriods", 0))),
        ("container_cpu_cfs_throttled_seconds_total", [], int(throttling.get("throttledTime", 0)) // 1_000_000_000),
        ("container_memory_usage_bytes", [], int(mem_usage.get("usage", 0))),
        ("container_memory_working_set_bytes", [], working_set),
        ("container_memory_rss", [], stat("total_rss", "anon")),
        ("container_memory_cache", [], int(memory.get("cache", 0))),
        ("container_memory_mapped_file", [], stat("total_mapped_file", "file_mapped")),
        ("container_memory_swap", [], max(0, swapped)),
        ("container_memory_kernel_usage", [], kernel),
        ("container_memory_max_usage_bytes", [], int(mem_usage.get("max", 0))),
        ("container_memory_failcnt", [], int(mem_usage.get("failcnt", 0))),
        ("container_processes", [], int((data.get("pids") or {}).get("current", 0))),
        ("container_threads_max", [], int((data.get("pids") or {}).get("limit", 0))),
    ]
    for kind in ("pgfault", "pgmajfault"):
        out.append(("container_memory_failures_total", [kind, "container"], int(raw.get(kind, 0))))
        out.append(("container_memory_failures_total", [kind, "hierarchy"], stat("total_" + kind, kind)))
    return out


def network_samples(net_dev: str) -> list[Sample]:
    """Per interface (but lo) of a /proc/net/dev text (pod_net_dev's)."""
    lines = net_dev.splitlines()[2:]
    out: list[Sample] = []
    for line in lines:
        name, _, figures = line.partition(":")
        values, name = figures.split(), name.strip()
        if name == "lo" or len(values) < 16:
            continue
        out += [(f"container_network_{what}_total", [name], int(values[i])) for what, i in _NET_DEV.items()]
    return out


def _container_samples(record: ContainerRecord, stats: api_pb2.ContainerStats, data: dict | None,
                       runtime: Runtime, layout: Layout, now: int) -> list[Sample]:
    resources = decode_pb(api_pb2.ContainerConfig, record.config).linux.resources
    out: list[Sample] = [
        ("container_fs_usage_bytes", [], stats.writable_layer.used_bytes.value),
        ("container_fs_inodes_total", [], stats.writable_layer.inodes_used.value),
        ("container_last_seen", [], now // 1_000_000_000),
        ("container_start_time_seconds", [], record.started_at // 1_000_000_000),
        ("container_spec_cpu_period", [], resources.cpu_period),
        ("container_spec_cpu_shares", [], resources.cpu_shares),
        ("container_spec_memory_limit_bytes", [], resources.memory_limit_in_bytes),
        ("container_spec_memory_swap_limit_bytes", [], resources.memory_swap_limit_in_bytes),
    ]
    if runtime.kernel is not None:  # the filesystem the writable layers live on
        try:
            fs = runtime.kernel.statvfs(layout.images)
            out += [("container_fs_inodes_free", [], fs.f_favail),
                    ("container_fs_limit_bytes", [], fs.f_blocks * fs.f_frsize)]
        except OSError as e:
            log.warning("statvfs %s: %s", layout.images, e)
    if data is None:  # no cgroup any more: not running
        return out
    out += cgroup_samples(data)
    try:
        pids = runtime.pids(record.id)
        ooms = runtime.oom_count(record.id)
    except PyRuntimeError:  # ended since the stats were read
        return out
    threads, fds, sockets = process_figures(pids)
    out += [("container_threads", [], threads), ("container_file_descriptors", [], fds),
            ("container_sockets", [], sockets), ("container_oom_events_total", [], ooms)]
    return out


def _metrics(samples: list[Sample], labels: list[str], now: int) -> list[api_pb2.Metric]:
    out = []
    for name, extra, value in samples:
        metric = api_pb2.Metric(name=name, timestamp=now, metric_type=_DESCRIPTORS[name][1],
                                label_values=labels + extra)
        metric.value.value = max(0, int(value))
        out.append(metric)
    return out


def sandbox_metrics(sandbox: SandboxRecord, containers: list[ContainerRecord], runtime: Runtime,
                    layout: Layout) -> api_pb2.PodSandboxMetrics:
    now = time.time_ns()
    out = api_pb2.PodSandboxMetrics(pod_sandbox_id=sandbox.id)
    for record in containers:
        stats, data = _container_stats(record, runtime, layout)
        labels = [record.id, stats.attributes.metadata.name, record.image_ref]
        samples = _container_samples(record, stats, data, runtime, layout, now)
        out.container_metrics.append(api_pb2.ContainerMetrics(container_id=record.id,
                                                              metrics=_metrics(samples, labels, now)))
    net_dev = pod_net_dev(sandbox, runtime.kernel)
    if net_dev is not None:
        name = decode_pb(api_pb2.PodSandboxConfig, sandbox.config).metadata.name
        out.metrics.extend(_metrics(network_samples(net_dev), [sandbox.id, name, ""], now))
    return out
