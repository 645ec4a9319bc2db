"""The images database: names to image records, and the record to what an image is made of.

One JSON file (images.json) under the store root, rewritten atomically under an flock (shared to read,
exclusive to write), holds every image record and the tag table, so a name and the image it names change
together and a crash leaves the old file or the new one. Reference counts are not stored: the collector
(gc.py) derives them from these records each time, so a crash can never leave a count wrong.

A record keeps everything `list` and `inspect` show (the config summary, each snapshot's size), so listing N
images reads this one file and not N config blobs and every snapshot record. Records written before those
fields existed are completed from the blobs and snapshots on read.
"""
from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pynode_os.files import atomic_write
from pyruntime.errors import FailedPreconditionError, NotFoundError
from pyruntime.images import reference as refs
from pyruntime.images.content import ContentStore, flock
from pyruntime.images.snapshots import SnapshotStore


class ImageNotFound(NotFoundError):
    """No image has that name or id, or a blob an image needs is missing from the store."""


class ImageInUse(FailedPreconditionError):
    """The image backs a container's rootfs; removal needs `force` or the container gone first."""


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
    def from_blob(cls, config: dict) -> ImageConfig:
        c = config.get("config") or {}
        return cls(env=list(c.get("Env") or []), entrypoint=list(c.get("Entrypoint") or []),
                   cmd=list(c.get("Cmd") or []), working_dir=c.get("WorkingDir") or "", user=c.get("User") or "",
                   exposed_ports=sorted(c.get("ExposedPorts") or {}), volumes=sorted(c.get("Volumes") or {}),
                   labels=dict(c.get("Labels") or {}), stop_signal=c.get("StopSignal") or "")


def config_summary(config: dict) -> dict:
    """What a record keeps of an image's config blob."""
    return {"os": config.get("os", ""), "architecture": config.get("architecture", ""),
            "variant": config.get("variant", ""), "created": config.get("created", ""),
            "config": asdict(ImageConfig.from_blob(config))}


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


def names_an_id(text: str, image_id: str) -> bool:
    short = text.removeprefix("sha256:")
    return len(short) >= 12 and all(c in "0123456789abcdef" for c in short) and \
        image_id.removeprefix("sha256:").startswith(short)


