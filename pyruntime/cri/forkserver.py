"""The fork server: the one process of pyruntime-cri that forks pause processes, container supervisors, exec
helpers and image pulls. The daemon's side of it is pyruntime/cri/launcher.py; what they say to each other,
pyruntime/cri/jobs.py over pyruntime/channel.py.

Why: a gRPC server has threads, and a fork from a threaded process copies only the calling thread; a lock
another thread held (malloc, the import lock, a gRPC core thread) stays held for good in the child, which
hangs in the container's set-up. So `Launcher.spawn` starts this server as a process of its own (posix_spawn
of a fresh interpreter, safe from any process): it imports the container code once, so every child starts
warm (no interpreter start and imports per container, which are most of bench.runtime's `run`) and shares
its pages copy-on-write, and it imports nothing else: no module whose at-fork hooks (logging's, threading's)
would run in each of the four forks a container takes.

Wire: the channel's messages (pyruntime/channel.py: one JSON object per message, fds beside it, bounded).
A request is {"id", "op", "job", "stdio"}; the reply carries the same id and either "ok" (the result) or
the channel's failure, {"error": a pyruntime.errors kind name, "message"}, which the client re-raises as that
kind: a child's failure keeps its kind to the daemon's gRPC status.

Concurrency: the server never blocks on a child. It forks one child per request, hands it a report
socket and goes back to its loop; the reply is sent when the child reports, so a slow CreateContainer
(an image's hooks, a big rootfs) does not hold up an exec behind it.

Children: a pause (pause.py), a supervisor (pyruntime.cri.supervisor.supervise(runtime, job, report_fd),
which calls setsid itself and writes one message, {"pid": init_pid} or the failure), an exec helper
(below), and the puller (_puller), forked at start, which forks a child per image pull (PullJob) that
reports to the launcher as the others do. Each starts with only fds 0-2 and its report socket open.
Everything they run is imported at start (PRELOAD, PULL_PRELOAD), never after: a child forked after an
upgrade runs the code the launcher started with.

Lifetime: the server reaps its children (SIGCHLD, WNOHANG) so none stays a zombie, and exits when the
daemon's end closes (close(), or the daemon died), once the puller has. Its other children stay: the pause
processes and the supervisors are in sessions of their own and are found again by a restarted daemon from the
records. An exec helper reports its process's exit code on a pipe of its own, passed to the daemon, so
waiting for an exec needs neither the launcher nor a thread, and the exec'd process is killed through a pidfd
the helper opened while the process was its unreaped child (no pid reuse can redirect the kill).
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable, Sequence

from pynode_os.proc import process_start_time, stat_fields
from pyruntime import channel
from pyruntime.cri.jobs import ContainerJob, ExecJob, PauseJob, PullJob
from pyruntime.cri.pause import become_pause, check_sysctls, pause_cgroup, stays, unpin
from pyruntime.errors import InternalError, InvalidArgumentError, UnavailableError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

    from pyruntime.cri.model import Layout
    from pyruntime.linux.syscalls import Syscalls
    from pyruntime.runtime import Runtime
    from pyruntime.settings import Settings

# What the launcher and its children import lazily (tests/unit/test_preload.py checks the lists): the container
# code, loaded once here rather than once per child, so every child starts warm and shares its pages. And so a
# supervisor or exec helper forked weeks later runs the code the launcher started with: loaded then, a module
# would come from whatever is installed by then, newer than the rest or gone.
PRELOAD = (
    "pyruntime.container.console", "pyruntime.container.control", "pyruntime.container.create",
    "pyruntime.container.exec", "pyruntime.cri.model", "pyruntime.cri.seccomp_default", "pyruntime.cri.supervisor",
    "pyruntime.linux.capabilities", "pyruntime.linux.cgroups", "pyruntime.linux.cgroups.devicefilter",
    "pyruntime.linux.cgroups.v1", "pyruntime.linux.cgroups.v2", "pyruntime.linux.seccomp.compiler",
    "pyruntime.linux.seccomp.loader", "pyruntime.linux.seccomp.profile", "pyruntime.linux.syscalls",
    "pyruntime.logline", "pyruntime.oci.spec", "pyruntime.runtime", "pyruntime.settings",
    "pyruntime.linux.cgroups.systemd", "jeepney", "jeepney.io.blocking",  # the systemd driver, its D-Bus client
)
# The puller's, on top of PRELOAD: the registry client and the unpacking, which the launcher does not load itself
# (their modules' at-fork hooks and pages would make each of its forks slower).
PULL_PRELOAD = ("pyruntime.images.pull", "pyruntime.images.request", "pyruntime.images.store", "zstandard")


class _Pending:
    """A request whose child has not reported yet."""

    def __init__(self, rid: int, op: str, pid: int, report: socket.socket, job, extra: dict) -> None:
        self.rid, self.op, self.pid, self.report, self.job, self.extra = rid, op, pid, report, job, extra

    @property
    def job_id(self) -> str:
        return _job_name(self.job)


def serve(fd: str) -> None:
    """The server process's entry (Launcher.spawn): `fd` is its socket's, whose first message is the
    settings and the layout. Exits 0 when the daemon's end closes."""
    from pyruntime.cri.model import Layout
    from pyruntime.settings import Settings

    def run() -> None:
        sock = socket.socket(fileno=int(fd))
        sock.set_inheritable(False)
        got = channel.receive(sock)
        if got is None:
            raise InternalError("launcher: the daemon closed its socket before sending the settings")
        setup = got[0]
        server = _Server(sock, Settings(**setup["settings"]), Layout(*setup["layout"]))
        set_title(server.kernel, "pyruntime-launcher")  # not `python -c ...` and the settings in ps
        server.serve()
    _run_and_exit(run)


