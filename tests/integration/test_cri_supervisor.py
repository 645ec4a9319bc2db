"""The container supervisor with real containers: forked (as the launcher forks it) from a
single-threaded helper process, it creates a busybox container, writes its CRI log, serves attach,
reopen and resize on supervisor.sock, records the exit and goes away with nothing left behind."""
from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from pyruntime.cri import attach
from pyruntime.cri.crilog import MAX_LINE
from pyruntime.cri.jobs import ContainerJob
from pyruntime.cri.model import ExitRecord
from pyruntime.cri.supervisor import SOCKET
from pyruntime.errors import FailedPreconditionError, InvalidArgumentError
from pyruntime.runtime import Runtime
from pyruntime.settings import Settings
from tests.kit.runtime import bundle_config

# the launcher's part: fork, supervise in the child, pass on its report
DRIVER = """
import json, os, sys
from pyruntime.cri.jobs import ContainerJob
from pyruntime.cri.supervisor import supervise
from pyruntime.runtime import Runtime
from pyruntime.settings import Settings

runtime = Runtime(Settings.from_env({}, root=sys.argv[1]))
job = ContainerJob(**json.loads(sys.argv[2]))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    supervise(runtime, job, w)
os.close(w)
with os.fdopen(r) as f:
    print(json.dumps({"supervisor": pid, **json.loads(f.readline() or "{}")}))
"""
ENTRY = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr) ([PF]) (.*)")


@dataclass
class Job(ContainerJob):
    """The launcher's job, and where its supervisor listens."""

    @property
    def sock(self) -> str:
        return os.path.join(self.supervisor_dir, SOCKET)


@pytest.fixture
def rt(tmp_path):
    runtime = Runtime(Settings.from_env({}, root=str(tmp_path / "state")))
    yield runtime
    for state in runtime.list():
        runtime.delete(state.id, force=True)


@pytest.fixture
def job(tmp_path, rootfs):
    """job(args, **fields, config edits via `edit`) -> Job with its bundle written."""
    counter = iter(range(100))

    def make(args: list[str], edit=None, **fields) -> Job:
        n = next(counter)
        config = bundle_config(rootfs, args)
        config["process"]["terminal"] = fields.get("tty", False)
        if edit:
            edit(config)
        bundle = tmp_path / f"bundle{n}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(config))
        values: dict[str, Any] = {
            "container_id": f"sup{n}", "bundle": str(bundle), "log_path": str(tmp_path / "logs" / f"c{n}.log"),
            "tty": False, "stdin": False, "stdin_once": False, "exit_path": str(tmp_path / f"exit{n}.json"),
            "supervisor_dir": str(tmp_path / "run" / f"c{n}")}
        values.update(fields)
        return Job(**values)
    return make


