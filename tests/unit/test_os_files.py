"""The one atomic replace (pynode_os.files): a reader sees the old file or the new, and a failed write leaves
no trace."""
from __future__ import annotations

import os
import stat

import pytest

from pynode_os.files import DATA, FULL, NONE, atomic_file, atomic_write


def test_replaces_the_file_with_its_mode(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 & ~_umask()
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "images.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(target) as f:
        f.write(b"half")
        raise RuntimeError("killed half way")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["images.json"]


def test_the_temporary_name_can_be_chosen(tmp_path):
    (tmp_path / "ingest").mkdir()
    target = tmp_path / "blob"
    seen = []
    with atomic_file(target, tmp=tmp_path / "ingest" / "blob.put") as f:
        f.write(b"x")
        seen = os.listdir(tmp_path / "ingest")
    assert seen == ["blob.put"] and target.read_bytes() == b"x" and os.listdir(tmp_path / "ingest") == []


@pytest.mark.parametrize("sync,syncs", [(FULL, 2), (DATA, 1), (NONE, 0)])
def test_each_sync_level_syncs_the_file_and_its_directory_or_less(tmp_path, monkeypatch, sync, syncs):
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    atomic_write(tmp_path / "state.json", b"x", sync=sync)
    assert len(synced) == syncs and (tmp_path / "state.json").read_bytes() == b"x"


def test_an_exact_mode_holds_whatever_the_umask_and_a_leftover_temporary_file(tmp_path):
    target = tmp_path / "kubelet.key"
    (tmp_path / ".kubelet.key.tmp").write_text("left by a killed write")
    os.chmod(tmp_path / ".kubelet.key.tmp", 0o666)
    old = os.umask(0o077)
    try:
        atomic_write(target, b"launcher", mode=0o755, exact=True)
        assert stat.S_IMODE(target.stat().st_mode) == 0o755
    finally:
        os.umask(old)
    os.umask(0)
    try:
        atomic_write(target, b"key", mode=0o600, exact=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and os.listdir(tmp_path) == ["kubelet.key"]


def test_the_temporary_file_is_never_followed_through_a_symlink(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    (tmp_path / ".state.json.tmp").symlink_to(elsewhere)
    with pytest.raises(OSError):
        atomic_write(tmp_path / "state.json", b"x")
    assert elsewhere.read_text() == "untouched" and not (tmp_path / "state.json").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
