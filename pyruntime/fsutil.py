"""Replacing a file so that readers and a crash see the old content or the new, never a torn mix.

Every record pyruntime keeps on disk goes through here: a container's state.json, pid files, the image
database, snapshot and mount records, blobs put into the content store. The steps are the classic
ones, and each is needed: write a temporary file in the same directory (rename is atomic only
within one filesystem), fsync it (else the rename can reach the disk before the data, leaving an
empty file after a power cut), rename it over the target, and fsync the directory (else the rename
itself can be lost). Kept at the top of the package, importing nothing of it, so that both
pyruntime.container and pyruntime.images use it without depending on each other.

The fsyncs guard against a power cut only: a crash of the writing process is covered by the rename alone.
Three levels (`sync`), each for one kind of record:
- FULL, both fsyncs: what must outlive a reboot as soon as the call returns (the image store, a record
  the CRI daemon keeps under its --root when it is first written).
- DATA, the file's fsync only: an update of such a record with facts that a power cut makes moot (the
  pids and start times of the processes it describes). After a power cut the record is the old one or
  the new one, never empty or torn (which a rename reaching the disk before the data would leave, as
  on XFS), as containers/storage's AtomicWriteFile keeps CRI-O's state; the directory's journal commit
  is saved.
- NONE: a record of live processes under /run (a container's state.json, a pid file), as runc's
  state.json: a power cut ends every process it describes, and takes tmpfs with it. Also the CRI's
  bundle config.json: the runtime reads it before CreateContainer returns, and after a power cut the
  container it configures is gone (only a verbose status shows it, and skips one it can't read); and
  a pod's resolv.conf, hostname and hosts, which its containers bind only while the pod is ready.
"""
from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator

FULL, DATA, NONE = "full", "data", "none"  # atomic_file's `sync` (see the module doc)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Makes the directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, mode: int = 0o644, tmp: str | os.PathLike[str] | None = None,
                sync: str = FULL) -> Iterator[io.BufferedWriter]:
    """A binary file to write the new content into; it replaces `path` when the block ends without error.

    The temporary name is fixed (`.<name>.tmp` beside it) unless `tmp` is given: callers hold a lock
    for `path`, so a write killed half way leaves one stale file that the next write overwrites,
    not a new piece of garbage per attempt. On an error the temporary file is removed.
    """
    path = os.fspath(path)
    directory, name = os.path.split(path)
    tmp_path = os.fspath(tmp) if tmp is not None else os.path.join(directory, f".{name}.tmp")
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if sync != NONE:
                os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path)
        raise
    if sync == FULL:
        fsync_dir(directory or ".")


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                 tmp: str | os.PathLike[str] | None = None, sync: str = FULL) -> None:
    """Replaces `path` with `data` (see atomic_file)."""
    with atomic_file(path, mode=mode, tmp=tmp, sync=sync) as f:
        f.write(data)
