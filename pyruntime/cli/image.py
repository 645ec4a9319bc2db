"""`pyruntime image ...`: pull, list, inspect, remove, import, export, prune, mount, unmount.

click is imported here only, so the runc-compatible commands of the lean launcher never pay for it.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.settings import Settings


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.1f}{unit}" if unit != "B" else f"{int(n)}B"
        n /= 1000
    return f"{n:.1f}GB"


class _ProgressBar:
    """One row per layer on a terminal (as `ctr image pull` draws), redrawn at most ten times a second; plain
    lines for finished steps otherwise, so a log stays readable."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.rows: dict[str, str] = {}
        self.lock = threading.Lock()
        self.last = 0.0
        self.drawn = 0

    def __call__(self, event) -> None:
        with self.lock:
            short = event.digest.removeprefix("sha256:")[:12]
            if event.status in ("resolving", "resolved", "complete"):  # the reference's own row
                key, row = event.ref, f"{event.ref}: {event.status} {short}".rstrip()
            else:
                key = short
                name = f"layer {event.layer + 1}/{event.layers} {short}" if event.layer is not None else short
                if event.status == "downloading" and event.total:
                    frac = min(event.done / event.total, 1)
                    bar = "=" * int(frac * 30) + (">" if frac < 1 else "") + " " * (30 - int(frac * 30))
                    row = f"{name}: [{bar[:30]}] {_human(event.done)}/{_human(event.total)}"
                else:
                    row = f"{name}: {'waiting' if event.status == 'started' else event.status}"
            self.rows[key] = row
            if not self.tty and event.status in ("done", "exists", "unpacked", "complete"):
                print(row, file=self.stream, flush=True)
            if self.tty and (time.monotonic() - self.last > 0.1 or event.status != "downloading"):
                self.last = time.monotonic()
                if self.drawn:
                    self.stream.write(f"\x1b[{self.drawn}F")
                for row in self.rows.values():
                    self.stream.write(f"\x1b[2K{row}\n")
                self.drawn = len(self.rows)
                self.stream.flush()


