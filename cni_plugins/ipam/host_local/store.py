"""The on-disk allocation store, file-compatible with the reference host-local.

One file per IP named by the address and holding `containerID\\r\\nifname`, `last_reserved_ip.N` per range
set, and a `lock` file whose flock serialises every writer (processes and helper threads alike, since each
open gets its own lock). A reservation is written to a per-attachment temporary file and hard-linked into
place, so a plugin killed at any point leaves either a complete allocation or a temporary file that DEL
and GC of the same attachment remove.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cni_plugins.fsutil import atomic_write
from cni_plugins.result import IPAddress
from cni_plugins.skel import ERR_IO_FAILURE, CNIError

LAST_RESERVED_PREFIX = "last_reserved_ip."
LOCK_NAME = "lock"
TMP_PREFIX = ".reserve."


class Store:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @contextmanager
    def locked(self) -> Iterator["Store"]:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
        tmp.write_bytes(f"{container_id}\r\n{ifname}".encode())
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
        atomic_write(self.dir / f"{LAST_RESERVED_PREFIX}{range_id}", str(ip))

    def last_reserved(self, range_id: int) -> IPAddress | None:
        try:
            return ipaddress.ip_address((self.dir / f"{LAST_RESERVED_PREFIX}{range_id}").read_text().strip())
        except (OSError, ValueError):
            return None

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
