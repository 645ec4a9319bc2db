"""The allocation manager (pykubelet/pods/allocation.py): the allocated and actuated checkpoints (atomic,
0600, read back by a restarted kubelet), the allocated pod the sync acts on, a resize's feasibility against
the node (Infeasible, Deferred) and the PodResizePending / PodResizeInProgress conditions; and the status
resources of a resized container (pods/status.py)."""
from __future__ import annotations

import json
import stat
from pathlib import Path

from proto import api_pb2
from pykubelet.api.podmodel import Pod, Resources, parse_pod
from pykubelet.pods.allocation import (
    ACTUATED_FILE,
    ALLOCATED_FILE,
    AllocationManager,
    Checkpoint,
    PodResources,
    allocated_pod,
    resize_verdict,
)
from pykubelet.pods.status import pod_level_status, status_resources
from tests.unit.test_kubelet_pods import Cache

NODE = {"cpu": "2", "memory": "4Gi", "pods": "110"}


def pod(cpu: str = "500m", memory: str = "64Mi", *, uid: str = "u1", generation: int = 1,
        pod_level: dict | None = None) -> Pod:
    r = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    spec: dict = {"containers": [{"name": "c", "image": "busybox:1", "resources": r}]}
    if pod_level is not None:
        spec["resources"] = pod_level
    return parse_pod({"metadata": {"name": uid, "namespace": "ns", "uid": uid, "generation": generation},
                      "spec": spec})


def res(cpu: str, memory: str) -> Resources:
    return Resources({"cpu": cpu, "memory": memory}, {"cpu": cpu, "memory": memory})