def main(argv: list[str], settings: Settings | None = None) -> int:
    """`settings`: the ones `pyruntime`'s main built from its global flags and the environment; read
    from the environment (pyruntime.settings, the one place that does) when run on its own. The image
    flags override them."""
    import click

    from pyruntime.cli import errors as exits
    from pyruntime.errors import InvalidArgumentError
    from pyruntime.images.metadata import ImageNotFound
    from pyruntime.images.request import Credentials, Platform
    from pyruntime.images.store import ImageStore
    from pyruntime.settings import SNAPSHOTTERS
    from pyruntime.settings import Settings as _Settings

    base = settings if settings is not None else _Settings.from_env()

    def store(ctx: click.Context) -> ImageStore:
        s: Settings = ctx.obj["settings"]
        platform = ctx.obj["platform"]
        return ImageStore(s.image_root, hosts_dir=Path(s.hosts_dir),
                          platform=Platform.parse(platform) if platform else None, snapshotter=s.snapshotter)

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--root", default=base.image_root, show_default=True,
                  help="image store directory [env PYRUNTIME_IMAGE_ROOT]")
    @click.option("--hosts-dir", default=base.hosts_dir, show_default=True,
                  help="directory of <registry>/hosts.toml files (mirrors, CA bundles) [env PYRUNTIME_REGISTRY_CONFIG]")
    @click.option("--snapshotter", type=click.Choice(SNAPSHOTTERS), default=base.snapshotter,
                  show_default=True, help="how container rootfs are made [env PYRUNTIME_SNAPSHOTTER]")
    @click.option("--platform", default=None, help="os/arch[/variant] to pull from a multi-arch index")
    @click.pass_context
    def cli(ctx: click.Context, root: str, hosts_dir: str, snapshotter: str, platform: str | None) -> None:
        ctx.obj = {"settings": base.replace(image_root=root, hosts_dir=hosts_dir, snapshotter=snapshotter),
                   "platform": platform}

    @cli.command()
    @click.argument("ref")
    @click.option("--creds", default=None,
                  help="USER:PASSWORD for this pull's registry [else env PYRUNTIME_REGISTRY_CREDS, HOST=USER:PASSWORD, "
                       "when HOST is its registry]")
    @click.option("-q", "--quiet", is_flag=True, help="print only the image ID")
    @click.pass_context
    def pull(ctx: click.Context, ref: str, creds: str | None, quiet: bool) -> None:
        """Pull an image from a registry and unpack it."""
        from pyruntime.images import reference
        try:
            auth = Credentials.parse(creds) if creds else None
        except ValueError as e:
            raise InvalidArgumentError(f"--creds: {e}") from e
        scoped = ctx.obj["settings"].registry_creds
        if auth is None and scoped:
            try:
                host, node_auth = Credentials.parse_scoped(scoped)
            except ValueError as e:
                raise InvalidArgumentError(f"PYRUNTIME_REGISTRY_CREDS: {e}") from e
            auth = node_auth if reference.parse(ref).domain == host else None
        progress = None if quiet else _ProgressBar(sys.stderr)
        image = store(ctx).pull(ref, auth=auth, progress=progress)
        click.echo(image.id)

    @cli.command("list")
    @click.option("-q", "--quiet", is_flag=True, help="only image IDs")
    @click.option("--json", "as_json", is_flag=True)
    @click.pass_context
    def list_(ctx: click.Context, quiet: bool, as_json: bool) -> None:
        """List images with their names, IDs and sizes."""
        images = store(ctx).list()
        if as_json:
            click.echo(json.dumps([i.to_dict() for i in images], indent=2))
            return
        if quiet:
            for i in images:
                click.echo(i.id)
            return
        click.echo(f"{'IMAGE':<60} {'ID':<13} {'SIZE':>9} {'DISK':>9}")
        for i in images:
            for name in i.repo_tags or ["<none>"]:
                click.echo(f"{name:<60} {i.id.removeprefix('sha256:')[:12]:<13} {_human(i.size):>9} "
                           f"{_human(i.disk_usage):>9}")

    @cli.command()
    @click.argument("refs", nargs=-1, required=True)
    @click.pass_context
    def inspect(ctx: click.Context, refs: tuple[str, ...]) -> None:
        """Print images' metadata and config as JSON."""
        s = store(ctx)
        out = [s.get(r).to_dict() for r in refs]
        click.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2))

    @cli.command()
    @click.argument("refs", nargs=-1, required=True)
    @click.option("-f", "--force", is_flag=True, help="remove even if a container rootfs uses it")
    @click.pass_context
    def remove(ctx: click.Context, refs: tuple[str, ...], force: bool) -> None:
        """Untag images; an image left without names is deleted with what only it used."""
        s = store(ctx)
        for r in refs:
            deleted = s.remove(r, force=force)
            click.echo(f"Untagged: {r}")
            for d in deleted:
                click.echo(f"Deleted: {d}")

    @cli.command("import")
    @click.argument("path", type=click.Path(exists=True))
    @click.option("--name", default=None, help="reference for an archive that carries only a tag or none")
    @click.pass_context
    def import_(ctx: click.Context, path: str, name: str | None) -> None:
        """Import an OCI image layout or docker-archive (directory or tar)."""
        for image in store(ctx).import_archive(path, name=name):
            click.echo(f"{image.id} {' '.join(image.repo_tags)}".rstrip())

    @cli.command()
    @click.argument("refs", nargs=-1, required=True)
    @click.option("-o", "--output", required=True, type=click.Path(), help="tar file to write")
    @click.pass_context
    def export(ctx: click.Context, refs: tuple[str, ...], output: str) -> None:
        """Export images as one tar that is both an OCI layout and a docker-archive."""
        store(ctx).export(list(refs), output)

    @cli.command()
    @click.option("--dangling", is_flag=True, help="only images without a tag")
    @click.pass_context
    def prune(ctx: click.Context, dangling: bool) -> None:
        """Remove images no container uses, then unreferenced snapshots, blobs and partial downloads."""
        report = store(ctx).prune(dangling_only=dangling)
        for i in report.images:
            click.echo(f"Deleted: {i}")
        click.echo(f"Reclaimed {_human(report.reclaimed)}")

    @cli.command()
    @click.argument("ref")
    @click.argument("container_id")
    @click.pass_context
    def mount(ctx: click.Context, ref: str, container_id: str) -> None:
        """Prepare a writable rootfs for a container and print its path."""
        click.echo(store(ctx).prepare_rootfs(ref, container_id))

    @cli.command()
    @click.argument("container_id")
    @click.pass_context
    def unmount(ctx: click.Context, container_id: str) -> None:
        """Release a container's rootfs."""
        if not store(ctx).release_rootfs(container_id):
            raise ImageNotFound(f"no rootfs for container {container_id!r}")

    try:
        cli.main(args=argv, prog_name="pyruntime image", standalone_mode=False)
    except click.exceptions.Abort:
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if exits.is_bug(e):
            raise
        status, line = exits.report(e)
        print(f"pyruntime image: {line}", file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
