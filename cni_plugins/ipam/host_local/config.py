"""The host-local IPAM configuration, validated at the edge into typed ranges.

Defaults follow the reference: the gateway is the subnet's first address, allocation starts there (the
iterator skips the gateway) and ends before the IPv4 broadcast or at the last IPv6 address.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_plugins.result import DNS, IPAddress, ResultError, Route, parse_route
from cni_plugins.skel import ERR_INVALID_NETWORK_CONFIG, CmdArgs, CNIError

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _invalid(msg: str, details: str = "") -> CNIError:
    return CNIError(ERR_INVALID_NETWORK_CONFIG, msg, details)


def _ip(raw: Any, what: str) -> IPAddress:
    try:
        return ipaddress.ip_address(raw)
    except (TypeError, ValueError):
        raise _invalid(f"invalid {what} {raw!r}") from None


@dataclass(frozen=True)
class Range:
    subnet: Network
    start: IPAddress
    end: IPAddress
    gateway: IPAddress

    def contains(self, ip: IPAddress) -> bool:
        return ip.version == self.subnet.version and self.start <= ip <= self.end  # type: ignore[operator]  # same family, by version

    def overlaps(self, other: Range) -> bool:
        return self.subnet.version == other.subnet.version and self.subnet.overlaps(other.subnet)

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"

    @classmethod
    def parse(cls, raw: Any) -> Range:
        if not isinstance(raw, dict) or "subnet" not in raw:
            raise _invalid("range has no subnet", repr(raw))
        try:
            iface = ipaddress.ip_interface(raw["subnet"])
        except (TypeError, ValueError):
            raise _invalid(f"invalid subnet {raw['subnet']!r}") from None
        subnet = iface.network
        if iface.ip != subnet.network_address:
            raise _invalid(f"Network has host bits set. For a subnet mask of length {subnet.prefixlen} "
                           f"the network address is {subnet.network_address}")
        if subnet.prefixlen > subnet.max_prefixlen - 2:
            raise _invalid(f"Network {subnet} too small to allocate from")
        last = subnet.broadcast_address - 1 if subnet.version == 4 else subnet.broadcast_address
        first = subnet.network_address + 1
        start = _ip(raw["rangeStart"], "rangeStart") if raw.get("rangeStart") else first
        end = _ip(raw["rangeEnd"], "rangeEnd") if raw.get("rangeEnd") else last
        gateway = _ip(raw["gateway"], "gateway") if raw.get("gateway") else first
        for name, ip in (("RangeStart", start), ("RangeEnd", end)):
            if ip.version != subnet.version or ip not in subnet:
                raise _invalid(f"{name} {ip} not in network {subnet}")
        if start > end:  # type: ignore[operator]  # one address family: both checked in subnet above
            raise _invalid(f"RangeStart {start} is after RangeEnd {end}")
        return cls(subnet, start, end, gateway)


@dataclass(frozen=True)
class RangeSet:
    ranges: tuple[Range, ...]

    def range_for(self, ip: IPAddress) -> Range | None:
        return next((r for r in self.ranges if r.contains(ip)), None)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.ranges)

    @classmethod
    def parse(cls, raw: Any) -> RangeSet:
        if not isinstance(raw, list) or not raw:
            raise _invalid("empty range set")
        ranges = tuple(Range.parse(r) for r in raw)
        if len({r.subnet.version for r in ranges}) > 1:
            raise _invalid("mixed address families in a range set", str(raw))
        for i, a in enumerate(ranges):
            for b in ranges[i + 1:]:
                if a.overlaps(b):
                    raise _invalid(f"subnets {a.subnet} and {b.subnet} overlap")
        return cls(ranges)


@dataclass
class HostLocalConfig:
    name: str
    range_sets: list[RangeSet]
    routes: list[Route] = field(default_factory=list)
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    dns: DNS = field(default_factory=DNS)
    requested_ips: list[IPAddress] = field(default_factory=list)

    @property
    def store_dir(self) -> Path:
        return self.data_dir / self.name


def parse_resolv_conf(path: str) -> DNS:
    dns = DNS()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise _invalid(f"cannot read resolvConf {path}: {exc.strerror}") from exc
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        key, values = fields[0], fields[1:]
        if key == "nameserver":
            dns.nameservers.append(values[0])
        elif key == "domain":
            dns.domain = values[0]
        elif key == "search":
            dns.search = values
        elif key == "options":
            dns.options.extend(values)
    return dns


def _requested_ips(args: CmdArgs) -> list[IPAddress]:
    raw: list[str] = []
    if args.args.get("IP"):
        raw.extend(args.args["IP"].split(","))
    cni_args = (args.config.get("args") or {}).get("cni") or {}
    raw.extend(cni_args.get("ips") or [])
    raw.extend(args.runtime_config().get("ips") or [])
    out = []
    for value in raw:
        try:
            out.append(ipaddress.ip_interface(value).ip)
        except ValueError:
            raise _invalid(f"invalid requested IP {value!r}") from None
    return out


def load(args: CmdArgs) -> HostLocalConfig:
    ipam = args.config.get("ipam")
    if not isinstance(ipam, dict):
        raise _invalid("IPAM config missing 'ipam' key")
    raw_sets = args.runtime_config().get("ipRanges") or ipam.get("ranges")
    if ipam.get("subnet"):
        legacy = {k: ipam[k] for k in ("subnet", "rangeStart", "rangeEnd", "gateway") if k in ipam}
        raw_sets = [[legacy]] + list(raw_sets or [])
    if not raw_sets:
        raise _invalid("no IP ranges specified")
    if not isinstance(raw_sets, list):
        raise _invalid("ranges must be a list of range sets")
    sets = [RangeSet.parse(s) for s in raw_sets]
    for i, a in enumerate(sets):
        for j in range(i + 1, len(sets)):
            if any(x.overlaps(y) for x in a.ranges for y in sets[j].ranges):
                raise _invalid(f"range set {i} overlaps with {j}")
    try:
        routes = [parse_route(r) for r in ipam.get("routes") or []]
    except ResultError as exc:
        raise _invalid(str(exc)) from exc
    return HostLocalConfig(
        name=args.network_name,
        range_sets=sets,
        routes=routes,
        data_dir=Path(ipam.get("dataDir") or DEFAULT_DATA_DIR),
        dns=parse_resolv_conf(ipam["resolvConf"]) if ipam.get("resolvConf") else DNS(),
        requested_ips=_requested_ips(args),
    )


def load_for_release(args: CmdArgs) -> tuple[str, Path]:
    """DEL and GC only need where the allocations live, so a config whose ranges no longer parse can still be
    released."""
    ipam = args.config.get("ipam")
    if not isinstance(ipam, dict):
        raise _invalid("IPAM config missing 'ipam' key")
    return args.network_name, Path(ipam.get("dataDir") or DEFAULT_DATA_DIR)
