"""The launcher's puller, without root: a fork server that runs each image pull in a child of its own with the
pull code it imported at start, reports each pull on the socket it came with, and exits with the launcher."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from pyruntime import channel
from pyruntime.cri import forkserver
from pyruntime.cri.jobs import PullJob
from pyruntime.errors import NotFoundError
from pyruntime.linux.syscalls import Syscalls
from pyruntime.settings import Settings


class _Titles(Syscalls):
    def set_process_name(self, name: bytes) -> None:
        pass


def _pull(settings: Settings, kernel: Syscalls, job: PullJob, report: socket.socket) -> None:
    """Stands in for forkserver._pull: reports which process ran the pull."""
    if job.ref == "fails":
        raise NotFoundError("no such image")
    channel.send(report, {"id": f"sha256:{job.ref}", "pid": os.getpid(), "ppid": os.getppid()})
    os._exit(0)


@pytest.fixture
def puller(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[tuple[socket.socket, int]]:
    """The puller in a child of this process (its socket and pid), as the launcher forks it."""
    monkeypatch.setattr(forkserver, "_pull", _pull)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            forkserver._puller(theirs, Settings(root=str(tmp_path)), _Titles())
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        yield ours, pid
    finally:
        ours.close()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _request(sock: socket.socket, job: dict) -> dict:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        channel.send(sock, {"job": job}, [theirs.fileno()])
        theirs.close()
        got = channel.receive(ours)
    assert got is not None, "the report socket closed without a report"
    return got[0]


def test_each_pull_runs_in_a_child_of_the_puller_and_reports_on_its_socket(puller) -> None:
    sock, pid = puller
    reports = [_request(sock, asdict(PullJob(ref))) for ref in ("a", "b")]
    assert [r["id"] for r in reports] == ["sha256:a", "sha256:b"]
    assert all(r["ppid"] == pid and r["pid"] != pid for r in reports)
    assert reports[0]["pid"] != reports[1]["pid"]


def test_a_failed_pull_reports_its_error_kind_and_the_puller_serves_on(puller) -> None:
    sock, _ = puller
    assert _request(sock, asdict(PullJob("fails"))) == {"error": "NotFoundError", "message": "no such image"}
    assert _request(sock, {"ref": "x", "no_such_field": 1})["error"] == "InternalError"
    assert _request(sock, asdict(PullJob("c")))["id"] == "sha256:c"


def test_the_puller_exits_when_the_launcher_closes_its_end(puller) -> None:
    sock, pid = puller
    sock.shutdown(socket.SHUT_RDWR)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_launcher_leaves_the_pull_code_and_its_at_fork_hooks_to_the_puller() -> None:
    """Each of the launcher's forks (four a container) pays for the pages it holds and runs the at-fork hooks
    of threading and logging, which the registry client brings: those wait in the puller."""
    watched = {"logging", "threading", "requests", "pyruntime.images.pull"}
    probe = ("import sys; from pyruntime.cri import forkserver; forkserver.preload(forkserver.PRELOAD); "
             f"print(' '.join(sorted({watched!r} & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path[:0] = {sys.path!r}\n{probe}"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == []
