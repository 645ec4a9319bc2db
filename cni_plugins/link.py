"""Link-level netlink operations shared by the plugins (the reference's pkg/ip link helpers), via pyroute2."""
from __future__ import annotations

import errno
import os
import time
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni_plugins.skel import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError

IFF_UP = 0x1
IFF_PROMISC = 0x100
OPER_UP = "UP"
BRIDGE_VLAN_INFO_PVID = 0x2
BRIDGE_VLAN_INFO_UNTAGGED = 0x4


class LinkError(CNIError):
    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(ERR_INTERNAL, msg, details)


def find(ipr: IPRoute, name: str) -> Any | None:
    """The link message for `name`, or None (one RTM_GETLINK by name: get_links(ifname=) would dump every link)."""
    try:
        links = ipr.link("get", ifname=name)
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return links[0] if links else None


def kind(link: Any) -> str | None:
    info = link.get("IFLA_LINKINFO")
    return info.get("IFLA_INFO_KIND") if info else None


def ensure_bridge(ipr: IPRoute, name: str, mtu: int, promisc: bool, vlan_filtering: bool) -> Any:
    """The bridge `name`, created if missing (concurrent creators are fine), up, promiscuous if asked."""
    link = find(ipr, name)
    if link is None:
        spec: dict[str, Any] = {"ifname": name, "kind": "bridge"}
        if mtu:
            spec["mtu"] = mtu
        if vlan_filtering:
            spec["br_vlan_filtering"] = 1
        try:
            ipr.link("add", **spec)
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise LinkError(f"could not add {name!r}: {os.strerror(exc.code)}") from exc
        link = find(ipr, name)
        if link is None:
            raise LinkError(f"bridge {name!r} vanished right after creation")
    if kind(link) != "bridge":
        raise LinkError(f"{name!r} already exists but is not a bridge")
    index = link["index"]
    changed = False
    if vlan_filtering and not _vlan_filtering(link):
        ipr.link("set", index=index, kind="bridge", br_vlan_filtering=1)
        changed = True
    if promisc and not link["flags"] & IFF_PROMISC:
        ipr.link("set", index=index, flags=link["flags"] | IFF_PROMISC, change=IFF_PROMISC)
        changed = True
    if not link["flags"] & IFF_UP:
        ipr.link("set", index=index, state="up")
        changed = True
    return ipr.get_links(index)[0] if changed else link


def _vlan_filtering(link: Any) -> bool:
    info = link.get("IFLA_LINKINFO")
    data = info.get("IFLA_INFO_DATA") if info else None
    return bool(data and data.get("IFLA_BR_VLAN_FILTERING"))


def create_veth(ipr: IPRoute, ifname: str, nsfd: int, mtu: int, mac: str) -> Any:
    """Creates a veth with `ifname` in the netns `nsfd` and a fresh random host end; returns the host link.

    Both ends come into being in one netlink request, so nothing is ever half made. EEXIST while the
    random host name is free means `ifname` is taken in the container.
    """
    peer: dict[str, Any] = {"ifname": ifname, "net_ns_fd": nsfd}
    if mtu:
        peer["mtu"] = mtu
    if mac:
        peer["address"] = mac
    for _ in range(10):
        host = "veth" + os.urandom(4).hex()
        spec: dict[str, Any] = {"ifname": host, "kind": "veth", "peer": peer}
        if mtu:
            spec["mtu"] = mtu
        try:
            ipr.link("add", **spec)
        except NetlinkError as exc:
            if exc.code == errno.EEXIST and find(ipr, host) is None:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"container veth name {ifname!r} already exists") from exc
            if exc.code != errno.EEXIST:
                raise LinkError(f"failed to create veth for {ifname!r}: {os.strerror(exc.code)}") from exc
            continue
        created = find(ipr, host)
        if created is None:
            raise LinkError(f"host veth {host} vanished after creation")
        return created
    raise LinkError("failed to find a free host veth name")


def attach_port(ipr: IPRoute, index: int, bridge_index: int, hairpin: bool, isolated: bool) -> None:
    ipr.link("set", index=index, master=bridge_index, state="up")
    if hairpin or isolated:
        ipr.brport("set", index=index, mode=int(hairpin), isolated=int(isolated))


def set_port_vlans(ipr: IPRoute, index: int, vlan: int, trunk: list[int], preserve_default: bool) -> None:
    """Access port `vlan` (pvid, untagged) plus tagged trunk ids, as the reference configures the host end."""
    if not preserve_default:
        ipr.vlan_filter("del", index=index, vlan_info={"vid": 1})
    if vlan:
        ipr.vlan_filter("add", index=index,
                        vlan_info={"vid": vlan, "flags": BRIDGE_VLAN_INFO_PVID | BRIDGE_VLAN_INFO_UNTAGGED})
    for vid in trunk:
        ipr.vlan_filter("add", index=index, vlan_info={"vid": vid})


def wait_oper_up(ipr: IPRoute, index: int, timeout: float = 2.5) -> Any:
    """Waits for a bridge port to be oper up (the reference does too) and returns its final link message."""
    deadline = time.monotonic() + timeout
    while True:
        link = ipr.get_links(index)[0]
        if link.get("IFLA_OPERSTATE") == OPER_UP:
            return link
        if time.monotonic() > deadline:
            raise LinkError(f"bridge port {link.get('IFLA_IFNAME')} in state {link.get('IFLA_OPERSTATE')}, not up")
        time.sleep(0.001)


def delete(ipr: IPRoute, index: int) -> None:
    try:
        ipr.link("del", index=index)
    except NetlinkError as exc:
        if exc.code not in (errno.ENODEV, errno.ENOENT):
            raise
