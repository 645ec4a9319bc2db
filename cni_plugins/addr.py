"""Addresses and routes on an interface from a CNI result (the reference's ipam.ConfigureIface) and their checks."""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import time
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni_plugins.result import IPConfig, Result, Route
from cni_plugins.skel import ERR_INTERNAL, CNIError

IFA_F_TENTATIVE = 0x40
RTPROT_BOOT = 3
AF = {4: socket.AF_INET, 6: socket.AF_INET6}


def _err(msg: str, exc: NetlinkError) -> CNIError:
    return CNIError(ERR_INTERNAL, f"{msg}: {os.strerror(exc.code)}")


def default_gateways(result: Result, index_of_iface: int | None) -> dict[int, Any]:
    gws: dict[int, Any] = {}
    for ip in result.ips:
        if index_of_iface is not None and ip.interface not in (None, index_of_iface):
            continue
        if ip.gateway is not None and ip.family not in gws:
            gws[ip.family] = ip.gateway
    return gws


def configure(ipr: IPRoute, index: int, ifname: str, result: Result, iface_index: int | None) -> None:
    """Adds the result's addresses for this interface, brings it up, then adds the result's routes."""
    ips = [ip for ip in result.ips if iface_index is None or ip.interface in (None, iface_index)]
    for ip in ips:
        try:
            ipr.addr("add", index=index, address=str(ip.address.ip), prefixlen=ip.address.network.prefixlen)
        except NetlinkError as exc:
            raise _err(f"failed to add IP addr {ip.address} to {ifname!r}", exc) from exc
    ipr.link("set", index=index, state="up")
    gws = default_gateways(result, iface_index)
    for route in result.routes:
        gw = route.gw or gws.get(route.dst.version)
        add_route(ipr, index, ifname, route, gw)


def add_route(ipr: IPRoute, index: int, ifname: str, route: Route, gw: Any) -> None:
    spec: dict[str, Any] = {
        "dst": str(route.network),
        "oif": index,
        "family": AF[route.dst.version],
        "proto": RTPROT_BOOT,
    }
    if gw is not None:
        spec["gateway"] = str(gw)
    if route.priority:
        spec["priority"] = route.priority
    if route.table:
        spec["table"] = route.table
    if route.scope is not None:
        spec["scope"] = route.scope
    metrics = {}
    if route.mtu:
        metrics["mtu"] = route.mtu
    if route.advmss:
        metrics["advmss"] = route.advmss
    if metrics:
        spec["metrics"] = metrics
    try:
        ipr.route("add", **spec)
    except NetlinkError as exc:
        raise _err(f"failed to add route '{route.dst} via {gw} dev {ifname}'", exc) from exc


def wait_dad(ipr: IPRoute, index: int, timeout: float = 10.0) -> None:
    """Waits until no IPv6 address on the link is tentative, so the container can use them at once."""
    deadline = time.monotonic() + timeout
    while any(
        a.get("IFA_FLAGS", a["flags"]) & IFA_F_TENTATIVE for a in ipr.get_addr(index=index, family=socket.AF_INET6)
    ):
        if time.monotonic() > deadline:
            raise CNIError(ERR_INTERNAL, "timed out waiting for IPv6 duplicate address detection")
        time.sleep(0.05)


def addresses(ipr: IPRoute, index: int) -> list[tuple[str, int]]:
    return [(a.get("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=index)]


def ensure_gateway(ipr: IPRoute, index: int, brname: str, ip: IPConfig, force: bool) -> bool:
    """Puts gateway/prefix on the bridge, replacing a conflicting address only when forced (reference
    ensureAddr); True when it added the address."""
    assert ip.gateway is not None
    want = (str(ip.gateway), ip.address.network.prefixlen)
    net = ip.address.network
    for a in ipr.get_addr(index=index, family=AF[ip.family]):
        have = (a.get("IFA_ADDRESS"), a["prefixlen"])
        if have == want:
            return False
        other = ipaddress.ip_interface(f"{have[0]}/{have[1]}")
        if ip.family == 4 or other.ip in net or ip.gateway in other.network:
            if not force:
                raise CNIError(ERR_INTERNAL, f"{brname!r} already has an IP address different from {want[0]}/{want[1]}")
            ipr.addr("del", index=index, address=have[0], prefixlen=have[1])
    try:
        ipr.addr("add", index=index, address=want[0], prefixlen=want[1])
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise _err(f"could not add IP address to {brname!r}", exc) from exc
        return False
    return True
