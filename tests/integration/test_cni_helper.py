"""The resident helper and network namespaces: a caller is served only by the helper of its own netns,
and a helper does not outlive its node's netns (nor keep it, with its veths, alive).

The "nodes" here are namespaces the plugin is exec'd from (`ip netns exec NODE pybridge`), as a runtime in
its own netns or a nested node would exec it; each pod netns gets a veth whose host end is in its node.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cni_plugins import helper
from tests.integration.cni_helpers import CNIEnv, helper_listening, ns_exec
from tests.integration.test_cni_bridge import bridge_conf, links_in

pytestmark = pytest.mark.usefixtures("restore_forwarding")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def helpers_in(cni: CNIEnv, netns: str) -> list[int]:
    """Pids of this test's helpers whose netns is `netns`."""
    ino = os.stat(netns).st_ino
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if (
                f"main({cni.helper_name!r})" in " ".join(proc.cmdline())
                and os.stat(f"/proc/{proc.pid}/ns/net").st_ino == ino
            ):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue  # exited while we looked: not a helper of that netns any more
    return found


def stop_helper_in(cni: CNIEnv, netns: str) -> None:
    code = f"from cni_plugins.helper import stop; stop({cni.helper_name!r})"
    proc = ns_exec(netns, sys.executable, "-c", code, timeout=20)
    assert proc.returncode == 0, proc.stderr


def test_callers_in_two_namespaces_get_their_own_bridges(cni: CNIEnv) -> None:
    cni.use_helper = True
    conf = bridge_conf(cni, subnet="10.222.71.0/24")
    node_a, node_b = cni.netns(), cni.netns()
    pod_a1, pod_a2, pod_b = cni.netns(), cni.netns(), cni.netns()
    try:
        a1 = cni.run("pybridge", "ADD", conf, pod_a1, "a1", caller_netns=node_a)  # in-process; starts A's helper
        assert a1.ok, a1.raw
        wait_for(lambda: helper_listening(cni.helper_name, node_a), 10, "node A's helper")
        a2 = cni.run("pybridge", "ADD", conf, pod_a2, "a2", caller_netns=node_a)  # served by A's helper
        b = cni.run("pybridge", "ADD", conf, pod_b, "b1", caller_netns=node_b)
        assert a2.ok and b.ok, (a2.raw, b.raw)
        for node, result in ((node_a, a1), (node_a, a2), (node_b, b)):
            links = links_in(node)
            assert conf["bridge"] in links, f"no bridge in {node}"
            assert result.out["interfaces"][1]["name"] in links, f"the host veth of {result.out} is not in {node}"
            assert "10.222.71.1/24" in ns_exec(node, "ip", "-o", "-4", "addr", "show", conf["bridge"]).stdout
        assert not Path(f"/sys/class/net/{conf['bridge']}").exists(), "the bridge was made in the test's netns"
        assert len(helpers_in(cni, node_a)) == 1
    finally:
        for node in (node_a, node_b):
            stop_helper_in(cni, node)


def test_deleted_node_netns_frees_its_helper_and_veths(cni: CNIEnv) -> None:
    cni.use_helper = True
    conf = bridge_conf(cni, subnet="10.222.72.0/24")
    node, pod = cni.netns(), cni.netns()
    add = cni.run("pybridge", "ADD", conf, pod, "n1", caller_netns=node)
    assert add.ok, add.raw
    wait_for(lambda: helper_listening(cni.helper_name, node), 10, "the node's helper")
    [pid] = helpers_in(cni, node)
    try:
        subprocess.run(["ip", "netns", "del", os.path.basename(node)], check=True)
        cni.namespaces.remove(os.path.basename(node))
        wait_for(lambda: not helper.alive(pid), 10, "the helper of a deleted netns to exit")
        # the netns is freed once its last user went, and its host veth ends take their pod ends with them
        wait_for(lambda: "eth0" not in links_in(pod), 10, "the pod's veth to go with the node's netns")
    finally:
        if helper.alive(pid):
            os.kill(pid, 9)
