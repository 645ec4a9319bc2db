"""Concurrency and crashes: parallel ADDs never share an address; a plugin killed mid-ADD is cleaned up by DEL."""
from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.cni_helpers import CNIEnv, chains_for, ns_exec
from tests.integration.test_cni_bridge import bridge_conf, host_veths

pytestmark = pytest.mark.usefixtures("restore_forwarding")

COUNT = 50


@pytest.mark.parametrize("use_helper", [False, True], ids=["in-process", "helper"])
def test_parallel_adds_get_distinct_addresses(cni: CNIEnv, use_helper: bool) -> None:
    cni.use_helper = use_helper
    conf = bridge_conf(cni, subnet="10.222.50.0/24", ipMasq=True)
    veths = host_veths()
    nss = [cni.netns() for _ in range(COUNT)]
    with ThreadPoolExecutor(COUNT) as pool:
        adds = list(pool.map(lambda i: cni.run("pybridge", "ADD", conf, nss[i], f"par{i}", timeout=120), range(COUNT)))
    assert all(r.ok for r in adds), [r.raw for r in adds if not r.ok][:3]
    addresses = [r.out["ips"][0]["address"] for r in adds]
    assert len(set(addresses)) == COUNT
    assert sorted(cni.allocations(conf["name"])) == sorted(a.split("/")[0] for a in addresses)
    assert len(host_veths() - veths) == COUNT
    with ThreadPoolExecutor(COUNT) as pool:
        dels = list(pool.map(lambda i: cni.run("pybridge", "DEL", conf, nss[i], f"par{i}", timeout=120), range(COUNT)))
    assert all(r.ok for r in dels), [r.raw for r in dels if not r.ok][:3]
    assert cni.allocations(conf["name"]) == []
    assert host_veths() == veths
    assert chains_for(conf["name"]) == []


@pytest.mark.parametrize("use_helper", [False, True], ids=["in-process", "helper"])
def test_killed_add_then_del_leaves_nothing(cni: CNIEnv, use_helper: bool) -> None:
    cni.use_helper = use_helper
    conf = bridge_conf(cni, subnet="10.222.51.0/24", ipMasq=True)
    ns = cni.netns()
    if use_helper:  # warm the helper so the kills land inside the forwarded call
        assert cni.run("pybridge", "ADD", conf, ns, "warm").ok
        assert cni.run("pybridge", "DEL", conf, ns, "warm").ok
    veths = host_veths()
    stdin = json.dumps(conf).encode()
    # in-process, imports take ~150 ms and the netlink/IPAM/iptables work the next ~70 ms: sample that densely
    delays = [0.0, 0.01, 0.05, 0.1, 0.13, 0.15, 0.16, 0.17, 0.18, 0.19, 0.2, 0.21, 0.22, 0.24, 0.27, 0.3]
    for n, delay in enumerate(delays):
        cid = f"kill{n}"
        proc = subprocess.Popen([str(cni.bin_dir / "pybridge")], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                env=cni.env("ADD", ns, cid))
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        time.sleep(delay)
        proc.kill()
        proc.wait()
        assert cni.run("pybridge", "DEL", conf, ns, cid).ok
        assert cni.allocations(conf["name"]) == [], f"allocation left after a kill at {delay}s"
        assert ns_exec(ns, "ip", "-o", "link").stdout.count("\n") == 1, f"container veth left after a kill at {delay}s"
        assert host_veths() == veths, f"host veth left after a kill at {delay}s"
        assert chains_for(conf["name"]) == [], f"masquerade rules left after a kill at {delay}s"
        again = cni.run("pybridge", "ADD", conf, ns, cid)
        assert again.ok, again.raw
        assert cni.run("pybridge", "DEL", conf, ns, cid).ok
    leftovers = [p.name for p in (cni.data_dir / conf["name"]).iterdir() if p.name.startswith(".")]
    assert leftovers == []
