"""The bridge plugin: a veth from the container's netns into a host bridge, addressed by an IPAM plugin.

ADD undoes everything it made when any step fails (veth, allocation, masquerade chain); DEL works from
names that are derived from the request alone (container ifname, chain name, IPAM attachment id), so a
DEL after an ADD killed at any point removes whatever that ADD got to make.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

from pyroute2 import IPRoute

from cni_plugins import addr, ipmasq, link, ns, spoofcheck
from cni_plugins.bridge_config import BridgeConf, load
from cni_plugins.ipam import delegate
from cni_plugins.result import Interface, IPConfig, Result, Route
from cni_plugins.skel import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, ERR_UNSUPPORTED_FIELD, CmdArgs, CNIError

CONTAINER_IFACE_INDEX = 2
FORWARDING = {4: "net/ipv4/ip_forward", 6: "net/ipv6/conf/all/forwarding"}


def _gateway_of(ip: IPConfig) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ip.address.network.network_address + 1


def _calc_gateways(result: Result, conf: BridgeConf) -> dict[int, list[IPConfig]]:
    """Fills in gateways and the default routes the reference's calcGateways adds; returns bridge gateways by family."""
    gws: dict[int, list[IPConfig]] = {4: [], 6: []}
    default_found: set[int] = set()
    for ip in result.ips:
        ip.interface = CONTAINER_IFACE_INDEX
        if ip.gateway is None and conf.is_gateway:
            ip.gateway = _gateway_of(ip)
        if conf.is_default_gateway and ip.family not in default_found:
            zero = ipaddress.ip_interface("0.0.0.0/0" if ip.family == 4 else "::/0")
            if not any(r.gw is not None and r.dst == zero for r in result.routes):
                result.routes.append(Route(dst=zero, gw=ip.gateway))
            default_found.add(ip.family)
        if conf.is_gateway:
            gws[ip.family].append(ip)
    return gws


def _container_setup(ifname: str, conf: BridgeConf, result: Result | None) -> str:
    """In the container netns: sysctls, addresses and routes (layer 3) or just up (layer 2); returns the MAC."""
    with IPRoute() as ipr:
        found = link.find(ipr, ifname)
        if found is None:
            raise CNIError(ERR_INTERNAL, f"container interface {ifname!r} disappeared during ADD")
        index = found["index"]
        if result is not None:
            if conf.enable_dad:
                ns.sysctl_set(f"net/ipv6/conf/{ifname}/enhanced_dad", "1")
                ns.sysctl_set(f"net/ipv6/conf/{ifname}/accept_dad", "1")
            else:
                ns.sysctl_set(f"net/ipv6/conf/{ifname}/accept_dad", "0")
            ns.sysctl_set(f"net/ipv4/conf/{ifname}/arp_notify", "1")
            addr.configure(ipr, index, ifname, result, CONTAINER_IFACE_INDEX)
            if any(ip.family == 6 for ip in result.ips):
                addr.wait_dad(ipr, index)
        elif not conf.disable_container_interface:
            ipr.link("set", index=index, state="up")
        return found.get("IFLA_ADDRESS")


def _check_supported(conf: BridgeConf) -> None:
    if conf.vlan and conf.is_gateway:
        raise CNIError(ERR_UNSUPPORTED_FIELD, f"unsupported field vlan: {conf.vlan} together with isGateway")


def add(args: CmdArgs) -> Result:
    conf = load(args)
    _check_supported(conf)
    nsfd = ns.open_netns(args.netns)
    try:
        with IPRoute() as ipr:
            return _add(ipr, conf, args, nsfd)
    finally:
        os.close(nsfd)


