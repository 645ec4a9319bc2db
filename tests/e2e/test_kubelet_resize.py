"""In-place pod resize (GA in 1.35) against pykubelet, on containerd 1.6 and pyruntime-cri: the real kubectl
patches a running pod's resize subresource (`kubectl patch pod --subresource resize`), pykubelet sees the
changed pod through its informer, weighs it against the node and gives the running container its new cpu
and memory through CRI UpdateContainerResources: the same container (same id, restartCount 0) with the new
limits in its cgroup, status.containerStatuses[].resources and allocatedResources saying so, and no
PodResizePending or PodResizeInProgress condition left once done; an init container that runs once, while it
runs, the same way. A container whose resizePolicy says
RestartContainer for the resource is restarted with it instead. A memory limit below what the container
uses is not applied (PodResizeInProgress, reason Error) until the resize is undone. More cpu than is free
is Deferred until a pod leaves; more than the node has is refused by the 1.37 API server itself
(PodResizeValidator, on by default), and pykubelet says Infeasible when the API server's view of the node
let such a resize through. A restarted kubelet keeps the accepted resize (its checkpoint) and touches no
container.

The cgroup files are read on the host, under the pod's cgroup as the kubelet names it (as in
test_kubelet_resilience.py)."""
from __future__ import annotations

import json
import stat
import time

from proto import api_pb2
from pykubelet.api import quantity
from tests.kit.controlplane import ControlPlane
from tests.kit.cri_server import cgroup_file
from tests.kit.kubelet_node import BUSYBOX, apply, delete, get_pod, on_node, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-resize"
NODE_IP = "10.201.0.43"
MIB = 1 << 20
SLEEP = ["sleep", "3600"]
RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")


def pod_spec(name: str, container: dict, **spec) -> dict:
    return kit_pod_spec(NODE, name, container, **spec)


def running(cp: ControlPlane, tmp_path, name: str, resources: dict, command: list[str] = SLEEP,
            **fields) -> dict:
    apply(cp, tmp_path, pod_spec(name, {"name": "c", "image": BUSYBOX, "command": command, "resources": resources,
                                        **fields}))
    return wait_pod(cp, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running")


def resize(cp: ControlPlane, name: str, resources: dict, check: bool = True):
    """kubectl's strategic merge patch of the resize subresource: container c's resources."""
    patch = {"spec": {"containers": [{"name": "c", "resources": resources}]}}
    return cp.kubectl("patch", "pod", name, "--subresource", "resize", "-p", json.dumps(patch), check=check)


def resize_conditions(pod: dict) -> list[dict]:
    return [c for c in pod.get("status", {}).get("conditions", []) if c["type"] in RESIZE_CONDITIONS]


def container(pod: dict) -> dict:
    (cs,) = pod["status"]["containerStatuses"]
    return cs


def resized(cp: ControlPlane, name: str, resources: dict, timeout: float = 60) -> dict:
    """The pod once its status shows `resources` as applied and allocated, with no resize condition left."""
    return wait_pod(cp, name, f"resized to {resources}", lambda p: (
        p.get("status", {}).get("containerStatuses") and container(p).get("resources") == resources
        and container(p).get("allocatedResources") == resources.get("requests")
        and "running" in container(p)["state"] and not resize_conditions(p)), timeout=timeout)


def cgroup_limits(pod: dict, status: dict | None = None) -> tuple[int, int]:
    """The cpu quota (µs per 100 ms period, -1: none) and memory limit (-1: none) in the cgroup of the
    container whose status is `status` (container c's if None)."""
    parent = f"/kubepods/{'' if pod['status']['qosClass'] == 'Guaranteed' else 'burstable/'}pod{pod['metadata']['uid']}"
    cid = (status or container(pod))["containerID"].split("://", 1)[1]
    memory = cgroup_file(parent, cid, "memory/memory.limit_in_bytes", "memory.max").read_text().strip()
    cpu = cgroup_file(parent, cid, "cpu/cpu.cfs_quota_us", "cpu.max").read_text().split()[0]
    limit = -1 if memory == "max" or int(memory) >= 1 << 62 else int(memory)
    return (-1 if cpu == "max" else int(cpu)), limit


def events(cp: ControlPlane, pod: dict) -> list[dict]:
    out = cp.kubectl("get", "events", "--field-selector", f"involvedObject.uid={pod['metadata']['uid']}",
                     "-o", "json").stdout
    return json.loads(out)["items"]


def same_container(cp: ControlPlane, runtime, before: dict) -> dict:
    """The pod's container c is the one it was: same id, running, never restarted."""
    after = get_pod(cp, before["metadata"]["name"])
    assert (container(after)["containerID"], container(after)["restartCount"]) == (
        container(before)["containerID"], 0)
    _, containers = on_node(runtime, before["metadata"]["uid"])
    assert [(c.id, c.state) for c in containers] == [
        (container(before)["containerID"].split("://", 1)[1], api_pb2.CONTAINER_RUNNING)]
    return after


def node_allocatable(cp: ControlPlane) -> dict:
    return json.loads(cp.kubectl("get", "node", NODE, "-o", "json").stdout)["status"]["allocatable"]


def millicores(text: str) -> int:
    return quantity.milli_value(quantity.parse(text))


BEFORE = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}
AFTER = {"requests": {"cpu": "200m", "memory": "32Mi"}, "limits": {"cpu": "400m", "memory": "128Mi"}}


