"""The CRI fork server against the real kernel: the built-in pause (namespaces pinned, hostname and
sysctls inside, shared pid, cgroup parent, release), exec into a running container (pipes, stdin, a
tty, exit codes, timeout and kill, failures), the container supervisor's creation, and the launcher's
own life (it ends with its client, its pause children don't)."""
from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from pynode_os.proc import process_start_time
from pyruntime.cri.jobs import ContainerJob, ExecJob, PauseJob
from pyruntime.cri.launcher import Launcher
from pyruntime.cri.model import Layout, SandboxRecord
from pyruntime.cri.pause import pidfile, release_pause
from pyruntime.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from pyruntime.linux import syscalls as sc
from pyruntime.linux.syscalls import LinuxSyscalls
from pyruntime.settings import Settings

KERNEL = LinuxSyscalls()


@pytest.fixture
def layout(tmp_path) -> Layout:
    return Layout(str(tmp_path / "root"), str(tmp_path / "state"))


@pytest.fixture
def launcher(layout, runtime):
    """A launcher whose runtime root is the kit runtime's, so containers made by either are seen by both."""
    la = Launcher.spawn(Settings(root=str(runtime.root)), layout)
    yield la
    la.close()


def _alive(pid: int, start: int) -> bool:
    return process_start_time(pid) == start


def _eventually(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _nsenter(option: str, pin: str, *cmd: str) -> str:
    return subprocess.run(["nsenter", f"{option}={pin}", *cmd], check=True, capture_output=True,
                          text=True, timeout=10).stdout.strip()


def _mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path)]


# ---------------------------------------------------------------------------------------------------------------
# pause


def test_a_pod_without_a_shared_pid_namespace_has_its_namespaces_pinned_and_no_process(launcher, layout):
    ns_dir = layout.ns_dir("s1")
    info = launcher.run_pause(PauseJob("s1", ns_dir, hostname="pod-host", sysctls={
        "net.ipv4.ip_forward": "1", "kernel/shm_rmid_forced": "1", "kernel.msgmax": "4321"}))
    try:
        assert (info.pid, info.start_time, info.cgroup) == (0, 0, "")  # the pins alone hold the namespaces
        assert set(info.namespaces) == {"net", "ipc", "uts"}
        for kind, flag in (("net", sc.CLONE_NEWNET), ("ipc", sc.CLONE_NEWIPC), ("uts", sc.CLONE_NEWUTS)):
            pin = info.namespaces[kind]
            assert pin == os.path.join(ns_dir, kind)
            assert KERNEL.ns_type(pin) == flag
            assert os.stat(pin).st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino
        assert _nsenter("--uts", info.namespaces["uts"], "hostname") == "pod-host"
        assert _nsenter("--net", info.namespaces["net"], "cat", "/proc/sys/net/ipv4/ip_forward") == "1"
        assert _nsenter("--ipc", info.namespaces["ipc"], "cat", "/proc/sys/kernel/shm_rmid_forced") == "1"
        assert _nsenter("--ipc", info.namespaces["ipc"], "cat", "/proc/sys/kernel/msgmax") == "4321"
        assert _nsenter("--net", info.namespaces["net"], "ip", "-o", "link").count("\n") == 0  # lo only
        assert not os.path.exists(pidfile(ns_dir))
    finally:
        release_pause(info, ns_dir, KERNEL)
    assert not os.path.exists(ns_dir) and _mounts_under(ns_dir) == []
    release_pause(info, ns_dir, KERNEL)  # idempotent


