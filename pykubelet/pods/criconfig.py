"""The CRI configs of a pod's sandbox and containers, built from its spec as the kubelet builds them.

Pure functions of the pod, the node's settings and what the sync resolved (the image, the env, the
mounts, the restart count): the labels and annotations they carry are what the sync reads back
(pods/labels.py), and the cgroup parent and log directory they name are where eviction and termination
find the pod again.
"""
from __future__ import annotations

import json
from pathlib import Path

from proto import api_pb2
from pykubelet.config import Settings
from pykubelet.pods import userns
from pykubelet.pods.labels import (
    CONTAINER_NAME,
    GRACE,
    HASH,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    PORTS,
    RESTART_COUNT,
    TERMINATION_MESSAGE_PATH,
    container_hash,
)
from pykubelet.pods.podspec import expand, parse_quantity, plain_env, qos_class, security_context, supplemental_groups

# what the kubelet masks and makes read-only in every unprivileged container (procMount Default)
MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                "/sys/devices/virtual/powercap"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
NAMESPACE_MODE = {True: api_pb2.NODE, False: api_pb2.POD}
CPU_PERIOD = 100_000
MIN_SHARES = 2


def cgroup_parent(pod: dict, settings: Settings) -> str:
    """The pod's cgroup under kubepods, by QoS class, as the kubelet names it for each cgroup driver."""
    qos, uid = qos_class(pod), pod["metadata"]["uid"]
    if settings.cgroup_driver == "systemd":
        uid_ = uid.replace("-", "_")
        if qos == "Guaranteed":
            return f"kubepods-pod{uid_}.slice"
        return f"kubepods-{qos.lower()}-pod{uid_}.slice"
    parts = [settings.cgroup_root.rstrip("/"), "kubepods"] + ([] if qos == "Guaranteed" else [qos.lower()])
    return "/".join(parts + [f"pod{uid}"])


def log_directory(pod: dict, settings: Settings) -> Path:
    m = pod["metadata"]
    return settings.pod_logs_dir / f"{m['namespace']}_{m['name']}_{m['uid']}"


def linux_resources(container: dict) -> api_pb2.LinuxContainerResources:
    res = container.get("resources", {})
    requests, limits = res.get("requests", {}), res.get("limits", {})
    out = api_pb2.LinuxContainerResources(cpu_period=CPU_PERIOD)
    cpu_request = requests.get("cpu", limits.get("cpu"))
    out.cpu_shares = max(MIN_SHARES, int(parse_quantity(cpu_request) * 1024)) if cpu_request else MIN_SHARES
    if "cpu" in limits:
        out.cpu_quota = max(1000, int(parse_quantity(limits["cpu"]) * CPU_PERIOD))
    if "memory" in limits:
        out.memory_limit_in_bytes = int(parse_quantity(limits["memory"]))
    return out


def seccomp(sc: dict) -> api_pb2.SecurityProfile | None:
    profile = sc.get("seccompProfile")
    if not profile or profile.get("type") == "Unconfined":
        return api_pb2.SecurityProfile(profile_type=api_pb2.SecurityProfile.Unconfined)
    if profile["type"] == "Localhost":
        return api_pb2.SecurityProfile(profile_type=api_pb2.SecurityProfile.Localhost,
                                       localhost_ref=profile.get("localhostProfile", ""))
    return api_pb2.SecurityProfile(profile_type=api_pb2.SecurityProfile.RuntimeDefault)


def namespace_options(pod: dict) -> api_pb2.NamespaceOption:
    spec = pod["spec"]
    return api_pb2.NamespaceOption(
        network=NAMESPACE_MODE[bool(spec.get("hostNetwork"))],
        pid=api_pb2.NODE if spec.get("hostPID") else
        (api_pb2.POD if spec.get("shareProcessNamespace") else api_pb2.CONTAINER),
        ipc=NAMESPACE_MODE[bool(spec.get("hostIPC"))])


def dns_config(pod: dict, settings: Settings) -> api_pb2.DNSConfig | None:
    """ClusterFirst: the cluster DNS and its search path; Default (or no cluster DNS): the runtime's (the
    host's); None: only the pod's dnsConfig, which is merged over the others as the kubelet does."""
    spec = pod["spec"]
    policy = spec.get("dnsPolicy", "ClusterFirst")
    if policy == "ClusterFirst" and spec.get("hostNetwork"):
        policy = "Default"
    if policy == "ClusterFirstWithHostNet":
        policy = "ClusterFirst"
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    if policy == "ClusterFirst" and settings.cluster_dns:
        domain, ns = settings.cluster_domain, pod["metadata"]["namespace"]
        servers = list(settings.cluster_dns)
        searches = [f"{ns}.svc.{domain}", f"svc.{domain}", domain] if domain else []
        options = ["ndots:5"]
    extra = spec.get("dnsConfig") or {}
    servers += [s for s in extra.get("nameservers", []) if s not in servers]
    searches += [s for s in extra.get("searches", []) if s not in searches]
    for opt in extra.get("options", []):
        text = f"{opt['name']}:{opt['value']}" if opt.get("value") is not None else opt["name"]
        options = [o for o in options if o.split(":")[0] != opt["name"]] + [text]
    if not (servers or searches or options):
        return None
    return api_pb2.DNSConfig(servers=servers, searches=searches, options=options)


