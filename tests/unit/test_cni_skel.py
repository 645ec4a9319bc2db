"""The CNI protocol layer: environment and config validation, version gating, result and error JSON."""
from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from cni_plugins import skel
from cni_plugins.result import DNS, Interface, IPConfig, Result, Route
from cni_plugins.versions import LATEST, SUPPORTED_VERSIONS


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def add(self, args: skel.CmdArgs) -> Result:
        self.calls.append("ADD")
        return Result(interfaces=[Interface("eth0", "aa:bb:cc:dd:ee:ff", 1500, "/run/netns/x")],
                      ips=[IPConfig(ipaddress.ip_interface("10.0.0.2/24"), ipaddress.ip_address("10.0.0.1"), 0)])

    def delete(self, args: skel.CmdArgs) -> None:
        self.calls.append("DEL")

    def check(self, args: skel.CmdArgs) -> None:
        self.calls.append("CHECK")

    def status(self, args: skel.CmdArgs) -> None:
        self.calls.append("STATUS")

    def gc(self, args: skel.CmdArgs) -> None:
        raise skel.CNIError(skel.ERR_IO_FAILURE, "disk on fire")


ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c1",
    "CNI_NETNS": "/run/netns/x",
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/opt/cni/bin",
}


def run(conf: dict | bytes, **env: str) -> tuple[int, Any, Recorder]:
    plugin = Recorder()
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    rc, out = skel.execute(plugin, {**ENV, **env}, stdin)
    return rc, json.loads(out) if out else None, plugin


def conf(version: str = LATEST) -> dict:
    return {"cniVersion": version, "name": "net1", "type": "x"}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_add_result_per_version(version: str) -> None:
    rc, out, _ = run(conf(version))
    assert rc == 0
    ip = out["ips"][0]
    assert out["cniVersion"] == version
    assert ip["address"] == "10.0.0.2/24" and ip["gateway"] == "10.0.0.1" and ip["interface"] == 0
    assert ("version" in ip) == version.startswith("0.")
    assert ("mtu" in out["interfaces"][0]) == (version == "1.1.0")
    assert ("dns" in out) == version.startswith("0.")


def test_version_command() -> None:
    rc, out, plugin = run(b"", CNI_COMMAND="VERSION")
    assert rc == 0 and out["supportedVersions"] == list(SUPPORTED_VERSIONS)
    rc, out, _ = run({"cniVersion": "0.4.0"}, CNI_COMMAND="VERSION")
    assert out["cniVersion"] == "0.4.0"
    assert plugin.calls == []


@pytest.mark.parametrize("env,code,word", [
    ({"CNI_COMMAND": ""}, 4, "CNI_COMMAND"),
    ({"CNI_COMMAND": "NOPE"}, 4, "NOPE"),
    ({"CNI_NETNS": ""}, 4, "CNI_NETNS"),
    ({"CNI_IFNAME": "", "CNI_CONTAINERID": ""}, 4, "CNI_CONTAINERID,CNI_IFNAME"),
    ({"CNI_CONTAINERID": "../x"}, 4, "CNI_CONTAINERID"),
    ({"CNI_IFNAME": "a/b"}, 4, "invalid character"),
    ({"CNI_IFNAME": "x" * 16}, 4, "too long"),
    ({"CNI_ARGS": "A=1;broken"}, 4, "broken"),
])
def test_environment_errors(env: dict, code: int, word: str) -> None:
    rc, out, plugin = run(conf(), **env)
    assert rc == 1 and out["code"] == code and word in out["msg"] + out.get("details", "")
    assert plugin.calls == []


@pytest.mark.parametrize("env", [{"CNI_CONTAINERID": "c1\n"}, {"CNI_CONTAINERID": "c1\n", "CNI_COMMAND": "DEL"},
                                 {"CNI_IFNAME": "eth0\n"}, {"CNI_IFNAME": "eth0\n", "CNI_COMMAND": "CHECK"}],
                         ids=["id-add", "id-del", "ifname-add", "ifname-check"])
def test_a_trailing_newline_is_refused_naming_the_variable(env: dict) -> None:
    """Python's `$` matches before a final newline; the spec's ID and interface name rules allow none."""
    rc, out, plugin = run(conf(), **env)
    [variable] = [k for k in env if k != "CNI_COMMAND"]
    assert rc == 1 and out["code"] == skel.ERR_INVALID_ENVIRONMENT and variable in out["msg"]
    assert plugin.calls == []


