"""Writes the lean plugin launchers into a CNI bin dir (the same `python -IS` shape as scripts/install-launchers.py),
and the default network (10-pynode.conflist) into a CNI conf dir that has none."""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from pynode_os.files import atomic_write

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFLIST = Path(__file__).resolve().parent / "10-pynode.conflist"
CONF_EXTENSIONS = (".conf", ".conflist", ".json")  # what a CNI runtime (libcni, go-cni) loads
EXECUTABLES = {"pybridge": "bridge", "pyhost-local": "host_local", "pyloopback": "loopback", "pyportmap": "portmap"}
TEMPLATE = """#!{python} -IS
import sys
sys.path[:0] = [{repo!r}, {site!r}]
from cni_plugins.launch import {func}
sys.exit({func}())
"""


def launchers(python: Path | None = None) -> dict[str, str]:
    """Each plugin's executable name and its launcher's text (for `python`, default this interpreter)."""
    python = python or Path(sys.executable)
    site = sysconfig.get_paths()["purelib"]
    return {name: TEMPLATE.format(python=python, repo=str(REPO), site=site, func=func)
            for name, func in EXECUTABLES.items()}


def install(directory: Path, python: Path | None = None) -> list[Path]:
    """Writes one launcher per plugin atomically; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in launchers(python).items():
        path = directory / name
        atomic_write(path, text.encode(), mode=0o755, exact=True)  # run by any user, whatever the umask
        written.append(path)
    return written


def install_conf(conf_dir: Path) -> Path | None:
    """Writes the default network (pybridge pynode0 + pyhost-local 10.85.0.0/16 + pyportmap) into `conf_dir`
    unless a network config is there already (an administrator's is never replaced); returns its path."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    if any(p.suffix in CONF_EXTENSIONS for p in conf_dir.iterdir() if p.is_file()):
        return None
    path = conf_dir / DEFAULT_CONFLIST.name
    atomic_write(path, DEFAULT_CONFLIST.read_bytes(), mode=0o644, exact=True)
    return path
