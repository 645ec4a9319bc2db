"""The kubelet's settings, built once at start-up and passed down: defaults, then a KubeletConfiguration
file (kubelet.config.k8s.io/v1beta1, YAML or JSON, `--config`), then command-line flags, each layer over
the one before, as the stock kubelet merges them.

A typo in a config file must not silently fall back to a default (a node that registers with the wrong
max-pods or serves without client CA is worse than one that does not start), so a field that is not in
v1beta1 stops start-up naming it, and every value is checked here, with a message naming the flag or the
field path. The file the stock kubelet takes is taken here too (kubeadm's, `make cluster`'s): every field of
v1beta1 is in FILE_FIELDS, either implemented or accepted and named in one warning at start-up
(Settings.not_implemented). Everything downstream reads a validated Settings object and never re-parses.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any

from pykubelet.api import quantity as api_quantity
from pykubelet.api.names import is_dns1123_subdomain
from pykubelet.durations import duration
from pykubelet.errors import InvalidArgumentError
from pykubelet.featuregates import feature_gates

API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"


class ConfigError(InvalidArgumentError):
    """A setting is unknown or invalid; the message names it (flag or file field path)."""


@dataclass
class Settings:
    node_name: str = ""  # --hostname-override, else the host name, lower-cased (as the kubelet does)
    kubeconfig: Path | None = None  # None: standalone mode, static pods only
    container_runtime_endpoint: str = "unix:///run/containerd/containerd.sock"
    runtime_request_timeout: float = 120.0
    streaming_connection_idle_timeout: float = 4 * 3600.0  # an exec/attach/port-forward with no traffic ends
    static_pod_path: Path | None = None
    file_check_frequency: float = 20.0
    node_ip: str | None = None
    root_dir: Path = Path("/var/lib/kubelet")
    pod_logs_dir: Path = Path("/var/log/pods")  # podLogsDir: containers' logs, NS_NAME_UID/NAME/N.log
    address: str = "0.0.0.0"
    port: int = 10250
    tls_cert_file: Path | None = None
    tls_private_key_file: Path | None = None
    client_ca_file: Path | None = None
    anonymous_auth: bool = False
    webhook_authentication: bool = True
    authorization_mode: str = "Webhook"
    authentication_webhook_cache_ttl: float = 120.0
    authorization_webhook_cache_authorized_ttl: float = 300.0
    authorization_webhook_cache_unauthorized_ttl: float = 30.0
    max_pods: int = 110
    verbosity: int = 0
    sync_frequency: float = 60.0
    node_status_update_frequency: float = 10.0
    node_status_report_frequency: float = 300.0
    node_lease_duration_seconds: int = 40
    cluster_dns: list[str] = field(default_factory=list)
    cluster_domain: str = ""
    cgroup_driver: str = "cgroupfs"
    cgroup_root: str = "/"
    image_gc_high_threshold_percent: int = 85
    image_gc_low_threshold_percent: int = 80
    image_minimum_gc_age: float = 120.0
    container_log_max_size: int = 10 * 1024 * 1024
    container_log_max_files: int = 5
    container_log_monitor_interval: float = 10.0
    serialize_image_pulls: bool = True
    # eviction (pykubelet/eviction): signal -> threshold value, as parsed by pykubelet.eviction.policy
    eviction_hard: dict[str, Any] = field(default_factory=lambda: dict(_eviction_policy().DEFAULT_HARD))
    eviction_soft: dict[str, Any] = field(default_factory=dict)
    eviction_soft_grace_period: dict[str, float] = field(default_factory=dict)
    eviction_minimum_reclaim: dict[str, Any] = field(default_factory=dict)
    eviction_max_pod_grace_period: int = 0
    eviction_pressure_transition_period: float = 300.0
    allowed_unsafe_sysctls: list[str] = field(default_factory=list)  # names, or prefixes ending in *
    resolv_conf: Path | None = Path("/etc/resolv.conf")  # the host's DNS for pods; None: none (resolvConf "")
    healthz_port: int = 10248  # 0: no healthz server
    healthz_bind_address: str = "127.0.0.1"
    tls_min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    tls_cipher_suites: list[str] = field(default_factory=list)  # OpenSSL names of TLS 1.2 suites; empty: its own
    feature_gates: dict[str, bool] = field(default_factory=dict)
    # node allocatable: resource -> amount (cpu in millicores, memory and ephemeral-storage in bytes, pid)
    system_reserved: dict[str, int] = field(default_factory=dict)
    kube_reserved: dict[str, int] = field(default_factory=dict)
    enforce_node_allocatable: list[str] = field(default_factory=lambda: ["pods"])
    system_reserved_cgroup: str = ""  # the existing cgroup enforceNodeAllocatable's system-reserved limits
    kube_reserved_cgroup: str = ""
    pod_pids_limit: int = -1  # each pod cgroup's pids.max; -1: none
    # graceful node shutdown (pykubelet/node/shutdown.py): off while all are zero or empty
    shutdown_grace_period: float = 0.0
    shutdown_grace_period_critical_pods: float = 0.0
    shutdown_grace_period_by_pod_priority: list[dict[str, int]] = field(default_factory=list)
    node_labels: dict[str, str] = field(default_factory=dict)  # set at registration (--node-labels)
    register_with_taints: list[dict[str, str]] = field(default_factory=list)  # {key, value, effect}
    not_implemented: list[str] = field(default_factory=list)  # file fields taken and not acted on: a warning
    # TLS bootstrap and rotation (pykubelet/certificates)
    bootstrap_kubeconfig: Path | None = None  # with it, --kubeconfig is written once a client cert is issued
    cert_dir: Path = Path("/var/lib/kubelet/pki")
    rotate_certificates: bool = False
    server_tls_bootstrap: bool = False


# --- value parsers: each returns the value or raises ValueError with what it expected ---------------------

def _amount(value: Any) -> Decimal | None:
    """The amount of a quantity written as a string or an integer (YAML's), None if it is none."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    try:
        return api_quantity.parse(str(value))
    except ValueError:
        return None


def quantity(value: Any) -> int:
    """A byte quantity ("10Mi", "1G", "4096"), in bytes (rounded up, as the API's Value)."""
    amount = _amount(value)
    if amount is None or amount < 0:
        raise ValueError(f"a quantity such as \"10Mi\", got {value!r}")
    return api_quantity.value(amount)


def integer(low: int, high: int | None = None):
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise ValueError(f"an integer in [{low}, {high if high is not None else '...'}], got {value!r}")
        return value
    return parse


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"true or false, got {value!r}")
    return value


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a string, got {value!r}")
    return value


