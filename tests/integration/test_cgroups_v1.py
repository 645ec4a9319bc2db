"""The v1 driver on this host's real hierarchies (hybrid: v1 controllers plus a hugetlb-only cgroup2).

Each test's container cgroup is /pyruntime/<unique>; processes enter it from the child side, between
fork and exec, as the runtime's init does.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from pyruntime.linux.cgroups import FROZEN, THAWED, CgroupError, Resources, V1Manager, detect, manager
from pyruntime.linux.syscalls import LinuxSyscalls
from tests.kit.busybox import static_busybox

BUSYBOX = str(static_busybox())
# a proportional I/O weight exists only under CFQ or BFQ: a kernel with neither has no file for it (runc fails too)
BLKIO_WEIGHT = any(Path("/sys/fs/cgroup/blkio", f).exists() for f in ("blkio.weight", "blkio.bfq.weight"))

pytestmark = pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/memory") or detect(LinuxSyscalls()) != "v1",
                                reason="needs a cgroup v1 host")


class Container:
    """A cgroup plus the processes a test starts in it, all of which it kills, reaps and removes."""

    def __init__(self) -> None:
        self.id = f"test-{uuid.uuid4().hex[:12]}"
        cg = manager(f"/pyruntime/{self.id}", self.id, LinuxSyscalls())
        assert isinstance(cg, V1Manager)
        self.cg = cg
        self.procs: list[subprocess.Popen] = []

    def run(self, script: str, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen([BUSYBOX, "sh", "-c", script], preexec_fn=lambda: self.cg.add(os.getpid()),
                                **kwargs)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        self.cg.kill_all(signal.SIGKILL)
        for proc in self.procs:
            proc.kill()
            proc.wait(10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.cg.destroy()


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def ctr():
    c = Container()
    c.cg.create()
    try:
        yield c
    finally:
        c.close()


def test_create_and_set_limits(ctr):
    cg = ctr.cg
    with open("/sys/fs/cgroup/cpuset/cpuset.effective_cpus") as f:
        first_cpu = f.read().strip().split("-")[0].split(",")[0]
    cg.set(Resources.from_spec({
        "memory": {"limit": 64 << 20, "reservation": 32 << 20, "swap": 96 << 20, "swappiness": 10},
        "cpu": {"shares": 512, "quota": 25000, "period": 50000, "cpus": first_cpu,
                "mems": "0"},
        "pids": {"limit": 16},
        **({"blockIO": {"weight": 200}} if BLKIO_WEIGHT else {}),
        "hugepageLimits": [{"pageSize": "2MB", "limit": 0}],
        "devices": [{"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 1, "minor": 3,
                                                        "access": "rwm"}],
    }))
    assert int(cg.read("memory", "memory.limit_in_bytes")) == 64 << 20
    assert int(cg.read("memory", "memory.soft_limit_in_bytes")) == 32 << 20
    assert int(cg.read("memory", "memory.memsw.limit_in_bytes")) == 96 << 20
    assert cg.read("cpu", "cpu.shares").strip() == "512"
    assert cg.read("cpu", "cpu.cfs_quota_us").strip() == "25000"
    assert cg.read("cpu", "cpu.cfs_period_us").strip() == "50000"
    assert cg.read("cpuset", "cpuset.cpus").strip() == first_cpu
    assert cg.read("pids", "pids.max").strip() == "16"
    assert cg.read("devices", "devices.list").split("\n")[0] == "c 1:3 rwm"
    assert cg.unified is not None and cg.unified.read("hugetlb.2MB.max").strip() == "0"
    proc = ctr.run("cat /proc/self/cgroup", stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(10)
    assert f"memory:/pyruntime/{ctr.id}" in out and f"pids:/pyruntime/{ctr.id}" in out
    assert f"0::/pyruntime/{ctr.id}" in out


def test_a_child_born_in_the_cgroup2_part_that_enters_the_v1_ones_itself_is_in_every_hierarchy(ctr):
    """create's way in, which writes no cgroup.procs (each write waits on the kernel's cgroup lock): the
    child is cloned into the cgroup2 directory and writes "0" into each v1 `tasks` file itself."""
    from pyruntime.container.create import fork_in_cgroup
    r, w = os.pipe()
    pid, in_cgroup, _cloned = fork_in_cgroup(LinuxSyscalls(), ctr.cg)
    if pid == 0:
        try:
            os.close(r)
            ctr.cg.enter_v1()
            with open("/proc/self/cgroup", "rb") as f:
                os.write(w, f.read())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        lines = f.read().decode().splitlines()
    os.waitpid(pid, 0)
    assert in_cgroup
    assert lines and all(line.split(":", 2)[2] == f"/pyruntime/{ctr.id}" for line in lines
                         if line.split(":", 2)[1] not in ("", "rdma", "misc")), lines
    assert any(line.startswith("0::") for line in lines) == (ctr.cg.unified is not None)


def test_devices_set_twice_keeps_list(ctr):
    rules = Resources.from_spec({"devices": [{"allow": False, "access": "rwm"},
                                             {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
                                             {"allow": True, "type": "c", "major": 136, "access": "rw"}]})
    ctr.cg.set(rules)
    first = ctr.cg.read("devices", "devices.list")
    assert sorted(first.split("\n")) == sorted(["", "c 1:3 rwm", "c 136:* rw"])
    ctr.cg.set(rules)
    assert ctr.cg.read("devices", "devices.list") == first


def test_update_lowers_and_raises_memory(ctr):
    cg = ctr.cg
    cg.set(Resources.from_spec({"memory": {"limit": 256 << 20, "swap": 512 << 20}}))
    cg.set(Resources.from_spec({"memory": {"limit": 64 << 20, "swap": 64 << 20}}))
    assert int(cg.read("memory", "memory.memsw.limit_in_bytes")) == 64 << 20
    cg.set(Resources.from_spec({"memory": {"limit": 1 << 30, "swap": 2 << 30}}))
    assert int(cg.read("memory", "memory.limit_in_bytes")) == 1 << 30
    cg.set(Resources.from_spec({"memory": {"limit": -1}}))
    assert int(cg.read("memory", "memory.memsw.limit_in_bytes")) > 1 << 40


def test_kernel_error_names_file(ctr):
    with pytest.raises(CgroupError) as info:
        ctr.cg.set(Resources.from_spec({"cpu": {"cpus": "4095"}}))
    assert info.value.errno is not None
    assert str(info.value) == (f"write /sys/fs/cgroup/cpuset/pyruntime/{ctr.id}/cpuset.cpus: "
                               f"{os.strerror(info.value.errno)}")


def test_pids_limit_stops_fork_bomb(ctr):
    ctr.cg.set(Resources.from_spec({"pids": {"limit": 5}}))
    proc = ctr.run(f"for i in 1 2 3 4 5 6 7 8 9 10; do {BUSYBOX} sleep 30 2>/dev/null & done; {BUSYBOX} sleep 30",
                   stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=10)  # the shell gives up at the first fork the limit refuses
    assert proc.returncode != 0 and "can't fork" in err
    assert len(ctr.cg.pids()) == 4
    assert int(ctr.cg.read("pids", "pids.current")) == 4
    assert ctr.cg.stats()["pids"] == {"current": 4, "limit": 5}


def test_freeze_thaw(ctr):
    proc = ctr.run("while :; do :; done")
    wait_for(lambda: ctr.cg.pids() == [proc.pid])
    ctr.cg.freeze()
    assert ctr.cg.state() == FROZEN
    assert ctr.cg.read("freezer", "freezer.state").strip() == "FROZEN"
    ticks = ctr.cg.stats()["cpu"]["usage"]["total"]
    time.sleep(0.2)
    assert ctr.cg.stats()["cpu"]["usage"]["total"] == ticks
    ctr.cg.thaw()
    assert ctr.cg.state() == THAWED
    wait_for(lambda: ctr.cg.stats()["cpu"]["usage"]["total"] > ticks)


def test_kill_all_reaches_every_process(ctr):
    proc = ctr.run(f"{BUSYBOX} sleep 30 & {BUSYBOX} sleep 30 & exec {BUSYBOX} sleep 30")
    wait_for(lambda: len(ctr.cg.pids()) == 3)
    ctr.cg.kill_all(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    wait_for(lambda: ctr.cg.pids() == [])
    assert ctr.cg.state() == THAWED


def test_kill_all_sigkill_reaches_frozen_processes(ctr):
    proc = ctr.run(f"exec {BUSYBOX} sleep 30")
    wait_for(lambda: ctr.cg.pids() == [proc.pid])
    ctr.cg.freeze()
    ctr.cg.kill_all(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def test_stats(ctr):
    ctr.cg.set(Resources.from_spec({"memory": {"limit": 128 << 20}, "pids": {"limit": 10}}))
    proc = ctr.run(f"i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec {BUSYBOX} sleep 30")
    wait_for(lambda: ctr.cg.stats()["cpu"]["usage"]["total"] > 10_000_000)
    stats = ctr.cg.stats()
    assert stats["memory"]["usage"]["usage"] > 0
    assert stats["memory"]["usage"]["limit"] == 128 << 20
    assert stats["memory"]["usage"]["max"] >= stats["memory"]["usage"]["usage"]
    assert stats["pids"] == {"current": 1, "limit": 10} or stats["pids"]["limit"] == 10
    assert stats["cpu"]["usage"]["user"] + stats["cpu"]["usage"]["kernel"] > 0
    assert proc.poll() is None


def test_oom_kill_is_counted(ctr):
    ctr.cg.set(Resources.from_spec({"memory": {"limit": 16 << 20, "swap": 16 << 20}}))
    assert not ctr.cg.oom_killed()
    proc = ctr.run(f"exec {BUSYBOX} dd if=/dev/zero of=/dev/null bs=64M count=1", stderr=subprocess.DEVNULL)
    assert proc.wait(20) == -signal.SIGKILL
    assert ctr.cg.oom_kill_count() >= 1 and ctr.cg.oom_killed()


def test_destroy_is_complete_and_idempotent():
    c = Container()
    assert c.cg.create() is True  # made new here: create() says so, and the runtime skips its pids check
    assert c.cg.create() is False
    assert c.cg.exists()
    proc = c.run(f"exec {BUSYBOX} sleep 30")
    wait_for(lambda: c.cg.pids() == [proc.pid])
    c.cg.kill_all(signal.SIGKILL)
    c.cg.destroy()  # retries EBUSY until the killed process is reaped below
    proc.wait(10)
    c.cg.destroy()
    assert not c.cg.exists()
    for path in c.cg.dirs.values():
        assert not os.path.exists(path)
    c.close()


def test_shared_parent_stays_while_used():
    one, two = Container(), Container()
    try:
        one.cg.create()
        two.cg.create()
        one.cg.destroy()
        assert two.cg.exists() and os.path.isdir("/sys/fs/cgroup/memory/pyruntime")
    finally:
        one.close()
        two.close()


def test_concurrent_destroy_of_shared_parent_does_not_break_create():
    """create() walks down again when another container's destroy() removed the empty /pyruntime."""
    for _ in range(20):
        one, two = Container(), Container()
        try:
            one.cg.create()
            one.cg.destroy()
            two.cg.create()
            assert two.cg.exists()
        finally:
            one.close()
            two.close()