def test_the_checkpoint_is_written_atomically_0600_and_read_back_by_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "root" / ALLOCATED_FILE
    cp = Checkpoint(path)
    cp.set("u1", PodResources({"c": res("1", "64Mi")}, Resources({"cpu": "2"}, {"cpu": "2"})))
    cp.set_container("u1", "c", res("2", "64Mi"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary file left
    again = Checkpoint(path)
    assert again.get("u1") == PodResources({"c": res("2", "64Mi")}, Resources({"cpu": "2"}, {"cpu": "2"}))
    again.remove("u1")
    assert Checkpoint(path).get("u1") is None


def test_an_unreadable_checkpoint_is_started_afresh(tmp_path: Path) -> None:
    path = tmp_path / ALLOCATED_FILE
    path.write_text("{not json")
    assert Checkpoint(path).get("u1") is None
    path.write_text(json.dumps({"pods": []}))
    assert Checkpoint(path).get("u1") is None


def test_the_allocated_pod_has_the_granted_resources_not_the_spec() -> None:
    p = pod("1", "128Mi", pod_level={"limits": {"cpu": "4"}})
    granted = allocated_pod(p, PodResources({"c": res("500m", "64Mi")}, Resources({"cpu": "2"}, {"cpu": "2"})))
    assert granted.spec.containers[0].resources == res("500m", "64Mi")
    assert granted.spec.resources == Resources({"cpu": "2"}, {"cpu": "2"})
    assert allocated_pod(p, None) is p


def test_a_resize_beyond_the_node_is_infeasible_beyond_what_is_free_deferred() -> None:
    others = [pod("1", "1Gi", uid="u2")]
    assert resize_verdict(pod("1"), others, NODE).admit
    infeasible = resize_verdict(pod("3"), others, NODE)
    assert (infeasible.reason, infeasible.message) == (
        "Infeasible", "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000")
    deferred = resize_verdict(pod("1500m"), others, NODE)
    assert deferred.reason == "Deferred"
    assert deferred.message == "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
    assert resize_verdict(pod("1", "8Gi"), [], NODE).reason == "Infeasible"


def test_a_pod_level_request_stands_for_its_containers() -> None:
    assert resize_verdict(pod("100m", pod_level={"requests": {"cpu": "3"}}), [], NODE).reason == "Infeasible"


def test_admission_records_the_spec_once_and_a_restart_keeps_an_accepted_resize(tmp_path: Path) -> None:
    m = AllocationManager(tmp_path)
    m.admitted(pod("500m"))
    assert m.allocated.get("u1") == m.actuated.get("u1") == PodResources({"c": res("500m", "64Mi")})
    event = m.handle_resize(pod("1", generation=2), list, lambda: NODE)
    assert event is not None and (event.type, event.reason) == ("Normal", "ResizeStarted")
    assert event.message.startswith('Pod resize started: {"containers":[{"name":"c","resources":')
    restarted = AllocationManager(tmp_path)
    restarted.admitted(pod("1", generation=2))  # admitted again after a restart: the records stand
    assert restarted.allocated.get("u1") == PodResources({"c": res("1", "64Mi")})
    assert restarted.actuated.get("u1") == PodResources({"c": res("500m", "64Mi")})
    assert (tmp_path / ACTUATED_FILE).exists()


def test_the_records_of_pods_gone_while_the_kubelet_was_away_go(tmp_path: Path) -> None:
    m = AllocationManager(tmp_path)
    m.admitted(pod(uid="u1"))
    m.admitted(pod(uid="u2"))
    m.retain({"u2"})
    again = AllocationManager(tmp_path)
    assert (again.allocated.get("u1"), again.actuated.get("u1")) == (None, None)
    assert again.allocated.get("u2") is not None and again.actuated.get("u2") is not None


def test_pending_conditions_say_why_and_go_when_the_resize_fits_or_is_undone(tmp_path: Path) -> None:
    m = AllocationManager(tmp_path)
    m.admitted(pod())
    event = m.handle_resize(pod("3", generation=2), list, lambda: NODE)
    assert event is not None and (event.type, event.reason) == ("Warning", "ResizeInfeasible")
    assert m.conditions("u1") == [{"type": "PodResizePending", "status": "True", "observedGeneration": 2,
                                   "reason": "Infeasible", "message": "Node didn't have enough capacity: cpu, "
                                                                      "requested: 3000, capacity: 2000"}]
    assert m.handle_resize(pod("3", generation=2), list, lambda: NODE) is None  # said once per reason and generation
    assert m.allocated.get("u1") == PodResources({"c": res("500m", "64Mi")})  # nothing granted
    event = m.handle_resize(pod("1500m", generation=3), lambda: [pod("1", uid="u2")], lambda: NODE)
    assert event is not None and event.reason == "ResizeDeferred"
    assert m.conditions("u1")[0]["reason"] == "Deferred" and m.deferred() == ["u1"]
    assert m.handle_resize(pod(generation=4), list, lambda: NODE) is None  # asked back to what it has
    assert m.conditions("u1") == []


def test_in_progress_until_actuated_with_the_error_that_holds_it(tmp_path: Path) -> None:
    m = AllocationManager(tmp_path)
    m.admitted(pod())
    m.handle_resize(pod("1", generation=2), list, lambda: NODE)
    allocated = m.allocated_pod(pod("1", generation=2))
    assert m.conditions("u1") == [{"type": "PodResizeInProgress", "status": "True", "observedGeneration": 2}]
    error = "cannot decrease memory limits: ..."
    event = m.actuation_done(allocated, {"c"}, error)
    assert event is not None and (event.type, event.reason) == ("Warning", "ResizeError")
    assert m.conditions("u1")[0]["reason"] == "Error" and m.conditions("u1")[0]["message"] == error
    assert m.actuation_done(allocated, {"c"}, error) is None  # the same error is said once
    m.actuated.set_container("u1", "c", res("1", "64Mi"))
    event = m.actuation_done(allocated, {"c"}, None)
    assert event is not None and (event.type, event.reason) == ("Normal", "ResizeCompleted")
    assert m.conditions("u1") == []


def test_a_restart_reports_the_conditions_the_pod_has_once(tmp_path: Path) -> None:
    m = AllocationManager(tmp_path)
    kept: list[dict] = [{"type": "PodResizePending", "status": "True", "reason": "Deferred", "message": "m",
                         "observedGeneration": 3}, {"type": "Ready", "status": "True"}]
    m.restore("u1", kept)
    assert m.conditions("u1") == [{"type": "PodResizePending", "status": "True", "observedGeneration": 3,
                                   "reason": "Deferred", "message": "m"}]
    m.handle_resize(pod(), list, lambda: NODE)  # no allocation recorded: nothing pending
    m.restore("u1", kept)  # the informer's copy, not updated yet: not taken again
    assert m.conditions("u1") == []
    m.forget("u1")
    assert m.allocated.get("u1") is None and m.conditions("u1") == []


def running(cpu_shares: int = 0, cpu_quota: int = 0, memory: int = 0) -> api_pb2.ContainerStatus:
    s = api_pb2.ContainerStatus(id="c1", state=api_pb2.CONTAINER_RUNNING)
    s.resources.linux.CopyFrom(api_pb2.LinuxContainerResources(cpu_shares=cpu_shares, cpu_period=100_000,
                                                               cpu_quota=cpu_quota, memory_limit_in_bytes=memory))
    return s


def test_status_resources_are_what_the_runtime_applied() -> None:
    allocated = res("1", "128Mi")
    assert status_resources(allocated, running(512, 50_000, 64 << 20), None) == {
        "requests": {"cpu": "500m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}}
    assert status_resources(allocated, None, None) == {"requests": {"cpu": "1", "memory": "128Mi"},
                                                       "limits": {"cpu": "1", "memory": "128Mi"}}


def test_status_resources_without_the_runtime_saying_are_what_the_kubelet_gave() -> None:
    no_resources = api_pb2.ContainerStatus(id="c1", state=api_pb2.CONTAINER_RUNNING)
    assert status_resources(res("1", "128Mi"), no_resources, res("500m", "64Mi")) == {
        "requests": {"cpu": "500m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}}


def test_status_resources_keep_what_the_allocation_does_not_set() -> None:
    requests_only = Resources({"memory": "64Mi"}, {})
    assert status_resources(requests_only, running(2, 0, 0), None) == {"requests": {"memory": "64Mi"}}
    assert status_resources(Resources(), running(2), None) == {}


def _with_phase(p: Pod, phase: str) -> Pod:
    return parse_pod({**p.raw, "status": {"phase": phase}})


def test_pod_level_status_is_the_granted_pod_level_requests() -> None:
    """The PLR Pod InPlace Resize specs' VerifyPodLevelStatus: status.allocatedResources is the pod-level
    requests where the pod has them (whatever its containers ask), for a running pod too."""
    plr = pod("20m", "32Mi", pod_level={"requests": {"cpu": "80m", "memory": "95Mi"},
                                        "limits": {"cpu": "160m", "memory": "190Mi"}})
    resources, allocated = pod_level_status(_with_phase(plr, "Running"))
    assert allocated == {"cpu": "80m", "memory": "95Mi"}
    # running: the pod-level resources with the limits of the pod's cgroup
    assert resources == {"requests": {"cpu": "80m", "memory": "95Mi"}, "limits": {"cpu": "160m", "memory": "190Mi"}}
    assert pod_level_status(_with_phase(plr, "Pending"))[0] == resources
    # a resize the pod's cgroup did not take (PLR "decrease pod-level memory limit below usage"): resources say
    # what the cgroup has, allocatedResources what was granted
    had = Resources({"cpu": "80m", "memory": "95Mi"}, {"cpu": "160m", "memory": "190Mi"})
    shrunk = pod("20m", "32Mi", pod_level={"requests": {"cpu": "80m", "memory": "10Ki"},
                                           "limits": {"cpu": "160m", "memory": "10Ki"}})
    resources, allocated = pod_level_status(_with_phase(shrunk, "Running"), actuated=had)
    assert resources["limits"]["memory"] == "190Mi" and allocated["memory"] == "10Ki"
    # a fraction of a byte, which the API admits, is granted as asked, not rounded up to a byte (the PLR spec
    # "pod-level resize with no container requests and limits" asks for 10m of memory)
    tiny = parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                      "spec": {"containers": [{"name": "c", "image": "i"}],
                               "resources": {"requests": {"cpu": "4m", "memory": "10m"}}}})
    assert pod_level_status(tiny)[1] == {"cpu": "4m", "memory": "10m"}


def test_pod_level_status_without_pod_level_resources_aggregates_the_containers() -> None:
    """PodRequests: the regular containers and sidecars summed, or a one-at-a-time init container with the
    sidecars started before it if more, every resource named, and the overhead added."""
    spec = {"containers": [{"name": "a", "image": "i", "resources": {"requests": {"cpu": "100m", "memory": "64Mi",
                                                                                "ephemeral-storage": "1Gi"}}},
                           {"name": "b", "image": "i", "resources": {"requests": {"cpu": "200m"},
                                                                     "limits": {"cpu": "1"}}}],
            "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always",
                                "resources": {"requests": {"cpu": "50m"}}},
                               {"name": "big", "image": "i", "resources": {"requests": {"memory": "1Gi"}}}],
            "overhead": {"cpu": "10m"}}
    p = parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec,
                   "status": {"phase": "Pending"}})
    resources, allocated = pod_level_status(p)
    assert allocated == {"cpu": "360m", "ephemeral-storage": "1Gi", "memory": "1Gi"}
    assert resources == {"requests": allocated, "limits": {"cpu": "1010m"}}  # the overhead on a limit set
    running, _ = pod_level_status(_with_phase(p, "Running"))
    # Burstable, not every container with a cpu or memory limit: the pod's cgroup has neither limit
    assert running == {"requests": {"memory": "1Gi"}}


