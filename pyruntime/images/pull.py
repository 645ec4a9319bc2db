"""Pull orchestration: resolve a reference, fetch and verify every blob, unpack each layer, record the image.

Blobs download in parallel and layers unpack in order as each arrives; nothing is recorded unless every blob
and layer checked out, and the record and its names are written at once (metadata.ImageDB.put). The GC lock is
held shared throughout, so nothing committed but not yet recorded is collected from under a pull.

Progress is a small typed event stream (ProgressEvent) that a caller renders as it likes: `pyruntime image
pull` draws a bar per layer, a CRI server can log or ignore it. Events arrive from download threads, so a
callback must be thread-safe.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from pyruntime.errors import InvalidArgumentError
from pyruntime.images import reference as refs
from pyruntime.images.content import ContentStore, DigestError, check_digest
from pyruntime.images.gc import GarbageCollector
from pyruntime.images.metadata import Image, ImageDB, config_summary
from pyruntime.images.registry import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    PROGRESS_TIMEOUT,
    RegistryClient,
    select_platform,
)
from pyruntime.images.request import Credentials, Platform
from pyruntime.images.snapshots import SnapshotStore, chain_ids
from pyruntime.images.unpack import apply_layer
from pyruntime.linux.syscalls import Syscalls

DOWNLOAD_WORKERS = 4

# resolving (the reference), resolved (the manifest digest), then per blob: started, downloading (done/total
# bytes), exists (already in the store) or done (downloaded and verified); per layer: unpacking, unpacked; and
# complete (the image ID) at the end.
Status = Literal["resolving", "resolved", "started", "downloading", "exists", "done", "unpacking", "unpacked",
                 "complete"]


class ManifestError(InvalidArgumentError):
    """A manifest, config or archive that is not a usable image (unsupported type, wrong diff_ids)."""


@dataclass(frozen=True)
class ProgressEvent:
    ref: str
    digest: str
    status: Status
    done: int = 0
    total: int | None = None
    layer: int | None = None  # index of the layer the blob is, None for manifests and the config
    layers: int = 0  # how many layers the image has, once known


ProgressCallback = Callable[[ProgressEvent], None]
Fetch = Callable[[dict, ProgressCallback], None]


def _ignore(event: ProgressEvent) -> None:
    pass


class Puller:
    def __init__(self, content: ContentStore, snapshots: SnapshotStore, db: ImageDB, gc: GarbageCollector, *,
                 hosts_dir: Path | None, platform: Platform, kernel: Syscalls) -> None:
        """`kernel`: what layers are unpacked through (ownership, modes, device nodes, symlinks)."""
        self.content = content
        self.snapshots = snapshots
        self.db = db
        self.gc = gc
        self.hosts_dir = hosts_dir
        self.platform = platform
        self.kernel = kernel

    def pull(self, ref: str, *, auth: Credentials | None = None, progress: ProgressCallback | None = None,
             platform: Platform | None = None, progress_timeout: float = PROGRESS_TIMEOUT) -> Image:
        """Fetch, verify and unpack an image; nothing is recorded unless every blob and layer checked out.
        A blob whose bytes stand still for `progress_timeout` seconds (0: never) fails the pull."""
        reference = refs.parse(ref)
        platform = platform or self.platform
        note = progress or _ignore
        what = str(reference)
        client = RegistryClient(reference, credentials=auth, hosts_dir=self.hosts_dir,
                                progress_timeout=progress_timeout)
        try:
            with self.gc.shared():
                note(ProgressEvent(what, "", "resolving"))
                media, digest, body = client.get_manifest(reference.object)
                index_digest = ""
                if media in INDEX_TYPES:
                    self.content.put(body, digest)
                    index_digest = digest
                    chosen = select_platform(json.loads(body), platform, what)
                    media, digest, body = client.get_manifest(chosen["digest"])
                if media not in MANIFEST_TYPES:
                    raise ManifestError(f"{reference}: unsupported manifest type {media!r} (manifest {digest})")
                note(ProgressEvent(what, digest, "resolved"))
                self.content.put(body, digest)

                def fetch(desc: dict, note: ProgressCallback) -> None:
                    def blob_note(d: str, s: str, done: int, total: int | None) -> None:
                        note(ProgressEvent(what, d, cast(Status, s), done, total))  # registry: a subset of Status
                    client.fetch_blob(self.content, desc["digest"], desc.get("size"), blob_note)

                tags = [f"{reference.name}:{reference.tag}"] if reference.tag else []
                image = self.install(json.loads(body), digest, fetch, what, note, index_digest=index_digest,
                                     tags=tags, repo_digest=f"{reference.name}@{index_digest or digest}")
        finally:
            client.close()
        note(ProgressEvent(what, image.id, "complete"))
        return image

    def install(self, manifest: dict, manifest_digest: str, fetch: Fetch, what: str, note: ProgressCallback, *,
                index_digest: str = "", tags: Iterable[str] = (), repo_digest: str | None = None) -> Image:
        """Fetch config and layers (in parallel) with `fetch`, unpack them in order as each arrives, then
        record the image. The caller holds the GC lock shared."""
        config_desc = manifest.get("config") or {}
        layers = manifest.get("layers")
        if manifest.get("schemaVersion") != 2 or not config_desc.get("digest") or layers is None:
            raise ManifestError(f"{what}: manifest {manifest_digest} is not a schema 2 image manifest")
        for desc in [config_desc, *layers]:
            check_digest(desc["digest"])
        fetch(config_desc, note)
        config = json.loads(self.content.read(config_desc["digest"]))
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        if len(diff_ids) != len(layers):
            raise ManifestError(f"{what}: config {config_desc['digest']} lists {len(diff_ids)} diff_ids "
                                f"for {len(layers)} layers")
        chain = chain_ids(diff_ids)
        n = len(layers)

        def fetch_layer(i: int, desc: dict) -> None:
            def layer_note(e: ProgressEvent) -> None:
                note(ProgressEvent(e.ref, e.digest, e.status, e.done, e.total, i, n))
            layer_note(ProgressEvent(what, desc["digest"], "started", 0, desc.get("size")))
            fetch(desc, layer_note)

        sizes = []
        with ThreadPoolExecutor(max_workers=DOWNLOAD_WORKERS) as pool:
            futures = [pool.submit(fetch_layer, i, desc) for i, desc in enumerate(layers)]
            try:
                for i, (desc, future) in enumerate(zip(layers, futures, strict=True)):
                    future.result()
                    sizes.append(self._unpack(desc, diff_ids[i], chain[:i + 1], what, note, i, n))
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        image_id = config_desc["digest"]
        record = {"manifest_digest": manifest_digest, "config_digest": image_id, "index_digest": index_digest,
                  "layers": [{"digest": d["digest"], "size": d.get("size", 0), "mediaType": d.get("mediaType", "")}
                             for d in layers],
                  "diff_ids": diff_ids, "chain_ids": chain, "repo_digests": [], "snapshot_sizes": sizes,
                  "summary": config_summary(config),
                  "size": config_desc.get("size", 0) + sum(d.get("size", 0) for d in layers)}
        return self.db.put(image_id, record, tags=tags, repo_digest=repo_digest)

    def _unpack(self, desc: dict, diff_id: str, chain: list[str], what: str, note: ProgressCallback,
                layer: int, layers: int) -> int:
        """Unpack one layer into its snapshot unless it is there already; returns the snapshot's size."""
        chain_id = chain[-1]
        with self.snapshots.lock(chain_id):
            if self.snapshots.exists(chain_id):
                return self.snapshots.info(chain_id).size
            note(ProgressEvent(what, desc["digest"], "unpacking", layer=layer, layers=layers))
            with self.snapshots.create(chain_id) as dest:
                with open(self.content.path(desc["digest"]), "rb") as blob:
                    stats = apply_layer(blob, dest, kernel=self.kernel, lowers=self.snapshots.lowers(chain[:-1]))
                if stats.diff_id != diff_id:
                    raise DigestError(f"layer {desc['digest']} of {what}: uncompressed content hashes to "
                                      f"{stats.diff_id}, but the config says diff_id {diff_id}")
                info = self.snapshots.commit(chain_id, chain[-2] if len(chain) > 1 else None, diff_id)
            note(ProgressEvent(what, desc["digest"], "unpacked", layer=layer, layers=layers))
            return info.size
