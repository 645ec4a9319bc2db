"""The interface both drivers implement, and the file helpers they share.

The runtime talks only to `CgroupManager`; which hierarchy layout is behind it is decided once by
`detect()`. Every kernel error is re-raised as `CgroupError` naming the operation and the file, because a
bare EINVAL or EBUSY from a cgroup write is useless without knowing which of dozens of files it came from.
"""
from __future__ import annotations

import errno
import os
import time
from _signal import SIGKILL  # not `signal`, which builds enums at import
from abc import ABC, abstractmethod

from pyruntime.errors import InternalError

TYPE_CHECKING = False
if TYPE_CHECKING:  # `delete`, `state` and `start` never set resources, so they do not load them
    from pyruntime.linux.cgroups.resources import Resources

FROZEN = "frozen"
THAWED = "thawed"

# How long destroy() waits for exiting processes to leave a cgroup; the kernel keeps a cgroup busy until
# its last task is reaped, which after a SIGKILL takes milliseconds.
RMDIR_TIMEOUT = 2.0
# A freeze is reported as done only when every task has stopped, which is quick unless a task sits in an
# uninterruptible sleep.
FREEZE_TIMEOUT = 5.0


class CgroupError(InternalError, OSError):
    """An OSError whose message is "<operation> <path>: <reason>"; `errno` stays available to callers.
    Internal: one class serves every cgroup failure, and most are the kernel refusing a write that the
    caller can't fix by changing its request; what validation can detect earlier it reports as a SpecError."""

    def __init__(self, err: int, message: str) -> None:
        super().__init__(err, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def os_error(op: str, path: str, exc: OSError) -> CgroupError:
    err = exc.errno or errno.EIO
    return CgroupError(err, f"{op} {path}: {os.strerror(err)}")


def read_file(path: str) -> str:
    """A small kernel file (cgroup, /proc) whole, through os.open and os.read: a text-mode open() builds
    three layers of file objects and a decoder, three times the cost, and `create` reads about twenty."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def read(path: str) -> str:
    try:
        return read_file(path)
    except OSError as exc:
        raise os_error("read", path, exc) from exc


def read_optional(path: str) -> str | None:
    """For files that exist only with some kernels or configs, where absence just means "not available"."""
    try:
        return read_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error("read", path, exc) from exc


def write(path: str, value: str) -> None:
    """One write(2) per value, since a cgroup file acts on each write; O_TRUNC as runc opens them."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError as exc:
        raise os_error("write", path, exc) from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise os_error("write", path, exc) from exc
    finally:
        os.close(fd)


def keyed(text: str | None) -> dict[str, int]:
    """Parses flat keyed files (memory.stat, cpu.stat, memory.events): one "key value" per line."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def number(text: str | None) -> int:
    """A counter or limit file's value; "max" (v2 unlimited) reads as 0 as in runc's stats."""
    if text is None:
        return 0
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else 0


def makedirs(path: str) -> None:
    """mkdir -p that tolerates a concurrent destroy() removing an empty shared parent under us."""
    for _ in range(5):
        try:
            os.makedirs(path, exist_ok=True)
            return
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise os_error("mkdir", path, exc) from exc
    raise CgroupError(errno.ENOENT, f"mkdir {path}: parent kept disappearing")


def procs_in_tree(top: str) -> list[int]:
    """Every pid in a cgroup and its descendants, because a container may make sub-cgroups of its own."""
    pids: list[int] = []
    for dirpath, _dirs, files in os.walk(top):
        if "cgroup.procs" not in files:
            continue
        text = read_optional(os.path.join(dirpath, "cgroup.procs"))
        pids.extend(int(p) for p in (text or "").split())
    return pids


def rmdir_tree(top: str) -> None:
    """Removes a cgroup directory and its sub-cgroups bottom-up; gone already counts as done.

    EBUSY is retried until RMDIR_TIMEOUT because killed processes leave their cgroup only once reaped.
    The usual cgroup, an empty leaf, goes with one rmdir; only a busy one is walked (a cgroup directory
    lists every control file, which costs `delete` a scandir per hierarchy).
    """
    try:
        os.rmdir(top)
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):  # busy: processes, or sub-cgroups to remove first
            raise os_error("rmdir", top, exc) from exc
    dirs = [dirpath for dirpath, _d, _f in os.walk(top)]
    for path in reversed(dirs):
        deadline = time.monotonic() + RMDIR_TIMEOUT
        delay = 0.005
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise os_error("rmdir", path, exc) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.1)


def rmdir_if_empty(path: str) -> bool:
    """Removes a parent cgroup only when no other container uses it; False when it had to stay."""
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EBUSY, errno.EEXIST):
            return False
        raise os_error("rmdir", path, exc) from exc


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class CgroupManager(ABC):
    """One container's cgroup, in whatever hierarchy layout the host has."""

    @abstractmethod
    def create(self) -> bool:
        """Makes the cgroup directories (and parents) and enables what the controllers need. True when this
        call made the cgroup's own directory in every hierarchy: it then holds no process yet."""

    @abstractmethod
    def add(self, pid: int) -> None:
        """Moves a process, with all its threads, into the cgroup."""

    def needs_pid(self) -> bool:
        """True when the cgroup is made only around a first process (systemd's scope): the caller then forks
        that process outside any cgroup and hands it to add(), which makes the cgroup."""
        return False

    @abstractmethod
    def cgroup2_dir(self) -> str | None:
        """The cgroup's directory in the cgroup2 hierarchy (a unified host's, or a hybrid host's cgroup2
        part), for a child to be born in (Syscalls.fork_into_cgroup); None when it has no cgroup2 part."""

    @abstractmethod
    def enter_v1(self) -> None:
        """Moves the calling single-threaded process into the cgroup's cgroup v1 directories, by its one
        thread: "0" written to `tasks` spares the kernel its global threadgroup lock (which a cgroup.procs
        write takes, waiting out an RCU grace period: bench.runtime). cgroup2 has no such write (cgroup.threads
        moves threads only within a domain): its part is cgroup2_dir's."""

    @abstractmethod
    def set(self, resources: Resources) -> None:
        """Writes the limits that `resources` gives and leaves the others as they are."""

    @abstractmethod
    def freeze(self) -> None:
        """Returns only once every task is frozen, so that callers can rely on a stopped container."""

    @abstractmethod
    def thaw(self) -> None: ...

    @abstractmethod
    def state(self) -> str:
        """FROZEN or THAWED."""

    @abstractmethod
    def pids(self) -> list[int]:
        """All processes in the cgroup and its sub-cgroups."""

    @abstractmethod
    def kill_all(self, sig: int = SIGKILL) -> None:
        """Signals every process; it does not wait for them to exit."""

    @abstractmethod
    def stats(self) -> dict:
        """The `data` object of a `runc events --stats` record."""

    @abstractmethod
    def oom_kill_count(self) -> int:
        """How many processes the OOM killer has killed in the cgroup since it was made."""

    def oom_killed(self) -> bool:
        return self.oom_kill_count() > 0

    @abstractmethod
    def destroy(self) -> None:
        """Removes the container's cgroup and the empty parents the runtime made; idempotent."""

    @abstractmethod
    def exists(self) -> bool: ...

    def _signal_frozen(self, sig: int, can_freeze: bool, thaw_after: bool) -> None:
        """Signals every process with the cgroup frozen, so that none forks a child we would miss.
        A freeze that times out (a task in D state) does not stop the signal, which then goes out
        unfrozen; `thaw_after` thaws even a cgroup that was frozen before (v1 tasks act on SIGKILL
        only once thawed)."""
        froze = False
        if can_freeze and self.state() != FROZEN:
            try:
                self.freeze()
                froze = True
            except CgroupError:
                pass
        try:
            signal_pids(self.pids(), sig)
        finally:
            if froze or (can_freeze and thaw_after):
                self.thaw()
