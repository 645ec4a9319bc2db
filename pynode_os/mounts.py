"""mount(2), umount2(2) and statfs(2) through libc, not the mount(8) tool: a container or a pod start
should not fork. Each failure raises MountError, an OSError whose message names the call and the path
(errno stays for callers that branch on it), because "Invalid argument" alone never tells which of forty
mounts went wrong; `what` words it for a caller whose users know the mount by another name ("bind mount
SOURCE on TARGET").

The runtime reaches these only through its Syscalls object (pyruntime/linux/syscalls.py), which re-raises
a MountError as its SyscallError and gives its modules the flags below under its own names.
"""
from __future__ import annotations

import ctypes
import os

from pynode_os.libc import libc

# mount(2) flags (linux/mount.h)
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_SYNCHRONOUS = 0x10
MS_REMOUNT = 0x20
MS_MANDLOCK = 0x40
MS_DIRSYNC = 0x80
MS_NOSYMFOLLOW = 0x100
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_SILENT = 0x8000
MS_UNBINDABLE = 1 << 17
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MS_LAZYTIME = 1 << 25
# umount2(2) flags
MNT_DETACH = 2


class MountError(OSError):
    """A mount(2), umount2(2) or statfs(2) call failed; the message names the call and the path."""


def _b(value: str | os.PathLike[str] | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def _fail(what: str) -> MountError:
    err = ctypes.get_errno()
    return MountError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | os.PathLike[str] | None, target: str | os.PathLike[str], fstype: str | None, flags: int,
          data: str | None, *, what: str | None = None) -> None:
    if libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)) != 0:
        raise _fail(what or f"mount({source or 'none'}, type={fstype or 'none'}, flags={flags:#x}, data={data or ''}) "
                            f"on {os.fspath(target)}")


def umount(target: str | os.PathLike[str], flags: int = 0, *, what: str | None = None) -> None:
    if libc.umount2(_b(target), flags) != 0:
        raise _fail(what or f"umount2 {os.fspath(target)}")


def statfs_type(path: str | os.PathLike[str]) -> int:
    """The filesystem's magic number (f_type), which os.statvfs does not report."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux; f_type comes first
    if libc.statfs(_b(path), buf) != 0:
        raise _fail(f"statfs {os.fspath(path)}")
    return ctypes.c_long.from_buffer(buf).value
