"""host-local without a kernel: config validation, round-robin allocation, the file store and its lock, GC."""
from __future__ import annotations

import ipaddress
import json
import multiprocessing
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cni_plugins import skel
from cni_plugins.ipam.host_local import allocator, config, plugin
from cni_plugins.ipam.host_local.backend import AllocationStore
from cni_plugins.ipam.host_local.store import DiskAllocationStore
from cni_plugins.result import IPAddress


def args(ipam: dict, cid: str = "c1", ifname: str = "eth0", command: str = "ADD", version: str = "1.1.0",
         cni_args: str = "", **top) -> skel.CmdArgs:
    conf = {"cniVersion": version, "name": "net1", "ipam": {"type": "pyhost-local", **ipam}, **top}
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/dev/null", "CNI_IFNAME": ifname,
           "CNI_ARGS": cni_args}
    return skel._parse(env, json.dumps(conf).encode())


def ip(s: str):
    return ipaddress.ip_address(s)


def test_range_defaults() -> None:
    r = config.Range.parse({"subnet": "10.1.2.0/24"})
    assert (str(r.start), str(r.end), str(r.gateway)) == ("10.1.2.1", "10.1.2.254", "10.1.2.1")
    r6 = config.Range.parse({"subnet": "fd00::/120"})
    assert (str(r6.start), str(r6.end)) == ("fd00::1", "fd00::ff")


@pytest.mark.parametrize("raw,word", [
    ({"subnet": "10.1.2.3/24"}, "host bits"),
    ({"subnet": "10.1.2.0/31"}, "too small"),
    ({"subnet": "nonsense"}, "invalid subnet"),
    ({"subnet": "10.1.2.0/24", "rangeStart": "10.1.3.1"}, "RangeStart"),
    ({"subnet": "10.1.2.0/24", "rangeEnd": "fd00::1"}, "RangeEnd"),
    ({"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.9", "rangeEnd": "10.1.2.5"}, "after"),
    ({}, "no subnet"),
])
def test_range_errors(raw: dict, word: str) -> None:
    with pytest.raises(skel.CNIError) as err:
        config.Range.parse(raw)
    assert err.value.code == 7 and word in err.value.msg + err.value.details


