"""Writes lean launchers for the commands whose start-up time is the product.

pip's console scripts run the interpreter with `site`, a cost of its own in a venv; these launchers run
`python -I -S` and put only the repository and the venv's site-packages on sys.path, so a container or a
CNI ADD pays for nothing it does not import, and they skip the interpreter's teardown at the end.
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

# The cyclic GC's first threshold goes from 700 allocations to 100,000: the imports alone triggered a dozen
# collections in each command; a command that runs long (`run` in the foreground, `events`) still
# collects, less often. The end skips the interpreter's teardown (freeing every module and object, in
# each command) with os._exit once the output is flushed. Not when threads were started (the teardown
# joins them) or a flush fails (the interpreter then reports it, with its status 120 unless the command
# handled it).
TEMPLATE = """#!{python} -IS
import gc
gc.set_threshold(100_000)
import sys
sys.path[:0] = [{repo!r}, {site!r}]
from {module} import {func}
status = {func}()
if "threading" in sys.modules:
    sys.exit(status)
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    sys.exit(status)
import os
os._exit(status or 0)
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
