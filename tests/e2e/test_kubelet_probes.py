"""pykubelet's probes, lifecycle hooks and sidecars, end to end on containerd 1.6: a container failing its
liveness probe is killed and restarted (Unhealthy and Killing events, its restart in lastState); a
readiness probe gates the container's `ready` and the pod's Ready condition both ways; a startup probe
holds liveness back until it passes; httpGet (port by name, a 404 fails) and tcpSocket probes; postStart
(httpGet to the test, a failing exec kills the container) and preStop (runs before SIGTERM); a sidecar
init container runs beside the main container and the pod completes when the main container exits.

gRPC probes: no test image has a gRPC server, so the pod serves grpc.health.v1 SERVING with busybox nc and
printf: the HTTP/2 frames of one canned answer (SETTINGS, then the response HEADERS, DATA and trailers on
stream 1), enough for one Check per connection; a readiness probe on it makes the pod Ready, a liveness
probe on a port where nothing listens fails (Unhealthy) and restarts the container. The handler is also
tested against a real gRPC health server in tests/unit/test_kubelet_probes.py."""
from __future__ import annotations

import http.server
import json
import threading
import time
from typing import ClassVar

from tests.kit.kubelet_node import BUSYBOX, HTTPD, apply, condition, delete, get_pod, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-probes"
NODE_IP = "10.201.0.32"
# sleeps until SIGTERM, then ends at once (a shell as PID 1 ignores SIGTERM otherwise)
IDLE = "trap 'exit 0' TERM; while true; do sleep 0.2; done"


def pod_spec(name: str, *containers: dict, **spec) -> dict:
    pod = kit_pod_spec(NODE, name, containers[0], **spec)
    pod["spec"]["containers"] = list(containers)
    return pod


def busybox(name: str, script: str = IDLE, **fields) -> dict:
    return {"name": name, "image": BUSYBOX, "command": ["sh", "-c", script], **fields}


def exec_probe(*command: str, **timing) -> dict:
    return {"exec": {"command": list(command)}, "periodSeconds": 1, **timing}


def status_of(pod: dict, name: str) -> dict:
    statuses = pod.get("status", {}).get("containerStatuses", []) + pod.get("status", {}).get(
        "initContainerStatuses", [])
    return next((s for s in statuses if s["name"] == name), {})


def container_id(pod: dict, name: str) -> str:
    return status_of(pod, name)["containerID"].split("://", 1)[1]


def events(cp, pod: dict) -> list[dict]:
    out = cp.kubectl("get", "events", "--field-selector", f"involvedObject.uid={pod['metadata']['uid']}",
                     "-o", "json")
    return json.loads(out.stdout)["items"]


def has_event(cp, pod: dict, reason: str, text: str = "") -> list[dict]:
    return [e for e in events(cp, pod) if e["reason"] == reason and text in e.get("message", "")]


def test_liveness_failure_restarts_the_container(control_plane, kubelet, kubepods, tmp_path):
    script = "touch /tmp/healthy; sleep 4; rm /tmp/healthy; " + IDLE
    apply(control_plane, tmp_path, pod_spec("liveness", busybox("c", script, livenessProbe=exec_probe(
        "cat", "/tmp/healthy", failureThreshold=2, terminationGracePeriodSeconds=2))))
    try:
        pod = wait_pod(control_plane, "liveness", "restarted after its liveness failure",
                       lambda p: status_of(p, "c").get("restartCount", 0) >= 1
                       and "running" in status_of(p, "c").get("state", {}), timeout=60)
        cs = status_of(pod, "c")
        terminated = cs["lastState"]["terminated"]
        assert terminated["exitCode"] in (0, 137, 143), terminated  # the trap or SIGKILL
        assert cs["ready"]  # no readiness probe: ready as it runs
        unhealthy = wait_for("an Unhealthy event", lambda: has_event(control_plane, pod, "Unhealthy"))
        assert unhealthy[0]["message"].startswith("Liveness probe failed:"), unhealthy
        assert unhealthy[0]["type"] == "Warning"
        assert unhealthy[0]["involvedObject"]["fieldPath"] == "spec.containers{c}"
        killing = has_event(control_plane, pod, "Killing")
        assert killing and killing[0]["message"] == "Container c failed liveness probe, will be restarted"
    finally:
        delete(control_plane, "liveness")


