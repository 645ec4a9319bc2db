"""Path resolution that cannot leave a directory: openat2(RESOLVE_IN_ROOT), or a component-wise O_NOFOLLOW walk.

A layer is written through directory fds only; every path is resolved with the snapshot directory as its root,
so a symlink to `/etc` or `../../..` planted by an earlier entry lands back inside the snapshot.
"""
from __future__ import annotations

import errno
import os

from pyruntime.linux.syscalls import RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_XDEV, SYS

_openat2_works: bool | None = None


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    for _ in range(64):  # EAGAIN: a concurrent rename raced the lookup; the kernel asks for a retry
        try:
            return SYS.openat2(dirfd, path, flags, resolve)
        except OSError as e:
            if e.errno != errno.EAGAIN:
                # as its errno's subclass (FileNotFoundError, ...), which the unpacker catches
                raise OSError(e.errno, e.strerror, path) from e
    raise OSError(errno.EAGAIN, f"openat2 {path!r}: kept racing with renames", path)


def _walk_nofollow(rootfd: int, path: str, flags: int) -> int:
    """Without openat2: each component opened with O_NOFOLLOW, so any symlink on the way is refused (ELOOP)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise OSError(errno.EXDEV, f"{path!r} climbs out of its root", path)
    fd = os.dup(rootfd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nfd = os.open(part, (flags if last else os.O_PATH | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nfd
        if not parts:
            nfd = os.open(".", flags | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_in_root(rootfd: int, path: str, flags: int = os.O_RDONLY | os.O_DIRECTORY) -> int:
    """Open `path` as if `rootfd` were `/`: absolute symlinks and `..` are clamped to it, magic links refused."""
    global _openat2_works
    if _openat2_works is not False:
        try:
            fd = _openat2(rootfd, path or ".", flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)
            _openat2_works = True
            return fd
        except OSError as e:
            if e.errno != errno.ENOSYS:
                raise
            _openat2_works = False
    return _walk_nofollow(rootfd, path, flags)
