"""The leak check's window as fixtures shape it: what a fixture allows to stay is no leak, and everything else
new is; the cleanups fixtures hand it run after it has looked, every one of them. The pod tests' allowance is
kubepods and its QoS levels, never a pod's own cgroup."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.kit import kubelet_node
from tests.leakcheck import Check, Snapshot

V1 = [Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/memory")]


def test_what_a_fixture_allows_is_no_leak_and_the_rest_is() -> None:
    check = Check(Snapshot({"cgroups": {"/cg/a"}, "links": {"lo"}}))
    check.allow("cgroups", lambda item: item == "/cg/qos")
    now = Snapshot({"cgroups": {"/cg/a", "/cg/qos", "/cg/qos/pod1"}, "links": {"lo", "veth0"}})
    assert check.leaks(now) == {"cgroups": ["/cg/qos/pod1"], "links": ["veth0"]}
    assert check.leaks(Snapshot({"cgroups": {"/cg/a", "/cg/qos"}, "links": {"lo"}})) == {}


def test_a_process_is_its_pid_and_start_time_not_its_title() -> None:
    """pyruntime-cri's launcher retitles itself once its imports are done: the same process, no leak; a new
    process is one, and so is one that became a zombie."""
    before = Snapshot({"processes": {"7@100.00 python -P -c import sys", "8@101.00 sleep 9"}})
    now = Snapshot({"processes": {"7@100.00 pyruntime-launcher", "8@101.00 sleep 9 (zombie)",
                                  "9@102.00 pyruntime-puller", "7@103.00 reused pid"}})
    assert Check(before).leaks(now) == {"processes": ["7@103.00 reused pid", "8@101.00 sleep 9 (zombie)",
                                                      "9@102.00 pyruntime-puller"]}


def test_an_allowance_names_a_kind_the_check_knows() -> None:
    with pytest.raises(ValueError, match=r"no leak kind 'cgroup': one of \[.*'cgroups'"):
        Check(Snapshot()).allow("cgroup", lambda _: True)


def test_cleanups_run_newest_first_each_though_one_fails() -> None:
    ran: list[str] = []
    check = Check(Snapshot())

    def failing() -> None:
        ran.append("failing")
        raise OSError("busy")

    check.after(lambda: ran.append("first"))
    check.after(failing)
    check.after(lambda: ran.append("last"))
    with pytest.raises(OSError, match="busy"):
        check.clean_up()
    assert ran == ["last", "failing", "first"]
    check.clean_up()  # each runs once
    assert ran == ["last", "failing", "first"]


@pytest.mark.parametrize(("cgroup", "allowed"), [
    ("/sys/fs/cgroup/cpu/kubepods", True),
    ("/sys/fs/cgroup/memory/kubepods/burstable", True),
    ("/sys/fs/cgroup/cpu/kubepods/besteffort", True),
    ("/sys/fs/cgroup/cpu/kubepods/besteffort/pod0a1b", False),
    ("/sys/fs/cgroup/cpu/kubepods/pod0a1b", False),  # a Guaranteed pod's
    ("/sys/fs/cgroup/cpu/kubepods/burstable/pod0a1b/c1", False),
    ("/sys/fs/cgroup/cpu/other/kubepods", False),
    ("/sys/fs/cgroup/pids/kubepods", False),  # no hierarchy of this host
])
def test_a_running_kubelet_keeps_kubepods_and_its_qos_levels_never_a_pod_cgroup(
        monkeypatch: pytest.MonkeyPatch, cgroup: str, allowed: bool) -> None:
    monkeypatch.setattr(kubelet_node, "cgroup_hierarchies", lambda: V1)
    assert kubelet_node.node_level(cgroup) is allowed
