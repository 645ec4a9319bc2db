"""The v2 driver against a fake cgroup2 tree: a tmp dir laid out like the mount, files standing in for the
kernel's, so every mapping can be checked without a v2 host (this CI host is hybrid v1)."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

import pytest

from pyruntime.fieldreader import SpecError
from pyruntime.linux.cgroups import FROZEN, THAWED, CgroupError, Resources, V2Manager
from pyruntime.linux.cgroups import base as cgroups_base
from pyruntime.linux.cgroups.devicefilter import compile_rules
from pyruntime.linux.cgroups.resources import UINT64_MAX
from pyruntime.linux.cgroups.v2 import blkio_to_io_weight, shares_to_weight, swap_to_v2
from pyruntime.linux.syscalls import (
    BPF_CGROUP_DEVICE,
    BPF_F_ALLOW_MULTI,
    BPF_PROG_TYPE_CGROUP_DEVICE,
    FakeSyscalls,
    SyscallError,
)

CONTROLLERS = "cpuset cpu io memory hugetlb pids"
LEAF_FILES = {
    "cgroup.controllers": CONTROLLERS, "cgroup.procs": "", "cgroup.freeze": "0",
    "cgroup.events": "populated 0\nfrozen 0\n", "cgroup.kill": "", "memory.max": "max", "memory.low": "0",
    "memory.high": "max", "memory.swap.max": "max", "memory.current": "4096",
    "memory.peak": "8192", "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    "memory.stat": "anon 100\nfile 200\n", "memory.swap.current": "0", "cpu.weight": "100",
    "cpu.max": "max 100000", "cpu.max.burst": "0", "cpu.idle": "0",
    "cpu.stat": "usage_usec 5\nuser_usec 3\nsystem_usec 2\nnr_periods 7\nnr_throttled 1\nthrottled_usec 4\n",
    "cpuset.cpus": "", "cpuset.mems": "", "pids.max": "max", "pids.current": "2", "io.weight": "default 100",
    "io.max": "", "hugetlb.2MB.max": "max", "hugetlb.2MB.rsvd.max": "max",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text(CONTROLLERS + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def make_leaf(mgr: V2Manager, files: dict[str, str] = LEAF_FILES) -> Path:
    """What the kernel would show in the new cgroup once create() has enabled the controllers."""
    leaf = Path(mgr.path)
    for name, text in files.items():
        (leaf / name).write_text(text)
    return leaf


def manager(tree: Path) -> V2Manager:
    return V2Manager(str(tree), str(tree), ("pyruntime", "c1"), (("pyruntime",),))


def test_create_enables_controllers_in_parents(tree):
    mgr = manager(tree)
    assert mgr.create() is True  # made here: the runtime then skips looking for its processes
    assert os.path.isdir(mgr.path) and mgr.exists()
    assert (tree / "cgroup.subtree_control").read_text() == "+cpu +cpuset +hugetlb +io +memory +pids"
    assert not (Path(mgr.path) / "cgroup.subtree_control").exists()
    assert mgr.create() is False


def test_create_does_not_rewrite_enabled_controllers(tree):
    (tree / "cgroup.subtree_control").write_text(CONTROLLERS)
    manager(tree).create()
    assert (tree / "cgroup.subtree_control").read_text() == CONTROLLERS


def test_set_maps_like_runc(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    mgr.set(Resources.from_spec({
        "memory": {"limit": 64 << 20, "reservation": 32 << 20, "swap": 96 << 20},
        "cpu": {"shares": 1024, "quota": 50000, "period": 100000, "burst": 1000, "cpus": "0-1", "mems": "0", "idle": 1},
        "pids": {"limit": 0},
        "blockIO": {"weight": 500, "throttleReadBpsDevice": [{"major": 8, "minor": 0, "rate": 600}]},
        "hugepageLimits": [{"pageSize": "2MB", "limit": 4 << 20}],
        "unified": {"memory.high": "50M"},
    }))
    expect = {"memory.max": str(64 << 20), "memory.low": str(32 << 20), "memory.swap.max": str(32 << 20),
              "cpu.weight": "39", "cpu.max": "50000 100000", "cpu.max.burst": "1000", "cpuset.cpus": "0-1",
              "cpuset.mems": "0", "cpu.idle": "1", "pids.max": "0", "io.weight": str(blkio_to_io_weight(500)),
              "io.max": "8:0 rbps=600", "hugetlb.2MB.max": str(4 << 20), "hugetlb.2MB.rsvd.max": str(4 << 20),
              "memory.high": "50M"}
    assert {name: (leaf / name).read_text() for name in expect} == expect


def test_partial_update_keeps_other_values(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    (leaf / "cpu.max").write_text("20000 100000")
    (leaf / "memory.max").write_text(str(100 << 20))
    mgr.set(Resources.from_spec({"cpu": {"period": 50000}, "memory": {"swap": 150 << 20}}))
    assert (leaf / "cpu.max").read_text() == "20000 50000"
    assert (leaf / "memory.swap.max").read_text() == str(50 << 20)
    assert (leaf / "memory.max").read_text() == str(100 << 20)


def test_unlimited_memory_makes_swap_unlimited(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    (leaf / "memory.swap.max").write_text("0")
    mgr.set(Resources.from_spec({"memory": {"limit": -1}, "pids": {"limit": -1}, "cpu": {"quota": -1}}))
    assert (leaf / "memory.max").read_text() == "max"
    assert (leaf / "memory.swap.max").read_text() == "max"
    assert (leaf / "pids.max").read_text() == "max"
    assert (leaf / "cpu.max").read_text() == "max"


def test_missing_controller_is_explained(tree):
    mgr = manager(tree)
    mgr.create()
    make_leaf(mgr, {"cgroup.controllers": "cpu pids"})
    with pytest.raises(CgroupError) as info:
        mgr.set(Resources.from_spec({"memory": {"limit": 1 << 20}}))
    assert info.value.errno == errno.ENOENT
    assert str(info.value) == (f"write {mgr.path}/memory.max: the memory controller is not enabled for this cgroup "
                               "(available: cpu pids)")


def test_conversions():
    assert [shares_to_weight(s) for s in (0, 2, 1024, 262144, 1 << 20)] == [0, 1, 39, 10000, 10000]
    assert [blkio_to_io_weight(w) for w in (0, 10, 500, 1000)] == [0, 1, 4950, 10000]
    assert swap_to_v2(-1, 100) == -1
    assert swap_to_v2(0, 100) is None
    assert swap_to_v2(300, 100) == 200
    with pytest.raises(CgroupError, match=r"memory\.swap: cannot limit swap without a memory limit"):
        swap_to_v2(300, -1)
    with pytest.raises(CgroupError, match="below memory limit"):
        swap_to_v2(50, 100)


class BpfKernel(FakeSyscalls):
    """Records the bpf calls; the fds it hands out are real (of /dev/null), as the manager closes them."""

    def __init__(self, attached: tuple[int, ...] = (), refuse: str = "") -> None:
        super().__init__()
        self.attached, self.refuse = list(attached), refuse

    def _fd(self, name: str, *args) -> int:
        self.calls.append((name, *args))
        if name == self.refuse:
            raise SyscallError(errno.EPERM, f"{name}: Operation not permitted")
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)

    def bpf_prog_query(self, target_fd: int, attach_type: int) -> list[int]:
        self.calls.append(("bpf_prog_query", attach_type))
        return list(self.attached)

    def bpf_prog_load(self, prog_type: int, program: bytes, license: str, name: str) -> int:
        return self._fd("bpf_prog_load", prog_type, program)

    def bpf_prog_get_fd_by_id(self, prog_id: int) -> int:
        return self._fd("bpf_prog_get_fd_by_id", prog_id)

    def bpf_prog_attach(self, target_fd: int, prog_fd: int, attach_type: int, flags: int) -> None:
        self._fd("bpf_prog_attach", attach_type, flags)


def test_devices_attach_a_new_program_before_detaching_the_old(tree):
    kernel = BpfKernel(attached=(41,))
    mgr = V2Manager(str(tree), str(tree), ("pyruntime", "c1"), (("pyruntime",),), kernel)
    mgr.create()
    rules = Resources.from_spec({"devices": [{"allow": False}]}).with_device_policy()
    mgr.set(rules)
    assert [c[0] for c in kernel.calls] == ["bpf_prog_query", "bpf_prog_load", "bpf_prog_attach",
                                            "bpf_prog_get_fd_by_id", "bpf_prog_detach"]
    assert kernel.calls[1][1:] == (BPF_PROG_TYPE_CGROUP_DEVICE, compile_rules(rules.devices or ()))
    assert kernel.calls[2][1:] == (BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)
    assert kernel.calls[3][1:] == (41,)


def test_devices_refused_by_the_kernel_fail_before_other_writes(tree):
    kernel = BpfKernel(refuse="bpf_prog_load")
    mgr = V2Manager(str(tree), str(tree), ("pyruntime", "c1"), (("pyruntime",),), kernel)
    mgr.create()
    leaf = make_leaf(mgr)
    with pytest.raises(CgroupError, match=r"^linux.resources.devices: bpf_prog_load: Operation not permitted$"):
        mgr.set(Resources.from_spec({"memory": {"limit": 1 << 20}, "devices": [{"allow": False}]}))
    assert (leaf / "memory.max").read_text() == "max"
    with pytest.raises(CgroupError, match="no kernel interface to attach a device program through"):
        manager(tree).set(Resources.from_spec({"devices": [{"allow": False}]}))
    with pytest.raises(SpecError, match=r"devices\[2\] \(deny c 1:3 rwm\): cannot take access away"):
        mgr.set(Resources.from_spec({"devices": [{"allow": False}, {"allow": True, "type": "c"},
                                                 {"allow": False, "type": "c", "major": 1, "minor": 3}]}))


def test_freeze_thaw_state(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    (leaf / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert mgr.state() == THAWED
    mgr.freeze()
    assert (leaf / "cgroup.freeze").read_text() == "1" and mgr.state() == FROZEN
    mgr.thaw()
    assert (leaf / "cgroup.freeze").read_text() == "0" and mgr.state() == THAWED


def test_freeze_times_out_and_thaws(tree, monkeypatch):
    monkeypatch.setattr("pyruntime.linux.cgroups.v2.FREEZE_TIMEOUT", 0.05)
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    with pytest.raises(CgroupError, match="tasks did not stop") as info:
        mgr.freeze()
    assert info.value.errno == errno.ETIMEDOUT
    assert (leaf / "cgroup.freeze").read_text() == "0"


def test_pids_are_recursive(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    (leaf / "cgroup.procs").write_text("10\n11\n")
    (leaf / "sub").mkdir()
    (leaf / "sub" / "cgroup.procs").write_text("12\n")
    assert sorted(mgr.pids()) == [10, 11, 12]


def test_kill_all_uses_cgroup_kill_for_sigkill(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    mgr.kill_all(signal.SIGKILL)
    assert (leaf / "cgroup.kill").read_text() == "1"


def sigterm_thawed(mgr, leaf) -> None:
    """kill_all(SIGTERM) reaches a process in `leaf`, and `leaf` is left thawed."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        (leaf / "cgroup.procs").write_text(f"{child.pid}\n")
        mgr.kill_all(signal.SIGTERM)
        assert child.wait(5) == -signal.SIGTERM
        assert (leaf / "cgroup.freeze").read_text() == "0"
    finally:
        child.kill()
        child.wait()