def supervise(rt: Runtime, job: Job) -> dict:
    done = subprocess.run([sys.executable, "-c", DRIVER, rt.settings.root, json.dumps(asdict(job))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_exit(pid: int, timeout: float = 30) -> int:
    """The supervisor is this (subreaper) process's child once the driver exited."""
    deadline = time.monotonic() + timeout
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        assert time.monotonic() < deadline, "the supervisor did not exit"
        time.sleep(0.02)


def entries(path: str) -> list[tuple[str, str, bytes]]:
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        m = ENTRY.fullmatch(line)
        assert m, line
        out.append((m[1].decode(), m[2].decode(), m[3]))
    return out


def until(check, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


@pytest.fixture(autouse=True)
def no_thread_left():
    """The attach clients' threads end with their attach: the runtime tests after these fork."""
    yield
    deadline = time.monotonic() + 5
    while threading.active_count() > 1:
        assert time.monotonic() < deadline, threading.enumerate()
        time.sleep(0.02)


def finished(rt: Runtime, job: Job, report: dict) -> ExitRecord:
    """Waits for the supervisor, checks it left nothing, removes the container."""
    assert wait_exit(report["supervisor"]) == 0
    record = ExitRecord.load(job.exit_path)
    assert not os.path.exists(job.sock)
    assert not os.path.exists(f"/proc/{report['pid']}")
    rt.delete(job.container_id)
    return record


def test_output_goes_to_the_cri_log_and_the_exit_is_recorded(rt, job):
    script = (f"echo out; echo err >&2; grep SigIgn /proc/self/status; head -c {2 * MAX_LINE + 10} /dev/zero"
              " | tr '\\0' x; echo; printf partial; exit 3")
    j = job(["sh", "-c", script])
    report = supervise(rt, j)
    assert report["pid"] > 0 and rt.state(j.container_id).status == "created"
    assert os.stat(j.sock).st_mode & 0o777 == 0o600
    rt.start(j.container_id)
    before = time.time_ns()
    record = finished(rt, j, report)
    assert (record.exit_code, record.reason) == (3, "Error") and record.finished_at >= before - 10**9
    got = entries(j.log_path)
    assert ("stdout", "F", b"out") in got and ("stderr", "F", b"err") in got
    stdout = [(tag, text) for stream, tag, text in got if stream == "stdout"]
    assert stdout[0] == ("F", b"out") and stdout[1][1].startswith(b"SigIgn:\t")
    ignored = int(stdout[1][1].split(b"\t")[1], 16)
    assert ignored == 0  # neither Python's (SIGPIPE, SIGXFSZ) nor make's (32, 33) leaked in
    assert stdout[2:] == [("P", b"x" * MAX_LINE), ("P", b"x" * MAX_LINE), ("F", b"x" * 10), ("P", b"partial")]


@pytest.mark.parametrize("script, sig, code, reason", [("exit 0", None, 0, "Completed"),
                                                          ("sleep 100", "KILL", 137, "Error")])
def test_exit_codes_and_reasons(rt, job, script, sig, code, reason):
    j = job(["sh", "-c", script], log_path="")  # no log file
    report = supervise(rt, j)
    rt.start(j.container_id)
    if sig:
        rt.kill(j.container_id, sig)
    record = finished(rt, j, report)
    assert (record.exit_code, record.reason) == (code, reason)


def test_a_memory_limit_kill_is_oomkilled(rt, job):
    def limit(config):
        config["linux"]["resources"] = {"memory": {"limit": 32 << 20, "swap": 32 << 20}}
    j = job(["sh", "-c", "a=xxxxxxxx; while :; do a=$a$a; done"], edit=limit)
    report = supervise(rt, j)
    rt.start(j.container_id)
    record = finished(rt, j, report)
    assert (record.exit_code, record.reason) == (137, "OOMKilled")


def read_frames(sock: socket.socket) -> dict[int, bytes]:
    """A raw client of the documented protocol: the frames until the server closes."""
    out: dict[int, bytes] = {}
    buf = b""
    while chunk := sock.recv(65536):
        buf += chunk
    while buf:
        kind, size = attach.FRAME.unpack_from(buf)
        out[kind] = out.get(kind, b"") + buf[attach.FRAME.size:attach.FRAME.size + size]
        buf = buf[attach.FRAME.size + size:]
    return out


def raw_attach(path: str, hello: dict) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    with attach.unix_address(path) as address:
        sock.connect(address)
    sock.sendall(json.dumps(hello).encode() + b"\n")
    line = b""
    while not line.endswith(b"\n"):
        line += sock.recv(1)
    assert json.loads(line) == {"ok": True, "tty": False}
    return sock


def test_attach_with_stdin_once_and_a_second_watcher(rt, job):
    j = job(["cat"], stdin=True, stdin_once=True)
    report = supervise(rt, j)
    rt.start(j.container_id)
    watcher = raw_attach(j.sock, {"op": "attach", "stdout": True, "stderr": True})
    seen: dict[int, bytes] = {}
    reader = threading.Thread(target=lambda: seen.update(read_frames(watcher)))
    reader.start()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(in_w, b"hello\nworld\n")
    os.close(in_w)  # the client's stdin ends: stdin_once closes the container's, cat exits
    attach.attach(j.sock, stdin=in_r, stdout=out_w, stderr=None)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        assert f.read() == b"hello\nworld\n"
    os.close(in_r)
    reader.join(10)
    watcher.close()
    assert seen == {attach.STDOUT: b"hello\nworld\n"}
    record = finished(rt, j, report)
    assert (record.exit_code, record.reason) == (0, "Completed")
    assert entries(j.log_path) == [("stdout", "F", b"hello"), ("stdout", "F", b"world")]
    with pytest.raises(FailedPreconditionError, match="supervisor has exited"):
        attach.attach(j.sock, stdout=1)


def test_stdin_stays_open_for_the_next_client_without_stdin_once(rt, job):
    j = job(["sh", "-c", "read a; echo got $a; read b; echo got $b"], stdin=True)
    report = supervise(rt, j)
    rt.start(j.container_id)
    for word in (b"one", b"two"):
        in_r, in_w = os.pipe()
        os.write(in_w, word + b"\n")
        os.close(in_w)
        ours, theirs = socket.socketpair()
        done = threading.Thread(target=attach.attach, args=(j.sock,), kwargs={"stdin": in_r, "stdout": ours})
        done.start()
        until(lambda peer=theirs: select.select([peer], [], [], 0)[0])
        assert theirs.recv(100) == b"got " + word + b"\n"
        if word == b"one":
            # the client's stdin ended, the container's stays open for the next one and the attach
            # waits for more output until the client goes away
            assert rt.state(j.container_id).status == "running" and done.is_alive()
            theirs.close()
        done.join(10)
        assert not done.is_alive()
        os.close(in_r)
        ours.close()
        theirs.close()
    record = finished(rt, j, report)
    assert record.exit_code == 0


def test_attach_to_a_container_without_stdin_asking_for_it_fails(rt, job):
    j = job(["sleep", "100"])
    report = supervise(rt, j)
    with pytest.raises(InvalidArgumentError, match="stdin"):
        attach.attach(j.sock, stdin=0)
    rt.kill(j.container_id, "KILL")
    record = finished(rt, j, report)
    assert record.exit_code == 137


def test_tty_resize_and_attach(rt, job):
    script = "read a; stty size; while [ \"$(stty size)\" != '50 120' ]; do sleep 0.05; done; echo resized"
    j = job(["sh", "-c", script], tty=True, stdin=True, stdin_once=True)
    report = supervise(rt, j)
    rt.start(j.container_id)
    attach.resize(j.sock, 100, 40)
    import queue
    sizes: queue.Queue = queue.Queue()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.set_blocking(out_r, False)
    output = bytearray()

    def drain() -> bytes:
        try:
            while chunk := os.read(out_r, 65536):
                output.extend(chunk)
        except BlockingIOError:
            pass
        return bytes(output)
    done = threading.Thread(target=attach.attach, args=(j.sock,),
                            kwargs={"stdin": in_r, "stdout": out_w, "tty": True, "resize": sizes})
    done.start()
    os.write(in_w, b"go\n")
    until(lambda: b"40 100" in drain())
    sizes.put((120, 50))
    until(lambda: b"resized" in drain())
    done.join(10)
    assert not done.is_alive()
    for fd in (in_r, in_w, out_r, out_w):
        os.close(fd)
    record = finished(rt, j, report)
    assert record.exit_code == 0
    got = entries(j.log_path)
    assert ("stdout", "F", b"go") in got and ("stdout", "F", b"40 100") in got  # the echo, "\r\n" ends
    assert got[-1] == ("stdout", "F", b"resized") and {s for s, _, _ in got} == {"stdout"}


def test_reopen_log_after_rotation(rt, job):
    j = job(["sh", "-c", "echo one; read x; echo two"], stdin=True, stdin_once=True)
    report = supervise(rt, j)
    rt.start(j.container_id)
    until(lambda: os.path.exists(j.log_path) and entries(j.log_path))
    os.rename(j.log_path, j.log_path + ".1")
    attach.reopen_log(j.sock)
    in_r, in_w = os.pipe()
    os.close(in_w)
    attach.attach(j.sock, stdin=in_r)
    os.close(in_r)
    finished(rt, j, report)
    assert entries(j.log_path + ".1") == [("stdout", "F", b"one")]
    assert entries(j.log_path) == [("stdout", "F", b"two")]


def test_a_failed_create_is_reported_and_leaves_nothing(rt, job, tmp_path):
    j = job(["true"], edit=lambda config: config["process"].pop("args"))
    report = supervise(rt, j)
    assert report["error"] == "InvalidArgumentError" and "process.args" in report["message"]
    assert wait_exit(report["supervisor"]) == 1
    assert rt.list() == [] and os.listdir(j.supervisor_dir) == [] and not os.path.exists(j.exit_path)


def test_an_id_in_use_is_reported_and_the_other_container_is_left_alone(rt, job):
    first = job(["sleep", "100"])
    report = supervise(rt, first)
    second = job(["true"], container_id=first.container_id)
    failed = supervise(rt, second)
    assert failed["error"] == "AlreadyExistsError"
    assert wait_exit(failed["supervisor"]) == 1
    assert rt.state(first.container_id).status == "created"
    rt.kill(first.container_id, "KILL")
    assert finished(rt, first, report).exit_code == 137


def test_long_socket_paths_work(rt, job, tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    j = job(["sh", "-c", "read x; echo $x"], tty=True, stdin=True, supervisor_dir=str(deep))
    report = supervise(rt, j)
    assert len(j.sock) > 108
    rt.start(j.container_id)
    in_r, in_w = os.pipe()
    os.write(in_w, b"deep\n")
    out_r, out_w = os.pipe()
    attach.attach(j.sock, stdin=in_r, stdout=out_w, tty=True)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        assert b"deep\n" in f.read()  # the echo; the console translates no newlines (ONLCR off, as runc's)
    for fd in (in_r, in_w):
        os.close(fd)
    assert finished(rt, j, report).exit_code == 0
    assert Path(j.log_path).exists()
