"""The loopback plugin: brings `lo` up in the container netns (and down on DEL), passing a prevResult through."""
from __future__ import annotations

import ipaddress
import os

from pyroute2 import IPRoute

from cni_plugins import addr, link, ns
from cni_plugins.result import Interface, IPConfig, Result
from cni_plugins.skel import ERR_INTERNAL, CmdArgs, CNIError


def _up() -> list[tuple[str, int]]:
    with IPRoute() as ipr:
        lo = link.find(ipr, "lo")
        if lo is None:
            raise CNIError(ERR_INTERNAL, "no lo interface in the container netns")
        ipr.link("set", index=lo["index"], state="up")
        return addr.addresses(ipr, lo["index"])


def _down() -> None:
    with IPRoute() as ipr:
        lo = link.find(ipr, "lo")
        if lo is not None:
            ipr.link("set", index=lo["index"], state="down")


def add(args: CmdArgs) -> Result:
    nsfd = ns.open_netns(args.netns)
    try:
        addrs = ns.run_in(nsfd, _up)
    finally:
        os.close(nsfd)
    prev = args.prev_result()
    if prev is not None:
        return prev
    result = Result(interfaces=[Interface(args.ifname, "00:00:00:00:00:00", sandbox=args.netns)])
    for address, prefixlen in addrs:
        result.ips.append(IPConfig(ipaddress.ip_interface(f"{address}/{prefixlen}"), interface=0))
    return result


def delete(args: CmdArgs) -> None:
    if not args.netns:
        return
    try:
        nsfd = ns.open_netns(args.netns)
    except ns.NetNSGone:
        return
    try:
        ns.run_in(nsfd, _down)
    finally:
        os.close(nsfd)


def check(args: CmdArgs) -> None:
    nsfd = ns.open_netns(args.netns)
    try:
        up = ns.run_in(nsfd, _is_up)
    finally:
        os.close(nsfd)
    if not up:
        raise CNIError(ERR_INTERNAL, "lo is down")


def _is_up() -> bool:
    with IPRoute() as ipr:
        lo = link.find(ipr, "lo")
        return lo is not None and bool(lo["flags"] & 1)


def status(args: CmdArgs) -> None:
    return None


def gc(args: CmdArgs) -> None:
    return None