def _run_and_exit(run: Callable[[], None]) -> NoReturn:
    """Runs a process's body, then ends the process: 0 when it returned, 1 with the traceback on stderr (the
    daemon's log) when it raised. Never returns, so a forked child never unwinds into its parent's code."""
    code = 1
    try:
        run()
        code = 0
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def preload(names: Sequence[str]) -> None:
    for name in names:
        importlib.import_module(name)


class _Server:
    puller: socket.socket | None = None  # the puller's socket, None until it is forked and once it is gone
    puller_pid = 0

    def __init__(self, sock: socket.socket, settings: Settings, layout: Layout) -> None:
        self.sock = sock
        self.exec_dir = os.path.join(layout.state, "exec")  # exec helpers' console sockets
        self.pending: dict[int, _Pending] = {}  # by report fd
        os.setsid()  # the daemon's terminal signals (^C) don't reach the launcher or its children
        preload(PRELOAD)
        from pyruntime.cri import seccomp_default, supervisor
        seccomp_default.precompile()
        from pyruntime.linux.syscalls import LinuxSyscalls
        self.supervise = supervisor.supervise  # imported here, not per child: faster create, pages shared
        from pyruntime.runtime import Runtime
        self.kernel = LinuxSyscalls()
        self.runtime: Runtime = Runtime(settings, kernel=self.kernel)
        self.settings = settings
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        _close_fds_except({0, 1, 2, sock.fileno(), self.wake_r, self.wake_w})
        self._fork_puller()
        import gc
        gc.freeze()  # the children's GC leaves these objects' pages shared

    def serve(self) -> None:
        try:
            self._serve()
        finally:
            if self.puller is not None:  # it exits at the end of its socket: wait, so none outlives the launcher
                self.puller.close()
                try:
                    os.waitpid(self.puller_pid, 0)
                except ChildProcessError:
                    pass

    def _serve(self) -> None:
        while True:
            poller = select.poll()
            for fd in (self.sock.fileno(), self.wake_r, *self.pending):
                poller.register(fd, select.POLLIN)
            ready = {fd for fd, _events in poller.poll()}
            for fd in ready:
                if fd in self.pending:
                    self._on_report(self.pending[fd])
            if self.wake_r in ready:
                while True:
                    try:
                        if not os.read(self.wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
            self._reap()
            if self.sock.fileno() in ready:
                try:
                    got = channel.receive(self.sock)
                except InternalError as e:  # no id to answer to; the caller's own wait tells it
                    print(f"pyruntime-cri launcher: {e}", file=sys.stderr, flush=True)
                    continue
                if got is None:
                    return
                self._on_request(*got)

    def _reap(self) -> None:
        try:
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                if pid == self.puller_pid and self.puller is not None:
                    print(f"pyruntime-cri launcher: the puller (pid {pid}) exited; the next pull forks another",
                          file=sys.stderr, flush=True)
                    self.puller.close()
                    self.puller = None
        except ChildProcessError:
            pass

    def _fork_puller(self) -> socket.socket:
        from pyruntime.linux.syscalls import PR_SET_PDEATHSIG
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            def run() -> None:
                ours.close()
                # it dies with the launcher: stopped while the puller still imports (before it would read the
                # launcher's end closing), a daemon would otherwise leave it running its imports out
                self.kernel.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != launcher:
                    os._exit(0)  # the launcher died before the line above
                signal.set_wakeup_fd(-1)
                _close_fds_except({0, 1, 2, theirs.fileno()})
                _puller(theirs, self.settings, self.kernel)
            _run_and_exit(run)
        theirs.close()
        self.puller, self.puller_pid = ours, pid
        return ours

    def _reply(self, rid: int, message: dict, fds: Sequence[int] = ()) -> None:
        try:
            channel.send(self.sock, {"id": rid, **message}, fds)
        except OSError:
            pass  # the daemon is gone; the loop sees the end of its socket next
        finally:
            for fd in fds:
                os.close(fd)

    # -- requests

    def _on_request(self, request: dict, fds: list[int]) -> None:
        rid = request.get("id", 0)
        try:
            op = request["op"]
            start = {"pause": self._start_pause, "create": self._start_create, "exec": self._start_exec,
                     "pull": self._start_pull, "ready": self._ready}.get(op)
            if start is None:
                raise InvalidArgumentError(f"launcher: unknown request {op!r}")
            stdio = iter(fds)
            start(rid, request["job"], [next(stdio) if present else None for present in request.get("stdio", ())])
        except BaseException as e:  # a bad request never ends the server
            self._reply(rid, channel.error_message(e))
        finally:
            for fd in fds:
                os.close(fd)

    def _ready(self, rid: int, _job, _stdio) -> None:
        """Answered from the loop, so once the imports are done, the puller forked and the title set."""
        self._reply(rid, {"ok": {}})

    def _fork(self, rid: int, op: str, job, child, extra: dict | None = None,
              keep: tuple[int, ...] = ()) -> _Pending:
        """Forks `child(report_socket)`, which must not return; registers its report."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _close_fds_except({0, 1, 2, theirs.fileno(), *keep})
                set_title(self.kernel, f"{TITLES[op]} {_job_name(job)}")
                child(theirs)
            except BaseException as e:
                channel.send_error(theirs, e)
            os._exit(1)
        theirs.close()
        pending = _Pending(rid, op, pid, ours, job, extra or {})
        self.pending[ours.fileno()] = pending
        return pending

    def _start_pause(self, rid: int, raw: dict, _stdio) -> None:
        job = PauseJob(**raw)
        check_sysctls(job.sysctls, new_net=job.new_net, new_ipc=job.new_ipc)
        cgroup = None
        if stays(job):
            from pyruntime.linux import cgroups
            try:
                cgroup = cgroups.manager(pause_cgroup(job.cgroup_parent, job.sandbox_id, job.systemd_cgroup),
                                         job.sandbox_id, self.kernel, systemd=job.systemd_cgroup)
            except ValueError as e:
                raise InvalidArgumentError(f"cgroup_parent: {e}") from e
        try:
            if cgroup is not None:
                cgroup.create()
            self._fork(rid, "pause", job, lambda report: become_pause(job, self.kernel, report, cgroup),
                       extra={"cgroup": cgroup})
        except BaseException:
            if cgroup is not None:
                cgroup.destroy()
            raise

    def _start_create(self, rid: int, raw: dict, _stdio) -> None:
        job = ContainerJob(**raw)

        pending = self._fork(rid, "create", job, lambda report: self.supervise(self.runtime, job, report.fileno()))
        pending.extra["start_time"] = process_start_time(pending.pid) or 0  # now, while it can't be reaped

    def _start_exec(self, rid: int, raw: dict, stdio: list[int | None]) -> None:
        job = ExecJob(**raw)
        exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
        try:
            self._fork(rid, "exec", job,
                       lambda report: _exec_helper(self.runtime, job, stdio, report, exit_w, self.exec_dir),
                       extra={"exit_fd": exit_r}, keep=(exit_w, *(fd for fd in stdio if fd is not None)))
        except BaseException:
            os.close(exit_r)
            raise
        finally:
            os.close(exit_w)

    def _start_pull(self, rid: int, raw: dict, _stdio) -> None:
        """Hands the pull to the puller with a report socket whose other end is registered here, as a child's."""
        job = PullJob(**raw)
        puller = self.puller or self._fork_puller()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            channel.send(puller, {"job": raw}, [theirs.fileno()])
        except OSError as e:
            ours.close()
            raise UnavailableError(f"launcher: the puller (pid {self.puller_pid}): {e.strerror}") from e
        finally:
            theirs.close()
        self.pending[ours.fileno()] = _Pending(rid, "pull", self.puller_pid, ours, job, {})

    # -- reports

    def _on_report(self, p: _Pending) -> None:
        del self.pending[p.report.fileno()]
        fds: list[int] = []
        try:
            try:
                got = channel.receive(p.report)
            except OSError:
                got = None
            finally:
                p.report.close()
            if got is None:
                raise InternalError(f"{p.op} {p.job_id}: the child (pid {p.pid}) exited without a report")
            message, fds = got
            channel.raise_reported(message, p.op)
            result, passed = getattr(self, f"_{p.op}_done")(p, message, fds)
        except BaseException as e:
            for fd in fds:
                os.close(fd)
            self._failed(p)
            self._reply(p.rid, channel.error_message(e))
            return
        for fd in set(fds) - set(passed):  # none is expected but an exec's
            os.close(fd)
        self._reply(p.rid, {"ok": result}, passed)

    def _pause_done(self, p: _Pending, message: dict, _fds: list[int]) -> tuple[dict, list[int]]:
        return {k: message[k] for k in ("pid", "start_time", "namespaces", "cgroup")}, []

    def _create_done(self, p: _Pending, message: dict, _fds: list[int]) -> tuple[dict, list[int]]:
        return {"pid": p.pid, "start_time": p.extra["start_time"], "init_pid": int(message["pid"])}, []

    def _pull_done(self, p: _Pending, message: dict, _fds: list[int]) -> tuple[dict, list[int]]:
        return {"id": str(message["id"])}, []

    def _exec_done(self, p: _Pending, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        """The helper's fds: the process's pidfd, then with a tty the terminal's master."""
        if len(fds) != 1 + p.job.tty:
            raise InternalError(f"exec {p.job_id}: the exec helper sent {len(fds)} fds, not {1 + p.job.tty}")
        return {"pid": int(message["pid"])}, [p.extra.pop("exit_fd"), *fds]

    def _failed(self, p: _Pending) -> None:
        """Undoes what a failed child's request made here: nothing of a failed request stays."""
        if "exit_fd" in p.extra:
            os.close(p.extra.pop("exit_fd"))
        if p.op != "pause":
            return
        try:
            os.waitpid(p.pid, 0)  # it reported and exits: its cgroup is empty once it is reaped
        except ChildProcessError:
            pass
        unpin(p.job.ns_dir, self.kernel)
        if p.extra["cgroup"] is not None:
            p.extra["cgroup"].destroy()


TITLES = {"pause": "pyruntime-pause", "create": "pyruntime-supervisor", "exec": "pyruntime-exec",
          "pull": "pyruntime-pull"}


def _puller(sock: socket.socket, settings: Settings, kernel: Syscalls) -> None:
    """The puller: a fork server for image pulls, forked by the launcher at its start. It imports the registry
    client and the unpacking (PULL_PRELOAD) then, as the launcher does the container code, and keeps them out of
    the launcher, whose every fork they would slow. A request is {"job": a PullJob} with the report socket
    beside it; a child per pull runs it and reports there. It exits when the launcher's end closes."""
    set_title(kernel, "pyruntime-puller")  # first: ps tells it from the launcher while it imports
    preload(PULL_PRELOAD)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the pulls' children: nobody waits for them
    while True:
        got = channel.receive(sock)
        if got is None:
            return
        message, fds = got
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue  # the launcher sends one report socket with each job
        report = socket.socket(fileno=fds[0])
        try:
            job = PullJob(**message["job"])
            pid = os.fork()
        except BaseException as e:
            channel.send_error(report, e)
            report.close()
            continue
        if pid == 0:
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                set_title(kernel, f"{TITLES['pull']} {job.ref}")
                _pull(settings, kernel, job, report)
            except BaseException as e:
                channel.send_error(report, e)
            os._exit(1)
        report.close()


def _job_name(job) -> str:
    """What a request is about, for its child's title and errors: the container, the pod or the image."""
    return str(getattr(job, "container_id", None) or getattr(job, "sandbox_id", None) or getattr(job, "ref", ""))


def set_title(kernel: Syscalls, title: str) -> None:
    """Names this process in ps: a child forked from the launcher otherwise shows the daemon's whole command
    line, and an operator can't tell a pod's pause from a container's supervisor. comm (PR_SET_NAME, 15
    bytes) and the argv area (overwritten in place through /proc/self/mem: no allocation, nothing moves;
    words NUL-separated, as argv is). Best effort: a title is never worth failing a pod for."""
    encoded = title.encode()
    try:
        kernel.set_process_name(encoded)
        fields = stat_fields("self")
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: proc(5) fields 48 and 49
        data = encoded.replace(b" ", b"\0")[:end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(data + b"\0" * (end - start - len(data)))
    except (OSError, ValueError, IndexError):
        pass


def _close_fds_except(keep: set[int]) -> None:
    last = -1
    for fd in sorted(keep):
        if fd > last + 1:  # closerange(n, n) is no empty range: it closes n and everything above
            os.closerange(last + 1, fd)
        last = fd
    os.closerange(last + 1, 1 << 20)


def _exec_helper(runtime: Runtime, job: ExecJob, stdio: list[int | None], report: socket.socket,
                 exit_w: int, exec_dir: str) -> None:
    """The exec helper: the exec'd process's stdio and subreaper (runc exec's role in a shim). Reports
    {"pid"} with the pidfd (and the pty master) on `report`, then {"exit_code"} on exit_w."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for target, fd in enumerate(stdio):
        os.dup2(null if fd is None else fd, target)
    for fd in {null, *(fd for fd in stdio if fd is not None)} - {0, 1, 2}:
        os.close(fd)
    process = runtime.process_of(job.container_id)
    process["args"] = list(job.argv)
    process["terminal"] = job.tty
    if job.env:
        names = {e.split("=", 1)[0] for e in job.env}
        process["env"] = [e for e in process.get("env", []) if e.split("=", 1)[0] not in names] + list(job.env)
    if job.cwd:
        process["cwd"] = job.cwd
    if job.user is not None:
        process["user"] = job.user
    fds: list[int] = []
    pid = _start_exec(runtime, job, process, fds, exec_dir)
    channel.send(report, {"pid": pid}, fds)
    for fd in fds:
        os.close(fd)
    report.close()
    code = 255
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if got == pid:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            break
    os.write(exit_w, json.dumps({"exit_code": code}).encode() + b"\n")
    os._exit(0)


def _pull(settings: Settings, kernel: Syscalls, job: PullJob, report: socket.socket) -> None:
    """A pull, in a child of the puller: the image store the daemon reads (same root, registry hosts and
    snapshotter), pulled into here. Reports {"id"}."""
    from pathlib import Path

    from pyruntime.images.request import Credentials
    from pyruntime.images.store import ImageStore
    store = ImageStore(settings.image_root, hosts_dir=Path(settings.hosts_dir), snapshotter=settings.snapshotter,
                       kernel=kernel)
    auth = Credentials(job.username, job.password, job.token) if job.username or job.token else None
    channel.send(report, {"id": store.pull(job.ref, auth=auth, progress_timeout=job.progress_timeout).id})
    os._exit(0)


def _start_exec(runtime: Runtime, job: ExecJob, process: dict, fds: list[int], exec_dir: str) -> int:
    """Runtime.exec, then the pidfd (and the pty master) into `fds`; a process started but not handed
    over is killed, so a failed request leaves nothing running."""
    if not job.tty:
        pid = runtime.exec(job.container_id, process)
        fds.append(os.pidfd_open(pid))
        return pid
    import shutil
    import tempfile

    from pyruntime.container import console
    os.makedirs(exec_dir, mode=0o700, exist_ok=True)
    where = tempfile.mkdtemp(dir=exec_dir)
    pid = 0
    try:
        with console.listen(os.path.join(where, "console.sock")) as server:
            pid = runtime.exec(job.container_id, process, console_socket=os.path.join(where, "console.sock"))
            fds.append(os.pidfd_open(pid))
            fds.append(console.receive_master(server))
        return pid
    except BaseException:
        if pid:
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        shutil.rmtree(where, ignore_errors=True)
