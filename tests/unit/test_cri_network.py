"""pyruntime.cri.network without root: config selection and validation, the conf dir followed live, and the
exec protocol (env, stdin, chaining, capabilities, cache, DEL order, errors, timeouts) against a fake
plugin that records each call."""
from __future__ import annotations

import base64
import json
import os
import re
import sys
from pathlib import Path

import pytest

from proto import api_pb2
from pyruntime import errors
from pyruntime.cri.network import Network, PluginError, parse_conf, pod_ips
from pyruntime.linux.syscalls import FakeSyscalls

FAKE = """#!{python}
import json, os, sys, time
conf = json.load(sys.stdin)
cmd = os.environ["CNI_COMMAND"]
with open(os.environ["FAKE_LOG"], "a") as f:
    env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
    f.write(json.dumps({{"type": conf["type"], "env": env, "conf": conf}}) + "\\n")
fake = conf.get("fake", {{}})
time.sleep(fake.get("sleep", 0))
if cmd in fake.get("fail", {{}}):
    print(json.dumps(fake["fail"][cmd]))
    sys.exit(1)
if cmd == "ADD":
    result = conf.get("prevResult") or {{
        "cniVersion": conf["cniVersion"],
        "interfaces": [{{"name": "br"}}, {{"name": os.environ["CNI_IFNAME"], "sandbox": os.environ["CNI_NETNS"]}}],
        "ips": [{{"address": a, "interface": 1}} for a in fake.get("ips", ["fd00::5/64", "10.9.0.5/24"])]}}
    print(json.dumps(result))
"""


