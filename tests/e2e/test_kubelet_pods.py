"""pykubelet runs the pods bound to its node through CRI (containerd 1.6 and pyruntime-cri): a web server pod reaches
Running and Ready with its IP and answers there; a crash-looping container restarts with a growing back-off
and its restartCount grows; `kubectl delete pod` stops the container with SIGTERM and leaves nothing on the
node (no sandbox, no container, no IP reservation, no pod cgroup) before the pod object goes.

Images come from the test registry through the runtime's certs.d mirrors (tests/conformance/critest.py's
registry pieces), so nothing leaves the machine."""
from __future__ import annotations

import json
import re
import time

import requests

from proto import api_pb2
from tests.kit.kubelet_node import (
    BUSYBOX,
    HTTPD,
    apply,
    condition,
    delete,
    get_pod,
    kubepods_dirs,
    on_node,
    wait_for,
    wait_pod,
)
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-pods"
NODE_IP = "10.201.0.21"


def pod_spec(name: str, container: dict, **spec) -> dict:
    return kit_pod_spec(NODE, name, container, **spec)


def test_pod_runs_ready_with_ip_and_answers(control_plane, kubelet, runtime, cri, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("web", {"name": "httpd", "image": HTTPD,
                                                   "ports": [{"containerPort": 80}]}))
    try:
        pod = wait_for("web Running and Ready", lambda: (lambda p: p if p.get("status", {}).get("phase") == "Running"
                                                          and condition(p, "Ready") == "True" else None)(
            get_pod(control_plane, "web")), timeout=90)
        status = pod["status"]
        assert status["podIP"].startswith("10.235.") and status["podIPs"] == [{"ip": status["podIP"]}]
        assert status["hostIP"] == NODE_IP
        for kind in ("Initialized", "ContainersReady", "PodScheduled", "PodReadyToStartContainers"):
            assert condition(pod, kind) == "True", kind
        (cs,) = status["containerStatuses"]
        assert cs["name"] == "httpd" and cs["ready"] and cs["started"] and cs["restartCount"] == 0
        assert "running" in cs["state"] and cs["containerID"].startswith(f"{runtime.version().runtime_name}://")
        assert cs["imageID"]
        answer = wait_for("an answer", lambda: _get(f"http://{status['podIP']}/"), timeout=20)
        assert "It works!" in answer
        sandboxes, containers = on_node(runtime, pod["metadata"]["uid"])
        assert len(sandboxes) == 1 and len(containers) == 1
        sandbox = sandboxes[0]
        assert sandbox.metadata.name == "web" and sandbox.labels["io.kubernetes.pod.namespace"] == "default"
        assert containers[0].annotations["io.kubernetes.container.restartCount"] == "0"
        log_dir = kubelet.pods_dir / f"default_web_{pod['metadata']['uid']}"
        assert (log_dir / "httpd" / "0.log").exists()
        events = json.loads(control_plane.kubectl("get", "events", "--field-selector",
                                                  f"involvedObject.uid={pod['metadata']['uid']}", "-o", "json").stdout)
        started = [e for e in events["items"] if e["reason"] == "Started"]
        assert started and started[0]["source"] == {"component": "kubelet", "host": NODE}
        assert started[0]["involvedObject"]["fieldPath"] == "spec.containers{httpd}"
    finally:
        delete(control_plane, "web")


def _get(url: str) -> str | None:
    try:
        return requests.get(url, timeout=2).text
    except requests.RequestException:
        return None


