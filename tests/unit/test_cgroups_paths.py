"""cgroupsPath resolution and the mountinfo and /proc/self/cgroup parsers behind it."""
from __future__ import annotations

import pytest

from pyruntime.linux.cgroups.paths import (
    Hierarchy,
    base_dir,
    parent_of_own,
    parse_mountinfo,
    parse_proc_cgroup,
    removable_parents,
    split_path,
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
    assert base_dir(v1[0], False, own) == "/sys/fs/cgroup/cpu,cpuacct/x"
    assert base_dir(v1[0], True, own) == "/sys/fs/cgroup/cpu,cpuacct"


def test_mountinfo_unescapes_paths():
    v1, _ = parse_mountinfo("99 31 0:32 / /mnt/my\\040cgroups rw - cgroup cgroup rw,pids\n")
    assert v1[0].mountpoint == "/mnt/my cgroups"


def test_only_cgroup_mounts_count_among_the_pods_mounts():
    """The lines of other filesystems are skipped before parsing, whatever their paths and options say."""
    pods = "".join(f"{200 + i} 25 0:{60 + i} / /run/pods/{i}/cgroup\\040-\\040cgroup rw - overlay overlay rw,x=cgroup\n"
                   for i in range(50))
    assert parse_mountinfo(pods + HYBRID + pods) == parse_mountinfo(HYBRID)


def test_relative_base_is_own_cgroup():
    h = Hierarchy("memory", frozenset({"memory"}), "/sys/fs/cgroup/memory", "/")
    own = {"memory": "/process_api/abc"}
    assert base_dir(h, False, own) == "/sys/fs/cgroup/memory/process_api/abc"
    assert base_dir(h, False, {"memory": "/"}) == "/sys/fs/cgroup/memory"
    assert base_dir(h, False, {}) == "/sys/fs/cgroup/memory"


@pytest.mark.parametrize("path, expected", [
    ("", (True, ("pyruntime", "ctr"))),
    ("/kubepods/pod1/ctr", (True, ("kubepods", "pod1", "ctr"))),
    ("/a//b/./c/", (True, ("a", "b", "c"))),
    ("mine/ctr", (False, ("mine", "ctr"))),
    ("/with:colons:inside", (True, ("with:colons:inside",))),
    # containerd's CRI gives the systemd form to a cgroupfs runtime too; runc's fs driver takes it as a name
    ("test.slice:cri-containerd:abc", (False, ("test.slice:cri-containerd:abc",))),
    ("/test.slice:cri-containerd:abc", (True, ("test.slice:cri-containerd:abc",))),
    ("system.slice:docker:abc", (False, ("system.slice:docker:abc",))),
])
def test_split_path(path, expected):
    assert split_path(path, "ctr") == expected


@pytest.mark.parametrize("path, message", [
    ("/a/../../etc", "must not contain '..'"),
    ("/", "names the hierarchy root"),
])
def test_split_path_refuses(path, message):
    with pytest.raises(ValueError, match=message):
        split_path(path, "ctr")


def test_removable_parents_only_inside_pyruntime():
    assert removable_parents(("pyruntime", "ctr")) == [("pyruntime",)]
    assert removable_parents(("pyruntime", "pod", "ctr")) == [("pyruntime", "pod"), ("pyruntime",)]
    assert removable_parents(("kubepods", "pod", "ctr")) == []
    assert removable_parents(("pyruntime",)) == []


def test_manager_refuses_a_bad_path_before_reading_anything():
    from pyruntime.linux.cgroups import manager
    from pyruntime.linux.syscalls import FakeSyscalls
    kernel = FakeSyscalls()
    with pytest.raises(ValueError, match=r"must not contain '\.\.'"):
        manager("kubepods.slice:cri-containerd:../../abc", "abc", kernel)
    assert kernel.calls == []


def test_a_relative_path_on_v2_is_under_the_parent_of_our_own_cgroup():
    """As runc's fs2 driver: our own cgroup has our process, so no container cgroup can be its child."""
    own = parse_proc_cgroup("0::/system.slice/ssh.service\n")
    assert parent_of_own(own) == {"": "/system.slice"}
    assert parent_of_own({"": "/user.slice"}) == {"": "/"}
    assert parent_of_own({"": "/"}) == {"": "/"}
    v1 = parse_proc_cgroup("4:memory:/x/y\n")
    assert parent_of_own(v1) == v1  # v1 (and a hybrid host's unified part) keep runc's fs behaviour
