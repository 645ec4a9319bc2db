"""Layer extraction: containerd's TestBreakouts cases, OCI whiteouts, and the overlay on-disk format.

Every case runs with a decoy tree next to the snapshot directory, and the host's /etc is watched too; whether a
case is refused or applied, nothing outside the snapshot may change. Where containerd clamps an escaping name or
link back into the root, we refuse it instead (names with '..', absolute names, relative symlinks that climb
above the root, hard links out); symlinks that stay inside are followed within the root, as containerd does.
"""
from __future__ import annotations

import io
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from pyruntime.images import unpack
from pyruntime.images.unpack import OVERLAY_OPAQUE_XATTR, LayerFormatError, LayerStats, UnsafeLayerError
from pyruntime.linux.resolve import open_in_root
from pyruntime.linux.syscalls import LinuxSyscalls
from tests.kit.images import (
    LAYERED_BASE,
    LAYERED_THIRD,
    LAYERED_TOP,
    Entry,
    compress,
    d,
    f,
    hardlink,
    symlink,
    tar_entries,
)

REFUSE = "refuse"
KERNEL = LinuxSyscalls()  # the unpacker writes real files, all under tmp_path
HOST_WATCH = ["/etc/unbroken", "/etc/emptied", "/etc/whitedout", "/localetc", "/breakout", "/dne"]


def apply_layer(blob, dest: Path, lowers: Sequence[Path] = ()) -> LayerStats:
    return unpack.apply_layer(blob, dest, kernel=KERNEL, lowers=lowers)


def copy_snapshot_into(src: Path, dest: Path) -> None:
    unpack.copy_snapshot_into(KERNEL, src, dest)


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            content = Path(p).read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_nlink, st.st_size, content)
    return out


def _stat_in(root: Path, path: str) -> os.stat_result:
    rootfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = open_in_root(KERNEL, rootfd, path, os.O_PATH, same_mount=True)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)
    finally:
        os.close(rootfd)


def same_file(a: str, b: str):
    def check(root: Path) -> None:
        sa, sb = _stat_in(root, a), _stat_in(root, b)
        assert (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino), f"{a} and {b} differ"
    return check


def not_same_file(a: str, b: str):
    def check(root: Path) -> None:
        sa, sb = _stat_in(root, a), _stat_in(root, b)
        assert (sa.st_dev, sa.st_ino) != (sb.st_dev, sb.st_ino)
    return check


def value(path: str, content: bytes):
    def check(root: Path) -> None:
        assert (root / path).read_bytes() == content
    return check


def whited_out(path: str):
    def check(root: Path) -> None:
        st = os.lstat(root / path)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0, f"{path} is not an overlay whiteout"
    return check


def missing(path: str):
    def check(root: Path) -> None:
        assert not os.path.lexists(root / path)
    return check


def all_of(*checks):
    def check(root: Path) -> None:
        for c in checks:
            c(root)
    return check


unbroken = value("etc/unbroken", b"unbroken")
etc = [d("etc", 0o770), f("etc/passwd", "inside")]