def test_a_network_name_with_a_trailing_newline_is_refused() -> None:
    rc, out, plugin = run({**conf(), "name": "net1\n"})
    assert rc == 1 and out["code"] == skel.ERR_INVALID_NETWORK_CONFIG and "network name" in out["msg"]
    assert plugin.calls == []


def test_del_needs_no_netns() -> None:
    rc, _, plugin = run(conf(), CNI_COMMAND="DEL", CNI_NETNS="")
    assert rc == 0 and plugin.calls == ["DEL"]


@pytest.mark.parametrize("stdin,code,word", [
    (b"{", 6, "decoding"),
    (b"\xff\xfe", 6, "decoding"),
    (b"42", 6, "not a JSON object"),
    (json.dumps({"cniVersion": 1, "name": "n"}).encode(), 6, "cniVersion"),
    (json.dumps({"cniVersion": "0.2.0", "name": "n"}).encode(), 1, "0.2.0"),
    (json.dumps({"name": "n"}).encode(), 1, "0.1.0"),
    (json.dumps({"cniVersion": "1.1.0"}).encode(), 7, "network name"),
    (json.dumps({"cniVersion": "1.1.0", "name": "bad name"}).encode(), 7, "network name"),
])
def test_config_errors(stdin: bytes, code: int, word: str) -> None:
    rc, out, _ = run(stdin)
    assert rc == 1 and out["code"] == code and word in out["msg"] + out.get("details", "")


def test_version_gates() -> None:
    assert run(conf("0.3.1"), CNI_COMMAND="CHECK")[1]["code"] == 1
    assert run(conf("0.4.0"), CNI_COMMAND="CHECK")[0] == 0
    assert run(conf("1.0.0"), CNI_COMMAND="STATUS")[1]["code"] == 1
    assert run(conf("1.1.0"), CNI_COMMAND="STATUS")[0] == 0


def test_plugin_errors_become_error_json() -> None:
    rc, out, _ = run(conf("1.1.0"), CNI_COMMAND="GC")
    assert rc == 1 and out == {"cniVersion": "1.1.0", "code": 5, "msg": "disk on fire"}


def test_result_round_trip_keeps_route_attributes() -> None:
    res = Result(
        routes=[
            Route(ipaddress.ip_interface("10.1.0.0/16"), ipaddress.ip_address("10.0.0.1"), mtu=1400, table=100, scope=0)
        ],
        dns=DNS(["1.1.1.1"], "d", ["s"], ["ndots:2"]),
    )
    raw = res.to_json("1.1.0")
    assert raw["routes"] == [{"dst": "10.1.0.0/16", "gw": "10.0.0.1", "mtu": 1400, "table": 100}]
    assert Result.from_json(raw).to_json("1.1.0") == raw
    assert res.to_json("1.0.0")["routes"] == [{"dst": "10.1.0.0/16", "gw": "10.0.0.1"}]


def test_prev_result_in_any_version() -> None:
    prev = {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.2/24", "interface": 0}]}
    args = skel._parse(ENV, json.dumps(dict(conf("0.3.1"), prevResult=prev)).encode())
    result = args.prev_result()
    assert result is not None and str(result.ips[0].address) == "10.0.0.2/24"
    bad = skel._parse(ENV, json.dumps(dict(conf(), prevResult={"ips": [{"address": "nope"}]})).encode())
    with pytest.raises(skel.CNIError) as err:
        bad.prev_result()
    assert err.value.code == 6


class FailingAdd(Recorder):
    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc

    def add(self, args: skel.CmdArgs) -> Result:
        self.exc.add_note("undoing the host veth failed: OSError: busy")
        raise self.exc


@pytest.mark.parametrize("exc,code,details", [
    (skel.CNIError(skel.ERR_TRY_AGAIN_LATER, "no addresses", "range 10.0.0.0/30"), skel.ERR_TRY_AGAIN_LATER,
     "range 10.0.0.0/30; undoing the host veth failed: OSError: busy"),
    (RuntimeError("boom"), skel.ERR_INTERNAL, "undoing the host veth failed: OSError: busy"),
])
def test_rollback_failures_reach_the_error_details(exc: Exception, code: int, details: str) -> None:
    """A failed ADD's rollback notes its own failures on the error; the caller sees them, the error stays."""
    rc, out = skel.execute(FailingAdd(exc), ENV, json.dumps(conf()).encode())
    error = json.loads(out)
    assert rc == 1 and error["code"] == code and error["details"] == details
