"""The pod status semantics Kubernetes' own [NodeConformance] specs check, on a real node (a stock
kube-apiserver, pykubelet, a CRI runtime), each test doing what its spec does:

- an init container that fails leaves the pod not initialized (Initialized False, reason
  ContainersNotInitialized, naming the init containers not done) and its app containers waiting in
  PodInitializing; restartPolicy Never fails the pod (test/e2e/common/node/init_container.go);
- activeDeadlineSeconds lowered on a running pod ends it Failed with reason DeadlineExceeded
  (test/e2e/common/node/pods.go, "should allow activeDeadlineSeconds to be updated");
- readiness gates: Ready only once each gate's condition, patched in through pods/status, is True, and the
  kubelet's own status writes keep those conditions (pods.go, "should support pod readiness gates");
- a deleted pod whose container stops serving on SIGTERM turns not Ready before it is gone, and a liveness
  probe it fails on its way out kills nothing and reports nothing, for a container and a restartable init
  container (test/e2e/common/node/container_probe.go)."""
from __future__ import annotations

import json
import time

import pytest

from tests.kit.kubelet_node import BUSYBOX, apply, condition, delete, get_pod, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

# What these tests check is the kubelet's deciding (phases, conditions, restarts, grace), over CRI calls that
# test_kubelet_pods and test_kubelet_probes run on both runtimes: one runtime is enough here (make test's time),
# and `make conformance-k8s` runs the upstream specs on pykubelet with containerd too
pytestmark = pytest.mark.parametrize("cri", ["pyruntime-cri"], indirect=True, scope="module")

NODE = "pynode-e2e-status"
NODE_IP = "10.201.0.45"
IDLE = "trap 'exit 0' TERM; while true; do sleep 0.2; done"  # sh as PID 1 ignores SIGTERM unless it traps it
# the specs' script: ready and alive until SIGTERM, then neither, and still running a while
SERVING = ("trap 'rm -f /tmp/ready /tmp/liveness; sleep 15; exit 0' TERM; touch /tmp/ready /tmp/liveness; "
           "while true; do sleep 1; done")


def busybox(name: str, script: str = IDLE, **fields) -> dict:
    return {"name": name, "image": BUSYBOX, "command": ["sh", "-c", script], **fields}


def pod_spec(name: str, container: dict, **spec) -> dict:
    return kit_pod_spec(NODE, name, container, **spec)


def conditions(pod: dict) -> dict[str, dict]:
    return {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}


def events(cp, pod: dict) -> list[dict]:
    out = cp.kubectl("get", "events", "--field-selector", f"involvedObject.uid={pod['metadata']['uid']}",
                     "-o", "json")
    return json.loads(out.stdout)["items"]


def test_a_failing_init_container_keeps_a_restart_always_pod_initializing(control_plane, kubelet, kubepods,
                                                                          tmp_path):
    """[Conformance] "should not start app containers if init containers fail on a RestartAlways pod"."""
    apply(control_plane, tmp_path, pod_spec("init-always", busybox("run1"), initContainers=[
        busybox("init1", "exit 1"), busybox("init2", "true")]))
    try:
        def checked(p: dict) -> bool:
            status = p.get("status", {})
            for s in status.get("containerStatuses", []):
                assert s["state"].get("waiting", {}).get("reason") == "PodInitializing", s
            inits = status.get("initContainerStatuses", [])
            if len(inits) != 2:
                return False
            assert inits[1]["state"].get("waiting", {}).get("reason") == "PodInitializing", inits[1]
            assert inits[0]["state"].get("terminated", {}).get("exitCode") != 0, inits[0]
            return inits[0]["restartCount"] >= 3

        pod = wait_pod(control_plane, "init-always", "init1 restarted three times", checked, timeout=150)
        assert pod["status"]["phase"] == "Pending"
        init = conditions(pod)["Initialized"]
        assert (init["status"], init["reason"], init["message"]) == (
            "False", "ContainersNotInitialized", "containers with incomplete status: [init1 init2]")
        assert condition(pod, "Ready") == "False"
    finally:
        delete(control_plane, "init-always")


def test_a_failing_init_container_fails_a_restart_never_pod(control_plane, kubelet, kubepods, tmp_path):
    """[Conformance] "should not start app containers and fail the pod if init containers fail on a
    RestartNever pod"."""
    apply(control_plane, tmp_path, pod_spec("init-never", busybox("run1", "true"), restartPolicy="Never",
                                            initContainers=[busybox("init1", "true"), busybox("init2", "exit 1")]))
    try:
        pod = wait_pod(control_plane, "init-never", "Failed", lambda p: p["status"].get("phase") == "Failed",
                       timeout=60)
        init = conditions(pod)["Initialized"]
        assert (init["status"], init["reason"], init["message"]) == (
            "False", "ContainersNotInitialized", "containers with incomplete status: [init2]")
        inits = pod["status"]["initContainerStatuses"]
        assert [s["state"]["terminated"]["exitCode"] for s in inits] == [0, 1]
        (run1,) = pod["status"]["containerStatuses"]
        assert run1["state"]["waiting"]["reason"] == "PodInitializing" and run1["restartCount"] == 0
        assert conditions(pod)["Ready"]["reason"] == "PodFailed"
    finally:
        delete(control_plane, "init-never")