def test_a_resize_changes_the_cgroup_not_the_container(control_plane, kubelet, runtime, kubepods, tmp_path):
    pod = running(control_plane, tmp_path, "resized", BEFORE)
    assert container(pod)["resources"] == BEFORE and container(pod)["allocatedResources"] == BEFORE["requests"]
    assert cgroup_limits(pod) == (20_000, 64 * MIB)
    resize(control_plane, "resized", AFTER)
    after = resized(control_plane, "resized", AFTER)
    same_container(control_plane, runtime, pod)
    assert cgroup_limits(after) == (40_000, 128 * MIB)
    assert after["status"]["qosClass"] == "Burstable" and after["metadata"]["generation"] == 2
    reasons = [e["reason"] for e in events(control_plane, pod)]
    assert "ResizeStarted" in reasons and "ResizeCompleted" in reasons, reasons
    assert reasons.count("Started") == 1
    time.sleep(5)  # a few of the kubelet's passes: nothing more happens to it
    same_container(control_plane, runtime, pod)
    delete(control_plane, "resized")


def test_resize_policy_restart_container_restarts_it(control_plane, kubelet, runtime, kubepods, tmp_path):
    policy = [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
              {"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    pod = running(control_plane, tmp_path, "restarted", BEFORE, resizePolicy=policy)
    bigger = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "96Mi"}}
    resize(control_plane, "restarted", bigger)
    after = wait_pod(control_plane, "restarted", "restarted with its new memory", lambda p: (
        container(p)["restartCount"] == 1 and "running" in container(p)["state"]
        and container(p).get("resources") == bigger and not resize_conditions(p)))
    assert container(after)["containerID"] != container(pod)["containerID"]
    assert cgroup_limits(after) == (20_000, 96 * MIB)
    killing = [e["message"] for e in events(control_plane, pod) if e["reason"] == "Killing"]
    assert "Container c resize requires restart" in killing, killing
    # a cpu change alone: NotRequired, in place
    cpu_only = {"requests": {"cpu": "150m", "memory": "32Mi"}, "limits": {"cpu": "300m", "memory": "96Mi"}}
    resize(control_plane, "restarted", cpu_only)
    again = resized(control_plane, "restarted", cpu_only)
    assert (container(again)["containerID"], container(again)["restartCount"]) == (
        container(after)["containerID"], 1)
    assert cgroup_limits(again) == (30_000, 96 * MIB)
    delete(control_plane, "restarted")


