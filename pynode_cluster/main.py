"""`pynode`: the product's own command, so that a node runs from the installed package (a wheel, no checkout);
`make run` and `make stop` call it. `pynode run` starts a node on this machine without an API server,
`pynode stop` removes it (standalone.py)."""
from __future__ import annotations

import os
import sys

import click

from pynode_cluster import standalone


def _as_root(command: str) -> None:
    if os.geteuid() != 0:
        raise click.ClickException(f"`pynode {command}` must run as root")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A Kubernetes node in pure Python: pyruntime-cri, pykubelet and the CNI plugins, on this machine."""


@main.command()
def run() -> None:
    """Start a node in the background (pyruntime-cri, pykubelet without an API server, a static pod serving
    HTTP) and print its pod's IP and answer; a node already running is left as it is."""
    _as_root("run")
    sys.exit(standalone.up())


@main.command()
def stop() -> None:
    """Remove what `pynode run` made: the pod, pykubelet, pyruntime-cri, the pod network and the node's state."""
    _as_root("stop")
    sys.exit(standalone.down())