def test_the_hash_leaves_resources_out_so_a_resize_keeps_the_container() -> None:
    from pykubelet.pods.labels import container_hash

    assert container_hash(pod("500m").spec.containers[0]) == container_hash(pod("2", "1Gi").spec.containers[0])


def raw_pod(generation: int, cpu: str, memory: str) -> dict:
    r = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    return {"metadata": {"name": "web", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": {"containers": [{"name": "c", "image": "img:1", "resources": r}]}}


def test_the_workers_resize_in_place_report_it_and_say_why_not(tmp_path: Path) -> None:
    """PATCH pods/NAME/resize is a MODIFIED pod: accepted, the running container gets UpdateContainerResources
    and is not restarted, its status shows what it has and was allocated; more than the node has is
    Infeasible and changes nothing; a memory limit under the usage waits with PodResizeInProgress Error."""
    from pykubelet.config import Settings
    from pykubelet.pods.admission import Admission
    from pykubelet.pods.workers import PodWorkers
    from tests.kit.fake_cri import FakeCRI

    cache, rt = Cache(), FakeCRI()
    rt.add_image("sha256:i", "img:1")
    admission = Admission("node", pods=list, on_node=set, allocatable=lambda: NODE, labels=dict)
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache,
                         admission=admission)

    def sync(raw: dict) -> tuple[dict, list]:
        workers._on_pod("MODIFIED", None, cache.put(raw))
        workers.sync("u1")
        status = workers.statuses.last("u1")
        return status, [c for c in status["conditions"] if c["type"].startswith("PodResize")]

    sync(raw_pod(1, "500m", "64Mi"))
    assert rt.started == ["c-0"]
    status, conditions = sync(raw_pod(2, "1", "64Mi"))
    assert rt.started == ["c-0"]  # not restarted
    (update,) = [c for c in rt.calls if c[0] == "UpdateContainerResources"]
    assert update[1] == "c-0" and (update[2].cpu_quota, update[2].cpu_shares) == (100_000, 1024)
    assert update[2].memory_limit_in_bytes == 64 << 20
    (c,) = status["containerStatuses"]
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}
    assert c["allocatedResources"] == {"cpu": "1", "memory": "64Mi"} and conditions == []

    status, conditions = sync(raw_pod(3, "3", "64Mi"))
    assert [(k["type"], k["reason"], k["observedGeneration"]) for k in conditions] == [
        ("PodResizePending", "Infeasible", 3)]
    assert status["containerStatuses"][0]["allocatedResources"]["cpu"] == "1"  # nothing granted
    assert len([c for c in rt.calls if c[0] == "UpdateContainerResources"]) == 1

    rt.memory_usage["c-0"] = 40 << 20
    status, conditions = sync(raw_pod(4, "1", "32Mi"))
    assert [(k["type"], k["reason"]) for k in conditions] == [("PodResizeInProgress", "Error")]
    assert conditions[0]["message"] == ('cannot decrease memory limits: attempting to set container "c" memory '
                                        f"limit ({32 << 20}) below current usage ({40 << 20})")
    assert status["containerStatuses"][0]["resources"]["limits"]["memory"] == "64Mi"  # as it still is
    rt.memory_usage["c-0"] = 10 << 20
    status, conditions = sync(raw_pod(4, "1", "32Mi"))
    assert conditions == [] and status["containerStatuses"][0]["resources"]["limits"]["memory"] == "32Mi"
    assert rt.started == ["c-0"]


