"""RuntimeStreamBackend on the real kernel: port forwarding opens its connection inside a pod's network
namespace (and leaves the thread in its own), and a tty exec pumps the terminal and applies resizes
(with a stand-in for the launcher that runs the kit's busybox on a pty)."""
from __future__ import annotations

import os
import pty
import queue
import subprocess
import sys
import threading
import time

import pytest

from pyruntime.cri.streaming.backend import RuntimeStreamBackend
from pyruntime.errors import UnavailableError
from pyruntime.linux.syscalls import LinuxSyscalls
from tests.integration.cni_helpers import scratch_netns
from tests.kit.busybox import static_busybox

ECHO = """
import socket, sys
s = socket.create_server(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
s.close()
while data := c.recv(65536):
    c.sendall(data)
"""


@pytest.fixture
def pod_netns():
    with scratch_netns("pynode-pf") as name:
        yield name


def test_port_forward_connects_inside_the_pods_netns(pod_netns):
    path = f"/run/netns/{pod_netns}"
    server = subprocess.Popen(["ip", "netns", "exec", pod_netns, sys.executable, "-c", ECHO], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        backend = RuntimeStreamBackend(launcher=None, layout=None,  # type: ignore[arg-type]  # not used by port_forward
                                       sandbox_netns={"pod": path}.__getitem__, kernel=LinuxSyscalls())
        before = os.stat("/proc/thread-self/ns/net").st_ino
        with backend.port_forward("pod", port) as conn:
            assert os.stat("/proc/thread-self/ns/net").st_ino == before
            conn.sendall(b"ping")
            assert conn.recv(10) == b"ping"
        with pytest.raises(UnavailableError, match=f"port forward to pod pod port {port}"):
            backend.port_forward("pod", port)  # the echo server took one connection and stopped listening
        gone = RuntimeStreamBackend(launcher=None, layout=None,  # type: ignore[arg-type]  # as above
                                    sandbox_netns=lambda _: "/run/netns/pynode-no-such", kernel=LinuxSyscalls())
        with pytest.raises(UnavailableError, match="pynode-no-such: gone"):
            gone.port_forward("pod", port)
        assert os.stat("/proc/thread-self/ns/net").st_ino == before
    finally:
        server.kill()
        server.communicate()


class PtyLauncher:
    """Launcher.exec's contract for a tty job, on the host: the command on a new pty, the master returned."""

    class Handle:
        def __init__(self, proc: subprocess.Popen, master: int) -> None:
            self.pid, self.pty, self._proc = proc.pid, master, proc

        def wait(self, timeout: float | None = None) -> int | None:
            return self._proc.wait(timeout)

        def kill(self) -> None:
            self._proc.kill()

        def close(self) -> None:
            os.close(self.pty)

    def exec(self, job, stdin, stdout, stderr):
        assert job.tty and job.container_id == "c1"
        master, slave = pty.openpty()
        # busybox's stty prefers LINES/COLUMNS (which pytest may set) to the terminal's size
        env = {k: v for k, v in os.environ.items() if k not in ("LINES", "COLUMNS")}
        proc = subprocess.Popen(job.argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env)
        os.close(slave)
        return self.Handle(proc, master)


def test_tty_exec_pumps_the_terminal_and_resizes(monkeypatch):
    import importlib
    import types

    from pyruntime.cri.streaming import backend as backend_module

    # the jobs module is another part's: give the backend its ExecJob shape only
    fake_jobs = types.SimpleNamespace(ExecJob=lambda container_id, argv, tty: types.SimpleNamespace(
        container_id=container_id, argv=argv, tty=tty))
    real_import = importlib.import_module
    monkeypatch.setattr(backend_module.importlib, "import_module",
                        lambda name: fake_jobs if name == "pyruntime.cri.jobs" else real_import(name))
    busybox = str(static_busybox())
    sizes: queue.Queue = queue.Queue()
    applied = threading.Event()
    calls = 0

    def resize():
        nonlocal calls
        calls += 1
        if calls == 2:
            applied.set()  # the first size was applied before the backend asked for the next
        return sizes.get()

    threads_before = threading.active_count()
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    backend = RuntimeStreamBackend(PtyLauncher(), layout=None, sandbox_netns=lambda _: None,  # type: ignore[arg-type]  # exec only
                                   kernel=LinuxSyscalls())
    result: list[int] = []
    cmd = [busybox, "sh", "-c", f"read line; {busybox} stty size; echo got $line; exit 7"]
    runner = threading.Thread(target=lambda: result.append(backend.exec(
        "c1", cmd, tty=True, stdin=stdin_r, stdout=stdout_w, stderr=None, resize=resize)))
    runner.start()
    try:
        sizes.put((132, 43))
        assert applied.wait(10)
        os.write(stdin_w, b"hello\n")
        runner.join(20)
        assert result == [7]
        os.close(stdout_w)
        out = b""
        while data := os.read(stdout_r, 65536):
            out += data
        assert b"43 132" in out and b"got hello" in out
    finally:
        sizes.put(None)
        for fd in (stdin_r, stdin_w, stdout_r):
            os.close(fd)
    # the pumps end with their streams (here: stdin closed, terminal gone, no more sizes)
    deadline = time.monotonic() + 10
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads_before, threading.enumerate()
