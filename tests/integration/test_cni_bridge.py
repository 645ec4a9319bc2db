"""pybridge + pyhost-local + pyloopback as a CNI runtime calls them, in namespaces the tests create."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cni_plugins.versions import LATEST, SUPPORTED_VERSIONS
from tests.integration.cni_helpers import CNIEnv, chains_for, helper_listening, ns_exec, ping, tcp_roundtrip

pytestmark = pytest.mark.usefixtures("restore_forwarding")

def bridge_conf(cni: CNIEnv, subnet: str = "10.222.10.0/24", version: str = LATEST, **extra) -> dict:
    conf = {
        "cniVersion": version, "name": cni.network(), "type": "pybridge", "bridge": cni.bridge(),
        "isGateway": True,
        "ipam": {"type": "pyhost-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(cni.data_dir),
                 "routes": [{"dst": "0.0.0.0/0"}]},
    }
    conf.update(extra)
    return conf


def links_in(netns: str) -> list[str]:
    out = ns_exec(netns, "ip", "-o", "link").stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def host_veths() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith("veth")}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_add_gives_address_and_connectivity(cni: CNIEnv, version: str) -> None:
    conf = bridge_conf(cni, version=version)
    a, b = cni.netns(), cni.netns()
    ra = cni.run("pybridge", "ADD", conf, a, "ca")
    rb = cni.run("pybridge", "ADD", conf, b, "cb")
    assert ra.ok, ra.raw
    assert rb.ok, rb.raw
    res = ra.out
    assert res["cniVersion"] == version
    assert res["interfaces"][0]["name"] == conf["bridge"]
    assert res["interfaces"][2] == {"name": "eth0", "mac": res["interfaces"][2]["mac"], "sandbox": a}
    ip = res["ips"][0]
    assert ip["address"] == "10.222.10.2/24" and ip["gateway"] == "10.222.10.1" and ip["interface"] == 2
    assert ("version" in ip) == version.startswith("0.")
    addr_b = rb.out["ips"][0]["address"].split("/")[0]
    assert addr_b == "10.222.10.3"
    assert ping(a, "10.222.10.1"), "container cannot reach the gateway"
    assert ping(a, addr_b), "container cannot reach another container on the bridge"
    assert ping(None, "10.222.10.2"), "host cannot reach the container"
    assert tcp_roundtrip(b, addr_b, a) == "HELLO"
    assert tcp_roundtrip(a, "10.222.10.2", None) == "HELLO"
    for netns, cid in ((a, "ca"), (b, "cb")):
        assert cni.run("pybridge", "DEL", conf, netns, cid).ok
    assert cni.allocations(conf["name"]) == []
    assert links_in(a) == ["lo"]


def test_check_del_idempotent_and_netns_gone(cni: CNIEnv) -> None:
    conf = bridge_conf(cni, ipMasq=True, hairpinMode=True, mtu=1400)
    ns = cni.netns()
    veths = host_veths()
    add = cni.run("pybridge", "ADD", conf, ns, "c1")
    assert add.ok, add.raw
    assert chains_for(conf["name"]), "ipMasq made no rules"
    host = add.out["interfaces"][1]["name"]
    assert Path(f"/sys/class/net/{host}/brport/hairpin_mode").read_text().strip() == "1"
    assert Path(f"/sys/class/net/{host}/mtu").read_text().strip() == "1400"
    assert ns_exec(ns, "cat", "/proc/sys/net/ipv4/conf/eth0/arp_notify").stdout.strip() == "1"
    checked = dict(conf, prevResult=add.out)
    assert cni.run("pybridge", "CHECK", checked, ns, "c1").ok
    ns_exec(ns, "ip", "addr", "flush", "dev", "eth0")
    bad = cni.run("pybridge", "CHECK", checked, ns, "c1")
    assert not bad.ok and "10.222.10.2" in bad.out["msg"]
    assert cni.run("pybridge", "DEL", checked, ns, "c1").ok
    assert cni.run("pybridge", "DEL", checked, ns, "c1").ok
    assert cni.allocations(conf["name"]) == [] and chains_for(conf["name"]) == []
    assert host_veths() == veths
    # the namespace is gone before DEL: the address is still released
    ns2 = cni.netns()
    assert cni.run("pybridge", "ADD", conf, ns2, "c2").ok
    subprocess.run(["ip", "netns", "del", ns2.rsplit("/", 1)[1]], check=True)
    cni.namespaces.remove(ns2.rsplit("/", 1)[1])
    assert cni.allocations(conf["name"]) == ["10.222.10.3"]
    assert cni.run("pybridge", "DEL", conf, ns2, "c2").ok
    assert cni.allocations(conf["name"]) == []
    assert chains_for(conf["name"]) == []


def test_dual_stack(cni: CNIEnv) -> None:
    conf = bridge_conf(cni, isDefaultGateway=True)
    conf["ipam"]["ranges"] = [[{"subnet": "10.222.11.0/24"}], [{"subnet": "fd00:222:11::/64"}]]
    conf["ipam"].pop("routes")
    ns = cni.netns()
    add = cni.run("pybridge", "ADD", conf, ns, "c1")
    assert add.ok, add.raw
    assert [i["address"] for i in add.out["ips"]] == ["10.222.11.2/24", "fd00:222:11::2/64"]
    assert [r["dst"] for r in add.out["routes"]] == ["0.0.0.0/0", "::/0"]
    assert ping(ns, "10.222.11.1")
    assert ping(ns, "fd00:222:11::1", attempts=10)
    routes6 = ns_exec(ns, "ip", "-6", "route").stdout
    assert "default via fd00:222:11::1" in routes6
    assert cni.run("pybridge", "DEL", conf, ns, "c1").ok
    assert cni.allocations(conf["name"]) == []


def test_layer2_and_disabled_interface(cni: CNIEnv) -> None:
    conf = {"cniVersion": "1.0.0", "name": cni.network(), "type": "pybridge", "bridge": cni.bridge(), "ipam": {}}
    ns = cni.netns()
    add = cni.run("pybridge", "ADD", conf, ns, "c1")
    assert add.ok, add.raw
    assert "ips" not in add.out and len(add.out["interfaces"]) == 3
    assert "UP" in ns_exec(ns, "ip", "-br", "link", "show", "eth0").stdout
    assert cni.run("pybridge", "DEL", conf, ns, "c1").ok
    off = dict(conf, disableContainerInterface=True)
    assert cni.run("pybridge", "ADD", off, ns, "c2").ok
    assert "DOWN" in ns_exec(ns, "ip", "-br", "link", "show", "eth0").stdout
    assert cni.run("pybridge", "DEL", off, ns, "c2").ok
    both = dict(off, ipam={"type": "pyhost-local", "subnet": "10.222.12.0/24", "dataDir": str(cni.data_dir)})
    err = cni.run("pybridge", "ADD", both, ns, "c3")
    assert err.out["code"] == 7 and "DisableContainerInterface" in err.out["msg"]


def kernel_has_vlan_filtering() -> bool:
    probe = "pyt-vlanprobe"
    made = subprocess.run(["ip", "link", "add", probe, "type", "bridge", "vlan_filtering", "1"], capture_output=True)
    subprocess.run(["ip", "link", "del", probe], capture_output=True)
    return made.returncode == 0


def test_bridge_keeps_its_mac_as_pods_come_and_go(cni: CNIEnv) -> None:
    """As the reference's: the bridge's MAC is set explicitly (addr_assign_type 3, NET_ADDR_SET). Left to the
    kernel it follows the lowest port MAC, and each pod's ARP entry for its gateway would go stale."""
    conf = bridge_conf(cni, subnet="10.222.14.0/24")
    first = cni.netns()
    assert cni.run("pybridge", "ADD", conf, first, "c1").ok
    sysfs = Path(f"/sys/class/net/{conf['bridge']}")
    mac = (sysfs / "address").read_text()
    assert (sysfs / "addr_assign_type").read_text().strip() == "3"
    later = []
    for i in range(3):  # host veths with random MACs: some lower than the bridge's
        later.append(cni.netns())
        assert cni.run("pybridge", "ADD", conf, later[-1], f"c{i + 2}").ok
        assert (sysfs / "address").read_text() == mac
    for i, netns in enumerate([first, *later]):
        assert cni.run("pybridge", "DEL", conf, netns, f"c{i + 1}").ok


