"""Local-storage eviction on a real node (a stock kube-apiserver, pykubelet, a CRI runtime): a pod that
writes past its emptyDir's sizeLimit, or a container past its ephemeral-storage limit, is evicted (phase
Failed, reason Evicted, the kubelet's message, an Evicted event) and its containers stopped, while a pod
within its limits on the same node keeps running. The writes are a few MiB, on the node's real disk."""
from __future__ import annotations

import json

from tests.kit.kubelet_node import BUSYBOX, apply, delete, get_pod, on_node, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-eviction"
NODE_IP = "10.201.0.41"
STOPPABLE = "trap 'exit 0' TERM; "  # sh as PID 1 ignores SIGTERM unless it traps it


def container(name: str, command: str, **extra) -> dict:
    return {"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", STOPPABLE + command], **extra}


def running(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") == "Running"


def evicted(pod: dict) -> bool:
    return pod.get("status", {}).get("reason") == "Evicted"


def events(cp, name: str) -> list[dict]:
    out = cp.kubectl("get", "events", "-n", "default", "--field-selector",
                     f"involvedObject.name={name},reason=Evicted", "-o", "json")
    return json.loads(out.stdout)["items"]


def assert_evicted(cp, runtime, name: str, message: str) -> None:
    pod = wait_pod(cp, name, "Evicted", evicted, timeout=60)
    status = pod["status"]
    assert (status["phase"], status["message"]) == ("Failed", message)
    assert all("terminated" in s["state"] for s in status["containerStatuses"]), status["containerStatuses"]
    sandboxes, containers = on_node(runtime, pod["metadata"]["uid"])
    assert not sandboxes and not containers, "the evicted pod's containers still run"
    event = wait_for("an Evicted event", lambda: events(cp, name), timeout=30)[0]
    assert event["type"] == "Warning" and event["message"] == message


def test_pod_past_its_empty_dir_size_limit_is_evicted(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, kit_pod_spec(NODE, "bystander", container("main", "sleep 3600 & wait")))
    filler = kit_pod_spec(NODE, "filler", container(
        "main", "dd if=/dev/zero of=/scratch/fill bs=1M count=4; sleep 3600 & wait",
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}]),
        volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}])
    apply(control_plane, tmp_path, filler)
    try:
        wait_pod(control_plane, "bystander", "Running", running)
        assert_evicted(control_plane, runtime, "filler", 'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". ')
        assert running(get_pod(control_plane, "bystander"))
    finally:
        delete(control_plane, "filler")
        delete(control_plane, "bystander")


def test_container_past_its_ephemeral_storage_limit_is_evicted(control_plane, kubelet, runtime, kubepods, tmp_path):
    # two containers: the pod's total limit (101Mi) holds, the writer's own (1Mi) does not
    spec = kit_pod_spec(NODE, "writer", container(
        "writer", "dd if=/dev/zero of=/fill bs=1M count=4; sleep 3600 & wait",
        resources={"limits": {"ephemeral-storage": "1Mi"}}))
    spec["spec"]["containers"].append(container("quiet", "sleep 3600 & wait",
                                                resources={"limits": {"ephemeral-storage": "100Mi"}}))
    apply(control_plane, tmp_path, spec)
    try:
        assert_evicted(control_plane, runtime, "writer",
                       'Container writer exceeded its local ephemeral storage limit "1Mi". ')
    finally:
        delete(control_plane, "writer")
