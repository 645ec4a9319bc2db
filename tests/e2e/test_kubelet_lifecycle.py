"""What Kubernetes' own [NodeConformance] specs check of the kubelet's lifecycle hooks, probes and restart
rules, end to end against a stock kube-apiserver on each CRI runtime (containerd 1.6 and pyruntime-cri):

- a preStop sleep runs before the stop, and a pod kept by a finalizer shows its container terminated, with
  the finish time that says so ([sig-node] Lifecycle Sleep Hook valid prestop hook using sleep action);
- a second deletion with a shorter grace period cuts the sleep: the container ends by the new deadline
  (Lifecycle Sleep Hook reduce GracePeriodSeconds during runtime);
- an http liveness probe answered with a redirect to another host is a success: no restart, and a
  ProbeWarning event that quotes the body ([sig-node] Probing container should *not* be restarted with a
  non-local redirect http liveness probe);
- a container's own restartPolicy and restartPolicyRules decide its restart and the pod's phase ([sig-node]
  Pod Extended (container restart policy));
- a container's exit that its RestartAllContainers rule matches restarts every init, sidecar and regular
  container of the pod in place, once, each with a restart count and a last termination, and then they
  run ([sig-node] Pod Extended (RestartAllContainers): on a regular container's exit, a sidecar's, an init
  container's, with two such rules (no loop), after an earlier plain restart);
- the node declares the features it implements (RestartAllContainersOnContainerExits among them). A pod
  that needs one it lacks is refused with PodFeatureUnsupported (tests/unit/test_kubelet_node_features.py:
  the API server, with its default gates, takes no pod that needs one of the others).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Iterator

import pytest

from tests.kit.kubelet_node import BUSYBOX, apply, condition, delete, get_pod, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

# What these tests check is the kubelet's deciding (phases, conditions, restarts, grace), over CRI calls that
# test_kubelet_pods and test_kubelet_probes run on both runtimes: one runtime is enough here (make test's time),
# and `make conformance-k8s` runs the upstream specs on pykubelet with containerd too
pytestmark = pytest.mark.parametrize("cri", ["pyruntime-cri"], indirect=True, scope="module")

NODE = "pynode-e2e-lifecycle"
NODE_IP = "10.201.0.48"
IDLE = "trap 'exit 0' TERM; while true; do sleep 0.2; done"  # ends at once on SIGTERM
FINALIZER = "pynode.test/hold"
REDIRECT_BODY = '<a href="http://0.0.0.0/">Found</a>.'
REDIRECT = (b"HTTP/1.1 302 Found\r\nLocation: http://0.0.0.0/\r\nContent-Type: text/html\r\n"
            + f"Content-Length: {len(REDIRECT_BODY)}\r\n\r\n{REDIRECT_BODY}".encode())
# an HTTP server on 8080 whose every answer is a 302 to another host (http.Redirect's body), one connection
# at a time, as agnhost's /redirect?loc=http://0.0.0.0/; the answer in octal escapes, which no quoting mangles
REDIRECTOR = ("trap 'exit 0' TERM; while true; do nc -l -p 8080 -e sh -c \"printf '"
              + "".join(f"\\{b:03o}" for b in REDIRECT) + "'; cat >/dev/null\"; done & wait")


def busybox(name: str, script: str = IDLE, **fields) -> dict:
    return {"name": name, "image": BUSYBOX, "command": ["sh", "-c", script], **fields}


def status_of(pod: dict, name: str) -> dict:
    return next((s for s in pod.get("status", {}).get("containerStatuses", []) if s["name"] == name), {})


def when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def release(cp, name: str) -> None:
    """The finalizer off, then the pod deleted (it goes at once: its containers are gone already)."""
    cp.kubectl("patch", "pod", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
    delete(cp, name)


def events(cp, pod: dict) -> list[dict]:
    out = cp.kubectl("get", "events", "--field-selector", f"involvedObject.uid={pod['metadata']['uid']}",
                     "-o", "json")
    return json.loads(out.stdout)["items"]


@contextlib.contextmanager
def sleeping_pre_stop(cp, tmp_path, name: str, sleep: int, grace: int) -> Iterator[None]:
    """A running pod whose container's preStop hook sleeps `sleep` s, kept by a finalizer so that its terminated
    status stays to be read once the kubelet is done with it; released at the end."""
    pod = kit_pod_spec(NODE, name, busybox("c", lifecycle={"preStop": {"sleep": {"seconds": sleep}}}),
                       terminationGracePeriodSeconds=grace)
    pod["metadata"]["finalizers"] = [FINALIZER]
    apply(cp, tmp_path, pod)
    try:
        wait_pod(cp, name, "Running", lambda p: "running" in status_of(p, "c").get("state", {}))
        yield
    finally:
        release(cp, name)


def terminated(cp, name: str, timeout: float) -> dict:
    return wait_pod(cp, name, "its container terminated", lambda p: "terminated" in status_of(p, "c").get("state", {}),
                    timeout=timeout)


def test_pre_stop_sleep_then_the_terminated_status_of_a_pod_kept_by_a_finalizer(control_plane, kubelet,
                                                                                kubepods, tmp_path):
    with sleeping_pre_stop(control_plane, tmp_path, "sleepy", sleep=5, grace=30):
        control_plane.kubectl("delete", "pod", "sleepy", "--wait=false")
        deleted = get_pod(control_plane, "sleepy")
        asked = when(deleted["metadata"]["deletionTimestamp"]) - datetime.timedelta(seconds=30)
        ended = terminated(control_plane, "sleepy", timeout=40)
        state = status_of(ended, "c")["state"]["terminated"]
        slept = (when(state["finishedAt"]) - asked).total_seconds()
        assert 5 <= slept < 30, (slept, state)  # the hook's 5 s, then the container's own end on SIGTERM
        assert state["exitCode"] == 0 and ended["status"]["phase"] == "Succeeded"  # the trap's exit


def test_a_shorter_grace_period_cuts_a_sleeping_pre_stop(control_plane, kubelet, kubepods, tmp_path):
    with sleeping_pre_stop(control_plane, tmp_path, "cut", sleep=50, grace=100):
        control_plane.kubectl("delete", "pod", "cut", "--wait=false")
        time.sleep(3)  # the hook sleeps
        control_plane.kubectl("delete", "pod", "cut", "--wait=false", "--grace-period=5")
        deadline = when(get_pod(control_plane, "cut")["metadata"]["deletionTimestamp"])
        finished = when(status_of(terminated(control_plane, "cut", timeout=30), "c")["state"]["terminated"]
                        ["finishedAt"])
        # by the new deadline, not the 50 s sleep: the stop after the hook gets the kubelet's minimum grace (2 s,
        # which a container ignoring SIGTERM takes whole), and both times are whole seconds
        assert (finished - deadline).total_seconds() <= 5, (finished, deadline)


def test_a_redirect_to_another_host_is_a_liveness_success_with_a_warning(control_plane, kubelet, kubepods,
                                                                         tmp_path):
    probe = {"httpGet": {"path": "/redirect", "port": 8080}, "initialDelaySeconds": 1, "periodSeconds": 1,
             "failureThreshold": 1}
    apply(control_plane, tmp_path, kit_pod_spec(NODE, "redirect", busybox("c", REDIRECTOR, livenessProbe=probe)))
    try:
        pod = wait_pod(control_plane, "redirect", "Running",
                       lambda p: "running" in status_of(p, "c").get("state", {}))
        warning = wait_for("a ProbeWarning event", lambda: [e for e in events(control_plane, pod)
                                                          if e["reason"] == "ProbeWarning"], timeout=30)
        assert warning[0]["type"] == "Warning" and warning[0]["involvedObject"]["fieldPath"] == "spec.containers{c}"
        assert warning[0]["message"] == f"Liveness probe warning: Probe terminated redirects, Response body: " \
                                        f"{REDIRECT_BODY}", warning
        time.sleep(5)
        assert status_of(get_pod(control_plane, "redirect"), "c")["restartCount"] == 0
        assert not [e for e in events(control_plane, pod) if e["reason"] in ("Unhealthy", "Killing")]
    finally:
        delete(control_plane, "redirect")


def test_a_containers_own_restart_policy_and_rules(control_plane, kubelet, kubepods, tmp_path):
    rule = {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
    apply(control_plane, tmp_path, kit_pod_spec(
        NODE, "ruled", busybox("c", "exit 42", restartPolicy="Never", restartPolicyRules=[rule]),
        restartPolicy="Never"))
    apply(control_plane, tmp_path, kit_pod_spec(
        NODE, "never", busybox("c", "exit 1", restartPolicy="Never"), restartPolicy="Always"))
    try:
        pod = wait_pod(control_plane, "ruled", "restarted by its rule",
                       lambda p: status_of(p, "c").get("restartCount", 0) >= 1, timeout=60)
        assert pod["status"]["phase"] in ("Pending", "Running"), pod["status"]  # restarting: not ended
        pod = wait_pod(control_plane, "never", "Failed", lambda p: p["status"].get("phase") == "Failed")
        assert status_of(pod, "c")["restartCount"] == 0
        assert status_of(pod, "c")["state"]["terminated"]["exitCode"] == 1
    finally:
        delete(control_plane, "ruled")
        delete(control_plane, "never")


def test_the_node_declares_its_features(control_plane, kubelet, kubepods, tmp_path):
    node = json.loads(control_plane.kubectl("get", "node", NODE, "-o", "json").stdout)
    assert node["status"]["declaredFeatures"] == ["InPlacePodLevelResourcesVerticalScaling",
                                                  "InPlacePodVerticalScalingInitContainers",
                                                  "RestartAllContainersOnContainerExits"]


ALL_ON_42 = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
WORKDIR = {"name": "workdir", "mountPath": "/mnt"}
SLEEP = "sleep 10000"


def ruled(name: str, script: str, policy: str, mount: bool = True) -> dict:
    return busybox(name, script, restartPolicy=policy, restartPolicyRules=ALL_ON_42,
                   **({"volumeMounts": [WORKDIR]} if mount else {}))


# the specs' pods (test/e2e/common/node/container_restart_policy.go): (init containers, containers, the pod's
# restartPolicy, the containers that restart, the ones that run in the end, how long nothing may restart then:
# longer than a source sleeps before it exits, where it does)
RESTART_ALL_SPECS = {
    "on regular container exit": (
        [busybox("init", "exit 0"), busybox("sidecar", SLEEP, restartPolicy="Always")],
        [ruled("source-container", "if [ -f /mnt/restart-complete ]; then sleep 10000; "
                                   "else touch /mnt/restart-complete; exit 42; fi", "Never"),
         busybox("regular", SLEEP)],
        "Never", ["init", "sidecar", "source-container", "regular"], ["source-container", "regular"], 3),
    "on sidecar container exit": (
        [busybox("init", "exit 0"), busybox("sidecar", SLEEP, restartPolicy="Always"),
         ruled("source-sidecar", "if [ -f /mnt/init-complete ]; then sleep 10000; "
                                 "else touch /mnt/init-complete; sleep 30; exit 42; fi", "Always")],
        [busybox("regular", SLEEP)],
        "Never", ["init", "sidecar", "source-sidecar", "regular"], ["regular", "source-sidecar"], 3),
    "init and sidecar containers on init container exit": (
        [busybox("sidecar", SLEEP, restartPolicy="Always"), busybox("init", "exit 0"),
         ruled("source-init", "if [ -f /mnt/init-complete ]; then exit 0; "
                              "else touch /mnt/init-complete; exit 42; fi", "Never")],
        [busybox("regular", SLEEP)],
        "Never", ["init", "sidecar", "source-init"], ["regular"], 3),
    "with two rules, once (no loop)": (
        [],
        [ruled("source-container", "if [ -f /mnt/restart-complete ]; then sleep 10000; "
                                   "else touch /mnt/restart-complete; sleep 10; exit 42; fi", "Never"),
         ruled("regular", SLEEP, "Never", mount=False)],
        "Never", ["source-container", "regular"], ["source-container", "regular"], 12),
    "on a previously restarted regular container exit": (
        [],
        [ruled("source-container", "if [ -f /mnt/restart-complete ]; then sleep 10000; "
                                   "elif [ -f /mnt/restart-1 ]; then touch /mnt/restart-complete; exit 42; "
                                   "else touch /mnt/restart-1; exit 1; fi", "Always"),
         busybox("regular", SLEEP)],
        "Always", ["source-container", "regular"], ["source-container", "regular"], 3),
}


def all_statuses(pod: dict) -> dict[str, dict]:
    status = pod.get("status", {})
    return {s["name"]: s for s in status.get("initContainerStatuses", []) + status.get("containerStatuses", [])}


@pytest.mark.parametrize("spec", list(RESTART_ALL_SPECS))
def test_restart_all_containers(control_plane, kubelet, kubepods, tmp_path, spec):
    """What the spec's validateAllContainersRestarted checks: each of its containers has restarted and has
    a last termination (the reset's, RestartingAllContainers), then the ones it names run; besides, once
    they run the pod is not restarting any more (AllContainersRestarting False), it never failed, and
    nothing restarts again (no loop)."""
    init, containers, policy, restarting, running, settle = RESTART_ALL_SPECS[spec]
    name = "restart-all"
    apply(control_plane, tmp_path, kit_pod_spec(
        NODE, name, containers[0], containers=containers, initContainers=init, restartPolicy=policy,
        volumes=[{"name": "workdir", "emptyDir": {}}]))
    try:
        def restarted(p: dict) -> bool:
            assert p.get("status", {}).get("phase") != "Failed", p.get("status")
            statuses = all_statuses(p)
            return all(statuses.get(c, {}).get("restartCount", 0) > 0
                       and "terminated" in statuses[c].get("lastState", {}) for c in restarting)

        wait_pod(control_plane, name, "all its containers restarted", restarted, timeout=180)
        pod = wait_pod(control_plane, name, f"{running} running", lambda p: all(
            "running" in all_statuses(p).get(c, {}).get("state", {}) for c in running), timeout=180)
        assert condition(pod, "AllContainersRestarting") == "False", pod["status"]
        counts = {c: s["restartCount"] for c, s in all_statuses(pod).items()}
        time.sleep(settle)
        after = get_pod(control_plane, name)
        assert {c: s["restartCount"] for c, s in all_statuses(after).items()} == counts, after["status"]
        assert after["status"]["phase"] == "Running" and condition(after, "AllContainersRestarting") == "False"
    finally:
        delete(control_plane, name)
