"""The one mountinfo parser: fields, propagation tags, and the kernel's octal escapes both ways."""
from __future__ import annotations

import pytest

from pynode_os import mountinfo

SAMPLE = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n"
    "35 22 0:31 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    "90 22 0:50 /a\\134b /mnt/my\\040dir/with\\011tab\\012nl rw master:3 propagate_from:2 "
    "- tmpfs my\\040src rw,size=4k\n"
    "not a mountinfo line\n"
)


def test_fields_and_optional_tags():
    root, cgroup, odd = mountinfo.parse(SAMPLE)
    assert (root.mount_id, root.parent_id, root.device, root.mount_point) == (22, 1, "8:1", "/")
    assert root.optional == ("shared:1",) and root.fstype == "ext4" and root.source == "/dev/sda1"
    assert cgroup.options == ("rw", "nosuid", "nodev", "noexec", "relatime")
    assert cgroup.super_options == ("rw", "nsdelegate")
    assert odd.mount_point == "/mnt/my dir/with\ttab\nnl" and odd.root == "/a\\b" and odd.source == "my src"
    assert odd.optional == ("master:3", "propagate_from:2")


@pytest.mark.parametrize("path", ["/plain", "/with space", "/with\ttab", "/with\nnewline", "/back\\slash",
                                  "/all of\t\n\\ them\\040", "/not\\an\\octal\\09"])
def test_escapes_round_trip(path):
    escaped = mountinfo.escape(path)
    assert not any(c in escaped for c in " \t\n")
    assert mountinfo.unescape(escaped) == path
    line = f"1 0 0:1 / {escaped} rw - tmpfs none rw\n"
    assert mountinfo.parse(line)[0].mount_point == path


def test_mount_of_picks_the_last_longest_prefix():
    mounts = mountinfo.parse(SAMPLE + "91 90 0:51 / /mnt/my\\040dir/with\\011tab\\012nl rw - tmpfs b rw\n")
    spaced = mountinfo.mount_of("/mnt/my dir/with\ttab\nnl/x", mounts)
    prefixed = mountinfo.mount_of("/sys/fs/cgroupfoo", mounts)
    assert spaced is not None and spaced.mount_id == 91
    assert prefixed is not None and prefixed.mount_id == 22
    assert mountinfo.is_mount_point("/sys/fs/cgroup", mounts)
    assert not mountinfo.is_mount_point("/sys/fs", mounts)