def test_a_pod_level_memory_limit_below_what_the_pod_uses_waits(tmp_path: Path) -> None:
    """PLR Pod InPlace Resize "decrease pod-level memory limit below usage": a pod-level memory limit at or below
    what the pod's containers use together is not applied (PodResizeInProgress, Error, the kubelet's message)
    until they use less, as validateMemoryResizeAction checks the pod's usage."""
    from pykubelet.config import Settings
    from pykubelet.pods.admission import Admission
    from pykubelet.pods.workers import PodWorkers
    from tests.kit.fake_cri import FakeCRI

    cache, rt = Cache(), FakeCRI()
    rt.add_image("sha256:i", "img:1")
    admission = Admission("node", pods=list, on_node=set, allocatable=lambda: NODE, labels=dict)
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache,
                         admission=admission)

    def sync(generation: int, memory: str) -> list:
        pod_level = {"requests": {"memory": memory}, "limits": {"memory": memory}}
        workers._on_pod("MODIFIED", None, cache.put({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": {"containers": [{"name": "c", "image": "img:1"}], "resources": pod_level}}))
        workers.sync("u1")
        return [c for c in workers.statuses.last("u1")["conditions"] if c["type"].startswith("PodResize")]

    sync(1, "64Mi")
    rt.memory_usage["c-0"] = 40 << 20
    conditions = sync(2, "32Mi")
    assert [(k["type"], k["reason"]) for k in conditions] == [("PodResizeInProgress", "Error")]
    # the container has the pod-level limit as its own, so it is checked too, as the kubelet's
    assert conditions[0]["message"] == (
        f"cannot decrease memory limits: [attempting to set pod memory limit ({32 << 20}) below current usage "
        f'({40 << 20}), attempting to set container "c" memory limit ({32 << 20}) below current usage ({40 << 20})]')
    rt.memory_usage["c-0"] = 10 << 20
    assert sync(2, "32Mi") == []