def test_config_errors() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "no IP ranges"),
        ({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]}, "overlap"),
        ({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]]}, "overlaps"),
        ({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}, "mixed"),
        ({"subnet": "10.0.0.0/24", "routes": [{"gw": "10.0.0.1"}]}, "dst"),
        ({"subnet": "10.0.0.0/24", "resolvConf": "/nonexistent/resolv.conf"}, "resolvConf"),
    ]
    for ipam, word in cases:
        with pytest.raises(skel.CNIError) as err:
            config.load(args(ipam))
        assert err.value.code == 7 and word in err.value.msg + err.value.details, ipam
    with pytest.raises(skel.CNIError):
        config.load(skel._parse({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/x", "CNI_IFNAME": "e"},
                                b'{"cniVersion": "1.0.0", "name": "n"}'))


def test_round_robin_and_wrap(tmp_path: Path) -> None:
    rs = config.RangeSet.parse([{"subnet": "10.0.0.0/29"}])
    store = DiskAllocationStore(tmp_path / "net")
    got = []
    with store.locked():
        for n in range(5):
            got.append(str(allocator.allocate(store, rs, 0, f"c{n}", "eth0", None).address))
        assert got == ["10.0.0.2/29", "10.0.0.3/29", "10.0.0.4/29", "10.0.0.5/29", "10.0.0.6/29"]
        with pytest.raises(skel.CNIError) as err:
            allocator.allocate(store, rs, 0, "c9", "eth0", None)
        assert err.value.code == 11 and "10.0.0.1-10.0.0.6" in err.value.msg
        store.release_by_id("c1", "eth0")
        # after the last reserved (.6) the search wraps and skips the gateway .1
        assert str(allocator.allocate(store, rs, 0, "c10", "eth0", None).address.ip) == "10.0.0.3"
        with pytest.raises(skel.CNIError) as dup:
            allocator.allocate(store, rs, 0, "c10", "eth0", None)
        assert "duplicate" in dup.value.msg


class MemoryStore:
    """An AllocationStore that is not the disk's, to show what the allocator needs of one."""

    def __init__(self) -> None:
        self.held: dict[IPAddress, tuple[str, str]] = {}
        self.last: dict[int, IPAddress] = {}

    @contextmanager
    def locked(self) -> Iterator[MemoryStore]:
        yield self

    def reserve(self, container_id: str, ifname: str, ip: IPAddress, range_id: int) -> bool:
        if ip in self.held:
            return False
        self.held[ip], self.last[range_id] = (container_id, ifname), ip
        return True

    def last_reserved(self, range_id: int) -> IPAddress | None:
        return self.last.get(range_id)

    def ips_of(self, container_id: str, ifname: str) -> list[IPAddress]:
        return [ip for ip, owner in self.held.items() if owner == (container_id, ifname)]

    def release_by_id(self, container_id: str, ifname: str) -> None:
        self.release_all_but({owner for owner in self.held.values() if owner != (container_id, ifname)})

    def release(self, ip: IPAddress) -> None:
        self.held.pop(ip, None)

    def release_all_but(self, valid: set[tuple[str, str]]) -> None:
        self.held = {ip: owner for ip, owner in self.held.items() if owner in valid}

    def is_allocated(self, ip: IPAddress) -> bool:
        return ip in self.held


def test_the_allocator_runs_on_any_allocation_store() -> None:
    store: AllocationStore = MemoryStore()
    rs = config.RangeSet.parse([{"subnet": "10.0.0.0/29"}])
    with store.locked():
        got = [str(allocator.allocate(store, rs, 0, f"c{n}", "eth0", None).address.ip) for n in range(5)]
        assert got == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
        assert not allocator.has_free(store, rs)
        store.release_by_id("c1", "eth0")
        assert allocator.has_free(store, rs)
        assert str(allocator.allocate(store, rs, 0, "c10", "eth0", None).address.ip) == "10.0.0.3"


def test_release_removes_an_empty_temporary_file_of_a_killed_add(tmp_path: Path) -> None:
    """A plugin killed between creating its reservation file and writing its content leaves it empty: DEL
    of that attachment still finds it by name (test_cni_parallel's kill sweep hit this window)."""
    store = DiskAllocationStore(tmp_path / "net")
    with store.locked():
        (store.dir / ".reserve.killed.eth0").write_bytes(b"")
        (store.dir / ".reserve.other.eth0").write_bytes(b"")
        store.release_by_id("killed", "eth0")
    assert sorted(p.name for p in store.dir.iterdir()) == [".reserve.other.eth0", "lock"]


def test_round_robin_across_ranges(tmp_path: Path) -> None:
    rs = config.RangeSet.parse([{"subnet": "10.0.0.0/30"}, {"subnet": "10.0.1.0/30"}])
    store = DiskAllocationStore(tmp_path / "net")
    with store.locked():
        got = [str(allocator.allocate(store, rs, 0, f"c{n}", "eth0", None).address.ip) for n in range(2)]
    assert got == ["10.0.0.2", "10.0.1.2"]


def test_store_files_are_reference_compatible(tmp_path: Path) -> None:
    result = plugin.add(args({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]],
                              "dataDir": str(tmp_path)}, cid="abc"))
    d = tmp_path / "net1"
    assert (d / "10.0.0.2").read_bytes() == b"abc\r\neth0"
    assert (d / "fd00::2").read_bytes() == b"abc\r\neth0"
    assert (d / "last_reserved_ip.0").read_text() == "10.0.0.2"
    assert (d / "last_reserved_ip.1").read_text() == "fd00::2"
    assert [str(i.address) for i in result.ips] == ["10.0.0.2/24", "fd00::2/64"]
    plugin.delete(args({"dataDir": str(tmp_path)}, cid="abc", command="DEL"))
    assert sorted(p.name for p in d.iterdir()) == ["last_reserved_ip.0", "last_reserved_ip.1", "lock"]


def test_store_modes_are_the_references(tmp_path: Path) -> None:
    """v1.10.0: MkdirAll 0755 for every level, allocations and last_reserved_ip 0600, the lock 0750; a leftover
    0644 temporary file of a killed call does not pass its mode on."""
    old = os.umask(0o022)
    try:
        data = tmp_path / "a" / "b"
        (data / "net1").mkdir(parents=True)
        (data / "net1" / ".reserve.abc.eth0").write_bytes(b"stale")
        plugin.add(args({"ranges": [[{"subnet": "10.0.0.0/24"}]], "dataDir": str(tmp_path / "x" / "y")}, cid="abc"))
        plugin.add(args({"ranges": [[{"subnet": "10.0.0.0/24"}]], "dataDir": str(data)}, cid="abc"))
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert modes == {
        "x": 0o755, "x/y": 0o755, "x/y/net1": 0o755, "x/y/net1/lock": 0o750,
        "x/y/net1/10.0.0.2": 0o600, "x/y/net1/last_reserved_ip.0": 0o600,
        "a": 0o755, "a/b": 0o755, "a/b/net1": 0o755, "a/b/net1/lock": 0o750,
        "a/b/net1/10.0.0.2": 0o600, "a/b/net1/last_reserved_ip.0": 0o600,
    }


