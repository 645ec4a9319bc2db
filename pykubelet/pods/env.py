"""A container's environment as the kubelet builds it: envFrom first, then env in order (an env entry
overrides an envFrom key); each plain value has its $(VAR) references expanded against what is defined
so far; valueFrom entries are resolved from configMaps and secrets (read as the node, pykubelet/volumes/
objects.py), the pod's own fields (fieldRef) and its containers' resources (resourceFieldRef). The
downward API's field and resource values are shared with the downwardAPI volumes, so both agree.

The service environment variables (FOO_SERVICE_HOST, FOO_PORT_80_TCP_ADDR...) are the kubelet's
getServiceEnvVarMap: the master `kubernetes` service of namespace default always, the pod's namespace's
services when enableServiceLinks (default true); they can be referenced by $(VAR) and an explicit env or
envFrom entry of the same name wins. A missing configMap or secret that is not optional, or a missing key,
is a ContainerConfigError whose message the container's waiting reason CreateContainerConfigError carries,
as upstream's. EnvSource holds what resolving needs on this node (the API client, the Services, the
node's IP and allocatable resources): the pod sync asks it, and the volume manager only makes volumes.
"""
from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Callable
from decimal import Decimal

from pykubelet.api import quantity
from pykubelet.api.podmodel import Container, Pod
from pykubelet.config import Settings
from pykubelet.pods.podspec import expand, is_static, parse_quantity
from pykubelet.volumes import objects
from pykubelet.volumes.errors import ContainerConfigError


def _format_map(m: dict[str, str]) -> str:
    """fieldpath.FormatMap: sorted key="value" lines, values quoted as Go's strconv.Quote."""
    return "\n".join(f"{k}={_go_quote(m[k])}" for k in sorted(m))


