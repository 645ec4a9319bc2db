"""The v1 driver against a fake tree of split hierarchies, checking which files get which values and in
what order (the kernel refuses some orders), without touching the host's cgroups."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pyruntime.linux.cgroups import FROZEN, THAWED, CgroupError, Resources, V1Manager, V2Manager
from pyruntime.linux.cgroups import v1 as v1mod

KEYS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "name=systemd")
FILES = {
    "memory": {"memory.limit_in_bytes": "9223372036854771712", "memory.memsw.limit_in_bytes": "9223372036854771712",
               "memory.soft_limit_in_bytes": "0", "memory.swappiness": "60", "memory.oom_control": "",
               "memory.kmem.tcp.limit_in_bytes": "0", "memory.usage_in_bytes": "4096",
               "memory.max_usage_in_bytes": "8192", "memory.failcnt": "0", "memory.memsw.usage_in_bytes": "4096",
               "memory.memsw.max_usage_in_bytes": "8192", "memory.memsw.failcnt": "0",
               "memory.stat": "cache 100\nrss 200\n"},
    "cpu": {"cpu.shares": "1024", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000", "cpu.cfs_burst_us": "0",
            "cpu.rt_period_us": "1000000", "cpu.rt_runtime_us": "0", "cpu.idle": "0",
            "cpu.stat": "nr_periods 3\nnr_throttled 1\nthrottled_time 500\n"},
    "cpuacct": {"cpuacct.usage": "900", "cpuacct.usage_percpu": "600 300 ", "cpuacct.usage_user": "700",
                "cpuacct.usage_sys": "200"},
    "cpuset": {"cpuset.cpus": "", "cpuset.mems": ""},
    "pids": {"pids.max": "max", "pids.current": "1"},
    "freezer": {"freezer.state": "THAWED"},
    "devices": {"devices.allow": "", "devices.deny": "", "devices.list": "a *:* rwm\n"},
    "blkio": {"blkio.bfq.weight": "100", "blkio.throttle.read_bps_device": ""},
}


@pytest.fixture
def bases(tmp_path: Path) -> dict[str, str]:
    out = {}
    for key in KEYS:
        base = tmp_path / key.replace("name=", "")
        base.mkdir()
        out[key] = str(base)
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-3\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    return out


def populate(mgr: V1Manager) -> dict[str, Path]:
    """The control files the kernel shows in new v1 cgroups; the cpuset ones start empty there too."""
    for key, path in mgr.dirs.items():
        Path(path).mkdir(parents=True, exist_ok=True)
        for name, text in FILES.get(key, {}).items():
            (Path(path) / name).write_text(text)
        (Path(path) / "cgroup.procs").write_text("")
    return {key: Path(path) for key, path in mgr.dirs.items()}


def cpuset_files_on_mkdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mkdir as cgroupfs does it: a new cpuset directory has empty cpuset.cpus and cpuset.mems."""
    real_mkdir = os.mkdir

    def mkdir_like_cgroupfs(path, mode=0o777):
        real_mkdir(path, mode)
        if str(path).startswith(str(tmp_path / "cpuset")):
            for name in ("cpuset.cpus", "cpuset.mems"):
                Path(path, name).write_text("")

    monkeypatch.setattr(os, "mkdir", mkdir_like_cgroupfs)


def test_create_makes_every_hierarchy_and_fills_cpuset(bases, tmp_path, monkeypatch):
    mgr = V1Manager(bases, ("pyruntime", "c1"), (("pyruntime",),))
    cpuset_files_on_mkdir(tmp_path, monkeypatch)
    (tmp_path / "cpuset" / "pyruntime").mkdir()
    (tmp_path / "cpuset" / "pyruntime" / "cpuset.cpus").write_text("2\n")
    (tmp_path / "cpuset" / "pyruntime" / "cpuset.mems").write_text("0\n")
    assert mgr.create() is True  # a parent that was there already does not make the leaf any less new
    assert all(Path(p).is_dir() for p in mgr.dirs.values()) and mgr.exists()
    os.rmdir(mgr.dirs["memory"])
    for name in ("cpuset.cpus", "cpuset.mems"):  # what the fake kernel put there
        (Path(mgr.dirs["cpuset"]) / name).unlink()
    os.rmdir(mgr.dirs["cpuset"])
    assert mgr.create() is False  # the leaf was there in some hierarchies: it may hold processes
    assert mgr.dirs["name=systemd"] == str(tmp_path / "systemd/pyruntime/c1")
    assert (tmp_path / "cpuset/pyruntime/c1/cpuset.cpus").read_text() == "2"
    assert (tmp_path / "cpuset/pyruntime/cpuset.cpus").read_text() == "2\n"
    assert (tmp_path / "cpuset/pyruntime/c1/cpuset.mems").read_text() == "0"