# (name, entries already in the snapshot, layer entries, REFUSE or a validator)
CASES = [
    ("SymlinkAbsolute", [], [d("etc"), symlink("localetc", "/etc"), f("localetc/unbroken", "unbroken")], unbroken),
    ("SymlinkAbsoluteName", [], [d("etc"), symlink("localetc", "/etc"), f("/localetc/unbroken", "unbroken")],
     REFUSE),
    ("SymlinkUpAndOut", [], [d("etc"), d("dummy"), symlink("localetc", "/dummy/../etc"),
                             f("localetc/unbroken", "unbroken")], unbroken),
    ("SymlinkMultipleAbsolute", [], [d("etc"), d("dummy"), symlink("dummy/etc", "/etc"),
                                     symlink("localetc", "/dummy/etc"), f("dummy/etc/unbroken", "unbroken")],
     unbroken),
    ("SymlinkMultipleRelative", [], [d("etc"), d("dummy"), symlink("dummy/etc", "/etc"),
                                     symlink("localetc", "./dummy/etc"), f("dummy/etc/unbroken", "unbroken")],
     unbroken),
    ("SymlinkEmptyFile", [], [d("etc"), f("etc/emptied", "notempty"), symlink("localetc", "/etc"),
                              f("localetc/emptied", "")], value("etc/emptied", b"")),
    ("HardlinkRelative", [], etc + [d("breakouts"), symlink("breakouts/d1", "../../etc"),
                                    hardlink("breakouts/mypasswd", "breakouts/d1/passwd")], REFUSE),
    ("HardlinkDownAndOut", [], etc + [d("breakouts"), d("downandout"),
                                      symlink("breakouts/d1", "../downandout/../../etc"),
                                      hardlink("breakouts/mypasswd", "breakouts/d1/passwd")], REFUSE),
    ("HardlinkAbsolute", [], etc + [symlink("localetc", "/etc"), hardlink("localpasswd", "/localetc/passwd")],
     REFUSE),
    ("HardlinkThroughAbsoluteSymlink", [], etc + [symlink("localetc", "/etc"),
                                                  hardlink("localpasswd", "localetc/passwd")],
     same_file("localpasswd", "etc/passwd")),
    ("HardlinkRelativeLong", [], etc + [symlink("localetc", "../../../../../../../etc"),
                                        hardlink("localpasswd", "localetc/passwd")], REFUSE),
    ("HardlinkRelativeUpAndOut", [], etc + [symlink("localetc", "upandout/../../../etc"),
                                            hardlink("localpasswd", "localetc/passwd")], REFUSE),
    ("HardlinkDirectRelative", [], etc + [hardlink("localpasswd", "../../../../../etc/passwd")], REFUSE),
    ("HardlinkDirectAbsolute", [], etc + [hardlink("localpasswd", "/etc/passwd")], REFUSE),
    ("SymlinkParentDirectory", [], etc + [symlink("..", "/etc/"), hardlink("localpasswd", "etc/passwd")], REFUSE),
    ("SymlinkEmptyFilename", [], etc + [symlink("", "/etc/"), hardlink("localpasswd", "etc/passwd")], REFUSE),
    ("SymlinkParentRelative", [], etc + [symlink("localetc/sub/..", "/etc/"),
                                         hardlink("localetc/localpasswd", "etc/passwd")], REFUSE),
    ("SymlinkSlashEnded", [], etc + [d("localetc/", 0o770), hardlink("localetc/localpasswd", "etc/passwd")],
     same_file("localetc/localpasswd", "etc/passwd")),
    ("SymlinkOverrideDirectory", [d("etc"), f("etc/passwd", "inside"), d("localetc")],
     [symlink("localetc", "/etc"), hardlink("localetc/localpasswd", "etc/passwd")],
     same_file("localetc/localpasswd", "etc/passwd")),
    ("SymlinkOverrideDirectoryRelative", [d("etc"), f("etc/passwd", "inside"), d("localetc")],
     [symlink("localetc", "../../etc"), hardlink("localetc/localpasswd", "etc/passwd")], REFUSE),
    ("DirectoryOverrideSymlink", [d("etc"), f("etc/passwd", "inside"), symlink("localetc", "/etc")],
     [d("localetc/"), hardlink("localetc/localpasswd", "etc/passwd")],
     same_file("localetc/localpasswd", "etc/passwd")),
    ("DirectoryOverrideSymlinkAndHardlink", [d("etc"), f("etc/passwd", "inside"), symlink("localetc", "etc"),
                                             hardlink("localetc/localpasswd", "etc/passwd")],
     [d("localetc/"), f("localetc/localpasswd", "different")],
     all_of(not_same_file("localetc/localpasswd", "etc/passwd"), value("etc/passwd", b"inside"))),
    ("WhiteoutRootParent", [d("etc"), f("etc/passwd", "inside")], [f(".wh...")], REFUSE),
    ("WhiteoutParent", [d("etc"), f("etc/passwd", "inside")], [f("etc/.wh...")], REFUSE),
    ("WhiteoutRoot", [d("etc"), f("etc/passwd", "inside")], [f(".wh..")], REFUSE),
    ("WhiteoutCurrentDirectory", [d("etc"), f("etc/passwd", "inside")], [f("etc/.wh..")], REFUSE),
    ("WhiteoutSymlink", [d("etc"), f("etc/passwd", "all users"), symlink("localetc", "/etc")],
     [f(".wh.localetc")], all_of(value("etc/passwd", b"all users"), whited_out("localetc"))),
    ("WhiteoutSymlinkPath", [d("etc"), f("etc/passwd", "all users"), f("etc/whitedout", "ahhhh whiteout"),
                             symlink("localetc", "/etc")],
     [f("localetc/.wh.whitedout")], all_of(value("etc/passwd", b"all users"), whited_out("etc/whitedout"))),
    ("WhiteoutDirectoryName", [d("etc"), f("etc/passwd", "all users"), symlink("localetc", "/etc")],
     [f(".wh.etc/somefile", "non-empty")],
     all_of(value("etc/passwd", b"all users"), value(".wh.etc/somefile", b"non-empty"))),
    ("WhiteoutDeadSymlinkParent", [d("etc"), f("etc/passwd", "all users"), symlink("localetc", "/dne")],
     [f("localetc/.wh.etc")], value("etc/passwd", b"all users")),
    ("WhiteoutRelativePath", [d("etc"), f("etc/passwd", "all users"), symlink("localetc", "/dne")],
     [f("dne/../.wh.etc")], REFUSE),
    ("HardlinkSymlinkBeforeCreateTarget", [], [d("etc", 0o770), symlink("localpasswd", "/etc/passwd"),
                                               hardlink("localpasswd-dup", "localpasswd"), f("etc/passwd", "after")],
     same_file("localpasswd-dup", "etc/passwd")),
    ("HardlinkSymlinkRelative", [], etc + [symlink("passwdlink", "../../../../../etc/passwd"),
                                           hardlink("localpasswd", "passwdlink")], REFUSE),
    ("HardlinkSymlinkAbsolute", [], etc + [symlink("passwdlink", "/etc/passwd"),
                                           hardlink("localpasswd", "passwdlink")],
     all_of(same_file("localpasswd", "etc/passwd"), same_file("localpasswd", "passwdlink"))),
    ("TarSlipDotDot", [], [f("../../outside/evil", "pwned")], REFUSE),
    ("TarSlipDeep", [], [d("a"), f("a/../../outside/evil", "pwned")], REFUSE),
    ("SymlinkDirThenFileOutside", [], [symlink("out", "../outside"), f("out/evil", "pwned")], REFUSE),
    ("SymlinkAbsoluteToHostThenWrite", [], [symlink("tmpdir", "/tmp"), f("tmpdir/pynode-unpack-evil", "pwned")],
     lambda root: (root / "tmpdir/pynode-unpack-evil").read_text() == "pwned"),
    ("HardlinkToHostFile", [], [hardlink("passwd", "/etc/passwd")], REFUSE),
    ("DeviceNode", [], [Entry("chr", "null", mode=0o666, major=1, minor=3)],
     lambda root: os.major(os.lstat(root / "null").st_rdev) == 1),
]