class ImageDB:
    def __init__(self, root: Path, content: ContentStore, snapshots: SnapshotStore) -> None:
        self.content = content
        self.snapshots = snapshots
        self._db = Path(root) / "images.json"
        self._lock = Path(root) / "locks" / "metadata.lock"
        self._thread_lock = threading.RLock()

    @contextlib.contextmanager
    def transaction(self, write: bool) -> Iterator[dict]:
        """The database as a dict; with write=True, what the block leaves in it is saved when it ends cleanly."""
        with self._thread_lock, flock(self._lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH):
            db = json.loads(self._db.read_text()) if self._db.exists() else {"images": {}, "tags": {}}
            yield db
            if write:
                atomic_write(self._db, json.dumps(db, indent=1, sort_keys=True).encode())

    # ---- resolution -----------------------------------------------------------------------------------------

    @staticmethod
    def resolve_id(db: dict, ref_or_id: str) -> str:
        """An image ID (full or a 12+ hex prefix), a name:tag or a name@digest, to the image ID."""
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
        except refs.ReferenceFormatError as e:
            raise ImageNotFound(f"image {ref_or_id!r} not found (not an image ID or a valid reference)") from e
        if ref.digest:
            for image_id, rec in db["images"].items():
                if f"{ref.name}@{ref.digest}" in rec["repo_digests"]:
                    return image_id
        elif str(ref) in db["tags"]:
            return db["tags"][str(ref)]
        raise ImageNotFound(f"image {ref_or_id!r} not found")

    def chain(self, ref_or_id: str) -> tuple[str, list[str]]:
        """The image ID and snapshot chain a container rootfs is made from."""
        with self.transaction(write=False) as db:
            image_id = self.resolve_id(db, ref_or_id)
            return image_id, list(db["images"][image_id]["chain_ids"])

    # ---- queries --------------------------------------------------------------------------------------------

    def list(self) -> builtins.list[Image]:
        with self.transaction(write=False) as db:
            sharers = _sharers(db)
            return [self._image(db, i, sharers) for i in sorted(db["images"])]

    def get(self, ref_or_id: str) -> Image:
        with self.transaction(write=False) as db:
            return self._image(db, self.resolve_id(db, ref_or_id), _sharers(db))

    def _image(self, db: dict, image_id: str, sharers: dict[str, int]) -> Image:
        rec = db["images"][image_id]
        summary = rec.get("summary") or config_summary(json.loads(self.content.read(rec["config_digest"])))
        sizes = rec.get("snapshot_sizes") or [self._snapshot_size(c) for c in rec["chain_ids"]]
        return Image(id=image_id, repo_tags=sorted(t for t, i in db["tags"].items() if i == image_id),
                     repo_digests=sorted(rec["repo_digests"]), manifest_digest=rec["manifest_digest"],
                     config_digest=rec["config_digest"], layers=rec["layers"], diff_ids=rec["diff_ids"],
                     chain_ids=rec["chain_ids"], os=summary["os"], architecture=summary["architecture"],
                     variant=summary["variant"], created=summary["created"], size=rec["size"],
                     disk_usage=sum(sizes),
                     unique_size=sum(s for c, s in zip(rec["chain_ids"], sizes, strict=True)
                                     if sharers.get(c, 0) <= 1),
                     config=ImageConfig(**summary["config"]), index_digest=rec.get("index_digest", ""))

    def _snapshot_size(self, chain_id: str) -> int:
        try:
            return self.snapshots.info(chain_id).size
        except FileNotFoundError:
            return 0

    # ---- changes --------------------------------------------------------------------------------------------

    def put(self, image_id: str, record: dict, *, tags: Iterable[str] = (), repo_digest: str | None = None) -> Image:
        """Record an image and its names in one write, so no other process ever sees it nameless (and
        prunable); names it already had are kept."""
        with self.transaction(write=True) as db:
            old = db["images"].get(image_id)
            if old:
                record["repo_digests"] = old["repo_digests"]
                record["index_digest"] = record["index_digest"] or old.get("index_digest", "")
            if repo_digest and repo_digest not in record["repo_digests"]:
                record["repo_digests"].append(repo_digest)
            db["images"][image_id] = record
            for tag in tags:
                db["tags"][tag] = image_id
            return self._image(db, image_id, _sharers(db))

    def tag(self, ref_or_id: str, new_ref: str) -> None:
        target = refs.parse(new_ref)
        if target.digest:
            raise refs.ReferenceFormatError(f"cannot tag with a digest reference {new_ref!r}")
        with self.transaction(write=True) as db:
            db["tags"][str(target)] = self.resolve_id(db, ref_or_id)

    def remove(self, ref: str, *, force: bool, users: Callable[[str], builtins.list[str]]) -> builtins.list[str]:
        """Untag; an image left with no name is deleted (unless `users(image_id)` names containers and not
        `force`). Returns the deleted IDs; what only they used is the collector's to delete."""
        with self.transaction(write=True) as db:
            image_id = self.resolve_id(db, ref)
            by_id = names_an_id(ref, image_id)
            if by_id:
                for t in [t for t, i in db["tags"].items() if i == image_id]:
                    del db["tags"][t]
            else:
                parsed = refs.parse(ref)
                if parsed.digest:
                    db["images"][image_id]["repo_digests"].remove(f"{parsed.name}@{parsed.digest}")
                else:
                    db["tags"].pop(str(parsed), None)
            if not by_id and image_id in db["tags"].values():
                return []
            in_use = users(image_id)
            if in_use and not force:
                raise ImageInUse(f"image {image_id} is in use by container(s) {', '.join(in_use)}")
            del db["images"][image_id]
            return [image_id]


def _sharers(db: dict) -> dict[str, int]:
    """How many images use each snapshot, counted once over all records."""
    out: dict[str, int] = {}
    for rec in db["images"].values():
        for c in set(rec["chain_ids"]):
            out[c] = out.get(c, 0) + 1
    return out