def test_pause_with_a_shared_pid_namespace_is_its_pid_1(launcher, layout):
    ns_dir = layout.ns_dir("s2")
    info = launcher.run_pause(PauseJob("s2", ns_dir, new_uts=False, share_pid=True))
    try:
        assert set(info.namespaces) == {"net", "ipc", "pid"}
        assert info.namespaces["pid"] == f"/proc/{info.pid}/ns/pid"
        assert KERNEL.ns_type(info.namespaces["pid"]) == sc.CLONE_NEWPID
        status = Path(f"/proc/{info.pid}/status").read_text()
        assert next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[1:] == [
            str(info.pid), "1"]
        # pid 1 reaps what is left to it: an orphan of the pod's pid namespace doesn't stay a zombie
        subprocess.run(["nsenter", f"--pid={info.namespaces['pid']}", "--", "sh", "-c", "sleep 0.1 &"],
                       check=True, timeout=10)
        time.sleep(0.4)
        children = Path(f"/proc/{info.pid}/task/{info.pid}/children").read_text().split()
        assert children == []
        assert os.readlink(f"/proc/{info.pid}/ns/uts") == os.readlink("/proc/self/ns/uts")  # shared with the host
        # the pause is small and quiet: no fds, in a session that is not the daemon's
        assert os.listdir(f"/proc/{info.pid}/fd") == []
        assert os.getsid(info.pid) != os.getsid(0)
    finally:
        release_pause(info, ns_dir, KERNEL)
    assert not _alive(info.pid, info.start_time)
    assert not os.path.exists(ns_dir)


def test_pause_joins_a_leaf_of_its_cgroup_parent(launcher, layout):
    parent = f"/pynode-test-pod-{uuid.uuid4().hex[:8]}"
    ns_dir = layout.ns_dir("s3")
    info = launcher.run_pause(PauseJob("s3", ns_dir, share_pid=True, cgroup_parent=parent))
    try:
        assert info.cgroup == f"{parent}/pause"
        own = Path(f"/proc/{info.pid}/cgroup").read_text()
        assert f"{parent}/pause\n" in own
    finally:
        release_pause(info, ns_dir, KERNEL)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():  # the parent is the caller's (the kubelet's)
            leftover = hierarchy / parent.lstrip("/")
            assert not (leftover / "pause").exists()
            if leftover.is_dir():
                leftover.rmdir()


def test_bad_pause_requests_name_what_is_wrong_and_leave_nothing(launcher, layout):
    ns_dir = layout.ns_dir("s4")
    for sysctls, match in (({"kernel.hostname": "x"}, "sysctls.kernel.hostname: not a namespaced sysctl"),
                           ({"net.ipv4.no_such_thing": "1"}, "sysctls.net.ipv4.no_such_thing: no such sysctl")):
        with pytest.raises(InvalidArgumentError, match=match):
            launcher.run_pause(PauseJob("s4", ns_dir, sysctls=sysctls))
        assert not os.path.exists(ns_dir) and _mounts_under(ns_dir) == []
    with pytest.raises(InvalidArgumentError, match="not allowed in the host's network namespace"):
        launcher.run_pause(PauseJob("s4", ns_dir, new_net=False, sysctls={"net.core.somaxconn": "100"}))


def test_the_launcher_ends_with_its_client_and_its_pause_survives(layout, tmp_path):
    launcher = Launcher.spawn(Settings(root=str(tmp_path / "runtime")), layout)
    ns_dir = layout.ns_dir("s5")
    info = launcher.run_pause(PauseJob("s5", ns_dir, share_pid=True))
    try:
        launcher.close()
        assert not os.path.exists(f"/proc/{launcher.pid}")  # reaped by close()
        assert _alive(info.pid, info.start_time)
        assert KERNEL.ns_type(info.namespaces["net"]) == sc.CLONE_NEWNET
        with pytest.raises(Exception, match="launcher"):
            launcher.run_pause(PauseJob("s6", layout.ns_dir("s6")))
    finally:
        release_pause(info, ns_dir, KERNEL)
    assert not _alive(info.pid, info.start_time)


