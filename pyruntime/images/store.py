"""The image store: names to images, images to blobs and snapshots, and the garbage collector.

Layout under the root (default /var/lib/pyruntime/images):
  blobs/sha256/<hex>        verified content (manifests, configs, layers)       -- content.py
  ingest/<hex>.partial      downloads in progress, kept for resume
  snapshots/<chain hex>/fs  one unpacked layer each, overlayfs lower format   -- snapshots.py
  containers/<id>/          a container's rootfs mount, upper and work dirs
  images.json               image records and the tag table, rewritten atomically under locks/metadata.lock

Reference counts are not stored: a snapshot or blob is in use while an image record or a container mount names
it, and the collector computes that from the records each time, so a crash can never leave a count wrong.
Pulls hold the GC lock shared and the collector holds it exclusive, so nothing a pull has committed but not yet
recorded is collected from under it.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import tarfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyruntime.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from pyruntime.fsutil import atomic_file, atomic_write
from pyruntime.images import reference as refs
from pyruntime.images.content import ContentStore, DigestError, check_digest, sha256_digest
from pyruntime.images.registry import (INDEX_TYPES, MANIFEST_TYPES, MEDIA_DOCKER_MANIFEST, MEDIA_OCI_INDEX,
                                       MEDIA_OCI_MANIFEST, Credentials, Platform, RegistryClient,
                                       select_platform)
from pyruntime.images.snapshots import ContainerMount, SnapshotStore, chain_ids
from pyruntime.images.unpack import apply_layer
from pyruntime.linux import resolve
from pyruntime.linux.syscalls import LinuxSyscalls, Syscalls

DEFAULT_ROOT = Path(os.environ.get("PYRUNTIME_IMAGE_ROOT", "/var/lib/pyruntime/images"))
MEDIA_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
CONTAINERD_NAME_ANNOTATION = "io.containerd.image.name"
DOWNLOAD_WORKERS = 4


class ImageNotFound(NotFoundError):
    """No image has that name or id, or a blob an image needs is missing from the store."""


class ImageInUse(FailedPreconditionError):
    """The image backs a container's rootfs; removal needs `force` or the container gone first."""


class ManifestError(InvalidArgumentError):
    """A manifest, config or archive that is not a usable image (unsupported type, wrong diff_ids)."""


@dataclass
class ImageConfig:
    """The parts of the image config a runtime and the kubelet need."""
    env: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    working_dir: str = ""
    user: str = ""
    exposed_ports: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    stop_signal: str = ""

    @classmethod
    def from_blob(cls, config: dict) -> "ImageConfig":
        c = config.get("config") or {}
        return cls(env=list(c.get("Env") or []), entrypoint=list(c.get("Entrypoint") or []),
                   cmd=list(c.get("Cmd") or []), working_dir=c.get("WorkingDir") or "", user=c.get("User") or "",
                   exposed_ports=sorted(c.get("ExposedPorts") or {}), volumes=sorted(c.get("Volumes") or {}),
                   labels=dict(c.get("Labels") or {}), stop_signal=c.get("StopSignal") or "")


@dataclass
class Image:
    id: str  # the config digest, as docker and CRI use it
    repo_tags: list[str]
    repo_digests: list[str]
    manifest_digest: str
    config_digest: str
    layers: list[dict]
    diff_ids: list[str]
    chain_ids: list[str]
    os: str
    architecture: str
    variant: str
    created: str
    size: int  # bytes of compressed content (config + layers), what a registry would transfer
    disk_usage: int = 0  # bytes of the unpacked snapshots on disk
    unique_size: int = 0  # of which not shared with any other image
    config: ImageConfig = field(default_factory=ImageConfig)
    index_digest: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PruneReport:
    images: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    reclaimed: int = 0


@dataclass
class ProgressEvent:
    ref: str
    digest: str
    status: str  # resolving, resolved, downloading, exists, done, unpacking, unpacked, complete
    done: int = 0
    total: int | None = None


ProgressCallback = Callable[[ProgressEvent], None]


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


