"""Apply one layer tar into its own snapshot directory, in overlayfs's on-disk format.

Each layer becomes a directory that overlayfs can stack as a lower: an OCI whiteout `.wh.NAME` becomes the
0/0 character device overlayfs uses for a deleted name, and `.wh..wh..opq` becomes the `trusted.overlay.opaque`
xattr. tarfile only parses entries; every write goes through a directory fd resolved inside the snapshot
(see pyruntime.linux.resolve), and names with `..`, absolute names, hard links out of the layer and relative
symlinks that climb above the root are refused outright, so a hostile layer cannot write outside however its entries are
ordered (containerd's TestBreakouts cases, CVE-2018-15664 and the tar-slip class).
"""
from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pyruntime.errors import InvalidArgumentError
from pyruntime.linux import resolve
from pyruntime.linux.syscalls import Syscalls

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
OVERLAY_OPAQUE_XATTR = "trusted.overlay.opaque"
_XATTR_PAX = "SCHILY.xattr."
_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY


class UnsafeLayerError(InvalidArgumentError):
    """A layer entry that would write outside its snapshot or is otherwise refused; names the entry."""


class LayerFormatError(InvalidArgumentError):
    """A layer that is not a readable tar (or compressed tar)."""


class _HashingReader(io.RawIOBase):
    """Hashes the uncompressed tar as tarfile reads it, giving the diff_id without a second pass."""

    def __init__(self, inner: BinaryIO | io.BufferedIOBase) -> None:
        self.inner = inner
        self.hasher = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.inner.read(len(b))
        n = len(data)
        b[:n] = data
        self.hasher.update(data)
        return n


def decompressed(f: BinaryIO) -> BinaryIO | io.BufferedIOBase:
    """Pick the decompressor by magic number: registries and docker archives mislabel media types often enough."""
    head = f.read(4)
    f.seek(0)
    if head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")
    if head == b"\x28\xb5\x2f\xfd":
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
    return f


