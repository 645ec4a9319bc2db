"""The eviction policy's decisions (pykubelet/eviction/policy.py), as tables: thresholds parsed from the
KubeletConfiguration, signals compared with them, conditions held for the transition period, pods ranked
and the kubelet's messages."""
from __future__ import annotations

from pathlib import Path

import pytest

from pykubelet import config
from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.eviction import manager, policy
from pykubelet.eviction.policy import ContainerUsage, Observation, PodUsage, Threshold, Value
from pykubelet.node import hostfacts
from pykubelet.pods import podspec

MI = 1 << 20


@pytest.mark.parametrize("text,want", [
    ("100Mi", Value(quantity=100 * MI)), ("10%", Value(percentage=0.10)), ("1G", Value(quantity=10**9)),
    ("1000", Value(quantity=1000)), ("1.5Ki", Value(quantity=1536)), ("0%", None), ("0", None),
])
def test_values_parse(text, want):
    assert policy.parse_value(text) == want


@pytest.mark.parametrize("text", ["", "abc", "-1Mi", "101%", "-5%", "x%", "nan%", "inf"])
def test_bad_values_are_refused(text):
    with pytest.raises(ValueError):
        policy.parse_value(text)


def write(tmp_path: Path, fields: str) -> Path:
    p = tmp_path / "k.yaml"
    p.write_text(f"apiVersion: {config.API_VERSION}\nkind: {config.KIND}\n{fields}")
    return p


@pytest.mark.parametrize("fields,error", [
    ("evictionHard: {memory.available: lots}\n", "evictionHard.memory.available: expected not a quantity: 'lots'"),
    ("evictionHard: {memory.free: 1Mi}\n", "evictionHard.memory.free: expected an eviction signal"),
    ("evictionSoft: {nodefs.available: 20%}\n",
     "evictionSoftGracePeriod: no grace period for the soft threshold nodefs.available"),
    ("evictionSoftGracePeriod: {nodefs.available: 1m}\n",
     "evictionSoftGracePeriod: nodefs.available has no soft threshold in evictionSoft"),
    ("evictionSoftGracePeriod: {nodefs.available: soon}\n",
     "evictionSoftGracePeriod.nodefs.available: expected a duration"),
    ("evictionMaxPodGracePeriod: -1\n", "evictionMaxPodGracePeriod: expected an integer"),
    ("evictionMinimumReclaim: {pid.available: 200%}\n",
     "evictionMinimumReclaim.pid.available: expected a percentage between"),
])
def test_config_errors_name_the_field(tmp_path, fields, error):
    with pytest.raises(config.ConfigError, match=None) as e:
        config.build({}, write(tmp_path, fields))
    assert error in str(e.value)


def test_defaults_and_a_given_map_replaces_them(tmp_path):
    s = config.build({"node_ip": None})
    assert {t.signal: t.value for t in config.eviction_thresholds(s)} == policy.DEFAULT_HARD
    assert s.eviction_pressure_transition_period == 300.0
    s = config.build({}, write(tmp_path, "evictionHard: {nodefs.available: 1Gi}\n"
                               "evictionSoft: {memory.available: 1Gi}\n"
                               "evictionSoftGracePeriod: {memory.available: 1m30s}\n"
                               "evictionMinimumReclaim: {nodefs.available: 500Mi}\nevictionMaxPodGracePeriod: 20\n"))
    assert config.eviction_thresholds(s) == [
        Threshold("nodefs.available", Value(quantity=1 << 30), 0.0, Value(quantity=500 * MI), True),
        Threshold("memory.available", Value(quantity=1 << 30), 90.0, None, False)]
    assert s.eviction_max_pod_grace_period == 20


HARD_MEM = Threshold("memory.available", Value(quantity=100 * MI))
HARD_DISK = Threshold("nodefs.available", Value(percentage=0.10), min_reclaim=Value(quantity=5 * MI))
SOFT_PID = Threshold("pid.available", Value(quantity=1000), grace_period=30.0, hard=False)


@pytest.mark.parametrize("threshold,available,capacity,met", [
    (HARD_MEM, 99 * MI, 1000 * MI, True), (HARD_MEM, 100 * MI, 1000 * MI, False),
    (HARD_DISK, 9 * MI, 100 * MI, True), (HARD_DISK, 10 * MI, 100 * MI, False),
    (SOFT_PID, 999, 4_000_000, True),
])
def test_signal_comparison(threshold, available, capacity, met):
    assert policy.is_met(threshold, {threshold.signal: Observation(available, capacity)}, False) is met


