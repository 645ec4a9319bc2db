"""The kubelet's settings, built once at start-up and passed down: defaults, then a KubeletConfiguration
file (kubelet.config.k8s.io/v1beta1, YAML or JSON, `--config`), then command-line flags, each layer over
the one before, as the stock kubelet merges them.

A typo in a config file must not silently fall back to a default (a node that registers with the wrong
max-pods or serves without client CA is worse than one that does not start), so any field this kubelet
does not know stops start-up naming it, and every value is checked here with a message naming the flag
or the field path. Everything downstream reads a validated Settings object and never re-parses.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pykubelet.durations import duration
from pykubelet.errors import InvalidArgumentError

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
    # TLS bootstrap and rotation (pykubelet/certificates)
    bootstrap_kubeconfig: Path | None = None  # with it, --kubeconfig is written once a client cert is issued
    cert_dir: Path = Path("/var/lib/kubelet/pki")
    rotate_certificates: bool = False
    server_tls_bootstrap: bool = False


# --- value parsers: each returns the value or raises ValueError with what it expected ---------------------

_QUANTITY = re.compile(r"(\d+)(Ki|Mi|Gi|Ti|K|M|G|T|k)?")
_QUANTITY_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "K": 10**3,
                   "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(value: Any) -> int:
    """A byte quantity ("10Mi", "1G", "4096")."""
    m = _QUANTITY.fullmatch(str(value)) if isinstance(value, str | int) and not isinstance(value, bool) else None
    if m is None:
        raise ValueError(f"a quantity such as \"10Mi\", got {value!r}")
    return int(m.group(1)) * _QUANTITY_UNITS[m.group(2)]


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


# KubeletConfiguration field path -> (Settings attribute, parser). Anything else in a file is refused.
FILE_FIELDS: dict[str, tuple[str | None, Any]] = {
    "containerRuntimeEndpoint": ("container_runtime_endpoint", endpoint),
    "runtimeRequestTimeout": ("runtime_request_timeout", duration),
    "streamingConnectionIdleTimeout": ("streaming_connection_idle_timeout", duration),
    "staticPodPath": ("static_pod_path", path),
    "fileCheckFrequency": ("file_check_frequency", duration),
    "address": ("address", lambda v: str(ipaddress.ip_address(v))),
    "port": ("port", integer(1, 65535)),
    "tlsCertFile": ("tls_cert_file", path),
    "tlsPrivateKeyFile": ("tls_private_key_file", path),
    "authentication.x509.clientCAFile": ("client_ca_file", path),
    "authentication.anonymous.enabled": ("anonymous_auth", boolean),
    "authentication.webhook.enabled": ("webhook_authentication", boolean),
    "authentication.webhook.cacheTTL": ("authentication_webhook_cache_ttl", duration),
    "authorization.mode": ("authorization_mode", one_of("Webhook", "AlwaysAllow")),
    "authorization.webhook.cacheAuthorizedTTL": ("authorization_webhook_cache_authorized_ttl", duration),
    "authorization.webhook.cacheUnauthorizedTTL": ("authorization_webhook_cache_unauthorized_ttl", duration),
    "maxPods": ("max_pods", integer(1)),
    "podLogsDir": ("pod_logs_dir", path),
    "syncFrequency": ("sync_frequency", duration),
    "nodeStatusUpdateFrequency": ("node_status_update_frequency", duration),
    "nodeStatusReportFrequency": ("node_status_report_frequency", duration),
    "nodeLeaseDurationSeconds": ("node_lease_duration_seconds", integer(1)),
    "clusterDNS": ("cluster_dns", ip_list),
    "clusterDomain": ("cluster_domain", string),
    "cgroupDriver": ("cgroup_driver", one_of("cgroupfs", "systemd")),
    "cgroupRoot": ("cgroup_root", string),
    "imageGCHighThresholdPercent": ("image_gc_high_threshold_percent", integer(0, 100)),
    "imageGCLowThresholdPercent": ("image_gc_low_threshold_percent", integer(0, 100)),
    "imageMinimumGCAge": ("image_minimum_gc_age", duration),
    "containerLogMaxSize": ("container_log_max_size", quantity),
    "containerLogMaxFiles": ("container_log_max_files", integer(2)),
    "containerLogMonitorInterval": ("container_log_monitor_interval", duration),
    "serializeImagePulls": ("serialize_image_pulls", boolean),
    "evictionHard": ("eviction_hard", eviction_values),
    "evictionSoft": ("eviction_soft", eviction_values),
    "evictionSoftGracePeriod": ("eviction_soft_grace_period", eviction_durations),
    "evictionMinimumReclaim": ("eviction_minimum_reclaim", eviction_values),
    "evictionMaxPodGracePeriod": ("eviction_max_pod_grace_period", integer(0)),
    "evictionPressureTransitionPeriod": ("eviction_pressure_transition_period", duration),
    "allowedUnsafeSysctls": ("allowed_unsafe_sysctls", sysctl_patterns),
    "rotateCertificates": ("rotate_certificates", boolean),
    "serverTLSBootstrap": ("server_tls_bootstrap", boolean),
    # settings of the stock kubelet that have no meaning here; accepted so one file serves both
    "failSwapOn": (None, boolean),
    "failCgroupV1": (None, boolean),
}


def _flatten(obj: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and any(f.startswith(name + ".") for f in FILE_FIELDS):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def load_file(path_: Path) -> dict[str, Any]:
    """The Settings attributes a KubeletConfiguration file sets."""
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
    values: dict[str, Any] = {}
    fields = _flatten({k: v for k, v in doc.items() if k not in ("kind", "apiVersion")})
    unknown = sorted(set(fields) - set(FILE_FIELDS))
    if unknown:
        raise ConfigError(f"--config {path_}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    for name, raw in fields.items():
        attr, parse = FILE_FIELDS[name]
        try:
            value = parse(raw)
        except ValueError as e:
            raise ConfigError(f"--config {path_}: {name}: expected {e}") from e
        if attr is not None:
            values[attr] = value
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


_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _validate(s: Settings) -> Settings:
    if len(s.node_name) > 253 or not _DNS1123.fullmatch(s.node_name):
        raise ConfigError(f"--hostname-override: node name {s.node_name!r} is not a DNS-1123 subdomain")
    if (s.tls_cert_file is None) != (s.tls_private_key_file is None):
        raise ConfigError("--tls-cert-file and --tls-private-key-file go together: one is missing")
    try:
        eviction_thresholds(s)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if s.image_gc_low_threshold_percent > s.image_gc_high_threshold_percent:
        raise ConfigError("imageGCLowThresholdPercent must not exceed imageGCHighThresholdPercent")
    if s.container_log_monitor_interval < 3:
        raise ConfigError("containerLogMonitorInterval: expected at least 3s, as the kubelet, got "
                          f"{s.container_log_monitor_interval:g}s")
    if s.bootstrap_kubeconfig is not None and s.kubeconfig is None:
        raise ConfigError("--bootstrap-kubeconfig needs --kubeconfig: the path the kubelet writes its credential to")
    bootstrapped = ("kubeconfig",) if s.bootstrap_kubeconfig is not None else ()  # written by the bootstrap
    for name in ("kubeconfig", "bootstrap_kubeconfig", "tls_cert_file", "tls_private_key_file", "client_ca_file"):
        p = getattr(s, name)
        if name in bootstrapped:
            continue
        if p is not None and not p.is_file():
            raise ConfigError(f"--{name.replace('_', '-')} {p}: no such file")
    return s


def eviction_thresholds(s: Settings) -> list:
    """The eviction manager's thresholds (pykubelet.eviction.policy.Threshold) from the settings."""
    return _eviction_policy().thresholds(s.eviction_hard, s.eviction_soft, s.eviction_soft_grace_period,
                                         s.eviction_minimum_reclaim)


def dump(s: Settings) -> str:
    """The merged settings, for the log at -v 1 and above."""
    return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(s).items()},
                      sort_keys=True)
