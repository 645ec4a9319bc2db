"""The kubelet's cgroup limits as the stock container manager's formulas give them (pkg/kubelet/cm: helpers_linux.go
MilliCPUToShares, MilliCPUToQuota, ResourceConfigForPod; node_container_manager_linux.go), and as files on
either cgroup version, written by NodeCgroups into a directory standing for the cgroup root."""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from pykubelet.api.podmodel import parse_pod
from pykubelet.config import ConfigError, Settings, load_file
from pykubelet.pods import cgroupconfig as cc
from pykubelet.pods import nodecgroups
from pykubelet.pods.cgroupconfig import ResourceConfig
from pykubelet.pods.nodecgroups import NodeCgroups

UID = "0b5d2e3c-1111-2222-3333-444455556666"


def pod(*containers: dict, resources: dict | None = None, init: tuple[dict, ...] = (), overhead=None):
    def c(i, r, **kw):
        return {"name": f"c{i}", "image": "i", "resources": r, **kw}
    spec: dict = {"containers": [c(i, r) for i, r in enumerate(containers)],
                  "initContainers": [c(f"i{i}", r.pop("_r"), **r) for i, r in enumerate(init)]}
    if resources is not None:
        spec["resources"] = resources
    if overhead is not None:
        spec["overhead"] = overhead
    return parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": UID}, "spec": spec})


@pytest.mark.parametrize(("milli", "shares"), [(0, 2), (1, 2), (100, 102), (1000, 1024), (2500, 2560),
                                               (300000, 262144)])
def test_milli_cpu_to_shares(milli, shares):
    assert cc.milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(("milli", "quota"), [(0, 0), (5, 1000), (250, 25000), (1500, 150000)])
def test_milli_cpu_to_quota(milli, quota):
    assert cc.milli_cpu_to_quota(milli, 100000) == quota


@pytest.mark.parametrize(("shares", "weight"), [(2, 1), (1024, 39), (2048, 79), (262144, 10000)])
def test_shares_to_weight_as_the_kubelets(shares, weight):
    assert cc.shares_to_weight(shares) == weight == 1 + ((shares - 2) * 9999) // 262142


