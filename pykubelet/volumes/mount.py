"""The few mount(2) calls the volume manager makes on the host: a tmpfs for memory-backed volumes (emptyDir
medium Memory, secret and projected volumes, so secrets never reach a disk) and the bind mounts that pin
a subPath; and their undoing when the pod goes.

Direct syscalls through libc, not the mount(8) tool: a pod start should not fork. pykubelet runs in the
host's mount namespace, so these mounts are what the runtime bind-mounts into the containers.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from pynode_os import mountinfo

MS_BIND = 0x1000
MS_REC = 0x4000
MNT_DETACH = 0x2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


class MountError(OSError):
    """A mount(2) or umount2(2) call failed; the message names the call and the path."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"{what}: {os.strerror(err)}")


def mount_tmpfs(target: Path, size: int | None = None, mode: int = 0o777) -> None:
    options = f"mode={mode:o}" + (f",size={size}" if size else "")
    _check(_libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", 0, options.encode()),
           f"mount tmpfs ({options}) on {target}")


def bind(source: str | Path, target: Path) -> None:
    _check(_libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND | MS_REC, None),
           f"bind mount {source} on {target}")


def unmount(target: Path) -> None:
    _check(_libc.umount2(os.fsencode(target), MNT_DETACH), f"umount {target}")


def mounts_under(path: Path) -> list[tuple[Path, str]]:
    """The mount points at or below `path` with their file system types, deepest first."""
    base = os.path.realpath(path)
    found = [(Path(m.mount_point), m.fstype) for m in mountinfo.read()
             if m.mount_point == base or m.mount_point.startswith(base.rstrip("/") + "/")]
    return sorted(found, key=lambda m: -len(m[0].parts))


def fs_type(path: Path) -> str | None:
    """The file system type if `path` is itself a mount point, else None."""
    return next((t for p, t in mounts_under(path) if p == Path(os.path.realpath(path))), None)