def test_a_lowered_active_deadline_fails_the_pod_with_deadline_exceeded(control_plane, kubelet, kubepods, tmp_path):
    """[Conformance] "should allow activeDeadlineSeconds to be updated"."""
    apply(control_plane, tmp_path, pod_spec("deadline", busybox("c")))
    try:
        wait_pod(control_plane, "deadline", "Running", lambda p: p["status"].get("phase") == "Running")
        control_plane.kubectl("patch", "pod", "deadline", "-p", json.dumps({"spec": {"activeDeadlineSeconds": 5}}))
        pod = wait_pod(control_plane, "deadline", "Failed", lambda p: p["status"].get("phase") == "Failed",
                       timeout=60)
        assert pod["status"]["reason"] == "DeadlineExceeded"
        assert pod["status"]["message"] == "Pod was active on the node longer than the specified deadline"
        assert condition(pod, "Ready") == "False" and "DisruptionTarget" not in conditions(pod)
        assert [e for e in events(control_plane, pod) if e["reason"] == "DeadlineExceeded" and e["type"] == "Normal"]
    finally:
        delete(control_plane, "deadline")


def test_readiness_gates_hold_ready_until_each_condition_is_true(control_plane, kubelet, kubepods, tmp_path):
    """"should support pod readiness gates [NodeConformance]"."""
    gate1, gate2 = "k8s.io/test-condition1", "k8s.io/test-condition2"

    def set_gate(gate: str, value: str) -> None:
        control_plane.kubectl("patch", "pod", "gates", "--subresource", "status", "--type", "strategic", "-p",
                              json.dumps({"status": {"conditions": [{"type": gate, "status": value}]}}))

    apply(control_plane, tmp_path, pod_spec("gates", busybox("c"), readinessGates=[
        {"conditionType": gate1}, {"conditionType": gate2}]))
    try:
        pod = wait_pod(control_plane, "gates", "Running with its containers ready",
                       lambda p: p["status"].get("phase") == "Running" and condition(p, "ContainersReady") == "True")
        ready = conditions(pod)["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "ReadinessGatesNotReady")
        set_gate(gate1, "True")
        time.sleep(10)  # the spec's syncLoopFrequency: the kubelet's writes meanwhile keep gate1's condition
        pod = get_pod(control_plane, "gates")
        assert condition(pod, "Ready") == "False" and condition(pod, gate1) == "True"
        assert conditions(pod)["Ready"]["message"] == (
            f'corresponding condition of pod readiness gate "{gate2}" does not exist.')
        set_gate(gate2, "True")
        wait_pod(control_plane, "gates", "Ready", lambda p: condition(p, "Ready") == "True", timeout=60)
        set_gate(gate1, "False")
        pod = wait_pod(control_plane, "gates", "not Ready", lambda p: condition(p, "Ready") == "False", timeout=60)
        assert condition(pod, gate2) == "True"
    finally:
        delete(control_plane, "gates")


def _not_ready_while_terminating(cp, name: str, probed: str) -> None:
    """Deletes the Ready pod `name` and checks it turns not Ready before it is gone, and that its container
    `probed`, failing its liveness probe on its way out, is neither killed for it nor reported."""
    pod = wait_pod(cp, name, "Running and Ready", lambda p: condition(p, "Ready") == "True", timeout=90)
    cp.kubectl("delete", "pod", name, "--wait=false")
    terminating = wait_pod(cp, name, "not Ready while terminating", lambda p: condition(p, "Ready") == "False",
                           timeout=40)
    assert terminating["metadata"].get("deletionTimestamp"), "gone before it turned not Ready"
    time.sleep(5)  # the liveness probe would have failed (period 1 s, threshold 1) and killed the container
    assert not [e for e in events(cp, pod) if "failed liveness probe" in e.get("message", "")
                or e.get("message", "").startswith("Liveness probe failed")]
    statuses = get_pod(cp, name)["status"]
    assert all(s["restartCount"] == 0 for s in statuses.get("containerStatuses", [])
               + statuses.get("initContainerStatuses", []) if s["name"] == probed)


def test_a_deleted_pod_turns_not_ready_while_it_terminates(control_plane, kubelet, kubepods, tmp_path):
    """"should mark readiness on pods to false and disable liveness probes while pod is in progress of
    terminating" (and its readiness-only sibling)."""
    probe = {"initialDelaySeconds": 2, "failureThreshold": 1}
    apply(control_plane, tmp_path, pod_spec("terminating", busybox(
        "c", SERVING, readinessProbe={"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 2, **probe},
        livenessProbe={"exec": {"command": ["cat", "/tmp/liveness"]}, "periodSeconds": 1, **probe}),
        terminationGracePeriodSeconds=30))
    try:
        _not_ready_while_terminating(control_plane, "terminating", "c")
    finally:
        delete(control_plane, "terminating")


def test_a_deleted_pods_sidecar_turns_it_not_ready_while_it_terminates(control_plane, kubelet, kubepods, tmp_path):
    """The restartable init container variants of the same specs ("Probing restartable init container")."""
    probe = {"initialDelaySeconds": 2, "failureThreshold": 1}
    sidecar = busybox("sidecar", SERVING, restartPolicy="Always",
                      readinessProbe={"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 2, **probe},
                      livenessProbe={"exec": {"command": ["cat", "/tmp/liveness"]}, "periodSeconds": 1, **probe})
    apply(control_plane, tmp_path, pod_spec("terminating-sidecar", busybox("main"), initContainers=[sidecar],
                                            terminationGracePeriodSeconds=30))
    try:
        _not_ready_while_terminating(control_plane, "terminating-sidecar", "sidecar")
    finally:
        delete(control_plane, "terminating-sidecar")
