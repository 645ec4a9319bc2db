"""The runtime as a library, called from this (single-threaded) test process as the CRI server's
fork server will: every operation, its error kinds, and the refusal to fork with threads alive."""
from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
import warnings

import pytest

from pyruntime.errors import FailedPreconditionError, InternalError, InvalidArgumentError, NotFoundError
from pyruntime.linux.cgroups import manager
from pyruntime.linux.syscalls import LinuxSyscalls
from pyruntime.oci.spec import load_bundle
from pyruntime.runtime import Runtime
from pyruntime.settings import Settings
from tests.kit.busybox import build_rootfs


@pytest.fixture
def rt(tmp_path):
    runtime = Runtime(Settings.from_env({}, root=str(tmp_path / "state")))
    yield runtime
    for state in runtime.list():
        runtime.delete(state.id, force=True)


def _eventually(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_life_cycle_through_the_api(rt, make_bundle):
    assert len(os.listdir("/proc/self/task")) == 1  # what lets this process fork containers
    bundle = make_bundle(["sh", "-c", "trap 'exit 3' TERM; while :; do sleep 1; done"])
    created = rt.create("c1", str(bundle), spec=load_bundle(str(bundle)))
    assert (created.id, created.status) == ("c1", "created") and created.pid > 0
    assert [s.id for s in rt.list()] == ["c1"]
    rt.start("c1")
    assert rt.state("c1").status == "running"
    rt.kill("c1", 0)

    pid = rt.exec("c1", {"args": ["sleep", "100"], "cwd": "/", "env": ["PATH=/bin"]})
    _eventually(lambda: pid in rt.pids("c1"))

    rt.update("c1", {"pids": {"limit": 42}})
    assert rt.stats("c1")["data"]["pids"]["limit"] == 42
    rt.pause("c1")
    assert rt.state("c1").status == "paused"
    with pytest.raises(FailedPreconditionError):
        rt.start("c1")
    rt.resume("c1")
    assert rt.state("c1").status == "running"

    rt.kill("c1", "TERM")
    # this process is a child subreaper (tests/conftest.py), so the exec'd process and the init are its
    # children once their parents exit; the init's exit waits for every process of its pid namespace
    # to be reaped, the exec'd one included
    assert os.waitpid(pid, 0)[0] == pid
    _eventually(lambda: rt.state("c1").status == "stopped")
    os.waitpid(created.pid, 0)
    assert rt.state("c1").to_json()["pid"] == 0
    with pytest.raises(FailedPreconditionError):
        rt.kill("c1", signal.SIGTERM)
    rt.delete("c1")
    with pytest.raises(NotFoundError):
        rt.state("c1")
    rt.delete("c1", force=True)  # a missing container is no error with force


def test_create_and_exec_refuse_to_fork_with_a_thread_alive_and_leave_nothing(rt, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        with pytest.raises(FailedPreconditionError, match="refusing to fork from a process with 2 threads"):
            rt.create("c1", str(bundle))
    finally:
        stop.set()
        worker.join()
    assert not os.path.exists(rt.store.path("c1")) and rt.list() == []
    assert not manager("", "c1", LinuxSyscalls()).exists()

    rt.create("c1", str(bundle))
    rt.start("c1")
    stop.clear()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        with pytest.raises(FailedPreconditionError, match="exec in c1: refusing to fork"):
            rt.exec("c1", rt.process_of("c1"))
    finally:
        stop.set()
        worker.join()
    init_pid = rt.state("c1").pid
    assert rt.pids("c1") == [init_pid]
    rt.delete("c1", force=True)
    os.waitpid(init_pid, 0)  # our child: this process is a subreaper (tests/conftest.py)


def _state_letter(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_an_exec_whose_process_dies_before_it_runs_is_reaped_so_the_container_can_end(rt, make_bundle, monkeypatch):
    """The exec'd process killed between its fork and the exec (its pid namespace ended with the container's
    init while an exec probe joined it): the exec fails and reaps it, since the init's own exit waits until every
    process of the namespace is reaped, and nobody else knows its pid. Unreaped, the container's exit was never
    seen by its supervisor, and a kubelet's StopContainer failed after its grace."""
    from pyruntime.container import exec as exec_module
    real_end_stage1 = exec_module.end_stage1
    doomed: list[int] = []

    def end_stage1_then_kill(*args, **kwargs) -> int:
        pid = real_end_stage1(*args, **kwargs)
        doomed.append(pid)
        os.kill(pid, signal.SIGKILL)
        _eventually(lambda: _state_letter(pid) == "Z")
        return pid

    bundle = make_bundle(["sleep", "100"])
    rt.create("c1", str(bundle))
    rt.start("c1")
    monkeypatch.setattr(exec_module, "end_stage1", end_stage1_then_kill)
    with pytest.raises(InternalError, match="exited before"):
        rt.exec("c1", rt.process_of("c1"))
    monkeypatch.undo()
    (pid,) = doomed
    with pytest.raises(ChildProcessError):  # reaped by the exec already
        os.waitpid(pid, os.WNOHANG)
    init_pid = rt.state("c1").pid
    rt.kill("c1", signal.SIGKILL)
    _eventually(lambda: os.waitpid(init_pid, os.WNOHANG)[0] == init_pid)  # our child: this process is a subreaper
    rt.delete("c1", force=True)


def test_a_mount_refused_in_the_init_keeps_its_kind_and_leaves_nothing(rt, make_bundle, tmp_path):
    """Container init refuses these mounts after the fork: what it reports over the channel is the caller's
    to fix, and reaches the caller (the CRI server, the kubelet) as that kind, not as an internal error."""
    rootfs = build_rootfs(tmp_path / "evil-rootfs")
    (rootfs / "etc" / "secret").symlink_to("/etc/passwd")
    masked = make_bundle(["true"])
    config = json.loads((masked / "config.json").read_text())
    config["root"]["path"] = str(rootfs)
    config["linux"]["maskedPaths"].append("/etc/secret")
    (masked / "config.json").write_text(json.dumps(config))
    with pytest.raises(FailedPreconditionError, match="masked path /etc/secret is a symlink"):
        rt.create("c1", str(masked))
    assert rt.list() == [] and not manager("", "c1", LinuxSyscalls()).exists()

    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    missing = make_bundle(["true"])
    config = json.loads((missing / "config.json").read_text())
    config["mounts"].append({"destination": "/data", "type": "bind", "source": str(tmp_path / "dangling"),
                             "options": ["rbind"]})
    (missing / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidArgumentError, match="mount /data: bind source"):
        rt.create("c2", str(missing))
    assert rt.list() == [] and not manager("", "c2", LinuxSyscalls()).exists()



def test_a_create_the_kernel_refuses_before_the_fork_leaves_nothing(rt, make_bundle):
    """The kernel refuses the cgroup's CPU quota (below its 1 ms minimum) while create sets up, before any
    child takes the channel's other end: the error names the file, and neither the container, its cgroup,
    nor either end of the channel stays."""
    bundle = make_bundle(["true"])
    config = json.loads((bundle / "config.json").read_text())
    config["linux"].setdefault("resources", {})["cpu"] = {"quota": 500, "period": 100000}
    (bundle / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as unclosed:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(OSError, match=r"cpu\.(cfs_quota_us|max)"):
            rt.create("c1", str(bundle))
        gc.collect()
    assert [str(w.message) for w in unclosed] == []
    assert rt.list() == [] and not manager("", "c1", LinuxSyscalls()).exists()
