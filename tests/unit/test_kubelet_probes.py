"""pykubelet's probes and lifecycle hooks without a runtime: the handlers against servers on loopback (HTTP
status codes, redirects, headers, timeouts; TCP; the gRPC health check against a grpc server), the
per-probe thresholds, startup gating and liveness verdicts of the probe manager with a fake CRI runtime,
preStop before the stop and a failed postStart killing the container, and the status a sidecar gives."""
from __future__ import annotations

import http.server
import socket
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import ClassVar

import grpc
import pytest

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.api.podmodel import ExecAction, HTTPGetAction, Pod, Probe, TCPSocketAction, parse_pod
from pykubelet.pods import lifecycle
from pykubelet.pods import status as pod_status
from pykubelet.pods.runtimepod import RuntimePod
from pykubelet.pods.sync import SyncResult
from pykubelet.prober import handlers
from pykubelet.prober.handlers import Outcome, Result
from pykubelet.prober.manager import LIVENESS, READINESS, STARTUP, ProbeManager, Worker
from tests.kit.fake_cri import FakeCRI

UID = "uid-1"


class Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []

    def do_GET(self) -> None:
        Handler.seen.append(dict(self.headers))
        if self.path == "/ok":
            self._answer(200, b"fine")
        elif self.path == "/missing":
            self._answer(404, b"no")
        elif self.path == "/same":
            self._answer(302, b"", location="/ok")
        elif self.path == "/loop":
            self._answer(302, b"", location="/loop")
        elif self.path == "/away":
            self._answer(302, b'<a href="http://elsewhere.invalid/x">Found</a>.\n\n', location="http://elsewhere.invalid/x")
        elif self.path == "/choices":
            self._answer(300, b"pick one", location="/ok")
        elif self.path == "/slow":
            time.sleep(2)
            self._answer(200, b"late")
        else:
            self._answer(500, b"boom")

    def _answer(self, code: int, body: bytes, location: str = "") -> None:
        self.send_response(code)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def web():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_http_status_codes_redirects_and_timeouts(web):
    base = f"http://127.0.0.1:{web}"
    headers = {"User-Agent": handlers.USER_AGENT}
    assert handlers.run_http(f"{base}/ok", headers, 1) == Outcome(Result.SUCCESS, "fine")
    assert handlers.run_http(f"{base}/missing", headers, 1) == Outcome(
        Result.FAILURE, "HTTP probe failed with statuscode: 404")
    assert handlers.run_http(f"{base}/error", headers, 1).result is Result.FAILURE
    assert handlers.run_http(f"{base}/same", headers, 1) == Outcome(Result.SUCCESS, "fine")  # followed
    away = handlers.run_http(f"{base}/away", headers, 1)
    # not followed to another host: a success whose message quotes the body, as the kubelet's (the
    # "should *not* be restarted with a non-local redirect http liveness probe" spec looks for it)
    assert away == Outcome(Result.SUCCESS, 'Probe terminated redirects, Response body: '
                           '<a href="http://elsewhere.invalid/x">Found</a>.\n\n')
    # a 3xx that Go's client does not follow is the answer, with the same warning
    assert handlers.run_http(f"{base}/choices", headers, 1) == Outcome(
        Result.SUCCESS, "Probe terminated redirects, Response body: pick one")
    assert "redirects" in handlers.run_http(f"{base}/loop", headers, 1).message
    slow = handlers.run_http(f"{base}/slow", headers, 0.3)
    assert slow.result is Result.FAILURE and "deadline" in slow.message


class Dripper:
    """A pod's server that answers one byte every `interval` seconds, for ever (until closed): the status
    line and headers first, then, with `body`, a 200 whose body never ends."""

    def __init__(self, interval: float, body: bool) -> None:
        self.interval, self.body = interval, body
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n"
            if self.body:
                conn.sendall(head)
            data = b"x" * 100_000_000 if self.body else head * 1000
            for i in range(len(data)):
                if self.stop.wait(self.interval):
                    return
                try:
                    conn.send(data[i:i + 1])
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(10)


