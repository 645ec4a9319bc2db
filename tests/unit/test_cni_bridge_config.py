"""pybridge's config validation, masquerade chain naming, and the lean launcher, without root."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from cni_plugins import bridge_config, ipmasq, iptables, launch, skel
from cni_plugins.install import install, install_conf


def load(**conf) -> bridge_config.BridgeConf:
    raw = {"cniVersion": "1.1.0", "name": "net1", "type": "pybridge", **conf}
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/x", "CNI_IFNAME": "eth0",
           "CNI_ARGS": conf.pop("cni_args", "") if "cni_args" in conf else ""}
    return bridge_config.load(skel._parse(env, json.dumps(raw).encode()))


def test_defaults_and_implications() -> None:
    conf = load(ipam={"type": "pyhost-local"})
    assert conf.bridge == "cni0" and conf.layer3 and not conf.is_gateway and conf.preserve_default_vlan
    assert load(isDefaultGateway=True).is_gateway
    assert not load(ipam={}).layer3
    assert load(vlanTrunk=[{"id": 5}, {"minID": 7, "maxID": 9}]).vlan_trunk == [5, 7, 8, 9]
    assert load(runtimeConfig={"mac": "0A:58:0A:00:00:02"}).mac == "0a:58:0a:00:00:02"


@pytest.mark.parametrize("conf,code,word", [
    ({"hairpinMode": True, "promiscMode": True}, 7, "hairpin"),
    ({"vlan": -1}, 7, "VLAN"),
    ({"vlan": True}, 7, "VLAN"),
    ({"vlanTrunk": [{"minID": 9, "maxID": 3}]}, 7, "vlanTrunk"),
    ({"vlanTrunk": [{"foo": 1}]}, 7, "vlanTrunk"),
    ({"mtu": -5}, 7, "mtu"),
    ({"isGateway": "true"}, 7, "isGateway"),
    ({"bridge": "x" * 16}, 7, "bridge name"),
    ({"disableContainerInterface": True, "ipam": {"type": "pyhost-local"}}, 7, "DisableContainerInterface"),
    ({"ipMasqBackend": "bogus"}, 7, "bogus"),
    ({"macspoofchk": "on"}, 7, "macspoofchk"),
    ({"ipMasqBackend": "nftables"}, 2, "nftables"),
    ({"runtimeConfig": {"mac": "zz"}}, 7, "MAC"),
    ({"ipam": "host-local"}, 7, "ipam"),
])
def test_invalid(conf: dict, code: int, word: str) -> None:
    with pytest.raises(skel.CNIError) as err:
        load(**conf)
    assert err.value.code == code and word in err.value.msg


def test_chain_name_matches_reference_format() -> None:
    # utils.FormatChainName: "CNI-" + hex(sha512(name + id)) cut to 28 characters
    chain = iptables.chain_name("mynet", "abc123")
    assert len(chain) == 28 and chain.startswith("CNI-")
    assert chain == "CNI-" + __import__("hashlib").sha512(b"mynetabc123").hexdigest()[:24]
    assert ipmasq.comment("mynet", "abc123") == 'name: "mynet" id: "abc123"'


def test_install_writes_lean_launchers(tmp_path: Path) -> None:
    paths = install(tmp_path / "bin")
    assert sorted(p.name for p in paths) == ["pybridge", "pyhost-local", "pyloopback", "pyportmap"]
    text = (tmp_path / "bin" / "pybridge").read_text()
    assert text.startswith("#!") and " -IS\n" in text.splitlines()[0] + "\n"
    assert os.access(tmp_path / "bin" / "pybridge", os.X_OK)
    out = subprocess.run([sys.executable, "-m", "cni_plugins", "install", "--dir", str(tmp_path / "other")],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    assert "pyloopback" in out.stdout


def test_install_conf_writes_the_default_network_only_into_an_empty_conf_dir(tmp_path: Path) -> None:
    written = install_conf(tmp_path / "net.d")
    assert written == tmp_path / "net.d" / "10-pynode.conflist"
    conf = json.loads(written.read_text())
    assert [p["type"] for p in conf["plugins"]] == ["pybridge", "pyportmap"]
    assert conf["plugins"][0]["ipam"]["type"] == "pyhost-local" and conf["plugins"][0]["isDefaultGateway"]
    assert conf["plugins"][1]["capabilities"] == {"portMappings": True}
    written.write_text("{}")
    assert install_conf(tmp_path / "net.d") is None and written.read_text() == "{}", "an existing config stays"


def test_launcher_imports_nothing_heavy(tmp_path: Path) -> None:
    install(tmp_path)
    code = (
        f"import sys; sys.path[:0] = [{str(Path(__file__).parents[2])!r}]; import cni_plugins.launch; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('socket', 'json', 'pyroute2', 'asyncio', 'enum')))"
    )
    out = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_launcher_without_helper_serves_in_process(tmp_path: Path) -> None:
    install(tmp_path / "bin")
    name = f"pyt-helper-{secrets.token_hex(4)}"  # a socket name nobody listens on
    for mode in ("off", "auto"):
        env = {"CNI_COMMAND": "VERSION", "PYCNI_HELPER": mode, "PYCNI_HELPER_SOCKET": name}
        proc = subprocess.run([str(tmp_path / "bin" / "pyhost-local")], input=b'{"cniVersion": "1.0.0"}',
                              capture_output=True, env=env, check=False)
        assert proc.returncode == 0 and json.loads(proc.stdout)["cniVersion"] == "1.0.0"
    assert launch.socket_path(name) not in Path("/proc/net/unix").read_text(), "VERSION must not start a helper"