def test_readiness_gates_ready_both_ways(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("readiness", busybox("c", readinessProbe=exec_probe(
        "cat", "/tmp/ready", successThreshold=1, failureThreshold=1))))
    try:
        pod = wait_pod(control_plane, "readiness", "Running, not Ready",
                       lambda p: p["status"].get("phase") == "Running" and "running" in status_of(p, "c")["state"])
        time.sleep(2)
        pod = get_pod(control_plane, "readiness")
        assert condition(pod, "Ready") == "False" and condition(pod, "ContainersReady") == "False"
        assert status_of(pod, "c")["started"] and not status_of(pod, "c")["ready"]
        cid = container_id(pod, "c")
        runtime.exec_sync(cid, ["touch", "/tmp/ready"], 5)
        pod = wait_pod(control_plane, "readiness", "Ready", lambda p: condition(p, "Ready") == "True", timeout=20)
        assert condition(pod, "ContainersReady") == "True" and status_of(pod, "c")["ready"]
        runtime.exec_sync(cid, ["rm", "/tmp/ready"], 5)
        pod = wait_pod(control_plane, "readiness", "not Ready again", lambda p: condition(p, "Ready") == "False",
                       timeout=20)
        assert status_of(pod, "c")["restartCount"] == 0  # readiness never restarts
    finally:
        delete(control_plane, "readiness")


def test_startup_probe_holds_liveness_back(control_plane, kubelet, runtime, kubepods, tmp_path):
    # liveness would kill the container at once if it ran before the startup probe passed
    apply(control_plane, tmp_path, pod_spec("startup", busybox(
        "c", startupProbe=exec_probe("cat", "/tmp/started", failureThreshold=60),
        livenessProbe=exec_probe("cat", "/tmp/started", failureThreshold=1))))
    try:
        pod = wait_pod(control_plane, "startup", "Running",
                       lambda p: "running" in status_of(p, "c").get("state", {}))
        time.sleep(4)
        pod = get_pod(control_plane, "startup")
        cs = status_of(pod, "c")
        assert not cs["started"] and not cs["ready"] and cs["restartCount"] == 0, cs
        runtime.exec_sync(container_id(pod, "c"), ["touch", "/tmp/started"], 5)
        pod = wait_pod(control_plane, "startup", "started and Ready",
                       lambda p: status_of(p, "c")["started"] and condition(p, "Ready") == "True", timeout=20)
        time.sleep(2)
        assert status_of(get_pod(control_plane, "startup"), "c")["restartCount"] == 0
        assert not has_event(control_plane, pod, "Killing")
    finally:
        delete(control_plane, "startup")


def test_exec_probe_timeout_is_a_failure(control_plane, kubelet, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("slow", busybox("c", readinessProbe=exec_probe(
        "sleep", "5", timeoutSeconds=1, periodSeconds=2))))
    try:
        pod = wait_pod(control_plane, "slow", "Running", lambda p: "running" in status_of(p, "c").get("state", {}))
        timed_out = wait_for("a timed-out Unhealthy event", lambda: has_event(
            control_plane, pod, "Unhealthy", "timed out"), timeout=30)
        assert timed_out[0]["message"].startswith("Readiness probe failed:")
        assert condition(get_pod(control_plane, "slow"), "Ready") == "False"
    finally:
        delete(control_plane, "slow")


