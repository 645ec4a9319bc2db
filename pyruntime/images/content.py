"""Blobs by digest, written so that a blob in the store is always complete and verified.

Downloads land in `ingest/` and are hashed as they stream; only a blob whose digest and size match is
fsynced and renamed into `blobs/sha256/`. A partial download stays in `ingest/` so the next attempt can
resume with a Range request; a file lock per digest keeps two processes from writing the same one.
"""
from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pynode_os.files import atomic_write, fsync_dir
from pyruntime.errors import InvalidArgumentError, NotFoundError

_HEX64 = set("0123456789abcdef")


class DigestError(InvalidArgumentError):
    """A blob whose content does not match its digest or size, or a malformed digest; the message names
    the digest. Invalid input: bytes that contradict their digest are never stored or retried as they
    are, whether a registry or an archive supplied them."""


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """Only sha256 is stored; the hex is checked because it becomes a file name."""
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not set(hexpart) <= _HEX64:
        raise DigestError(f"unsupported or malformed digest {digest!r}")
    return hexpart


@contextlib.contextmanager
def flock(path: Path, mode: int) -> Iterator[None]:
    """Hold flock(2) `mode` on a lock file, made if missing, until the block ends. Its last holder may
    remove it (LOCKS.hold's `remove`): a lock won on a file unlinked meanwhile guards nothing, so it is
    taken again on the file now at `path`."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode)
            held = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)


class _Locks:
    """flock serialises processes, but two threads of one process share a lock, so a mutex goes first. A
    mutex lives while some thread holds or waits for it: the keys (a container id each) never stop coming."""

    def __init__(self) -> None:
        self._mutexes: dict[str, tuple[threading.Lock, list[int]]] = {}  # key -> (mutex, [its users])
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def hold(self, path: Path, remove: bool = False) -> Iterator[None]:
        """`remove`: the block ends the thing the lock guards (a container's rootfs), so the lock file goes
        too, unlinked while held (flock takes care of those who waited for it)."""
        key = str(path)
        with self._guard:
            mutex, users = self._mutexes.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with mutex, flock(path, fcntl.LOCK_EX):
                yield
                if remove:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        finally:
            with self._guard:
                users[0] -= 1
                if not users[0]:
                    del self._mutexes[key]


LOCKS = _Locks()


@dataclass
class Writer:
    """An ingest in progress: `offset` bytes are already on disk and hashed."""
    digest: str
    size: int | None
    path: Path
    file: BinaryIO
    hasher: hashlib._Hash
    offset: int

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.hasher.update(chunk)
        self.offset += len(chunk)
        if self.size is not None and self.offset > self.size:
            raise DigestError(f"blob {self.digest}: more than the expected {self.size} bytes")

    def restart(self) -> None:
        """The server ignored the Range request: start over from byte zero."""
        self.file.seek(0)
        self.file.truncate()
        self.hasher = hashlib.sha256()
        self.offset = 0


class ContentStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs" / "sha256"
        self.ingest = self.root / "ingest"
        self.locks = self.root / "locks"
        for d in (self.blobs, self.ingest, self.locks):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)  # the store's root (store.py) is what closes them

    def path(self, digest: str) -> Path:
        return self.blobs / check_digest(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def read(self, digest: str) -> bytes:
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError as e:
            raise NotFoundError(f"blob {digest} not in the content store") from e

    def list(self) -> builtins.list[str]:
        return sorted("sha256:" + p.name for p in self.blobs.iterdir() if len(p.name) == 64)

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(digest).unlink()

    def put(self, data: bytes, digest: str | None = None) -> str:
        """Store bytes already in memory (manifests, configs), verifying them first when a digest is given."""
        actual = sha256_digest(data)
        if digest is not None and actual != digest:
            raise DigestError(f"blob {digest}: content hashes to {actual}")
        target = self.path(actual)
        with self.lock(actual):
            if not target.exists():
                atomic_write(target, data, tmp=self.ingest / f"{check_digest(actual)}.put")
        return actual

    @contextlib.contextmanager
    def lock(self, digest: str) -> Iterator[None]:
        with LOCKS.hold(self.locks / f"blob-{check_digest(digest)}.lock"):
            yield

    @contextlib.contextmanager
    def writer(self, digest: str, size: int | None) -> Iterator[Writer]:
        """Open (or reopen, to resume) the ingest for a digest; on clean exit the blob is verified and committed.

        The caller must hold `lock(digest)`. On an exception the partial file is kept for a resume, unless the
        exception is a DigestError, which means the bytes so far are wrong and are thrown away.
        """
        hexpart = check_digest(digest)
        partial = self.ingest / f"{hexpart}.partial"
        with open(partial, "a+b") as f:
            hasher = hashlib.sha256()
            f.seek(0)
            offset = 0
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
                offset += len(chunk)
            if size is not None and offset > size:
                f.truncate(0)
                hasher, offset = hashlib.sha256(), 0
            f.seek(0, os.SEEK_END)
            w = Writer(digest, size, partial, f, hasher, offset)
            try:
                yield w
            except DigestError:
                partial.unlink(missing_ok=True)
                raise
            actual = "sha256:" + w.hasher.hexdigest()
            if (size is not None and w.offset != size) or actual != digest:
                partial.unlink(missing_ok=True)
                raise DigestError(f"blob {digest}: got {w.offset} bytes hashing to {actual}"
                                  + (f", expected {size} bytes" if size is not None else ""))
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, self.blobs / hexpart)
        fsync_dir(self.blobs)

    def partial_size(self, digest: str) -> int:
        p = self.ingest / f"{check_digest(digest)}.partial"
        return p.stat().st_size if p.exists() else 0

    def clean_ingest(self) -> builtins.list[Path]:
        """Drop partial downloads nobody is writing (their lock is free); prune calls this."""
        removed = []
        for p in self.ingest.iterdir():
            hexpart = p.name.split(".", 1)[0]
            lock = self.locks / f"blob-{hexpart}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                p.unlink(missing_ok=True)
                removed.append(p)
            finally:
                os.close(fd)
        return removed
