"""The kubelet's directories under --root-dir, with the kubelet's modes whatever the umask.

The root dir and everything the kubelet makes on the way to a volume (pods/, pods/UID/, volumes/, the
plugin's directory, volume-subpaths/) are 0750, as the kubelet's setupDataDirs and MkdirAll(0750): below
them are every pod's secrets and service-account tokens, which a host user must not read. A container
reaches its volumes through their bind mounts, which the runtime makes as root, so the closed parents
stop nobody who should pass; the volume directory itself keeps the mode its container needs (volumes/).

Modes are set, not left to mkdir(2), which applies the umask (000 would leave the tree world-writable, 022
made every level 0755, the probe of issue 22). The root dir and pods/ are narrowed at start when an older
version left them wider: closing them closes everything below. pyruntime/fsutil.py has the same helper;
pykubelet keeps its own because it imports nothing of the runtime (it reaches one only through CRI).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o750


def make_dirs(path: Path, mode: int = DIR_MODE, *, narrow: bool = True) -> None:
    """mkdir -p: every level made gets `mode` exactly (a chmod after mkdir, which only adds back the bits the
    umask cleared, so no wider window); an existing `path` with bits beyond `mode` is narrowed to it unless
    `narrow` is False. Existing parents stay as they are."""
    try:
        current = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        _make_missing(path, mode)
        return
    if narrow and current & ~mode:
        os.chmod(path, current & mode)


def _make_missing(path: Path, mode: int) -> None:
    try:
        os.mkdir(path, mode)
    except FileNotFoundError:
        if path.parent == path:
            raise
        _make_missing(path.parent, mode)
        _make_missing(path, mode)
        return
    except FileExistsError:  # made meanwhile by another worker, with the same mode
        return
    os.chmod(path, mode)


def set_up_root(root_dir: Path) -> None:
    """The kubelet's root dir and pods/ at start."""
    make_dirs(root_dir)
    make_dirs(root_dir / "pods")
