"""A busybox rootfs and a real OCI image made from Debian's busybox-static.

A node without a registry needs an image it can make itself: `pynode run` imports this one into its CRI
server's store for its sample pod (standalone.py), so it lives in the package, and runs from a wheel without a
checkout. Every test tier builds on it too (tests/kit/busybox.py), instead of a downloaded image (the test
machines have no route to a public registry). Layers are real gzip tars with correct digests, so the same
image can be pushed to a registry with skopeo, imported, or unpacked, and a rootfs made here is what
`pyruntime run` executes in tests and benchmarks.

The busybox comes from the busybox-static .deb, extracted into ~/.cache/pynode, never from the host's
/bin/busybox: Debian's `busybox` package is dynamically linked, and a rootfs holding it has no loader, so
every container would fail with "exec /bin/sh: No such file or directory". The two packages conflict,
so installing busybox-static on the host would replace what its owner chose; downloading the .deb
doesn't. The binary is checked for a PT_INTERP header before any rootfs is made from it.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE = Path.home() / ".cache" / "pynode"
STATIC_ROOT = CACHE / "busybox-static"  # the extracted .deb
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnobody:x:65534:\n"

PT_INTERP = 3
# By EI_CLASS (1: 32-bit, 2: 64-bit): the ELF header after e_ident, a program header, and where in the
# latter p_offset and p_filesz are.
_ELF_HEADER = {1: "HHIIIIIHHHHHH", 2: "HHIQQQIHHHHHH"}
_PROGRAM_HEADER = {1: ("IIIIIIII", 1, 4), 2: ("IIQQQQQQ", 2, 5)}


def elf_interpreter(path: Path) -> str | None:
    """The program interpreter (dynamic loader) an ELF executable asks for, or None for a static one.

    Read from the program headers: a static-pie binary has PT_DYNAMIC but no PT_INTERP and runs without
    a loader, so PT_INTERP is what decides. Raises ValueError for a file that is not ELF."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ValueError(f"{path}: not an ELF file")
        endian = "<" if ident[5] == 1 else ">"
        header_format = endian + _ELF_HEADER[ident[4]]
        header = struct.unpack(header_format, f.read(struct.calcsize(header_format)))
        phoff, phentsize, phnum = header[4], header[8], header[9]
        entry_format, offset_at, size_at = _PROGRAM_HEADER[ident[4]]
        entry_size = struct.calcsize(endian + entry_format)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            entry = struct.unpack(endian + entry_format, f.read(entry_size))
            if entry[0] == PT_INTERP:
                f.seek(entry[offset_at])
                return f.read(entry[size_at]).rstrip(b"\0").decode(errors="replace")
    return None


def require_static(path: Path) -> Path:
    """`path`, once it is known to run in a rootfs that has nothing but itself."""
    interp = elf_interpreter(path)
    if interp is not None:
        raise RuntimeError(f"{path} is dynamically linked (it needs {interp}), so a container whose rootfs holds "
                           f"only busybox could not exec it; the busybox image needs busybox-static's binary")
    return path


def _apt_download(package: str, into: Path) -> None:
    argv = ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package]
    if subprocess.run(argv, cwd=into, capture_output=True).returncode == 0:
        return
    # apt-get download knows only what the package lists know: a fresh machine has none yet
    update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
    if update.returncode != 0:
        raise RuntimeError(f"apt-get update (needed to download {package}) failed: {update.stderr.strip()}")
    proc = subprocess.run(argv, cwd=into, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {into} failed: {proc.stderr.strip()}")


def _binary_in(root: Path) -> Path | None:
    return next((p for p in (root / "bin" / "busybox", root / "usr" / "bin" / "busybox") if p.is_file()), None)


def busybox_from_deb(package: str, root: Path) -> Path:
    """The busybox binary of Debian's `package`, downloaded and extracted once into `root` (in the cache)."""
    binary = _binary_in(root)
    if binary is None:
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE, prefix=f".{package}-") as tmp:
            _apt_download(package, Path(tmp))
            debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
            if len(debs) != 1:
                raise RuntimeError(f"apt-get download {package} left {len(debs)} .deb files in {tmp}")
            extracted = Path(tmp) / "root"
            unpack = subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(extracted)], capture_output=True, text=True)
            if unpack.returncode != 0:
                raise RuntimeError(f"dpkg-deb -x {debs[0]} {extracted} failed: {unpack.stderr.strip()}")
            try:
                extracted.rename(root)
            except OSError:  # another run extracted it first
                if _binary_in(root) is None:
                    raise
        binary = _binary_in(root)
        if binary is None:
            raise RuntimeError(f"the {package} package extracted into {root} has no bin/busybox")
    return binary


@functools.cache
def static_busybox() -> Path:
    """A statically linked busybox from the busybox-static .deb."""
    return require_static(busybox_from_deb("busybox-static", STATIC_ROOT))


def applets() -> list[str]:
    out = subprocess.run([str(static_busybox()), "--list-full"], check=True, capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def build_rootfs(dest: Path) -> Path:
    """A minimal root filesystem: busybox with one symlink per applet, /etc/passwd and the usual dirs."""
    dest = Path(dest)
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "tmp", "root", "var", "run"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    shutil.copy2(static_busybox(), dest / "bin/busybox")
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

    layers: list[dict[str, Any]] = []
    diff_ids: list[str] = []
    for raw in layer_tars:
        gz = gzip.compress(raw, mtime=0)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(gz), "size": len(gz)})
        diff_ids.append(_digest(raw))
    config: dict[str, Any] = {
        "architecture": ARCH, "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Cmd": ["sh"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "pynode test-image kit"} for _ in layer_tars],
    }
    if config_extra:
        config["config"].update(config_extra)
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_desc: dict[str, Any] = {"mediaType": "application/vnd.oci.image.config.v1+json",
                                   "digest": put(config_bytes), "size": len(config_bytes)}
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


if __name__ == "__main__":
    print(static_busybox())  # `make base` fetches it here, so that neither `make run` nor a test waits for apt
