"""Many runtime processes acting on one container at once, as a shim, a kubelet's CRI calls and a user's
`pyruntime` do: every read-then-write command holds the container's lock, so no update is lost (a
concurrent one used to save a record loaded before the other's write, and re-apply its stale values to
the cgroup) and nothing deadlocks."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time

ROUNDS = 12
MIB = 1 << 20
# a trapped signal reaches a pid namespace's init; an untrapped one would be dropped by the kernel
TRAPPING_INIT = ["sh", "-c", "trap : USR1 USR2 HUP; while :; do sleep 1; done"]


def _loop(runtime, commands: list[list[str]]) -> subprocess.Popen:
    """One process that runs `commands` in order, stopping at the first failure."""
    prefix = f"{runtime.binary} --root {runtime.root}"
    script = " && ".join(f"{prefix} {' '.join(c)}" for c in commands)
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_concurrent_updates_and_kills_lose_nothing_and_never_deadlock(runtime, make_bundle):
    runtime("run", "-d", "--bundle", str(make_bundle(TRAPPING_INIT)), "c1")
    mem_a = [(64 + i) * MIB for i in range(ROUNDS)]
    mem_b = [(256 + i) * MIB for i in range(ROUNDS)]
    pids = [100 + i for i in range(ROUNDS)]
    workers = [
        _loop(runtime, [["update", "--memory", str(v), "c1"] for v in mem_a]),
        _loop(runtime, [["update", "--memory", str(v), "c1"] for v in mem_b]),
        _loop(runtime, [["update", "--pids-limit", str(v), "c1"] for v in pids]),
        _loop(runtime, [["kill", "c1", "0"] for _ in range(ROUNDS)]),
        _loop(runtime, [["kill", "c1", sig] for sig in ("USR1", "USR2", "HUP") * (ROUNDS // 3)]),
        _loop(runtime, [["state", "c1"] for _ in range(ROUNDS)]),
    ]
    deadline = time.monotonic() + 120
    try:
        for w in workers:
            _, err = w.communicate(timeout=max(deadline - time.monotonic(), 1))
            assert w.returncode == 0, err
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()

    assert runtime.state("c1")["status"] == "running"  # every signal was trapped, none lost the init
    record = json.loads((runtime.root / "c1" / "state.json").read_text())["resources"]
    cgroup = json.loads(runtime("events", "--stats", "c1").stdout)["data"]
    # the sole writer of pids: its last write is in the record and the cgroup
    assert record["pids"]["limit"] == cgroup["pids"]["limit"] == pids[-1]
    # two writers of memory: whichever came last, record and cgroup agree on its last value
    assert record["memory"]["limit"] == cgroup["memory"]["usage"]["limit"]
    assert record["memory"]["limit"] in (mem_a[-1], mem_b[-1])
    runtime("delete", "--force", "c1")


def test_updates_lined_up_behind_a_held_lock_all_land(runtime, make_bundle):
    """The lost update, made certain: every writer starts while the lock is held, so each has read the
    record before any other wrote it; each must still re-read it under the lock, or only the last
    writer's field would survive in the record."""
    runtime("run", "-d", "--bundle", str(make_bundle(TRAPPING_INIT)), "c1")
    updates = {("memory", "limit"): ["--memory", str(96 * MIB)],
               ("memory", "reservation"): ["--memory-reservation", str(48 * MIB)],
               ("pids", "limit"): ["--pids-limit", "77"],
               ("cpu", "shares"): ["--cpu-shares", "512"],
               ("cpu", "quota"): ["--cpu-quota", "50000"]}
    if any(os.path.exists(f"/sys/fs/cgroup/blkio/{f}") for f in ("blkio.weight", "blkio.bfq.weight")):
        updates[("blockIO", "weight")] = ["--blkio-weight", "300"]  # only under CFQ or BFQ
    fd = os.open(runtime.root / "c1", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        waiting = [_loop(runtime, [["update", *flags, "c1"]]) for flags in updates.values()]
        waiting.append(_loop(runtime, [["kill", "c1", "USR1"]]))
        time.sleep(1)
        assert all(w.poll() is None for w in waiting), "a command ran while another process held the lock"
    finally:
        os.close(fd)
    for w in waiting:
        _, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
    record = json.loads((runtime.root / "c1" / "state.json").read_text())["resources"]
    for (section, key), flags in updates.items():
        assert str(record[section][key]) == flags[1], f"{section}.{key} lost: {record}"
    cgroup = json.loads(runtime("events", "--stats", "c1").stdout)["data"]
    assert cgroup["memory"]["usage"]["limit"] == 96 * MIB and cgroup["pids"]["limit"] == 77
    assert runtime.state("c1")["status"] == "running"
    runtime("delete", "--force", "c1")
