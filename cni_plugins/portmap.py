"""The portmap plugin (hostPort): DNAT from host ports to the pod, rule for rule as the reference v1.10.0's
iptables backend, so either plugin finds, checks and removes what the other made.

A chained plugin: it takes the pod's addresses from prevResult (those on CNI_IFNAME inside the sandbox)
and the mappings from runtimeConfig.portMappings. In the nat table, shared by every pod:
PREROUTING and OUTPUT send local-destination traffic to CNI-HOSTPORT-DNAT; POSTROUTING starts with a jump
to CNI-HOSTPORT-MASQ, which masquerades what CNI-HOSTPORT-SETMARK marked (the mark bit, 13 by default).
Per attachment, one chain CNI-DN-<hash of network + container id>, reached from CNI-HOSTPORT-DNAT by
multiport rules, marks hairpin traffic (the pod reaching itself through the host port) and IPv4 traffic
from 127.0.0.1 for masquerade, then DNATs. DEL needs only the network name and the container id to
remove exactly that pod's chain and the jumps to it; the shared chains stay, as the reference leaves them.

Threat model: the mappings come from the runtime (the kubelet's pod spec), and the host port is not
reserved, as with the reference: a host service on that port has its traffic taken by the pod.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import shlex
from dataclasses import dataclass, field
from typing import Any

from cni_plugins import iptables, ns
from cni_plugins.result import IPInterface, Result
from cni_plugins.skel import ERR_INTERNAL, ERR_UNSUPPORTED_FIELD, CmdArgs, CNIError

log = logging.getLogger(__name__)

DNAT_CHAIN = "CNI-HOSTPORT-DNAT"
SETMARK_CHAIN = "CNI-HOSTPORT-SETMARK"
MASQ_CHAIN = "CNI-HOSTPORT-MASQ"
OLD_SNAT_CHAIN = "CNI-HOSTPORT-SNAT"
DEFAULT_MARK_BIT = 13
MULTIPORT_MAX = 15
COMMENT_MAX = 255
IPPROTO_UDP = 17


def _fail(msg: str) -> CNIError:
    """The reference returns plain errors, which its skel reports as code 999 with the text as msg."""
    return CNIError(ERR_INTERNAL, msg)


@dataclass
class PortMapping:
    host_port: int
    container_port: int
    protocol: str
    host_ip: str = ""


@dataclass
class Chain:
    """A nat chain with the rules it holds and the rules (in other chains) that jump to it."""
    name: str
    entry_chains: list[str] = field(default_factory=list)
    entry_rules: list[list[str]] = field(default_factory=list)
    rules: list[list[str]] = field(default_factory=list)
    prepend_entry: bool = False

    def setup(self, version: int) -> None:
        iptables.ensure_chain(version, self.name)
        for rule in self.rules:
            iptables.insert_unique(version, self.name, rule)
        for entry_chain in self.entry_chains:
            for rule in self.entry_rules:
                iptables.insert_unique(version, entry_chain, [*rule, "-j", self.name], prepend=self.prepend_entry)

    def teardown(self, version: int) -> None:
        """Removes the jumps to the chain (the known ones, then any found by listing) and the chain."""
        if not iptables.chain_exists(version, self.name):
            return
        for entry_chain in self.entry_chains:
            for rule in self.entry_rules:
                iptables.run(version, "-D", entry_chain, *rule, "-j", self.name, check=False)
        if iptables.delete_chain(version, self.name):
            return
        for entry_chain in self.entry_chains:
            listing = iptables.run(version, "-S", entry_chain, check=False).stdout.splitlines()
            for line in listing[1:]:
                if line.endswith("-j " + self.name):
                    iptables.run(version, "-D", entry_chain, *shlex.split(line)[2:], check=False)
        if not iptables.delete_chain(version, self.name):
            raise _fail(f"failed to delete chain {self.name}: it is still referenced")

    def check(self, version: int) -> None:
        if not iptables.chain_exists(version, self.name):
            raise _fail(f"chain {self.name} not found in iptables table nat")
        for rule in reversed(self.rules):
            if not iptables.rule_exists(version, self.name, rule):
                raise _fail(f"rule {shlex.join(rule)} in chain {self.name} not found in table nat")
        for entry_chain in self.entry_chains:
            for rule in reversed(self.entry_rules):
                if not iptables.rule_exists(version, entry_chain, [*rule, "-j", self.name]):
                    raise _fail(f"rule {shlex.join(rule)} in chain {entry_chain} not found in table nat")


@dataclass
class Conf:
    name: str
    container_id: str
    mappings: list[PortMapping]
    snat: bool
    mark_bit: int
    masq_all: bool
    external_set_mark_chain: str | None
    conditions: dict[int, list[str]]
    addresses: dict[int, IPInterface]  # family -> the pod's address on CNI_IFNAME
    prev: Result | None


def _mark(bit: int) -> str:
    value = 1 << bit
    return f"{value:#x}/{value:#x}"


def _backend_of(conditions: Any) -> str:
    """iptables conditions start with '-' or '!'; anything else is nftables syntax."""
    if not conditions or not conditions[0]:
        return ""
    return "iptables" if conditions[0][0] in "-!" else "nftables"


def _string_list(config: dict[str, Any], key: str) -> list[str] | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(f"failed to parse config: {key} must be a list of strings")
    return value


def _mappings(config: dict[str, Any]) -> list[PortMapping]:
    runtime = config.get("runtimeConfig") or {}
    raw = runtime.get("portMappings") if isinstance(runtime, dict) else None
    if not raw:
        return []
    if not isinstance(raw, list):
        raise _fail("failed to parse config: runtimeConfig.portMappings must be a list")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise _fail(f"failed to parse config: runtimeConfig.portMappings[{i}] must be an object")
        try:
            out.append(PortMapping(int(entry.get("hostPort") or 0), int(entry.get("containerPort") or 0),
                                   str(entry.get("protocol") or ""), str(entry.get("hostIP") or "")))
        except (TypeError, ValueError) as exc:
            raise _fail(f"failed to parse config: runtimeConfig.portMappings[{i}]: {exc}") from exc
    return out


def parse(args: CmdArgs) -> Conf:
    config = args.config
    mark_bit = config.get("markMasqBit")
    external = config.get("externalSetMarkChain")
    if mark_bit is not None and external is not None:
        raise _fail("failed to parse config: Cannot specify externalSetMarkChain and markMasqBit")
    mark_bit = DEFAULT_MARK_BIT if mark_bit is None else mark_bit
    if not isinstance(mark_bit, int) or not 0 <= mark_bit <= 31:
        raise _fail("failed to parse config: MasqMarkBit must be between 0 and 31")
    conditions = {4: _string_list(config, "conditionsV4"), 6: _string_list(config, "conditionsV6")}
    backend = config.get("backend")
    wrong = {"externalSetMarkChain": "iptables" if external is not None else "",
             "conditionsV4": _backend_of(conditions[4]), "conditionsV6": _backend_of(conditions[6])}
    if backend == "nftables":
        raise CNIError(ERR_UNSUPPORTED_FIELD, "unsupported field backend: \"nftables\"", "only iptables is implemented")
    if backend not in (None, "iptables"):
        raise _fail(f"failed to parse config: unrecognized backend {json.dumps(str(backend))}")
    if nft := [key for key, kind in wrong.items() if kind == "nftables"]:
        raise _fail(f"failed to parse config: iptables backend was requested but configuration contains "
                    f"nftables-specific options [{' '.join(nft)}]")
    mappings = _mappings(config)
    for m in mappings:
        if m.container_port <= 0:
            raise _fail(f"failed to parse config: Invalid container port number: {m.container_port}")
        if m.host_port <= 0:
            raise _fail(f"failed to parse config: Invalid host port number: {m.host_port}")
    prev = args.prev_result()
    addresses: dict[int, IPInterface] = {}
    if prev is not None:
        for ip in prev.ips:
            if ip.family in addresses:
                continue
            if ip.interface is not None and 0 <= ip.interface < len(prev.interfaces):
                iface = prev.interfaces[ip.interface]
                if iface.name != args.ifname or not iface.sandbox:
                    continue
            addresses[ip.family] = ip.address
    snat = config.get("snat")
    return Conf(name=args.network_name, container_id=args.container_id, mappings=mappings,
                snat=True if snat is None else bool(snat), mark_bit=mark_bit,
                masq_all=bool(config.get("masqAll")), external_set_mark_chain=external,
                conditions={k: v or [] for k, v in conditions.items()}, addresses=addresses, prev=prev)


def dnat_chain(conf: Conf) -> Chain:
    return Chain(iptables.chain_name(conf.name, conf.container_id, "DN-"), entry_chains=[DNAT_CHAIN])


def _fill_dnat(chain: Chain, conf: Conf, address: IPInterface) -> None:
    v6 = address.version == 6
    comment = f'dnat name: "{conf.name}" id: "{conf.container_id}"'
    if len(comment) > COMMENT_MAX:
        comment = comment[:COMMENT_MAX - 2] + "..."
    set_mark = conf.external_set_mark_chain or SETMARK_CHAIN
    by_proto: dict[str, list[int]] = {}
    for m in conf.mappings:
        by_proto.setdefault(m.protocol, []).append(m.host_port)
    for proto in sorted(by_proto):
        ports = by_proto[proto]
        for i in range(0, len(ports), MULTIPORT_MAX):
            spec = ",".join(str(p) for p in ports[i:i + MULTIPORT_MAX])
            chain.entry_rules.append(["-m", "comment", "--comment", comment, "-m", "multiport", "-p", proto,
                                      "--destination-ports", spec, *conf.conditions[address.version]])
    for m in conf.mappings:
        with_dst = False
        if m.host_ip:
            host_ip = ipaddress.ip_address(m.host_ip)
            if (host_ip.version == 6) != v6:
                continue
            with_dst = not host_ip.is_unspecified
        base = ["-p", m.protocol, "--dport", str(m.host_port), *(["-d", m.host_ip] if with_dst else [])]
        if conf.snat:
            masq_cidr = ("::/0" if v6 else "0.0.0.0/0") if conf.masq_all else str(address)
            chain.rules.append([*base, "-s", masq_cidr, "-j", set_mark])
            if not v6 and not conf.masq_all:
                chain.rules.append([*base, "-s", "127.0.0.1", "-j", set_mark])
        target = f"[{address.ip}]:{m.container_port}" if v6 else f"{address.ip}:{m.container_port}"
        chain.rules.append([*base, "-j", "DNAT", "--to-destination", target])


def _forward(conf: Conf, address: IPInterface) -> None:
    version = address.version
    if conf.snat and conf.external_set_mark_chain is None:
        mark = _mark(conf.mark_bit)
        Chain(SETMARK_CHAIN, rules=[["-m", "comment", "--comment", "CNI portfwd masquerade mark",
                                     "-j", "MARK", "--set-xmark", mark]]).setup(version)
        Chain(MASQ_CHAIN, entry_chains=["POSTROUTING"], prepend_entry=True,
              entry_rules=[["-m", "comment", "--comment", "CNI portfwd requiring masquerade"]],
              rules=[["-m", "mark", "--mark", mark, "-j", "MASQUERADE"]]).setup(version)
    Chain(DNAT_CHAIN, entry_chains=["PREROUTING", "OUTPUT"],
          entry_rules=[["-m", "addrtype", "--dst-type", "LOCAL"]]).setup(version)
    chain = dnat_chain(conf)
    _fill_dnat(chain, conf, address)
    chain.setup(version)


def _flush_udp_conntrack(mappings: list[PortMapping], version: int) -> None:
    """Drops conntrack entries to the mapped UDP host ports, which would keep sending datagrams to where the
    port led before; best effort, as the reference's."""
    ports = {m.host_port for m in mappings if m.protocol.lower() == "udp"}
    if not ports:
        return
    import socket

    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple
    family = socket.AF_INET if version == 4 else socket.AF_INET6
    try:
        with Conntrack() as ct:
            for port in sorted(ports):
                for entry in list(ct.dump_entries(tuple_orig=NFCTAttrTuple(family=family, proto=IPPROTO_UDP,
                                                                           dport=port))):
                    ct.delete(entry)
    except Exception as exc:  # informative only: the rules are in place
        log.warning("failed to delete stale UDP conntrack entries for ports %s: %s", sorted(ports), exc)


