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

from pynode_os import mountinfo
from pyruntime.errors import InvalidArgumentError
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


@dataclass(frozen=True)
class IdMap:
    """A pod's user namespace (its /proc/PID/ns/user or a pin of it) and the host ids its root maps to."""
    userns: str
    root_uid: int
    root_gid: int


def mount_all(mounts: list[Mount], target: Path | str, kernel: Syscalls, idmap: IdMap | None = None) -> None:
    """Make `mounts` at `target`, in order (each on top of the one before, as containerd's mount.All does).
    `idmap`: for a pod with a user namespace of its own, whose root is to own what root owns in the image."""
    if idmap is None:
        for m in mounts:
            _mount(m, str(target), kernel)
        return
    userns_fd = os.open(idmap.userns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for m in mounts:
            _mount_idmapped(m, str(target), kernel, userns_fd, idmap)
    finally:
        os.close(userns_fd)


def staging_dir(target: str) -> str:
    return f"{target}.idmap"


def _mount_idmapped(m: Mount, target: str, kernel: Syscalls, userns_fd: int, idmap: IdMap) -> None:
    """An overlay can't be idmapped itself, but its lower layers can (Linux >= 5.19), as containerd's overlay
    snapshotter does for user namespaces: each lower layer is mounted idmapped under a staging directory
    beside `target`, the overlay is made of those, and the staging mounts are detached again (the overlay
    keeps what it needs). No file of the image is chowned: its layers stay shared with every other pod,
    whatever its map. The upper layer, this container's own and still empty, is chowned to the pod's root:
    the overlay writes it with its mounter's (the host root's) credentials, which an idmapped mount of it
    could not represent. A bind (the copy snapshotter's private copy) is idmapped itself."""
    if m.type != "overlay":
        if m.type != "bind":
            raise InvalidArgumentError(f"mount {m.source} on {target}: unsupported mount type {m.type!r}")
        kernel.mount_idmapped(m.source, userns_fd, target)
        return
    staging = staging_dir(target)
    os.makedirs(staging, mode=0o700, exist_ok=True)
    try:
        options = []
        for opt in m.options:
            key, _, value = opt.partition("=")
            if key == "lowerdir":
                layers: list[str] = []
                for layer in value.split(":"):
                    layers.append(os.path.join(staging, str(len(layers))))
                    os.mkdir(layers[-1], 0o700)
                    kernel.mount_idmapped(layer, userns_fd, layers[-1])
                opt = "lowerdir=" + ":".join(layers)
            elif key == "upperdir":
                kernel.chown(value, idmap.root_uid, idmap.root_gid)
            options.append(opt)
        _mount(Mount("overlay", m.source, options), target, kernel)
    finally:
        _drop_staging(staging, kernel)


def _drop_staging(staging: str, kernel: Syscalls) -> None:
    """Detaches and removes the staging mounts of an idmapped overlay: left behind by a crash between
    their making and their removal, the directory would hold mounts of the image's layers."""
    for name in os.listdir(staging) if os.path.isdir(staging) else ():
        path = os.path.join(staging, name)
        try:
            kernel.umount(path, MNT_DETACH)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOENT):
                raise
        os.rmdir(path)
    if os.path.isdir(staging):
        os.rmdir(staging)


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
    _drop_staging(staging_dir(str(target)), kernel)
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
