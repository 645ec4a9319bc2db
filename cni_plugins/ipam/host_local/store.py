"""The on-disk allocation store, file-compatible with the reference host-local.

One file per IP named by the address and holding `containerID\\r\\nifname`, `last_reserved_ip.N` per range
set, and a `lock` file whose flock serialises every writer (processes and helper threads alike, since each
open gets its own lock). A reservation is written to a per-attachment temporary file and hard-linked into
place, so a plugin killed at any point leaves either a complete allocation or a temporary file that DEL
and GC of the same attachment remove.

Modes are the reference's (v1.10.0): directories 0755 (MkdirAll), allocation and `last_reserved_ip.N`
files 0600 (the container ids in them are nobody else's business), and the lock 0750 (go-filemutex's
mode). The directories' modes are set, not left to the umask: under umask 000 the reference leaves the
store world-writable, and a host user could plant allocations or a `lock` symlink that root then opens.
A store dir an older version left wider is narrowed to 0755 when the plugin opens it. Files keep the
umask's narrowing, which never opens them.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cni_plugins.result import IPAddress
from cni_plugins.skel import ERR_IO_FAILURE, CNIError
from pynode_os.files import make_dirs

LAST_RESERVED_PREFIX = "last_reserved_ip."
LOCK_NAME = "lock"
TMP_PREFIX = ".reserve."
DIR_MODE = 0o755
FILE_MODE = 0o600
LOCK_MODE = 0o750


class DiskAllocationStore:
    """The reference's disk.Store: the AllocationStore (backend.py) host-local runs on."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @contextmanager
    def locked(self) -> Iterator[DiskAllocationStore]:
        try:
            make_dirs(self.dir, DIR_MODE, chmod=os.chmod)
            fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_MODE)
        except OSError as exc:
            raise CNIError(ERR_IO_FAILURE, f"cannot open the IPAM store {self.dir}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)

    def reserve(self, container_id: str, ifname: str, ip: IPAddress, range_id: int) -> bool:
        """Claims `ip` for the attachment; False when another attachment holds it."""
        final = self.dir / str(ip)
        tmp = self._tmp_path(container_id, ifname)
        _write_new(tmp, f"{container_id}\r\n{ifname}".encode())
        try:
            os.link(tmp, final)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        self._write_last_reserved(range_id, ip)
        return True

    def _tmp_path(self, container_id: str, ifname: str) -> Path:
        return self.dir / f"{TMP_PREFIX}{container_id}.{ifname}"

    def _write_last_reserved(self, range_id: int, ip: IPAddress) -> None:
        """Renamed into place but not fsynced, on the ADD path: it is a round-robin hint, which the
        reference writes without a sync, and an unreadable one restarts the scan at the range's start."""
        path = self.dir / f"{LAST_RESERVED_PREFIX}{range_id}"
        tmp = path.with_name(path.name + ".tmp")
        _write_new(tmp, str(ip).encode())
        os.replace(tmp, path)

    def last_reserved(self, range_id: int) -> IPAddress | None:
        path = self.dir / f"{LAST_RESERVED_PREFIX}{range_id}"
        try:
            return ipaddress.ip_address(path.read_text().strip())
        except FileNotFoundError:
            return None
        except ValueError:  # unparsable (the reference's net.ParseIP gives nil): start from the range's start
            return None
        except OSError as exc:
            raise CNIError(ERR_IO_FAILURE, f"cannot read {path}: {exc.strerror}") from exc

    def allocations(self) -> Iterator[tuple[Path, str, str]]:
        """Every allocation file with its (container id, ifname); temporary files included."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return
        for name in names:
            if name == LOCK_NAME or name.startswith(LAST_RESERVED_PREFIX):
                continue
            path = self.dir / name
            try:
                content = path.read_bytes().decode(errors="replace")
            except (FileNotFoundError, IsADirectoryError):
                continue
            container_id, _, ifname = content.partition("\r\n")
            yield path, container_id.strip(), ifname.strip()

    def ips_of(self, container_id: str, ifname: str) -> list[IPAddress]:
        out = []
        for path, cid, name in self.allocations():
            if (cid, name) == (container_id, ifname) and not path.name.startswith(TMP_PREFIX):
                out.append(ipaddress.ip_address(path.name))
        return out

    def release_by_id(self, container_id: str, ifname: str) -> None:
        # the temporary file by its name too: a plugin killed between creating and writing it left it empty
        _unlink(self._tmp_path(container_id, ifname))
        for path, cid, name in self.allocations():
            if (cid, name) == (container_id, ifname):
                _unlink(path)

    def release(self, ip: IPAddress) -> None:
        _unlink(self.dir / str(ip))

    def release_all_but(self, valid: set[tuple[str, str]]) -> None:
        for path, cid, name in self.allocations():
            if (cid, name) not in valid:
                _unlink(path)

    def is_allocated(self, ip: IPAddress) -> bool:
        return (self.dir / str(ip)).exists()


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise CNIError(ERR_IO_FAILURE, f"cannot release {path.name}: {exc.strerror}") from exc


def _write_new(path: Path, data: bytes) -> None:
    """Writes `path` afresh with FILE_MODE: a leftover of a killed call is replaced, never reused with its mode."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
