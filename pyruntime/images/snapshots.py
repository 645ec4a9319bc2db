"""Snapshots: one directory per layer, named by chain ID, stacked with overlayfs for each container.

The chain ID (OCI config.md) names a layer together with everything under it, so two images that share a base
share its snapshots. A snapshot is unpacked into `<chain>.tmp` and renamed into place only when complete,
under a per-chain file lock, so a killed unpack leaves nothing that looks committed and a concurrent one waits
and then finds the work done. A container's rootfs is an overlay mount with its own upper and work dirs; where
overlayfs cannot be mounted, the snapshots are copied, whiteouts applied, into a plain directory instead.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from pyruntime.errors import AlreadyExistsError, InvalidArgumentError
from pyruntime.fsutil import atomic_write
from pyruntime.images.content import LOCKS, check_digest
from pyruntime.images.unpack import copy_snapshot_into, usage
from pyruntime.linux import mountinfo
from pyruntime.linux.syscalls import MNT_DETACH, Syscalls

OVERLAY_OPTIONS_MAX = 4000  # the mount data page, less headroom


def chain_ids(diff_ids: list[str]) -> list[str]:
    out: list[str] = []
    for diff_id in diff_ids:
        out.append(diff_id if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest())
    return out


class SnapshotError(AlreadyExistsError):
    """A container that already has a rootfs: `prepare` claims a container id once."""


@dataclass
class SnapshotInfo:
    chain_id: str
    parent: str | None
    diff_id: str
    size: int


@dataclass
class ContainerMount:
    container_id: str
    image_id: str
    chain_id: str
    rootfs: str
    driver: str  # "overlay" or "copy"


def _mount_overlay_fsconfig(kernel: Syscalls, lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    settings = [("lowerdir+", str(p)) for p in lowers] + [("upperdir", str(upper)), ("workdir", str(work))]
    kernel.mount_with_fsconfig("overlay", settings, str(target))


def _umount(kernel: Syscalls, target: str) -> None:
    try:
        kernel.umount(target, MNT_DETACH)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOENT):
            raise


def _is_mountpoint(path: Path) -> bool:
    return mountinfo.is_mount_point(os.path.realpath(path), mountinfo.read())


def overlay_supported() -> bool:
    if os.environ.get("PYRUNTIME_SNAPSHOTTER", "overlay") == "copy" or os.geteuid() != 0:
        return False
    with open("/proc/filesystems") as f:
        return any(line.split()[-1] == "overlay" for line in f if line.strip())


class SnapshotStore:
    def __init__(self, root: Path, kernel: Syscalls) -> None:
        self.root = Path(root)
        self.kernel = kernel
        self.snapshots = self.root / "snapshots"
        self.containers = self.root / "containers"
        self.locks = self.root / "locks"
        for d in (self.snapshots, self.containers, self.locks):
            d.mkdir(parents=True, exist_ok=True)

    def dir(self, chain_id: str) -> Path:
        return self.snapshots / check_digest(chain_id)

    def fs(self, chain_id: str) -> Path:
        return self.dir(chain_id) / "fs"

    def exists(self, chain_id: str) -> bool:
        return (self.dir(chain_id) / "snapshot.json").is_file()

    def info(self, chain_id: str) -> SnapshotInfo:
        return SnapshotInfo(**json.loads((self.dir(chain_id) / "snapshot.json").read_text()))

    def list(self) -> list[SnapshotInfo]:
        out = []
        for d in self.snapshots.iterdir():
            if len(d.name) == 64 and (d / "snapshot.json").is_file():
                out.append(self.info("sha256:" + d.name))
        return out

    @contextlib.contextmanager
    def lock(self, chain_id: str) -> Iterator[None]:
        with LOCKS.hold(self.locks / f"snapshot-{check_digest(chain_id)}.lock"):
            yield

    @contextlib.contextmanager
    def create(self, chain_id: str) -> Iterator[Path]:
        """Yield an empty directory to unpack into; commit it on success. The caller holds lock(chain_id)."""
        final = self.dir(chain_id)
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a killed unpack; the lock proves nobody is writing it
        (tmp / "fs").mkdir(parents=True)
        try:
            yield tmp / "fs"
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def commit(self, chain_id: str, parent: str | None, diff_id: str) -> SnapshotInfo:
        final = self.dir(chain_id)
        tmp = final.with_name(final.name + ".tmp")
        info = SnapshotInfo(chain_id, parent, diff_id, usage(tmp / "fs"))
        atomic_write(tmp / "snapshot.json", json.dumps(asdict(info)).encode())
        os.replace(tmp, final)
        return info

    def remove(self, chain_id: str) -> None:
        with self.lock(chain_id):
            d = self.dir(chain_id)
            if not d.exists():
                return
            doomed = d.with_name(d.name + ".removing")
            os.replace(d, doomed)  # no reader can see a half-deleted snapshot under the committed name
            shutil.rmtree(doomed)

    def clean_temporary(self) -> list[Path]:
        """Unpacks and removals that were killed half way; only those whose lock is free are touched."""
        removed = []
        for d in self.snapshots.iterdir():
            if not d.name.endswith((".tmp", ".removing")):
                continue
            chain = "sha256:" + d.name.split(".", 1)[0]
            with self.lock(chain):
                if d.exists():
                    shutil.rmtree(d)
                    removed.append(d)
        return removed

    def lowers(self, chain: list[str]) -> list[Path]:
        """overlayfs wants the topmost lower first."""
        return [self.fs(c) for c in reversed(chain)]

    def container(self, container_id: str) -> ContainerMount | None:
        meta = self.containers / _safe_id(container_id) / "mount.json"
        if not meta.is_file():
            return None
        return ContainerMount(**json.loads(meta.read_text()))

    def list_containers(self) -> list[ContainerMount]:
        out = []
        for d in self.containers.iterdir():
            meta = d / "mount.json"
            if meta.is_file():
                out.append(ContainerMount(**json.loads(meta.read_text())))
        return out

    def prepare(self, container_id: str, image_id: str, chain: list[str]) -> ContainerMount:
        """A writable rootfs for one container over the image's snapshots; the same id twice is an error."""
        cdir = self.containers / _safe_id(container_id)
        with LOCKS.hold(self.locks / f"container-{_safe_id(container_id)}.lock"):
            if (cdir / "mount.json").exists():
                raise SnapshotError(f"container {container_id!r} already has a rootfs at {cdir / 'rootfs'}")
            shutil.rmtree(cdir, ignore_errors=True)
            rootfs = cdir / "rootfs"
            rootfs.mkdir(parents=True)
            driver = "copy"
            lowers = self.lowers(chain)
            if lowers and overlay_supported():
                (cdir / "upper").mkdir()
                (cdir / "work").mkdir()
                try:
                    self._mount_overlay(lowers, cdir)
                    driver = "overlay"
                except OSError:
                    driver = "copy"
            if driver == "copy":
                for lower in reversed(lowers):
                    copy_snapshot_into(self.kernel, lower, rootfs)
                top = lowers[0] if lowers else None
                if top is not None:
                    shutil.copystat(top, rootfs)
            record = ContainerMount(container_id, image_id, chain[-1] if chain else "", str(rootfs), driver)
            atomic_write(cdir / "mount.json", json.dumps(asdict(record)).encode())
            return record

    def _mount_overlay(self, lowers: list[Path], cdir: Path) -> None:
        """The classic mount data is one page; beyond that, layers are added one by one through the new mount
        API (`lowerdir+`, Linux 6.8), which has no such limit."""
        upper, work, target = cdir / "upper", cdir / "work", cdir / "rootfs"
        options = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}"
        if len(options) < OVERLAY_OPTIONS_MAX:
            self.kernel.mount("overlay", str(target), "overlay", 0, options)
        else:
            _mount_overlay_fsconfig(self.kernel, lowers, upper, work, target)

    def release(self, container_id: str) -> bool:
        cdir = self.containers / _safe_id(container_id)
        with LOCKS.hold(self.locks / f"container-{_safe_id(container_id)}.lock"):
            if not cdir.exists():
                return False
            (cdir / "mount.json").unlink(missing_ok=True)
            rootfs = cdir / "rootfs"
            if rootfs.exists() and _is_mountpoint(rootfs):
                _umount(self.kernel, str(rootfs))
            shutil.rmtree(cdir)
            return True


def _safe_id(container_id: str) -> str:
    if not container_id or "/" in container_id or container_id in (".", "..") or "\x00" in container_id:
        raise InvalidArgumentError(f"invalid container id {container_id!r}")
    return container_id