def test_min_reclaim_keeps_a_threshold_until_past_it():
    state = policy.PressureState()
    obs = {"nodefs.available": Observation(9 * MI, 100 * MI)}
    assert state.step([HARD_DISK], obs, 0.0, 300).act_on == [HARD_DISK]
    # past the threshold, not past it plus the minimum reclaim (10Mi + 5Mi): still acted on
    assert state.step([HARD_DISK], {"nodefs.available": Observation(12 * MI, 100 * MI)}, 10, 300).act_on == [HARD_DISK]
    assert state.step([HARD_DISK], {"nodefs.available": Observation(16 * MI, 100 * MI)}, 20.0, 300).act_on == []


def test_soft_threshold_waits_its_grace_and_conditions_hold_for_the_transition_period():
    state = policy.PressureState()
    low = {"pid.available": Observation(10, 4_000_000)}
    fine = {"pid.available": Observation(3_000_000, 4_000_000)}
    d = state.step([SOFT_PID], low, 0.0, 60)
    assert d.act_on == [] and d.conditions == [policy.PIDS]  # the condition holds at once
    assert state.step([SOFT_PID], low, 29.0, 60).act_on == []
    assert state.step([SOFT_PID], low, 30.0, 60).act_on == [SOFT_PID]
    d = state.step([SOFT_PID], fine, 40.0, 60)
    assert d.act_on == [] and d.conditions == [policy.PIDS]  # last seen at 30: held until 90
    assert state.step([SOFT_PID], fine, 91.0, 60).conditions == []
    # seen again: its grace starts over
    assert state.step([SOFT_PID], low, 100.0, 60).act_on == []


def test_memory_is_reclaimed_first():
    state = policy.PressureState()
    obs = {"nodefs.available": Observation(1, 100), "memory.available": Observation(1, 1000 * MI)}
    d = state.step([HARD_DISK, HARD_MEM], obs, 0.0, 300)
    assert d.act_on[0] == HARD_MEM and d.conditions == [policy.MEMORY, policy.DISK]


def pod(name: str, *, requests: dict | None = None, limits: dict | None = None, prio: int = 0,
        annotations: dict | None = None, **spec) -> Pod:
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return parse_pod({"metadata": {"name": name, "namespace": "default", "uid": name, "annotations": annotations or {}},
                      "spec": {"containers": [{"name": "main", "image": "x", "resources": res}], "priority": prio,
                               **spec}})


def test_memory_ranking_over_requests_then_priority_then_usage():
    pods = [pod("guaranteed-high-use", requests={"memory": "500Mi"}, prio=0),
            pod("besteffort-small", prio=1000), pod("besteffort-big", prio=1000),
            pod("burstable-over", requests={"memory": "10Mi"}, prio=0), pod("no-stats", prio=5000)]
    usage = {"guaranteed-high-use": PodUsage(memory=400 * MI), "besteffort-small": PodUsage(memory=5 * MI),
             "besteffort-big": PodUsage(memory=50 * MI), "burstable-over": PodUsage(memory=20 * MI)}
    assert [p.metadata.name for p in policy.rank(pods, usage, "memory")] == [
        "no-stats", "burstable-over", "besteffort-big", "besteffort-small", "guaranteed-high-use"]


def test_disk_and_pid_ranking():
    pods = [pod("asked", requests={"ephemeral-storage": "1Gi"}), pod("filler"), pod("low-prio-few", prio=-10)]
    usage = {"asked": PodUsage(disk=100 * MI, pids=500), "filler": PodUsage(disk=30 * MI, pids=2),
             "low-prio-few": PodUsage(disk=1 * MI, pids=1)}
    assert [p.metadata.name for p in policy.rank(pods, usage, "ephemeral-storage")] == [
        "low-prio-few", "filler", "asked"]
    assert [p.metadata.name for p in policy.rank(pods, usage, "pids")] == ["low-prio-few", "asked", "filler"]


def test_critical_pods():
    assert podspec.is_critical(pod("x", prio=2_000_001_000))
    assert podspec.is_critical(pod("x", annotations={podspec.CONFIG_SOURCE: "file"}))
    assert podspec.is_critical(pod("x", annotations={podspec.CONFIG_MIRROR: "h"}))
    assert not podspec.is_critical(pod("x", annotations={podspec.CONFIG_SOURCE: "api"}))
    assert not podspec.is_critical(pod("x", prio=1_000_000_000))


