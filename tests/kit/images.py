"""More test images on top of busybox.py: layered images with whiteouts, multi-arch indexes, hostile layers.

Tar entries are described as small tuples so a test states exactly what a layer holds, including entries
no honest tool would write (`../` names, links out of the root), and layouts are real OCI image layouts that
skopeo can push to a registry.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from tests.kit.busybox import ARCH, OCIImage, build_rootfs, tar_directory

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
LAYER_MEDIA = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
               "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
               "none": "application/vnd.oci.image.layer.v1.tar"}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Entry:
    """One tar entry. kind: dir, file, symlink, hardlink, fifo, chr, blk."""
    kind: str
    name: str
    data: bytes = b""
    target: str = ""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    xattrs: dict[str, str] | None = None
    major: int = 0
    minor: int = 0


def d(name: str, mode: int = 0o755, **kw) -> Entry:
    return Entry("dir", name, mode=mode, **kw)


def f(name: str, data: bytes | str = b"", mode: int = 0o644, **kw) -> Entry:
    return Entry("file", name, data=data.encode() if isinstance(data, str) else data, mode=mode, **kw)


def symlink(name: str, target: str) -> Entry:
    return Entry("symlink", name, target=target, mode=0o777)


def hardlink(name: str, target: str, mode: int = 0o644) -> Entry:
    """`mode`: the target's, as tar writes it; an unpacker may set it on the file (moby's archive does)."""
    return Entry("hardlink", name, target=target, mode=mode)


def tar_entries(entries: list[Entry]) -> bytes:
    """An uncompressed tar holding exactly these entries, in this order, names written verbatim."""
    types = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE,
             "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = types[e.kind]
            info.mode, info.uid, info.gid, info.mtime = e.mode, e.uid, e.gid, 1_700_000_000
            info.linkname = e.target
            info.devmajor, info.devminor = e.major, e.minor
            if e.xattrs:
                info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in e.xattrs.items()}
            if e.kind == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def compress(raw: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(raw, mtime=0)
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(raw)
    return raw


@dataclass
class Blobs:
    layout: Path

    def put(self, data: bytes) -> str:
        digest = _digest(data)
        blobs = self.layout / "blobs" / "sha256"
        blobs.mkdir(parents=True, exist_ok=True)
        (blobs / digest.split(":", 1)[1]).write_bytes(data)
        return digest


def add_image(layout: Path, layers: list[tuple[bytes, str]], *, arch: str = ARCH, variant: str = "",
              config_extra: dict | None = None) -> tuple[dict, OCIImage]:
    """Blobs for one image (layers given as (raw tar, compression)); returns its manifest descriptor."""
    blobs = Blobs(layout)
    descs: list[dict[str, Any]] = []
    diff_ids: list[str] = []
    for raw, compression in layers:
        data = compress(raw, compression)
        descs.append({"mediaType": LAYER_MEDIA[compression], "digest": blobs.put(data), "size": len(data)})
        diff_ids.append(_digest(raw))
    config: dict[str, Any] = {"architecture": arch, "os": "linux",
              "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                         "Cmd": ["sh"], "WorkingDir": "/"},
              "rootfs": {"type": "layers", "diff_ids": diff_ids},
              "history": [{"created_by": "pynode test-image kit"} for _ in layers]}
    if variant:
        config["variant"] = variant
    config["config"].update(config_extra or {})
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_desc: dict[str, Any] = {"mediaType": "application/vnd.oci.image.config.v1+json",
                                   "digest": blobs.put(config_bytes), "size": len(config_bytes)}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MEDIA_MANIFEST, "config": config_desc,
                           "layers": descs}, sort_keys=True).encode()
    platform = {"architecture": arch, "os": "linux"} | ({"variant": variant} if variant else {})
    desc: dict[str, Any] = {"mediaType": MEDIA_MANIFEST, "digest": blobs.put(manifest), "size": len(manifest),
                            "platform": platform}
    return desc, OCIImage(layout, desc["digest"], config_desc["digest"], [x["digest"] for x in descs], diff_ids)


def write_index(layout: Path, descriptors: list[dict], tag: str = "latest", *, nested: bool = False) -> str:
    """index.json naming the descriptors by tag; nested=True puts them behind one image index (a multi-arch image)."""
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    if nested:
        inner = json.dumps({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": descriptors},
                           sort_keys=True).encode()
        descriptors = [{"mediaType": MEDIA_INDEX, "digest": Blobs(layout).put(inner), "size": len(inner)}]
    manifests = [dict(x, annotations={"org.opencontainers.image.ref.name": tag}) for x in descriptors]
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": MEDIA_INDEX,
                                                   "manifests": manifests}, sort_keys=True))
    return descriptors[0]["digest"]


def busybox_layer(workdir: Path) -> bytes:
    return tar_directory(build_rootfs(Path(workdir) / "rootfs"))


def push_busybox(registry, workdir: Path, repository: str, creds: str | None = None) -> None:
    """Busybox as one gzip layer, pushed to `registry` (tests/integration/registry_server.Registry) as
    `repository` (REPO:TAG), with `creds` (USER:PASSWORD) where the registry wants them."""
    layout = Path(workdir) / "layout"
    layout.mkdir(parents=True)
    desc, _ = add_image(layout, [(busybox_layer(Path(workdir) / "work"), "gzip")])
    tag = repository.rsplit(":", 1)[1]
    write_index(layout, [desc], tag=tag)
    registry.push(layout, repository, tag=tag, creds=creds)


# What the layered image's second and third layers do to the first, and what the result must look like.
LAYERED_BASE = [
    d("data"), f("data/keep", "keep"), f("data/remove-me", "gone"), d("data/subdir"), f("data/subdir/x", "x"),
    d("opq", 0o750), f("opq/old1", "old"), f("opq/old2", "old"), d("app"), f("etc/motd", "base motd\n"),
]
LAYERED_TOP = [
    f("data/.wh.remove-me"), f("data/.wh.subdir"), f("data/added", "added"),
    f("opq/.wh..wh..opq"), f("opq/new", "new"),
    f("app/hello", "#!/bin/sh\necho hello from layer two\n", 0o755, uid=1000, gid=1000),
    hardlink("app/hello-link", "app/hello"),
    symlink("app/motd", "/etc/motd"),
    f("app/setuid", "s", 0o4755, uid=0, gid=0),
    f("app/xattr", "x", xattrs={"user.pynode": "yes"}),
    Entry("fifo", "app/fifo", mode=0o600),
    Entry("chr", "app/null", mode=0o666, major=1, minor=3),
]
LAYERED_THIRD = [f("etc/motd", "third motd\n"), hardlink("app/motd-link", "etc/motd"), f("app/.wh.setuid")]


def build_layered_image(layout: Path, workdir: Path, *, tag: str = "latest") -> OCIImage:
    """busybox + a layer with whiteouts, an opaque dir and every entry type + a zstd layer that deletes again."""
    layers = [(busybox_layer(workdir), "gzip"),
              (tar_entries(LAYERED_BASE), "gzip"),
              (tar_entries(LAYERED_TOP), "gzip"),
              (tar_entries(LAYERED_THIRD), "zstd")]
    desc, image = add_image(layout, layers, config_extra={
        "Entrypoint": ["/app/hello"], "Cmd": ["--flag"], "User": "1000:1000", "WorkingDir": "/app",
        "Env": ["PATH=/bin:/usr/bin", "GREETING=hi"], "ExposedPorts": {"8080/tcp": {}},
        "Volumes": {"/data": {}}, "Labels": {"org.example.kit": "layered"}})
    write_index(layout, [desc], tag)
    return image


def build_multiarch_image(layout: Path, workdir: Path, *, tag: str = "latest") -> dict[str, OCIImage]:
    """An image index: the host's arch runs busybox; arm64 and arm/v7 carry a marker file naming their arch."""
    out, descs = {}, []
    bb = busybox_layer(workdir)
    for arch, variant in (("amd64", ""), ("arm64", "v8"), ("arm", "v7")):
        marker = tar_entries([f("arch", f"{arch}{('/' + variant) if variant else ''}\n")])
        layers = [(bb, "gzip"), (marker, "gzip")] if arch == ARCH else [(marker, "gzip")]
        desc, image = add_image(layout, layers, arch=arch, variant=variant)
        descs.append(desc)
        out[arch + (f"/{variant}" if variant else "")] = image
    write_index(layout, descs, tag, nested=True)
    return out


def build_single_layer_image(layout: Path, entries: list[Entry], *, tag: str = "latest",
                             compression: str = "gzip") -> OCIImage:
    desc, image = add_image(layout, [(tar_entries(entries), compression)])
    write_index(layout, [desc], tag)
    return image


def build_random_image(layout: Path, layer_sizes: list[int], *, tag: str = "latest", seed: int = 0,
                       files_per_layer: int = 8) -> OCIImage:
    """Layers of incompressible data of the given sizes: for resume, kill and bench runs."""
    import random
    rng = random.Random(seed)
    layers = []
    for i, size in enumerate(layer_sizes):
        per = max(size // files_per_layer, 1)
        entries = [d(f"layer{i}")] + [f(f"layer{i}/blob{j}", rng.randbytes(per)) for j in range(files_per_layer)]
        layers.append((tar_entries(entries), "gzip"))
    desc, image = add_image(layout, layers)
    write_index(layout, [desc], tag)
    return image
