"""What the kubelet's own cgroups are limited to, decided apart from writing it (pykubelet/pods/cgroups.py
writes it): the kubepods cgroup by node allocatable, the QoS cgroups, and each pod's cgroup by the pod's
requests and limits, with the stock kubelet's container manager's formulas (pkg/kubelet/cm: MilliCPUToShares,
MilliCPUToQuota, ResourceConfigForPod, getCgroupConfig), then the same values as cgroup v1 files, cgroup v2
files, or systemd unit properties.

Only what the stock kubelet sets is set: cpu shares, the CFS quota and its period, the memory limit and the
pids limit. Hugepages are left out: this node reports no hugepages capacity.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from pykubelet.api import quantity
from pykubelet.api.podmodel import Pod, Resources
from pykubelet.pods.podresources import pod_limits, pod_requests
from pykubelet.pods.podspec import parse_quantity, qos_class
from pynode_os.systemd import USEC_INFINITY

MIN_SHARES, MAX_SHARES, SHARES_PER_CPU = 2, 262144, 1024
QUOTA_PERIOD = 100000  # µs: the CFS period unless cpuCFSQuotaPeriod says otherwise
MIN_QUOTA = 1000  # µs
ENFORCE_PODS = "pods"


@dataclass(frozen=True)
class ResourceConfig:
    """A cgroup's limits as the kubelet's ResourceConfig: None leaves the setting as it is; cpu_quota -1 and
    pids -1 are no limit."""
    cpu_shares: int | None = None
    cpu_quota: int | None = None  # µs per cpu_period
    cpu_period: int | None = None  # µs
    memory: int | None = None  # bytes
    pids: int | None = None


def milli_cpu_to_shares(milli: int) -> int:
    if milli == 0:
        return MIN_SHARES
    return min(MAX_SHARES, max(MIN_SHARES, milli * SHARES_PER_CPU // 1000))


def milli_cpu_to_quota(milli: int, period: int) -> int:
    """0 for no limit (milli 0), else at least the kernel's 1ms."""
    if milli == 0:
        return 0
    return max(MIN_QUOTA, milli * period // 1000)


def shares_to_weight(shares: int) -> int:
    """cgroup v2's cpu.weight for v1 shares, as runc's and the kubelet's conversion: [2, 262144] to [1, 10000]."""
    return 1 + ((shares - 2) * 9999) // 262142


def pod_config(pod: Pod, pids_limit: int = -1, period: int = QUOTA_PERIOD) -> ResourceConfig:
    """ResourceConfigForPod, with podPidsLimit as EnsureExists adds it: shares from the requests; the quota and
    the memory limit only when every container has that limit, or the pod-level resources do; a BestEffort
    pod the minimal shares alone. cpuCFSQuota is taken as true: containers get their quota whatever it says."""
    qos = qos_class(pod)
    pids = pids_limit if pids_limit > 0 else None
    if qos == "BestEffort":
        return ResourceConfig(cpu_shares=MIN_SHARES, pids=pids)
    spec = pod.spec
    everyone = spec.containers + spec.init_containers
    pod_level: Resources = spec.resources or Resources()
    cpu_declared = all(parse_quantity(c.resources.limits.get("cpu", "0")) for c in everyone) \
        or bool(parse_quantity(pod_level.limits.get("cpu", "0")))
    memory_declared = all(parse_quantity(c.resources.limits.get("memory", "0")) for c in everyone) \
        or bool(parse_quantity(pod_level.limits.get("memory", "0")))
    reqs, limits = pod_requests(pod), pod_limits(pod)
    shares = milli_cpu_to_shares(quantity.milli_value(reqs.get("cpu", Decimal(0))))
    quota = milli_cpu_to_quota(quantity.milli_value(limits.get("cpu", Decimal(0))), period)
    memory = quantity.value(limits.get("memory", Decimal(0)))
    if qos == "Guaranteed":
        return ResourceConfig(cpu_shares=shares, cpu_quota=quota, cpu_period=period, memory=memory, pids=pids)
    return ResourceConfig(cpu_shares=shares, cpu_quota=quota if cpu_declared else None,
                          cpu_period=period if cpu_declared else None, memory=memory if memory_declared else None,
                          pids=pids)


def kubepods_config(capacity: Mapping[str, int], enforce: Iterable[str], system_reserved: Mapping[str, int],
                    kube_reserved: Mapping[str, int]) -> ResourceConfig:
    """The kubepods cgroup's limits, as createNodeAllocatableCgroups and enforceNodeAllocatableCgroups set them:
    the node's capacity (cpu in millicores, memory in bytes, pid), less systemReserved and kubeReserved when
    enforceNodeAllocatable has "pods". The hard eviction thresholds are not taken off, unlike the Node's
    allocatable: the kernel's OOM killer acts only past allocatable plus the threshold, after eviction."""
    enforced = ENFORCE_PODS in enforce

    def left(name: str) -> int:
        value = capacity[name]
        if enforced:
            value -= system_reserved.get(name, 0) + kube_reserved.get(name, 0)
        return max(0, value)
    return ResourceConfig(cpu_shares=milli_cpu_to_shares(left("cpu")), memory=left("memory"), pids=left("pid"))


def reserved_config(reserved: Mapping[str, int], compressible_only: bool) -> ResourceConfig:
    """getCgroupConfig of systemReserved or kubeReserved, for their cgroups: cpu shares, and unless only the
    compressible resources are enforced, the memory and pids limits."""
    shares = milli_cpu_to_shares(reserved["cpu"]) if "cpu" in reserved else None
    if compressible_only:
        return ResourceConfig(cpu_shares=shares)
    return ResourceConfig(cpu_shares=shares, memory=reserved.get("memory"), pids=reserved.get("pid"))


def qos_configs(pods: Iterable[Pod]) -> dict[str, ResourceConfig]:
    """The QoS cgroups' cpu shares as the kubelet's UpdateCgroups sets them: besteffort the minimal shares,
    burstable the sum of its pods' cpu requests."""
    milli = sum(quantity.milli_value(pod_requests(p).get("cpu", Decimal(0)))
                for p in pods if qos_class(p) == "Burstable")
    return {"burstable": ResourceConfig(cpu_shares=milli_cpu_to_shares(milli)),
            "besteffort": ResourceConfig(cpu_shares=MIN_SHARES)}


# --- the values as files and as systemd properties ---------------------------------------------------------

def v1_files(rc: ResourceConfig) -> list[tuple[str, str, str]]:
    """(controller, file, value) in the order runc's fs manager writes them: the period before the quota."""
    out = []
    if rc.cpu_shares is not None:
        out.append(("cpu", "cpu.shares", str(rc.cpu_shares)))
    if rc.cpu_period is not None:
        out.append(("cpu", "cpu.cfs_period_us", str(rc.cpu_period)))
    if rc.cpu_quota:  # 0: as it is, as runc's
        out.append(("cpu", "cpu.cfs_quota_us", str(rc.cpu_quota if rc.cpu_quota > 0 else -1)))
    if rc.memory:
        out.append(("memory", "memory.limit_in_bytes", str(rc.memory)))
    if rc.pids is not None:
        out.append(("pids", "pids.max", "max" if rc.pids < 0 else str(rc.pids)))
    return out


def v2_files(rc: ResourceConfig) -> list[tuple[str, str, str]]:
    """(controller, file, value) for a cgroup v2 cgroup, converted as runc's fs2 does."""
    out = []
    if rc.cpu_shares is not None:
        out.append(("cpu", "cpu.weight", str(shares_to_weight(rc.cpu_shares))))
    if rc.cpu_quota is not None or rc.cpu_period is not None:
        period = rc.cpu_period or QUOTA_PERIOD
        quota = rc.cpu_quota or 0
        out.append(("cpu", "cpu.max", f"{quota if quota > 0 else 'max'} {period}"))
    if rc.memory:
        out.append(("memory", "memory.max", str(rc.memory)))
    if rc.pids is not None:
        out.append(("pids", "pids.max", "max" if rc.pids < 0 else str(rc.pids)))
    return out


def systemd_properties(rc: ResourceConfig, v2: bool) -> list[tuple[str, tuple[str, object]]]:
    """The unit properties runc's systemd managers give a slice for these values: CPUWeight, MemoryMax on
    cgroup v2, CPUShares, MemoryLimit on v1; the quota per second rounded up to systemd's 10ms."""
    out: list[tuple[str, tuple[str, object]]] = []
    if rc.cpu_shares is not None:
        out.append(("CPUWeight", ("t", shares_to_weight(rc.cpu_shares))) if v2
                   else ("CPUShares", ("t", rc.cpu_shares)))
    if rc.cpu_quota is not None and rc.cpu_quota != 0:
        per_sec = USEC_INFINITY
        if rc.cpu_quota > 0:
            per_sec = rc.cpu_quota * 1000000 // (rc.cpu_period or QUOTA_PERIOD)
            if per_sec % 10000:
                per_sec = (per_sec // 10000 + 1) * 10000
        out.append(("CPUQuotaPerSecUSec", ("t", per_sec)))
    if rc.memory:
        out.append(("MemoryMax" if v2 else "MemoryLimit", ("t", rc.memory)))
    if rc.pids is not None:
        out.append(("TasksMax", ("t", USEC_INFINITY if rc.pids < 0 else rc.pids)))
    return out