def test_the_launcher_imports_nothing_from_the_daemons_working_directory(layout, tmp_path, monkeypatch):
    """`python -c` puts the working directory first on sys.path: a json.py there would run as root."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "imported"
    (cwd / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit('imported from the cwd')\n")
    monkeypatch.chdir(cwd)
    launcher = Launcher.spawn(Settings(root=str(tmp_path / "runtime")), layout)
    ns_dir = layout.ns_dir("s7")
    try:
        release_pause(launcher.run_pause(PauseJob("s7", ns_dir)), ns_dir, KERNEL)
    finally:
        launcher.close()
    assert not marker.exists()


def test_a_pause_whose_pid_never_reached_the_record_is_still_released(launcher, layout):
    """The daemon records the pause's pid once the launcher answers: killed before that, its sandbox record
    has no pid, and StopPodSandbox finds the pause through the note it leaves beside its pins."""
    ns_dir = layout.ns_dir("s8")
    info = launcher.run_pause(PauseJob("s8", ns_dir, share_pid=True))
    record = SandboxRecord(id="s8", config="", created_at=0)
    try:
        assert record.pause_pid == 0 and _alive(info.pid, info.start_time)
    finally:
        release_pause(record, ns_dir, KERNEL)
    assert not _alive(info.pid, info.start_time)
    assert not os.path.exists(os.path.dirname(ns_dir)) or os.listdir(os.path.dirname(ns_dir)) == []


def test_release_never_kills_a_process_it_did_not_make(layout):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        start = process_start_time(sleeper.pid)
        assert start is not None
        from pyruntime.cri.jobs import PauseInfo
        release_pause(PauseInfo(sleeper.pid, start + 1, {}), layout.ns_dir("s7"), KERNEL)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


# ---------------------------------------------------------------------------------------------------------------
# exec


@pytest.fixture
def container(runtime, make_bundle):
    bundle = make_bundle(["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"])
    runtime("create", "--bundle", str(bundle), "c1")
    runtime("start", "c1")
    return "c1"


def _read_all(fd: int, timeout: float = 10) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError as e:  # a pty's master reads EIO once every slave is closed
            if e.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        data += chunk
    return data


def test_exec_with_pipes_reports_output_and_exit_code(launcher, container):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    try:
        handle = launcher.exec(ExecJob(container, ["sh", "-c", "cat; echo err >&2; echo $FOO; exit 3"],
                                       env=["FOO=bar"]), in_r, out_w, err_w)
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        os.write(in_w, b"from stdin\n")
        os.close(in_w)
        assert handle.wait(10) == 3
        assert _read_all(out_r) == b"from stdin\nbar\n"
        assert _read_all(err_r) == b"err\n"
        handle.close()
    finally:
        os.close(out_r)
        os.close(err_r)


def test_exec_without_fds_and_signals(launcher, container):
    handle = launcher.exec(ExecJob(container, ["true"]), None, None, None)
    assert handle.wait(10) == 0
    handle.close()
    handle = launcher.exec(ExecJob(container, ["sleep", "100"]), None, None, None)
    assert handle.wait(0.2) is None  # timed out
    handle.kill()
    assert handle.wait(10) == 128 + signal.SIGKILL
    handle.kill()  # gone: no error
    handle.close()


def test_an_exec_whose_process_ended_does_not_hang_on_a_child_holding_its_output(launcher, container):
    out_r, out_w = os.pipe()
    try:
        handle = launcher.exec(ExecJob(container, ["sh", "-c", "sleep 30 & echo started"]), None, out_w, None)
        os.close(out_w)
        assert handle.wait(10) == 0
        handle.close()
        assert os.read(out_r, 100) == b"started\n"
    finally:
        os.close(out_r)


def test_exec_with_a_tty(launcher, container):
    handle = launcher.exec(ExecJob(container, ["sh", "-c", "tty; test -t 0 && exit 5"], tty=True), None, None, None)
    try:
        assert handle.pty is not None
        assert handle.wait(10) == 5
        assert b"/dev/pts/" in _read_all(handle.pty)
    finally:
        handle.close()


def test_exec_failures_are_errors_of_their_kind(launcher, container):
    with pytest.raises(InvalidArgumentError, match="executable file not found"):  # the caller's argv
        launcher.exec(ExecJob(container, ["no-such-binary"]), None, None, None)
    with pytest.raises(NotFoundError):
        launcher.exec(ExecJob("no-such-container", ["true"]), None, None, None)


def test_concurrent_execs_get_their_own_answers(launcher, container):
    results: dict[int, int | None] = {}

    def one(n: int) -> None:
        handle = launcher.exec(ExecJob(container, ["sh", "-c", f"exit {n}"]), None, None, None)
        results[n] = handle.wait(20)
        handle.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {n: n for n in range(8)}
    # every exec helper reaped, no zombie stays; the puller (the launcher's fork server for pulls) lives on
    _eventually(lambda: [c for c in _children(launcher.pid) if _comm(c) not in (PULLER, None)] == [])


def _children(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


PULLER = "pyruntime-puller"[:15]  # comm holds 15 bytes


def _comm(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # reaped since the listing
        return None


# ---------------------------------------------------------------------------------------------------------------
# containers (through pyruntime.cri.supervisor.supervise)


def _container_job(layout: Layout, cid: str, bundle: Path) -> ContainerJob:
    """A job with the directories the daemon makes before it asks (the kubelet makes the log's)."""
    job = ContainerJob(cid, str(bundle), log_path=os.path.join(layout.root, "logs", f"{cid}.log"), tty=False,
                       stdin=False, stdin_once=False, exit_path=layout.exit_record(cid),
                       supervisor_dir=layout.supervisor_dir(cid))
    for d in (os.path.dirname(job.log_path), layout.container_dir(cid), job.supervisor_dir):
        os.makedirs(d, exist_ok=True)
    return job


def test_create_container_returns_once_created(launcher, runtime, layout, make_bundle):
    bundle = make_bundle(["sleep", "100"])
    info = launcher.create_container(_container_job(layout, "c2", bundle))
    assert _alive(info.pid, info.start_time)
    state = runtime.state("c2")
    assert (state["status"], state["pid"]) == ("created", info.init_pid)
    runtime("delete", "--force", "c2")
    _eventually(lambda: not _alive(info.pid, info.start_time))


def test_create_container_failure_is_its_kind_and_leaves_nothing(launcher, runtime, layout, tmp_path, container,
                                                                  make_bundle):
    with pytest.raises(InvalidArgumentError, match="no-such-bundle"):
        launcher.create_container(_container_job(layout, "c3", tmp_path / "no-such-bundle"))
    bad = tmp_path / "bad-bundle"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": {"args": []}}))
    with pytest.raises(InvalidArgumentError):
        launcher.create_container(_container_job(layout, "c3", bad))
    assert not (Path(runtime.root) / "c3").exists()
    with pytest.raises(AlreadyExistsError):
        launcher.create_container(_container_job(layout, container, make_bundle(["true"])))
    assert runtime.state(container)["status"] == "running"


def test_a_slow_create_does_not_hold_up_an_exec(launcher, runtime, layout, make_bundle, container, tmp_path):
    # the create waits in its createRuntime hook until the test lets it go, after the exec has finished
    in_hook, go = tmp_path / "in-hook", tmp_path / "go"
    wait = f": > {in_hook}; while [ ! -e {go} ]; do /bin/sleep 0.05; done"
    bundle = make_bundle(["sleep", "100"], hooks={"createRuntime": [{"path": "/bin/sh", "args": ["sh", "-c", wait],
                                                                     "timeout": 60}]})
    created: list = []

    def create() -> None:
        try:
            created.append(launcher.create_container(_container_job(layout, "c4", bundle)))
        except Exception as e:  # re-raised by the test, not lost in the thread
            created.append(e)

    creator = threading.Thread(target=create)
    creator.start()
    try:
        _eventually(in_hook.exists)
        handle = launcher.exec(ExecJob(container, ["true"]), None, None, None)
        assert handle.wait(10) == 0
        handle.close()
        assert creator.is_alive()  # still in the hook, which only `go` ends
    finally:
        go.touch()
        creator.join(30)
    if isinstance(created[0], Exception):
        raise created[0]
    assert runtime.state("c4")["status"] == "created"
    runtime("delete", "--force", "c4")
    _eventually(lambda: not _alive(created[0].pid, created[0].start_time))