class ImageStore:
    def __init__(self, root: Path | str | None = None, *, hosts_dir: Path | None = None,
                 platform: Platform | None = None, kernel: Syscalls | None = None) -> None:
        """`kernel`: the syscall layer snapshots are mounted and layers unpacked through (the real one by default)."""
        self.root = Path(root) if root is not None else DEFAULT_ROOT
        self.root.mkdir(parents=True, exist_ok=True)
        self.kernel = kernel or LinuxSyscalls()
        self.content = ContentStore(self.root)
        self.snapshots = SnapshotStore(self.root, self.kernel)
        self.hosts_dir = hosts_dir
        self.platform = platform or Platform()
        self._db = self.root / "images.json"
        self._meta_lock = self.root / "locks" / "metadata.lock"
        self._gc_lock = self.root / "locks" / "gc.lock"
        self._thread_lock = threading.RLock()

    # ---- metadata -------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _metadata(self, write: bool) -> Iterator[dict]:
        with self._thread_lock, _flock(self._meta_lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH):
            db = json.loads(self._db.read_text()) if self._db.exists() else {"images": {}, "tags": {}}
            yield db
            if write:
                atomic_write(self._db, json.dumps(db, indent=1, sort_keys=True).encode())

    def _gc_shared(self) -> contextlib.AbstractContextManager[None]:
        return _flock(self._gc_lock, fcntl.LOCK_SH)

    def _resolve_id(self, db: dict, ref_or_id: str) -> str:
        if refs.is_image_id(ref_or_id):
            wanted = "sha256:" + ref_or_id.removeprefix("sha256:")
            if wanted in db["images"]:
                return wanted
        else:
            short = ref_or_id.removeprefix("sha256:")
            if 12 <= len(short) < 64 and all(c in "0123456789abcdef" for c in short):
                hits = [i for i in db["images"] if i.startswith("sha256:" + short)]
                if len(hits) == 1:
                    return hits[0]
        try:
            ref = refs.parse(ref_or_id)
        except refs.ReferenceError:
            raise ImageNotFound(f"image {ref_or_id!r} not found (not an image ID or a valid reference)") from None
        if ref.digest:
            for image_id, rec in db["images"].items():
                if f"{ref.name}@{ref.digest}" in rec["repo_digests"]:
                    return image_id
        elif str(ref) in db["tags"]:
            return db["tags"][str(ref)]
        raise ImageNotFound(f"image {ref_or_id!r} not found")

    def _image(self, db: dict, image_id: str, usage: dict[str, int] | None = None) -> Image:
        rec = db["images"][image_id]
        tags = sorted(t for t, i in db["tags"].items() if i == image_id)
        config = json.loads(self.content.read(rec["config_digest"]))
        usage = usage if usage is not None else self._snapshot_usage()
        sharers: dict[str, int] = {}
        for other in db["images"].values():
            for c in set(other["chain_ids"]):
                sharers[c] = sharers.get(c, 0) + 1
        disk = sum(usage.get(c, 0) for c in rec["chain_ids"])
        unique = sum(usage.get(c, 0) for c in rec["chain_ids"] if sharers.get(c, 0) <= 1)
        return Image(id=image_id, repo_tags=tags, repo_digests=sorted(rec["repo_digests"]),
                     manifest_digest=rec["manifest_digest"], config_digest=rec["config_digest"],
                     layers=rec["layers"], diff_ids=rec["diff_ids"], chain_ids=rec["chain_ids"],
                     os=config.get("os", ""), architecture=config.get("architecture", ""),
                     variant=config.get("variant", ""), created=config.get("created", ""),
                     size=rec["size"], disk_usage=disk, unique_size=unique, config=ImageConfig.from_blob(config),
                     index_digest=rec.get("index_digest", ""))

    def _snapshot_usage(self) -> dict[str, int]:
        return {s.chain_id: s.size for s in self.snapshots.list()}

    # ---- queries --------------------------------------------------------------------------------------------

    def list(self) -> list[Image]:
        with self._metadata(write=False) as db:
            usage = self._snapshot_usage()
            return [self._image(db, i, usage) for i in sorted(db["images"])]

    def get(self, ref_or_id: str) -> Image:
        with self._metadata(write=False) as db:
            return self._image(db, self._resolve_id(db, ref_or_id))

    def refcounts(self) -> dict[str, int]:
        """Users of each snapshot: images whose chain includes it plus containers running on it."""
        counts = {s.chain_id: 0 for s in self.snapshots.list()}
        with self._metadata(write=False) as db:
            for rec in db["images"].values():
                for c in rec["chain_ids"]:
                    counts[c] = counts.get(c, 0) + 1
            for mount in self.snapshots.list_containers():
                rec = db["images"].get(mount.image_id)
                for c in (rec["chain_ids"] if rec else []):
                    counts[c] = counts.get(c, 0) + 1
        return counts

    # ---- pull -----------------------------------------------------------------------------------------------

    def pull(self, ref: str, *, auth: Credentials | None = None, progress: ProgressCallback | None = None,
             platform: Platform | None = None) -> Image:
        """Fetch, verify and unpack an image; nothing is recorded unless every blob and layer checked out."""
        reference = refs.parse(ref)
        platform = platform or self.platform
        note = progress or (lambda e: None)
        client = RegistryClient(reference, credentials=auth, hosts_dir=self.hosts_dir)
        try:
            with self._gc_shared():
                note(ProgressEvent(str(reference), "", "resolving"))
                media, digest, body = client.get_manifest(reference.object)
                index_digest = ""
                if media in INDEX_TYPES:
                    self.content.put(body, digest)
                    index_digest = digest
                    chosen = select_platform(json.loads(body), platform, str(reference))
                    media, digest, body = client.get_manifest(chosen["digest"])
                if media not in MANIFEST_TYPES:
                    raise ManifestError(f"{reference}: unsupported manifest type {media!r} (manifest {digest})")
                note(ProgressEvent(str(reference), digest, "resolved"))
                manifest = json.loads(body)
                self.content.put(body, digest)

                def fetch(desc: dict) -> None:
                    client.fetch_blob(self.content, desc["digest"], desc.get("size"),
                                      lambda d, s, done, total: note(ProgressEvent(str(reference), d, s, done,
                                                                                   total)))

                tags = [f"{reference.name}:{reference.tag}"] if reference.tag else []
                image = self._install(manifest, digest, fetch, str(reference), note, index_digest=index_digest,
                                      tags=tags, repo_digest=f"{reference.name}@{index_digest or digest}")
        finally:
            client.close()
        note(ProgressEvent(str(reference), image.id, "complete"))
        return image

    def _install(self, manifest: dict, manifest_digest: str, fetch: Callable[[dict], None], what: str,
                 note: ProgressCallback, *, index_digest: str = "", tags: Iterable[str] = (),
                 repo_digest: str | None = None) -> Image:
        """Fetch config and layers (in parallel), unpack them in order as each arrives, then record the image
        and its names in one metadata write, so no other process ever sees it nameless (and prunable)."""
        config_desc = manifest.get("config") or {}
        layers = manifest.get("layers")
        if manifest.get("schemaVersion") != 2 or not config_desc.get("digest") or layers is None:
            raise ManifestError(f"{what}: manifest {manifest_digest} is not a schema 2 image manifest")
        for desc in [config_desc, *layers]:
            check_digest(desc["digest"])
        fetch(config_desc)
        config = json.loads(self.content.read(config_desc["digest"]))
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        if len(diff_ids) != len(layers):
            raise ManifestError(f"{what}: config {config_desc['digest']} lists {len(diff_ids)} diff_ids "
                                f"for {len(layers)} layers")
        chain = chain_ids(diff_ids)
        with ThreadPoolExecutor(max_workers=DOWNLOAD_WORKERS) as pool:
            futures = [pool.submit(fetch, desc) for desc in layers]
            try:
                for i, (desc, future) in enumerate(zip(layers, futures)):
                    future.result()
                    self._unpack(desc, diff_ids[i], chain[:i + 1], what, note)
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        image_id = config_desc["digest"]
        record = {"manifest_digest": manifest_digest, "config_digest": image_id, "index_digest": index_digest,
                  "layers": [{"digest": d["digest"], "size": d.get("size", 0), "mediaType": d.get("mediaType", "")}
                             for d in layers],
                  "diff_ids": diff_ids, "chain_ids": chain, "repo_digests": [],
                  "size": config_desc.get("size", 0) + sum(d.get("size", 0) for d in layers)}
        with self._metadata(write=True) as db:
            old = db["images"].get(image_id)
            if old:
                record["repo_digests"] = old["repo_digests"]
                record["index_digest"] = record["index_digest"] or old.get("index_digest", "")
            if repo_digest and repo_digest not in record["repo_digests"]:
                record["repo_digests"].append(repo_digest)
            db["images"][image_id] = record
            for tag in tags:
                db["tags"][tag] = image_id
            return self._image(db, image_id)

    def _unpack(self, desc: dict, diff_id: str, chain: list[str], what: str, note: ProgressCallback) -> None:
        chain_id = chain[-1]
        with self.snapshots.lock(chain_id):
            if self.snapshots.exists(chain_id):
                return
            note(ProgressEvent(what, desc["digest"], "unpacking"))
            with self.snapshots.create(chain_id) as dest:
                with open(self.content.path(desc["digest"]), "rb") as blob:
                    stats = apply_layer(blob, dest, kernel=self.kernel, lowers=self.snapshots.lowers(chain[:-1]))
                if stats.diff_id != diff_id:
                    raise DigestError(f"layer {desc['digest']} of {what}: uncompressed content hashes to "
                                      f"{stats.diff_id}, but the config says diff_id {diff_id}")
                self.snapshots.commit(chain_id, chain[-2] if len(chain) > 1 else None, diff_id)
            note(ProgressEvent(what, desc["digest"], "unpacked"))

    # ---- tag / remove / prune -------------------------------------------------------------------------------

    def tag(self, ref_or_id: str, new_ref: str) -> None:
        target = refs.parse(new_ref)
        if target.digest:
            raise refs.ReferenceError(f"cannot tag with a digest reference {new_ref!r}")
        with self._metadata(write=True) as db:
            db["tags"][str(target)] = self._resolve_id(db, ref_or_id)

    def remove(self, ref: str, *, force: bool = False) -> list[str]:
        """Untag; an image left with no name is deleted, and then whatever only it used. Returns deleted IDs."""
        with self._metadata(write=True) as db:
            image_id = self._resolve_id(db, ref)
            by_id = _names_an_id(ref, image_id)
            if by_id:
                for t in [t for t, i in db["tags"].items() if i == image_id]:
                    del db["tags"][t]
            else:
                parsed = refs.parse(ref)
                if parsed.digest:
                    db["images"][image_id]["repo_digests"].remove(f"{parsed.name}@{parsed.digest}")
                else:
                    db["tags"].pop(str(parsed), None)
            deleted = []
            if by_id or image_id not in db["tags"].values():
                users = [m.container_id for m in self.snapshots.list_containers() if m.image_id == image_id]
                if users and not force:
                    raise ImageInUse(f"image {image_id} is in use by container(s) {', '.join(users)}")
                del db["images"][image_id]
                deleted.append(image_id)
        if deleted:
            self.collect()
        return deleted

    def prune(self, *, dangling_only: bool = False, keep: Iterable[str] = ()) -> PruneReport:
        """Delete images no container uses (only untagged ones if dangling_only), then collect garbage."""
        report = PruneReport()
        with self._metadata(write=True) as db:
            kept = {self._resolve_id(db, k) for k in keep}
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
        with _flock(self._gc_lock, fcntl.LOCK_EX):
            with self._metadata(write=False) as db:
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
        for lock in (self.root / "locks").iterdir():
            kind, _, key = lock.stem.partition("-")
            if kind in ("blob", "snapshot") and key not in live and not (self.content.ingest / f"{key}.partial").exists():
                lock.unlink(missing_ok=True)
            elif kind == "container" and lock.stem not in live:
                lock.unlink(missing_ok=True)

    # ---- container root filesystems -------------------------------------------------------------------------

    def prepare_rootfs(self, ref_or_id: str, container_id: str) -> Path:
        """A writable rootfs for a container: overlay of the image's snapshots with its own upper directory."""
        with self._gc_shared():
            image = self.get(ref_or_id)
            mount = self.snapshots.prepare(container_id, image.id, image.chain_ids)
        return Path(mount.rootfs)

    def release_rootfs(self, container_id: str) -> bool:
        with self._gc_shared():
            return self.snapshots.release(container_id)

    def rootfs_mounts(self) -> list[ContainerMount]:
        return self.snapshots.list_containers()

    # ---- import / export ------------------------------------------------------------------------------------

    def import_archive(self, path: Path | str, *, name: str | None = None,
                       progress: ProgressCallback | None = None) -> list[Image]:
        """Load an OCI image layout or a docker-archive (`docker save`), as a directory or a tar file.

        `name` names an image whose archive carries no full reference (an OCI layout usually has only a tag).
        """
        note = progress or (lambda e: None)
        results: list[Image] = []
        with _ArchiveReader(Path(path), self.kernel) as archive, self._gc_shared():
            found = archive.images(self.platform)
            if not found:
                raise ManifestError(f"{path}: no image manifests found (neither index.json nor manifest.json)")
            for item in found:
                self.content.put(item.manifest, item.digest)

                def fetch(desc: dict, item: ArchiveImage = item) -> None:
                    with self.content.lock(desc["digest"]):
                        if self.content.has(desc["digest"]):
                            return
                        with self.content.writer(desc["digest"], desc.get("size")) as w, \
                                archive.open_blob(desc["digest"], item.paths.get(desc["digest"])) as src:
                            while chunk := src.read(1 << 20):
                                w.write(chunk)

                results.append(self._install(json.loads(item.manifest), item.digest, fetch, str(path), note,
                                             tags=_import_names(item, name)))
        return results

    def export(self, refs_or_ids: list[str], dest: Path | str) -> Path:
        """Write one tar that is both an OCI image layout and a docker-archive (docker 25+ `save` does the same)."""
        dest = Path(dest)
        with self._metadata(write=False) as db:
            chosen = [(r, self._resolve_id(db, r)) for r in refs_or_ids]
            records = {i: db["images"][i] for _, i in chosen}
        index = {"schemaVersion": 2, "mediaType": MEDIA_OCI_INDEX, "manifests": []}
        docker_manifest = []
        blobs: list[str] = []
        for r, image_id in chosen:
            rec = records[image_id]
            manifest_bytes = self.content.read(rec["manifest_digest"])
            manifest = json.loads(manifest_bytes)
            names = [] if refs.is_image_id(r) else [str(refs.parse(r))]
            annotations = {}
            if names:
                annotations = {CONTAINERD_NAME_ANNOTATION: names[0],
                               REF_NAME_ANNOTATION: refs.parse(names[0]).tag or refs.parse(names[0]).digest}
            config = json.loads(self.content.read(rec["config_digest"]))
            entry = {"mediaType": manifest.get("mediaType", MEDIA_OCI_MANIFEST), "digest": rec["manifest_digest"],
                     "size": len(manifest_bytes),
                     "platform": {"os": config.get("os", "linux"), "architecture": config.get("architecture", "")}}
            if annotations:
                entry["annotations"] = annotations
            index["manifests"].append(entry)
            docker_manifest.append({"Config": f"blobs/sha256/{check_digest(rec['config_digest'])}",
                                    "RepoTags": [refs.parse(n).familiar() for n in names if refs.parse(n).tag],
                                    "Layers": [f"blobs/sha256/{check_digest(d['digest'])}" for d in rec["layers"]]})
            for d in [rec["manifest_digest"], rec["config_digest"], *(x["digest"] for x in rec["layers"])]:
                if d not in blobs:
                    if not self.content.has(d):
                        raise ImageNotFound(f"image {r}: blob {d} is not in the store (cannot export)")
                    blobs.append(d)
        with atomic_file(dest, tmp=dest.with_name(f".{dest.name}.{os.getpid()}.tmp")) as out, \
                tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            def add_bytes(name: str, data: bytes) -> None:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))

            add_bytes("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            add_bytes("index.json", json.dumps(index).encode())
            add_bytes("manifest.json", json.dumps(docker_manifest).encode())
            for d in blobs:
                path = self.content.path(d)
                info = tar.gettarinfo(str(path), arcname=f"blobs/sha256/{check_digest(d)}")
                info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
        return dest


def _names_an_id(text: str, image_id: str) -> bool:
    short = text.removeprefix("sha256:")
    return len(short) >= 12 and all(c in "0123456789abcdef" for c in short) and \
        image_id.removeprefix("sha256:").startswith(short)


def _import_names(found: "ArchiveImage", name: str | None) -> list[str]:
    """Full references from the archive, or `name` joined with a bare tag from org.opencontainers.image.ref.name."""
    out = []
    for n in found.names:
        if not refs.is_tag(n):
            out.append(str(refs.parse(n)))
        elif name:
            out.append(str(refs.parse(f"{refs.parse(name, default_tag=False).name}:{n}")))
    if name and not out:
        out.append(str(refs.parse(name)))
    return out


@dataclass
class ArchiveImage:
    manifest: bytes
    digest: str
    names: list[str]
    paths: dict[str, str]  # blob digest -> path inside a docker-archive


class _ArchiveReader:
    """Reads blobs and manifests from an OCI layout or docker-archive, a directory or a tar, never by host path."""

    def __init__(self, path: Path, kernel: Syscalls) -> None:
        self.path = path
        self.kernel = kernel
        self.tar: tarfile.TarFile | None = None
        self.dirfd: int | None = None

    def __enter__(self) -> "_ArchiveReader":
        if self.path.is_dir():
            self.dirfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            try:
                self.tar = tarfile.open(self.path, "r:*")
            except (tarfile.TarError, OSError) as e:
                raise ManifestError(f"{self.path}: not a directory or a readable tar: {e}") from e
            self.members = {m.name.removeprefix("./"): m for m in self.tar.getmembers() if m.isreg()}
        return self

    def __exit__(self, *exc) -> None:
        if self.tar:
            self.tar.close()
        if self.dirfd is not None:
            os.close(self.dirfd)

    def _open(self, name: str):
        name = name.removeprefix("./")
        if self.tar is not None:
            member = self.members.get(name)
            if member is None:
                raise FileNotFoundError(f"{self.path}: no {name!r} in the archive")
            return self.tar.extractfile(member)
        fd = resolve.open_in_root(self.kernel, self.dirfd, name, os.O_RDONLY | os.O_NOFOLLOW, same_mount=True)
        return os.fdopen(fd, "rb")

    def exists(self, name: str) -> bool:
        try:
            self._open(name).close()
            return True
        except OSError:
            return False

    def read(self, name: str) -> bytes:
        with self._open(name) as f:
            return f.read()

    def blob(self, digest: str) -> bytes:
        data = self.read(f"blobs/sha256/{check_digest(digest)}")
        if sha256_digest(data) != digest:
            raise DigestError(f"blob {digest} in {self.path}: content hashes to {sha256_digest(data)}")
        return data

    @contextlib.contextmanager
    def open_blob(self, digest: str, path: str | None):
        with self._open(path or f"blobs/sha256/{check_digest(digest)}") as f:
            yield f

    def images(self, platform: Platform) -> list[ArchiveImage]:
        if self.exists("index.json"):
            return self._oci(platform)
        if self.exists("manifest.json"):
            return self._docker()
        return []

    def _oci(self, platform: Platform) -> list[ArchiveImage]:
        index = json.loads(self.read("index.json"))
        out = []
        for desc in index.get("manifests", []):
            names = []
            ann = desc.get("annotations") or {}
            if ann.get(CONTAINERD_NAME_ANNOTATION):
                names.append(ann[CONTAINERD_NAME_ANNOTATION])
            elif ann.get(REF_NAME_ANNOTATION):
                names.append(ann[REF_NAME_ANNOTATION])
            mdesc = desc
            if desc.get("mediaType") in INDEX_TYPES:
                inner = json.loads(self.blob(desc["digest"]))
                mdesc = select_platform(inner, platform, str(self.path))
            elif desc.get("platform") and not platform.matches(desc["platform"]):
                continue
            out.append(ArchiveImage(self.blob(mdesc["digest"]), mdesc["digest"], names, {}))
        return out

    def _docker(self) -> list[ArchiveImage]:
        """docker-archive has no manifests of its own: one is synthesised, with layers hashed as stored."""
        out = []
        for entry in json.loads(self.read("manifest.json")):
            config_bytes = self.read(entry["Config"])
            layers, paths = [], {sha256_digest(config_bytes): entry["Config"]}
            for layer_path in entry["Layers"]:
                with self._open(layer_path) as f:
                    h = hashlib.sha256()
                    size = 0
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                        size += len(chunk)
                layers.append({"mediaType": MEDIA_DOCKER_LAYER, "digest": "sha256:" + h.hexdigest(), "size": size})
                paths[layers[-1]["digest"]] = layer_path
            manifest = {"schemaVersion": 2, "mediaType": MEDIA_DOCKER_MANIFEST,
                        "config": {"mediaType": MEDIA_DOCKER_CONFIG, "digest": sha256_digest(config_bytes),
                                   "size": len(config_bytes)},
                        "layers": layers}
            body = json.dumps(manifest, sort_keys=True).encode()
            out.append(ArchiveImage(body, sha256_digest(body), list(entry.get("RepoTags") or []), paths))
        return out
