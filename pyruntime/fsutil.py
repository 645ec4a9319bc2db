"""Directories whose modes come from the code, never from the umask.

mkdir(2) applies the umask, so a root shell with umask 000 would leave state world-writable and one with 022
made every level os.makedirs adds 0755, which is how a host user once reached every container's rootfs
(CVE-2021-41103's class). Files are replaced through pynode_os.files.
"""
from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.linux.syscalls import Syscalls


def make_dirs(kernel: Syscalls, path: str | os.PathLike[str], mode: int, *, narrow: bool = True) -> None:
    """mkdir -p, as Go's MkdirAll: every level it makes gets `mode` exactly, whatever the umask (mkdir(2)
    applies it; the chmod after it sets the bits it cleared and never opens a wider window). An existing
    `path` with bits beyond `mode`, made by an older version or under another umask, is narrowed to `mode`
    unless `narrow` is False (a directory that may be the host's, as a socket's); its existing parents are the
    host's and stay as they are."""
    path = os.fspath(path)
    try:
        current = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        _make_missing(kernel, path, mode)
        return
    if narrow and current & ~mode:
        kernel.chmod(path, current & mode)


def _make_missing(kernel: Syscalls, path: str, mode: int) -> None:
    try:
        os.mkdir(path, mode)
    except FileNotFoundError:
        parent = os.path.dirname(path.rstrip("/"))
        if not parent or parent == path:
            raise
        _make_missing(kernel, parent, mode)
        _make_missing(kernel, path, mode)
        return
    except FileExistsError:  # made meanwhile by a concurrent caller, with the same mode
        return
    kernel.chmod(path, mode)
