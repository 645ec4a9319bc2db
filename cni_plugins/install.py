"""Writes the lean plugin launchers into a CNI bin dir (the same `python -IS` shape as scripts/install-launchers.py)."""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from cni_plugins.fsutil import atomic_write

REPO = Path(__file__).resolve().parent.parent
EXECUTABLES = {"pybridge": "bridge", "pyhost-local": "host_local", "pyloopback": "loopback"}
TEMPLATE = """#!{python} -IS
import sys
sys.path[:0] = [{repo!r}, {site!r}]
from cni_plugins.launch import {func}
sys.exit({func}())
"""


def install(directory: Path, python: Path | None = None) -> list[Path]:
    """Writes one launcher per plugin atomically; returns their paths."""
    python = python or Path(sys.executable)
    site = sysconfig.get_paths()["purelib"]
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, func in EXECUTABLES.items():
        path = directory / name
        atomic_write(path, TEMPLATE.format(python=python, repo=str(REPO), site=site, func=func), 0o755)
        written.append(path)
    return written
