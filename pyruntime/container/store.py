"""Container state on disk: one directory per container under the runtime root (runc's --root).

The directory is the container's existence: `mkdir` is the atomic test that an id is free, and
state.json is replaced with a temp file and a rename, so a crash at any point leaves either the
old record or the new one (without fsync, as runc writes it: pynode_os.files says why a record of live processes
needs none). Commands that change a container hold an flock on its directory, because
two runtime processes (a shim's delete and a user's kill, say) may touch it at once.

The root is 0711, set whatever the umask and narrowed when an older version or another umask left it wider
(pynode_os.files.make_dirs): a host user who could write it could plant or swap a container's directory, its
state.json and exec fifo, which root's later commands trust. Only `create` and a foreground terminal make
it, so the commands that only read or signal stat nothing more.
"""
from __future__ import annotations

import fcntl
import os

from pynode_os.files import NONE, atomic_write, make_dirs
from pyruntime import fastjson
from pyruntime.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
)
from pyruntime.oci.state import ContainerState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.linux.syscalls import Syscalls

DEFAULT_ROOT = "/run/pyruntime"
ROOT_MODE = 0o711  # runc's: others pass through to a container's state by id, never list or write
# What runc's `^[\w+.-]+$` accepts, checked without `re`, whose import every command would pay.
_ID_PUNCTUATION = frozenset("_+.-")
STATE_FILE = "state.json"
# the one fifo between `create` and `start`, named as runc names it (tools and runc's tests know the name)
FIFO = "exec.fifo"


class ContainerError(FailedPreconditionError):
    """The container is in the wrong state for the request: start of a running one, kill of a stopped one,
    delete of a running one without force. Other failures raise their own kind."""


class NotFound(NotFoundError):
    """No container has that id (or it was deleted meanwhile)."""


class AlreadyExists(AlreadyExistsError):
    """A container with that id exists: create claims an id once."""


def validate_id(cid: str) -> None:
    if (not cid or not all(c.isalnum() or c in _ID_PUNCTUATION for c in cid) or cid in (".", "..")
            or len(cid) > 1024):
        raise InvalidArgumentError(f"invalid container id {cid!r}: use letters, digits, '_', '+', '-' and '.'")


class ContainerStore:
    def __init__(self, root: str = DEFAULT_ROOT) -> None:
        self.root = os.path.abspath(root)

    def path(self, cid: str, name: str = "") -> str:
        return os.path.join(self.root, cid, name) if name else os.path.join(self.root, cid)

    def reserve(self, cid: str, kernel: Syscalls) -> None:
        """Claims an id, failing if a container with it exists."""
        validate_id(cid)
        make_dirs(self.root, ROOT_MODE, chmod=kernel.chmod)
        try:
            os.mkdir(self.path(cid), ROOT_MODE)
        except FileExistsError as e:
            raise AlreadyExists(f"container with id {cid!r} already exists") from e

    def save(self, state: ContainerState) -> None:
        final = self.path(state.id, STATE_FILE)
        atomic_write(final, fastjson.dumps(state.to_json()).encode(), mode=0o600, tmp=final + ".tmp", sync=NONE)

    def load(self, cid: str) -> ContainerState:
        validate_id(cid)
        try:
            with open(self.path(cid, STATE_FILE), "rb") as f:
                return ContainerState.from_json(fastjson.load(f))
        except FileNotFoundError as e:
            raise NotFound(f"container {cid!r} does not exist") from e
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError, as are from_json's errors
            raise InternalError(f"container {cid!r}: unreadable state {self.path(cid, STATE_FILE)}: {e}; "
                                "`delete --force` removes it") from e

    def ids(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        return [n for n in names if os.path.exists(self.path(n, STATE_FILE))]

    def remove(self, cid: str) -> None:
        """The directory holds files only (state.json, the exec fifo), removed one by one: shutil's import
        (bz2, lzma) would be paid by every delete. Whatever else is found there goes with rmtree."""
        path = self.path(cid)
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    os.unlink(entry.path)
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:  # a directory someone made in it
            import shutil
            shutil.rmtree(path, ignore_errors=True)

    def locked(self, cid: str) -> _Flock:
        """Held by every command across its read of the state and its last change to it, so that two
        commands never act on the same stale record (an update that a concurrent one overwrote).
        Forked children inherit the lock's open file until close_fds or exit; nothing forked here
        outlives the command with it."""
        validate_id(cid)
        try:
            fd = os.open(self.path(cid), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise NotFound(f"container {cid!r} does not exist") from e
        return _Flock(fd)


class _Flock:
    """An exclusive flock on an open fd, closed when the block ends (a class, not a contextlib generator:
    every runtime command takes one, and would pay contextlib's import)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise

    def __exit__(self, *_exc: object) -> None:
        os.close(self.fd)