def test_promisc(cni: CNIEnv) -> None:
    conf = {"cniVersion": "1.0.0", "name": cni.network(), "type": "pybridge", "bridge": cni.bridge(),
            "promiscMode": True, "ipam": {}}
    ns = cni.netns()
    assert cni.run("pybridge", "ADD", conf, ns, "c1").ok
    assert int(Path(f"/sys/class/net/{conf['bridge']}/flags").read_text(), 16) & 0x100
    assert cni.run("pybridge", "DEL", conf, ns, "c1").ok


@pytest.mark.skipif(not kernel_has_vlan_filtering(),
                    reason="kernel built without bridge VLAN filtering, as this project's VM's is; the test runs in "
                           "make test-lab, on the node VM's stock Debian 12 kernel (tests/lab/test_lab_v2.py's "
                           "GUEST_SUITE)")
def test_vlan(cni: CNIEnv) -> None:
    conf = {"cniVersion": "1.0.0", "name": cni.network(), "type": "pybridge", "bridge": cni.bridge(),
            "vlan": 100, "vlanTrunk": [{"id": 101}, {"minID": 200, "maxID": 202}], "ipam": {}}
    ns = cni.netns()
    add = cni.run("pybridge", "ADD", conf, ns, "c1")
    assert add.ok, add.raw
    host = add.out["interfaces"][1]["name"]
    vlans = json.loads(
        subprocess.run(["bridge", "-j", "vlan", "show", "dev", host], capture_output=True, text=True).stdout
    )
    by_vid = {v["vlan"]: v.get("flags", []) for v in vlans[0]["vlans"]}
    assert set(by_vid) == {1, 100, 101, 200, 201, 202}
    assert "PVID" in by_vid[100] and "Egress Untagged" in by_vid[100]
    assert Path(f"/sys/class/net/{conf['bridge']}/bridge/vlan_filtering").read_text().strip() == "1"
    assert cni.run("pybridge", "DEL", conf, ns, "c1").ok


