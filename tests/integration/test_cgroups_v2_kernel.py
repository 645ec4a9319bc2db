"""The v2 driver against a real cgroup2 kernel: this hybrid host's /sys/fs/cgroup/unified mount, which has
only hugetlb as a controller but all the core files (procs, freeze, kill, events), so that part of the
driver runs against the kernel and not only the fake tree of the unit tests."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest

from pynode_os.cgroups import parse_mountinfo
from pyruntime.linux.cgroups import FROZEN, THAWED, CgroupError, Resources, V2Manager
from tests.kit.busybox import static_busybox


def _cgroup2_mount() -> str:
    with open("/proc/self/mountinfo") as f:
        _, v2 = parse_mountinfo(f.read())
    return v2.mountpoint if v2 is not None else ""


MOUNT = _cgroup2_mount()
BUSYBOX = str(static_busybox())
pytestmark = pytest.mark.skipif(not MOUNT, reason="no cgroup2 mount")


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


class TrackedManager(V2Manager):
    """A V2Manager that also holds the processes a test started in it, for the fixture to kill and reap."""

    procs: list[subprocess.Popen]


@pytest.fixture
def cg():
    mgr = TrackedManager(MOUNT, MOUNT, ("pyruntime", f"test-{uuid.uuid4().hex[:12]}"), (("pyruntime",),))
    mgr.create()
    procs: list[subprocess.Popen] = []
    mgr.procs = procs
    try:
        yield mgr
    finally:
        mgr.kill_all(signal.SIGKILL)
        for p in procs:
            p.kill()
            p.wait(10)
        mgr.destroy()


def run(mgr: TrackedManager, script: str) -> subprocess.Popen:
    proc = subprocess.Popen([BUSYBOX, "sh", "-c", script], preexec_fn=lambda: mgr.add(os.getpid()))
    mgr.procs.append(proc)
    return proc


def test_processes_freeze_and_thaw(cg):
    proc = run(cg, f"{BUSYBOX} sleep 30 & exec {BUSYBOX} sleep 30")
    wait_for(lambda: len(cg.pids()) == 2)
    assert proc.pid in cg.pids()
    with open(f"/proc/{proc.pid}/cgroup") as f:
        assert f"0::/{os.path.relpath(cg.path, MOUNT)}\n" in f.read()
    cg.freeze()
    assert cg.state() == FROZEN
    assert "frozen 1" in cg.read("cgroup.events")
    cg.thaw()
    assert cg.state() == THAWED
    assert "frozen 0" in cg.read("cgroup.events")
    wait_for(lambda: proc_state(proc.pid) == "S")  # back in its sleep, not stopped


def test_kill_all_with_cgroup_kill(cg):
    proc = run(cg, f"{BUSYBOX} sleep 30 & exec {BUSYBOX} sleep 30")
    wait_for(lambda: len(cg.pids()) == 2)
    cg.kill_all(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    wait_for(lambda: cg.pids() == [])


def test_kill_all_other_signal_through_freeze(cg):
    proc = run(cg, f"exec {BUSYBOX} sleep 30")
    wait_for(lambda: cg.pids() == [proc.pid])
    cg.kill_all(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    assert cg.state() == THAWED


def test_hugetlb_limit_and_missing_controller(cg):
    with open(os.path.join(MOUNT, "cgroup.controllers")) as f:
        available = f.read().split()
    if "hugetlb" in available and os.path.isdir("/sys/kernel/mm/hugepages/hugepages-2048kB"):
        cg.set(Resources.from_spec({"hugepageLimits": [{"pageSize": "2MB", "limit": 2 << 20}]}))
        assert cg.read("hugetlb.2MB.max").strip() == str(2 << 20)
    if "pids" not in available:
        with pytest.raises(CgroupError, match="the pids controller is not enabled for this cgroup"):
            cg.set(Resources.from_spec({"pids": {"limit": 5}}))


def test_destroy_with_sub_cgroup_and_idempotent(cg):
    os.mkdir(os.path.join(cg.path, "inner"))
    proc = run(cg, f"echo $$ > {cg.path}/inner/cgroup.procs; exec {BUSYBOX} sleep 30")
    wait_for(lambda: cg.pids() == [proc.pid])
    cg.kill_all(signal.SIGKILL)
    proc.wait(10)
    cg.destroy()
    assert not cg.exists()
    cg.destroy()
