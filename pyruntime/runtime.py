"""pyruntime as a library: the container life cycle for a long-running caller (the CRI server), and
the one thing the `pyruntime` CLI calls.

A caller builds `Runtime(settings)` once and calls one method per operation; failures are the kinds
of pyruntime.errors (a missing container is a NotFoundError, a start of a running one a
FailedPreconditionError, a bad spec field an InvalidArgumentError naming it), never a message to parse.
Each method is one runtime command: it takes the container's lock where it reads and then changes
the container, so concurrent callers in other processes (a shim, the CLI) are safe.

Forking: `create` and `exec` fork the container's processes from the calling process. A fork copies
only the calling thread; a lock another thread held (in malloc, in the interpreter's import machinery,
in a gRPC core thread) stays held forever in the child, which then hangs inside the container's
set-up. So both refuse with a FailedPreconditionError, before anything is made, when the calling
process has more than one thread: a threaded server calls them from a single-threaded fork server
it started before its first thread (cri/forkserver.py). The other methods do not fork and are safe
from any thread.
"""
from __future__ import annotations

import _signal  # not `signal`, which builds enums at import
import builtins
import time

from pyruntime.container.store import ContainerError, ContainerStore, NotFound
from pyruntime.errors import InvalidArgumentError, PyRuntimeError
from pyruntime.oci.state import ContainerState, oci_state
from pyruntime.settings import Settings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pyruntime.linux.syscalls import Syscalls
    from pyruntime.oci.spec import Process, Spec


class State:
    """The OCI state of one container (`pyruntime state`'s JSON, with runc's extra fields)."""

    __slots__ = ("_json", "annotations", "bundle", "created", "id", "owner", "pid", "rootfs", "status")

    def __init__(self, record: ContainerState, status: str) -> None:
        self._json = oci_state(record, status)
        self.id: str = record.id
        self.pid: int = self._json["pid"]
        self.status = status
        self.bundle = record.bundle
        self.rootfs = record.rootfs
        self.created = record.created
        self.annotations: dict[str, str] = record.annotations
        self.owner = record.owner

    def to_json(self) -> dict:
        return dict(self._json)

    def __repr__(self) -> str:
        return f"State(id={self.id!r}, status={self.status!r}, pid={self.pid})"


def parse_signal(sig: int | str) -> int:
    """A signal as a number, a name (KILL, SIGKILL) or a numeric string; 0 probes that the init is alive."""
    if isinstance(sig, int) and not isinstance(sig, bool):
        if not 0 <= sig <= _signal.SIGRTMAX:
            raise InvalidArgumentError(f"signal: {sig} is not a signal number")
        return sig
    from pyruntime.container.control import parse_signal as parse_text
    return parse_text(str(sig))


