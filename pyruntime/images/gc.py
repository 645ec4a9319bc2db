"""Garbage collection: mark what image records and container rootfs name, sweep every other snapshot and blob.

Nothing keeps a reference count that a crash could leave wrong: the live set is computed from the records
each time (containerd's mark and sweep). Users of the store's content (pulls, imports, rootfs preparation and
release) hold the GC lock shared and the collector holds it exclusive, so a blob or snapshot that a pull has
committed but not yet recorded is never collected from under it, and lock files can be deleted safely.
"""
from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pyruntime.images.content import ContentStore, flock
from pyruntime.images.metadata import ImageDB
from pyruntime.images.snapshots import SnapshotStore


@dataclass
class PruneReport:
    images: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    reclaimed: int = 0


class GarbageCollector:
    def __init__(self, root: Path, db: ImageDB, content: ContentStore, snapshots: SnapshotStore) -> None:
        self.locks = Path(root) / "locks"
        self.db = db
        self.content = content
        self.snapshots = snapshots
        self._lock = self.locks / "gc.lock"

    def shared(self) -> contextlib.AbstractContextManager[None]:
        """Held while adding content that is not recorded yet, or using a container's rootfs record."""
        return flock(self._lock, fcntl.LOCK_SH)

    def prune(self, *, dangling_only: bool = False, keep: Iterable[str] = ()) -> PruneReport:
        """Delete images no container uses (only untagged ones if dangling_only), then collect garbage."""
        report = PruneReport()
        with self.db.transaction(write=True) as db:
            kept = {self.db.resolve_id(db, k) for k in keep}
            used = {m.image_id for m in self.snapshots.list_containers()}
            tagged = set(db["tags"].values())
            for image_id in list(db["images"]):
                if image_id in used or image_id in kept or (dangling_only and image_id in tagged):
                    continue
                for t in [t for t, i in db["tags"].items() if i == image_id]:
                    del db["tags"][t]
                del db["images"][image_id]
                report.images.append(image_id)
        collected = self.collect()
        report.snapshots, report.blobs, report.reclaimed = collected.snapshots, collected.blobs, collected.reclaimed
        return report

    def collect(self) -> PruneReport:
        """Mark and sweep: snapshots and blobs that no image record or container mount names are deleted."""
        report = PruneReport()
        with flock(self._lock, fcntl.LOCK_EX):
            with self.db.transaction(write=False) as db:
                live_chains: set[str] = set()
                live_blobs: set[str] = set()
                for rec in db["images"].values():
                    live_chains.update(rec["chain_ids"])
                    live_blobs.update([rec["manifest_digest"], rec["config_digest"]]
                                      + [d["digest"] for d in rec["layers"]])
                    if rec.get("index_digest"):
                        live_blobs.add(rec["index_digest"])
                for mount in self.snapshots.list_containers():
                    rec = db["images"].get(mount.image_id)
                    live_chains.update(rec["chain_ids"] if rec else [])
                    if not rec and mount.chain_id:
                        live_chains.add(mount.chain_id)
                for snap in self.snapshots.list():
                    if snap.chain_id not in live_chains:
                        self.snapshots.remove(snap.chain_id)
                        report.snapshots.append(snap.chain_id)
                        report.reclaimed += snap.size
                for digest in self.content.list():
                    if digest not in live_blobs:
                        report.reclaimed += self.content.size(digest)
                        self.content.delete(digest)
                        report.blobs.append(digest)
            self.snapshots.clean_temporary()
            self.content.clean_ingest()
            self._clean_locks()
        return report

    def _clean_locks(self) -> None:
        """Lock files of blobs, snapshots and containers that are gone. Safe only under the exclusive GC lock,
        which every user of those locks holds shared."""
        live = {d.removeprefix("sha256:") for d in self.content.list()}
        live |= {s.chain_id.removeprefix("sha256:") for s in self.snapshots.list()}
        live |= {f"container-{m.container_id}" for m in self.snapshots.list_containers()}
        for lock in self.locks.iterdir():
            kind, _, key = lock.stem.partition("-")
            partial = self.content.ingest / f"{key}.partial"
            unused_blob_or_snapshot = kind in ("blob", "snapshot") and key not in live and not partial.exists()
            if unused_blob_or_snapshot or (kind == "container" and lock.stem not in live):
                lock.unlink(missing_ok=True)