def test_kill_all_other_signal_freezes_around_it(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    (leaf / "cgroup.events").write_text("frozen 1\n")
    sigterm_thawed(mgr, leaf)


def test_stats_shape(tree):
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    (leaf / "memory.max").write_text("1048576\n")
    stats = mgr.stats()
    assert stats["cpu"] == {"usage": {"total": 5000, "kernel": 2000, "user": 3000},
                            "throttling": {"periods": 7, "throttledPeriods": 1, "throttledTime": 4000}}
    assert stats["memory"]["usage"] == {"usage": 4096, "limit": 1048576, "max": 8192, "failcnt": 3}
    assert stats["memory"]["swap"] == {"usage": 0, "limit": UINT64_MAX}
    assert stats["memory"]["cache"] == 200
    assert stats["pids"] == {"current": 2, "limit": 0}
    assert mgr.oom_kill_count() == 1 and mgr.oom_killed()


def test_destroy_removes_leaf_and_empty_runtime_parent(tree):
    mgr = manager(tree)
    mgr.create()
    mgr.destroy()
    assert not (tree / "pyruntime").exists()
    assert not mgr.exists()
    mgr.destroy()


def test_destroy_keeps_parent_in_use(tree):
    one, two = manager(tree), V2Manager(str(tree), str(tree), ("pyruntime", "c2"), (("pyruntime",),))
    one.create()
    two.create()
    one.destroy()
    assert not one.exists() and two.exists()
    two.destroy()
    assert not (tree / "pyruntime").exists()


class _Clock:
    """time for the cgroup code: sleeping only moves the clock on, so a test sees every wait and takes none."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_destroy_retries_busy_then_reports(tree, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(cgroups_base, "time", clock)
    mgr = manager(tree)
    mgr.create()
    calls = []
    real_rmdir = os.rmdir

    def busy(path):
        calls.append(path)
        if len(calls) < 3:
            raise OSError(errno.EBUSY, "busy")
        real_rmdir(path)

    monkeypatch.setattr(os, "rmdir", busy)
    mgr.destroy()
    # retried after a short wait, and done as soon as the cgroup was free, not at the timeout
    assert calls[:3] == [mgr.path] * 3 and not os.path.exists(mgr.path)
    assert clock.sleeps and clock.now < cgroups_base.RMDIR_TIMEOUT
    monkeypatch.setattr(os, "rmdir", lambda p: (_ for _ in ()).throw(OSError(errno.EBUSY, "busy")))
    mgr.create()
    began, clock.sleeps = clock.now, []
    with pytest.raises(CgroupError, match=rf"^rmdir {mgr.path}: Device or resource busy$"):
        mgr.destroy()
    # still busy: retried until the timeout, with waits that stay short, and reported right after it
    assert len(clock.sleeps) > 2 and max(clock.sleeps) < cgroups_base.RMDIR_TIMEOUT / 2
    assert cgroups_base.RMDIR_TIMEOUT < clock.now - began <= cgroups_base.RMDIR_TIMEOUT + max(clock.sleeps)
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    mgr.destroy()


def test_kill_all_signals_even_when_freeze_times_out(tree, monkeypatch):
    monkeypatch.setattr("pyruntime.linux.cgroups.v2.FREEZE_TIMEOUT", 0.05)
    mgr = manager(tree)
    mgr.create()
    leaf = make_leaf(mgr)
    sigterm_thawed(mgr, leaf)
