"""Bad requests get the spec's error JSON with the right code, and leave nothing half made."""
from __future__ import annotations

import pytest

from tests.integration.cni_helpers import CNIEnv, chains_for, ns_exec
from tests.integration.test_cni_bridge import bridge_conf, host_veths

pytestmark = pytest.mark.usefixtures("restore_forwarding")


def assert_error(res, code: int, *words: str) -> None:
    assert res.rc != 0, res.raw
    assert res.out is not None and res.out["code"] == code, res.raw
    for word in words:
        assert word in res.out["msg"] + res.out.get("details", ""), res.raw


@pytest.mark.parametrize("plugin", ["pybridge", "pyhost-local", "pyloopback"])
def test_malformed_json(cni: CNIEnv, plugin: str) -> None:
    ns = cni.netns()
    assert_error(cni.run(plugin, "ADD", b"{not json", ns), 6, "decoding")
    assert_error(cni.run(plugin, "ADD", b"[1, 2]", ns), 6, "not a JSON object")


def test_environment_errors(cni: CNIEnv) -> None:
    conf = bridge_conf(cni)
    ns = cni.netns()
    assert_error(cni.run("pybridge", "ADD", conf, "", "c1"), 4, "CNI_NETNS")
    assert_error(cni.run("pybridge", "ADD", conf, ns, ""), 4, "CNI_CONTAINERID")
    assert_error(cni.run("pybridge", "ADD", conf, ns, "c1", ifname=""), 4, "CNI_IFNAME")
    assert_error(cni.run("pybridge", "FROB", conf, ns, "c1"), 4, "FROB")
    assert_error(cni.run("pybridge", "ADD", conf, ns, "-bad id"), 4, "CNI_CONTAINERID")
    assert_error(cni.run("pybridge", "ADD", conf, ns, "c1", ifname="a" * 16), 4, "too long")
    assert_error(cni.run("pybridge", "ADD", conf, ns, "c1", extra={"CNI_ARGS": "novalue"}), 4, "novalue")
    assert cni.allocations(conf["name"]) == []


def test_config_errors(cni: CNIEnv) -> None:
    ns = cni.netns()
    conf = bridge_conf(cni)
    assert_error(cni.run("pybridge", "ADD", dict(conf, cniVersion="9.9.9"), ns), 1, "incompatible", "9.9.9")
    assert_error(cni.run("pybridge", "ADD", {k: v for k, v in conf.items() if k != "name"}, ns), 7, "network name")
    assert_error(cni.run("pybridge", "ADD", dict(conf, hairpinMode=True, promiscMode=True), ns), 7, "hairpin")
    assert_error(cni.run("pybridge", "ADD", dict(conf, vlan=5000), ns), 7, "5000")
    assert_error(cni.run("pybridge", "ADD", dict(conf, mtu="big"), ns), 7, "mtu")
    assert_error(cni.run("pybridge", "ADD", dict(conf, ipMasq="yes"), ns), 7, "ipMasq")
    assert_error(cni.run("pybridge", "ADD", dict(conf, macspoofchk="yes"), ns), 7, "macspoofchk")
    assert_error(cni.run("pybridge", "ADD", dict(conf, ipMasqBackend="pf"), ns), 7, "pf")
    assert_error(cni.run("pybridge", "CHECK", dict(conf, cniVersion="0.3.1"), ns), 1, "CHECK")
    assert_error(cni.run("pybridge", "GC", dict(conf, cniVersion="1.0.0")), 1, "GC")
    bad_ipam = dict(conf, ipam=dict(conf["ipam"], ranges=[[{"subnet": "10.222.20.1/24"}]]))
    assert_error(cni.run("pybridge", "ADD", bad_ipam, ns), 7, "host bits")
    tiny = dict(conf, ipam=dict(conf["ipam"], ranges=[[{"subnet": "10.222.20.0/31"}]]))
    assert_error(cni.run("pybridge", "ADD", tiny, ns), 7, "too small")
    outside = dict(conf, ipam=dict(conf["ipam"], ranges=[[{"subnet": "10.222.20.0/24", "rangeStart": "10.1.1.1"}]]))
    assert_error(cni.run("pybridge", "ADD", outside, ns), 7, "RangeStart")
    no_ranges = dict(conf, ipam={"type": "pyhost-local", "dataDir": str(cni.data_dir)})
    assert_error(cni.run("pybridge", "ADD", no_ranges, ns), 7, "no IP ranges")
    unknown_ipam = dict(conf, ipam={"type": "no-such-ipam"})
    assert_error(cni.run("pybridge", "ADD", unknown_ipam, ns), 7, "no-such-ipam")
    assert ns_exec(ns, "ip", "-o", "link").stdout.count("\n") == 1, "a failed ADD left an interface behind"


