"""fsGroup: a pod's volumes belong to its group, as the kubelet's SetVolumeOwnership makes them.

A pod that runs as a non-root user (runAsUser 1000) must still be able to use the volumes the kubelet
made as root: with `securityContext.fsGroup` every file and directory of the volume gets that group,
group read (and write, for a writable volume such as emptyDir; read-only for the API-data volumes),
and directories the setgid bit so files the container creates later inherit the group. The container's
process has fsGroup among its supplementary groups (pykubelet/pods/podspec.py), which is what gives it the
access.

Symlinks are given the group (lchown) but never followed: the API-data volumes are symlinks into
`..data`, and a link pointing out of the volume must not let the kubelet chown the node's files. An
emptyDir is the container's to change while the kubelet walks it (a kubelet restart re-checks it), so the
walk goes by descriptors (openat with O_NOFOLLOW, chmod through /proc/self/fd of an O_PATH descriptor):
a directory or file swapped for a symlink mid-walk is skipped, never followed out of the volume.
fsGroupChangePolicy OnRootMismatch skips the walk when the volume's root already has the group and
permissions; the walk goes bottom-up so a correct root means the whole tree was done.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

RW, RO, EXEC = 0o660, 0o440, 0o110


def requires_change(root: Path, fs_group: int, readonly: bool) -> bool:
    """Whether the volume's root lacks the group, the group permissions or the setgid bit (the kubelet's
    requiresPermissionChange)."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return True
    if st.st_gid != fs_group or not stat.S_ISDIR(st.st_mode):
        return True
    wanted = (RO if readonly else RW) | EXEC
    return (st.st_mode & wanted) != wanted or not st.st_mode & stat.S_ISGID


def _change(fd: int, fs_group: int, readonly: bool) -> None:
    """Group and mode of what `fd` (O_PATH or a directory, never a symlink's target) names."""
    st = os.fstat(fd)
    os.chown(f"/proc/self/fd/{fd}", -1, fs_group)
    mask = RO if readonly else RW
    if stat.S_ISDIR(st.st_mode):
        mask |= stat.S_ISGID | EXEC
    os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | mask)


def _walk(dir_fd: int, fs_group: int, readonly: bool) -> None:
    """Everything below the open directory `dir_fd`, children before their directory."""
    with os.scandir(dir_fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in entries]
    for name, is_dir, is_link in names:
        try:
            if is_link:
                os.chown(name, -1, fs_group, dir_fd=dir_fd, follow_symlinks=False)
                continue
            flags = (os.O_RDONLY | os.O_DIRECTORY if is_dir else os.O_PATH) | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                continue  # gone or swapped for a symlink since the listing: not ours to follow
            raise
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                continue  # O_PATH|O_NOFOLLOW opened a symlink that replaced the file
            if is_dir:
                _walk(fd, fs_group, readonly)
            _change(fd, fs_group, readonly)
        finally:
            os.close(fd)


def set_ownership(root: Path, fs_group: int, readonly: bool, policy: str | None = None) -> bool:
    """Gives the tree under `root` to group `fs_group`; False if OnRootMismatch found nothing to do."""
    if policy == "OnRootMismatch" and not requires_change(root, fs_group, readonly):
        return False
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _walk(fd, fs_group, readonly)
        _change(fd, fs_group, readonly)
    finally:
        os.close(fd)
    return True
