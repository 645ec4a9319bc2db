"""pyportmap: the same nat rules as the reference portmap v1.10.0 (differential), and a host port that works.

Each test puts a pod on a pybridge network, chains a portmap plugin after it with the pod's result as
prevResult, and removes what it made: the pod's chain by DEL (which is what is tested), the shared
CNI-HOSTPORT-* chains when the test made them.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cni_helpers import (
    PEERS_CNI,
    CNIEnv,
    hostport_state,
    remove_hostport_state,
    tcp_roundtrip,
)

pytestmark = pytest.mark.usefixtures("restore_forwarding")

REFERENCE = PEERS_CNI / "portmap"
MAPPINGS = [
    {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
    {"hostPort": 18081, "containerPort": 81, "protocol": "tcp", "hostIP": "127.0.0.1"},
    {"hostPort": 18053, "containerPort": 53, "protocol": "udp"},
    {"hostPort": 18082, "containerPort": 82, "protocol": "tcp", "hostIP": "::"},
]


@pytest.fixture
def hostport(cni: CNIEnv) -> Iterator[CNIEnv]:
    """The cni world with the reference portmap beside ours; the shared chains it had before are kept."""
    before = hostport_state()
    if REFERENCE.is_file():
        os.symlink(REFERENCE, cni.bin_dir / "portmap")
    try:
        yield cni
    finally:
        remove_hostport_state(before)


def nat_rules() -> list[str]:
    out = []
    for tool in ("iptables", "ip6tables"):
        listing = subprocess.run([tool, "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=True).stdout
        out += [f"{tool} {line}" for line in listing.splitlines()]
    return out


def pod(cni: CNIEnv, network: str, bridge: str, subnet4: str, subnet6: str | None = None,
        container_id: str = "pm1") -> tuple[str, dict]:
    ranges = [[{"subnet": subnet4}]] + ([[{"subnet": subnet6}]] if subnet6 else [])
    conf = {"cniVersion": "1.1.0", "name": network, "type": "pybridge", "bridge": bridge, "isGateway": True,
            "hairpinMode": True, "ipam": {"type": "pyhost-local", "dataDir": str(cni.data_dir), "ranges": ranges}}
    netns = cni.netns()
    add = cni.run("pybridge", "ADD", conf, netns, container_id)
    assert add.ok, add.raw
    return netns, add.out


def portmap_conf(plugin: str, network: str, prev: dict, mappings: list[dict], **extra) -> dict:
    return {"cniVersion": "1.1.0", "name": network, "type": plugin, "capabilities": {"portMappings": True},
            "runtimeConfig": {"portMappings": mappings}, "prevResult": prev, **extra}


def localnet(bridge: str) -> str:
    return Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").read_text().strip()


@pytest.mark.skipif(not REFERENCE.is_file(), reason="reference portmap not built (make peers)")
@pytest.mark.parametrize("extra", [{}, {"masqAll": True}, {"snat": False}, {"markMasqBit": 5},
                                   {"conditionsV4": ["-s", "192.0.2.0/24"]}, {"externalSetMarkChain": "KUBE-MARK-X"}],
                         ids=["default", "masqAll", "no-snat", "markbit", "conditions", "external-mark"])
def test_same_rules_as_reference(hostport: CNIEnv, extra: dict) -> None:
    cni = hostport
    network, bridge = cni.network(), cni.bridge()
    netns, prev = pod(cni, network, bridge, "10.222.50.0/24", "fd00:222:50::/64")
    before, shared = nat_rules(), hostport_state()
    if extra.get("externalSetMarkChain"):
        subprocess.run(["iptables", "-w", "-t", "nat", "-N", "KUBE-MARK-X"], check=True)
        subprocess.run(["ip6tables", "-w", "-t", "nat", "-N", "KUBE-MARK-X"], check=True)
    seen = {}
    try:
        for plugin in ("portmap", "pyportmap"):
            Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").write_text("0")
            conf = portmap_conf(plugin, network, prev, MAPPINGS, **extra)
            add = cni.run(plugin, "ADD", conf, netns, "pm1")
            assert add.ok, add.raw
            after_add = sorted(set(nat_rules()) - set(before))
            routed = localnet(bridge)
            check = cni.run(plugin, "CHECK", conf, netns, "pm1")
            assert check.ok, check.raw
            dele = cni.run(plugin, "DEL", conf, netns, "pm1")
            assert dele.ok, dele.raw
            after_del = sorted(set(nat_rules()) - set(before))
            assert cni.run(plugin, "DEL", conf, netns, "pm1").ok, "a second DEL is fine"
            seen[plugin] = (add.out, after_add, routed, after_del)
            remove_hostport_state(shared)
    finally:
        for tool in ("iptables", "ip6tables"):
            subprocess.run([tool, "-w", "-t", "nat", "-X", "KUBE-MARK-X"], check=False, capture_output=True)
    assert seen["pyportmap"] == seen["portmap"]
    assert any("CNI-DN-" in rule for rule in seen["portmap"][1]), "the reference made a pod chain"


@pytest.mark.skipif(not REFERENCE.is_file(), reason="reference portmap not built (make peers)")
def test_each_removes_what_the_other_made_and_check_sees_a_missing_rule(hostport: CNIEnv) -> None:
    cni = hostport
    network, bridge = cni.network(), cni.bridge()
    netns, prev = pod(cni, network, bridge, "10.222.51.0/24")
    before = nat_rules()
    for maker, remover in (("portmap", "pyportmap"), ("pyportmap", "portmap")):
        assert cni.run(maker, "ADD", portmap_conf(maker, network, prev, MAPPINGS), netns, "pm1").ok
        conf = portmap_conf(remover, network, prev, MAPPINGS)
        assert cni.run(remover, "CHECK", conf, netns, "pm1").ok
        dnat = next(r for r in nat_rules() if r.startswith("iptables -A CNI-DN-") and "-j DNAT" in r)
        subprocess.run(["iptables", "-w", "-t", "nat", "-D", *dnat.split()[2:]], check=True)
        for plugin in ("portmap", "pyportmap"):
            check = cni.run(plugin, "CHECK", portmap_conf(plugin, network, prev, MAPPINGS), netns, "pm1")
            assert not check.ok and check.out["code"] == 999, (plugin, check.raw)
        assert cni.run(remover, "DEL", conf, netns, "pm1").ok
        assert not [r for r in nat_rules() if "CNI-DN-" in r]
    assert not set(nat_rules()) - set(before) - {r for r in nat_rules() if "CNI-HOSTPORT" in r}


@pytest.mark.skipif(not REFERENCE.is_file(), reason="reference portmap not built (make peers)")
@pytest.mark.parametrize("case", ["no-prev", "host-port-0", "container-port-0", "mark-bit", "mark-and-chain"])
def test_same_errors_as_reference(hostport: CNIEnv, case: str) -> None:
    cni = hostport
    network, bridge = cni.network(), cni.bridge()
    netns, prev = pod(cni, network, bridge, "10.222.52.0/24")
    errors = {}
    for plugin in ("portmap", "pyportmap"):
        conf = portmap_conf(plugin, network, prev, MAPPINGS)
        if case == "no-prev":
            conf.pop("prevResult")
        elif case == "host-port-0":
            conf["runtimeConfig"]["portMappings"] = [{"hostPort": 0, "containerPort": 80, "protocol": "tcp"}]
        elif case == "container-port-0":
            conf["runtimeConfig"]["portMappings"] = [{"hostPort": 8, "containerPort": -1, "protocol": "tcp"}]
        elif case == "mark-bit":
            conf["markMasqBit"] = 32
        else:
            conf.update(markMasqBit=3, externalSetMarkChain="X")
        add = cni.run(plugin, "ADD", conf, netns, "pm1")
        assert not add.ok
        errors[plugin] = {k: add.out.get(k) for k in ("code", "msg", "details")}
    assert errors["pyportmap"] == errors["portmap"]


def test_host_port_reaches_the_pod_from_another_pod_and_from_the_host(hostport: CNIEnv) -> None:
    cni = hostport
    network, bridge = cni.network(), cni.bridge()
    server_ns, prev = pod(cni, network, bridge, "10.222.53.0/24", container_id="srv")
    client_ns, _ = pod(cni, network, bridge, "10.222.53.0/24", container_id="cli")
    server_ip = prev["ips"][0]["address"].split("/")[0]
    gateway = prev["ips"][0]["gateway"]
    conf = portmap_conf("pyportmap", network, prev, [{"hostPort": 18090, "containerPort": 7777, "protocol": "tcp"}])
    assert cni.run("pyportmap", "ADD", conf, server_ns, "srv").ok
    try:
        assert tcp_roundtrip(server_ns, "0.0.0.0", client_ns, via=(gateway, 18090)) == "HELLO"
        assert tcp_roundtrip(server_ns, "0.0.0.0", None, via=("127.0.0.1", 18090)) == "HELLO"
        assert tcp_roundtrip(server_ns, "0.0.0.0", server_ns, via=(gateway, 18090)) == "HELLO", "hairpin"
        assert tcp_roundtrip(server_ns, server_ip, client_ns) == "HELLO", "the pod's own port still answers"
    finally:
        assert cni.run("pyportmap", "DEL", conf, server_ns, "srv").ok
    assert tcp_roundtrip(server_ns, "0.0.0.0", None, via=("127.0.0.1", 18090)) == "", "DEL removed the mapping"