def test_crash_loop_backs_off_and_restart_count_grows(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("crash", {"name": "crash", "image": BUSYBOX,
                                                     "command": ["sh", "-c", "echo crashing; exit 3"]}))
    try:
        backoffs: dict[int, dict] = {}  # restartCount -> the first CrashLoopBackOff status seen with it
        ready_in_backoff: list[str] = []
        restarts: dict[int, float] = {}

        def restarted_twice():
            p = get_pod(control_plane, "crash")
            for cs in p.get("status", {}).get("containerStatuses", []):
                restarts.setdefault(cs["restartCount"], time.monotonic())
                if cs["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff":
                    backoffs.setdefault(cs["restartCount"], cs)
                    ready_in_backoff.append(condition(p, "Ready"))
                if cs["restartCount"] >= 2 and 1 in backoffs:
                    return p
            return None

        pod = wait_for("two restarts with back-off", restarted_twice, timeout=60, interval=0.3)
        # the back-off between the first and the second restart; the container restarted the second time may
        # have crashed again already (it exits at once), and be waiting out the next, 20 s, back-off
        cs = backoffs[1]
        assert "back-off 10s restarting failed container=crash" in cs["state"]["waiting"]["message"]
        assert all("back-off 20s" in b["state"]["waiting"]["message"] for n, b in backoffs.items() if n == 2)
        assert cs["lastState"]["terminated"]["exitCode"] == 3
        assert cs["lastState"]["terminated"]["reason"] == "Error"
        assert pod["status"]["phase"] == "Running"  # restartPolicy Always: it is being restarted
        assert set(ready_in_backoff) == {"False"}
        # the first restart is at once, the second waits out 10 s from the exit
        assert restarts[2] - restarts[1] >= 8, restarts
        # at most the newest container and the newest dead one are kept
        _, containers = on_node(runtime, pod["metadata"]["uid"])
        assert 1 <= len(containers) <= 2
    finally:
        delete(control_plane, "crash")


def test_finished_pod_succeeds_and_gives_back_its_ip(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("once", {"name": "once", "image": BUSYBOX,
                                                    "command": ["sh", "-c", "echo done"]}, restartPolicy="Never"))
    try:
        pod = wait_for("once Succeeded", lambda: (lambda p: p if p.get("status", {}).get("phase") == "Succeeded"
                                                  else None)(get_pod(control_plane, "once")), timeout=60)
        (cs,) = pod["status"]["containerStatuses"]
        assert cs["state"]["terminated"]["exitCode"] == 0 and cs["state"]["terminated"]["reason"] == "Completed"
        assert cs["restartCount"] == 0
        sandboxes, containers = wait_for("the sandbox stopped", lambda: (lambda o: o if all(
            s.state == api_pb2.SANDBOX_NOTREADY for s in o[0]) else None)(on_node(runtime, pod["metadata"]["uid"])))
        assert len(sandboxes) == 1 and len(containers) == 1  # the container stays, for its logs
    finally:
        delete(control_plane, "once")


def test_a_label_just_given_to_the_node_admits_the_next_pod(control_plane, kubelet, kubepods, tmp_path):
    """As the [Conformance] SchedulerPredicates specs do: a pod is admitted (the kubelet has read its node's
    labels), the node is labelled, and a pod whose required node affinity needs the label is bound at once: the
    kubelet admits it too, its admission reading the Node of its watch, not a copy of some seconds before."""
    sleep = {"name": "app", "image": BUSYBOX, "command": ["sleep", "3600"]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "e2e-rack", "operator": "In", "values": ["r7"]}]}]}}}
    apply(control_plane, tmp_path, pod_spec("first", sleep))
    try:
        wait_pod(control_plane, "first", "Running", lambda p: p.get("status", {}).get("phase") == "Running")
        control_plane.kubectl("label", "node", NODE, "e2e-rack=r7")
        apply(control_plane, tmp_path, pod_spec("labelled", sleep, affinity=affinity))
        pod = wait_pod(control_plane, "labelled", "Running or Failed",
                       lambda p: p.get("status", {}).get("phase") in ("Running", "Failed"))
        assert pod["status"]["phase"] == "Running", pod["status"]
    finally:
        delete(control_plane, "labelled")
        delete(control_plane, "first")
        control_plane.kubectl("label", "node", NODE, "e2e-rack-", check=False)


