"""The kernel's own escaping, read back: a tmpfs on a path with a space, a tab, a newline and a
backslash is found where it was mounted, by every reader that uses the shared parser."""
from __future__ import annotations

import os

import pytest

from pynode_os import mountinfo
from pyruntime.images.mount import is_mountpoint
from pyruntime.linux.syscalls import MNT_DETACH, LinuxSyscalls

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


@pytest.mark.parametrize("name", ["with space", "with\ttab", "with\nnewline", "with\\backslash",
                                  "all \t\n\\ of them \\040"])
def test_a_mount_on_an_awkward_path_is_found(tmp_path, name):
    kernel = LinuxSyscalls()
    target = tmp_path / name
    target.mkdir()
    kernel.mount("tmpfs", str(target), "tmpfs", 0, "size=64k")
    try:
        found = [m for m in mountinfo.read() if m.mount_point == str(target)]
        assert len(found) == 1 and found[0].fstype == "tmpfs" and found[0].source == "tmpfs"
        inside = mountinfo.mount_of(str(target / "inside"), mountinfo.read())
        assert inside is not None and inside.mount_point == str(target)
        assert is_mountpoint(target)
    finally:
        kernel.umount(str(target), MNT_DETACH)
    assert not any(m.mount_point == str(target) for m in mountinfo.read())