def test_a_restart_for_more_cpu_grows_the_pods_cgroup_first(control_plane, kubelet, runtime, kubepods, tmp_path):
    """The PLR specs' "resize policy cpu restart ... all resources in the same direction": the new container's
    CFS quota must fit its pod's (cgroup v1 refuses it otherwise), so the pod's cgroup takes the new limits
    before the container is made again; and the new container has its QoS class's oom_score_adj."""
    policy = [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]
    pod = running(control_plane, tmp_path, "grown", BEFORE, resizePolicy=policy)
    resize(control_plane, "grown", AFTER)
    after = wait_pod(control_plane, "grown", "restarted with its new cpu", lambda p: (
        container(p)["restartCount"] == 1 and "running" in container(p)["state"]
        and container(p).get("resources") == AFTER and not resize_conditions(p)))
    assert cgroup_limits(after) == (40_000, 128 * MIB)
    parent = f"/kubepods/burstable/pod{pod['metadata']['uid']}"
    assert cgroup_file(parent, "", "cpu/cpu.cfs_quota_us", "cpu.max").read_text().split()[0] == "40000"
    node = json.loads(control_plane.kubectl("get", "node", NODE, "-o", "json").stdout)
    capacity = quantity.value(quantity.parse(node["status"]["capacity"]["memory"]))
    out, _, code = runtime.exec_sync(container(after)["containerID"].split("://", 1)[1],
                                     ["cat", "/proc/1/oom_score_adj"], 10)
    assert (code, out.decode().strip()) == (0, str(1000 - 1000 * 32 * MIB // capacity))  # Burstable: its share
    assert [e["reason"] for e in events(control_plane, pod)].count("Failed") == 0
    delete(control_plane, "grown")


def test_a_memory_limit_below_the_usage_waits(control_plane, kubelet, runtime, kubepods, tmp_path):
    """The container holds 48 MiB in its /dev/shm (charged to its memory cgroup): a limit of 32Mi is not
    applied, as the kubelet's validateMemoryResizeAction; undone, the condition goes."""
    big = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}
    fill = ["sh", "-c", "head -c 50331648 /dev/zero > /dev/shm/fill && exec sleep 3600"]
    pod = running(control_plane, tmp_path, "full", big, command=fill)
    wait_for("the container's usage", lambda: runtime.container_stats(
        container(pod)["containerID"].split("://", 1)[1]).memory.usage_bytes.value >= 48 * MIB, timeout=30)
    small = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "32Mi"}}
    resize(control_plane, "full", small)
    held = wait_pod(control_plane, "full", "PodResizeInProgress Error", lambda p: any(
        c["type"] == "PodResizeInProgress" and c.get("reason") == "Error" for c in resize_conditions(p)))
    (cond,) = [c for c in resize_conditions(held) if c["type"] == "PodResizeInProgress"]
    assert "cannot decrease memory limits" in cond["message"] and "below current usage" in cond["message"], cond
    assert container(held)["resources"]["limits"]["memory"] == "128Mi"
    assert container(held)["allocatedResources"] == small["requests"]
    assert cgroup_limits(held)[1] == 128 * MIB
    same_container(control_plane, runtime, pod)
    resize(control_plane, "full", big)
    resized(control_plane, "full", big)
    same_container(control_plane, runtime, pod)
    delete(control_plane, "full")