@pytest.mark.parametrize("body", [False, True], ids=["headers", "body"])
def test_http_probe_timeout_bounds_the_whole_probe(body):
    """Issue 22: timeoutSeconds bounded each read, not the probe, so a pod whose server drips a byte every
    timeout/2 held the probe (and its worker) for ever; and a body cut at the deadline could pass as a
    success. Now the timeout is a deadline for connect, request and response together."""
    timeout = 0.5
    dripper = Dripper(timeout / 2, body)
    outcome: list[Outcome] = []
    probe = threading.Thread(target=lambda: outcome.append(
        handlers.run_http(f"http://127.0.0.1:{dripper.port}/", {}, timeout)), daemon=True)
    try:
        probe.start()
        probe.join(10 * timeout + 5)
        assert not probe.is_alive(), "the probe outlived its timeout"
        assert outcome[0].result is Result.FAILURE and "deadline" in outcome[0].message, outcome
    finally:
        dripper.close()
        probe.join(60)


def test_http_url_headers_and_named_ports(web):
    container = pod({"name": "c", "ports": [{"name": "http", "containerPort": web}]}).spec.containers[0]
    url, headers = handlers.http_url(HTTPGetAction(port="http", path="ok", headers=(
        ("user-agent", "mine"), ("X-A", "1"))), "127.0.0.1", container, "p")
    assert url == f"http://127.0.0.1:{web}/ok"
    assert headers == {"Accept": "*/*", "user-agent": "mine", "X-A": "1"}
    Handler.seen.clear()
    assert handlers.run_http(url, headers, 1).ok
    assert Handler.seen[0]["user-agent"] == "mine" and Handler.seen[0]["X-A"] == "1"
    url, _ = handlers.http_url(HTTPGetAction(port=8443, scheme="HTTPS", host="fd00::1"), "10.0.0.1", container, "p")
    assert url == "https://[fd00::1]:8443/"
    with pytest.raises(handlers.ProbeSpecError, match=r"p.port: container 'c' has no port named 'nope'"):
        handlers.http_url(HTTPGetAction(port="nope"), "10.0.0.1", container, "p")


def test_tcp():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert handlers.run_tcp("127.0.0.1", port, 1).ok
    closed = handlers.run_tcp("127.0.0.1", port, 1)
    assert closed.result is Result.FAILURE and closed.message.startswith(f"dial tcp 127.0.0.1:{port}:")


def test_health_messages_round_trip():
    assert handlers.encode_health_request("") == b""
    assert handlers.decode_health_request(handlers.encode_health_request("my.Service")) == "my.Service"
    for status in range(4):
        assert handlers.decode_health_response(handlers.encode_health_response(status)) == status
    # unknown fields of other wire types are skipped
    assert handlers.decode_health_response(b"\x12\x02ab\x08\x02\x1d\x00\x00\x00\x00") == 2
    with pytest.raises(ValueError):
        handlers.decode_health_response(b"\x08")


@pytest.fixture(scope="module")
def health_server():
    statuses = {"": 1, "sick": 2}

    def check(request: str, context: grpc.ServicerContext) -> int:
        if request not in statuses:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return statuses[request]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    method = grpc.unary_unary_rpc_method_handler(check, request_deserializer=handlers.decode_health_request,
                                                 response_serializer=handlers.encode_health_response)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("grpc.health.v1.Health",
                                                                          {"Check": method})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(0)


def test_grpc_health_check(health_server):
    assert handlers.run_grpc("127.0.0.1", health_server, "", 2).ok
    sick = handlers.run_grpc("127.0.0.1", health_server, "sick", 2)
    assert sick == Outcome(Result.FAILURE, "service unhealthy (responded with 'NOT_SERVING')")
    unknown = handlers.run_grpc("127.0.0.1", health_server, "other", 2)
    assert unknown.result is Result.FAILURE and "NOT_FOUND" in unknown.message
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert handlers.run_grpc("127.0.0.1", free, "", 0.5).result is Result.FAILURE


def test_exec_results():
    rt = FakeCRI()
    rt.exec_answers = {"bad": 1, "slow": cri.DeadlineExceeded("ExecSync", grpc.StatusCode.DEADLINE_EXCEEDED, "x"),
                  "gone": cri.NotFound("ExecSync", grpc.StatusCode.NOT_FOUND, "no such container")}
    assert handlers.run_exec(rt, "c1", ["ok"], 3) == Outcome(Result.SUCCESS, "out")
    assert handlers.run_exec(rt, "c1", ["bad"], 3).result is Result.FAILURE
    assert "timed out" in handlers.run_exec(rt, "c1", ["slow"], 3).message
    assert handlers.run_exec(rt, "c1", ["gone"], 3).result is Result.UNKNOWN
    assert rt.calls[0] == ("ExecSync", "c1", ("ok",), 3)