def _components(name: str, what: str) -> list[str]:
    if name.startswith("/"):
        raise UnsafeLayerError(f"layer entry {what} {name!r}: absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeLayerError(f"layer entry {what} {name!r}: '..' component")
    if "\x00" in name:
        raise UnsafeLayerError(f"layer entry {what} {name!r}: NUL byte")
    return parts


@dataclass
class LayerStats:
    diff_id: str
    entries: int = 0
    bytes_written: int = 0


@dataclass
class _Applier:
    kernel: Syscalls
    rootfd: int
    lowerfds: list[int]
    is_root: bool = os.geteuid() == 0
    dirfds: dict[str, int] = field(default_factory=dict)
    retired: list[int] = field(default_factory=list)
    dir_times: dict[str, float] = field(default_factory=dict)
    stats: LayerStats = field(default_factory=lambda: LayerStats(""))

    def close(self) -> None:
        self._forget_dirs()
        self._close_retired()

    def _forget_dirs(self) -> None:
        """A directory or symlink was removed or replaced: cached fds may now name something else.

        They are closed only after the current entry, which may still be using one of them.
        """
        self.retired.extend(self.dirfds.values())
        self.dirfds.clear()

    def _close_retired(self) -> None:
        for fd in self.retired:
            os.close(fd)
        self.retired.clear()

    def _lower_stat(self, path: str) -> os.stat_result | None:
        for lfd in self.lowerfds:
            try:
                fd = self._open(lfd, path, os.O_PATH | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                return os.fstat(fd)
            finally:
                os.close(fd)
        return None

    def _open(self, dirfd: int, path: str, flags: int) -> int:
        return resolve.open_in_root(self.kernel, dirfd, path, flags, same_mount=True)

    def parent(self, parts: list[str]) -> int:
        """A dirfd for the entry's parent, creating missing directories with the metadata the lower layers have."""
        key = "/".join(parts)
        fd = self.dirfds.get(key)
        if fd is not None:
            return fd
        try:
            fd = self._open(self.rootfd, key, _DIR_FLAGS)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
            fd = self._create_parents(parts)
        self.dirfds[key] = fd
        return fd

    def _create_parents(self, parts: list[str]) -> int:
        fd = os.dup(self.rootfd)
        try:
            for i, part in enumerate(parts):
                prefix = "/".join(parts[: i + 1])
                try:
                    nfd = self._open(self.rootfd, prefix, _DIR_FLAGS)
                except OSError as e:
                    if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                        raise
                    self._remove(fd, part)
                    lower = self._lower_stat(prefix)
                    mode = stat.S_IMODE(lower.st_mode) if lower and stat.S_ISDIR(lower.st_mode) else 0o755
                    os.mkdir(part, 0o700, dir_fd=fd)
                    nfd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    if lower and stat.S_ISDIR(lower.st_mode) and self.is_root:
                        self.kernel.chown(nfd, lower.st_uid, lower.st_gid)
                    self.kernel.chmod(nfd, mode)
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _remove(self, pfd: int, base: str) -> None:
        try:
            st = os.stat(base, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            self._forget_dirs()
            shutil.rmtree(base, dir_fd=pfd)
        else:
            if stat.S_ISLNK(st.st_mode):
                self._forget_dirs()
            os.unlink(base, dir_fd=pfd)

    def _owner(self, fd_or_name, info: tarfile.TarInfo, pfd: int | None = None) -> None:
        if not self.is_root:
            return
        if pfd is None:
            self.kernel.chown(fd_or_name, info.uid, info.gid)
        else:
            self.kernel.chown(fd_or_name, info.uid, info.gid, dir_fd=pfd, follow_symlinks=False)

    def _xattrs(self, fd: int, info: tarfile.TarInfo) -> None:
        for key, value in info.pax_headers.items():
            if not key.startswith(_XATTR_PAX):
                continue
            name = key[len(_XATTR_PAX):]
            if name.startswith("trusted.overlay.") or (name.startswith("trusted.") and not self.is_root):
                continue  # overlay's own xattrs would let a layer forge whiteouts or redirects
            raw = value.encode("utf-8", "surrogateescape")
            try:
                os.setxattr(fd, name, raw)
            except OSError as e:
                if e.errno not in (errno.ENOTSUP, errno.EPERM):
                    raise

    def apply(self, tar: tarfile.TarFile) -> None:
        for info in tar:
            self.stats.entries += 1
            self._close_retired()
            parts = _components(info.name, "name")
            if not parts:
                if not info.isdir():
                    raise UnsafeLayerError(f"layer entry name {info.name!r}: a non-directory at the root")
                continue  # the layer's own root ("./"): the snapshot directory keeps its metadata
            *dirs, base = parts
            if base == OPAQUE_MARKER:
                pfd = self.parent(dirs)
                if self.is_root:
                    os.setxattr(pfd, OVERLAY_OPAQUE_XATTR, b"y")
                continue
            if base.startswith(WHITEOUT_PREFIX):
                name = base[len(WHITEOUT_PREFIX):]
                if not name or name in (".", ".."):
                    raise UnsafeLayerError(f"layer entry name {info.name!r}: whiteout of nothing")
                pfd = self.parent(dirs)
                self._remove(pfd, name)
                self.kernel.mknod(name, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=pfd)
                continue
            pfd = self.parent(dirs)
            if info.isdir():
                self._dir(pfd, base, info, "/".join(parts))
            elif info.isreg():
                self._file(pfd, base, info, tar)
            elif info.issym():
                self._symlink(pfd, base, info, dirs)
            elif info.islnk():
                self._hardlink(pfd, base, info)
            elif info.ischr() or info.isblk() or info.isfifo():
                self._node(pfd, base, info)
            else:
                raise UnsafeLayerError(f"layer entry name {info.name!r}: unsupported type {info.type!r}")
        for path, mtime in self.dir_times.items():
            try:
                fd = self._open(self.rootfd, path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
            except OSError:
                continue  # replaced by a later entry
            try:
                os.utime(f"/proc/self/fd/{fd}", (mtime, mtime))
            finally:
                os.close(fd)

    def _dir(self, pfd: int, base: str, info: tarfile.TarInfo, path: str) -> None:
        try:
            st = os.stat(base, dir_fd=pfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                self._remove(pfd, base)
                os.mkdir(base, 0o700, dir_fd=pfd)
        except FileNotFoundError:
            os.mkdir(base, 0o700, dir_fd=pfd)
        fd = os.open(base, _DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        try:
            self._owner(fd, info)
            self.kernel.chmod(fd, info.mode & 0o7777)
            self._xattrs(fd, info)
        finally:
            os.close(fd)
        self.dir_times[path] = info.mtime

    def _file(self, pfd: int, base: str, info: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        self._remove(pfd, base)
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
        try:
            src = tar.extractfile(info)
            if src is not None:
                while chunk := src.read(_CHUNK):
                    _write_all(fd, chunk)
                    self.stats.bytes_written += len(chunk)
            self._owner(fd, info)
            self.kernel.chmod(fd, info.mode & 0o7777)
            self._xattrs(fd, info)
            os.utime(fd, (info.mtime, info.mtime))
        finally:
            os.close(fd)

    def _symlink(self, pfd: int, base: str, info: tarfile.TarInfo, dirs: list[str]) -> None:
        target = info.linkname
        if "\x00" in target or not target:
            raise UnsafeLayerError(f"layer entry symlink {info.name!r}: empty or NUL target")
        if not target.startswith("/"):
            depth = len(dirs)
            for part in target.split("/"):
                depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
                if depth < 0:
                    raise UnsafeLayerError(f"layer entry symlink {info.name!r} -> {target!r}: points above the root")
        self._remove(pfd, base)
        self.kernel.symlink(target, base, dir_fd=pfd)
        self._owner(base, info, pfd)
        os.utime(base, (info.mtime, info.mtime), dir_fd=pfd, follow_symlinks=False)

    def _hardlink(self, pfd: int, base: str, info: tarfile.TarInfo) -> None:
        tparts = _components(info.linkname, "hard link target")
        if not tparts:
            raise UnsafeLayerError(f"layer entry hard link {info.name!r}: links to the root directory")
        *tdirs, tbase = tparts
        tpath = "/".join(tparts)
        try:
            tpfd = self._open(self.rootfd, "/".join(tdirs), _DIR_FLAGS)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
            tpfd = None
        if tpfd is not None:
            try:
                st = os.stat(tbase, dir_fd=tpfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            try:
                if st is not None:
                    if stat.S_ISDIR(st.st_mode):
                        raise UnsafeLayerError(f"layer entry hard link {info.name!r} -> {tpath!r}: "
                                               "target is a directory")
                    if _inode(pfd, base) == st.st_ino:
                        return  # already this very file: linking again would fail with EEXIST
                    self._remove(pfd, base)
                    os.link(tbase, base, src_dir_fd=tpfd, dst_dir_fd=pfd, follow_symlinks=False)
                    return
            finally:
                os.close(tpfd)
        self._copy_from_lower(pfd, base, tpath, info)

    def _copy_from_lower(self, pfd: int, base: str, tpath: str, info: tarfile.TarInfo) -> None:
        """A hard link to a file of a lower layer: overlayfs cannot link across layers, so the file is copied
        up, and a FIFO or device node is made again as the same node. The target is looked at through an
        O_PATH fd: opening a FIFO to read it would wait for a writer that never comes."""
        for lfd in self.lowerfds:
            try:
                src = self._open(lfd, tpath, os.O_PATH | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                st = os.fstat(src)
                if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                    self._make_node(pfd, base, stat.S_IFMT(st.st_mode), st.st_rdev, st.st_uid, st.st_gid,
                                    st.st_mode, st.st_mtime)
                    return
                if not stat.S_ISREG(st.st_mode):
                    raise UnsafeLayerError(f"layer entry hard link {info.name!r} -> {tpath!r}: not a regular file")
                self._remove(pfd, base)
                data = os.open(f"/proc/self/fd/{src}", os.O_RDONLY | os.O_CLOEXEC)  # this very regular file
                dst = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=pfd)
                try:
                    while chunk := os.read(data, _CHUNK):
                        _write_all(dst, chunk)
                    if self.is_root:
                        self.kernel.chown(dst, st.st_uid, st.st_gid)
                    self.kernel.chmod(dst, stat.S_IMODE(st.st_mode))
                    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                finally:
                    os.close(dst)
                    os.close(data)
                return
            finally:
                os.close(src)
        raise UnsafeLayerError(f"layer entry hard link {info.name!r} -> {tpath!r}: target not found in the image")

    def _node(self, pfd: int, base: str, info: tarfile.TarInfo) -> None:
        kind = stat.S_IFCHR if info.ischr() else stat.S_IFBLK if info.isblk() else stat.S_IFIFO
        self._make_node(pfd, base, kind, os.makedev(info.devmajor, info.devminor), info.uid, info.gid, info.mode,
                        info.mtime)

    def _make_node(self, pfd: int, base: str, kind: int, rdev: int, uid: int, gid: int, mode: int,
                   mtime: float) -> None:
        """A FIFO or device node; its metadata is set through an O_PATH fd, never by opening the node."""
        self._remove(pfd, base)
        self.kernel.mknod(base, kind | 0o600, rdev, dir_fd=pfd)
        fd = os.open(base, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        try:
            if self.is_root:
                self.kernel.chown(f"/proc/self/fd/{fd}", uid, gid)
            self.kernel.chmod(f"/proc/self/fd/{fd}", mode & 0o7777)
            os.utime(f"/proc/self/fd/{fd}", (mtime, mtime))
        finally:
            os.close(fd)


def _inode(pfd: int, base: str) -> int | None:
    try:
        return os.stat(base, dir_fd=pfd, follow_symlinks=False).st_ino
    except FileNotFoundError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def apply_layer(blob: BinaryIO, dest: Path, *, kernel: Syscalls, lowers: Sequence[Path] = ()) -> LayerStats:
    """Unpack a (possibly compressed) layer tar into `dest`; `lowers` are the snapshots below it, topmost first.
    Ownership, modes, device nodes and symlinks are made through `kernel`.

    Returns the diff_id (sha256 of the uncompressed tar) for the caller to check against the image config.
    """
    rootfd = os.open(dest, _DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC)
    lowerfds = [os.open(p, _DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC) for p in lowers]
    applier = _Applier(kernel, rootfd, lowerfds)
    try:
        reader = _HashingReader(decompressed(blob))
        buffered = io.BufferedReader(reader, buffer_size=_CHUNK)
        try:
            with tarfile.open(fileobj=buffered, mode="r|") as tar:
                applier.apply(tar)
            while buffered.read(_CHUNK):
                pass
        except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise LayerFormatError(f"layer is not a valid tar: {e}") from e
        applier.stats.diff_id = "sha256:" + reader.hasher.hexdigest()
        return applier.stats
    finally:
        applier.close()
        for fd in lowerfds:
            os.close(fd)
        os.close(rootfd)


def usage(path: Path) -> int:
    """Bytes a snapshot takes on disk (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def copy_snapshot_into(kernel: Syscalls, src: Path, dest: Path) -> None:
    """The plain-copy fallback: replay an overlay-format snapshot onto a directory, honouring whiteouts."""
    links: dict[int, Path] = {}
    for dirpath, dirnames, filenames in os.walk(src):
        rel = posixpath.relpath(dirpath, src)
        target_dir = dest if rel == "." else dest / rel
        for name in list(dirnames) + filenames:
            s = os.path.join(dirpath, name)
            t = target_dir / name
            st = os.lstat(s)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                _rm(t)
                if name in dirnames:
                    dirnames.remove(name)
                continue
            if stat.S_ISDIR(st.st_mode):
                opaque = False
                try:
                    opaque = os.getxattr(s, OVERLAY_OPAQUE_XATTR, follow_symlinks=False) == b"y"
                except OSError:
                    pass
                if t.is_symlink() or (t.exists() and not t.is_dir()) or (opaque and t.exists()):
                    _rm(t)
                if not t.exists():
                    t.mkdir()
                shutil.copystat(s, t, follow_symlinks=False)
                kernel.chown(str(t), st.st_uid, st.st_gid, follow_symlinks=False)
            else:
                _rm(t)
                if st.st_nlink > 1 and st.st_ino in links:
                    os.link(links[st.st_ino], t, follow_symlinks=False)
                    continue
                links[st.st_ino] = t
                if stat.S_ISREG(st.st_mode):
                    shutil.copy2(s, t, follow_symlinks=False)
                elif stat.S_ISLNK(st.st_mode):
                    kernel.symlink(os.readlink(s), str(t))
                else:
                    kernel.mknod(str(t), st.st_mode, st.st_rdev)
                kernel.chown(str(t), st.st_uid, st.st_gid, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    kernel.chmod(str(t), stat.S_IMODE(st.st_mode))
    for dirpath, _dirnames, _files in os.walk(src):
        rel = posixpath.relpath(dirpath, src)
        t = dest if rel == "." else dest / rel
        if t.is_dir() and not t.is_symlink():
            shutil.copystat(dirpath, t, follow_symlinks=False)


def _rm(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
