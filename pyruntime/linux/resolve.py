"""Opening a path as if a directory were `/`: the one way pyruntime resolves a path it does not trust.

Two callers hand the kernel a path chosen by an image: the container's rootfs set-up (mount targets,
devices, masked paths; a string join of rootfs and `/etc` trusts every symlink in the image,
CVE-2021-30465's class) and the layer unpacker and archive importer (a symlink to `/etc` or
`../../..` planted by an earlier tar entry). Both resolve through openat2(RESOLVE_IN_ROOT), so absolute
symlinks and `..` are clamped to the root, and magic links (/proc/self/fd/N, /proc/PID/root) are refused.

Where openat2 is missing (ENOSYS, kernels before 5.6) the path is walked component by component with
O_NOFOLLOW instead, refusing every symlink and `..`: stricter than the kernel's clamping, never looser.
The answer is not cached: a failed openat2 costs one syscall, and a cache would be hidden global state.
Errors are `SyscallError`s naming the path, whichever way it was resolved.
"""
from __future__ import annotations

import errno
import os

from pyruntime.linux.syscalls import (
    O_PATH,
    RESOLVE_IN_ROOT,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_XDEV,
    SyscallError,
    Syscalls,
)


def open_in_root(kernel: Syscalls, root_fd: int, path: str, flags: int = O_PATH, *, nofollow: bool = False,
                 same_mount: bool = False) -> int:
    """An fd of `path` resolved inside `root_fd`. `nofollow` refuses a symlink as the last component
    (ELOOP); `same_mount` refuses crossing a mount point (EXDEV), for trees that should hold none."""
    flags |= os.O_NOFOLLOW if nofollow else 0
    relative = path.lstrip("/") or "."
    resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | (RESOLVE_NO_XDEV if same_mount else 0)
    try:
        return _openat2(kernel, root_fd, relative, flags, resolve)
    except SyscallError as e:
        if e.errno != errno.ENOSYS:
            raise
    return _walk_nofollow(root_fd, relative, flags)


def _openat2(kernel: Syscalls, root_fd: int, path: str, flags: int, resolve: int) -> int:
    for _ in range(64):  # EAGAIN: a concurrent rename raced the lookup; the kernel asks for a retry
        try:
            return kernel.openat2(root_fd, path, flags, resolve)
        except SyscallError as e:
            if e.errno != errno.EAGAIN:
                raise
    raise SyscallError(errno.EAGAIN, f"openat2 {path}: kept racing with renames")


def _walk_nofollow(root_fd: int, path: str, flags: int) -> int:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SyscallError(errno.EXDEV, f"open {path}: '..' is refused without openat2")
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nfd = os.open(part, (flags if last else O_PATH | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nfd
        if not parts:
            nfd = os.open(".", flags | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except OSError as e:
        os.close(fd)
        raise SyscallError(e.errno, f"open {path} (symlinks refused without openat2): {e.strerror}") from e
    except BaseException:
        os.close(fd)
        raise