def test_worker_thresholds_and_hold():
    p = pod({"name": "c"})
    w = Worker(UID, "c", READINESS, Probe(ExecAction(), success_threshold=2, failure_threshold=3), p,
               p.spec.containers[0])
    w.reset("c1", 0)
    assert w.result_for("c1") is Result.FAILURE and w.result_for("other") is Result.FAILURE
    ok, bad = Outcome(Result.SUCCESS), Outcome(Result.FAILURE, "no")
    assert not w.record(ok) and w.record(ok) and w.result is Result.SUCCESS
    assert not w.record(bad) and not w.record(bad) and not w.record(ok) and w.result is Result.SUCCESS
    assert not w.record(bad) and not w.record(bad) and w.record(bad) and w.result is Result.FAILURE
    live = Worker(UID, "c", LIVENESS, Probe(ExecAction(), failure_threshold=1), p, p.spec.containers[0])
    live.reset("c1", 0)
    assert live.result is Result.SUCCESS and live.record(bad) and live.on_hold


def pod(*containers: dict, init: tuple[dict, ...] = (), grace: int = 7, status: dict | None = None,
        policy: str = "Always", uid: str = UID) -> Pod:
    return parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": uid},
                      "spec": {"containers": [{"image": "busybox", **c} for c in containers],
                               "initContainers": [{"image": "busybox", **c} for c in init],
                               "terminationGracePeriodSeconds": grace, "restartPolicy": policy},
                      **({"status": status} if status is not None else {})})


def running(*names_ids: tuple[str, str], started_at: float | None = None) -> RuntimePod:
    started = int((started_at if started_at is not None else time.time()) * 1e9)
    statuses = [api_pb2.ContainerStatus(id=cid, state=api_pb2.CONTAINER_RUNNING, started_at=started,
                                        labels={"io.kubernetes.container.name": name}) for name, cid in names_ids]
    state = RuntimePod(sandboxes=[api_pb2.PodSandbox(id="s", state=api_pb2.SANDBOX_READY)],
                       containers=[api_pb2.Container(id=s.id, pod_sandbox_id="s", labels=s.labels)
                                   for s in statuses], statuses={s.id: s for s in statuses})
    state.sandbox_status = api_pb2.PodSandboxStatus(network=api_pb2.PodSandboxNetworkStatus(ip="10.0.0.9"))
    return state


def manager(rt: FakeCRI) -> tuple[ProbeManager, list[str]]:
    changed: list[str] = []
    return ProbeManager(rt, changed.append), changed


def test_startup_gates_liveness_and_readiness_and_liveness_kills():
    rt = FakeCRI()
    rt.exec_answers = {"starting": 1, "alive": 1}
    c = {"name": "c", "startupProbe": {"exec": {"command": ["starting"]}, "failureThreshold": 5},
         "livenessProbe": {"exec": {"command": ["alive"]}, "failureThreshold": 1,
                           "terminationGracePeriodSeconds": 3},
         "readinessProbe": {"exec": {"command": ["ready"]}}}
    m, changed = manager(rt)
    m.sync_pod(pod(c), running(("c", "c1")))
    workers = {k[2]: w for k, w in m._workers.items()}
    assert not m.started(UID, "c", "c1") and not m.ready(UID, "c", "c1")
    assert m.probe_once(workers[LIVENESS]) is None and m.probe_once(workers[READINESS]) is None  # gated
    assert m.probe_once(workers[STARTUP]).result is Result.FAILURE  # type: ignore[union-attr] # it ran
    assert not changed and m.kill_reason(UID, "c", "c1") is None  # 1 of 5 failures
    rt.exec_answers["starting"] = 0
    m.probe_once(workers[STARTUP])
    assert changed == [UID] and m.started(UID, "c", "c1") and not m.ready(UID, "c", "c1")
    assert m.probe_once(workers[STARTUP]) is None  # done for this container
    m.probe_once(workers[READINESS])
    assert m.ready(UID, "c", "c1") and not m.ready(UID, "c", "c2")
    m.probe_once(workers[LIVENESS])
    assert m.kill_reason(UID, "c", "c1") == ("Container c failed liveness probe, will be restarted", 3)
    assert m.probe_once(workers[LIVENESS]) is None  # on hold: being killed
    # its successor starts afresh
    m.sync_pod(pod(c), running(("c", "c2")))
    assert m.kill_reason(UID, "c", "c2") is None and not m.started(UID, "c", "c2")
    m.remove_pod(UID)
    assert not m._workers and m.ready(UID, "c", "c2")