def test_requested_ips(tmp_path: Path) -> None:
    ipam = {"subnet": "10.0.0.0/24", "dataDir": str(tmp_path)}
    assert str(plugin.add(args(ipam, cni_args="IP=10.0.0.77")).ips[0].address) == "10.0.0.77/24"
    with pytest.raises(skel.CNIError) as taken:
        plugin.add(args(ipam, cid="c2", cni_args="IP=10.0.0.77"))
    assert "10.0.0.77" in taken.value.msg
    with pytest.raises(skel.CNIError) as gw:
        plugin.add(args(ipam, cid="c3", cni_args="IP=10.0.0.1"))
    assert "gateway" in gw.value.msg
    res = plugin.add(args(ipam, cid="c4", args={"cni": {"ips": ["10.0.0.80"]}}))
    assert str(res.ips[0].address) == "10.0.0.80/24"
    with pytest.raises(skel.CNIError) as outside:
        plugin.add(args(ipam, cid="c5", cni_args="IP=192.168.0.1"))
    assert "192.168.0.1" in outside.value.msg
    assert sorted(p.name for p in (tmp_path / "net1").iterdir() if p.name[0].isdigit()) == ["10.0.0.77", "10.0.0.80"]


def test_routes_dns_and_result(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(
        "# c\nnameserver 10.0.0.53\nnameserver fd00::53\ndomain d.test\nsearch a.test b.test\noptions ndots:3\n"
    )
    res = plugin.add(
        args(
            {
                "subnet": "10.0.0.0/24",
                "dataDir": str(tmp_path),
                "resolvConf": str(resolv),
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.0.0.9"}],
            },
            version="0.3.1",
        )
    )
    assert res.to_json("0.3.1") == {
        "cniVersion": "0.3.1",
        "ips": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.0.0.9"}],
        "dns": {
            "nameservers": ["10.0.0.53", "fd00::53"],
            "domain": "d.test",
            "search": ["a.test", "b.test"],
            "options": ["ndots:3"],
        },
    }


def test_gc_keeps_only_valid_attachments(tmp_path: Path) -> None:
    ipam = {"subnet": "10.0.0.0/24", "dataDir": str(tmp_path)}
    for n in range(4):
        plugin.add(args(ipam, cid=f"c{n}"))
    (tmp_path / "net1" / ".reserve.c9.eth0").write_bytes(b"c9\r\neth0")
    valid: dict[str, Any] = {"cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "eth0"}]}
    plugin.gc(args(ipam, command="GC", **valid))
    assert sorted(p.name for p in (tmp_path / "net1").iterdir()) == ["10.0.0.4", "last_reserved_ip.0", "lock"]
    with pytest.raises(skel.CNIError):
        plugin.gc(args(ipam, command="GC", **{"cni.dev/valid-attachments": "all"}))


def test_check_and_status(tmp_path: Path) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/30"}]], "dataDir": str(tmp_path)}
    with pytest.raises(skel.CNIError) as missing:
        plugin.check(args(ipam, command="CHECK"))
    assert missing.value.code == 3
    plugin.status(args(ipam, command="STATUS"))
    plugin.add(args(ipam))
    plugin.check(args(ipam, command="CHECK"))
    with pytest.raises(skel.CNIError) as full:
        plugin.status(args(ipam, command="STATUS"))
    assert full.value.code == 50


def _hammer(data_dir: str, worker: int, out) -> None:
    ipam = {"subnet": "10.0.0.0/16", "dataDir": data_dir}
    got = [str(plugin.add(args(ipam, cid=f"w{worker}-{n}")).ips[0].address.ip) for n in range(25)]
    out.put(got)


def test_concurrent_processes_and_threads_never_share(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), w, queue)) for w in range(4)]
    threads = [threading.Thread(target=_hammer, args=(str(tmp_path), 10 + w, queue)) for w in range(4)]
    for p in procs:
        p.start()
    for t in threads:
        t.start()
    results = [queue.get(timeout=60) for _ in range(8)]
    for p in procs:
        p.join()
    for t in threads:
        t.join()
    everything = [a for r in results for a in r]
    assert len(everything) == 200 and len(set(everything)) == 200
