"""`python -m cni_plugins install --dir DIR` and `helper stop`: the administrative commands."""
from __future__ import annotations

from pathlib import Path

import click

from cni_plugins import helper, launch
from cni_plugins.install import install, install_conf


@click.group()
def cli() -> None:
    """pybridge, pyhost-local, pyloopback and pyportmap CNI plugins."""


@cli.command("install")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="CNI bin dir to write the plugin launchers into")
@click.option("--conf-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="CNI conf dir to write the default network (10-pynode.conflist) into, unless it has one")
def install_cmd(directory: Path, conf_dir: Path | None) -> None:
    """Write the plugin executables into a CNI bin dir (and the default network into a conf dir)."""
    for path in install(directory):
        click.echo(str(path))
    if conf_dir is not None:
        written = install_conf(conf_dir)
        click.echo(str(written) if written else f"{conf_dir} has a network config already: left as it is")


@cli.command("helper-stop")
@click.option("--socket", "name", default=None,
              help=f"the helper's socket name (default $PYCNI_HELPER_SOCKET or {launch.DEFAULT_NAME})")
def helper_stop(name: str | None) -> None:
    """Stop the resident helper of this network namespace."""
    click.echo("stopped" if helper.stop(name or launch.socket_name()) else "no helper running")


if __name__ == "__main__":
    cli()