def _add(ipr: IPRoute, conf: BridgeConf, args: CmdArgs, nsfd: int) -> Result:
    br = link.ensure_bridge(ipr, conf.bridge, conf.mtu, conf.promisc, conf.vlan_filtering)
    ns.sysctl_set(f"net/ipv6/conf/{conf.bridge}/accept_ra", "0")
    host_index: int | None = None
    ipam_called = False
    try:
        host_link = link.create_veth(ipr, args.ifname, nsfd, conf.mtu, conf.mac)
        host_index = host_link["index"]
        link.attach_port(ipr, host_index, br["index"], conf.hairpin, conf.port_isolation)
        if conf.vlan_filtering:
            link.set_port_vlans(ipr, host_index, conf.vlan, conf.vlan_trunk, conf.preserve_default_vlan)
        result = Result()
        if conf.layer3:
            ipam_called = True
            result = delegate.add(conf.ipam_type, args)
            if not result.ips:
                raise CNIError(ERR_INTERNAL, "IPAM plugin returned missing IP config")
            gateways = _calc_gateways(result, conf)
            # the container's side in a netns thread while the host's is done here: a new masquerade chain
            # is an iptables commit, which waits out an RCU grace period in the kernel (bench.cni)
            configured = ns.start_in(nsfd, _container_setup, args.ifname, conf, result)
            try:
                _setup_gateways(ipr, br["index"], conf, gateways)
                if conf.ip_masq:
                    for ip in result.ips:
                        ipmasq.setup(ip.address, conf.name, args.container_id)
            except BaseException as exc:
                try:
                    configured()
                except Exception as other:
                    exc.add_note(f"the container's side failed too: {type(other).__name__}: {other}")
                raise
            mac = configured()
        else:
            mac = ns.run_in(nsfd, _container_setup, args.ifname, conf, None)
        if conf.macspoofchk:
            spoofcheck.setup(host_link.get("IFLA_IFNAME"), mac, args.container_id, args.ifname)
        if not conf.disable_container_interface:
            host_link = link.wait_oper_up(ipr, host_index)
        br = ipr.get_links(br["index"])[0]
        result.interfaces = [
            Interface(conf.bridge, br.get("IFLA_ADDRESS")),
            Interface(host_link.get("IFLA_IFNAME"), host_link.get("IFLA_ADDRESS")),
            Interface(args.ifname, mac, sandbox=args.netns),
        ]
        if not conf.dns.is_empty():
            result.dns = conf.dns
        return result
    except BaseException as exc:
        for failure in _undo(ipr, conf, args, host_index, ipam_called):
            exc.add_note(failure)
        raise


def _setup_gateways(ipr: IPRoute, br_index: int, conf: BridgeConf, gateways: dict[int, list[IPConfig]]) -> None:
    for family, ips in gateways.items():
        for ip in ips:
            if addr.ensure_gateway(ipr, br_index, conf.bridge, ip, conf.force_address):
                # pin the bridge MAC so it stops following the lowest port MAC as ports come and go
                mac = ipr.get_links(br_index)[0].get("IFLA_ADDRESS")
                ipr.link("set", index=br_index, address=mac)
        if ips and not ns.sysctl_set(FORWARDING[family], "1"):
            raise CNIError(ERR_INTERNAL, f"failed to enable forwarding: /proc/sys/{FORWARDING[family]} missing")


def _undo(ipr: IPRoute, conf: BridgeConf, args: CmdArgs, host_index: int | None, ipam_called: bool) -> list[str]:
    """Rolls back a failed ADD as far as it can; its own failures are returned, not raised, so they are
    reported next to the original error instead of hiding it."""
    steps: list[tuple[str, Any]] = []
    if host_index is not None:
        steps.append(("the host veth", lambda: link.delete(ipr, host_index)))
    if conf.layer3 and conf.ip_masq:
        steps.append(("the masquerade rules", lambda: ipmasq.teardown(conf.name, args.container_id)))
    if conf.macspoofchk:
        steps.append(("the MAC spoof check", lambda: spoofcheck.teardown(args.container_id, args.ifname)))
    if ipam_called:
        steps.append(("the IPAM allocation", lambda: delegate.delete(conf.ipam_type, args)))
    failures = []
    for what, step in steps:
        try:
            step()
        except Exception as exc:  # every step runs; each failure is reported
            failures.append(f"undoing {what} failed: {type(exc).__name__}: {exc}")
    return failures


def _container_delete(ifname: str) -> None:
    with IPRoute() as ipr:
        found = link.find(ipr, ifname)
        if found is not None:
            link.delete(ipr, found["index"])