def test_initial_delay_and_result_for_a_replaced_container():
    rt = FakeCRI()
    c = {"name": "c", "readinessProbe": {"exec": {"command": ["ready"]}, "initialDelaySeconds": 30}}
    m, _ = manager(rt)
    started = time.time()
    m.sync_pod(pod(c), running(("c", "c1"), started_at=started))
    (w,) = m._workers.values()
    assert m.probe_once(w) is None and not rt.calls  # 30 s not over
    assert w.due == pytest.approx(started + 30, abs=1e-3)  # the initial delay, from the container's start
    m.sync_pod(pod(c), running(("c", "c1"), started_at=time.time() - 31))  # same container: no reset
    assert w.started_at == pytest.approx(started, abs=1e-3)
    m2, _ = manager(rt)
    m2.sync_pod(pod(c), running(("c", "c1"), started_at=time.time() - 31))
    (w2,) = m2._workers.values()
    assert m2.probe_once(w2).ok  # type: ignore[union-attr] # it ran
    assert rt.calls[-1] == ("ExecSync", "c1", ("ready",), 1)  # timeoutSeconds' default


def test_probes_run_on_their_own(web):
    rt = FakeCRI()
    c = {"name": "c", "readinessProbe": {"httpGet": {"port": web, "path": "/ok"}, "periodSeconds": 1}}
    m, changed = manager(rt)
    state = running(("c", "c1"))
    state.sandbox_status.network.ip = "127.0.0.1"  # type: ignore[union-attr] # set above
    m.sync_pod(pod(c), state)
    stop = threading.Event()
    t = threading.Thread(target=m.run, args=(stop,))
    t.start()
    try:
        deadline = time.time() + 5
        while not changed and time.time() < deadline:
            time.sleep(0.05)
        assert changed == [UID] and m.ready(UID, "c", "c1")
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def test_pre_stop_runs_first_and_its_time_comes_off_the_grace():
    rt = FakeCRI()
    c = {"name": "c", "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}}
    began = time.monotonic()
    lifecycle.stop_container(rt, pod(c), "c", "c1", 10)
    assert time.monotonic() - began >= 1
    assert rt.calls == [("StopContainer", "c1", 9)]
    rt.calls.clear()
    c["lifecycle"] = {"preStop": {"exec": {"command": ["save", "state"]}}}
    lifecycle.stop_container(rt, pod(c), "c", "c1", 1)
    assert rt.calls == [("ExecSync", "c1", ("save", "state"), 1), ("StopContainer", "c1", lifecycle.MIN_GRACE)]
    rt.calls.clear()
    lifecycle.stop_container(rt, None, "c", "c1", 5)
    assert rt.calls == [("StopContainer", "c1", 5)]


def test_a_shortened_grace_cuts_a_sleeping_pre_stop_and_the_stop_after_it():
    """A pod deleted again with a shorter grace while its preStop sleeps ends by the new deadline ([sig-node]
    Lifecycle Sleep Hook reduce GracePeriodSeconds during runtime): the sleep wakes, the stop gets what is
    left (at least MIN_GRACE)."""
    rt = FakeCRI()
    c = {"name": "c", "lifecycle": {"preStop": {"sleep": {"seconds": 50}}}}
    deadline = lifecycle.Deadline(100)
    t = threading.Thread(target=lifecycle.stop_container, args=(rt, pod(c, grace=100), "c", "c1", 100),
                         kwargs={"deadline": deadline})
    began = time.monotonic()
    t.start()
    time.sleep(0.2)
    assert t.is_alive() and not deadline.shorten(200)  # a grace only ever decreases
    assert deadline.shorten(0.3)
    t.join(5)
    assert not t.is_alive() and 0.4 < time.monotonic() - began < 2
    assert rt.calls == [("StopContainer", "c1", lifecycle.MIN_GRACE)]
    assert deadline.left() == 0


def test_a_deadline_sleeps_its_time_or_until_it_ends():
    now = [0.0]
    deadline = lifecycle.Deadline(10, clock=lambda: now[0])
    assert deadline.left() == 10 and deadline.shorten(4) and deadline.left() == 4 and not deadline.shorten(5)
    now[0] = 5.0
    deadline.sleep(30)  # over already: returns at once
    assert deadline.left() == 0
    real = lifecycle.Deadline(10)
    began = time.monotonic()
    real.sleep(0.1)
    assert 0.1 <= time.monotonic() - began < 1 and 9 < real.left() < 10


def test_failed_post_start_kills_the_container():
    rt = FakeCRI()
    rt.exec_answers = {"setup": 2}
    seen: list[tuple] = []
    c = {"name": "c", "lifecycle": {"postStart": {"exec": {"command": ["setup"]}}}}
    p = pod(c)
    failed = lifecycle.post_start(rt, p, p.spec.containers[0], "c1", "10.0.0.9", lambda *a: seen.append(a))
    assert failed == "PostStartHook failed: out"
    assert seen[0][1:4] == ("c", "Warning", "FailedPostStartHook")
    assert rt.calls[-1] == ("StopContainer", "c1", 7)
    d = pod({"name": "d"})
    assert lifecycle.post_start(rt, d, d.spec.containers[0], "d1", "", None) is None


def test_sidecar_status_initialized_once_started_and_gates_ready():
    rt = FakeCRI()
    side = {"name": "side", "image": "i", "restartPolicy": "Always", "readinessProbe": {"exec": {"command": ["ready"]}}}
    main = {"name": "main", "image": "i"}
    p = pod(main, init=(side,))
    m, _ = manager(rt)
    state = running(("side", "s1"))
    m.sync_pod(p, state)
    s = pod_status.pod_status(p, state, SyncResult(), host_ip=None, runtime_name="x", probes=m)
    conditions = {c["type"]: c["status"] for c in s["conditions"]}
    assert conditions["Initialized"] == "True" and s["phase"] == "Pending"  # main not yet created
    (side_status,) = s["initContainerStatuses"]
    assert side_status["started"] and not side_status["ready"]
    state = running(("side", "s1"), ("main", "m1"))
    m.sync_pod(p, state)
    s = pod_status.pod_status(p, state, SyncResult(), host_ip=None, runtime_name="x", probes=m)
    assert s["phase"] == "Running" and {c["type"]: c["status"] for c in s["conditions"]}["Ready"] == "False"
    (w,) = m._workers.values()
    m.probe_once(w)
    s = pod_status.pod_status(p, state, SyncResult(), host_ip=None, runtime_name="x", probes=m)
    assert {c["type"]: c["status"] for c in s["conditions"]}["Ready"] == "True"


def syncer(rt: FakeCRI, root: Path):
    """PodSyncer passes, each followed by the probe manager's look at the pod, against pod p's sandbox
    in `rt`, which has image i:1; the kubelet's files under `root`."""
    from pykubelet.config import Settings
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer

    rt.add_sandbox("s", "p", "ns", UID)
    rt.add_image("sha256:i", "i:1")
    m, _ = manager(rt)
    s = PodSyncer(rt, Settings(root_dir=root, pod_logs_dir=root / "logs"), probes=m)

    def sync(p: Pod) -> None:
        s.sync(p, observe(rt, UID))
        m.sync_pod(p, observe(rt, UID))

    return m, sync


def test_sidecars_start_in_order_keep_running_and_stop_after_the_main_containers(tmp_path: Path):
    rt = FakeCRI()
    rt.exec_answers = {"side-up": 1}
    side = {"name": "side", "image": "i:1", "restartPolicy": "Always",
            "startupProbe": {"exec": {"command": ["side-up"]}, "failureThreshold": 10}}
    setup = {"name": "setup", "image": "i:1"}
    main = {"name": "main", "image": "i:1"}
    p = pod(main, init=(side, setup), policy="Never")
    m, sync = syncer(rt, tmp_path)
    sync(p)
    assert rt.started == ["side-0"]
    sync(p)
    assert rt.started == ["side-0"]  # setup waits for side's startup probe
    rt.exec_answers["side-up"] = 0
    m.probe_once(m._workers[(UID, "side", STARTUP)])
    sync(p)
    assert rt.started == ["side-0", "setup-0"]
    rt.exit("setup-0", 0)
    sync(p)
    assert rt.started == ["side-0", "setup-0", "main-0"]
    rt.exit("side-0", 1)  # a sidecar that dies is restarted, whatever the pod's restart policy
    sync(p)
    assert rt.started[-1] == "side-1" and "main-0" not in [c[1] for c in rt.calls if c[0] == "StopContainer"]
    rt.exit("main-0", 0)
    sync(p)  # the main container is done: the sidecar is stopped, with the pod's grace
    assert ("StopContainer", "side-1", 7) in rt.calls and rt.statuses["side-1"].state == api_pb2.CONTAINER_EXITED
    sync(p)
    assert rt.started[-1] == "side-1"  # and not restarted


def test_liveness_failure_kills_and_the_restart_policy_restarts(tmp_path: Path):
    rt = FakeCRI()
    rt.exec_answers = {"alive": 1}
    main = {"name": "main", "image": "i:1", "livenessProbe": {"exec": {"command": ["alive"]}, "failureThreshold": 1},
            "lifecycle": {"preStop": {"exec": {"command": ["bye"]}}}}
    m, sync = syncer(rt, tmp_path)
    sync(pod(main))
    m.probe_once(m._workers[(UID, "main", LIVENESS)])
    sync(pod(main))
    stops = [c for c in rt.calls if c[0] in ("StopContainer", "ExecSync") and c[1] == "main-0"]
    assert stops == [("ExecSync", "main-0", ("alive",), 1), ("ExecSync", "main-0", ("bye",), 7),
                     ("StopContainer", "main-0", 7)]
    assert rt.started == ["main-0", "main-1"] and m.kill_reason(UID, "main", "main-1") is None


def test_a_restarted_kubelet_keeps_the_reported_readiness():
    rt = FakeCRI()
    c = {"name": "c", "startupProbe": {"exec": {"command": ["up"]}}, "readinessProbe": {"exec": {"command": ["r"]}}}
    p = pod(c, status={"containerStatuses": [{"name": "c", "containerID": "containerd://c1", "ready": True,
                                              "started": True}]})
    m, _ = manager(rt)
    m.sync_pod(p, running(("c", "c1")))
    assert m.started(UID, "c", "c1") and m.ready(UID, "c", "c1")
    m2, _ = manager(rt)
    m2.sync_pod(p, running(("c", "c2")))  # another container than the one reported
    assert not m2.started(UID, "c", "c2") and not m2.ready(UID, "c", "c2")


def test_a_probe_naming_a_missing_port_is_an_error_not_a_failure():
    outcome = handlers.run_action(FakeCRI(), TCPSocketAction(port="db"), pod({"name": "c"}).spec.containers[0], "c1",
                                  "10.0.0.9", 1, "spec.containers{c}.livenessProbe")
    assert outcome == Outcome(Result.UNKNOWN, "spec.containers{c}.livenessProbe.tcpSocket.port: container 'c' "
                                              "has no port named 'db'")


def test_a_hanging_post_start_holds_only_its_own_pod(tmp_path):
    """Issue 22: pods were synced by a pool of 8 threads, and a postStart hook may run for its pod's grace
    period, which the pod sets (here 11 days): 8 pods whose hooks never answered held every thread, and
    no other pod started. Each pod's sync now runs on a thread of its own."""
    from pykubelet.config import Settings
    from pykubelet.pods.workers import PodWorkers

    release = threading.Event()

    class HangingHooks(FakeCRI):
        def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 0) -> tuple[bytes, bytes, int]:
            release.wait(60)  # the hook's command never ends
            return b"", b"", 0

    class Synced:
        def add_handler(self, _handler) -> None:
            pass

        def wait_synced(self, _timeout: float) -> bool:
            return True

        def objects(self) -> list:
            return []

    rt = HangingHooks()
    hooked = {"name": "c", "lifecycle": {"postStart": {"exec": {"command": ["hang"]}}}}
    hanging = pod(hooked, grace=10 ** 6)
    other_started = threading.Event()
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path), Synced())
    def idle(stop: threading.Event) -> None:
        stop.wait()

    workers.pleg.run = workers.probes.run = idle  # type: ignore[method-assign] # not under test

    def sync(uid: str) -> None:
        if uid.startswith("hanging"):
            lifecycle.post_start(rt, hanging, hanging.spec.containers[0], uid, "10.0.0.9")
        else:
            other_started.set()

    workers.sync = sync  # type: ignore[method-assign] # the hook, not the rest of a sync
    stop = threading.Event()
    runner = threading.Thread(target=workers.run, args=(stop,), daemon=True)
    runner.start()
    try:
        for i in range(16):
            workers.queue.add(f"hanging-{i}")
        workers.queue.add("other")
        assert other_started.wait(10), "pods whose postStart hangs held every pod worker"
    finally:
        release.set()
        stop.set()
        runner.join(30)
    assert not runner.is_alive()


