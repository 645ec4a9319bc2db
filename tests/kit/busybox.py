"""The test-image kit: a busybox rootfs and a real OCI image made from Debian's busybox-static.

Every tier builds on these instead of a downloaded image (this machine has no route to a public registry).
Layers are real gzip tars with correct digests, so the same image can be pushed to a registry with skopeo,
imported, or unpacked, and a rootfs made here is what `pyruntime run` executes in tests and benchmarks.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnobody:x:65534:\n"


def applets() -> list[str]:
    out = subprocess.run([str(BUSYBOX), "--list-full"], check=True, capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def build_rootfs(dest: Path) -> Path:
    """A minimal root filesystem: busybox with one symlink per applet, /etc/passwd and the usual dirs."""
    dest = Path(dest)
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "tmp", "root", "var", "run"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, dest / "bin/busybox")
    for applet in applets():
        link = dest / applet
        if applet == "bin/busybox" or link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    (dest / "etc/passwd").write_text(PASSWD)
    (dest / "etc/group").write_text(GROUP)
    (dest / "etc/hostname").write_text("busybox\n")
    return dest


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_directory(root: Path) -> bytes:
    """An uncompressed layer tar of a directory, with paths relative to it and deterministic metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(Path(root).rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


@dataclass
class OCIImage:
    layout: Path
    manifest_digest: str
    config_digest: str
    layer_digests: list[str]
    diff_ids: list[str]


def write_oci_layout(layout: Path, layer_tars: list[bytes], *, tag: str = "latest",
                     config_extra: dict | None = None) -> OCIImage:
    """An OCI image layout (oci-layout, index.json, blobs/sha256) holding one image made of the given layers."""
    layout = Path(layout)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _digest(data)
        (blobs / digest.split(":", 1)[1]).write_bytes(data)
        return digest

    layers, diff_ids = [], []
    for raw in layer_tars:
        gz = gzip.compress(raw, mtime=0)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(gz), "size": len(gz)})
        diff_ids.append(_digest(raw))
    config = {
        "architecture": ARCH, "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Cmd": ["sh"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "pynode test-image kit"} for _ in layer_tars],
    }
    if config_extra:
        config["config"].update(config_extra)
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(config_bytes),
                   "size": len(config_bytes)}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": layers}
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = put(manifest_bytes)
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
                            "size": len(manifest_bytes),
                            "annotations": {"org.opencontainers.image.ref.name": tag},
                            "platform": {"architecture": ARCH, "os": "linux"}}]}
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
    return OCIImage(layout, manifest_digest, config_desc["digest"], [d["digest"] for d in layers], diff_ids)


def build_busybox_image(layout: Path, workdir: Path) -> OCIImage:
    """The busybox image as an OCI layout with one gzip layer."""
    rootfs = build_rootfs(Path(workdir) / "rootfs")
    return write_oci_layout(layout, [tar_directory(rootfs)])
