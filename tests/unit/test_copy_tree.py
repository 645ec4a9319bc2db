"""tmpcopyup's copy (rootfs.copy_tree): what was under the tmpfs is there again, as it was, and nothing in
the source is followed out of it."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from pyruntime.container.rootfs import copy_tree
from pyruntime.linux.syscalls import LinuxSyscalls


def test_a_tree_is_copied_with_modes_times_and_links_as_links(tmp_path: Path) -> None:
    src, dst, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside"
    (src / "dir1" / "dir2").mkdir(parents=True)
    os.chmod(src / "dir1" / "dir2", 0o777)
    (src / "dir1" / "file").write_text("content")
    os.chmod(src / "dir1" / "file", 0o4640)
    os.utime(src / "dir1" / "file", ns=(1_000_000_000, 2_000_000_000))
    outside.write_text("a host file")
    (src / "escape").symlink_to(outside)  # copied as a link, never read through
    os.chmod(src / "dir1", 0o555)  # the copy fills a directory before giving it its mode
    dst.mkdir()
    fds = [os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in (src, dst)]
    try:
        copy_tree(LinuxSyscalls(), *fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert stat.S_IMODE((dst / "dir1" / "dir2").stat().st_mode) == 0o777
    assert stat.S_IMODE((dst / "dir1").stat().st_mode) == 0o555
    copied = dst / "dir1" / "file"
    assert copied.read_text() == "content" and stat.S_IMODE(copied.stat().st_mode) == 0o4640
    assert copied.stat().st_mtime_ns == 2_000_000_000
    assert (dst / "escape").is_symlink() and os.readlink(dst / "escape") == str(outside)
    os.chmod(src / "dir1", 0o755)
    os.chmod(dst / "dir1", 0o755)
