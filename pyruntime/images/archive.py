"""Image archives: OCI image layouts and docker-archives (`docker save`), as directories or tar files.

An archive is untrusted input: its files are opened inside it only (a tar's members by name, a directory
through `pyruntime.linux.resolve.open_in_root`), every blob is verified against its digest, and what it holds
goes through the same install path as a pull (pull.Puller.install), so an import can do nothing a pull could
not. An export is one
tar that is both an OCI layout and a docker-archive, as docker 25+ `save` writes, so skopeo, docker and
containerd all read it.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pynode_os.files import atomic_file
from pyruntime.images import reference as refs
from pyruntime.images.content import ContentStore, DigestError, check_digest, sha256_digest
from pyruntime.images.metadata import Image, ImageDB, ImageNotFound
from pyruntime.images.pull import ManifestError, ProgressCallback, Puller
from pyruntime.images.registry import (
    INDEX_TYPES,
    MEDIA_DOCKER_MANIFEST,
    MEDIA_OCI_INDEX,
    MEDIA_OCI_MANIFEST,
    select_platform,
)
from pyruntime.images.request import Platform
from pyruntime.linux import resolve
from pyruntime.linux.syscalls import Syscalls

MEDIA_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
CONTAINERD_NAME_ANNOTATION = "io.containerd.image.name"


def import_archive(puller: Puller, path: Path | str, *, name: str | None = None,
                   progress: ProgressCallback | None = None) -> list[Image]:
    """Load an OCI image layout or a docker-archive (`docker save`), as a directory or a tar file.

    `name` names an image whose archive carries no full reference (an OCI layout usually has only a tag).
    """
    note = progress or (lambda e: None)
    content = puller.content
    results: list[Image] = []
    with _ArchiveReader(Path(path), puller.kernel) as archive, puller.gc.shared():
        found = archive.images(puller.platform)
        if not found:
            raise ManifestError(f"{path}: no image manifests found (neither index.json nor manifest.json)")
        for item in found:
            content.put(item.manifest, item.digest)

            def fetch(desc: dict, note: ProgressCallback, item: ArchiveImage = item) -> None:
                with content.lock(desc["digest"]):
                    if content.has(desc["digest"]):
                        return
                    with content.writer(desc["digest"], desc.get("size")) as w, \
                            archive.open_blob(desc["digest"], item.paths.get(desc["digest"])) as src:
                        while chunk := src.read(1 << 20):
                            w.write(chunk)

            results.append(puller.install(json.loads(item.manifest), item.digest, fetch, str(path), note,
                                          tags=import_names(item, name)))
    return results


def export(db: ImageDB, content: ContentStore, refs_or_ids: list[str], dest: Path | str) -> Path:
    """Write one tar that is both an OCI image layout and a docker-archive (docker 25+ `save` does the same)."""
    dest = Path(dest)
    with db.transaction(write=False) as tx:
        chosen = [(r, db.resolve_id(tx, r)) for r in refs_or_ids]
        records = {i: tx["images"][i] for _, i in chosen}
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": MEDIA_OCI_INDEX, "manifests": []}
    docker_manifest = []
    blobs: list[str] = []
    for r, image_id in chosen:
        rec = records[image_id]
        manifest_bytes = content.read(rec["manifest_digest"])
        manifest = json.loads(manifest_bytes)
        names = [] if refs.is_image_id(r) else [str(refs.parse(r))]
        annotations = {}
        if names:
            annotations = {CONTAINERD_NAME_ANNOTATION: names[0],
                           REF_NAME_ANNOTATION: refs.parse(names[0]).tag or refs.parse(names[0]).digest}
        config = json.loads(content.read(rec["config_digest"]))
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
                if not content.has(d):
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
            path = content.path(d)
            info = tar.gettarinfo(str(path), arcname=f"blobs/sha256/{check_digest(d)}")
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return dest


def import_names(found: ArchiveImage, name: str | None) -> list[str]:
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

    def __enter__(self) -> _ArchiveReader:
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
        assert self.dirfd is not None  # neither a tar nor a directory: __enter__ raised
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
            layers: list[dict[str, Any]] = []
            paths = {sha256_digest(config_bytes): entry["Config"]}
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
