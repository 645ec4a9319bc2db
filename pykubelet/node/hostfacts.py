"""The machine's facts the kubelet reads from /proc: its memory, its CPUs, its pid limits, and the directory
statvfs is asked about for a path not made yet.

The node status (capacity), the Summary API (the node's memory, swap and rlimit), the node's cgroups
(kubepods' limits) and the eviction manager (memory.available, pid.available, the filesystems) read the
same numbers, so they read them here, the same way.
"""
from __future__ import annotations

import os
from pathlib import Path


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo's fields, in bytes where the kernel gives kB (the HugePages_ counts are plain numbers)."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def meminfo() -> dict[str, int]:
    return parse_meminfo(Path("/proc/meminfo").read_text())


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity), which a cpuset makes fewer than the machine's."""
    return len(os.sched_getaffinity(0))


def pid_max() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def threads_max() -> int:
    return int(Path("/proc/sys/kernel/threads-max").read_text())


def existing(path: Path) -> Path:
    """`path` or its nearest parent that exists: a directory the kubelet has not made yet is on its parent's
    filesystem."""
    while not path.exists():
        path = path.parent
    return path
