"""Writes lean launchers for the commands whose start-up time is the product.

pip's console scripts run the interpreter with `site`, which costs ~15 ms in a venv; these launchers run
`python -I -S` and put only the repository and the venv's site-packages on sys.path, so a container or a
CNI ADD pays for nothing it does not import.
"""
import os
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# command name -> "module:function"
LAUNCHERS = {
    "pyruntime": "pyruntime.cli.main:main",
    "pybridge": "cni_plugins.launch:bridge",
    "pyhost-local": "cni_plugins.launch:host_local",
    "pyloopback": "cni_plugins.launch:loopback",
    "pyportmap": "cni_plugins.launch:portmap",
}

TEMPLATE = """#!{python} -IS
import sys
sys.path[:0] = [{repo!r}, {site!r}]
from {module} import {func}
sys.exit({func}())
"""


def main() -> None:
    venv = Path(sys.argv[1]).resolve()
    python = venv / "bin" / "python3"
    site = sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]
    for name, target in LAUNCHERS.items():
        module, func = target.split(":")
        path = venv / "bin" / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(TEMPLATE.format(python=python, repo=str(REPO), site=site, module=module, func=func))
        tmp.chmod(0o755)
        os.replace(tmp, path)


if __name__ == "__main__":
    main()
