"""Snapshots: one directory per layer, named by chain ID, and per container the mounts that stack them.

The chain ID (OCI config.md) names a layer together with everything under it, so two images that share a base
share its snapshots. A snapshot is unpacked into `<chain>.tmp` and renamed into place only when complete,
under a per-chain file lock, so a killed unpack leaves nothing that looks committed and a concurrent one waits
and then finds the work done.

Preparing a container's rootfs (containerd's Snapshotter.Prepare) only makes directories and a record: the
record carries the mounts to make (`mount.Mount`), an overlay with the container's own upper and work dirs,
or, for the copy snapshotter (where overlayfs cannot be mounted), a bind of a plain directory into which the
snapshots were copied with their whiteouts applied. Mounting is the caller's job (`mount.mount_all`), so this
module needs no root and a CRI server chooses the target.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pynode_os.files import atomic_write
from pyruntime.errors import AlreadyExistsError, FailedPreconditionError, InvalidArgumentError
from pyruntime.images.content import LOCKS, check_digest
from pyruntime.images.mount import Mount, is_mountpoint
from pyruntime.images.unpack import copy_snapshot_into, usage
from pyruntime.linux.syscalls import Syscalls

SNAPSHOTTERS = ("overlay", "copy")


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
    """A container's prepared rootfs: `mounts` made at `rootfs` (or anywhere else) give its filesystem."""
    container_id: str
    image_id: str
    chain_id: str
    rootfs: str  # where `pyruntime image mount` mounts it; a CRI server may choose another target
    driver: str  # "overlay" or "copy"
    mounts: list[Mount] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(asdict(self), mounts=[m.to_dict() for m in self.mounts])

    @classmethod
    def from_dict(cls, d: dict) -> ContainerMount:
        return cls(**dict(d, mounts=[Mount.from_dict(m) for m in d.get("mounts") or []]))


def overlay_supported(snapshotter: str = "overlay") -> bool:
    if snapshotter == "copy" or os.geteuid() != 0:
        return False
    with open("/proc/filesystems") as f:
        return any(line.split()[-1] == "overlay" for line in f if line.strip())


class SnapshotStore:
    def __init__(self, root: Path, kernel: Syscalls, snapshotter: str = "overlay") -> None:
        """`kernel` makes the copy snapshotter's device nodes and ownership; nothing here mounts."""
        if snapshotter not in SNAPSHOTTERS:
            raise InvalidArgumentError(f"snapshotter: {snapshotter!r} is not one of {', '.join(SNAPSHOTTERS)}")
        self.root = Path(root)
        self.kernel = kernel
        self.snapshotter = snapshotter
        self.snapshots = self.root / "snapshots"
        self.containers = self.root / "containers"
        self.locks = self.root / "locks"
        for d in (self.snapshots, self.containers, self.locks):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)  # the store's root (store.py) is what closes them

    def dir(self, chain_id: str) -> Path:
        return self.snapshots / check_digest(chain_id)

    def fs(self, chain_id: str) -> Path:
        return self.dir(chain_id) / "fs"

    def exists(self, chain_id: str) -> bool:
        return (self.dir(chain_id) / "snapshot.json").is_file()

    def info(self, chain_id: str) -> SnapshotInfo:
        return SnapshotInfo(**json.loads((self.dir(chain_id) / "snapshot.json").read_text()))

    def list(self) -> builtins.list[SnapshotInfo]:
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

    def clean_temporary(self) -> builtins.list[Path]:
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

    def lowers(self, chain: builtins.list[str]) -> builtins.list[Path]:
        """overlayfs wants the topmost lower first."""
        return [self.fs(c) for c in reversed(chain)]

    def container(self, container_id: str) -> ContainerMount | None:
        meta = self.containers / _safe_id(container_id) / "mount.json"
        if not meta.is_file():
            return None
        return ContainerMount.from_dict(json.loads(meta.read_text()))

    def list_containers(self) -> builtins.list[ContainerMount]:
        out = []
        for d in self.containers.iterdir():
            meta = d / "mount.json"
            if meta.is_file():
                out.append(ContainerMount.from_dict(json.loads(meta.read_text())))
        return out

    def prepare(self, container_id: str, image_id: str, chain: builtins.list[str], *,
                driver: str | None = None) -> ContainerMount:
        """A writable rootfs for one container over the image's snapshots, as the mounts that make it; the
        same id twice is an error. `driver` overrides the store's snapshotter (a refused overlay falls back)."""
        cdir = self.containers / _safe_id(container_id)
        with LOCKS.hold(self.locks / f"container-{_safe_id(container_id)}.lock"):
            if (cdir / "mount.json").exists():
                raise SnapshotError(f"container {container_id!r} already has a rootfs at {cdir / 'rootfs'}")
            shutil.rmtree(cdir, ignore_errors=True)
            rootfs = cdir / "rootfs"
            rootfs.mkdir(parents=True)
            lowers = self.lowers(chain)
            driver = driver or ("overlay" if lowers and overlay_supported(self.snapshotter) else "copy")
            if driver == "overlay":
                upper, work = cdir / "upper", cdir / "work"
                upper.mkdir()
                work.mkdir()
                mounts = [Mount("overlay", "overlay", [f"lowerdir={':'.join(str(p) for p in lowers)}",
                                                       f"upperdir={upper}", f"workdir={work}"])]
            else:
                for lower in reversed(lowers):
                    copy_snapshot_into(self.kernel, lower, rootfs)
                if lowers:
                    shutil.copystat(lowers[0], rootfs)
                mounts = [Mount("bind", str(rootfs), ["rbind", "rw"])]
            record = ContainerMount(container_id, image_id, chain[-1] if chain else "", str(rootfs), driver, mounts)
            atomic_write(cdir / "mount.json", json.dumps(record.to_dict()).encode())
            return record

    def release(self, container_id: str) -> bool:
        """Forget a container's rootfs and delete its writable layer; its mounts must already be gone, so that
        nothing is deleted through a live overlay."""
        cdir = self.containers / _safe_id(container_id)
        with LOCKS.hold(self.locks / f"container-{_safe_id(container_id)}.lock", remove=True):
            if not cdir.exists():
                return False
            rootfs = cdir / "rootfs"
            if rootfs.exists() and is_mountpoint(rootfs):
                raise FailedPreconditionError(f"container {container_id!r}: {rootfs} is still mounted; "
                                              "unmount it first")
            (cdir / "mount.json").unlink(missing_ok=True)
            shutil.rmtree(cdir)
            return True


def _safe_id(container_id: str) -> str:
    if not container_id or "/" in container_id or container_id in (".", "..") or "\x00" in container_id:
        raise InvalidArgumentError(f"invalid container id {container_id!r}")
    return container_id