@pytest.fixture
def world(tmp_path: Path):
    bin_dir, conf_dir, cache = tmp_path / "bin", tmp_path / "net.d", tmp_path / "cache"
    conf_dir_, cache_ = conf_dir, cache
    bin_dir.mkdir()
    conf_dir.mkdir()
    for name in ("fakebr", "fakepm", "pyloopback"):
        (bin_dir / name).write_text(FAKE.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"  # (the stale CNI_COMMAND in the env given: the call's own CNI_* win)

    class World:
        conf_dir, cache = conf_dir_, cache_
        kernel = FakeSyscalls()
        net = Network(str(conf_dir), [str(tmp_path / "nothing"), str(bin_dir)], str(cache), kernel=kernel,
                      env={"PATH": os.environ["PATH"], "FAKE_LOG": str(log), "CNI_COMMAND": "stale"}, timeout=5)

        @staticmethod
        def conf(name: str = "10-a.conflist", **plugin_opts) -> Path:
            body = {"cniVersion": "1.0.0", "name": "fakenet", "plugins": [
                {"type": "fakebr", "fake": plugin_opts.get("br", {})},
                {"type": "fakepm", "capabilities": {"portMappings": True, "bandwidth": False},
                 "fake": plugin_opts.get("pm", {})}]}
            (conf_dir / name).write_text(json.dumps(body))
            return conf_dir / name

        @staticmethod
        def calls() -> list[dict]:
            if not log.exists():
                return []
            out = [json.loads(line) for line in log.read_text().splitlines()]
            log.unlink()
            return out

    return World


def ports() -> list[api_pb2.PortMapping]:
    return [api_pb2.PortMapping(protocol=api_pb2.UDP, container_port=53, host_port=5353, host_ip="127.0.0.1"),
            api_pb2.PortMapping(protocol=api_pb2.TCP, container_port=80, host_port=0)]


def test_parse_wraps_a_conf_and_picks_the_highest_known_version() -> None:
    net = parse_conf(b'{"cniVersion": "0.4.0", "name": "n1", "type": "bridge"}', "/d/10.conf")
    assert (net.name, net.version, [p["type"] for p in net.plugins]) == ("n1", "0.4.0", ["bridge"])
    net = parse_conf(json.dumps({"cniVersion": "0.3.1", "cniVersions": ["1.0.0", "9.0.0"], "name": "n2",
                                 "plugins": [{"type": "x"}]}).encode(), "/d/n.conflist")
    assert net.version == "1.0.0"


@pytest.mark.parametrize("body,source,words", [
    (b"{", "/d/a.conflist", "not JSON"),
    (b'{"cniVersion": "1.0.0", "name": "n", "plugins": []}', "/d/a.conflist", "plugins: missing or empty"),
    (b'{"cniVersion": "1.0.0", "name": "bad name", "plugins": [{"type": "x"}]}', "/d/a.conflist", "name:"),
    (b'{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "../x"}]}', "/d/a.conflist", "plugins[0].type"),
    (b'{"cniVersion": "0.2.0", "name": "n", "plugins": [{"type": "x"}]}', "/d/a.conflist", "cniVersion"),
    (b'{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "x"}]}', "/d/a.conf", "type: missing"),
])
def test_parse_rejects_naming_the_file_and_field(body: bytes, source: str, words: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=re.escape(words)) as err:
        parse_conf(body, source)
    assert source in str(err.value)


def test_status_follows_the_conf_dir_and_skips_bad_files(world) -> None:
    ready, reason, message = world.net.status()
    assert not ready and reason == "NetworkPluginNotReady" and str(world.conf_dir) in message
    (world.conf_dir / "00-broken.conflist").write_text("{")
    (world.conf_dir / "05-ignored.txt").write_text("{}")
    ready, _, message = world.net.status()
    assert not ready and "00-broken.conflist" in message and "not JSON" in message
    world.conf()
    assert world.net.status() == (True, "", "")
    assert world.net.network()[0].source.endswith("10-a.conflist")
    (world.conf_dir / "05-first.conf").write_text('{"cniVersion": "1.0.0", "name": "first", "type": "fakebr"}')
    assert world.net.network()[0].name == "first"
    (world.conf_dir / "05-first.conf").write_text('{"cniVersion": "1.0.0", "name": "edited", "type": "fakebr"}')
    os.utime(world.conf_dir / "05-first.conf", ns=(1, 1))  # an in-place edit is seen even with an old mtime
    assert world.net.network()[0].name == "edited"
    for p in world.conf_dir.iterdir():
        p.unlink()
    assert not world.net.status()[0]
    world.conf_dir.rmdir()
    assert "does not exist" in world.net.status()[2]


def test_setup_sets_lo_up_runs_the_chain_and_caches_what_it_ran(world) -> None:
    world.conf()
    ips = world.net.setup("sb1", "/run/netns/x", name="web", namespace="ns1", uid="u1", port_mappings=ports(),
                          cgroup_parent="/kubepods/pod1")
    assert ips == ["10.9.0.5", "fd00::5"]
    assert world.kernel.named("loopback_up") == [("loopback_up", "/run/netns/x")], "lo without a plugin exec"
    br, pm = world.calls()
    assert br["env"] == {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "sb1", "CNI_NETNS": "/run/netns/x",
                         "CNI_IFNAME": "eth0", "CNI_PATH": world.net.bin_dirs[0] + ":" + world.net.bin_dirs[1],
                         "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web;"
                                     "K8S_POD_INFRA_CONTAINER_ID=sb1;K8S_POD_UID=u1"}
    assert (br["conf"]["name"], br["conf"]["cniVersion"]) == ("fakenet", "1.0.0")
    assert "runtimeConfig" not in br["conf"] and "prevResult" not in br["conf"]
    assert pm["conf"]["runtimeConfig"] == {"portMappings": [
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}]}
    assert pm["conf"]["prevResult"]["ips"][1]["address"] == "10.9.0.5/24"
    cached = json.loads((world.cache / "results" / "fakenet-sb1-eth0").read_text())
    assert cached["kind"] == "cniCacheV1" and cached["containerId"] == "sb1" and cached["ifName"] == "eth0"
    assert json.loads(base64.b64decode(cached["config"]))["name"] == "fakenet"
    assert cached["capabilityArgs"]["cgroupPath"] == "/kubepods/pod1"
    assert ["K8S_POD_NAME", "web"] in cached["cniArgs"]
    assert sorted(os.listdir(world.cache / "results")) == ["fakenet-sb1-eth0"]
    assert oct((world.cache / "results" / "fakenet-sb1-eth0").stat().st_mode & 0o777) == "0o600"


