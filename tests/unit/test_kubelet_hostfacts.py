"""The machine's facts the node status, the Summary API, the node's cgroups and the eviction manager read."""
from __future__ import annotations

from pathlib import Path

from pykubelet.node import hostfacts


def test_meminfo_in_bytes_where_the_kernel_gives_kb() -> None:
    text = "MemTotal:       1000 kB\nMemFree:         100 kB\nHugePages_Total:       2\n\nHugepagesize:    2048 kB\n"
    assert hostfacts.parse_meminfo(text) == {"MemTotal": 1_024_000, "MemFree": 102_400, "HugePages_Total": 2,
                                             "Hugepagesize": 2_097_152}


def test_this_machine_s_facts() -> None:
    assert hostfacts.meminfo()["MemTotal"] > 0
    assert hostfacts.cpu_count() >= 1
    assert hostfacts.pid_max() > 0 and hostfacts.threads_max() > 0


def test_a_path_not_made_yet_is_its_nearest_existing_parent(tmp_path: Path) -> None:
    assert hostfacts.existing(tmp_path / "not" / "yet") == tmp_path
    assert hostfacts.existing(tmp_path) == tmp_path
