"""The runtime CLI's start path stays off the stdlib modules that cost it milliseconds at import.

Every `pyruntime create/start/state/delete` is a fresh interpreter, so what its modules import at the
top is paid per container operation (runc's whole `start` is 4 ms). `json` imports `re` and `enum`;
`socket`, `signal` and `selectors` build enums; `collections` comes with `functools`, `contextlib`,
`array` and a `from collections.abc import` made for annotations; `typing` and `dataclasses` are larger
still. The start path uses fastjson, `_socket`, `_signal` and TYPE_CHECKING imports instead.

The TYPE_CHECKING imports, said once here for every such block in pyruntime: a module defines
`TYPE_CHECKING = False` itself (PEP 781's idiom, which type checkers read as typing.TYPE_CHECKING) and
imports under `if TYPE_CHECKING:` what it needs for annotations only, so neither `typing` nor those
modules (collections.abc, socket, the syscall layer...) are loaded by a command that runs it.
"""
from __future__ import annotations

import subprocess
import sys

START_PATH = ["pyruntime.cli.main", "pyruntime.runtime", "pyruntime.container.create", "pyruntime.container.control",
              "pyruntime.container.exec", "pyruntime.linux.capabilities", "pyruntime.linux.seccomp.profile",
              "pyruntime.linux.seccomp.compiler", "pyruntime.linux.seccomp.loader",
              "pyruntime.linux.cgroups.v1", "pyruntime.linux.cgroups.v2", "pyruntime.linux.cgroups.resources",
              "pyruntime.linux.cgroups.systemd", "pyruntime.oci.validate"]
HEAVY = {"json", "re", "enum", "socket", "signal", "selectors", "collections", "functools", "contextlib", "array",
         "typing", "dataclasses", "inspect", "subprocess", "threading", "logging", "shutil", "tempfile"}


def _loaded(modules: list[str], watched: set[str]) -> list[str]:
    """Which of `watched` a fresh interpreter (as the CLI runs: -I -S) has loaded after importing `modules`."""
    probe = (f"import sys; sys.path[:0] = {sys.path!r}; import importlib\n"
             f"for name in {modules!r}: importlib.import_module(name)\n"
             f"print(' '.join(sorted(set({sorted(watched)!r}) & set(sys.modules))))")
    return subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True,
                          check=True).stdout.split()


def test_start_path_modules_import_none_of_the_heavy_stdlib():
    assert _loaded(START_PATH, HEAVY) == []


def test_start_and_state_load_neither_the_cgroup_managers_nor_ctypes():
    """`start` (and `state` of a created container) touch no cgroup: what control.py imports at the top
    stops short of the managers and the syscall layer, a quarter of those commands' imports."""
    watched = {"ctypes", "pyruntime.linux.syscalls", "pyruntime.linux.cgroups.v1", "pyruntime.linux.cgroups.v2"}
    assert _loaded(["pyruntime.cli.main", "pyruntime.runtime", "pyruntime.container.control"], watched) == []


def test_the_systemd_driver_loads_its_d_bus_client_only_to_talk_to_systemd():
    """`--systemd-cgroup create` validates its path and builds the scope's properties before it asks systemd;
    jeepney comes with the first call (pynode_os.systemd.DBusSystemd), and never to a cgroupfs command."""
    assert _loaded([*START_PATH, "pynode_os.systemd"], {"jeepney"}) == []