class Runtime:
    """The container operations over the state under `settings.root` (see the module doc). `kernel`: the
    syscall layer `create` and `exec` set containers up through; None lets them make the real one when
    they need it, so the commands that don't fork never load ctypes."""

    def __init__(self, settings: Settings | None = None, kernel: Syscalls | None = None) -> None:
        self.settings = settings if settings is not None else Settings()
        self.kernel = kernel
        self.store = ContainerStore(self.settings.root)

    def _trace(self):  # -> Callable[[str], None] | None
        """With debug on, the reporter of a container's set-up stages (to the log, else stderr)."""
        if not self.settings.debug:
            return None
        from pyruntime.logline import tracer
        return tracer(self.settings.log, self.settings.log_format)

    def create(self, id: str, bundle: str, spec: Spec | None = None, *, console_socket: str | None = None,
               pid_file: str | None = None, preserve_fds: int = 0) -> State:
        """Makes the container from `bundle` (its config.json, or `spec` when the caller validated one with
        pyruntime.oci.spec.parse/load_bundle), stopped before the user process until `start`."""
        from pyruntime.container.create import create
        if preserve_fds < 0:
            raise InvalidArgumentError(f"preserve_fds: must be >= 0, got {preserve_fds}")
        record = create(self.store, id, bundle, spec=spec, console_socket=console_socket, pid_file=pid_file,
                        preserve_fds=preserve_fds, debug=self.settings.debug, kernel=self.kernel, trace=self._trace(),
                        systemd_cgroup=self.settings.systemd_cgroup)
        return State(record, "created")

    def start(self, id: str) -> None:
        from pyruntime.container.control import start
        start(self.store, id)

    def state(self, id: str) -> State:
        from pyruntime.container.control import status_of
        record = self.store.load(id)
        return State(record, status_of(self.store, record))

    def list(self, on_error: Callable[[str, PyRuntimeError], None] | None = None) -> list[State]:
        """Every container under the root; one deleted while listing is left out, and so is one whose
        record can't be read, which goes to `on_error(id, error)` so that one bad record does not hide the rest."""
        from pyruntime.container.control import status_of
        out = []
        for cid in self.store.ids():
            try:
                record = self.store.load(cid)
            except NotFound:
                continue
            except PyRuntimeError as e:
                if on_error is not None:
                    on_error(cid, e)
                continue
            out.append(State(record, status_of(self.store, record)))
        return out

    def kill(self, id: str, signal: int | str = _signal.SIGTERM, all_processes: bool = False) -> None:
        """Sends `signal` to the init (or to every process in the cgroup); signal 0 checks it is alive."""
        from pyruntime.container.control import kill
        kill(self.store, id, parse_signal(signal), all_processes)

    def delete(self, id: str, force: bool = False) -> None:
        """Removes a stopped container; `force` kills a live one first, and a missing one is no error."""
        from pyruntime.container.control import delete
        try:
            delete(self.store, id, force)
        except NotFound:
            if not force:
                raise

    def process_of(self, id: str) -> dict:
        """The container's process section of config.json: the defaults runc's `exec` starts from."""
        return dict(self.store.load(id).process)

    def exec(self, id: str, process: Process | dict, *, console_socket: str | None = None,
             pid_file: str | None = None, preserve_fds: int = 0) -> int:
        """Starts `process` (typed, or a config.json process object) in the container's namespaces and
        cgroup; returns its pid, a child of the caller once it set PR_SET_CHILD_SUBREAPER, else of init's
        reaper. The caller waits for it."""
        from pyruntime.container.create import write_pid_file
        from pyruntime.container.exec import exec_process
        from pyruntime.oci.spec import process_from_json
        if isinstance(process, dict):
            process = process_from_json(process)
        if preserve_fds < 0:
            raise InvalidArgumentError(f"preserve_fds: must be >= 0, got {preserve_fds}")
        pid = exec_process(self.store, id, process, console_socket=console_socket, preserve_fds=preserve_fds,
                           debug=self.settings.debug, kernel=self.kernel, trace=self._trace())
        if pid_file:
            write_pid_file(pid_file, pid)
        return pid

    def pause(self, id: str) -> None:
        from pyruntime.container.control import pause
        pause(self.store, id)

    def resume(self, id: str) -> None:
        from pyruntime.container.control import resume
        resume(self.store, id)

    def update(self, id: str, resources: dict) -> None:
        """Merges `resources` (a linux.resources object of the spec, any subset) into the container's."""
        from pyruntime.container.control import update
        if not isinstance(resources, dict):
            raise InvalidArgumentError(f"linux.resources: must be an object, got {type(resources).__name__}")
        update(self.store, id, resources)

    def pids(self, id: str) -> builtins.list[int]:
        from pyruntime.container.control import pids
        return pids(self.store, id)

    def oom_count(self, id: str) -> int:
        """How many times the kernel's OOM killer killed a process of the container's cgroup."""
        from pyruntime.container.control import oom_count
        return oom_count(self.store, id)

    def stats(self, id: str) -> dict:
        """runc's `events --stats` record: {"type": "stats", "id": ..., "data": the cgroup's figures}."""
        from pyruntime.container.control import stats
        return stats(self.store, id)

    def events(self, id: str, interval: float = 5.0) -> Iterator[dict]:
        """runc's `events` stream: a stats record every `interval` seconds and an {"type": "oom"} record when
        the cgroup's OOM-kill count grows; it ends when the container stops or is deleted."""
        from pyruntime.container.control import oom_count, stats
        if interval <= 0:
            raise InvalidArgumentError(f"interval: must be > 0, got {interval}")
        ooms = oom_count(self.store, id)
        while True:
            try:
                record = stats(self.store, id)
                now = oom_count(self.store, id)
            except (ContainerError, NotFound):  # stopped or deleted since the last round: the stream ends
                return
            yield record
            if now > ooms:
                yield {"type": "oom", "id": id}
                ooms = now
            time.sleep(interval)