def delete(args: CmdArgs) -> None:
    """The container's interface goes in a thread in its netns while the masquerade rules go here: the
    veth's unregistering and iptables' commit each wait out an RCU grace period, one after the other
    otherwise. The addresses are released whatever happened to the rules."""
    conf = load(args)
    nsfd = None
    if args.netns:
        try:
            nsfd = ns.open_netns(args.netns)
        except ns.NetNSGone:
            pass
    masq_error: Exception | None = None
    try:
        deleted = ns.start_in(nsfd, _container_delete, args.ifname) if nsfd is not None else None
        try:
            if conf.layer3 and conf.ip_masq:
                prev = args.prev_result()  # the families to clean up: without a result, both
                families = tuple(sorted({ip.family for ip in prev.ips})) if prev is not None and prev.ips else (4, 6)
                try:
                    ipmasq.teardown(conf.name, args.container_id, families,
                                    [ip.address for ip in prev.ips] if prev else ())
                except Exception as e:
                    masq_error = e
        finally:
            if deleted is not None:
                deleted()
    finally:
        if nsfd is not None:
            os.close(nsfd)
    if conf.layer3:
        delegate.delete(conf.ipam_type, args)
    if conf.macspoofchk:
        spoofcheck.teardown(args.container_id, args.ifname)
    if masq_error is not None:
        raise masq_error


def _container_state(ifname: str) -> dict[str, Any] | None:
    with IPRoute() as ipr:
        found = link.find(ipr, ifname)
        if found is None:
            return None
        index = found["index"]
        routes = []
        for r in ipr.get_routes(oif=index, family=socket.AF_INET) + ipr.get_routes(oif=index, family=socket.AF_INET6):
            routes.append(
                (
                    r.get("RTA_DST") or ("0.0.0.0" if r["family"] == socket.AF_INET else "::"),
                    r["dst_len"],
                    r.get("RTA_GATEWAY"),
                )
            )
        return {"mac": found.get("IFLA_ADDRESS"), "peer": found.get("IFLA_LINK"), "kind": link.kind(found),
                "addrs": addr.addresses(ipr, index), "routes": routes}


def check(args: CmdArgs) -> None:
    conf = load(args)
    prev = args.prev_result()
    if prev is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "Required prevResult missing")
    if conf.layer3:
        delegate.check(conf.ipam_type, args)
    nsfd = ns.open_netns(args.netns)
    try:
        state = ns.run_in(nsfd, _container_state, args.ifname)
    finally:
        os.close(nsfd)
    if state is None:
        raise CNIError(ERR_INTERNAL, f"container interface {args.ifname!r} not found in {args.netns}")
    if state["kind"] != "veth":
        raise CNIError(ERR_INTERNAL, f"container interface {args.ifname!r} is not a veth")
    expected = next((i for i in prev.interfaces if i.name == args.ifname and i.sandbox), None)
    if expected is None:
        raise CNIError(ERR_INTERNAL, f"prevResult lists no interface {args.ifname!r} in a sandbox")
    if expected.mac and expected.mac.lower() != (state["mac"] or "").lower():
        raise CNIError(ERR_INTERNAL, f"interface {args.ifname!r} has MAC {state['mac']}, expected {expected.mac}")
    for ip in prev.ips:
        if (str(ip.address.ip), ip.address.network.prefixlen) not in state["addrs"]:
            raise CNIError(ERR_INTERNAL, f"address {ip.address} missing on {args.ifname!r}")
    present = {
        (str(ipaddress.ip_network(f"{d}/{n}", strict=False)), str(gw) if gw else None) for d, n, gw in state["routes"]
    }
    for route in prev.routes:
        if not any(dst == str(route.network) for dst, _ in present):
            raise CNIError(ERR_INTERNAL, f"route to {route.dst} missing on {args.ifname!r}")
    with IPRoute() as ipr:
        br = link.find(ipr, conf.bridge)
        if br is None or link.kind(br) != "bridge":
            raise CNIError(ERR_INTERNAL, f"bridge {conf.bridge!r} not found")
        peer = ipr.get_links(state["peer"]) if state["peer"] else []
        if not peer or peer[0].get("IFLA_MASTER") != br["index"]:
            raise CNIError(ERR_INTERNAL, f"host end of {args.ifname!r} is not a port of {conf.bridge!r}")


def status(args: CmdArgs) -> None:
    conf = load(args)
    if conf.layer3:
        delegate.status(conf.ipam_type, args)


def gc(args: CmdArgs) -> None:
    conf = load(args)
    if conf.layer3:
        delegate.gc(conf.ipam_type, args)