def test_delete_sends_sigterm_and_leaves_nothing(control_plane, kubelet, runtime, cri, kubepods, tmp_path):
    script = "trap 'echo got SIGTERM; exit 0' TERM; echo ready; while true; do sleep 0.2; done"
    # a grace period delete's 60 s wait can't see the end of: the deletion completes only if the container's
    # exit on SIGTERM ends it
    apply(control_plane, tmp_path, pod_spec("term", {"name": "term", "image": BUSYBOX,
                                                    "command": ["sh", "-c", script]},
                                            terminationGracePeriodSeconds=600))
    pod = wait_for("term Running", lambda: (lambda p: p if p.get("status", {}).get("phase") == "Running" else None)(
        get_pod(control_plane, "term")), timeout=60)
    uid, ip = pod["metadata"]["uid"], pod["status"]["podIP"]
    log_file = kubelet.pods_dir / f"default_term_{uid}" / "term" / "0.log"
    wait_for("the container's first line", lambda: "ready" in log_file.read_text())
    with open(log_file) as log:  # read after deletion: the open file outlives its directory
        delete(control_plane, "term")
        assert "got SIGTERM" in log.read(), "the container did not see SIGTERM"
    assert on_node(runtime, uid) == ([], [])
    assert not (kubelet.pods_dir / f"default_term_{uid}").exists()
    reservations = cri.work / "ipam"
    assert not any(ip in p.name for p in reservations.rglob("*")), list(reservations.rglob("*"))
    assert not [p for p in kubepods_dirs() if p.name == f"pod{uid}"]


def _events(cp, **selector) -> list[dict]:
    fields = ",".join(f"{k}={v}" for k, v in selector.items())
    out = cp.kubectl("get", "events", "-A", "--field-selector", fields, "-o", "json")
    return json.loads(out.stdout)["items"]


def _story(cp, uid: str) -> set[tuple[str, str, str]]:
    """(reason, fieldPath, message) of the pod's events."""
    return {(e["reason"], e["involvedObject"].get("fieldPath", ""), e["message"])
            for e in _events(cp, **{"involvedObject.uid": uid})}


def test_events_tell_the_usual_story(control_plane, kubelet, kubepods, tmp_path):
    """`kubectl get events` shows what the stock kubelet's show: the node's Starting and NodeReady; a pod's
    Pulling / Pulled (a pull's duration and size, or "already present"), Created, Started, then Killing on
    delete; a pull that fails: Failed and BackOff."""
    node = _events(control_plane, **{"involvedObject.kind": "Node", "involvedObject.name": NODE})
    reasons = {e["reason"] for e in node}
    assert {"Starting", "NodeReady", "NodeHasSufficientMemory", "NodeHasNoDiskPressure",
            "NodeHasSufficientPID"} <= reasons, reasons
    assert all(e["source"] == {"component": "kubelet", "host": NODE} for e in node)
    sleep = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    apply(control_plane, tmp_path, pod_spec("story", {"name": "main", "image": BUSYBOX, "command": sleep,
                                                     "imagePullPolicy": "IfNotPresent"},
                                            initContainers=[{"name": "init", "image": BUSYBOX, "command": ["true"],
                                                             "imagePullPolicy": "Always"}]))
    apply(control_plane, tmp_path, pod_spec("nopull", {"name": "c", "image": "127.0.0.1:1/nothing:1.0"}))
    try:
        pod = wait_pod(control_plane, "story", "Running", lambda p: p.get("status", {}).get("phase") == "Running")
        uid = pod["metadata"]["uid"]
        story = wait_for("Started of container main", lambda: (lambda s: s if any(
            r == "Started" and f == "spec.containers{main}" for r, f, _ in s) else None)(
            _story(control_plane, uid)), timeout=20)
        init, main = "spec.initContainers{init}", "spec.containers{main}"
        assert ("Pulling", init, f'Pulling image "{BUSYBOX}"') in story, story
        pulled = [m for r, f, m in story if r == "Pulled" and f == init]
        assert len(pulled) == 1 and re.fullmatch(
            rf'Successfully pulled image "{re.escape(BUSYBOX)}" in [0-9.]+(ms|s|µs) \([0-9.]+(ms|s|µs) including '
            r"waiting\)\. Image size: [1-9][0-9]* bytes\.", pulled[0]), pulled
        assert {("Created", init, "Created container: init"), ("Started", init, "Started container init")} <= story
        assert ("Pulled", main, f'Container image "{BUSYBOX}" already present on machine and can be accessed by '
                "the pod") in story, story
        assert {("Created", main, "Created container: main"), ("Started", main, "Started container main")} <= story
        nopull = get_pod(control_plane, "nopull")["metadata"]["uid"]
        failed = wait_for("a pull that fails: Failed and BackOff", lambda: (lambda s: s if {
            "Error: ErrImagePull", "Error: ImagePullBackOff"} <= {m for _, _, m in s} else None)(
            _story(control_plane, nopull)), timeout=60)
        assert any(r == "Failed" and m.startswith('Failed to pull image "127.0.0.1:1/nothing:1.0"')
                   for r, _, m in failed), failed
        assert ("BackOff", "spec.containers{c}", 'Back-off pulling image "127.0.0.1:1/nothing:1.0"') in failed
        assert ("Failed", "spec.containers{c}", "Error: ErrImagePull") in failed
        assert ("Failed", "spec.containers{c}", "Error: ImagePullBackOff") in failed
    finally:
        delete(control_plane, "nopull")
        delete(control_plane, "story")
    killing = wait_for("Killing", lambda: [s for s in _story(control_plane, uid) if s[0] == "Killing"], timeout=20)
    assert killing == [("Killing", "spec.containers{main}", "Stopping container main")]