def test_http_and_tcp_probes(control_plane, kubelet, kubepods, tmp_path):
    web = {"name": "web", "image": HTTPD, "ports": [{"name": "http", "containerPort": 80}],
           "readinessProbe": {"httpGet": {"path": "/", "port": "http",
                                          "httpHeaders": [{"name": "X-Probe", "value": "yes"}]},
                              "periodSeconds": 1},
           "livenessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1}}
    missing = busybox("missing", "mkdir -p /www; exec httpd -f -p 8081 -h /www", readinessProbe={
        "httpGet": {"path": "/nothing-here", "port": 8081}, "periodSeconds": 1})
    apply(control_plane, tmp_path, pod_spec("http", web, missing))
    try:
        pod = wait_pod(control_plane, "http", "web ready", lambda p: status_of(p, "web").get("ready"), timeout=60)
        assert not status_of(pod, "missing")["ready"] and condition(pod, "Ready") == "False"
        failed = wait_for("a 404 Unhealthy event", lambda: has_event(
            control_plane, pod, "Unhealthy", "HTTP probe failed with statuscode: 404"))
        assert failed[0]["involvedObject"]["fieldPath"] == "spec.containers{missing}"
        assert failed[0]["message"].startswith("Readiness probe failed:")
        time.sleep(2)
        pod = get_pod(control_plane, "http")
        assert status_of(pod, "web")["ready"] and status_of(pod, "web")["restartCount"] == 0  # tcp liveness passes
    finally:
        delete(control_plane, "http")


class _Hooks(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("User-Agent", "")))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_post_start_hooks(control_plane, kubelet, kubepods, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    good = busybox("good", lifecycle={"postStart": {"httpGet": {"host": "127.0.0.1", "port": port,
                                                                "path": "/post-start"}}})
    bad = busybox("bad", lifecycle={"postStart": {"exec": {"command": ["sh", "-c", "echo hook broke; exit 1"]}}})
    apply(control_plane, tmp_path, pod_spec("poststart", good, bad))
    try:
        pod = wait_pod(control_plane, "poststart", "bad restarted",
                       lambda p: status_of(p, "bad").get("restartCount", 0) >= 1, timeout=60)
        assert "running" in status_of(pod, "good")["state"] and status_of(pod, "good")["restartCount"] == 0
        assert ("/post-start", "kube-probe/1.37") in _Hooks.seen
        failed = wait_for("FailedPostStartHook", lambda: has_event(control_plane, pod, "FailedPostStartHook"))
        assert "hook broke" in failed[0]["message"]
        assert failed[0]["involvedObject"]["fieldPath"] == "spec.containers{bad}"
    finally:
        delete(control_plane, "poststart")
        server.shutdown()
        server.server_close()


def test_pre_stop_runs_before_sigterm(control_plane, kubelet, kubepods, tmp_path):
    script = "trap 'echo got SIGTERM; sleep 1; exit 0' TERM; echo ready; while true; do sleep 0.2; done"
    hook = {"preStop": {"exec": {"command": ["sh", "-c", "echo pre-stop ran > /proc/1/fd/1; sleep 2; "
                                                         "echo pre-stop done > /proc/1/fd/1"]}}}
    # a grace period delete's 60 s wait can't see the end of: the deletion completes only if the container's
    # exit on SIGTERM ends it
    apply(control_plane, tmp_path, pod_spec("prestop", busybox("c", script, lifecycle=hook),
                                            terminationGracePeriodSeconds=600))
    pod = wait_pod(control_plane, "prestop", "Running", lambda p: p["status"].get("phase") == "Running")
    log_file = kubelet.pods_dir / f"default_prestop_{pod['metadata']['uid']}" / "c" / "0.log"
    wait_for("the container's first line", lambda: log_file.exists() and "ready" in log_file.read_text())
    with open(log_file) as log:  # read after deletion: the open file outlives its directory
        delete(control_plane, "prestop")
        text = log.read()
    assert "pre-stop ran" in text and "got SIGTERM" in text, text
    assert text.index("pre-stop ran") < text.index("pre-stop done") < text.index("got SIGTERM"), text


def test_sidecar_runs_beside_and_pod_completes(control_plane, kubelet, kubepods, tmp_path):
    sidecar = busybox("side", restartPolicy="Always", startupProbe=exec_probe("true"))
    main = busybox("main", "sleep 4; echo done")
    apply(control_plane, tmp_path, pod_spec("sidecar", main, restartPolicy="Never", initContainers=[sidecar]))
    try:
        pod = wait_pod(control_plane, "sidecar", "main and side running",
                       lambda p: "running" in status_of(p, "main").get("state", {})
                       and "running" in status_of(p, "side").get("state", {}), timeout=60)
        side = status_of(pod, "side")
        assert side["started"] and side["ready"]
        assert condition(pod, "Initialized") == "True" and pod["status"]["phase"] == "Running"
        assert status_of(pod, "main")["state"]["running"]["startedAt"] >= side["state"]["running"]["startedAt"]
        pod = wait_pod(control_plane, "sidecar", "Succeeded", lambda p: p["status"].get("phase") == "Succeeded",
                       timeout=60)
        assert status_of(pod, "main")["state"]["terminated"]["exitCode"] == 0
        assert "terminated" in status_of(pod, "side")["state"]  # stopped after the main container
        assert status_of(pod, "side")["restartCount"] == 0
    finally:
        delete(control_plane, "sidecar")


def _octal(data: bytes) -> str:
    return "".join(f"\\{b:03o}" for b in data)


# a canned grpc.health.v1 Check answer (SERVING), HTTP/2 frames: the server's SETTINGS and an ACK of the
# client's, then on stream 1 the HEADERS (:status 200 indexed, content-type as a literal of an indexed name),
# a DATA frame with the length-prefixed HealthCheckResponse {status: SERVING} and the trailers (grpc-status 0)
GRPC_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
GRPC_ANSWER = (b"\x00\x00\x14\x01\x04\x00\x00\x00\x01" + b"\x88\x0f\x10\x10application/grpc"
               + b"\x00\x00\x07\x00\x00\x00\x00\x00\x01" + b"\x00\x00\x00\x00\x02\x08\x01"
               + b"\x00\x00\x0f\x01\x05\x00\x00\x00\x01" + b"\x00\x0bgrpc-status\x010")
# one connection at a time (nc -e runs the answer once connected, until the client closes); the answer
# waits for the client's request, which grpc sends once it has the server's SETTINGS
GRPC_HEALTH = (f"trap 'exit 0' TERM; while true; do nc -l -p 5000 -e sh -c \"printf '{_octal(GRPC_SETTINGS)}'; "
               f"sleep 0.3; printf '{_octal(GRPC_ANSWER)}'; cat >/dev/null\"; done & wait")


def test_grpc_probes(control_plane, kubelet, kubepods, tmp_path):
    grpc_probe = {"periodSeconds": 1, "timeoutSeconds": 2}
    apply(control_plane, tmp_path, pod_spec(
        "grpc", busybox("served", GRPC_HEALTH, ports=[{"name": "health", "containerPort": 5000}],
                        readinessProbe={"grpc": {"port": 5000}, **grpc_probe}),
        busybox("nothing", livenessProbe={"grpc": {"port": 5001}, "failureThreshold": 2, **grpc_probe})))
    try:
        pod = wait_pod(control_plane, "grpc", "served Ready, nothing restarted", lambda p: status_of(p, "served").get(
            "ready") is True and status_of(p, "nothing").get("restartCount", 0) >= 1, timeout=90)
        assert status_of(pod, "served")["restartCount"] == 0
        unhealthy = wait_for("an Unhealthy event", lambda: has_event(control_plane, pod, "Unhealthy"))
        ip = pod["status"]["podIP"]
        assert {e["involvedObject"]["fieldPath"] for e in unhealthy} == {"spec.containers{nothing}"}, unhealthy
        assert unhealthy[0]["message"].startswith(f'Liveness probe failed: failed to connect service "{ip}:5001"')
        killing = has_event(control_plane, pod, "Killing")
        assert killing[0]["message"] == "Container nothing failed liveness probe, will be restarted", killing
    finally:
        delete(control_plane, "grpc")
