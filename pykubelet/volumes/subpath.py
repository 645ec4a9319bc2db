"""subPath and subPathExpr: a part of a volume mounted in place of the whole, without letting it escape.

The threat (CVE-2017-1002101, CVE-2021-25741): a container writes a symlink into a shared volume, e.g.
`data/x -> /`, and a second container (or a restart of the first) mounts subPath `x`; a kubelet that
hands the runtime the path `VOLUME/x` gives that container the node's root file system. And checking the
path first and mounting it after is a race the container can win by swapping a directory for a symlink
in between. So, as upstream does: the path is resolved and must stay inside the volume; then it is
opened one element at a time with O_PATH|O_NOFOLLOW from the volume's root (any symlink now means it
changed under us: refused), and the open file, not the path, is bind-mounted (through /proc/self/fd) onto
a kubelet-owned mount point under ROOT/pods/UID/volume-subpaths; that mount point is what the runtime
gets. A missing subPath is made as a directory, with the same element-wise care, and each directory made
gets the volume root's mode, setgid and sticky bits included (the kubelet's SafeMakeDir with GetMode of the
volume): under an emptyDir given to an fsGroup (02777, 03777 on tmpfs) the subPath stays group-writable
for the pod's non-root user, where a runtime that made it would leave it 0755.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from pykubelet import dirs
from pykubelet.volumes import mount
from pykubelet.volumes.errors import ContainerConfigError


class SubPathError(ContainerConfigError):
    pass


def check_relative(field: str, sub: str) -> str:
    p = PurePosixPath(sub)
    if p.is_absolute():
        raise SubPathError(f"{field}: {sub!r} must be a relative path")
    if ".." in p.parts:
        raise SubPathError(f"{field}: {sub!r} must not contain '..'")
    return str(p)


def _walk(base_fd: int, parts: tuple[str, ...], field: str, sub: str, create: int | None) -> int:
    """An O_PATH descriptor of `parts` below `base_fd`, refusing a symlink at any element; `create`: the mode
    (permission, setuid, setgid and sticky bits) of each missing element, made as a directory, or None."""
    fd = os.dup(base_fd)
    try:
        for part in parts:
            made = False
            if create is not None:
                try:
                    os.mkdir(part, create, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
            nfd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise SubPathError(f"{field}: {sub!r}: element {part!r} is a symlink (the volume changed while "
                                   "it was opened): refused")
            if create is not None and made:  # mkdir(2) applies the umask, sets no setuid or setgid bit itself
                os.chmod(f"/proc/self/fd/{fd}", create)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def bind_subpath(field: str, volume: str, volume_path: Path, sub: str, target: Path) -> Path:
    """Bind-mounts `sub` of the volume at `volume_path` onto `target` (made as a file or a directory to
    match) and returns `target`; `field` is the volumeMount's field path, for errors."""
    sub = check_relative(field, sub)
    base = os.path.realpath(volume_path)
    base_fd = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not os.path.lexists(os.path.join(base, sub)):
            mode = stat.S_IMODE(os.fstat(base_fd).st_mode)
            os.close(_walk(base_fd, PurePosixPath(sub).parts, field, sub, create=mode))
        resolved = os.path.realpath(os.path.join(base, sub))
        if not _within(resolved, base):
            raise SubPathError(f"{field}: subPath {sub!r} resolves to {resolved}, outside volume {volume!r} "
                               f"({base}): refused")
        rel = os.path.relpath(resolved, base)
        fd = _walk(base_fd, PurePosixPath(rel).parts if rel != "." else (), field, sub, create=None)
    finally:
        os.close(base_fd)
    try:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        dirs.make_dirs(target.parent)
        if mount.fs_type(target) is not None:
            mount.unmount(target)  # a container restart: pin the subPath afresh
        if is_dir:
            target.mkdir(exist_ok=True)
        elif not target.exists():
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        mount.bind(f"/proc/self/fd/{fd}", target)
    finally:
        os.close(fd)
    return target