def test_teardown_uses_the_cached_config_in_reverse_even_after_the_conf_dir_changed(world) -> None:
    world.conf()
    world.net.setup("sb1", "/proc/self/ns/net", name="web", namespace="ns1", uid="u1", port_mappings=ports())
    world.calls()
    (world.conf_dir / "10-a.conflist").unlink()
    (world.conf_dir / "20-other.conf").write_text('{"cniVersion": "1.0.0", "name": "other", "type": "fakebr"}')
    world.net.teardown("sb1", "/proc/self/ns/net")
    pm, br = world.calls()
    assert [c["type"] for c in (pm, br)] == ["fakepm", "fakebr"]
    assert all(c["env"]["CNI_COMMAND"] == "DEL" for c in (pm, br))
    assert pm["conf"]["name"] == "fakenet" and pm["conf"]["runtimeConfig"]["portMappings"][0]["hostPort"] == 5353
    assert pm["conf"]["prevResult"]["ips"][1]["address"] == "10.9.0.5/24"
    assert br["env"]["CNI_NETNS"] == "/proc/self/ns/net" and "K8S_POD_NAME=web" in br["env"]["CNI_ARGS"]
    assert not list((world.cache / "results").iterdir())
    world.net.teardown("sb1", "/proc/self/ns/net")  # again: the current network, no prevResult
    assert [(c["type"], c["conf"]["name"], "prevResult" in c["conf"]) for c in world.calls()] == \
        [("fakebr", "other", False)]


def test_teardown_dels_a_loopback_attachment_an_earlier_version_cached(world) -> None:
    """Sandboxes made before lo was set up without a plugin have a cni-loopback cache entry: still undone."""
    world.conf()
    conf = {"cniVersion": "0.3.1", "name": "cni-loopback", "plugins": [{"type": "pyloopback"}]}
    record = {"kind": "cniCacheV1", "containerId": "sb1", "ifName": "lo", "networkName": "cni-loopback",
              "config": base64.b64encode(json.dumps(conf).encode()).decode(), "cniArgs": [],
              "result": {"cniVersion": "0.3.1"}}
    (world.cache / "results").mkdir(parents=True)
    (world.cache / "results" / "cni-loopback-sb1-lo").write_text(json.dumps(record))
    world.net.teardown("sb1", "/proc/self/ns/net")
    assert [(c["type"], c["env"]["CNI_IFNAME"], c["env"]["CNI_COMMAND"]) for c in world.calls()] == [
        ("fakepm", "eth0", "DEL"), ("fakebr", "eth0", "DEL"), ("pyloopback", "lo", "DEL")]
    assert not list((world.cache / "results").iterdir())


def test_teardown_of_a_gone_netns_passes_an_empty_cni_netns_and_tolerates_forgotten_containers(world) -> None:
    world.conf(pm={"fail": {"DEL": {"cniVersion": "1.0.0", "code": 3, "msg": "no such container"}}})
    world.net.setup("sb1", "/proc/self/ns/net", name="p", namespace="n", uid="u")
    world.calls()
    world.net.teardown("sb1", "/run/netns/pyt-gone-for-good")
    calls = world.calls()
    assert [c["env"]["CNI_NETNS"] for c in calls] == ["", ""]
    assert not list((world.cache / "results").iterdir())


def test_a_failing_del_still_runs_the_others_keeps_the_cache_and_reports_the_cni_error(world) -> None:
    world.conf(pm={"fail": {"DEL": {"cniVersion": "1.0.0", "code": 11, "msg": "busy", "details": "iptables lock"}}})
    world.net.setup("sb1", "/proc/self/ns/net", name="p", namespace="n", uid="u")
    world.calls()
    with pytest.raises(errors.UnavailableError) as err:
        world.net.teardown("sb1", None)
    assert "'fakepm' DEL" in str(err.value) and "code 11: busy: iptables lock" in str(err.value)
    assert isinstance(err.value, PluginError)
    assert (err.value.code, err.value.msg, err.value.details) == (11, "busy", "iptables lock")
    assert [c["type"] for c in world.calls()] == ["fakepm", "fakebr"], "IPAM ran all the same"
    assert (world.cache / "results" / "fakenet-sb1-eth0").exists(), "kept for the retry"