def test_missing_netns(cni: CNIEnv) -> None:
    conf = bridge_conf(cni)
    veths = host_veths()
    assert_error(cni.run("pybridge", "ADD", conf, "/run/netns/pyt-does-not-exist"), 3, "pyt-does-not-exist")
    assert_error(cni.run("pybridge", "ADD", conf, "/proc/self/status"), 4, "not a network namespace")
    assert_error(cni.run("pyloopback", "ADD", conf, "/run/netns/pyt-does-not-exist", ifname="lo"), 3)
    assert cni.allocations(conf["name"]) == [] and host_veths() == veths
    assert cni.run("pybridge", "DEL", conf, "/run/netns/pyt-does-not-exist").ok


def test_exhausted_range_leaves_nothing(cni: CNIEnv) -> None:
    conf = bridge_conf(cni, ipMasq=True)
    conf["ipam"]["ranges"] = [[{"subnet": "10.222.21.0/24", "rangeStart": "10.222.21.10", "rangeEnd": "10.222.21.11"}]]
    nss = [cni.netns() for _ in range(3)]
    assert cni.run("pybridge", "ADD", conf, nss[0], "c0").ok
    assert cni.run("pybridge", "ADD", conf, nss[1], "c1").ok
    veths = host_veths()
    chains = chains_for(conf["name"])
    assert_error(
        cni.run("pybridge", "ADD", conf, nss[2], "c2"), 11, "no IP addresses available", "10.222.21.10-10.222.21.11"
    )
    assert host_veths() == veths, "the failed ADD left its veth"
    assert ns_exec(nss[2], "ip", "-o", "link").stdout.count("\n") == 1
    assert chains_for(conf["name"]) == chains
    assert cni.allocations(conf["name"]) == ["10.222.21.10", "10.222.21.11"]


def test_dual_stack_second_range_exhausted_releases_first(cni: CNIEnv) -> None:
    conf = bridge_conf(cni)
    conf["ipam"]["ranges"] = [
        [{"subnet": "10.222.22.0/24"}],
        [{"subnet": "fd00:222:22::/64", "rangeStart": "fd00:222:22::5", "rangeEnd": "fd00:222:22::5"}],
    ]
    a, b = cni.netns(), cni.netns()
    assert cni.run("pybridge", "ADD", conf, a, "c0").ok
    assert_error(cni.run("pybridge", "ADD", conf, b, "c1"), 11, "fd00:222:22::5")
    assert cni.allocations(conf["name"]) == ["10.222.22.2", "fd00:222:22::5"]


def test_interface_exists(cni: CNIEnv) -> None:
    conf = bridge_conf(cni)
    ns = cni.netns()
    assert ns_exec(ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1").returncode == 0
    veths = host_veths()
    assert_error(cni.run("pybridge", "ADD", conf, ns, "c1"), 7, "eth0", "already exists")
    assert cni.allocations(conf["name"]) == []
    assert host_veths() == veths


def test_ipam_requested_ip_taken(cni: CNIEnv) -> None:
    conf = bridge_conf(cni)
    a, b = cni.netns(), cni.netns()
    assert (
        cni.run("pybridge", "ADD", conf, a, "c0", extra={"CNI_ARGS": "IP=10.222.10.50"}).out["ips"][0]["address"]
        == "10.222.10.50/24"
    )
    assert_error(cni.run("pybridge", "ADD", conf, b, "c1", extra={"CNI_ARGS": "IP=10.222.10.50"}), 11, "10.222.10.50")
    assert_error(cni.run("pybridge", "ADD", conf, b, "c1", extra={"CNI_ARGS": "IP=10.99.0.1"}), 7, "10.99.0.1")
    assert cni.allocations(conf["name"]) == ["10.222.10.50"]
