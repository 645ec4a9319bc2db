"""pynode_os.cgroups: the cgroup version of the host and its hierarchies, from statfs and mountinfo, and
the process's own cgroups from /proc/self/cgroup."""
from __future__ import annotations

import os

from pynode_os import cgroups
from pynode_os.cgroups import (
    CGROUP2_SUPER_MAGIC,
    Hierarchy,
    hierarchy_roots,
    parse_mountinfo,
    parse_proc_cgroup,
    version,
)

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
99 31 0:32 /sub /mnt/memory\\040again rw,relatime - cgroup cgroup rw,memory
"""

COMOUNTED = """\
25 20 0:22 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid shared:9 - cgroup cgroup rw,cpuacct,cpu
26 20 0:23 /docker/abc /sys/fs/cgroup/net_cls,net_prio ro - cgroup cgroup rw,net_cls,net_prio
"""


def test_hybrid_mountinfo():
    v1, v2 = parse_mountinfo(HYBRID)
    assert [h.key for h in v1] == ["cpu", "cpuacct", "memory", "name=systemd"]
    assert v1[2] == Hierarchy("memory", frozenset({"memory"}), "/sys/fs/cgroup/memory", "/")
    assert v1[3].controllers == frozenset({"name=systemd"})
    assert v2 == Hierarchy("", frozenset(), "/sys/fs/cgroup/unified", "/")


def test_comounted_mountinfo_keys_match_proc_cgroup():
    v1, v2 = parse_mountinfo(COMOUNTED)
    assert v2 is None
    assert [h.key for h in v1] == ["cpu,cpuacct", "net_cls,net_prio"]
    assert v1[0].root == "/docker/abc"
    own = parse_proc_cgroup("4:cpuacct,cpu:/docker/abc/x\n1:name=systemd:/init.scope\n0::/user.slice\n")
    assert own == {"cpu,cpuacct": "/docker/abc/x", "name=systemd": "/init.scope", "": "/user.slice"}


def test_mountinfo_unescapes_paths():
    v1, _ = parse_mountinfo("99 31 0:32 / /mnt/my\\040cgroups rw - cgroup cgroup rw,pids\n")
    assert v1[0].mountpoint == "/mnt/my cgroups"


def test_only_cgroup_mounts_count_among_the_pods_mounts():
    """The lines of other filesystems are skipped before parsing, whatever their paths and options say."""
    pods = "".join(f"{200 + i} 25 0:{60 + i} / /run/pods/{i}/cgroup\\040-\\040cgroup rw - overlay overlay rw,x=cgroup\n"
                   for i in range(50))
    assert parse_mountinfo(pods + HYBRID + pods) == parse_mountinfo(HYBRID)


def test_the_version_is_the_roots_filesystem_type(tmp_path):
    magic = {"/sys/fs/cgroup": CGROUP2_SUPER_MAGIC, str(tmp_path): 0x01021994}  # cgroup2, tmpfs
    assert version(magic.__getitem__) == cgroups.V2
    assert version(magic.__getitem__, str(tmp_path)) == cgroups.V1


def test_hierarchy_roots_are_the_v2_root_or_each_v1_hierarchy_but_no_symlink(tmp_path):
    for name in ("cpu,cpuacct", "memory", "unified"):
        (tmp_path / name).mkdir()
    (tmp_path / "cpu").symlink_to("cpu,cpuacct")
    (tmp_path / "cgroup.stray").write_text("")
    hierarchies = hierarchy_roots(lambda path: 0x01021994, str(tmp_path))  # tmpfs: v1
    assert sorted(hierarchies) == [os.path.join(tmp_path, n) for n in ("cpu,cpuacct", "memory", "unified")]
    assert hierarchy_roots(lambda path: CGROUP2_SUPER_MAGIC, str(tmp_path)) == [str(tmp_path)]
