"""The kubelet's directories under --root-dir, with the kubelet's modes whatever the umask.

The root dir and everything the kubelet makes on the way to a volume (pods/, pods/UID/, volumes/, the
plugin's directory, volume-subpaths/) are 0750, as the kubelet's setupDataDirs and MkdirAll(0750): below
them are every pod's secrets and service-account tokens, which a host user must not read. A container
reaches its volumes through their bind mounts, which the runtime makes as root, so the closed parents
stop nobody who should pass; the volume directory itself keeps the mode its container needs (volumes/).

Modes are set, not left to mkdir(2), which applies the umask (000 would leave the tree world-writable, 022
made every level 0755, the probe of issue 22; pynode_os.files.make_dirs). The root dir and pods/ are
narrowed at start when an older version left them wider: closing them closes everything below.
"""
from __future__ import annotations

import os
from pathlib import Path

from pynode_os import files

DIR_MODE = 0o750


def make_dirs(path: Path, mode: int = DIR_MODE, *, narrow: bool = True) -> None:
    """pynode_os.files.make_dirs with the kubelet's mode by default."""
    files.make_dirs(path, mode, chmod=os.chmod, narrow=narrow)


def set_up_root(root_dir: Path) -> None:
    """The kubelet's root dir and pods/ at start."""
    make_dirs(root_dir)
    make_dirs(root_dir / "pods")
