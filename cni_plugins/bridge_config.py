"""The bridge plugin's network configuration as a typed, validated dataclass."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cni_plugins import ipmasq
from cni_plugins.result import DNS, ResultError
from cni_plugins.skel import ERR_INVALID_NETWORK_CONFIG, CmdArgs, CNIError

MAC_RE = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
BOOLS = {
    "isGateway": "is_gateway", "isDefaultGateway": "is_default_gateway", "forceAddress": "force_address",
    "ipMasq": "ip_masq", "hairpinMode": "hairpin", "promiscMode": "promisc", "enabledad": "enable_dad",
    "preserveDefaultVlan": "preserve_default_vlan", "disableContainerInterface": "disable_container_interface",
    "portIsolation": "port_isolation", "macspoofchk": "macspoofchk",
}


def _invalid(msg: str) -> CNIError:
    return CNIError(ERR_INVALID_NETWORK_CONFIG, msg)


@dataclass
class BridgeConf:
    name: str
    bridge: str = "cni0"
    is_gateway: bool = False
    is_default_gateway: bool = False
    force_address: bool = False
    ip_masq: bool = False
    ip_masq_backend: str | None = None
    mtu: int = 0
    hairpin: bool = False
    promisc: bool = False
    vlan: int = 0
    vlan_trunk: list[int] = field(default_factory=list)
    preserve_default_vlan: bool = True
    enable_dad: bool = False
    disable_container_interface: bool = False
    port_isolation: bool = False
    macspoofchk: bool = False
    ipam_type: str = ""
    mac: str = ""
    dns: DNS = field(default_factory=DNS)

    @property
    def layer3(self) -> bool:
        return bool(self.ipam_type)

    @property
    def vlan_filtering(self) -> bool:
        return bool(self.vlan or self.vlan_trunk)


def _vlan_id(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 4094:
        raise _invalid(f"invalid {what} {value!r} (must be between 0 and 4094)")
    return value


def _trunk(raw: Any) -> list[int]:
    if not isinstance(raw, list):
        raise _invalid("vlanTrunk must be a list")
    ids: set[int] = set()
    for item in raw:
        if not isinstance(item, dict):
            raise _invalid(f"invalid vlanTrunk entry {item!r}")
        if "id" in item:
            ids.add(_vlan_id(item["id"], "vlanTrunk id"))
        elif "minID" in item and "maxID" in item:
            lo, hi = _vlan_id(item["minID"], "vlanTrunk minID"), _vlan_id(item["maxID"], "vlanTrunk maxID")
            if lo > hi:
                raise _invalid(f"invalid vlanTrunk range {lo}-{hi}")
            ids.update(range(lo, hi + 1))
        else:
            raise _invalid(f"invalid vlanTrunk entry {item!r}: needs id or minID and maxID")
    return sorted(ids)


def _mac(args: CmdArgs) -> str:
    cni_args = (args.config.get("args") or {}).get("cni") or {}
    mac = args.runtime_config().get("mac") or cni_args.get("mac") or args.args.get("MAC") or ""
    if mac and not MAC_RE.match(mac):
        raise _invalid(f"invalid MAC address {mac!r}")
    return mac.lower()


def load(args: CmdArgs) -> BridgeConf:
    raw = args.config
    conf = BridgeConf(name=args.network_name)
    for key, attr in BOOLS.items():
        if key in raw and raw[key] is not None:
            if not isinstance(raw[key], bool):
                raise _invalid(f"{key} must be a boolean, not {raw[key]!r}")
            setattr(conf, attr, raw[key])
    bridge = raw.get("bridge") or "cni0"
    if not isinstance(bridge, str) or len(bridge) > 15 or "/" in bridge or " " in bridge:
        raise _invalid(f"invalid bridge name {bridge!r}")
    conf.bridge = bridge
    mtu = raw.get("mtu", 0) or 0
    if not isinstance(mtu, int) or isinstance(mtu, bool) or mtu < 0:
        raise _invalid(f"invalid mtu {mtu!r}")
    conf.mtu = mtu
    conf.vlan = _vlan_id(raw.get("vlan", 0) or 0, "VLAN ID")
    if "vlanTrunk" in raw and raw["vlanTrunk"] is not None:
        conf.vlan_trunk = _trunk(raw["vlanTrunk"])
    conf.ip_masq_backend = raw.get("ipMasqBackend")
    ipmasq.validate_backend(conf.ip_masq_backend)
    if conf.is_default_gateway:
        conf.is_gateway = True
    if conf.hairpin and conf.promisc:
        raise _invalid("cannot set hairpin mode and promiscuous mode at the same time")
    ipam = raw.get("ipam")
    if ipam is not None and not isinstance(ipam, dict):
        raise _invalid("ipam must be an object")
    conf.ipam_type = (ipam or {}).get("type", "") or ""
    if conf.disable_container_interface and conf.layer3:
        raise _invalid("cannot use IPAM when DisableContainerInterface flag is set")
    conf.mac = _mac(args)
    try:
        conf.dns = DNS.from_json(raw.get("dns"))
    except ResultError as exc:
        raise _invalid(str(exc)) from exc
    return conf
