"""Replacing a file so that readers and a crash see the old content or the new, never a torn mix.

Every record the node keeps on disk goes through here: a container's state.json, pid files, the image
database, snapshot and mount records, blobs put into the content store, the CRI daemon's records, the CNI
plugins' launchers and default network, the kubelet's user namespace records and serving key, the
cluster's and the lab's files. The steps are the classic ones, and each is needed: write a temporary file
in the same directory (rename is atomic only within one filesystem), fsync it (else the rename can reach
the disk before the data, leaving an empty file after a power cut), rename it over the target, and fsync
the directory (else the rename itself can be lost).

The fsyncs guard against a power cut only: a crash of the writing process is covered by the rename alone.
Three levels (`sync`), each for one kind of record:
- FULL, both fsyncs: what must outlive a reboot as soon as the call returns (the image store, a record
  the CRI daemon keeps under its --root when it is first written, an installed CNI launcher, the
  kubelet's record of a pod's user namespace range, which no sandbox may be made with before the disk
  remembers it).
- DATA, the file's fsync only: an update of such a record with facts that a power cut makes moot (the
  pids and start times of the processes it describes), or a file whose loss a restart repairs (the
  kubelet's self-signed serving key, made again when missing). After a power cut the file is the old
  one or the new one, never empty or torn (which a rename reaching the disk before the data would
  leave, as on XFS), as containers/storage's AtomicWriteFile keeps CRI-O's state; the directory's journal
  commit is saved.
- NONE: a record of live processes under /run (a container's state.json, a pid file), as runc's
  state.json: a power cut ends every process it describes, and takes tmpfs with it. Also the CRI's
  bundle config.json: the runtime reads it before CreateContainer returns, and after a power cut the
  container it configures is gone (only a verbose status shows it, and skips one it can't read); and
  a pod's resolv.conf, hostname and hosts, which its containers bind only while the pod is ready.

A file's mode is `mode` narrowed by the umask, as open(2) makes it, unless `exact`: then it is `mode`
whatever the umask and whatever a leftover temporary file had (a launcher every user must run, a private
key that must be 0600 even under umask 000). The temporary file is never followed through a symlink.

Directories get their modes from make_dirs, never from the umask: mkdir(2) applies the umask, so a root shell
with umask 000 would leave state world-writable and one with 022 made every level os.makedirs adds 0755,
which is how a host user once reached every container's rootfs (CVE-2021-41103's class). make_dirs changes
a mode only through the `chmod` it is handed: the runtime's Syscalls.chmod, os.chmod elsewhere.
"""
from __future__ import annotations

import io
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

FULL, DATA, NONE = "full", "data", "none"  # atomic_file's `sync` (see the module doc)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Makes the directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: str | os.PathLike[str], mode: int, *, chmod: Callable[[str, int], object],
              narrow: bool = True) -> None:
    """mkdir -p, as Go's MkdirAll: every level it makes gets `mode` exactly, whatever the umask (mkdir(2)
    applies it; the chmod after it sets the bits it cleared and never opens a wider window). An existing
    `path` with bits beyond `mode`, made by an older version or under another umask, is narrowed to `mode`
    unless `narrow` is False (a directory that may be the host's, as a socket's); its existing parents are the
    host's and stay as they are. `chmod` has no default, so that a runtime module cannot forget its kernel's."""
    path = os.fspath(path)
    try:
        current = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        _make_missing(path, mode, chmod)
        return
    if narrow and current & ~mode:
        chmod(path, current & mode)


def _make_missing(path: str, mode: int, chmod: Callable[[str, int], object]) -> None:
    try:
        os.mkdir(path, mode)
    except FileNotFoundError:
        parent = os.path.dirname(path.rstrip("/"))
        if not parent or parent == path:
            raise
        _make_missing(parent, mode, chmod)
        _make_missing(path, mode, chmod)
        return
    except FileExistsError:  # made meanwhile by a concurrent caller, with the same mode
        return
    chmod(path, mode)


class atomic_file:
    """A binary file to write the new content into; it replaces `path` when the block ends without error.

    The temporary name is fixed (`.<name>.tmp` beside it) unless `tmp` is given: callers hold a lock
    for `path`, so a write killed half way leaves one stale file that the next write overwrites,
    not a new piece of garbage per attempt. On an error the temporary file is removed.
    A class rather than a contextlib generator: contextlib's import (collections, functools) would be paid
    by every runtime command, which writes state.json through here.
    """

    def __init__(self, path: str | os.PathLike[str], *, mode: int = 0o644,
                 tmp: str | os.PathLike[str] | None = None, sync: str = FULL, exact: bool = False) -> None:
        self.path = os.fspath(path)
        self.directory, name = os.path.split(self.path)
        self.tmp = os.fspath(tmp) if tmp is not None else os.path.join(self.directory, f".{name}.tmp")
        self.mode = mode
        self.sync = sync
        self.exact = exact

    def __enter__(self) -> io.BufferedWriter:
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, self.mode)
        if self.exact:
            try:
                os.fchmod(fd, self.mode)
            except BaseException:
                os.close(fd)
                self._discard()
                raise
        self.file = os.fdopen(fd, "wb")
        return self.file

    def __exit__(self, kind: type[BaseException] | None, _error: BaseException | None,
                 _tb: TracebackType | None) -> None:
        try:
            with self.file as f:
                if kind is None:
                    f.flush()
                    if self.sync != NONE:
                        os.fsync(f.fileno())
            if kind is None:
                os.replace(self.tmp, self.path)
        except BaseException:
            self._discard()
            raise
        if kind is not None:
            self._discard()
        elif self.sync == FULL:
            fsync_dir(self.directory or ".")

    def _discard(self) -> None:
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                 tmp: str | os.PathLike[str] | None = None, sync: str = FULL, exact: bool = False) -> None:
    """Replaces `path` with `data` (see atomic_file)."""
    with atomic_file(path, mode=mode, tmp=tmp, sync=sync, exact=exact) as f:
        f.write(data)
