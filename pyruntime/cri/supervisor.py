"""A container's supervisor: what containerd-shim or CRI-O's conmon is to their containers.

One supervisor per container, forked by the launcher (cri/forkserver.py) and living as long as the
container's init, independent of the daemon: it calls Runtime.create with the container's stdio, holds
that stdio for the container's whole life (pipes, or the pty master the runtime hands over on a console
socket), copies the output into the CRI log (crilog.py) and to attached clients (attach.py), reaps the
init and records how it ended in exit.json (model.ExitRecord), which is how a restarted daemon learns of
an exit it did not see. setsid keeps the daemon's and the launcher's signals and terminal away from it;
PR_SET_CHILD_SUBREAPER makes the init (whose runtime parent exits during create) its child.

It is one single-threaded selector loop, forked from the launcher with everything it runs already
imported, so nearly all of its memory stays shared with the launcher; it imports nothing after the fork,
and it leaves Runtime.create, which touches most of the container code, to a child of its own (_create).
It keeps no descriptor of the launcher's but `report`, so the daemon's and the launcher's sockets close
when they exit. A container that never reads its stdin, never ends a line or outlives its output does
not stall it: output is always drained (crilog.py), stdin is queued (attach.py), and once the init has
exited the output is read for at most DRAIN_GRACE before the exit is recorded (a process that escaped
the container's pid namespace could hold the pipes forever).
"""
from __future__ import annotations

import fcntl
import json
import os
import selectors
import signal
import struct
import termios
import time
from collections.abc import Callable
from typing import NoReturn

from pyruntime import channel, errors
from pyruntime.container import console
from pyruntime.container.control import oom_count
from pyruntime.container.create import become_subreaper
from pyruntime.cri import attach
from pyruntime.cri.crilog import CriLogWriter
from pyruntime.cri.model import ExitRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.runtime import Runtime

SOCKET = "supervisor.sock"
CONSOLE_SOCKET = "console.sock"
DRAIN_GRACE = 2.0  # seconds the output may stay open after the init exited
CLIENT_GRACE = 2.0  # seconds attached clients get to take the last output
_CHUNK = 1 << 16
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)


def supervise(runtime: Runtime, job, report: int) -> NoReturn:
    """Runs the container `job` (a cri.jobs.ContainerJob: container_id, bundle, log_path, tty, stdin,
    stdin_once, exit_path, supervisor_dir) until its init exits, in a fresh child of a single-threaded
    process. Writes one JSON line to the descriptor `report`: {"pid": init_pid} once the container is
    created, or {"error": a pyruntime.errors kind name, "message": ...}, after which nothing of the
    container is left. Exits 0 after recording the exit, 1 if the container could not be made."""
    code = 1
    try:
        code = _Supervisor(runtime, job).run(report)
    except BaseException:  # the process ends here whatever happened; the report said why
        pass
    finally:
        os._exit(code)


def _keep_only(fd: int) -> int:
    """Closes every descriptor but `fd` (moved above 2) and stdio, which becomes /dev/null; returns the
    number of `fd`. Also drops whatever signal handling the forking process had set up."""
    if fd <= 2:
        fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    os.closerange(0, fd)
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
    null = os.open("/dev/null", os.O_RDWR)
    for target in (0, 1, 2):
        if target != null:
            os.dup2(null, target)
    return fd