def test_more_cpu_than_the_node_has(control_plane, kubelet, runtime, kubepods, tmp_path):
    """The 1.37 API server refuses it (PodResizeValidator, against the Node's allocatable); with the Node's
    status saying more cpu than the machine has (a stale view, as the kubelet reports it again only every few
    minutes), the patch goes through and pykubelet, which weighs it against the machine, says Infeasible:
    nothing changes on the node."""
    pod = running(control_plane, tmp_path, "greedy", BEFORE)
    allocatable = node_allocatable(control_plane)
    too_much = f"{2 * millicores(allocatable['cpu'])}m"
    greedy = {"requests": {"cpu": too_much, "memory": "32Mi"}, "limits": {"cpu": too_much, "memory": "64Mi"}}
    refused = resize(control_plane, "greedy", greedy, check=False)
    assert refused.returncode != 0 and "node didn't have enough allocatable resources" in refused.stderr, refused
    control_plane.kubectl("patch", "node", NODE, "--subresource", "status", "-p",
                          json.dumps({"status": {"allocatable": {"cpu": "1000"}}}))
    try:
        resize(control_plane, "greedy", greedy)
    finally:
        control_plane.kubectl("patch", "node", NODE, "--subresource", "status", "-p",
                              json.dumps({"status": {"allocatable": {"cpu": allocatable["cpu"]}}}))
    pending = wait_pod(control_plane, "greedy", "PodResizePending Infeasible", lambda p: any(
        c["type"] == "PodResizePending" and c.get("reason") == "Infeasible" for c in resize_conditions(p)))
    (cond,) = resize_conditions(pending)
    assert cond["message"].startswith("Node didn't have enough capacity: cpu, requested: "), cond
    assert cond["observedGeneration"] == pending["metadata"]["generation"]
    assert container(pending)["resources"] == BEFORE and container(pending)["allocatedResources"] == BEFORE[
        "requests"]
    assert cgroup_limits(pending) == (20_000, 64 * MIB)
    assert "ResizeInfeasible" in [e["reason"] for e in events(control_plane, pod)]
    same_container(control_plane, runtime, pod)
    delete(control_plane, "greedy")


def test_a_resize_waits_for_room_then_is_done(control_plane, kubelet, runtime, kubepods, tmp_path):
    """Half the node's cpu is requested by another pod: a resize that needs more than the rest is Deferred,
    and done once that pod is deleted."""
    half = f"{millicores(node_allocatable(control_plane)['cpu']) // 2}m"
    running(control_plane, tmp_path, "hog", {"requests": {"cpu": half}})
    small = {"requests": {"cpu": "100m"}}
    pod = running(control_plane, tmp_path, "waiting", small)
    grown = {"requests": {"cpu": f"{millicores(half) + 100}m"}}
    resize(control_plane, "waiting", grown)
    deferred = wait_pod(control_plane, "waiting", "PodResizePending Deferred", lambda p: any(
        c["type"] == "PodResizePending" and c.get("reason") == "Deferred" for c in resize_conditions(p)))
    assert container(deferred)["allocatedResources"] == small["requests"]
    delete(control_plane, "hog")
    resized(control_plane, "waiting", grown, timeout=30)
    same_container(control_plane, runtime, pod)
    delete(control_plane, "waiting")


def pod_cpu_shares(pod: dict, millicores: int) -> tuple[int, int]:
    """The pod's cgroup's cpu.shares (on v2 its cpu.weight), and what it is for a request of `millicores`."""
    path = cgroup_file(f"/kubepods/burstable/pod{pod['metadata']['uid']}", "", "cpu/cpu.shares", "cpu.weight")
    shares = millicores * 1024 // 1000
    return int(path.read_text()), shares if path.name == "cpu.shares" else 1 + ((shares - 2) * 9999) // 262142


