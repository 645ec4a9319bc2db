"""Performing the mounts a snapshot asks for: the one place in the image store that needs root.

A snapshot record says what to mount (containerd's mount.Mount: type, source, options) and not where, so the
store can prepare a container's layers without privileges and be unit-tested as any user, and a caller (the
`pyruntime image mount` command, a CRI server building a sandbox) mounts them wherever its bundle wants. The
syscall layer is a parameter (`kernel`) so that tests pass `FakeSyscalls` and nothing here ever touches
the host unasked.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from pyruntime.errors import InvalidArgumentError
from pyruntime.linux import mountinfo
from pyruntime.linux.syscalls import MNT_DETACH, MS_BIND, MS_REC, Syscalls

OVERLAY_OPTIONS_MAX = 4000  # mount(2)'s data is one page, less headroom


@dataclass
class Mount:
    """One mount to make, as `mount -t TYPE -o OPTIONS SOURCE TARGET` would, the target chosen by the caller."""
    type: str  # "overlay" or "bind"
    source: str
    options: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"type": self.type, "source": self.source, "options": list(self.options)}

    @classmethod
    def from_dict(cls, d: dict) -> Mount:
        return cls(d["type"], d["source"], list(d.get("options") or []))


def mount_all(mounts: list[Mount], target: Path | str, kernel: Syscalls) -> None:
    """Make `mounts` at `target`, in order (each on top of the one before, as containerd's mount.All does)."""
    for m in mounts:
        _mount(m, str(target), kernel)


def _mount(m: Mount, target: str, kernel: Syscalls) -> None:
    if m.type == "overlay":
        data = ",".join(m.options)
        if len(data) < OVERLAY_OPTIONS_MAX:
            kernel.mount(m.source, target, "overlay", 0, data)
            return
        # Beyond one page, layers are added one by one through the new mount API (`lowerdir+`, Linux 6.8).
        settings: list[tuple[str, str]] = []
        for opt in m.options:
            key, _, value = opt.partition("=")
            if key == "lowerdir":
                settings += [("lowerdir+", p) for p in value.split(":")]
            else:
                settings.append((key, value))
        kernel.mount_with_fsconfig("overlay", settings, target)
    elif m.type == "bind":
        if os.path.realpath(m.source) == os.path.realpath(target):
            return  # the copy snapshotter's own directory: its files are already there
        flags = MS_BIND | (MS_REC if "rbind" in m.options else 0)
        kernel.mount(m.source, target, None, flags, None)
    else:
        raise InvalidArgumentError(f"mount {m.source} on {target}: unsupported mount type {m.type!r}")


def is_mountpoint(path: Path | str) -> bool:
    return mountinfo.is_mount_point(os.path.realpath(path), mountinfo.read())


def unmount(target: Path | str, kernel: Syscalls) -> bool:
    """Undo mount_all at `target` (lazily, so a process still inside does not block a release);
    False when nothing was mounted there."""
    if not os.path.exists(target) or not is_mountpoint(target):
        return False
    while True:  # a bind over an overlay is two mounts
        try:
            kernel.umount(str(target), MNT_DETACH)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOENT):
                raise
            return True
        if not is_mountpoint(target):
            return True