def test_the_kubelets_eviction_message():
    p = pod("x", requests={"memory": "10Mi"})
    usage = PodUsage(memory=20 * MI, containers={"main": ContainerUsage(memory=20 * MI)})
    assert policy.eviction_message(p, HARD_MEM, Observation(50 * MI, 1000 * MI), usage) == (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        "Container main was using 20Mi, request is 10Mi, has larger consumption of memory. ")
    # within its request: no container part; a percentage threshold shown as a quantity of the capacity; a
    # BinarySI quantity below 1Ki is written as a DecimalSI one
    within = PodUsage(disk=1, containers={"main": ContainerUsage(disk=1000)})
    assert policy.eviction_message(pod("y", requests={"ephemeral-storage": "1Mi"}), HARD_DISK,
                                   Observation(1000, 1 << 30), within) == (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 107374182, available: 1k. ")
    assert [policy.format_quantity(n) for n in (0, 1536, 3072, 51200 * 1024, 1 << 30)] == ["0", "1536", "3Ki", "50Mi",
                                                                                           "1Gi"]


@pytest.mark.parametrize("spec,usage,message", [
    ({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]},
     PodUsage(disk=4 * MI, volumes={"scratch": 4 * MI}),
     'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". '),
    ({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "8Mi"}}]},
     PodUsage(disk=4 * MI, volumes={"scratch": 4 * MI}), None),
    ({"containers": [{"name": "a", "image": "x", "resources": {"limits": {"ephemeral-storage": "2Mi"}}},
                     {"name": "b", "image": "x", "resources": {"limits": {"ephemeral-storage": "2Mi"}}}]},
     PodUsage(disk=5 * MI, containers={"a": ContainerUsage(disk=1 * MI), "b": ContainerUsage(disk=1 * MI)}),
     "Pod ephemeral local storage usage exceeds the total limit of containers 4Mi. "),
    ({"containers": [{"name": "a", "image": "x", "resources": {"limits": {"ephemeral-storage": "1Mi"}}},
                     {"name": "b", "image": "x", "resources": {"limits": {"ephemeral-storage": "100Mi"}}}]},
     PodUsage(disk=4 * MI, containers={"a": ContainerUsage(disk=4 * MI), "b": ContainerUsage(disk=0)}),
     'Container a exceeded its local ephemeral storage limit "1Mi". '),
    ({"containers": [{"name": "a", "image": "x"}]},
     PodUsage(disk=40 * MI, containers={"a": ContainerUsage(disk=40 * MI)}), None),
])
def test_local_storage_violations(spec, usage, message):
    p = parse_pod({"metadata": {"name": "p", "namespace": "default", "uid": "p"},
                   "spec": {"containers": [{"name": "a", "image": "x"}], **spec}})
    assert policy.local_storage_violation(p, usage) == message


@pytest.mark.parametrize("threshold,own,want", [(HARD_MEM, 30, 0), (None, 30, 0), (SOFT_PID, 30, 20), (SOFT_PID, 5, 5),
                                                (SOFT_PID, None, 20)])
def test_grace_periods(threshold, own, want):
    p = pod("x", **({} if own is None else {"terminationGracePeriodSeconds": own}))
    assert policy.grace_period(threshold, p, 20) == want


@pytest.mark.parametrize("p,conditions,message", [
    (pod("be"), [], None),
    (pod("be"), [policy.MEMORY], "The node had condition: [MemoryPressure]. "),
    (pod("burstable", requests={"memory": "1Mi"}), [policy.MEMORY], None),
    (pod("be-tolerating", tolerations=[{"key": policy.MEMORY_PRESSURE_TAINT, "operator": "Exists",
                                        "effect": "NoSchedule"}]), [policy.MEMORY], None),
    (pod("burstable", requests={"memory": "1Mi"}), [policy.MEMORY, policy.DISK],
     "The node had condition: [MemoryPressure DiskPressure]. "),
    (pod("critical", prio=2_000_000_000), [policy.DISK], None),
])
def test_admission_under_pressure(p, conditions, message):
    assert policy.admit(p, conditions) == message


def test_evicted_status_terminates_the_containers():
    last = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": True, "containerID": "pyruntime://c1",
                                   "state": {"running": {"startedAt": "T0"}}}]}
    s = policy.evicted_status(last, "gone. ", "T1")
    assert (s["phase"], s["reason"], s["message"]) == ("Failed", "Evicted", "gone. ")
    assert s["containerStatuses"][0]["state"] == {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": "T0",
                                                                 "finishedAt": "T1", "containerID": "pyruntime://c1"}}
    assert {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": "gone. "} \
        in s["conditions"]
    assert last["conditions"] == [{"type": "Ready", "status": "True"}]  # the status last sent is not changed
    unready = {**last, "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                                       "message": "containers with unready status: [main]"}]}
    assert policy.evicted_status(unready, "gone. ", "T1")["conditions"][0] == {
        "type": "Ready", "status": "False", "reason": "PodFailed"}


def test_node_readings(tmp_path):
    info = hostfacts.parse_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nInactive(file): 300 kB\nHugePages_Total: 0\n")
    assert manager.memory_observation(info) == Observation(400 * 1024, 1000 * 1024)
    assert manager.pid_observation(4_194_304, 300) == Observation(4_194_004, 4_194_304)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 8192)
    (tmp_path / "d" / "hard").hardlink_to(tmp_path / "d" / "f")
    (tmp_path / "d" / "out").symlink_to("/usr")  # not followed
    assert 8192 <= manager.du(tmp_path / "d") < 8192 + 3 * 4096 + 4096
