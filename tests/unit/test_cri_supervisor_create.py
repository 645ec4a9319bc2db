"""The supervisor's create step without root: Runtime.create runs in a child of the supervisor that exits
once done (so the pages its work dirties are not the supervisor's for the container's life), yet the init,
orphaned by the runtime's stage 1, is the supervisor's to reap, its output reaches the CRI log and a failed
create is reported as its kind. A stand-in runtime forks the init as pyruntime does (stage 1, then the init)."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pyruntime.cri import supervisor
from pyruntime.cri.jobs import ContainerJob
from pyruntime.cri.model import ExitRecord
from pyruntime.errors import InvalidArgumentError
from pyruntime.linux.syscalls import LinuxSyscalls


class StandIn:
    """create(): stage 1 forks the init (sh -c script) and exits at once, as pyruntime's create does."""

    kernel = LinuxSyscalls()
    store = None

    def __init__(self, bundle: str, script: str = "", fail: Exception | None = None, die: bool = False) -> None:
        self.bundle, self.script, self.fail, self.die = bundle, script, fail, die

    def create(self, cid: str, bundle: str, console_socket: str | None = None) -> SimpleNamespace:
        Path(bundle, "creator").write_text(str(os.getpid()))
        if self.fail is not None:
            raise self.fail
        r, w = os.pipe()
        stage1 = os.fork()
        if stage1 == 0:
            init = os.fork()
            if init == 0:
                os.execv("/bin/sh", ["sh", "-c", self.script])
            os.write(w, str(init).encode())
            os._exit(0)
        os.close(w)
        pid = int(os.read(r, 64))
        os.close(r)
        os.waitpid(stage1, 0)
        Path(bundle, "init").write_text(str(pid))
        if self.die:  # killed once the container is made, before it could report
            os.kill(os.getpid(), signal.SIGKILL)
        return SimpleNamespace(pid=pid)

    def delete(self, cid: str, force: bool = False) -> None:
        """Called by the supervisor, which knows the init only from what create left behind."""
        os.kill(int(Path(self.bundle, "init").read_text()), signal.SIGKILL)
        Path(self.bundle, "deleted").touch()


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "oom_count", lambda store, cid: 0)  # no cgroup behind the stand-in
    return ContainerJob(container_id="c1", bundle=str(tmp_path), log_path=str(tmp_path / "logs" / "c1.log"),
                        tty=False, stdin=False, stdin_once=False, exit_path=str(tmp_path / "exit.json"),
                        supervisor_dir=str(tmp_path / "run"))


def supervise(runtime: StandIn, job: ContainerJob) -> tuple[int, dict]:
    """Forks the supervisor as the launcher does: (its pid, its report)."""
    os.makedirs(os.path.dirname(job.log_path), exist_ok=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        supervisor.supervise(runtime, job, w)  # type: ignore[arg-type]  # the stand-in, not a Runtime
    os.close(w)
    with os.fdopen(r) as f:
        return pid, json.loads(f.readline() or "{}")


def exit_code(pid: int, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while not (got := os.waitpid(pid, os.WNOHANG))[0]:
        assert time.monotonic() < deadline, "the supervisor did not exit"
        time.sleep(0.02)
    return os.waitstatus_to_exitcode(got[1])


def test_the_init_made_in_the_create_child_is_reaped_by_the_supervisor(job):
    pid, report = supervise(StandIn(job.bundle, "sleep 0.3; echo out; echo err >&2; exit 7"), job)
    assert set(report) == {"pid"} and report["pid"] != pid
    creator = int(Path(job.bundle, "creator").read_text())
    deadline = time.monotonic() + 5  # a child of the supervisor's, reaped by it once it has exited
    while os.path.exists(f"/proc/{creator}"):
        assert time.monotonic() < deadline, "the create child was not reaped"
        time.sleep(0.01)
    assert creator != pid
    assert int(Path(f"/proc/{report['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid  # its parent
    assert exit_code(pid) == 0
    record = ExitRecord.load(job.exit_path)
    assert (record.exit_code, record.reason) == (7, "Error")
    log = Path(job.log_path).read_bytes()
    assert b" stdout F out\n" in log and b" stderr F err\n" in log


def test_a_failed_create_is_reported_as_its_kind(job):
    pid, report = supervise(StandIn(job.bundle, fail=InvalidArgumentError("process.args: empty")), job)
    assert report == {"error": "InvalidArgumentError", "message": "process.args: empty"}
    assert exit_code(pid) == 1
    assert not os.path.exists(job.exit_path) and not os.path.exists(os.path.join(job.bundle, "deleted"))


def test_a_create_child_killed_after_making_the_container_leaves_nothing(job):
    pid, report = supervise(StandIn(job.bundle, "exec sleep 60", die=True), job)
    assert report["error"] == "InternalError" and "exited without a report" in report["message"]
    assert exit_code(pid) == 1
    assert os.path.exists(os.path.join(job.bundle, "deleted"))  # and the init with it, reaped by the supervisor
