"""fsGroup: a pod's volumes belong to its group, as the kubelet's SetVolumeOwnership makes them.

A pod that runs as a non-root user (runAsUser 1000) must still be able to use the volumes the kubelet
made as root: with `securityContext.fsGroup` every file and directory of the volume gets that group,
group read (and write, for a writable volume such as emptyDir; read-only for the API-data volumes),
and directories the setgid bit so files the container creates later inherit the group. The container's
process has fsGroup among its supplementary groups (pykubelet/pods/sync.py), which is what gives it the
access.

Symlinks are given the group (lchown) but never followed: the API-data volumes are symlinks into
`..data`, and a link pointing out of the volume must not let the kubelet chown the node's files.
fsGroupChangePolicy OnRootMismatch skips the walk when the volume's root already has the group and
permissions; the walk goes bottom-up so a correct root means the whole tree was done.
"""
from __future__ import annotations

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


def _change(path: str, fs_group: int, readonly: bool) -> None:
    st = os.lstat(path)
    os.lchown(path, -1, fs_group)
    if stat.S_ISLNK(st.st_mode):
        return
    mask = RO if readonly else RW
    if stat.S_ISDIR(st.st_mode):
        mask |= stat.S_ISGID | EXEC
    os.chmod(path, stat.S_IMODE(st.st_mode) | mask)


def set_ownership(root: Path, fs_group: int, readonly: bool, policy: str | None = None) -> bool:
    """Gives the tree under `root` to group `fs_group`; False if OnRootMismatch found nothing to do."""
    if policy == "OnRootMismatch" and not requires_change(root, fs_group, readonly):
        return False
    for top, dirs, files in os.walk(root, topdown=False):  # os.walk does not follow symlinked dirs
        for name in files + dirs:
            _change(os.path.join(top, name), fs_group, readonly)
    _change(str(root), fs_group, readonly)
    return True
