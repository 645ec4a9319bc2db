"""The CRI configs of a pod's sandbox and containers, built from its spec as the kubelet builds them.

Pure functions of the pod, the node's settings and what the sync resolved (the image, the env, the
mounts, the restart count): the labels and annotations they carry are what the sync reads back
(pods/labels.py), and the cgroup parent and log directory they name are where eviction and termination
find the pod again.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from proto import api_pb2
from pykubelet.api import quantity
from pykubelet.api.podmodel import Container, Pod, Resources
from pykubelet.config import Settings
from pykubelet.pods import hosts, userns
from pykubelet.pods.cgroupconfig import QUOTA_PERIOD, milli_cpu_to_quota, milli_cpu_to_shares
from pykubelet.pods.dns import PodDNS
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
    TERMINATION_MESSAGE_POLICY,
    container_hash,
)
from pykubelet.pods.oomscore import container_oom_score_adj
from pykubelet.pods.podspec import expand, parse_quantity, plain_env, qos_class, security_context, supplemental_groups

log = logging.getLogger(__name__)

# what the kubelet masks and makes read-only in every unprivileged container (procMount Default)
MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                "/sys/devices/virtual/powercap"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
NAMESPACE_MODE = {True: api_pb2.NODE, False: api_pb2.POD}


def cgroup_parent(pod: Pod, settings: Settings) -> str:
    """The pod's cgroup under kubepods, by QoS class, as the kubelet names it for each cgroup driver: with
    systemd the pod slice's expanded path (/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
    with "_" for "-">.slice), as the stock kubelet sends it; containerd and pyruntime-cri take its last part."""
    qos, uid = qos_class(pod), pod.uid
    if settings.cgroup_driver == "systemd":
        from pykubelet.pods.slices import pod_slice_path
        return pod_slice_path(pod, settings)
    parts = [settings.cgroup_root.rstrip("/"), "kubepods"] + ([] if qos == "Guaranteed" else [qos.lower()])
    return "/".join(parts + [f"pod{uid}"])


def log_directory(pod: Pod, settings: Settings) -> Path:
    m = pod.metadata
    return settings.pod_logs_dir / f"{m.namespace}_{m.name}_{m.uid}"


def linux_resources(resources: Resources, pod_level: Resources | None = None) -> api_pb2.LinuxContainerResources:
    """A container's (or with pod-level resources, the pod's) cgroup settings; a container without a cpu or
    memory limit of its own has the pod-level one, as the stock kubelet's generateLinuxContainerResources."""
    requests, limits = resources.requests, resources.limits
    if pod_level is not None:
        limits = {**{k: v for k, v in pod_level.limits.items() if k in ("cpu", "memory")}, **limits}
    out = api_pb2.LinuxContainerResources(cpu_period=QUOTA_PERIOD)
    cpu_request = requests.get("cpu", limits.get("cpu"))
    out.cpu_shares = milli_cpu_to_shares(quantity.milli_value(parse_quantity(cpu_request)) if cpu_request else 0)
    if "cpu" in limits:  # a limit of 0 is none, as the kubelet's MilliCPUToQuota
        out.cpu_quota = milli_cpu_to_quota(quantity.milli_value(parse_quantity(limits["cpu"])), QUOTA_PERIOD)
    if "memory" in limits:
        out.memory_limit_in_bytes = quantity.value(parse_quantity(limits["memory"]))
    return out


def seccomp(profile: dict | None) -> api_pb2.SecurityProfile | None:
    if not profile or profile.get("type") == "Unconfined":
        return api_pb2.SecurityProfile(profile_type=api_pb2.SecurityProfile.Unconfined)
    if profile["type"] == "Localhost":
        return api_pb2.SecurityProfile(profile_type=api_pb2.SecurityProfile.Localhost,
                                       localhost_ref=profile.get("localhostProfile", ""))
    return api_pb2.SecurityProfile(profile_type=api_pb2.SecurityProfile.RuntimeDefault)


def namespace_options(pod: Pod) -> api_pb2.NamespaceOption:
    spec = pod.spec
    return api_pb2.NamespaceOption(
        network=NAMESPACE_MODE[spec.host_network],
        pid=api_pb2.NODE if spec.host_pid else (api_pb2.POD if spec.share_process_namespace else api_pb2.CONTAINER),
        ipc=NAMESPACE_MODE[spec.host_ipc])