def path(value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise ValueError(f"a path, got {value!r}")
    return Path(value)


def one_of(*choices: str):
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"one of {', '.join(choices)}, got {value!r}")
        return value
    return parse


def ip_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"a list of IP addresses, got {value!r}")
    return [str(ipaddress.ip_address(v)) for v in value]


def endpoint(value: Any) -> str:
    value = string(value)
    if not value.startswith("unix://") and not value.startswith("/"):
        raise ValueError(f"a unix socket (unix:///path), got {value!r}")
    return value if value.startswith("unix://") else f"unix://{value}"


def sysctl_patterns(value: Any) -> list[str]:
    """allowedUnsafeSysctls: namespaced sysctl names or prefixes ending in *; the kubelet refuses to start on
    any other."""
    from pykubelet.pods.sysctls import check_pattern

    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"a list of sysctl names or prefixes ending in *, got {value!r}")
    for pattern in value:
        try:
            check_pattern(pattern)
        except ValueError as e:
            raise ValueError(f"namespaced sysctl names or prefixes ending in *: {e}") from None
    return value


def comma_list(parse):
    """A flag's comma-separated list, each item as the file's list would be."""
    return lambda value: parse([v for v in string(value).split(",") if v])


def _eviction_policy():
    from pykubelet.eviction import policy
    return policy


def eviction_values(value: Any) -> dict[str, Any]:
    """evictionHard, evictionSoft, evictionMinimumReclaim: eviction signal -> "100Mi" or "10%"."""
    return _eviction_policy().value_map(value)


def eviction_durations(value: Any) -> dict[str, float]:
    """evictionSoftGracePeriod: eviction signal -> a duration."""
    return _eviction_policy().duration_map(value)


def node_ip(value: Any) -> str:
    """The kubelet refuses an address the API server cannot reach it on. Loopback is let through (the
    stock kubelet refuses it): it is the one address of a node whose API server runs on the same machine
    (the e2e tests, `make run`), and no other host's API server would be told it."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"an IP address, got {value!r}") from None
    if ip.is_unspecified or ip.is_multicast or (ip.is_link_local and not ip.is_loopback):
        raise ValueError(f"a routable address (not unspecified, multicast or link-local), got {value}")
    return str(ip)


# --- parsers of the other v1beta1 types ----------------------------------------------------------------------

class _Below(InvalidArgumentError):
    """A value's error inside a map or a list: `path` goes after the field's own (".memory.available",
    "[0].effect"), so the message names the whole field path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a number, got {value!r}")
    return float(value)


def _at(where: str, parse, value: Any) -> Any:
    """`parse(value)`, its error named at `where` below the field (a list's index, a map's key) and below that
    at what the inner parser named."""
    try:
        return parse(value)
    except _Below as e:
        raise _Below(f"{where}{e.path}", str(e)) from None
    except ValueError as e:
        raise _Below(where, str(e)) from None


