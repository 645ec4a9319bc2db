"""pyruntime.cri.network with our plugins exec'd for real: the default network (cni_plugins' 10-pynode.conflist,
with the test's own bridge, subnet and IPAM dir), a pod netns made with `ip netns add`, addresses that
answer, host ports that work, and a teardown that releases the address however the pod went away."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cni_plugins.install import DEFAULT_CONFLIST
from proto import api_pb2
from pyruntime import errors
from pyruntime.cri.network import Network
from pyruntime.linux.syscalls import LinuxSyscalls
from tests.integration.cni_helpers import CNIEnv, hostport_state, ping, remove_hostport_state, tcp_roundtrip

pytestmark = pytest.mark.usefixtures("restore_forwarding")

SUBNET = "10.222.54.0/24"


class Node:
    def __init__(self, cni: CNIEnv, tmp_path: Path) -> None:
        self.cni = cni
        self.network_name, self.bridge = cni.network(), cni.bridge()
        self.conf_dir = tmp_path / "net.d"
        self.conf_dir.mkdir()
        self.cache = tmp_path / "cache"
        env = {"PATH": os.environ["PATH"], "PYCNI_HELPER": "auto", "PYCNI_HELPER_SOCKET": cni.helper_name,
               "PYCNI_HELPER_LOG": str(cni.helper_log)}
        self.net = Network(str(self.conf_dir), [str(cni.bin_dir)], str(self.cache), kernel=LinuxSyscalls(), env=env)

    def write_conf(self) -> Path:
        conf = json.loads(DEFAULT_CONFLIST.read_text())
        conf["name"] = self.network_name
        bridge = conf["plugins"][0]
        bridge["bridge"] = self.bridge
        bridge["ipam"].update(ranges=[[{"subnet": SUBNET}]], dataDir=str(self.cni.data_dir))
        path = self.conf_dir / DEFAULT_CONFLIST.name
        path.write_text(json.dumps(conf))
        return path

    def allocated(self) -> list[str]:
        return self.cni.allocations(self.network_name)

    def setup(self, sandbox_id: str, netns: str, host_port: int = 0) -> list[str]:
        mappings = [api_pb2.PortMapping(protocol=api_pb2.TCP, container_port=7777, host_port=host_port)]
        return self.net.setup(sandbox_id, netns, name="web", namespace="default", uid=f"uid-{sandbox_id}",
                              port_mappings=mappings if host_port else [])


@pytest.fixture
def node(cni: CNIEnv, tmp_path: Path):
    """The plugins run as a CRI server runs them, through the resident helper (the test's own, stopped by cni)."""
    shared = hostport_state()
    try:
        yield Node(cni, tmp_path)
    finally:
        remove_hostport_state(shared)


def dnat_chains() -> list[str]:
    listing = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if line.startswith("-N CNI-DN-")]


def test_setup_gives_an_address_that_answers_and_teardown_releases_it(node: Node) -> None:
    node.write_conf()
    assert node.net.status() == (True, "", "")
    netns = node.cni.netns()
    ips = node.setup("sb-one", netns, host_port=18092)
    assert len(ips) == 1 and ips[0].startswith("10.222.54.")
    assert node.allocated() == ips
    assert ping(None, ips[0])
    lo = subprocess.run(["ip", "-n", Path(netns).name, "-j", "link", "show", "lo"], capture_output=True, text=True,
                        check=True)
    assert "UP" in json.loads(lo.stdout)[0]["flags"], "the runtime brought lo up (as ocicni does, no plugin)"
    assert tcp_roundtrip(netns, "0.0.0.0", None, via=("127.0.0.1", 18092)) == "HELLO", "the host port leads in"
    node.net.check("sb-one", netns)
    assert dnat_chains()

    node.net.teardown("sb-one", netns)
    assert node.allocated() == [], "the address is released"
    assert dnat_chains() == [], "the host port is unmapped"
    assert not list((node.cache / "results").iterdir())
    node.net.teardown("sb-one", netns)  # again: nothing left to do, and no error
    again = node.setup("sb-two", netns)  # the same netns attaches again (host-local hands out round robin)
    assert node.allocated() == again and ping(None, again[0])
    node.net.teardown("sb-two", netns)
    assert node.allocated() == []


def test_teardown_after_the_netns_and_the_conf_are_gone_still_releases(node: Node) -> None:
    conf = node.write_conf()
    netns = node.cni.netns()
    ips = node.setup("sb-gone", netns, host_port=18093)
    name = Path(netns).name
    subprocess.run(["ip", "netns", "del", name], check=True)
    node.cni.namespaces.remove(name)
    conf.unlink()
    assert not node.net.status()[0]
    node.net.teardown("sb-gone", netns)
    assert ips and node.allocated() == [], "released with the cached config, without the netns"
    assert dnat_chains() == []
    node.net.teardown("sb-gone", None)


def test_status_follows_the_conf_dir_and_setup_needs_a_network(node: Node) -> None:
    ready, reason, message = node.net.status()
    assert not ready and reason == "NetworkPluginNotReady" and str(node.conf_dir) in message
    netns = node.cni.netns()
    with pytest.raises(errors.FailedPreconditionError, match="cni plugin not initialized"):
        node.setup("sb-early", netns)
    conf = node.write_conf()
    assert node.net.status()[0], "a conflist that appears is used without a restart"
    ips = node.setup("sb-late", netns)
    conf.unlink()
    assert not node.net.status()[0]
    node.net.teardown("sb-late", netns)
    assert ips and node.allocated() == []


def test_a_plugin_error_reaches_the_caller_with_its_code_and_nothing_stays(node: Node) -> None:
    path = node.write_conf()
    conf = json.loads(path.read_text())
    conf["plugins"][0]["ipam"]["ranges"] = [[{"subnet": "10.222.55.0/30"}]]  # one usable address
    path.write_text(json.dumps(conf))
    first, second = node.cni.netns(), node.cni.netns()
    node.setup("sb-a", first)
    with pytest.raises(errors.UnavailableError, match=r"'pybridge' ADD for sandbox sb-b: code 11"):
        node.setup("sb-b", second)
    links = subprocess.run(["ip", "-n", Path(second).name, "-o", "link"], capture_output=True, text=True, check=True)
    assert "eth0" not in links.stdout, "the failed ADD was rolled back"
    assert len(node.allocated()) == 1
    node.net.teardown("sb-a", first)
    node.net.teardown("sb-b", second)
    assert node.allocated() == []
