"""The pem files of a certificate and its key under --cert-dir, as client-go's certificate FileStore keeps
them: NAME-<timestamp>.pem (the certificate chain, then the key, 0600) for each certificate obtained, and
NAME-current.pem, a symlink to the one in use, which the kubeconfig names.

The symlink is swapped by renaming a new one over it, so a reader (the API client reconnecting, a kubelet
starting) sees the old pair or the new one, never a missing file or a certificate beside another's key.
The directory is 0700 and the pem files 0600 whatever the umask: they hold the private key. Older pem files
stay (as the kubelet leaves them): one that still verifies is what an admin falls back to by hand.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from pykubelet.dirs import make_dirs
from pykubelet.errors import FailedPreconditionError, InvalidArgumentError
from pynode_os.files import FULL, atomic_write, fsync_dir

DIR_MODE = 0o700
PEM_MODE = 0o600


class StoreError(FailedPreconditionError):
    """The cert dir cannot hold the pair (NAME-current.pem is a regular file, the directory unwritable)."""


class PemError(InvalidArgumentError):
    """A pem file or a signed certificate is not a certificate chain with its key."""


@dataclass(frozen=True)
class Pair:
    chain: list[x509.Certificate]  # the leaf first
    key: PrivateKeyTypes
    path: Path

    @property
    def leaf(self) -> x509.Certificate:
        return self.chain[0]


def parse(data: bytes, path: Path) -> Pair:
    """A pem with certificates and one private key (the kubelet's layout, or any order)."""
    try:
        chain = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise PemError(f"{path}: no certificate: {e}") from None
    key_blocks = [b for b in _blocks(data) if b"PRIVATE KEY" in b.split(b"\n", 1)[0]]
    if len(key_blocks) != 1:
        raise PemError(f"{path}: {len(key_blocks)} private keys, expected 1")
    try:
        key = serialization.load_pem_private_key(key_blocks[0], password=None)
    except (ValueError, TypeError) as e:
        raise PemError(f"{path}: private key: {e}") from None
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
            != chain[0].public_key().public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo):
        raise PemError(f"{path}: the private key is not the certificate's")
    return Pair(chain, key, path)


def _blocks(data: bytes) -> list[bytes]:
    out, current = [], []
    for line in data.splitlines(keepends=True):
        if line.startswith(b"-----BEGIN "):
            current = [line]
        elif current:
            current.append(line)
            if line.startswith(b"-----END "):
                out.append(b"".join(current))
                current = []
    return out


class FileStore:
    """`name`'s pairs in `directory` (name: kubelet-client or kubelet-server)."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.directory = name, directory

    @property
    def current_path(self) -> Path:
        return self.directory / f"{self.name}-current.pem"

    def current(self) -> Pair | None:
        """The pair in use, or None when there is none or it can't be read (the caller asks for a new one)."""
        try:
            return parse(self.current_path.read_bytes(), self.current_path)
        except (OSError, PemError):
            return None

    def update(self, cert_pem: bytes, key_pem: bytes, now: datetime.datetime | None = None) -> Pair:
        """Writes the signed chain with its key to a new timestamped file and points NAME-current.pem at it."""
        chain = _certificates(cert_pem)
        key_blocks = [b for b in _blocks(key_pem) if b"PRIVATE KEY" in b.split(b"\n", 1)[0]]
        if len(key_blocks) != 1:
            raise PemError(f"{self.name}: {len(key_blocks)} private keys to store, expected 1")
        data = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain) + key_blocks[0]
        pair = parse(data, self.directory)  # a certificate issued for another key is refused before it is written
        make_dirs(self.directory, DIR_MODE)
        stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%d-%H-%M-%S")
        path = self.directory / f"{self.name}-{stamp}.pem"
        atomic_write(path, data, mode=PEM_MODE, sync=FULL, exact=True)
        self._point_current_at(path)
        return Pair(pair.chain, pair.key, path)

    def _point_current_at(self, path: Path) -> None:
        current = self.current_path
        if current.exists() and not current.is_symlink():
            raise StoreError(f"{current} is a regular file, not the symlink the kubelet keeps: move it away")
        tmp = self.directory / f".{current.name}.tmp"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.symlink(path.name, tmp)  # relative: the cert dir may be moved or seen through a bind mount
        os.replace(tmp, current)
        fsync_dir(self.directory)


def _certificates(data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise PemError(f"the issued certificate: {e}") from None
