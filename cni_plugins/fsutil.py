"""Replacing a file so that a reader or a crash sees the old content or the new, never a torn mix.

The plugin launchers (install.py) are written this way: a temporary file in the same directory, fsync,
rename over the target, fsync of the directory, so a crash mid-install never leaves a torn launcher.
pyruntime has the same helper (pyruntime/fsutil.py); cni_plugins keeps its own because it imports
nothing of pyruntime (the plugins run on nodes with any runtime).
"""
from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """The temporary name keeps the target's as a prefix, so a file killed half way is skipped by
    whatever skips the target."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)  # the umask may have narrowed the mode O_CREAT set
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
