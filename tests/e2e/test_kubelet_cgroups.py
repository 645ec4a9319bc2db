"""The cgroups pykubelet makes and limits, as the stock kubelet's container manager, read on the host under the
cgroupfs driver (the runtimes here use it) on either cgroup version: kubepods has node allocatable's limits
(capacity less systemReserved and kubeReserved, the eviction threshold not taken off), besteffort the
minimal cpu shares, burstable the sum of its pods' cpu requests, and a pod's own cgroup its limits
(ResourceConfigForPod) and podPidsLimit: a Guaranteed pod's summed over its containers, a pod with
pod-level resources (spec.resources) by those. Each runs on containerd 1.6 and on pyruntime-cri."""
from __future__ import annotations

import os
from pathlib import Path

from tests.kit.controlplane import ControlPlane
from tests.kit.kubelet_node import BUSYBOX, apply, delete, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-cgroups"
NODE_IP = "10.201.0.47"
MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
PIDS_LIMIT = 321
KUBELET_CONFIG = {"systemReserved": {"cpu": "500m", "memory": "256Mi", "pid": "1000"},
                  "kubeReserved": {"memory": "128Mi"}, "podPidsLimit": PIDS_LIMIT}
ROOT = Path("/sys/fs/cgroup")
V2 = (ROOT / "cgroup.controllers").exists()
SLEEP = ["sleep", "3600"]


def read(cgroup: str, v1: str, v2: str) -> str:
    """A file of the cgroup at `cgroup` (kubepods/...): `v1` as controller/file on a v1 host, `v2` on a unified one."""
    if V2:
        return (ROOT / cgroup / v2).read_text().strip()
    controller, name = v1.split("/", 1)
    return (ROOT / controller / cgroup / name).read_text().strip()


def cpu_shares(cgroup: str) -> int:
    """cpu.shares, or on v2 the v1 shares whose weight cpu.weight is (their conversion's inverse is not exact:
    compare weights)."""
    return int(read(cgroup, "cpu/cpu.shares", "cpu.weight"))


def shares(value: int) -> int:
    """What cpu_shares reads for `value` shares."""
    return 1 + ((value - 2) * 9999) // 262142 if V2 else value


def memory_limit(cgroup: str) -> int:
    value = read(cgroup, "memory/memory.limit_in_bytes", "memory.max")
    return -1 if value == "max" or int(value) >= 1 << 62 else int(value)


def cpu_quota(cgroup: str) -> int:
    """µs per 100ms period, -1: none."""
    if V2:
        quota, period = read(cgroup, "", "cpu.max").split()
        assert period == "100000"
        return -1 if quota == "max" else int(quota)
    assert read(cgroup, "cpu/cpu.cfs_period_us", "") == "100000"
    return int(read(cgroup, "cpu/cpu.cfs_quota_us", ""))


def pids_max(cgroup: str) -> str:
    return read(cgroup, "pids/pids.max", "pids.max")


def running(cp: ControlPlane, tmp_path, name: str, container: dict, **spec) -> dict:
    apply(cp, tmp_path, kit_pod_spec(NODE, name, {"name": "c", "image": BUSYBOX, "command": SLEEP, **container},
                                     **spec))
    return wait_pod(cp, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running")


def test_kubepods_has_node_allocatable_and_besteffort_the_minimal_shares(kubelet, kubepods):
    mem_total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:"))
    pid_cap = min(int(Path(f"/proc/sys/kernel/{n}").read_text()) for n in ("pid_max", "threads-max"))
    cpus = len(os.sched_getaffinity(0))
    allocatable = (mem_total - 384 * MIB) // PAGE * PAGE
    # the kubelet limits kubepods before its first pod, which may be after it registers
    wait_for("kubepods limited", lambda: (ROOT / ("" if V2 else "memory") / "kubepods").is_dir()
             and memory_limit("kubepods") == allocatable)
    assert cpu_shares("kubepods") == shares((cpus * 1000 - 500) * 1024 // 1000)
    assert pids_max("kubepods") == str(pid_cap - 1000)
    assert cpu_shares("kubepods/besteffort") == shares(2)


def test_a_guaranteed_pods_cgroup_has_its_containers_limits(control_plane, kubelet, kubepods, tmp_path):
    limits = {"cpu": "250m", "memory": "64Mi"}
    pod = running(control_plane, tmp_path, "guaranteed", {"resources": {"requests": limits, "limits": limits}},
                  initContainers=[{"name": "init", "image": BUSYBOX, "command": ["true"],
                                   "resources": {"requests": limits, "limits": limits}}])
    assert pod["status"]["qosClass"] == "Guaranteed"
    cgroup = f"kubepods/pod{pod['metadata']['uid']}"
    assert (cpu_quota(cgroup), memory_limit(cgroup)) == (25000, 64 * MIB)  # the init container's runs alone
    assert cpu_shares(cgroup) == shares(256)
    assert pids_max(cgroup) == str(PIDS_LIMIT)
    delete(control_plane, "guaranteed")


def test_pod_level_resources_limit_the_pods_cgroup(control_plane, kubelet, kubepods, tmp_path):
    pod = running(control_plane, tmp_path, "pod-level", {},
                  resources={"requests": {"cpu": "300m", "memory": "32Mi"},
                             "limits": {"cpu": "600m", "memory": "96Mi"}})
    assert pod["status"]["qosClass"] == "Burstable"
    # what the PLR Pod InPlace Resize specs check first: the pod's granted requests, and its resources
    assert pod["status"]["allocatedResources"] == {"cpu": "300m", "memory": "32Mi"}
    assert pod["status"]["resources"] == {"requests": {"cpu": "300m", "memory": "32Mi"},
                                          "limits": {"cpu": "600m", "memory": "96Mi"}}
    cgroup = f"kubepods/burstable/pod{pod['metadata']['uid']}"
    assert (cpu_quota(cgroup), memory_limit(cgroup)) == (60000, 96 * MIB)
    assert cpu_shares(cgroup) == shares(300 * 1024 // 1000)
    assert cpu_shares("kubepods/burstable") == shares(300 * 1024 // 1000)  # the one burstable pod's request
    delete(control_plane, "pod-level")
