"""The CNI result, parsed from and printed to every spec version we speak.

Plugins build one `Result` and the skel prints it in the caller's cniVersion, so the result's version
differences live here only: 0.3.x/0.4.0 carry `version` on each IP, 1.1.0 adds interface MTU and route
attributes (the versions that brought them are versions.py's).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from cni_plugins.versions import MTU_SINCE, V1_RESULT_SINCE, version_tuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface

ROUTE_EXTRAS = ("mtu", "advmss", "priority", "table", "scope")


class ResultError(ValueError):
    """A result or prevResult that does not decode."""


@dataclass
class Interface:
    name: str
    mac: str = ""
    mtu: int = 0
    sandbox: str = ""


@dataclass
class IPConfig:
    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None

    @property
    def family(self) -> int:
        return self.address.version


@dataclass
class Route:
    dst: IPInterface
    gw: IPAddress | None = None
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int = 0
    scope: int | None = None

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return self.dst.network


@dataclass
class DNS:
    nameservers: list[str] = field(default_factory=list)
    domain: str = ""
    search: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.nameservers or self.domain or self.search or self.options)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nameservers:
            out["nameservers"] = list(self.nameservers)
        if self.domain:
            out["domain"] = self.domain
        if self.search:
            out["search"] = list(self.search)
        if self.options:
            out["options"] = list(self.options)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> DNS:
        if not raw:
            return cls()
        if not isinstance(raw, dict):
            raise ResultError("dns must be an object")
        return cls(list(raw.get("nameservers") or []), raw.get("domain") or "",
                   list(raw.get("search") or []), list(raw.get("options") or []))


@dataclass
class Result:
    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)

    def to_json(self, version: str) -> dict[str, Any]:
        """The result as `version` spells it: empty lists omitted, and an empty `dns` too from 1.0.0 on (as the
        reference)."""
        v1 = version_tuple(version) >= V1_RESULT_SINCE
        v11 = version_tuple(version) >= MTU_SINCE
        out: dict[str, Any] = {"cniVersion": version}
        if self.interfaces:
            out["interfaces"] = [_interface_json(i, v11) for i in self.interfaces]
        if self.ips:
            out["ips"] = [_ip_json(ip, v1) for ip in self.ips]
        if self.routes:
            out["routes"] = [_route_json(r, v11) for r in self.routes]
        if not v1 or not self.dns.is_empty():
            out["dns"] = self.dns.to_json()
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Result:
        if not isinstance(raw, dict):
            raise ResultError("result must be a JSON object")
        try:
            return cls(
                interfaces=[Interface(i["name"], i.get("mac", ""), int(i.get("mtu", 0)), i.get("sandbox", ""))
                            for i in raw.get("interfaces") or []],
                ips=[IPConfig(ipaddress.ip_interface(ip["address"]),
                              ipaddress.ip_address(ip["gateway"]) if ip.get("gateway") else None,
                              ip.get("interface"))
                     for ip in raw.get("ips") or []],
                routes=[parse_route(r) for r in raw.get("routes") or []],
                dns=DNS.from_json(raw.get("dns")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultError(f"cannot decode result: {exc}") from exc


def parse_route(raw: Any) -> Route:
    if not isinstance(raw, dict) or "dst" not in raw:
        raise ResultError(f"route {raw!r} has no dst")
    try:
        return Route(
            dst=ipaddress.ip_interface(raw["dst"]),
            gw=ipaddress.ip_address(raw["gw"]) if raw.get("gw") else None,
            mtu=int(raw.get("mtu", 0)), advmss=int(raw.get("advmss", 0)),
            priority=int(raw.get("priority", 0)), table=int(raw.get("table", 0)),
            scope=int(raw["scope"]) if raw.get("scope") is not None else None,
        )
    except (TypeError, ValueError) as exc:
        raise ResultError(f"route {raw!r}: {exc}") from exc


def _interface_json(iface: Interface, v11: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": iface.name}
    if iface.mac:
        out["mac"] = iface.mac
    if v11 and iface.mtu:
        out["mtu"] = iface.mtu
    if iface.sandbox:
        out["sandbox"] = iface.sandbox
    return out


def _ip_json(ip: IPConfig, v1: bool) -> dict[str, Any]:
    out: dict[str, Any] = {} if v1 else {"version": str(ip.family)}
    if ip.interface is not None:
        out["interface"] = ip.interface
    out["address"] = str(ip.address)
    if ip.gateway is not None:
        out["gateway"] = str(ip.gateway)
    return out


def _route_json(route: Route, v11: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"dst": str(route.dst)}
    if route.gw is not None:
        out["gw"] = str(route.gw)
    if v11:
        for key in ROUTE_EXTRAS:
            value = getattr(route, key)
            if value:
                out[key] = value
    return out
