"""A pod's DNS (the resolv.conf its runtime writes) as the kubelet's dns.Configurer forms it for each
dnsPolicy: ClusterFirst (and ClusterFirstWithHostNet, which a hostNetwork pod needs to keep it) gets the cluster
DNS, the search path NS.svc.DOMAIN svc.DOMAIN DOMAIN before the host's, and ndots:5; Default (and ClusterFirst
on the host's network, or without a cluster DNS) gets the host's resolv.conf; None gets nothing. The pod's
dnsConfig is merged over each; then the limits the API server enforces on dnsConfig alone are applied to the
whole, as the kubelet does, with a DNSConfigForming warning naming what was kept.

Pure: the host's resolv.conf comes in as its text, read by the caller from the kubelet's resolvConf when it
forms a sandbox's config (a host whose resolver changes gives new pods the new one); None stands for
resolvConf "", under which the kubelet points host-DNS pods at the node's loopback with no search path.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pykubelet.api.podmodel import Pod
from pykubelet.errors import FailedPreconditionError

MAX_RESOLV_CONF = 10 << 20  # the kubelet refuses a longer host file
MAX_NAMESERVERS = 3  # what the resolver reads (MAXNS)
MAX_SEARCH_PATHS = 32
MAX_SEARCH_LIST_CHARS = 2048
MAX_SEARCH_PATH_CHARS = 253  # a DNS-1123 subdomain: glibc 2.28's resolver aborts on a longer one
DEFAULT_OPTIONS = ("ndots:5",)
MISSING_CLUSTER_DNS = ('kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" '
                       'policy. Falling back to "Default" policy.')


class DNSError(FailedPreconditionError):
    """The host's resolv.conf cannot be read or parsed: the kubelet makes no sandbox then, whatever the policy."""


@dataclass(frozen=True)
class ResolvConf:
    nameservers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodDNS:
    """What the sandbox's DNSConfig says, and the Warning events the kubelet records as it forms it: (reason,
    message) about the pod, and about the node."""
    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    pod_events: tuple[tuple[str, str], ...] = ()
    node_events: tuple[tuple[str, str], ...] = ()


def read_resolv_conf(path: Path | None) -> str | None:
    """The text of the kubelet's resolvConf (None for resolvConf ""), for pod_dns."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RESOLV_CONF + 1)
    except OSError as e:
        raise DNSError(f"could not open resolv conf file {path}: {e.strerror}") from e
    if len(data) > MAX_RESOLV_CONF:
        raise DNSError(f"resolv conf file {path} is longer than {MAX_RESOLV_CONF} bytes")
    return data.decode(errors="replace")


def _option_name(option: str) -> str:
    return option.split(":", 1)[0]


def parse_resolv_conf(text: str) -> ResolvConf:
    """As the kubelet reads a resolv.conf: nameserver lines add up, the last search line wins (a trailing dot
    and a lone "." dropped), an option given again replaces the earlier one. A nameserver line without an
    address is an error."""
    nameservers: list[str] = []
    searches: list[str] = []
    options: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] == "nameserver":
            if len(fields) < 2:
                raise DNSError(f"resolv.conf line {number}: nameserver list is empty")
            nameservers.append(fields[1])
        elif fields[0] == "search":
            searches = [s.removesuffix(".") for s in fields[1:] if s != "."]
        elif fields[0] == "options":
            for option in fields[1:]:
                options[_option_name(option)] = option
    return ResolvConf(tuple(nameservers), tuple(searches), tuple(options.values()))


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def merge_options(existing: Sequence[str], pod_options: Sequence[tuple[str, str | None]]) -> list[str]:
    """The pod's dnsConfig options over the others, by name; an option without a value (or an empty one) is
    its name alone."""
    merged: dict[str, str] = {}
    for option in existing:
        name, _, value = option.partition(":")
        merged[name] = value
    for name, given in pod_options:
        merged[name] = given or ""
    return [f"{name}:{value}" if value else name for name, value in merged.items()]


def fit_searches(searches: Sequence[str]) -> tuple[list[str], str | None]:
    """The search path within the limits (at most 32 domains, none longer than 253 characters, 2048 characters
    in all, dropped from the end), and the warning's message if something was dropped."""
    kept = list(searches[:MAX_SEARCH_PATHS])
    cut = len(searches) > MAX_SEARCH_PATHS
    fitting = [s for s in kept if len(s) <= MAX_SEARCH_PATH_CHARS]
    cut |= len(fitting) < len(kept)
    while len(" ".join(fitting)) > MAX_SEARCH_LIST_CHARS:
        fitting.pop()
        cut = True
    if not cut:
        return fitting, None
    return fitting, ("Search Line limits were exceeded, some search paths have been omitted, the applied search "
                     f"line is: {' '.join(fitting)}")


def fit_nameservers(servers: Sequence[str]) -> tuple[list[str], str | None]:
    """The first three nameservers, and the warning's message if there were more."""
    if len(servers) <= MAX_NAMESERVERS:
        return list(servers), None
    kept = list(servers[:MAX_NAMESERVERS])
    return kept, ("Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver "
                  f"line is: {' '.join(kept)}")


def cluster_searches(namespace: str, domain: str, host: Sequence[str]) -> list[str]:
    """NS.svc.DOMAIN svc.DOMAIN DOMAIN, then the host's; the host's alone without a cluster domain."""
    if not domain:
        return list(host)
    return _unique([f"{namespace}.svc.{domain}", f"svc.{domain}", domain, *host])


def pod_dns(pod: Pod, *, cluster_dns: Sequence[str], cluster_domain: str, host: str | None,
            node_ips: Sequence[str] = ()) -> PodDNS:
    """The pod's DNS for its dnsPolicy. `host`: the text of the kubelet's resolvConf, None for resolvConf "";
    `node_ips`: the node's addresses (--node-ip), whose families name the loopback a host-DNS pod gets then.
    Raises DNSError for a host file the kubelet cannot parse."""
    spec, meta = pod.spec, pod.metadata
    base = parse_resolv_conf(host) if host is not None else ResolvConf()
    servers, searches, options = list(base.nameservers), list(base.searches), list(base.options)
    pod_events: list[tuple[str, str]] = []
    node_events: list[tuple[str, str]] = []
    policy = spec.dns_policy
    cluster = policy == "ClusterFirstWithHostNet" or (policy == "ClusterFirst" and not spec.host_network)
    if policy == "None":
        servers, searches, options = [], [], []
    elif cluster and cluster_dns:
        servers = list(cluster_dns)
        searches = cluster_searches(meta.namespace, cluster_domain, searches)
        options = list(DEFAULT_OPTIONS)
    else:
        if cluster:
            node_events.append(("MissingClusterDNS", MISSING_CLUSTER_DNS))
            pod_events.append(("MissingClusterDNS",
                               f'pod: "{meta.name}_{meta.namespace}({meta.uid})". {MISSING_CLUSTER_DNS}'))
        if host is None:  # no host file: the resolver's own default, a server on the node itself
            servers = [("::1" if ":" in ip else "127.0.0.1") for ip in node_ips] or ["127.0.0.1"]
            searches = ["."]
    extra = spec.dns_config
    if extra is not None:
        servers = _unique([*servers, *extra.nameservers])
        searches = _unique([*searches, *extra.searches])
        options = merge_options(options, extra.options)
    servers, too_many = fit_nameservers(servers)
    searches, too_long = fit_searches(searches)
    pod_events += [("DNSConfigForming", message) for message in (too_many, too_long) if message]
    return PodDNS(tuple(servers), tuple(searches), tuple(options), tuple(pod_events), tuple(node_events))