def list_of(parse):
    def parse_list(value: Any) -> list:
        if not isinstance(value, list):
            raise ValueError(f"a list, got {value!r}")
        return [_at(f"[{i}]", parse, item) for i, item in enumerate(value)]
    return parse_list


def map_of(parse, key=string):
    """A map of string keys, each value parsed by `parse`."""
    def parse_map(value: Any) -> dict:
        if not isinstance(value, dict):
            raise ValueError(f"a map, got {value!r}")
        return {_at(f".{k}", key, k): _at(f".{k}", parse, v) for k, v in value.items()}
    return parse_map


def struct(**fields):
    """A list item that is an object of known fields (shutdownGracePeriodByPodPriority's, reservedMemory's...):
    each present one parsed, any other refused."""
    def parse_struct(value: Any) -> dict:
        if not isinstance(value, dict):
            raise ValueError(f"an object, got {value!r}")
        for k in value:
            if k not in fields:
                raise _Below(f".{k}", f"a field of {', '.join(fields)}: unknown field {k}")
        return {k: _at(f".{k}", fields[k], v) for k, v in value.items()}
    return parse_struct


def each_key(parse_map):
    """A map parser that judges the map whole (eviction's), called one key at a time so its error names it."""
    def parse(value: Any) -> dict:
        if not isinstance(value, dict):
            return parse_map(value)
        out: dict = {}
        for k, v in value.items():
            try:
                out.update(parse_map({k: v}))
            except ValueError as e:
                raise _Below(f".{k}", str(e).removesuffix(f" for {k}")) from None
        return out
    return parse


def only(allowed: Any, why: str):
    """A setting whose one value this kubelet takes is the one it does; any other is refused, saying why."""
    def parse(value: Any) -> Any:
        if value != allowed or type(value) is not type(allowed):
            raise ValueError(f"{json.dumps(allowed)}: {why}, got {value!r}")
        return value
    return parse


def ip_address(value: Any) -> str:
    try:
        return str(ipaddress.ip_address(string(value)))
    except ValueError:
        raise ValueError(f"an IP address, got {value!r}") from None


