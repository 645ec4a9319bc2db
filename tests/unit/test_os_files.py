"""pynode_os.files: the one atomic replace (a reader sees the old file or the new, and a failed write leaves
no trace) and the one mkdir -p with exact modes."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pynode_os.files import DATA, FULL, NONE, atomic_file, atomic_write, make_dirs
from tests.unit.test_state_modes import mode, umask


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


def test_make_dirs_sets_every_level_it_makes_whatever_the_umask(tmp_path: Path) -> None:
    for mask in (0o000, 0o077):
        top = tmp_path / f"mask{mask:o}"
        with umask(mask):
            make_dirs(top / "a" / "b", 0o711, chmod=os.chmod)
        assert [mode(top), mode(top / "a"), mode(top / "a" / "b")] == [0o711] * 3


def test_make_dirs_narrows_the_directory_but_never_its_parents_nor_widens(tmp_path: Path) -> None:
    parent = tmp_path / "var"
    (parent / "lib").mkdir(parents=True)
    os.chmod(parent, 0o755)
    os.chmod(parent / "lib", 0o777)  # an older version's, under umask 000
    make_dirs(parent / "lib", 0o700, chmod=os.chmod)
    make_dirs(parent / "lib" / "x", 0o700, chmod=os.chmod)
    assert (mode(parent), mode(parent / "lib"), mode(parent / "lib" / "x")) == (0o755, 0o700, 0o700)
    os.chmod(parent / "lib", 0o750)
    make_dirs(parent / "lib", 0o711, chmod=os.chmod)
    assert mode(parent / "lib") == 0o710  # narrowed to what both allow, not opened
    socket_dir = tmp_path / "run"
    socket_dir.mkdir()
    os.chmod(socket_dir, 0o1777)  # the host's
    make_dirs(socket_dir, 0o711, chmod=os.chmod, narrow=False)
    assert mode(socket_dir) == 0o1777


def test_make_dirs_changes_modes_only_through_the_chmod_it_is_handed(tmp_path: Path) -> None:
    """The runtime hands its Syscalls.chmod: a FakeSyscalls records the calls and makes none."""
    calls: list[tuple[str, int]] = []
    with umask(0o077):
        make_dirs(tmp_path / "a" / "b", 0o711, chmod=lambda path, mode: calls.append((path, mode)))
    assert calls == [(str(tmp_path / "a"), 0o711), (str(tmp_path / "a" / "b"), 0o711)]
    assert mode(tmp_path / "a") == 0o700  # what mkdir(2) left under the umask: nothing else touched it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
