"""The few mount(2) calls the volume manager makes on the host: a tmpfs for memory-backed volumes (emptyDir
medium Memory, secret and projected volumes, so secrets never reach a disk) and the bind mounts that pin
a subPath; and their undoing when the pod goes.

Through pynode_os.mounts (libc, not the mount(8) tool: a pod start should not fork). pykubelet runs in the
host's mount namespace, so these mounts are what the runtime bind-mounts into the containers.
"""
from __future__ import annotations

import os
from pathlib import Path

from pynode_os import mountinfo, mounts
from pynode_os.mounts import MountError as MountError  # what every call here raises, caught by the volume manager


def mount_tmpfs(target: Path, size: int | None = None, mode: int | None = None) -> None:
    """`mode` None: tmpfs's own root mode, 1777 (an emptyDir's, as the kubelet mounts it)."""
    options = ",".join(([f"mode={mode:o}"] if mode is not None else []) + ([f"size={size}"] if size else []))
    mounts.mount("tmpfs", target, "tmpfs", 0, options or None, what=f"mount tmpfs ({options}) on {target}")


def bind(source: str | Path, target: Path) -> None:
    mounts.mount(source, target, None, mounts.MS_BIND | mounts.MS_REC, None, what=f"bind mount {source} on {target}")


def unmount(target: Path) -> None:
    mounts.umount(target, mounts.MNT_DETACH, what=f"umount {target}")


def mounts_under(path: Path) -> list[tuple[Path, str]]:
    """The mount points at or below `path` with their file system types, deepest first."""
    base = os.path.realpath(path)
    found = [(Path(m.mount_point), m.fstype) for m in mountinfo.read()
             if m.mount_point == base or m.mount_point.startswith(base.rstrip("/") + "/")]
    return sorted(found, key=lambda m: -len(m[0].parts))


def fs_type(path: Path) -> str | None:
    """The file system type if `path` is itself a mount point, else None."""
    return next((t for p, t in mounts_under(path) if p == Path(os.path.realpath(path))), None)