G = {"requests": {"cpu": "500m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}


def test_a_guaranteed_pod_has_its_limits_summed():
    rc = cc.pod_config(pod(G, G), pids_limit=100)
    assert rc == ResourceConfig(cpu_shares=1024, cpu_quota=100000, cpu_period=100000, memory=256 << 20, pids=100)


def test_a_burstable_pod_gets_a_limit_only_when_every_container_has_it():
    rc = cc.pod_config(pod({"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}, {"limits": {"memory": "1Gi"}}))
    assert rc == ResourceConfig(cpu_shares=102, memory=(64 << 20) + (1 << 30))  # the second's request: its limit
    rc = cc.pod_config(pod({"requests": {"cpu": "100m"}}, {"limits": {"memory": "1Gi"}}))
    assert rc == ResourceConfig(cpu_shares=102)


def test_pod_level_resources_take_precedence():
    rc = cc.pod_config(pod({"requests": {"cpu": "100m"}}, {},
                           resources={"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}))
    assert rc == ResourceConfig(cpu_shares=1024, cpu_quota=200000, cpu_period=100000, memory=1 << 30)


def test_a_besteffort_pod_has_the_minimal_shares():
    assert cc.pod_config(pod({}), pids_limit=-1) == ResourceConfig(cpu_shares=2)


def test_init_containers_and_sidecars_and_overhead():
    big_init = {"_r": {"requests": {"cpu": "2"}, "limits": {"cpu": "2", "memory": "1Gi"}}}
    sidecar = {"_r": {"requests": {"cpu": "250m"}, "limits": {"cpu": "250m", "memory": "64Mi"}},
               "restartPolicy": "Always"}
    p = pod(G, init=(sidecar, big_init), overhead={"cpu": "100m", "memory": "10Mi"})
    assert cc.pod_requests(p) == {"cpu": Decimal("2.35"), "memory": (1 << 30) + (74 << 20)}
    rc = cc.pod_config(p)
    assert rc.cpu_quota == 235000 and rc.memory == (1 << 30) + (74 << 20)


def test_kubepods_gets_capacity_less_reserved_not_the_eviction_threshold():
    capacity = {"cpu": 2000, "memory": 4 << 30, "pid": 4194304}
    rc = cc.kubepods_config(capacity, ["pods"], {"cpu": 500, "memory": 512 << 20, "pid": 1000}, {"memory": 256 << 20})
    assert rc == ResourceConfig(cpu_shares=1536, memory=(4 << 30) - (768 << 20), pids=4193304)
    assert cc.kubepods_config(capacity, ["none"], {"cpu": 500}, {}) == ResourceConfig(
        cpu_shares=2048, memory=4 << 30, pids=4194304)


def test_qos_shares_sum_the_burstable_requests():
    configs = cc.qos_configs([pod({"requests": {"cpu": "250m"}}), pod({"requests": {"cpu": "750m"}}), pod(G),
                              pod({})])
    assert configs == {"burstable": ResourceConfig(cpu_shares=1024), "besteffort": ResourceConfig(cpu_shares=2)}


def test_the_files_of_each_version_and_the_systemd_properties():
    rc = ResourceConfig(cpu_shares=1024, cpu_quota=50000, cpu_period=100000, memory=1 << 30, pids=-1)
    assert cc.v1_files(rc) == [("cpu", "cpu.shares", "1024"), ("cpu", "cpu.cfs_period_us", "100000"),
                               ("cpu", "cpu.cfs_quota_us", "50000"), ("memory", "memory.limit_in_bytes", "1073741824"),
                               ("pids", "pids.max", "max")]
    assert cc.v2_files(rc) == [("cpu", "cpu.weight", "39"), ("cpu", "cpu.max", "50000 100000"),
                               ("memory", "memory.max", "1073741824"), ("pids", "pids.max", "max")]
    assert cc.v2_files(ResourceConfig(cpu_quota=-1, cpu_period=100000)) == [("cpu", "cpu.max", "max 100000")]
    assert dict(cc.systemd_properties(ResourceConfig(cpu_shares=1024, cpu_quota=1000, cpu_period=100000,
                                                     memory=5, pids=7), v2=False)) == {
        "CPUShares": ("t", 1024), "CPUQuotaPerSecUSec": ("t", 10000), "MemoryLimit": ("t", 5), "TasksMax": ("t", 7)}


@pytest.fixture
def files(monkeypatch):
    """Control files written as plain files (a directory of tmpfs has none to open)."""
    monkeypatch.setattr(nodecgroups, "_write", lambda path, value: Path(path).write_text(value))


def test_node_cgroups_written_on_v2(tmp_path, files):
    for d in ("", "kubepods", "kubepods/burstable", "kubepods/besteffort"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    cgroups = NodeCgroups(Settings(pod_pids_limit=64), None, list, root=str(tmp_path), version="v2")
    cgroups.ensure_node({"cpu": 2000, "memory": 4 << 30, "pid": 1000})
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    kubepods = tmp_path / "kubepods"
    assert [(kubepods / f).read_text() for f in ("cpu.weight", "memory.max", "pids.max")] == [
        "79", str(4 << 30), "1000"]
    assert (kubepods / "besteffort" / "cpu.weight").read_text() == "1"
    cgroups.ensure_pod(pod(G))
    assert (kubepods / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    pod_dir = kubepods / f"pod{UID}"
    assert [(pod_dir / f).read_text() for f in ("cpu.max", "memory.max", "pids.max")] == [
        "50000 100000", str(128 << 20), "64"]


def test_node_cgroups_written_on_v1(tmp_path, files):
    cgroups = NodeCgroups(Settings(), None, list, root=str(tmp_path), version="v1")
    cgroups.ensure_pod(pod({"requests": {"cpu": "100m"}}))
    assert (tmp_path / "cpu" / "kubepods" / "burstable" / f"pod{UID}" / "cpu.shares").read_text() == "102"
    assert (tmp_path / "cpu" / "kubepods" / "burstable" / "cpu.shares").read_text() == "102"
    assert (tmp_path / "pids" / "kubepods" / "burstable" / f"pod{UID}").is_dir()


def test_enforcing_a_reserved_cgroup_needs_it_named(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                    "enforceNodeAllocatable: [pods, system-reserved]\npodPidsLimit: 100\n")
    values = load_file(path)
    assert values["pod_pids_limit"] == 100 and values["enforce_node_allocatable"] == ["pods", "system-reserved"]
    from pykubelet.config import _validate
    with pytest.raises(ConfigError, match="system-reserved needs systemReservedCgroup"):
        _validate(Settings(node_name="n", **values))
    path.write_text(path.read_text() + "enforceNodeAllocatable: [pods, pods]\n")
    with pytest.raises(ConfigError, match="enforceNodeAllocatable"):
        load_file(path)


def test_a_resize_writes_what_grows_first_and_what_shrinks_after(tmp_path, files):
    cgroups = NodeCgroups(Settings(), None, list, root=str(tmp_path), version="v1")
    cgroups.update_pod(pod(G), leave=frozenset({"memory"}))
    cgroup = tmp_path / "{}" / "kubepods" / f"pod{UID}"
    assert (Path(str(cgroup).format("cpu")) / "cpu.cfs_quota_us").read_text() == "50000"
    assert not (Path(str(cgroup).format("memory")) / "memory.limit_in_bytes").exists()
    cgroups.update_pod(pod(G))
    assert (Path(str(cgroup).format("memory")) / "memory.limit_in_bytes").read_text() == str(128 << 20)
