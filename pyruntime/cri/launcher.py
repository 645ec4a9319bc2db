"""The daemon's side of the fork server (pyruntime/cri/forkserver.py): starts it, sends it jobs
(pyruntime/cri/jobs.py) over the channel (pyruntime/channel.py) and hands each reply to its caller.

Concurrency: the client multiplexes the daemon's threads over the one socket by request id: a thread sends
under a lock, and whichever waiting thread finds no reader becomes the reader until its own reply arrives,
handing the others theirs. A launcher that is gone, or speaks garbage, fails every waiting and later call as
UNAVAILABLE.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict

from pyruntime import channel
from pyruntime.cri.jobs import ContainerJob, ExecJob, PauseInfo, PauseJob, PullJob, SupervisorInfo
from pyruntime.errors import FailedPreconditionError, InternalError, UnavailableError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.cri.model import Layout
    from pyruntime.images.request import Credentials
    from pyruntime.settings import Settings


class ExecHandle:
    """pid: the exec'd process (host pid). pty: the terminal's master with a tty exec (closed by close())."""

    def __init__(self, pid: int, exit_fd: int, pidfd: int, pty: int | None) -> None:
        self.pid, self.pty = pid, pty
        self._exit_fd, self._pidfd = exit_fd, pidfd
        self._code: int | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code (128+signal when killed by one); None when `timeout` seconds passed first."""
        with self._lock:
            if self._code is not None:
                return self._code
            if self._exit_fd < 0:
                raise FailedPreconditionError(f"exec {self.pid}: handle closed")
            if not channel.wait_readable(self._exit_fd, timeout):
                return None
            data = b""
            while b"\n" not in data and (chunk := os.read(self._exit_fd, 4096)):
                data += chunk
            try:
                self._code = int(json.loads(data)["exit_code"])
            except (ValueError, KeyError, TypeError) as e:
                raise InternalError(f"exec {self.pid}: the exec helper ended without an exit code") from e
            return self._code

    def kill(self) -> None:
        """SIGKILL to the exec'd process; no error once it is gone."""
        if self._pidfd < 0:
            return
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for name in ("_exit_fd", "_pidfd", "pty"):
            fd = getattr(self, name)
            if fd is not None and fd >= 0:
                os.close(fd)
                setattr(self, name, -1 if name != "pty" else None)


class Launcher:
    """The daemon's handle on the fork server (see the module doc); every method is thread-safe."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.pid = pid
        self._sock = sock
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[int, tuple[dict, list[int]]] = {}
        self._reading = False
        self._gone: str | None = None

    @classmethod
    def spawn(cls, settings: Settings, layout: Layout) -> Launcher:
        """Starts the server in a fresh interpreter (this one's executable and import path), not a fork of
        the daemon: it then carries only the container code, none of the daemon's modules (click, logging,
        threading), whose at-fork hooks would run in every child it forks, four of them per container."""
        from pyruntime.settings import interpreter_env
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            theirs.set_inheritable(True)
            # -P: `-c` would put the working directory first on sys.path, where any json.py would run as root
            argv = [sys.executable, "-P", "-c", "import sys; from pyruntime.cri.forkserver import serve; "
                    "serve(sys.argv[1])", str(theirs.fileno())]
            pid = os.posix_spawn(sys.executable, argv, interpreter_env(sys.path))
        finally:
            theirs.close()
        # its set-up on the socket, not in argv, which any user can read (the settings may hold credentials)
        channel.send(ours, {"settings": {k: getattr(settings, k) for k in settings.FIELDS},
                            "layout": [layout.root, layout.state]})
        return cls(ours, pid)

    # -- requests

    def wait_ready(self) -> None:
        """Returns once the server has its imports done and its puller forked: the daemon listens only then,
        so its first client finds the launcher's processes as they will stay, and a launcher that can't start
        stops the daemon's start instead of its first pod."""
        self._call("ready", {})

    def run_pause(self, job: PauseJob) -> PauseInfo:
        """Returns once the pod's namespaces are pinned (and its pause runs, when one stays); a failure leaves
        no pin, cgroup or process."""
        reply, _ = self._call("pause", asdict(job))
        return PauseInfo(**reply)

    def create_container(self, job: ContainerJob) -> SupervisorInfo:
        """Returns once Runtime.create succeeded in the supervisor; a failure is re-raised as its kind."""
        reply, _ = self._call("create", asdict(job))
        return SupervisorInfo(**reply)

    def pull_image(self, ref: str, auth: Credentials | None, progress_timeout: float = 300.0) -> str:
        """The pulled image's id; a failure is re-raised as its kind (NotFound, Unavailable, ...)."""
        job = PullJob(ref, auth.username, auth.password, auth.token) if auth is not None else PullJob(ref)
        job.progress_timeout = progress_timeout
        reply, _ = self._call("pull", asdict(job))
        return str(reply["id"])

    def exec(self, job: ExecJob, stdin: int | None, stdout: int | None, stderr: int | None) -> ExecHandle:
        """Starts job.argv in the container with these fds as its stdio (None: /dev/null); with job.tty
        they are ignored and the handle's pty is the terminal's master. A process that can't be started
        (no such binary) raises, as containerd's exec fails, rather than returning an exit code."""
        stdio: list[int | None] = [stdin, stdout, stderr] if not job.tty else [None, None, None]
        reply, fds = self._call("exec", asdict(job), stdio=stdio)
        pty = fds[2] if job.tty else None
        return ExecHandle(reply["pid"], fds[0], fds[1], pty)

    def close(self) -> None:
        """Ends the server (it leaves its children running) and reaps it."""
        with self._send_lock:
            if self._sock.fileno() >= 0:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # the launcher is gone already
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        with self._cond:
            self._gone = self._gone or "closed"
            if not self._reading:
                self._sock.close()
            self._cond.notify_all()

    # -- multiplexing

    def _call(self, op: str, job: dict, stdio: Sequence[int | None] = ()) -> tuple[dict, list[int]]:
        rid = next(self._ids)
        fds = [fd for fd in stdio if fd is not None]
        request = {"id": rid, "op": op, "job": job, "stdio": [fd is not None for fd in stdio]}
        with self._send_lock:
            if self._gone or self._sock.fileno() < 0:
                raise UnavailableError(f"launcher {self.pid}: {self._gone or 'closed'}")
            try:
                channel.send(self._sock, request, fds)
            except OSError as e:
                raise UnavailableError(f"launcher {self.pid}: send {op}: {e.strerror}") from e
        reply, got = self._await(rid)
        if "error" in reply:
            for fd in got:
                os.close(fd)
            channel.raise_reported(reply, op)
        return reply["ok"], got

    def _await(self, rid: int) -> tuple[dict, list[int]]:
        while True:
            with self._cond:
                while rid not in self._replies and self._reading and not self._gone:
                    self._cond.wait()
                if rid in self._replies:
                    return self._replies.pop(rid)
                if self._gone:
                    raise UnavailableError(f"launcher {self.pid}: {self._gone} before answering")
                self._reading = True
            try:
                got = channel.receive(self._sock)
            except (OSError, InternalError) as e:  # a launcher that speaks garbage is as good as gone
                got = None
                reason = f"receive: {e.strerror if isinstance(e, OSError) else e}"
            else:
                reason = "exited"
            with self._cond:
                self._reading = False
                if got is None:
                    self._gone = self._gone or reason
                    if self._gone == "closed":
                        self._sock.close()
                else:
                    self._replies[got[0].get("id", 0)] = got
                self._cond.notify_all()