def test_probes_that_hang_hold_none_but_their_own_thread():
    """Issue 22: probes ran on a pool of 16 threads, and a probe may run for its timeoutSeconds, which the
    pod sets (here 11 days): a pod with 20 probes that never answer held the whole pool, and no other
    pod's probes ran (its readiness never came, its liveness was never checked)."""
    release = threading.Event()

    class HangingExec(FakeCRI):
        def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 0) -> tuple[bytes, bytes, int]:
            if cmd[0] == "hang":
                release.wait(60)
            return super().exec_sync(container_id, cmd, timeout)

    rt = HangingExec()
    m, _ = manager(rt)
    hanging = [{"name": f"h{i}", "readinessProbe": {"exec": {"command": ["hang"]}, "timeoutSeconds": 10 ** 6}}
               for i in range(20)]
    m.sync_pod(pod(*hanging), running(*((f"h{i}", f"h{i}") for i in range(len(hanging)))))
    other = pod({"name": "c", "readinessProbe": {"exec": {"command": ["ready"]}}}, uid="other-uid")
    m.sync_pod(other, running(("c", "c1")))
    stop = threading.Event()
    t = threading.Thread(target=m.run, args=(stop,))
    t.start()
    try:
        deadline = time.time() + 10
        while not m.ready("other-uid", "c", "c1") and time.time() < deadline:
            time.sleep(0.05)
        assert m.ready("other-uid", "c", "c1"), "probes that hang held every probe thread"
    finally:
        release.set()
        stop.set()
        t.join(10)
    assert not t.is_alive()