def _routable_host_interface(address: IPInterface) -> str:
    from pyroute2 import IPRoute
    try:
        with IPRoute() as ipr:
            for route in ipr.route("get", dst=str(address.ip)):
                oif = route.get_attr("RTA_OIF")
                if oif:
                    return ipr.link("get", index=oif)[0].get_attr("IFLA_IFNAME")
    except Exception:  # no route to the pod: nothing to enable, as the reference
        return ""
    return ""


def add(args: CmdArgs) -> Result:
    conf = parse(args)
    if conf.prev is None:
        raise _fail("must be called as chained plugin")
    if not conf.mappings:
        return conf.prev
    if 4 in conf.addresses:
        _forward(conf, conf.addresses[4])
        _flush_udp_conntrack(conf.mappings, 4)
        if conf.snat:
            host_if = _routable_host_interface(conf.addresses[4])
            if host_if and not ns.sysctl_set(f"net/ipv4/conf/{host_if}/route_localnet", "1"):
                raise _fail(f"unable to enable route_localnet: no such knob for {host_if}")
    if 6 in conf.addresses:
        _forward(conf, conf.addresses[6])
        _flush_udp_conntrack(conf.mappings, 6)
    return conf.prev


def delete(args: CmdArgs) -> None:
    conf = parse(args)
    if not conf.mappings:
        return
    versions = [v for v in (4, 6) if iptables.usable(v)]
    if not versions:
        raise _fail("neither iptables nor ip6tables is usable")
    for version in versions:
        dnat_chain(conf).teardown(version)
        # a chain of the plugin's old versions, removed in case they made it
        Chain(iptables.chain_name(conf.name, conf.container_id, "SN-"), entry_chains=[OLD_SNAT_CHAIN]).teardown(version)
    for version in (4, 6):
        _flush_udp_conntrack(conf.mappings, version)


def check(args: CmdArgs) -> None:
    conf = parse(args)
    if conf.prev is None:
        raise _fail("Required prevResult missing")
    if not conf.mappings:
        return
    for version, address in sorted(conf.addresses.items()):
        if not iptables.usable(version):
            raise _fail(f"neither iptables nor ip6tables is usable ({iptables.tool(version)})")
        chain = dnat_chain(conf)
        _fill_dnat(chain, conf, address)
        try:
            chain.check(version)
        except CNIError as exc:
            raise _fail(f"could not check ipv{version} dnat: {exc.msg}") from exc


def status(args: CmdArgs) -> None:
    """Nothing to report (the reference implements no STATUS)."""


def gc(args: CmdArgs) -> None:
    """Nothing to collect (the reference implements no GC)."""