def any_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity of any unit ("0", "1Gi", "100m", "1e3"), as its amount (of settings not
    implemented: it is checked, and zero is told from the rest)."""
    amount = _amount(value)
    if amount is None:
        raise ValueError(f"a quantity such as \"1Gi\" or \"100m\", got {value!r}")
    return amount


def duration_or_nanoseconds(value: Any) -> float:
    """logging.flushFrequency: a duration, or an integer of nanoseconds (how kubeadm writes it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value / 1e9
    return duration(value)


TLS_VERSIONS = {"VersionTLS10": ssl.TLSVersion.TLSv1, "VersionTLS11": ssl.TLSVersion.TLSv1_1,
                 "VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}
# Go's crypto/tls names (and the two short ChaCha20 ones Kubernetes also takes) -> OpenSSL's; the TLS 1.3
# suites are None: neither Go nor OpenSSL lets them be chosen, they are always on with TLS 1.3
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA", "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256", "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384", "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None, "TLS_AES_256_GCM_SHA384": None, "TLS_CHACHA20_POLY1305_SHA256": None,
}


def tls_version(value: Any) -> ssl.TLSVersion:
    if value not in TLS_VERSIONS:
        raise ValueError(f"one of {', '.join(TLS_VERSIONS)}, got {value!r}")
    return TLS_VERSIONS[value]


def cipher_suites(value: Any) -> list[str]:
    """tlsCipherSuites: Go's names of the suites, as OpenSSL names them; one OpenSSL cannot use is refused
    here rather than when the server starts."""
    if not isinstance(value, list):
        raise ValueError(f"a list of cipher suite names, got {value!r}")
    out = []
    for name in value:
        if name not in CIPHER_SUITES:
            raise ValueError(f"cipher suites as Go's crypto/tls names them: cipher suite {name} not supported "
                             "or doesn't exist")
        openssl = CIPHER_SUITES[name]
        if openssl is not None and openssl not in out:
            out.append(openssl)
    if out:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(":".join(out))
        except ssl.SSLError:
            raise ValueError(f"cipher suites this host's OpenSSL has, got {', '.join(value)}") from None
    return out


def reserved(value: Any) -> dict[str, int]:
    """systemReserved, kubeReserved: cpu ("500m", "1.5"), memory and ephemeral-storage ("1Gi"), pid."""
    out = {}
    for name, amount in map_of(lambda v: v)(value).items():
        try:
            if name == "cpu":
                cores = _amount(amount)
                if cores is None or cores < 0:
                    raise ValueError(f"a cpu quantity such as \"500m\" or \"1.5\", got {amount!r}")
                out[name] = api_quantity.milli_value(cores)
            elif name in ("memory", "ephemeral-storage"):
                out[name] = quantity(amount)
            elif name == "pid":
                out[name] = integer(0)(int(amount) if isinstance(amount, str) and amount.isdigit() else amount)
            else:
                raise ValueError(f"one of cpu, memory, ephemeral-storage, pid, got {name!r}")
        except ValueError as e:
            raise _Below(f".{name}", str(e)) from None
    return out


_NODE_ALLOCATABLE = ("pods", "system-reserved", "kube-reserved", "system-reserved-compressible",
                     "kube-reserved-compressible", "none")


def enforce_node_allocatable(value: Any) -> list[str]:
    values = list_of(one_of(*_NODE_ALLOCATABLE))(value)
    if "none" in values and len(values) > 1:
        raise ValueError(f"\"none\" alone, got {values}")
    if len(set(values)) < len(values):
        raise ValueError(f"each enforcement once, got {values}")
    return values


_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")


def label_key(key: Any) -> str:
    """A qualified name ("prefix/name" or "name"), as labels' and taints' keys are."""
    prefix, _, name = string(key).rpartition("/")
    if not _LABEL_NAME.fullmatch(name) or (prefix and not is_dns1123_subdomain(prefix)):
        raise ValueError(f"a qualified name (an optional DNS subdomain prefix and '/', then a name of 63 "
                         f"alphanumerics, '-', '_' or '.'), got {key!r}")
    return key


def label_value(value: Any) -> str:
    if value and not _LABEL_NAME.fullmatch(string(value)):
        raise ValueError(f"a label value (63 alphanumerics, '-', '_' or '.'), got {value!r}")
    return value


# the labels a node may set on itself (k8s.io/kubelet/pkg/apis/well_known_labels.go): any other key in the
# kubernetes.io or k8s.io namespaces is refused, as NodeRestriction would refuse it at registration
_KUBELET_LABELS = frozenset((
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "kubernetes.io/os", "kubernetes.io/arch",
    "beta.kubernetes.io/os", "beta.kubernetes.io/arch"))
_KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def _is_kubernetes_namespace(namespace: str) -> bool:
    return any(namespace == ns or namespace.endswith("." + ns) for ns in ("kubernetes.io", "k8s.io"))


def node_labels(value: Any) -> dict[str, str]:
    """--node-labels: key=value,... of keys a kubelet may set on its Node."""
    out = {}
    for item in (i for i in string(value).split(",") if i):
        key, eq, val = item.partition("=")
        if not eq:
            raise ValueError(f"key=value pairs separated by ',', got {item!r}")
        out[label_key(key)] = label_value(val)
    unknown = sorted(k for k in out if _is_kubernetes_namespace(k.rpartition("/")[0]) and k not in _KUBELET_LABELS
                     and not any(k.rpartition("/")[0] == ns or k.rpartition("/")[0].endswith("." + ns)
                                 for ns in _KUBELET_LABEL_NAMESPACES))
    if unknown:
        raise ValueError(f"labels in the 'kubernetes.io' namespace to begin with an allowed prefix "
                         f"({', '.join(_KUBELET_LABEL_NAMESPACES)}) or be in the allowed set "
                         f"({', '.join(sorted(_KUBELET_LABELS))}): unknown 'kubernetes.io' or 'k8s.io' labels "
                         f"{', '.join(unknown)}")
    return out


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def taint(value: Any) -> dict[str, str]:
    """A registerWithTaints item: {key, value, effect} (timeAdded is the API server's to set)."""
    t = struct(key=label_key, value=label_value, effect=one_of(*_TAINT_EFFECTS), timeAdded=string)(value)
    if "key" not in t or "effect" not in t:
        raise ValueError(f"a taint with a key and an effect, got {value!r}")
    return {"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]}


def taints(value: Any) -> list[dict[str, str]]:
    """--register-with-taints: key=value:Effect or key:Effect, separated by ','."""
    out = []
    for item in (i for i in string(value).split(",") if i):
        kv, colon, effect = item.rpartition(":")
        if not colon:
            raise ValueError(f"taints as key=value:Effect separated by ',', got {item!r}")
        key, _, val = kv.partition("=")
        out.append(taint({"key": key, "value": val, "effect": effect}))
    return out


# --- the KubeletConfiguration's fields ----------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    parse: Callable[[Any], Any]
    attr: str | None = None  # the Settings attribute its value goes to
    implemented: bool = True  # False: taken (its value checked) and named in the start-up warning
    # a Go pointer: a zero value (0, "", false, "0s") is a value; of any other field it is the field left out,
    # as Go reads it (kubeadm writes "0s" for each duration it leaves to the kubelet's defaults)
    pointer: bool = False


def sets(attr: str, parse, pointer: bool = False) -> Field:
    return Field(parse, attr, pointer=pointer)


def checked(parse) -> Field:
    """Implemented in that the only values taken are what this kubelet does (readOnlyPort 0...)."""
    return Field(parse)


def ignored(parse, pointer: bool = False) -> Field:
    return Field(parse, implemented=False, pointer=pointer)


def resolv_conf(value: Any) -> Path | None:
    """The host's resolver file for pods; "" is none."""
    return Path(value) if string(value) else None


EVICTION_VALUES = each_key(eviction_values)
EVICTION_DURATIONS = each_key(eviction_durations)
_NO_READ_ONLY_PORT = "this node serves no unauthenticated port"
_DURATION_MAP = map_of(duration)
_STRINGS = list_of(string)
_STRING_MAP = map_of(string)

# Every field of kubelet.config.k8s.io/v1beta1 (k8s.io/kubelet/config/v1beta1/types.go, 1.37) by its path.
FILE_FIELDS: dict[str, Field] = {
    "enableServer": checked(only(True, "the kubelet's server is how the API server reaches its pods")),
    "staticPodPath": sets("static_pod_path", path),
    "podLogsDir": sets("pod_logs_dir", path),
    "syncFrequency": sets("sync_frequency", duration),
    "fileCheckFrequency": sets("file_check_frequency", duration),
    "httpCheckFrequency": ignored(duration),
    "staticPodURL": ignored(string),
    "staticPodURLHeader": ignored(map_of(_STRINGS)),
    "address": sets("address", ip_address),
    "port": sets("port", integer(1, 65535)),
    "readOnlyPort": checked(only(0, _NO_READ_ONLY_PORT)),
    "tlsCertFile": sets("tls_cert_file", path),
    "tlsPrivateKeyFile": sets("tls_private_key_file", path),
    "tlsCipherSuites": sets("tls_cipher_suites", cipher_suites),
    "tlsCurvePreferences": ignored(list_of(integer(0, 65535))),
    "tlsMinVersion": sets("tls_min_version", tls_version),
    "rotateCertificates": sets("rotate_certificates", boolean),
    "serverTLSBootstrap": sets("server_tls_bootstrap", boolean),
    "authentication.x509.clientCAFile": sets("client_ca_file", path),
    "authentication.webhook.enabled": sets("webhook_authentication", boolean, pointer=True),
    "authentication.webhook.cacheTTL": sets("authentication_webhook_cache_ttl", duration),
    "authentication.anonymous.enabled": sets("anonymous_auth", boolean, pointer=True),
    "authorization.mode": sets("authorization_mode", one_of("Webhook", "AlwaysAllow")),
    "authorization.webhook.cacheAuthorizedTTL": sets("authorization_webhook_cache_authorized_ttl", duration),
    "authorization.webhook.cacheUnauthorizedTTL": sets("authorization_webhook_cache_unauthorized_ttl", duration),
    "registryPullQPS": ignored(integer(0), pointer=True),
    "registryBurst": ignored(integer(0)),
    "imagePullCredentialsVerificationPolicy": ignored(one_of(
        "NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages", "AlwaysVerify")),
    "preloadedImagesVerificationAllowlist": ignored(_STRINGS),
    "eventRecordQPS": ignored(integer(0), pointer=True),
    "eventBurst": ignored(integer(0)),
    "enableDebuggingHandlers": ignored(boolean, pointer=True),
    "enableContentionProfiling": ignored(boolean),
    "healthzPort": sets("healthz_port", integer(0, 65535), pointer=True),
    "healthzBindAddress": sets("healthz_bind_address", ip_address),
    "oomScoreAdj": ignored(integer(-1000, 1000), pointer=True),
    "clusterDomain": sets("cluster_domain", string),
    "clusterDNS": sets("cluster_dns", ip_list),
    "streamingConnectionIdleTimeout": sets("streaming_connection_idle_timeout", duration),
    "nodeStatusUpdateFrequency": sets("node_status_update_frequency", duration),
    "nodeStatusReportFrequency": sets("node_status_report_frequency", duration),
    "nodeLeaseDurationSeconds": sets("node_lease_duration_seconds", integer(1)),
    "imageMinimumGCAge": sets("image_minimum_gc_age", duration),
    "imageMaximumGCAge": ignored(duration),
    "imageGCHighThresholdPercent": sets("image_gc_high_threshold_percent", integer(0, 100), pointer=True),
    "imageGCLowThresholdPercent": sets("image_gc_low_threshold_percent", integer(0, 100), pointer=True),
    "volumeStatsAggPeriod": ignored(duration),
    "kubeletCgroups": ignored(string),
    "systemCgroups": ignored(string),
    "cgroupRoot": sets("cgroup_root", string),
    "cgroupsPerQOS": checked(only(True, "pods' cgroups are always under kubepods by QoS class")),
    "cgroupDriver": sets("cgroup_driver", one_of("cgroupfs", "systemd")),
    "cpuManagerPolicy": ignored(one_of("none", "static")),
    "singleProcessOOMKill": ignored(boolean, pointer=True),
    "cpuManagerPolicyOptions": ignored(_STRING_MAP),
    "cpuManagerReconcilePeriod": ignored(duration),
    "memoryManagerPolicy": ignored(one_of("None", "Static")),
    "topologyManagerPolicy": ignored(one_of("none", "best-effort", "restricted", "single-numa-node")),
    "topologyManagerScope": ignored(one_of("container", "pod")),
    "topologyManagerPolicyOptions": ignored(_STRING_MAP),
    "qosReserved": ignored(_STRING_MAP),
    "runtimeRequestTimeout": sets("runtime_request_timeout", duration),
    "hairpinMode": ignored(one_of("promiscuous-bridge", "hairpin-veth", "none")),
    "maxPods": sets("max_pods", integer(1)),
    "podCIDR": ignored(string),
    "podPidsLimit": sets("pod_pids_limit", integer(-1), pointer=True),
    "resolvConf": sets("resolv_conf", resolv_conf, pointer=True),
    "runOnce": ignored(boolean),
    "cpuCFSQuota": ignored(boolean, pointer=True),
    "cpuCFSQuotaPeriod": ignored(duration, pointer=True),
    "nodeStatusMaxImages": ignored(integer(-1), pointer=True),
    "maxOpenFiles": ignored(integer(0)),
    "contentType": ignored(string),
    "kubeAPIQPS": ignored(integer(0), pointer=True),
    "kubeAPIBurst": ignored(integer(0)),
    "serializeImagePulls": sets("serialize_image_pulls", boolean, pointer=True),
    "maxParallelImagePulls": ignored(integer(1), pointer=True),
    "evictionHard": sets("eviction_hard", EVICTION_VALUES, pointer=True),
    "evictionSoft": sets("eviction_soft", EVICTION_VALUES, pointer=True),
    "evictionSoftGracePeriod": sets("eviction_soft_grace_period", EVICTION_DURATIONS, pointer=True),
    "evictionPressureTransitionPeriod": sets("eviction_pressure_transition_period", duration),
    "evictionMaxPodGracePeriod": sets("eviction_max_pod_grace_period", integer(0)),
    "evictionMinimumReclaim": sets("eviction_minimum_reclaim", EVICTION_VALUES, pointer=True),
    "mergeDefaultEvictionSettings": ignored(boolean, pointer=True),
    "podsPerCore": ignored(integer(0)),
    "enableControllerAttachDetach": ignored(boolean, pointer=True),
    "protectKernelDefaults": ignored(boolean),
    "makeIPTablesUtilChains": ignored(boolean, pointer=True),
    "iptablesMasqueradeBit": ignored(integer(0, 31), pointer=True),
    "iptablesDropBit": ignored(integer(0, 31), pointer=True),
    "featureGates": sets("feature_gates", feature_gates),
    "failSwapOn": ignored(boolean, pointer=True),
    "memorySwap.swapBehavior": ignored(one_of("NoSwap", "LimitedSwap")),
    "containerLogMaxSize": sets("container_log_max_size", quantity),
    "containerLogMaxFiles": sets("container_log_max_files", integer(2), pointer=True),
    "containerLogMaxWorkers": ignored(integer(1), pointer=True),
    "containerLogMonitorInterval": sets("container_log_monitor_interval", duration, pointer=True),
    "configMapAndSecretChangeDetectionStrategy": ignored(one_of("Get", "Cache", "Watch")),
    "systemReserved": sets("system_reserved", reserved),
    "kubeReserved": sets("kube_reserved", reserved),
    "reservedSystemCPUs": ignored(string),
    "showHiddenMetricsForVersion": ignored(string),
    "systemReservedCgroup": sets("system_reserved_cgroup", string),
    "kubeReservedCgroup": sets("kube_reserved_cgroup", string),
    "enforceNodeAllocatable": sets("enforce_node_allocatable", enforce_node_allocatable, pointer=True),
    "allowedUnsafeSysctls": sets("allowed_unsafe_sysctls", sysctl_patterns),
    "defaultPodSysctls": ignored(_STRING_MAP),
    "volumePluginDir": ignored(string),
    "providerID": ignored(string),
    "kernelMemcgNotification": ignored(boolean),
    "logging.format": ignored(one_of("text", "json")),
    "logging.flushFrequency": ignored(duration_or_nanoseconds),
    "logging.verbosity": sets("verbosity", integer(0)),
    "logging.vmodule": ignored(list_of(struct(filePattern=string, verbosity=integer(0)))),
    "logging.options.text.splitStream": ignored(boolean),
    "logging.options.text.infoBufferSize": ignored(any_quantity),
    "logging.options.json.splitStream": ignored(boolean),
    "logging.options.json.infoBufferSize": ignored(any_quantity),
    "enableSystemLogHandler": ignored(boolean, pointer=True),
    "enableSystemLogQuery": ignored(boolean, pointer=True),
    "shutdownGracePeriod": sets("shutdown_grace_period", duration),
    "shutdownGracePeriodCriticalPods": sets("shutdown_grace_period_critical_pods", duration),
    "shutdownGracePeriodByPodPriority": sets("shutdown_grace_period_by_pod_priority", list_of(struct(
        priority=integer(-2**31, 2**31 - 1), shutdownGracePeriodSeconds=integer(0)))),
    "crashLoopBackOff.maxContainerRestartPeriod": ignored(duration, pointer=True),
    "reservedMemory": ignored(list_of(struct(numaNode=integer(0), limits=map_of(any_quantity)))),
    "enableProfilingHandler": ignored(boolean, pointer=True),
    "enableDebugFlagsHandler": ignored(boolean, pointer=True),
    "seccompDefault": ignored(boolean, pointer=True),
    "memoryThrottlingFactor": ignored(number, pointer=True),
    "memoryReservationPolicy": ignored(one_of("None", "HardReservation")),
    "registerWithTaints": sets("register_with_taints", list_of(taint)),
    "registerNode": checked(only(True, "this kubelet registers its Node")),
    "tracing.endpoint": ignored(string, pointer=True),
    "tracing.samplingRatePerMillion": ignored(integer(0, 1_000_000), pointer=True),
    "localStorageCapacityIsolation": ignored(boolean, pointer=True),
    "containerRuntimeEndpoint": sets("container_runtime_endpoint", endpoint),
    "imageServiceEndpoint": ignored(string),
    "failCgroupV1": ignored(boolean, pointer=True),
    "userNamespaces.idsPerPod": ignored(integer(65536), pointer=True),
}
_PARENTS = {p.rsplit(".", i)[0] for p in FILE_FIELDS for i in range(1, p.count(".") + 1)}


def _zero(value: Any) -> bool:
    return value is None or (not isinstance(value, Path) and not value)


def _flatten(obj: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if name in _PARENTS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ValueError(f"{name}: expected an object, got {value!r}")
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def load_file(path_: Path) -> dict[str, Any]:
    """The Settings attributes a KubeletConfiguration file sets, and under "not_implemented" the paths of the
    fields it gives that this kubelet takes and does not act on."""
    import yaml  # JSON is YAML: one parser for both

    try:
        doc = yaml.safe_load(path_.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--config {path_}: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"--config {path_}: not a KubeletConfiguration object")
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise ConfigError(f"--config {path_}: kind/apiVersion must be {KIND} {API_VERSION}, "
                          f"got {doc.get('kind')!r} {doc.get('apiVersion')!r}")
    try:
        fields = _flatten({k: v for k, v in doc.items() if k not in ("kind", "apiVersion")})
    except ValueError as e:
        raise ConfigError(f"--config {path_}: {e}") from None
    unknown = sorted(set(fields) - set(FILE_FIELDS))
    if unknown:
        raise ConfigError(f"--config {path_}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    values: dict[str, Any] = {}
    not_implemented = []
    for name, raw in fields.items():
        f = FILE_FIELDS[name]
        if raw is None or (raw == "" and not f.pointer):
            continue  # null, or the empty string of a string: the field left out
        try:
            value = f.parse(raw)
        except _Below as e:
            raise ConfigError(f"--config {path_}: {name}{e.path}: expected {e}") from e
        except ValueError as e:
            raise ConfigError(f"--config {path_}: {name}: expected {e}") from e
        if _zero(value) and not f.pointer:
            continue
        if not f.implemented:
            not_implemented.append(name)
        if f.attr is not None:
            values[f.attr] = value
    if "node_status_update_frequency" in values and "node_status_report_frequency" not in values:
        # as the kubelet's defaulting: a report period left out follows an update period that is set
        values["node_status_report_frequency"] = values["node_status_update_frequency"]
    if not_implemented:
        values["not_implemented"] = not_implemented
    return values


# flag name -> (Settings attribute, parser of the string click hands over)
FLAGS: dict[str, tuple[str, Any]] = {
    "kubeconfig": ("kubeconfig", path),
    "bootstrap_kubeconfig": ("bootstrap_kubeconfig", path),
    "cert_dir": ("cert_dir", path),
    "container_runtime_endpoint": ("container_runtime_endpoint", endpoint),
    "pod_manifest_path": ("static_pod_path", path),
    "hostname_override": ("node_name", string),
    "node_ip": ("node_ip", node_ip),
    "root_dir": ("root_dir", path),
    "port": ("port", integer(1, 65535)),
    "tls_cert_file": ("tls_cert_file", path),
    "tls_private_key_file": ("tls_private_key_file", path),
    "client_ca_file": ("client_ca_file", path),
    "max_pods": ("max_pods", integer(1)),
    "allowed_unsafe_sysctls": ("allowed_unsafe_sysctls", comma_list(sysctl_patterns)),
    "node_labels": ("node_labels", node_labels),
    "register_with_taints": ("register_with_taints", taints),
    "v": ("verbosity", integer(0)),
}


def build(flags: dict[str, Any], config_file: Path | None = None) -> Settings:
    """Defaults, then `config_file`, then the flags that were given (None: not given)."""
    values = load_file(config_file) if config_file is not None else {}
    for name, raw in flags.items():
        if raw is None:
            continue
        attr, parse = FLAGS[name]
        try:
            values[attr] = parse(raw)
        except ValueError as e:
            raise ConfigError(f"--{name.replace('_', '-')}: expected {e}") from e
    settings = Settings(**values)
    if not settings.node_name:
        settings.node_name = socket.gethostname()
    settings.node_name = settings.node_name.strip().lower()
    return _validate(settings)


def _validate(s: Settings) -> Settings:
    if not is_dns1123_subdomain(s.node_name):
        raise ConfigError(f"--hostname-override: node name {s.node_name!r} is not a DNS-1123 subdomain")
    if (s.tls_cert_file is None) != (s.tls_private_key_file is None):
        raise ConfigError("--tls-cert-file and --tls-private-key-file go together: one is missing")
    for key, cgroup in (("system-reserved", s.system_reserved_cgroup), ("kube-reserved", s.kube_reserved_cgroup)):
        if not cgroup and (key in s.enforce_node_allocatable or f"{key}-compressible" in s.enforce_node_allocatable):
            raise ConfigError(f"enforceNodeAllocatable: {key} needs {key.replace('-r', 'R')}Cgroup, the cgroup "
                              "to limit, as the kubelet")
    try:
        eviction_thresholds(s)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if s.image_gc_low_threshold_percent > s.image_gc_high_threshold_percent:
        raise ConfigError("imageGCLowThresholdPercent must not exceed imageGCHighThresholdPercent")
    if s.container_log_monitor_interval < 3:
        raise ConfigError("containerLogMonitorInterval: expected at least 3s, as the kubelet, got "
                          f"{s.container_log_monitor_interval:g}s")
    _validate_shutdown(s)
    if s.bootstrap_kubeconfig is not None and s.kubeconfig is None:
        raise ConfigError("--bootstrap-kubeconfig needs --kubeconfig: the path the kubelet writes its credential to")
    # with a bootstrap, --kubeconfig is what it writes, and the bootstrap file is read only when --kubeconfig
    # is no valid credential (kubeadm deletes it after `join`, and `init` never writes one): both are checked
    # then, by certificates.manager.bootstrap_client, as the kubelet's LoadClientCert
    for name in ("kubeconfig", "tls_cert_file", "tls_private_key_file", "client_ca_file"):
        p = getattr(s, name)
        if name == "kubeconfig" and s.bootstrap_kubeconfig is not None:
            continue
        if p is not None and not p.is_file():
            raise ConfigError(f"--{name.replace('_', '-')} {p}: no such file")
    return s


def _validate_shutdown(s: Settings) -> None:
    """The stock kubelet's checks of the graceful shutdown periods."""
    total, critical = s.shutdown_grace_period, s.shutdown_grace_period_critical_pods
    for name, value in (("shutdownGracePeriod", total), ("shutdownGracePeriodCriticalPods", critical)):
        if 0 < value < 1:
            raise ConfigError(f"{name}: expected zero or at least 1s, as the kubelet, got {value:g}s")
    if critical > total:
        raise ConfigError(f"shutdownGracePeriodCriticalPods: expected at most shutdownGracePeriod ({total:g}s), "
                          f"got {critical:g}s")
    if s.shutdown_grace_period_by_pod_priority and (total or critical):
        raise ConfigError("shutdownGracePeriodByPodPriority: expected either it or shutdownGracePeriod and "
                          "shutdownGracePeriodCriticalPods, as the kubelet, got both")


def eviction_thresholds(s: Settings) -> list:
    """The eviction manager's thresholds (pykubelet.eviction.policy.Threshold) from the settings."""
    return _eviction_policy().thresholds(s.eviction_hard, s.eviction_soft, s.eviction_soft_grace_period,
                                         s.eviction_minimum_reclaim)


def dump(s: Settings) -> str:
    """The merged settings, for the log at -v 1 and above."""
    return json.dumps({k: str(v) if isinstance(v, Path | Enum) else v for k, v in dataclasses.asdict(s).items()},
                      sort_keys=True)