@pytest.mark.parametrize("name,pre,entries,expect", CASES, ids=[c[0] for c in CASES])
def test_breakouts(tmp_path: Path, name, pre, entries, expect) -> None:
    if name == "DeviceNode" and os.geteuid() != 0:
        pytest.skip("mknod of a real device needs root")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("hello")
    root = tmp_path / "root"
    root.mkdir()
    if pre:
        apply_layer(io.BytesIO(tar_entries(pre)), root)
    before = _tree(outside)
    host_passwd = os.stat("/etc/passwd")
    host_state = {p: os.path.lexists(p) for p in HOST_WATCH + ["/tmp/pynode-unpack-evil"]}

    layer = io.BytesIO(compress(tar_entries(entries), "gzip"))
    if expect == REFUSE:
        with pytest.raises(UnsafeLayerError):
            apply_layer(layer, root)
    else:
        apply_layer(layer, root)
        result = expect(root)
        assert result is None or result is True

    assert _tree(outside) == before
    after_passwd = os.stat("/etc/passwd")
    assert (after_passwd.st_nlink, after_passwd.st_mtime_ns, after_passwd.st_size) == \
        (host_passwd.st_nlink, host_passwd.st_mtime_ns, host_passwd.st_size)
    assert {p: os.path.lexists(p) for p in host_state} == host_state


def test_refusal_names_the_entry(tmp_path: Path) -> None:
    with pytest.raises(UnsafeLayerError, match=r"\.\./escape"):
        apply_layer(io.BytesIO(tar_entries([f("../escape", "x")])), tmp_path)


def test_not_a_tar_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(LayerFormatError):
        apply_layer(io.BytesIO(compress(b"\x01" * 4096, "gzip")), tmp_path)


def test_diff_id_is_sha256_of_uncompressed_tar(tmp_path: Path) -> None:
    import hashlib
    raw = tar_entries([d("x"), f("x/y", "z")])
    for compression in ("gzip", "zstd", "none"):
        dest = tmp_path / compression
        dest.mkdir()
        stats = apply_layer(io.BytesIO(compress(raw, compression)), dest)
        assert stats.diff_id == "sha256:" + hashlib.sha256(raw).hexdigest()
        assert (dest / "x/y").read_text() == "z"