def test_loopback(cni: CNIEnv) -> None:
    ns = cni.netns()
    conf = {"cniVersion": "1.1.0", "name": "lo-net", "type": "pyloopback"}
    add = cni.run("pyloopback", "ADD", conf, ns, "c1", ifname="lo")
    assert add.ok, add.raw
    assert add.out["interfaces"] == [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": ns}]
    assert {i["address"] for i in add.out["ips"]} == {"127.0.0.1/8", "::1/128"}
    assert ping(ns, "127.0.0.1")
    prev = {"cniVersion": "1.1.0", "ips": [{"address": "10.9.9.9/24"}]}
    chained = cni.run("pyloopback", "ADD", dict(conf, prevResult=prev), ns, "c1", ifname="lo")
    assert chained.out == prev
    assert cni.run("pyloopback", "CHECK", conf, ns, "c1", ifname="lo").ok
    assert cni.run("pyloopback", "DEL", conf, ns, "c1", ifname="lo").ok
    assert "LOOPBACK" in ns_exec(ns, "ip", "-br", "link", "show", "lo").stdout
    assert not ping(ns, "127.0.0.1")


def test_gc_and_status(cni: CNIEnv) -> None:
    conf = bridge_conf(cni, subnet="10.222.13.0/29")
    nss = [cni.netns() for _ in range(3)]
    for i, ns in enumerate(nss):
        assert cni.run("pybridge", "ADD", conf, ns, f"c{i}").ok
    assert cni.run("pybridge", "STATUS", conf).ok
    assert len(cni.allocations(conf["name"])) == 3
    gc = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]})
    r = cni.run("pybridge", "GC", gc, container_id="", ifname="")
    assert r.ok and r.out is None
    assert cni.allocations(conf["name"]) == ["10.222.13.3"]
    # fill the /29 (.2-.6 less the gateway .1): status then says not available
    more = [cni.netns() for _ in range(4)]
    results = [cni.run("pybridge", "ADD", conf, ns, f"d{i}") for i, ns in enumerate(more)]
    assert [r.ok for r in results] == [True, True, True, True]
    st = cni.run("pybridge", "STATUS", conf)
    assert st.rc != 0 and st.out["code"] == 50
    old = cni.run("pybridge", "STATUS", dict(conf, cniVersion="1.0.0"))
    assert old.out["code"] == 1


def test_helper_serves_and_stops(cni: CNIEnv) -> None:
    cni.use_helper = True
    conf = bridge_conf(cni, subnet="10.222.14.0/24")
    nss = [cni.netns() for _ in range(3)]
    results = [cni.run("pybridge", "ADD", conf, ns, f"c{i}") for i, ns in enumerate(nss)]
    assert [r.out["ips"][0]["address"] for r in results] == ["10.222.14.2/24", "10.222.14.3/24", "10.222.14.4/24"]
    assert helper_listening(cni.helper_name), "no helper was started on demand"
    for i, ns in enumerate(nss):
        assert cni.run("pybridge", "DEL", conf, ns, f"c{i}").ok
    assert cni.allocations(conf["name"]) == []
    assert ping(None, "10.222.14.1")