@pytest.mark.parametrize("code,kind", [(7, errors.FailedPreconditionError), (4, errors.InvalidArgumentError),
                                       (999, errors.InternalError), (50, errors.UnavailableError)])
def test_a_failed_add_is_rolled_back_and_raised_with_its_code(world, code: int, kind: type) -> None:
    world.conf(pm={"fail": {"ADD": {"cniVersion": "1.0.0", "code": code, "msg": "nope", "details": "why"}}})
    with pytest.raises(kind, match=f"'fakepm' ADD for sandbox sb1: code {code}: nope: why"):
        world.net.setup("sb1", "/proc/self/ns/net", name="p", namespace="n", uid="u")
    assert [(c["type"], c["env"]["CNI_COMMAND"]) for c in world.calls()] == [
        ("fakebr", "ADD"), ("fakepm", "ADD"), ("fakepm", "DEL"), ("fakebr", "DEL")]
    assert not list(world.cache.rglob("*sb1*")), "nothing cached"


def test_setup_without_a_network_or_a_plugin_fails_naming_them(world) -> None:
    with pytest.raises(errors.FailedPreconditionError, match=str(world.conf_dir)):
        world.net.setup("sb1", "/proc/self/ns/net", name="p", namespace="n", uid="u")
    (world.conf_dir / "10.conf").write_text('{"cniVersion": "1.0.0", "name": "n", "type": "missing-plugin"}')
    with pytest.raises(errors.FailedPreconditionError, match=r"no executable 'missing-plugin' in .*nothing"):
        world.net.setup("sb1", "/proc/self/ns/net", name="p", namespace="n", uid="u")


def test_a_hung_plugin_is_killed_at_the_timeout(world) -> None:
    world.conf(br={"sleep": 30})
    world.net.timeout = 0.5
    with pytest.raises(errors.UnavailableError, match=r"timed out after 0\.5s"):
        world.net.setup("sb1", "/proc/self/ns/net", name="p", namespace="n", uid="u")


def test_check_runs_the_chain_with_the_cached_result(world) -> None:
    world.conf()
    with pytest.raises(errors.NotFoundError):
        world.net.check("sb1", "/proc/self/ns/net")
    world.net.setup("sb1", "/proc/self/ns/net", name="p", namespace="n", uid="u", port_mappings=ports())
    world.calls()
    world.net.check("sb1", "/proc/self/ns/net")
    br, pm = world.calls()
    assert (br["env"]["CNI_COMMAND"], pm["env"]["CNI_COMMAND"]) == ("CHECK", "CHECK")
    assert br["conf"]["prevResult"]["ips"][0]["address"] == "fd00::5/64"
    assert pm["conf"]["runtimeConfig"]["portMappings"][0]["hostPort"] == 5353


def test_pod_ips_are_the_sandbox_interfaces_ipv4_first() -> None:
    result = {"interfaces": [{"name": "cni0"}, {"name": "eth0", "sandbox": "/n"}],
              "ips": [{"address": "fd00::2/64", "interface": 1}, {"address": "10.0.0.1/24", "interface": 0},
                      {"address": "10.0.0.2/24", "interface": 1}]}
    assert pod_ips(result) == ["10.0.0.2", "fd00::2"]
    assert pod_ips({"ips": [{"address": "10.1.0.2/16"}]}) == ["10.1.0.2"]


def test_the_daemon_passes_its_pycni_settings_to_the_plugins_and_nothing_else():
    """`make cluster` may start pyruntime-cri with PYCNI_HELPER=off: its plugins see it, not HOME or PATH."""
    from pyruntime.settings import cni_plugin_env
    environ = {"PYCNI_HELPER": "off", "PYCNI_HELPER_LOG": "/x.log", "HOME": "/root", "PATH": "/mine"}
    assert cni_plugin_env(environ) == {"PYCNI_HELPER": "off", "PYCNI_HELPER_LOG": "/x.log"}