def _go_quote(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def field_value(pod: Pod, path: str, *, host_ips: list[str] | None = None, pod_ips: list[str] | None = None) -> str:
    """The downward API value of `path` (a fieldRef.fieldPath) for `pod`."""
    meta, spec = pod.metadata, pod.spec
    if path.endswith("']") and "['" in path:
        base, key = path[:-2].split("['", 1)
        if base == "metadata.labels":
            return meta.labels.get(key, "")
        if base == "metadata.annotations":
            return meta.annotations.get(key, "")
        raise ContainerConfigError(f"fieldPath {path!r} does not support subscript")
    host_ips, pod_ips = host_ips or [], pod_ips or []
    simple = {"metadata.name": lambda: meta.name, "metadata.namespace": lambda: meta.namespace,
              "metadata.uid": lambda: meta.uid, "metadata.labels": lambda: _format_map(meta.labels),
              "metadata.annotations": lambda: _format_map(meta.annotations),
              "spec.nodeName": lambda: spec.node_name,
              "spec.serviceAccountName": lambda: spec.service_account_name,
              "status.hostIP": lambda: host_ips[0] if host_ips else "",
              "status.hostIPs": lambda: ",".join(host_ips),
              "status.podIP": lambda: pod_ips[0] if pod_ips else "",
              "status.podIPs": lambda: ",".join(pod_ips)}
    if path not in simple:
        raise ContainerConfigError(f"unsupported fieldPath: {path}")
    return simple[path]()


def resource_value(pod: Pod, container: Container | None, ref: dict, allocatable: Callable[[], dict[str, str]]) -> str:
    """A resourceFieldRef's value: the container's request or limit (limits default to the node's
    allocatable, as the kubelet's), divided by `divisor` and rounded up."""
    name = ref.get("containerName")
    if name:
        container = next((c for c in pod.spec.containers + pod.spec.init_containers if c.name == name), None)
        if container is None:
            raise ContainerConfigError(f"container {name!r} not found in pod {pod.metadata.name}")
    if container is None:
        raise ContainerConfigError("resourceFieldRef.containerName is required here")
    resource = ref["resource"]
    kind, _, res = resource.partition(".")
    if kind not in ("limits", "requests") or res not in ("cpu", "memory", "ephemeral-storage"):
        raise ContainerConfigError(f"unsupported container resource : {resource}")
    value = (container.resources.limits if kind == "limits" else container.resources.requests).get(res)
    if value is None and kind == "limits":
        value = allocatable().get(res)
    amount = parse_quantity(value) if value is not None else Decimal(0)
    divisor = parse_quantity(ref.get("divisor") or "1")
    if divisor == 0:
        divisor = Decimal(1)
    if res == "cpu":  # upstream works in millicores: ceil(milli(value) / milli(divisor))
        return str(math.ceil(quantity.milli_value(amount) / quantity.milli_value(divisor)))
    return str(math.ceil(quantity.value(amount) / quantity.value(divisor)))


MASTER_SERVICES = ("kubernetes",)


def _env_name(name: str) -> str:
    return name.replace("-", "_").upper()


def service_env(services: list[dict], namespace: str, enable_links: bool) -> dict[str, str]:
    """The environment a pod of `namespace` gets from `services` (Service dicts of every namespace), as
    the kubelet's getServiceEnvVarMap and envvars.FromServices build it."""
    chosen: dict[str, dict] = {}
    for svc in services:
        meta, spec = svc["metadata"], svc.get("spec") or {}
        if spec.get("clusterIP") in (None, "", "None") or not spec.get("ports"):
            continue
        name = meta["name"]
        if meta.get("namespace") == "default" and name in MASTER_SERVICES:
            chosen.setdefault(name, svc)
        elif meta.get("namespace") == namespace and enable_links:
            chosen[name] = svc
    env: dict[str, str] = {}
    for name, svc in chosen.items():
        ip, ports, prefix = svc["spec"]["clusterIP"], svc["spec"]["ports"], _env_name(name)
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{_env_name(port['name'])}"] = str(port["port"])
        host = f"[{ip}]" if ":" in ip else ip
        for i, port in enumerate(ports):  # the Docker link variables
            proto = (port.get("protocol") or "TCP").lower()
            url = f"{proto}://{host}:{port['port']}"
            if i == 0:
                env[f"{prefix}_PORT"] = url
            each = f"{prefix}_PORT_{port['port']}_{proto.upper()}"
            env.update({each: url, f"{each}_PROTO": proto, f"{each}_PORT": str(port["port"]), f"{each}_ADDR": ip})
    return env


def valid_name(name: str) -> bool:
    """An env var name the runtime can set (the relaxed rule of the API: printable ASCII, no '=')."""
    return bool(name) and all(32 <= ord(ch) <= 126 for ch in name) and "=" not in name


def container_env(pod: Pod, container: Container, client, *, host_ips: list[str], pod_ips: list[str],
                  allocatable: Callable[[], dict[str, str]],
                  warn: Callable[[str, str], None] = lambda reason, message: None,
                  services: dict[str, str] | None = None) -> dict[str, str]:
    """The container's env, resolved (insertion order: envFrom keys, then env entries, then the service
    variables (see service_env) that neither defines)."""
    services = services or {}
    namespace = pod.metadata.namespace
    cache: dict[tuple[str, str], dict[str, bytes] | None] = {}

    def read(kind: str, name: str) -> dict[str, bytes] | None:
        if (kind, name) not in cache:
            try:
                fetch = objects.config_map if kind == "configmap" else objects.secret
                cache[kind, name] = fetch(client, namespace, name)
            except objects.ObjectError as e:
                raise ContainerConfigError(str(e)) from e
        return cache[kind, name]

    env: dict[str, str] = {}
    for env_from in container.env_from:
        kind, ref = ("configmap", env_from["configMapRef"]) if "configMapRef" in env_from else \
            ("secret", env_from.get("secretRef", {}))
        data = read(kind, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ContainerConfigError(str(objects.not_found(kind, ref["name"])))
        invalid = []
        for key, value in data.items():
            name = env_from.get("prefix", "") + key
            if not valid_name(name):
                invalid.append(name)
                continue
            env[name] = value.decode(errors="replace")
        if invalid:
            warn("InvalidEnvironmentVariableNames",
                 f"Keys [{', '.join(sorted(invalid))}] from the EnvFrom {kind} {namespace}/{ref['name']} were "
                 "skipped since they are considered invalid environment variable names.")
    for var in container.env:
        name, source = var.name, var.value_from
        if var.value or source is None:
            env[name] = expand(var.value, ChainMap(env, services))
            continue
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], host_ips=host_ips, pod_ips=pod_ips)
        elif "resourceFieldRef" in source:
            env[name] = resource_value(pod, container, source["resourceFieldRef"], allocatable)
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind, ref = ("configmap", source["configMapKeyRef"]) if "configMapKeyRef" in source else \
                ("secret", source["secretKeyRef"])
            data = read(kind, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise ContainerConfigError(str(objects.not_found(kind, ref["name"])))
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                label = "ConfigMap" if kind == "configmap" else "Secret"
                raise ContainerConfigError(f"couldn't find key {ref['key']} in {label} {namespace}/{ref['name']}")
            env[name] = data[ref["key"]].decode(errors="replace")
        else:
            raise ContainerConfigError(f"env {name!r}: unsupported valueFrom {sorted(source)}")
    for key, text in services.items():
        env.setdefault(key, text)
    return env


class EnvSource:
    """Where the containers' env comes from on this node: the API's configMaps, secrets and Services (read
    as the node), the node's IP and its allocatable resources (the default limits of resourceFieldRef)."""

    def __init__(self, client, settings: Settings, allocatable: Callable[[], dict[str, str]],
                 services: Callable[[], list[dict] | None] | None = None) -> None:
        # services: every Service (dicts) for the service env vars, None until first listed; without it
        # (standalone mode) there are none
        self.client, self.settings, self.allocatable, self.services = client, settings, allocatable, services

    def resolve(self, pod: Pod, container: Container, *, pod_ips: list[str],
                warn: Callable[[str, str], None]) -> dict[str, str]:
        """The container's env (see container_env); raises ContainerConfigError."""
        host_ips = [self.settings.node_ip] if self.settings.node_ip else []
        if not pod_ips and pod.spec.host_network:
            pod_ips = host_ips  # the pod's IPs are the node's, as its status says
        return container_env(pod, container, self.client, host_ips=host_ips, pod_ips=pod_ips,
                             allocatable=self.allocatable, warn=warn, services=self.service_env(pod))

    def service_env(self, pod: Pod) -> dict[str, str]:
        if self.services is None:
            return {}
        services = self.services()
        if services is None:
            if not is_static(pod):  # as the kubelet: no env at all rather than one that misses services
                raise ContainerConfigError("services have not yet been read at least once, cannot construct "
                                           "envvars")
            services = []  # as the kubelet: a static pod may be the API server the services come from
        return service_env(services, pod.metadata.namespace, pod.spec.enable_service_links)
