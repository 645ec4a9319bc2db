"""The plugins by executable name, imported only when a request needs one."""
from __future__ import annotations

import importlib
from collections.abc import Mapping

from cni_plugins import skel

MODULES = {
    "pybridge": "cni_plugins.bridge",
    "pyhost-local": "cni_plugins.ipam.host_local.plugin",
    "pyloopback": "cni_plugins.loopback",
    "pyportmap": "cni_plugins.portmap",
}


def run(name: str, env: Mapping[str, str], stdin: bytes) -> tuple[int, bytes]:
    module = importlib.import_module(MODULES[name])
    return skel.execute(module, env, stdin)


def preload() -> None:
    for module in MODULES.values():
        importlib.import_module(module)