def test_create_fills_a_shared_parent_a_concurrent_create_made_but_not_filled_yet(bases, tmp_path, monkeypatch):
    # two containers created at once: the other one made pyruntime/ (empty cpuset, as the kernel makes it)
    # and has not copied its parent's values yet; ours must not inherit the emptiness (ENOSPC on cgroup.procs)
    mgr = V1Manager(bases, ("pyruntime", "c2"))
    cpuset_files_on_mkdir(tmp_path, monkeypatch)
    os.mkdir(tmp_path / "cpuset" / "pyruntime")
    mgr.create()
    assert (tmp_path / "cpuset/pyruntime/cpuset.cpus").read_text() == "0-3"
    assert (tmp_path / "cpuset/pyruntime/c2/cpuset.cpus").read_text() == "0-3"
    assert (tmp_path / "cpuset/pyruntime/c2/cpuset.mems").read_text() == "0"


def test_set_writes_v1_files(bases):
    mgr = V1Manager(bases, ("c1",))
    d = populate(mgr)
    mgr.set(Resources.from_spec({
        "memory": {"limit": 64 << 20, "reservation": 32 << 20, "swap": 128 << 20, "swappiness": 10,
                   "disableOOMKiller": True, "kernelTCP": 1 << 20, "kernel": 1 << 20},
        "cpu": {"shares": 512, "quota": 50000, "period": 100000, "burst": 1000, "cpus": "1", "mems": "0"},
        "pids": {"limit": 10},
        "blockIO": {"weight": 300, "throttleReadBpsDevice": [{"major": 8, "minor": 0, "rate": 600}]},
    }))
    assert (d["memory"] / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (d["memory"] / "memory.memsw.limit_in_bytes").read_text() == str(128 << 20)
    assert (d["memory"] / "memory.soft_limit_in_bytes").read_text() == str(32 << 20)
    assert (d["memory"] / "memory.swappiness").read_text() == "10"
    assert (d["memory"] / "memory.oom_control").read_text() == "1"
    assert (d["memory"] / "memory.kmem.tcp.limit_in_bytes").read_text() == str(1 << 20)
    assert (d["cpu"] / "cpu.shares").read_text() == "512"
    assert (d["cpu"] / "cpu.cfs_quota_us").read_text() == "50000"
    assert (d["cpu"] / "cpu.cfs_period_us").read_text() == "100000"
    assert (d["cpu"] / "cpu.cfs_burst_us").read_text() == "1000"
    assert (d["cpuset"] / "cpuset.cpus").read_text() == "1"
    assert (d["pids"] / "pids.max").read_text() == "10"
    assert (d["blkio"] / "blkio.bfq.weight").read_text() == "300"
    assert (d["blkio"] / "blkio.throttle.read_bps_device").read_text() == "8:0 600"


@pytest.fixture
def writes(monkeypatch) -> list[tuple[str, str]]:
    log: list[tuple[str, str]] = []
    real = v1mod.write

    def record(path: str, value: str) -> None:
        log.append((Path(path).name, value))
        real(path, value)

    monkeypatch.setattr(v1mod, "write", record)
    return log


def test_memory_and_swap_order(bases, writes):
    mgr = V1Manager(bases, ("c1",))
    d = populate(mgr)
    (d["memory"] / "memory.limit_in_bytes").write_text(str(256 << 20))
    mgr.set(Resources.from_spec({"memory": {"limit": 64 << 20, "swap": 128 << 20}}))
    assert writes == [("memory.limit_in_bytes", str(64 << 20)), ("memory.memsw.limit_in_bytes", str(128 << 20))]
    writes.clear()
    mgr.set(Resources.from_spec({"memory": {"limit": 512 << 20, "swap": 1024 << 20}}))
    assert writes == [("memory.memsw.limit_in_bytes", str(1024 << 20)), ("memory.limit_in_bytes", str(512 << 20))]
    writes.clear()
    mgr.set(Resources.from_spec({"memory": {"limit": -1}}))
    assert writes == [("memory.memsw.limit_in_bytes", "-1"), ("memory.limit_in_bytes", "-1")]


def test_swap_without_accounting(bases):
    mgr = V1Manager(bases, ("c1",))
    d = populate(mgr)
    (d["memory"] / "memory.memsw.limit_in_bytes").unlink()
    mgr.set(Resources.from_spec({"memory": {"limit": 64 << 20, "swap": 64 << 20}}))
    assert (d["memory"] / "memory.limit_in_bytes").read_text() == str(64 << 20)
    with pytest.raises(CgroupError, match="swap accounting is off") as info:
        mgr.set(Resources.from_spec({"memory": {"limit": 64 << 20, "swap": 128 << 20}}))
    assert info.value.errno == errno.EOPNOTSUPP


def test_period_refused_until_quota_is_in(bases, monkeypatch):
    mgr = V1Manager(bases, ("c1",))
    populate(mgr)
    log = []
    refused = [True]

    def fake_write(path: str, value: str) -> None:
        name = Path(path).name
        log.append((name, value))
        if name == "cpu.cfs_period_us" and refused[0]:
            refused[0] = False
            raise CgroupError(errno.EINVAL, f"write {path}: Invalid argument")

    monkeypatch.setattr(v1mod, "write", fake_write)
    mgr.set(Resources.from_spec({"cpu": {"quota": 10000, "period": 20000}}))
    assert log == [("cpu.cfs_period_us", "20000"), ("cpu.cfs_quota_us", "10000"), ("cpu.cfs_period_us", "20000")]
    refused[0] = True
    with pytest.raises(CgroupError, match="Invalid argument"):
        mgr.set(Resources.from_spec({"cpu": {"period": 20000}}))


def test_devices_deny_all_then_rules_in_order(bases, writes):
    mgr = V1Manager(bases, ("c1",))
    populate(mgr)
    mgr.set(Resources.from_spec({"devices": [
        {"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
        {"allow": True, "type": "c", "major": 136, "access": "rw"}, {"allow": False, "type": "c", "major": 1,
                                                                      "minor": 3, "access": "m"}]}))
    assert writes == [("devices.deny", "a"), ("devices.deny", "a *:* rwm"), ("devices.allow", "c 1:3 rwm"),
                      ("devices.allow", "c 136:* rw"), ("devices.deny", "c 1:3 m")]


def test_devices_already_in_place_are_not_rewritten(bases, writes):
    """What `update` passes again must not open a deny-all window in a running container."""
    mgr = V1Manager(bases, ("c1",))
    d = populate(mgr)
    rules = Resources.from_spec({"devices": [
        {"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "m"},
        {"allow": True, "type": "c", "major": 136, "access": "rwm"}]})
    (d["devices"] / "devices.list").write_text("c 1:3 rwm\nc 136:* rwm\n")
    mgr.set(rules)
    assert writes == []
    (d["devices"] / "devices.list").write_text("c 1:3 rwm\n")
    mgr.set(rules)
    assert writes[0] == ("devices.deny", "a") and len(writes) == 5


def test_denies_after_the_allows_are_replayed_as_the_kernel_applies_them(bases, writes):
    """runc's usual list (deny-all, a deny of /dev/kmsg, the allows) and a deny taking one access away are
    recognised as in place: no rewrite, so no moment where /dev/null is denied (runc's minimal transitions)."""
    mgr = V1Manager(bases, ("c1",))
    d = populate(mgr)
    rules = Resources.from_spec({"devices": [
        {"allow": False, "access": "rwm"}, {"allow": False, "type": "c", "major": 1, "minor": 11, "access": "rwa"},
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
        {"allow": True, "type": "c", "major": 5, "minor": 0, "access": "rwm"},
        {"allow": False, "type": "c", "major": 5, "minor": 0, "access": "m"}]})
    (d["devices"] / "devices.list").write_text("c 1:3 rwm\nc 5:0 rw\n")
    mgr.set(rules)
    assert writes == []
    (d["devices"] / "devices.list").write_text("c 1:3 rwm\nc 5:0 rwm\n")  # the deny of m not applied yet
    mgr.set(rules)
    assert writes[0] == ("devices.deny", "a")


def test_unified_refused_on_v1(bases):
    mgr = V1Manager(bases, ("c1",))
    populate(mgr)
    with pytest.raises(CgroupError, match=r"linux\.resources\.unified: invalid configuration: needs cgroup v2"):
        mgr.set(Resources.from_spec({"unified": {"memory.high": "1"}}))


def test_missing_controller_is_named(bases):
    del bases["pids"]
    mgr = V1Manager(bases, ("c1",))
    populate(mgr)
    with pytest.raises(CgroupError, match="the pids controller is not mounted"):
        mgr.set(Resources.from_spec({"pids": {"limit": 5}}))


def test_hugetlb_goes_to_hybrid_unified_part(bases, tmp_path):
    unified_root = tmp_path / "unified"
    unified_root.mkdir()
    (unified_root / "cgroup.controllers").write_text("hugetlb\n")
    (unified_root / "cgroup.subtree_control").write_text("")
    unified = V2Manager(str(unified_root), str(unified_root), ("c1",))
    mgr = V1Manager(bases, ("c1",), (), unified)
    populate(mgr)
    mgr.create()
    (unified_root / "c1" / "hugetlb.2MB.max").write_text("max")
    mgr.set(Resources.from_spec({"hugepageLimits": [{"pageSize": "2MB", "limit": 0}]}))
    assert (unified_root / "c1" / "hugetlb.2MB.max").read_text() == "0"
    assert (unified_root / "cgroup.subtree_control").read_text() == "+hugetlb"
    V1Manager(bases, ("c1",)).set(Resources.from_spec({"hugepageLimits": [{"pageSize": "2MB", "limit": 0}]}))


def test_freeze_thaw_and_state(bases):
    mgr = V1Manager(bases, ("c1",))
    d = populate(mgr)
    assert mgr.state() == THAWED
    mgr.freeze()
    assert (d["freezer"] / "freezer.state").read_text() == "FROZEN" and mgr.state() == FROZEN
    mgr.thaw()
    assert mgr.state() == THAWED


def test_stats_and_oom(bases):
    mgr = V1Manager(bases, ("c1",))
    d = populate(mgr)
    (d["memory"] / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    stats = mgr.stats()
    assert stats["cpu"] == {"usage": {"total": 900, "percpu": [600, 300], "kernel": 200, "user": 700},
                            "throttling": {"periods": 3, "throttledPeriods": 1, "throttledTime": 500}}
    assert stats["memory"]["usage"] == {"usage": 4096, "limit": 9223372036854771712, "max": 8192, "failcnt": 0}
    assert stats["memory"]["swap"]["usage"] == 4096 and stats["memory"]["cache"] == 100
    assert stats["pids"] == {"current": 1, "limit": 0}
    assert mgr.oom_kill_count() == 2 and mgr.oom_killed()


def test_pids_union_and_destroy(bases, tmp_path):
    del bases["cpuset"]  # its fake control files would keep the directories from being removed
    mgr = V1Manager(bases, ("pyruntime", "c1"), (("pyruntime",),))
    mgr.create()
    (Path(mgr.dirs["pids"]) / "cgroup.procs").write_text("5\n")
    (Path(mgr.dirs["memory"]) / "cgroup.procs").write_text("5\n6\n")
    assert mgr.pids() == [5, 6]
    for p in mgr.dirs.values():
        (Path(p) / "cgroup.procs").unlink(missing_ok=True)
    other = V1Manager(bases, ("pyruntime", "c2"), (("pyruntime",),))
    other.create()
    mgr.destroy()
    assert not mgr.exists() and other.exists()
    other.destroy()
    assert not any((tmp_path / k.replace("name=", "") / "pyruntime").exists() for k in bases)
    other.destroy()