def test_probes_are_counted_by_result_as_upstreams_prober_probe_total():
    """Verdicts count by result (an errored probe counts not at all, as upstream throws it away), across
    the container's restarts, and go with the worker when the pod leaves."""
    rt = FakeCRI()
    rt.exec_answers = {"alive": 1, "gone": cri.NotFound("ExecSync", grpc.StatusCode.NOT_FOUND, "no container")}
    c = {"name": "c", "livenessProbe": {"exec": {"command": ["alive"]}, "failureThreshold": 3},
         "readinessProbe": {"exec": {"command": ["ready"]}}}
    m, _ = manager(rt)
    m.sync_pod(pod(c), running(("c", "c1")))
    workers = {k[2]: w for k, w in m._workers.items()}
    assert m.tallies() == []  # nothing ran: no series
    m.probe_once(workers[READINESS])
    m.probe_once(workers[LIVENESS])
    m.sync_pod(pod(c), running(("c", "c2")))  # a restart: the same series go on
    m.probe_once(workers[READINESS])
    rt.exec_answers["ready"] = rt.exec_answers["gone"]
    m.probe_once(workers[READINESS])  # errored: not counted
    tallies = {t.kind: t for t in m.tallies()}
    assert (tallies["Readiness"].successful, tallies["Readiness"].failed) == (2, 0)
    assert (tallies["Liveness"].successful, tallies["Liveness"].failed) == (0, 1)
    t = tallies["Readiness"]
    assert (t.container, t.pod, t.namespace, t.uid) == ("c", "p", "ns", UID)
    assert sum(t.buckets) == 2 and t.duration_sum >= 0 and sum(tallies["Liveness"].buckets) == 0
    m.remove_pod(UID)
    assert m.tallies() == []
