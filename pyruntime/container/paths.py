"""Paths inside a container's root, resolved by the kernel so that they can never land outside it.

A string join of rootfs and a destination trusts every symlink in the image: `/etc -> /` would put a
mount on the host's /etc (CVE-2021-30465's class). Here every lookup is an openat2 with
RESOLVE_IN_ROOT on a descriptor of the root, and what is mounted on is the descriptor itself, reached
through /proc/self/fd, so a symlink swapped in after the check is never followed either. The lookup
itself is pyruntime.linux.resolve's, shared with the layer unpacker.
"""
from __future__ import annotations

import errno
import os
import posixpath
import stat

from pyruntime.linux import resolve
from pyruntime.linux.syscalls import O_PATH, SyscallError, Syscalls


def clean(path: str) -> str:
    """An absolute, normalised path whose '..' cannot climb above '/'."""
    return posixpath.normpath("/" + path.lstrip("/")) if path else "/"


def open_in_root(kernel: Syscalls, root_fd: int, path: str, flags: int = O_PATH, nofollow: bool = False) -> int:
    return resolve.open_in_root(kernel, root_fd, clean(path), flags, nofollow=nofollow)


def _open_dir(kernel: Syscalls, root_fd: int, path: str) -> int:
    return open_in_root(kernel, root_fd, path, os.O_RDONLY | os.O_DIRECTORY)


def mkdir_all(kernel: Syscalls, root_fd: int, path: str, mode: int = 0o755, _depth: int = 0) -> int:
    """Creates every missing directory of `path` inside the root and returns an O_PATH fd of the last.

    Each prefix is resolved from the root again, so a symlink met on the way is followed as the
    container would see it, never relative to the host; a dangling one gets its target made (inside the
    root), as runc's MkdirAllInRoot does, so that a path through it exists afterwards.
    """
    parts = [p for p in clean(path).split("/") if p]
    for i, part in enumerate(parts):
        prefix = "/" + "/".join(parts[:i + 1])
        try:
            os.close(open_in_root(kernel, root_fd, prefix, O_PATH | os.O_DIRECTORY))
            continue
        except SyscallError as e:
            if e.errno != errno.ENOENT:
                raise
        above = "/" + "/".join(parts[:i])
        parent = _open_dir(kernel, root_fd, above)
        try:
            os.mkdir(part, mode, dir_fd=parent)
            continue
        except FileExistsError:
            try:
                link = os.readlink(part, dir_fd=parent)
            except OSError:
                continue  # made meanwhile by someone else
        finally:
            os.close(parent)
        if _depth >= 40:
            raise SyscallError(errno.ELOOP, f"{path}: too many levels of symbolic links")
        os.close(mkdir_all(kernel, root_fd, posixpath.join(above, link), mode, _depth + 1))
    return open_in_root(kernel, root_fd, path, O_PATH | os.O_DIRECTORY)


def make_target(kernel: Syscalls, root_fd: int, path: str, directory: bool, _depth: int = 0) -> int:
    """An O_PATH fd of the mount point `path` inside the root, made as a directory or an empty file.

    A dangling symlink on the way is followed as the container would follow it (inside the root) and
    its target is created there, as runc's securejoin does.
    """
    try:
        return open_in_root(kernel, root_fd, path)
    except SyscallError as e:
        if e.errno != errno.ENOENT:
            raise
    if directory and _depth == 0:
        try:
            return mkdir_all(kernel, root_fd, path)
        except SyscallError as e:
            if e.errno != errno.ENOENT or _depth >= 40:
                raise
    parent, name = posixpath.split(clean(path))
    os.close(mkdir_all(kernel, root_fd, parent))
    dfd = _open_dir(kernel, root_fd, parent)
    try:
        try:
            link = os.readlink(name, dir_fd=dfd)
        except OSError:
            link = None
        if link is not None:
            if _depth >= 40:
                raise SyscallError(errno.ELOOP, f"{path}: too many levels of symbolic links")
            return make_target(kernel, root_fd, posixpath.join(parent, link), directory, _depth + 1)
        if directory:
            os.mkdir(name, 0o755, dir_fd=dfd)
        else:
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd))
    except FileExistsError:
        pass
    finally:
        os.close(dfd)
    return open_in_root(kernel, root_fd, path)


def fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def is_dir_fd(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)