def _write_report(fd: int, message: dict) -> None:
    try:
        os.write(fd, json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the launcher is gone: nobody waits for the answer
    finally:
        os.close(fd)


class _Supervisor:
    sel: selectors.BaseSelector  # set by _start, in this order
    log: CriLogWriter
    server: attach.AttachServer

    def __init__(self, runtime: Runtime, job) -> None:
        self.runtime, self.job = runtime, job
        self.id = job.container_id
        self.outputs: dict[int, str] = {}  # the container's output descriptors -> CRI stream name
        self.master: int | None = None
        self.init_pid = 0
        self.status: int | None = None
        self.created = False

    def run(self, report: int) -> int:
        report = _keep_only(report)
        try:
            self._start()
        except BaseException as e:
            self._undo()
            _write_report(report, channel.error_message(e))
            return 1
        _write_report(report, {"pid": self.init_pid})
        self._loop()
        self._finish()
        return 0

    # set-up, until the container is created and its stdio and socket are ours

    def _start(self) -> None:
        job = self.job
        self.sel = selectors.DefaultSelector()  # after _keep_only, which closed what came before
        os.setsid()
        become_subreaper(self.runtime.kernel)
        self.bundle = os.path.abspath(job.bundle)
        os.chdir("/")  # pins no mount
        os.makedirs(job.supervisor_dir, mode=0o700, exist_ok=True)
        try:
            self.log = CriLogWriter(job.log_path)
        except OSError as e:
            raise errors.FailedPreconditionError(f"log_path: open {job.log_path}: {e.strerror}") from e
        null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        stdin_w = None
        theirs: list[int] = []  # the container's ends, ours to close once it has them
        if job.tty:
            stdio = (null, null, null)
        else:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            self.outputs = {out_r: "stdout", err_r: "stderr"}
            theirs += [out_w, err_w]
            stdin_r = null
            if job.stdin:
                stdin_r, stdin_w = os.pipe()
                theirs.append(stdin_r)
            stdio = (stdin_r, out_w, err_w)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)  # inheritable: the init's stdio
        if job.tty:
            master = self._create_with_terminal()
            if job.stdin:  # a dup: the selector takes each descriptor once, and the master is the output
                stdin_w = os.dup(master)
            self._serve(null, theirs, stdin_w)
        else:  # our own set-up needs nothing of the container: it runs while the child creates it
            self._create(None, lambda: self._serve(null, theirs, stdin_w))

    def _serve(self, null: int, theirs: list[int], stdin_w: int | None) -> None:
        """Gives the container's ends of its stdio to it alone and opens supervisor.sock; for a container
        without a terminal, done while the create child runs (which took its copies at the fork)."""
        job = self.job
        for target in (0, 1, 2):
            os.dup2(null, target)
        for fd in (null, *theirs):
            os.close(fd)
        for fd in [*self.outputs, *([stdin_w] if stdin_w is not None else [])]:
            os.set_blocking(fd, False)
        sock = os.path.join(job.supervisor_dir, SOCKET)
        try:
            os.unlink(sock)  # left by a supervisor of an earlier container of this id: ours is live now
        except FileNotFoundError:
            pass
        self.server = attach.AttachServer(sock, self.sel, tty=job.tty,
                                          stdin_fd=stdin_w, stdin_once=job.stdin_once,
                                          on_reopen=self._reopen_log, on_resize=self._resize)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        self.sel.register(wake_r, selectors.EVENT_READ, lambda _m: self._reap(wake_r))
        for fd in self.outputs:
            self.sel.register(fd, selectors.EVENT_READ, lambda _m, fd=fd: self._read(fd))

    def _create(self, console_socket: str | None, meanwhile: Callable[[], None] | None = None) -> None:
        """Runtime.create in a child of ours that exits once it is done. The create runs most of pyruntime's
        container code (spec, mounts, cgroups, the init's fork): every object it touches or allocates is a write
        to a page shared with the launcher, which would stay this process's own for the container's whole life
        (bench.cri's memory per pod); in the child those pages go when it exits. The init, orphaned when this
        child exits (or earlier by the runtime's stage 1), comes to us as the subreaper all the same; the child
        inherits our stdio, which the init takes over. Reports {"pid"} or the error on a pipe, re-raised here as
        its kind; a child that dies without a report may have made the container, which _undo then deletes.
        `meanwhile` runs here while the child works; its failure is raised once the child has reported."""
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            message: dict
            try:
                os.close(report_r)
                # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across execve: the
                # container's processes would not die writing to a closed pipe or past RLIMIT_FSIZE
                for sig in _PYTHON_IGNORES:
                    signal.signal(sig, signal.SIG_DFL)
                state = self.runtime.create(self.id, self.bundle, console_socket=console_socket)
                message = {"pid": state.pid}
            except BaseException as e:  # Runtime.create undid its own steps
                message = channel.error_message(e)
            finally:
                try:
                    os.write(report_w, json.dumps(message).encode() + b"\n")
                finally:
                    os._exit(0)
        os.close(report_w)
        failed: BaseException | None = None
        try:
            if meanwhile is not None:
                meanwhile()
        except BaseException as e:
            failed = e
        data = b""
        try:  # up to the newline, not the end of the pipe: the child's exit, later, is reaped by the loop
            while not data.endswith(b"\n") and (chunk := os.read(report_r, 4096)):
                data += chunk
        finally:
            os.close(report_r)
            if not data.endswith(b"\n"):
                os.waitpid(pid, 0)
        try:
            message = json.loads(data)
        except ValueError as e:
            self.created = True  # killed mid-way, maybe after the runtime made something: _undo deletes it
            raise errors.InternalError(f"create {self.id}: the runtime's child (pid {pid}) exited without a "
                                       "report") from e
        channel.raise_reported(message, f"create {self.id}")
        self.created, self.init_pid = True, int(message["pid"])
        if failed is not None:
            raise failed

    def _create_with_terminal(self) -> int:
        """The runtime sends the pty master over a console socket during create (the connection waits in
        the backlog until we accept)."""
        path = os.path.join(self.job.supervisor_dir, CONSOLE_SOCKET)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        with attach.unix_address(path) as address:  # valid in the runtime's forked init too
            server = console.listen(address)
            try:
                self._create(address)
                self.master = console.receive_master(server)
            finally:
                server.close()
                os.unlink(address)
        self.outputs = {self.master: "stdout"}
        return self.master

    def _undo(self) -> None:
        """A failed set-up leaves nothing: Runtime.create undoes its own steps; what came after it goes here."""
        if self.created:
            try:
                self.runtime.delete(self.id, force=True)
            except errors.PyRuntimeError:
                pass
            self._reap_all()
        for part in (getattr(self, "server", None), getattr(self, "log", None)):
            if part is not None:
                part.close()

    # the loop

    def _loop(self) -> None:
        self._reap_all()
        deadline = None
        while self.outputs or self.status is None:
            if self.status is not None and deadline is None:
                deadline = time.monotonic() + DRAIN_GRACE
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                break
            for key, mask in self.sel.select(timeout):
                key.data(mask)

    def _read(self, fd: int) -> bool:
        """Copies what the container wrote on `fd` to the log and the clients; False when nothing was
        there (the end of the output closes `fd`)."""
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:  # EIO: a pty whose slave side every process has closed
            data = b""
        if not data:
            self._close_output(fd)
            return False
        stream = self.outputs[fd]
        self.log.write(stream, data)
        self.server.broadcast(attach.STDOUT if stream == "stdout" else attach.STDERR, data)
        return True

    def _close_output(self, fd: int) -> None:
        self.sel.unregister(fd)
        self.log.flush(self.outputs.pop(fd))
        if fd != self.master:
            os.close(fd)

    def _reap(self, wake_fd: int) -> None:
        try:
            while os.read(wake_fd, 512):
                pass
        except BlockingIOError:
            pass
        self._reap_all()

    def _reap_all(self) -> None:
        """Reaps the init and any orphan reparented to us, without blocking."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.init_pid:
                code = os.waitstatus_to_exitcode(status)
                self.status = code if code >= 0 else 128 - code

    def _reopen_log(self) -> None:
        try:
            self.log.reopen()
        except OSError as e:
            raise errors.FailedPreconditionError(f"log_path: reopen {self.job.log_path}: {e.strerror}") from e

    def _resize(self, width: int, height: int) -> None:
        if self.master is None:
            return
        try:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        except OSError as e:
            raise errors.FailedPreconditionError(f"resize: the container's terminal: {e.strerror}") from e

    # the end

    def _finish(self) -> None:
        for fd in list(self.outputs):  # what is still buffered in a pipe held open past the init's exit
            while self._read(fd):
                pass
            if fd in self.outputs:
                self._close_output(fd)
        self.server.end_output()
        self._record()
        deadline = time.monotonic() + CLIENT_GRACE
        while self.server.sending() and (left := deadline - time.monotonic()) > 0:
            for key, mask in self.sel.select(left):
                key.data(mask)
        self.server.close()
        self.log.close()
        if self.master is not None:
            os.close(self.master)

    def _record(self) -> None:
        code = self.status if self.status is not None else 255
        try:  # the cgroup is this container's own, new with it (its path ends in the random container id):
            oomed = oom_count(self.runtime.store, self.id) > 0  # every OOM kill it counts was in this container
        except errors.PyRuntimeError:
            oomed = False  # the container was deleted meanwhile: its cgroup's count is gone with it
        reason = "OOMKilled" if oomed else "Completed" if code == 0 else "Error"
        ExitRecord(exit_code=code, finished_at=time.time_ns(), reason=reason).dump(self.job.exit_path)
