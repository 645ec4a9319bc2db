"""cgroupsPath resolution (the mountinfo and /proc/self/cgroup parsers behind it: test_os_cgroups.py)."""
from __future__ import annotations

import pytest

from pynode_os.cgroups import Hierarchy, parse_mountinfo, parse_proc_cgroup
from pyruntime.linux.cgroups.paths import base_dir, parent_of_own, removable_parents, split_path
from tests.unit.test_os_cgroups import COMOUNTED


def test_base_dirs_of_comounted_hierarchies_are_keyed_as_proc_cgroup_keys_them():
    v1, _ = parse_mountinfo(COMOUNTED)
    own = parse_proc_cgroup("4:cpuacct,cpu:/docker/abc/x\n1:name=systemd:/init.scope\n0::/user.slice\n")
    assert base_dir(v1[0], False, own) == "/sys/fs/cgroup/cpu,cpuacct/x"
    assert base_dir(v1[0], True, own) == "/sys/fs/cgroup/cpu,cpuacct"


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
