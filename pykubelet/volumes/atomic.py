"""The kubelet's AtomicWriter: configMap, secret, downwardAPI and projected volumes change all at once.

A container reading a volume while the kubelet updates it must see the old set of files or the new one,
never a mix (a certificate with the old key). So every version is written whole into a fresh hidden
directory `..YYYY_MM_DD_HH_MM_SS.XXXX`, the symlink `..data` is switched to it by one rename(2) of
`..data_tmp` over it, and each user-visible name is a symlink through `..data` (`key -> ..data/key`),
made once. The old version is removed after the switch. The layout is upstream's, byte for byte, so
programs that watch for the `..data` rename (inotify reloaders) work as with the stock kubelet.

Payload paths come from the API (item paths, keys) and are checked again here: relative, no `..`
element, no leading `..` (reserved for the writer), so nothing is written outside the volume.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path, PurePosixPath

from pykubelet import dirs
from pykubelet.volumes.errors import VolumeError

DATA = "..data"
VOLUME_MODE = 0o755  # the volume's own directories, which its container's user walks (the kubelet's too)
DATA_TMP = "..data_tmp"


class PayloadError(VolumeError):
    """A payload path that would escape or clash with the writer's own names."""


def check_path(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute():
        raise PayloadError(f"invalid path {path!r}: must be relative and not empty")
    if ".." in p.parts:
        raise PayloadError(f"invalid path {path!r}: must not contain '..'")
    if path.startswith(".."):
        raise PayloadError(f"invalid path {path!r}: must not start with '..'")
    return str(p)


def _same(payload: dict[str, tuple[bytes, int]], old: Path) -> bool:
    for path, (data, mode) in payload.items():
        f = old / path
        try:
            if f.is_symlink() or f.read_bytes() != data or (f.stat().st_mode & 0o7777) != mode:
                return False
        except OSError:
            return False
    old_files = {str(p.relative_to(old)) for p in old.rglob("*") if not p.is_dir()}
    return old_files == set(payload)


def write(target: Path, payload: dict[str, tuple[bytes, int]]) -> bool:
    """Makes `target` hold exactly `payload` (path -> (content, mode)); returns whether it wrote a new
    version (False: the content was already there)."""
    payload = {check_path(p): v for p, v in payload.items()}
    dirs.make_dirs(target, VOLUME_MODE, narrow=False)
    data_link = target / DATA
    try:
        old_name: str | None = os.readlink(data_link)
    except FileNotFoundError:
        old_name = None
    old_top = set()
    if old_name is not None:
        old_dir = target / old_name
        old_top = {p.name for p in old_dir.iterdir()} if old_dir.is_dir() else set()
        new_top = {PurePosixPath(p).parts[0] for p in payload}
        if _same(payload, old_dir) and old_top == new_top:
            return False
    ts = tempfile.mkdtemp(prefix=time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()), dir=target)
    os.chmod(ts, VOLUME_MODE)
    try:
        for path, (data, mode) in payload.items():
            f = Path(ts) / path
            dirs.make_dirs(f.parent, VOLUME_MODE)
            with open(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as out:
                out.write(data)
            os.chmod(f, mode)
        tmp_link = target / DATA_TMP
        tmp_link.unlink(missing_ok=True)
        os.symlink(os.path.basename(ts), tmp_link)
        os.rename(tmp_link, data_link)
    except BaseException:
        shutil.rmtree(ts, ignore_errors=True)
        raise
    new_top = {PurePosixPath(p).parts[0] for p in payload}
    for name in new_top:  # the user-visible names: symlinks through ..data, made once
        link = target / name
        if not link.is_symlink():
            os.symlink(f"{DATA}/{name}", link)
    for name in old_top - new_top:
        (target / name).unlink(missing_ok=True)
    if old_name is not None:
        shutil.rmtree(target / old_name, ignore_errors=True)
    return True