def sandbox_config(pod: dict, settings: Settings, attempt: int = 0,
                   host_range: int | None = None) -> api_pb2.PodSandboxConfig:
    """`host_range`: the first host id of the pod's own user namespace (hostUsers: false; userns.py)."""
    meta, spec = pod["metadata"], pod["spec"]
    hostname = settings.node_name if spec.get("hostNetwork") else (spec.get("hostname") or meta["name"])[:63]
    ports = [api_pb2.PortMapping(protocol=api_pb2.Protocol.Value(p.get("protocol", "TCP")),
                                 container_port=p["containerPort"], host_port=p["hostPort"],
                                 host_ip=p.get("hostIP", ""))
             for c in spec.get("containers", []) for p in c.get("ports", []) if p.get("hostPort")]
    sc = spec.get("securityContext", {})
    privileged = any(c.get("securityContext", {}).get("privileged")
                     for c in spec.get("containers", []) + spec.get("initContainers", []))
    security = api_pb2.LinuxSandboxSecurityContext(
        namespace_options=namespace_options(pod), privileged=privileged,
        supplemental_groups=supplemental_groups(pod), seccomp=seccomp(security_context(pod, None)))
    if host_range is not None:
        ids = [api_pb2.IDMapping(container_id=0, host_id=host_range, length=userns.LENGTH)]
        security.namespace_options.userns_options.CopyFrom(
            api_pb2.UserNamespace(mode=api_pb2.NamespaceMode.POD, uids=ids, gids=ids))
    if "runAsUser" in sc:
        security.run_as_user.value = sc["runAsUser"]
    if "runAsGroup" in sc:
        security.run_as_group.value = sc["runAsGroup"]
    linux = api_pb2.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent(pod, settings), security_context=security,
                                          sysctls={s["name"]: s["value"] for s in sc.get("sysctls", [])})
    config = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                                            attempt=attempt),
        hostname=hostname, log_directory=str(log_directory(pod, settings)), port_mappings=ports,
        labels={**meta.get("labels", {}), POD_NAME: meta["name"], POD_NAMESPACE: meta["namespace"],
                POD_UID: meta["uid"]},
        annotations=meta.get("annotations", {}), linux=linux)
    dns = dns_config(pod, settings)
    if dns is not None:
        config.dns_config.CopyFrom(dns)
    return config


def container_config(pod: dict, container: dict, image_ref: str, restart: int,
                     sandbox: api_pb2.PodSandboxConfig, *, envs: dict[str, str] | None = None,
                     mounts: list[api_pb2.Mount] | None = None) -> api_pb2.ContainerConfig:
    """`envs` and `mounts`: the resolved env and the volume mounts (pykubelet/volumes/manager.py); not
    hashed, so a changed configMap does not restart the container."""
    meta, spec = pod["metadata"], pod["spec"]
    sc = security_context(pod, container)
    caps = sc.get("capabilities", {})
    privileged = bool(sc.get("privileged"))
    security = api_pb2.LinuxContainerSecurityContext(
        capabilities=api_pb2.Capability(add_capabilities=caps.get("add", []), drop_capabilities=caps.get("drop", [])),
        privileged=privileged, namespace_options=sandbox.linux.security_context.namespace_options,
        readonly_rootfs=bool(sc.get("readOnlyRootFilesystem")),
        supplemental_groups=supplemental_groups(pod),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False, seccomp=seccomp(sc),
        masked_paths=[] if privileged or sc.get("procMount") == "Unmasked" else MASKED_PATHS,
        readonly_paths=[] if privileged or sc.get("procMount") == "Unmasked" else READONLY_PATHS)
    if "runAsUser" in sc:
        security.run_as_user.value = sc["runAsUser"]
    if "runAsGroup" in sc:
        security.run_as_group.value = sc["runAsGroup"]
    env = plain_env(container) if envs is None else envs
    grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30))
    userns_options = security.namespace_options.userns_options
    if userns_options.uids:  # as the stock kubelet: a pod with a user namespace gets its volumes idmapped
        mounts = [_idmapped(m, userns_options) for m in mounts or []]
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=container["name"], attempt=restart),
        image=api_pb2.ImageSpec(image=image_ref, user_specified_image=container["image"]),
        command=[expand(a, env) for a in container.get("command", [])],
        args=[expand(a, env) for a in container.get("args", [])],
        working_dir=container.get("workingDir", ""),
        envs=[api_pb2.KeyValue(key=k, value=v.encode()) for k, v in env.items()],
        labels={POD_NAME: meta["name"], POD_NAMESPACE: meta["namespace"], POD_UID: meta["uid"],
                CONTAINER_NAME: container["name"]},
        annotations={HASH: container_hash(container), RESTART_COUNT: str(restart), GRACE: str(grace),
                     TERMINATION_MESSAGE_PATH: container.get("terminationMessagePath", "/dev/termination-log"),
                     **({PORTS: json.dumps(container["ports"])} if container.get("ports") else {})},
        log_path=f"{container['name']}/{restart}.log", mounts=mounts or [],
        stdin=bool(container.get("stdin")), stdin_once=bool(container.get("stdinOnce")), tty=bool(container.get("tty")),
        linux=api_pb2.LinuxContainerConfig(resources=linux_resources(container), security_context=security))


def _idmapped(mount: api_pb2.Mount, userns_options: api_pb2.UserNamespace) -> api_pb2.Mount:
    """A copy of `mount` seen through the pod's mappings: what root owns on the host, the pod's root owns."""
    out = api_pb2.Mount()
    out.CopyFrom(mount)
    out.uidMappings.extend(userns_options.uids)
    out.gidMappings.extend(userns_options.gids)
    return out