def sandbox_config(pod: Pod, settings: Settings, attempt: int = 0, host_range: int | None = None,
                   dns: PodDNS | None = None) -> api_pb2.PodSandboxConfig:
    """`host_range`: the first host id of the pod's own user namespace (hostUsers: false; userns.py); `dns`: the
    pod's DNS (pods/dns.py), which the kubelet always gives; without it, the runtime's own (the host's). Raises
    hosts.HostnameError."""
    meta, spec = pod.metadata, pod.spec
    hostname = hosts.kernel_hostname(pod, settings.cluster_domain)
    ports = [api_pb2.PortMapping(protocol=api_pb2.Protocol.Value(p.protocol), container_port=p.container_port,
                                 host_port=p.host_port, host_ip=p.host_ip)
             for c in spec.containers for p in c.ports if p.host_port]
    sc = spec.security_context
    # as HasPrivilegedContainer: an ephemeral container too, for a sandbox made again once one was added
    privileged = any(c.security_context.privileged for c in spec.all_containers + spec.ephemeral_containers)
    security = api_pb2.LinuxSandboxSecurityContext(
        namespace_options=namespace_options(pod), privileged=privileged,
        supplemental_groups=supplemental_groups(pod), seccomp=seccomp(sc.seccomp_profile))
    if host_range is not None:
        ids = [api_pb2.IDMapping(container_id=0, host_id=host_range, length=userns.LENGTH)]
        security.namespace_options.userns_options.CopyFrom(
            api_pb2.UserNamespace(mode=api_pb2.NamespaceMode.POD, uids=ids, gids=ids))
    if sc.run_as_user is not None:
        security.run_as_user.value = sc.run_as_user
    if sc.run_as_group is not None:
        security.run_as_group.value = sc.run_as_group
    linux = api_pb2.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent(pod, settings), security_context=security,
                                          sysctls=dict(sc.sysctls))
    if spec.resources is not None:  # the pod-level resources, for a runtime that sizes the pod's cgroup by them
        linux.resources.CopyFrom(linux_resources(spec.resources))
    config = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=meta.name, namespace=meta.namespace, uid=meta.uid, attempt=attempt),
        hostname=hostname, log_directory=str(log_directory(pod, settings)), port_mappings=ports,
        labels={**meta.labels, POD_NAME: meta.name, POD_NAMESPACE: meta.namespace, POD_UID: meta.uid},
        annotations=meta.annotations, linux=linux)
    if dns is not None:
        config.dns_config.CopyFrom(api_pb2.DNSConfig(servers=dns.servers, searches=dns.searches, options=dns.options))
    return config


def container_config(pod: Pod, container: Container, image_ref: str, restart: int,
                     sandbox: api_pb2.PodSandboxConfig, *, memory_capacity: int, envs: dict[str, str] | None = None,
                     mounts: list[api_pb2.Mount] | None = None, target_id: str = "") -> api_pb2.ContainerConfig:
    """`memory_capacity`: the node's memory in bytes, which a Burstable container's oom_score_adj is a share
    of (pods/oomscore.py). `envs` and `mounts`: the resolved env and the volume mounts
    (pykubelet/volumes/manager.py); not hashed, so a changed configMap does not restart the container.
    `target_id`: an ephemeral container's target, whose pid namespace it joins (TARGET), unless the pod's
    containers share one already (the pod's or the node's), as the kubelet's generateLinuxContainerConfig."""
    meta, own = pod.metadata, container.security_context
    sc = security_context(pod, container)
    unmasked = own.privileged or own.proc_mount == "Unmasked"
    security = api_pb2.LinuxContainerSecurityContext(
        capabilities=api_pb2.Capability(add_capabilities=own.capabilities_add,
                                        drop_capabilities=own.capabilities_drop),
        privileged=own.privileged, namespace_options=sandbox.linux.security_context.namespace_options,
        readonly_rootfs=own.read_only_root_filesystem,
        supplemental_groups=supplemental_groups(pod),
        no_new_privs=own.allow_privilege_escalation is False, seccomp=seccomp(sc.seccomp_profile),
        masked_paths=[] if unmasked else MASKED_PATHS, readonly_paths=[] if unmasked else READONLY_PATHS)
    if target_id and security.namespace_options.pid == api_pb2.CONTAINER:
        security.namespace_options.pid, security.namespace_options.target_id = api_pb2.TARGET, target_id
    if sc.run_as_user is not None:
        security.run_as_user.value = sc.run_as_user
    if sc.run_as_group is not None:
        security.run_as_group.value = sc.run_as_group
    env = plain_env(container) if envs is None else envs
    grace = meta.deletion_grace_period_seconds
    if grace is None:
        grace = pod.spec.termination_grace_period_seconds
    userns_options = security.namespace_options.userns_options
    if userns_options.uids:  # as the stock kubelet: a pod with a user namespace gets its volumes idmapped
        mounts = [_idmapped(m, userns_options) for m in mounts or []]
    resources = linux_resources(container.resources, pod.spec.resources)
    resources.oom_score_adj = container_oom_score_adj(pod, container, memory_capacity)
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=container.name, attempt=restart),
        image=api_pb2.ImageSpec(image=image_ref, user_specified_image=container.image),
        command=[expand(a, env) for a in container.command], args=[expand(a, env) for a in container.args],
        working_dir=container.working_dir,
        envs=[api_pb2.KeyValue(key=k, value=v.encode()) for k, v in env.items()],
        labels={POD_NAME: meta.name, POD_NAMESPACE: meta.namespace, POD_UID: meta.uid, CONTAINER_NAME: container.name},
        annotations={HASH: container_hash(container), RESTART_COUNT: str(restart), GRACE: str(grace),
                     TERMINATION_MESSAGE_PATH: container.termination_message_path,
                     TERMINATION_MESSAGE_POLICY: container.termination_message_policy,
                     # as the pod gave them (the stock kubelet's annotation is its JSON of the ports)
                     **({PORTS: json.dumps(container.raw["ports"])} if container.ports else {})},
        log_path=f"{container.name}/{restart}.log", mounts=mounts or [],
        stdin=container.stdin, stdin_once=container.stdin_once, tty=container.tty,
        linux=api_pb2.LinuxContainerConfig(resources=resources, security_context=security))


def _idmapped(mount: api_pb2.Mount, userns_options: api_pb2.UserNamespace) -> api_pb2.Mount:
    """A copy of `mount` seen through the pod's mappings: what root owns on the host, the pod's root owns."""
    out = api_pb2.Mount()
    out.CopyFrom(mount)
    out.uidMappings.extend(userns_options.uids)
    out.gidMappings.extend(userns_options.gids)
    return out