def _layered(tmp_path: Path) -> list[Path]:
    """The kit's layered image without busybox, applied snapshot by snapshot."""
    snaps: list[Path] = []
    for i, entries in enumerate([[d("etc", 0o755), d("bin")], LAYERED_BASE, LAYERED_TOP, LAYERED_THIRD]):
        snap = tmp_path / f"snap{i}"
        snap.mkdir()
        apply_layer(io.BytesIO(compress(tar_entries(entries), "zstd" if i == 3 else "gzip")), snap,
                    lowers=list(reversed(snaps)))
        snaps.append(snap)
    return snaps


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay xattrs and device nodes need root")
def test_whiteouts_in_overlay_format(tmp_path: Path) -> None:
    snaps = _layered(tmp_path)
    top = snaps[2]
    whited_out("data/remove-me")(top)
    whited_out("data/subdir")(top)
    assert os.getxattr(top / "opq", OVERLAY_OPAQUE_XATTR) == b"y"
    assert (top / "opq/new").read_text() == "new"
    assert stat.S_IMODE(os.stat(top / "opq").st_mode) == 0o750  # implicit parent copies the lower's mode
    st = os.stat(top / "app/hello")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o755)
    assert os.stat(top / "app/hello-link").st_ino == st.st_ino
    assert stat.S_IMODE(os.stat(top / "app/setuid").st_mode) == 0o4755
    assert os.readlink(top / "app/motd") == "/etc/motd"
    assert os.getxattr(top / "app/xattr", "user.pynode") == b"yes"
    assert stat.S_ISFIFO(os.lstat(top / "app/fifo").st_mode)
    assert os.lstat(top / "app/null").st_rdev == os.makedev(1, 3)


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay xattrs and device nodes need root")
def test_copy_fallback_applies_whiteouts(tmp_path: Path) -> None:
    snaps = _layered(tmp_path)
    merged = tmp_path / "merged"
    merged.mkdir()
    for snap in snaps:
        copy_snapshot_into(snap, merged)
    assert (merged / "data/keep").read_text() == "keep"
    assert (merged / "data/added").read_text() == "added"
    assert not (merged / "data/remove-me").exists()
    assert not (merged / "data/subdir").exists()
    assert sorted(os.listdir(merged / "opq")) == ["new"]
    assert (merged / "etc/motd").read_text() == "third motd\n"
    assert os.stat(merged / "app/motd-link").st_ino == os.stat(merged / "etc/motd").st_ino
    assert not (merged / "app/setuid").exists()
    assert (merged / "app/hello").read_text().startswith("#!/bin/sh")


def test_hard_link_to_lower_layer_is_copied_up(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    lower.mkdir()
    upper.mkdir()
    apply_layer(io.BytesIO(tar_entries([d("data"), f("data/keep", "keep", 0o640)])), lower)
    apply_layer(io.BytesIO(tar_entries([hardlink("keep-link", "data/keep")])), upper, lowers=[lower])
    assert (upper / "keep-link").read_text() == "keep"
    assert stat.S_IMODE(os.stat(upper / "keep-link").st_mode) == 0o640


def _apply_in_thread(blob: bytes, dest: Path, lowers: Sequence[Path] = ()) -> None:
    """apply_layer with a generous limit: an unpack that opened a FIFO would wait for a peer for ever."""
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            apply_layer(io.BytesIO(blob), dest, lowers=lowers)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # open the FIFO's other end so the blocked open returns and the thread ends
        for fifo in [p for root in [dest, *lowers] for p in root.rglob("*") if p.is_fifo()]:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(30)
        pytest.fail("the unpack hung on a FIFO")
    if errors:
        raise errors[0]


def test_fifo_and_a_hard_link_to_it_in_a_lower_layer(tmp_path: Path) -> None:
    """Issue 22: a hard link to a lower layer's FIFO was 'copied up' by opening the FIFO for reading,
    which waits for a writer that never comes: a pull hung for good. The link is now made as the node it
    names, without opening it; within one layer the link is a link()."""
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    lower.mkdir()
    upper.mkdir()
    _apply_in_thread(tar_entries([d("run"), Entry("fifo", "run/pipe", mode=0o640), hardlink("run/same", "run/pipe")]),
                     lower)
    st = os.lstat(lower / "run/pipe")
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640 and st.st_nlink == 2
    assert os.path.samefile(lower / "run/pipe", lower / "run/same")
    _apply_in_thread(tar_entries([hardlink("pipe-link", "run/pipe")]), upper, lowers=[lower])
    st = os.lstat(upper / "pipe-link")
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640


def test_hard_link_to_missing_target_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeLayerError, match="not found"):
        apply_layer(io.BytesIO(tar_entries([hardlink("x", "nowhere")])), tmp_path)


def test_overlay_xattrs_from_a_layer_are_ignored(tmp_path: Path) -> None:
    apply_layer(io.BytesIO(tar_entries([d("x", xattrs={"trusted.overlay.redirect": "/etc"})])), tmp_path)
    with pytest.raises(OSError):
        os.getxattr(tmp_path / "x", "trusted.overlay.redirect")