def test_a_pod_level_request_resize_goes_to_the_pods_cgroup(control_plane, kubelet, runtime, kubepods, tmp_path):
    """What e2e's PLR Pod InPlace Resize specs do of pod-level requests: the pod's cgroup takes the new cpu
    request as its shares, the status says it (allocatedResources, observedGeneration) with no resize condition
    left, and the container, whose own resources are unchanged, is the one it was."""
    apply(control_plane, tmp_path, pod_spec("plr", {"name": "c", "image": BUSYBOX, "command": SLEEP, "resources": {
        "requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}},
        resources={"requests": {"cpu": "300m"}, "limits": {"cpu": "600m"}}))
    pod = wait_pod(control_plane, "plr", "Running", lambda p: p.get("status", {}).get("phase") == "Running")
    assert pod["status"]["allocatedResources"] == {"cpu": "300m"}
    got, want = pod_cpu_shares(pod, 300)
    assert got == want
    control_plane.kubectl("patch", "pod", "plr", "--subresource", "resize", "-p",
                          json.dumps({"spec": {"resources": {"requests": {"cpu": "500m"}}}}))
    after = wait_pod(control_plane, "plr", "resized", lambda p: (
        p["status"].get("allocatedResources") == {"cpu": "500m"} and not resize_conditions(p)
        and p["status"].get("observedGeneration") == p["metadata"]["generation"] == 2), timeout=60)
    got, want = pod_cpu_shares(after, 500)
    assert got == want
    same_container(control_plane, runtime, pod)
    delete(control_plane, "plr")


def test_a_running_init_container_is_resized_in_place(control_plane, kubelet, runtime, kubepods, tmp_path):
    """What e2e's Pod InPlace Resize Init Container spec does: an init container that runs once, resized while
    it runs (the API server lets it through only as the node declares InPlacePodVerticalScalingInitContainers),
    keeps running with its new limits, and its status says them."""
    apply(control_plane, tmp_path, pod_spec("initresize", {"name": "c", "image": BUSYBOX, "command": SLEEP},
                                            initContainers=[{"name": "init", "image": BUSYBOX, "command": SLEEP,
                                                             "resources": BEFORE}]))

    def init(p: dict) -> dict:
        statuses = p.get("status", {}).get("initContainerStatuses") or [{}]
        return statuses[0]
    pod = wait_pod(control_plane, "initresize", "its init container running", lambda p: (
        "running" in init(p).get("state", {}) and init(p).get("resources") == BEFORE))
    assert cgroup_limits(pod, init(pod)) == (20_000, 64 * MIB)
    patch = {"spec": {"initContainers": [{"name": "init", "resources": AFTER}]}}
    control_plane.kubectl("patch", "pod", "initresize", "--subresource", "resize", "-p", json.dumps(patch))
    after = wait_pod(control_plane, "initresize", f"init resized to {AFTER}", lambda p: (
        init(p).get("resources") == AFTER and init(p).get("allocatedResources") == AFTER["requests"]
        and not resize_conditions(p)), timeout=60)
    assert (init(after)["containerID"], init(after)["restartCount"]) == (init(pod)["containerID"], 0)
    assert "running" in init(after)["state"] and after["status"]["phase"] == "Pending"
    assert cgroup_limits(after, init(after)) == (40_000, 128 * MIB)
    delete(control_plane, "initresize")


def test_a_restarted_kubelet_keeps_the_resize(control_plane, kubelet, runtime, kubepods, tmp_path):
    """The allocation is in the kubelet's checkpoint (0600): killed and started again, it resizes nothing and
    restarts nothing. The last test of the module: the restarted kubelet is this test's to stop."""
    pod = running(control_plane, tmp_path, "kept", BEFORE)
    resize(control_plane, "kept", AFTER)
    resized(control_plane, "kept", AFTER)
    checkpoint = kubelet.work / "root" / "allocated_pods_state"
    assert stat.S_IMODE(checkpoint.stat().st_mode) == 0o600
    assert json.loads(checkpoint.read_text())["pods"][pod["metadata"]["uid"]]["containers"]["c"] == AFTER
    try:
        kubelet.kill()
        kubelet.start()
        wait_for("the kubelet's pod workers", lambda: kubelet.log_path.read_text().count("starting pykubelet") == 2)
        time.sleep(5)  # a few passes of the restarted kubelet
        after = same_container(control_plane, runtime, pod)
        assert container(after)["resources"] == AFTER and not resize_conditions(after)
        assert cgroup_limits(after) == (40_000, 128 * MIB)
    finally:
        delete(control_plane, "kept")
        kubelet.stop()
