"""A node made of a network namespace: pyruntime-cri started inside one (`nsenter --net`, nothing else
unshared, as the kubelet and journey tests run it) gives its pods their bridge, veths, addresses, routes and
masquerade rules in that namespace. Nothing of the pod network appears in the host's namespace, and the pod's
address answers from inside the node."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conformance.critest import critest_registry
from tests.integration.cni_helpers import scratch_netns
from tests.kit.cri_server import HTTPD, CriNode
from tests.kit.kubelet_node import wait_for

BRIDGE = "pyt-crinet0"
SUBNET = "10.238.0.0/24"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    with critest_registry(tmp_path_factory.mktemp("registry")) as m:
        yield m


def _host_network() -> dict[str, str]:
    """What the host's namespace shows of its network: links, addresses, routes, nat rules, forwarding."""
    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return {"links": run("ip", "-o", "link", "show"), "addresses": run("ip", "-o", "addr", "show"),
            "routes": run("ip", "route", "show", "table", "all"), "nat": run("iptables", "-w", "-t", "nat", "-S"),
            "forwarding": Path("/proc/sys/net/ipv4/ip_forward").read_text()}


@pytest.fixture
def netns():
    with scratch_netns("pyt-crinode") as name:
        yield name


def test_pods_of_a_node_in_a_netns_stay_in_it(mirror, netns):
    before = _host_network()
    node = CriNode(mirror.hosts_dir, bridge=BRIDGE, subnet=SUBNET)
    try:
        node.start()
        node.pull(HTTPD)  # from the host: the test registry listens on the host's loopback only
        node.close_channel()
        node.stop()
        node.netns = netns
        node.start()
        pod = node.run_pod("web")
        node.run_container(pod, "web", image=HTTPD, command=())
        ip = node.pod_status(pod).network.ip
        assert ip.startswith("10.238.0.")

        links = node.in_node("ip", "-o", "link", "show").stdout
        assert f": {BRIDGE}:" in links and "veth" in links
        assert f"inet {SUBNET.replace('0/24', '1/24')}" in node.in_node("ip", "-o", "addr", "show", BRIDGE).stdout
        assert SUBNET in node.in_node("ip", "route", "show").stdout
        assert f'"name: \\"{node.network}\\"' in node.in_node("iptables", "-w", "-t", "nat", "-S").stdout
        reply = wait_for("the pod's HTTP answer inside the node",
                         lambda: (r := node.in_node("curl", "-s", "--max-time", "3", f"http://{ip}/")).returncode == 0
                         and r.stdout, timeout=20, interval=0.1)
        assert "It works!" in reply

        assert _host_network() == before
        node.remove_pod(pod)
        assert node.allocated_ips() == set()
    finally:
        node.cleanup()
    assert _host_network() == before