def test_a_pod_with_host_users_false_gets_a_user_namespace_or_waits_with_the_reason(control_plane, kubelet, cri,
                                                                                     kubepods, tmp_path):
    """hostUsers: false: on pyruntime-cri the pod runs as root of its own user namespace (a 65536-id range
    of the node's), and owns its emptyDir (idmapped, as the stock kubelet asks); containerd 1.6 can't make
    one, so the pod waits with the reason, never runs unmapped."""
    script = "cat /proc/self/uid_map; id -u; stat -c %u /scratch; exec sleep 3600"
    container = {"name": "main", "image": BUSYBOX, "command": ["sh", "-c", script],
                 "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    apply(control_plane, tmp_path, pod_spec("userns", container, hostUsers=False,
                                            volumes=[{"name": "scratch", "emptyDir": {}}]))
    try:
        if cri.name != "pyruntime-cri":
            pod = wait_pod(control_plane, "userns", "waiting with the reason", lambda p: any(
                "does not support user namespaces" in cs.get("state", {}).get("waiting", {}).get("message", "")
                for cs in p.get("status", {}).get("containerStatuses", [])))
            assert pod["status"]["phase"] == "Pending"
            events = _events(control_plane, reason="FailedCreatePodSandBox", type="Warning")
            assert any(e["involvedObject"]["name"] == "userns" for e in events)
            return
        pod = wait_pod(control_plane, "userns", "Running", lambda p: p.get("status", {}).get("phase") == "Running")
        uid = pod["metadata"]["uid"]
        log_file = kubelet.pods_dir / f"default_userns_{uid}" / "main" / "0.log"
        lines = wait_for("the container's output", lambda: (lambda t: t if len(t) >= 3 else None)(
            [line.split(" ", 3)[3] for line in log_file.read_text().splitlines()]), timeout=20)
        inside, outside, length = (int(x) for x in lines[0].split())
        assert (inside, length) == (0, 65536) and outside >= 65536 and outside % 65536 == 0, lines[0]
        assert lines[1:3] == ["0", "0"]  # root, and the emptyDir's owner
    finally:
        delete(control_plane, "userns")


def test_kubelet_killed_and_restarted_recreates_nothing(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("steady", {"name": "httpd", "image": HTTPD}))
    try:
        pod = wait_for("steady Ready", lambda: (lambda p: p if condition(p, "Ready") == "True" else None)(
            get_pod(control_plane, "steady")), timeout=60)
        uid = pod["metadata"]["uid"]
        before = on_node(runtime, uid)
        kubelet.kill()
        kubelet.start()
        # the restarted kubelet syncs every pod at once (its first relist); give it a few passes
        wait_for("the kubelet's pod workers", lambda: kubelet.log_path.read_text().count("starting pykubelet") == 2)
        time.sleep(5)
        after = on_node(runtime, uid)
        assert [s.id for s in after[0]] == [s.id for s in before[0]]
        assert [(c.id, c.state) for c in after[1]] == [(c.id, api_pb2.CONTAINER_RUNNING) for c in before[1]]
        cs = get_pod(control_plane, "steady")["status"]["containerStatuses"][0]
        assert cs["restartCount"] == 0 and cs["ready"] and "running" in cs["state"]
    finally:
        delete(control_plane, "steady")
        kubelet.stop()  # the restarted process is this test's: the leak check wants it gone (so: the last test)

