"""The kubelet server's pure parts: CRI log reading (joining, options, follow across rotation and
restart), the authorization attributes of each path, the identities of certificates and tokens, the
self-signed serving certificate; and the server itself on loopback with a fake runtime: TLS, 401 / 403 /
200, /metrics, and an upgraded stream spliced through to a streaming server."""
from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from proto import api_pb2
from pykubelet.config import Settings
from pykubelet.server import logs
from pykubelet.server.app import KubeletServer
from pykubelet.server.authn import Authenticator, User, bearer_token, from_certificate
from pykubelet.server.authz import Attributes, Authorizer, attributes
from pykubelet.server.stats import Summary
from pykubelet.server.tls import self_signed
from pynode_cluster.pki import CA
from tests.kit.fake_cri import FakeCRI

T0 = "2026-12-03T10:00:00.000000001Z"
T1 = "2026-12-03T10:00:01.5Z"
T2 = "2026-12-03T10:00:02.123456789Z"


def cri_log(*lines: tuple[str, str, str, str]) -> bytes:
    return b"".join(f"{t} {stream} {tag} {msg}\n".encode() for t, stream, tag, msg in lines)


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def render(path: Path, **opts) -> bytes:
    out: list[bytes] = []
    logs.write_logs(path, logs.LogOptions(**opts), out.append)
    return b"".join(out)


@pytest.fixture
def log_file(tmp_path):
    path = tmp_path / "0.log"
    path.write_bytes(cri_log((T0, "stdout", "F", "one"), (T1, "stderr", "P", "tw"), (T1, "stderr", "P", "o"),
                             (T1, "stderr", "F", ""), (T2, "stdout", "F", "three")))
    return path


def test_partial_lines_are_joined_and_stamped_with_their_first_piece(log_file):
    assert render(log_file) == b"one\ntwo\nthree\n"
    assert render(log_file, timestamps=True) == f"{T0} one\n{T1} two\n{T2} three\n".encode()


def test_tail_since_and_limit(log_file):
    assert render(log_file, tail_lines=2) == b"two\nthree\n"
    assert render(log_file, tail_lines=0) == b""
    assert render(log_file, since=logs.parse_time("2026-12-03T10:00:01Z")) == b"two\nthree\n"
    assert render(log_file, limit_bytes=6) == b"one\ntw"


def test_a_malformed_line_passes_through(tmp_path):
    path = tmp_path / "0.log"
    path.write_bytes(b"not a cri line\n" + cri_log((T0, "stdout", "F", "ok")))
    assert render(path) == b"not a cri line\nok\n"


def test_a_line_without_its_newline_waits(tmp_path):
    path = tmp_path / "0.log"
    path.write_bytes(cri_log((T0, "stdout", "F", "one")) + f"{T1} stdout F tw".encode())
    assert render(path) == b"one\n"


def test_what_a_container_wrote_last_without_a_newline_is_served(tmp_path):
    """The runtime logs the end of a stream without a newline as a P entry (containerd does the same): the
    kubelet serves it as it came (Projected combined's container cats three files with no newline)."""
    path = tmp_path / "0.log"
    path.write_bytes(cri_log((T0, "stdout", "F", "one"), (T1, "stdout", "P", "two"), (T2, "stdout", "P", "2")))
    assert render(path) == b"one\ntwo2"
    assert render(path, timestamps=True) == f"{T0} one\n{T1} two2".encode()
    assert render(path, tail_lines=1) == b"two2"


def test_tail_reads_back_across_blocks_and_pieces(tmp_path, monkeypatch):
    """tailLines is found by reading backwards in blocks: lines and their P pieces cut by block edges."""
    monkeypatch.setattr(logs, "CHUNK", 7)
    path = tmp_path / "0.log"
    path.write_bytes(cri_log((T0, "stdout", "F", "one"), (T1, "stderr", "P", "tw"), (T1, "stderr", "P", "o"),
                             (T1, "stderr", "F", ""), (T2, "stdout", "F", "three")) + f"{T2} stdout F fo".encode())
    assert [render(path, tail_lines=n) for n in range(5)] == [
        b"", b"three\n", b"two\nthree\n", b"one\ntwo\nthree\n", b"one\ntwo\nthree\n"]
    path.write_bytes(b"not a cri line\n" + cri_log((T0, "stdout", "P", "a"), (T0, "stdout", "F", "b")))
    assert render(path, tail_lines=1) == b"ab\n"
    assert render(path, tail_lines=2, timestamps=True) == f"not a cri line\n{T0} ab\n".encode()


SERVE_LOG = """
import sys
from pathlib import Path
from pykubelet.server import logs

def peak_kib():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0])

before = peak_kib()
written = 0
def write(data):
    global written
    written += len(data)
tail = int(sys.argv[2])
logs.write_logs(Path(sys.argv[1]), logs.LogOptions(tail_lines=tail if tail >= 0 else None), write)
print(written, peak_kib() - before)
"""


def test_a_huge_log_is_served_in_bounded_memory(tmp_path):
    """Issue 22: /containerLogs read a whole log file into memory (and tailLines all of its lines), so a
    pod that logged a few GiB made the kubelet's RSS grow by as much on each request. The reader's process
    serves a 200 MiB log, whole and its tail, with its peak RSS growing by a bounded amount."""
    import subprocess
    import sys

    path = tmp_path / "0.log"
    line = cri_log((T0, "stdout", "F", "x" * 200))
    block = line * ((1 << 20) // len(line))
    with path.open("wb") as f:
        for _ in range(200):
            f.write(block)
    lines = 200 * ((1 << 20) // len(line))
    out_line = 201  # "x" * 200 and its newline
    for tail, expected in ((-1, lines * out_line), (3, 3 * out_line), (10 ** 9, lines * out_line)):
        proc = subprocess.run([sys.executable, "-c", SERVE_LOG, str(path), str(tail)], capture_output=True,
                              text=True, timeout=600, check=True)
        written, growth_kib = map(int, proc.stdout.split())
        assert written == expected
        assert growth_kib < 64 * 1024, f"tail {tail}: the reader's peak RSS grew by {growth_kib} KiB"


def test_parse_time_keeps_nanosecond_stamps_and_zones():
    assert logs.parse_time("1970-01-01T00:00:01.999999999Z") == pytest.approx(1.999999)
    assert logs.parse_time("1970-01-01T01:00:00+01:00") == 0
    with pytest.raises(ValueError):
        logs.parse_time("1970-01-01T00:00:00")


def test_options_from_the_query():
    o = logs.LogOptions.from_query({"follow": ["true"], "tailLines": ["5"], "sinceSeconds": ["10"],
                                    "timestamps": ["1"], "limitBytes": ["100"], "previous": ["false"]}, now=1000.0)
    assert o == logs.LogOptions(follow=True, previous=False, tail_lines=5, since=990.0, timestamps=True,
                                limit_bytes=100)
    assert logs.LogOptions.from_query({"sinceTime": ["1970-01-01T00:01:00Z"]}).since == 60


@pytest.mark.parametrize(("query", "message"), [
    ({"tailLines": ["x"]}, "tailLines: expected an integer"),
    ({"limitBytes": ["0"]}, "limitBytes: must be at least 1"),
    ({"sinceSeconds": ["1"], "sinceTime": ["1970-01-01T00:00:00Z"]}, "at most one"),
    ({"sinceTime": ["yesterday"]}, "sinceTime: expected an RFC 3339 time"),
    ({"follow": ["yes"]}, "follow: expected true or false"),
])
def test_bad_options_are_named(query, message):
    with pytest.raises(logs.LogOptionError, match=message):
        logs.LogOptions.from_query(query)


def test_follow_goes_on_across_a_rotation_and_a_restart(tmp_path):
    """The runtime writes, the kubelet rotates 0.log away and the runtime reopens it, then the container
    restarts into 1.log and finally ends: every line comes out once, in order."""
    first, second = tmp_path / "0.log", tmp_path / "1.log"
    first.write_bytes(cri_log((T0, "stdout", "F", "a")))
    steps = [
        lambda: append(first, cri_log((T0, "stdout", "P", "b"))),
        lambda: append(first, cri_log((T0, "stdout", "F", "!"))),
        lambda: first.rename(tmp_path / "0.log.20261203"),
        lambda: first.write_bytes(cri_log((T1, "stdout", "F", "c"))),
        lambda: second.write_bytes(cri_log((T2, "stdout", "F", "d"))),
    ]
    handed: list[Path] = []

    def next_path():
        if second.exists() and not handed:
            handed.append(second)
            return second
        if handed and not steps:
            raise StopIteration
        return None

    def sleep(_s: float) -> None:
        if steps:
            steps.pop(0)()

    out: list[bytes] = []
    logs.write_logs(first, logs.LogOptions(follow=True, timestamps=True), out.append, next_path=next_path,
                    sleep=sleep)
    assert b"".join(out) == f"{T0} a\n{T0} b!\n{T1} c\n{T2} d\n".encode()


def test_follow_stops_when_the_client_leaves(tmp_path):
    path = tmp_path / "0.log"
    path.write_bytes(cri_log((T0, "stdout", "F", "a")))
    out: list[bytes] = []
    logs.write_logs(path, logs.LogOptions(follow=True), out.append, next_path=lambda: None, gone=lambda: True)
    assert out == [b"a\n"]


@pytest.mark.parametrize(("method", "path", "expected"), [
    ("GET", "/containerLogs/ns/pod/c", [("get", "proxy")]),
    ("POST", "/exec/ns/pod/c", [("create", "proxy")]),
    ("GET", "/exec/ns/pod/c", [("create", "proxy")]),  # a websocket upgrade is a GET: still create
    ("GET", "/attach/ns/pod/c", [("create", "proxy")]),
    ("GET", "/portForward/ns/pod", [("create", "proxy")]),
    ("POST", "/run/ns/pod/c", [("create", "proxy")]),
    ("GET", "/stats/summary", [("get", "stats")]),
    ("GET", "/metrics", [("get", "metrics")]),
    ("GET", "/metrics/cadvisor", [("get", "metrics")]),
    ("GET", "/metrics/resource", [("get", "metrics")]),
    ("GET", "/metrics/probes", [("get", "metrics")]),
    ("GET", "/configz", [("get", "configz"), ("get", "proxy")]),
    ("GET", "/logs/syslog", [("get", "log")]),
    ("GET", "/healthz", [("get", "healthz"), ("get", "proxy")]),
    ("GET", "/pods", [("get", "pods"), ("get", "proxy")]),
    ("DELETE", "/something", [("delete", "proxy")]),
])
def test_authorization_attributes(method, path, expected):
    assert [(a.verb, a.subresource) for a in attributes(method, path, "node-a")] == expected
    assert {a.name for a in attributes(method, path, "node-a")} == {"node-a"}


def test_forbidden_names_the_user_and_the_check():
    text = Attributes("create", "proxy", "n").describe(User("alice"))
    assert text == "Forbidden (user=alice, verb=create, resource=nodes, subresource=proxy)"


def test_identities():
    cert = {"subject": ((("organizationName", "kubeadm:cluster-admins"),),
                        (("commonName", "kube-apiserver-kubelet-client"),))}
    assert from_certificate(cert) == User("kube-apiserver-kubelet-client",
                                          ("kubeadm:cluster-admins", "system:authenticated"))
    assert from_certificate({}) is None
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None


def test_without_an_api_server_tokens_are_refused_and_anonymous_only_when_enabled():
    assert Authenticator(None, anonymous=False, webhook=True).authenticate({}, None) is None
    assert Authenticator(None, anonymous=False, webhook=True).authenticate({}, "Bearer t") is None
    assert Authenticator(None, anonymous=True, webhook=True).authenticate({}, None) == User(
        "system:anonymous", ("system:unauthenticated",))
    assert not Authorizer(None, "Webhook").allowed(User("x"), Attributes("get", "proxy", "n"))
    assert Authorizer(None, "AlwaysAllow").allowed(User("x"), Attributes("get", "proxy", "n"))


class FakeReviews:
    """A lightkube client's create() answering reviews; counts the calls."""

    def __init__(self, allowed: bool) -> None:
        self.allowed, self.calls = allowed, 0

    def create(self, obj):
        self.calls += 1
        return SimpleNamespace(status=SimpleNamespace(allowed=self.allowed))


def test_decisions_are_cached_for_their_ttl():
    reviews = FakeReviews(allowed=False)
    authz = Authorizer(reviews, "Webhook", authorized_ttl=300, unauthorized_ttl=0)
    attrs = Attributes("get", "proxy", "n")
    assert not authz.allowed(User("a"), attrs) and not authz.allowed(User("a"), attrs)
    assert reviews.calls == 2  # an unauthorized TTL of 0: asked again
    reviews.allowed = True
    assert authz.allowed(User("a"), attrs) and authz.allowed(User("a"), attrs)
    assert reviews.calls == 3  # authorized: cached


def test_self_signed_serving_certificate(tmp_path):
    cert, key = self_signed(tmp_path / "pki", "node-a", ["127.0.0.1"])
    assert key.stat().st_mode & 0o777 == 0o600
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    before = cert.read_bytes()
    assert self_signed(tmp_path / "pki", "node-a", ["127.0.0.1"]) == (cert, key)
    assert cert.read_bytes() == before  # kept across restarts


def test_self_signed_key_and_pki_closed_whatever_the_umask_and_an_older_file(tmp_path):
    """A host user must not read the kubelet's serving key: under umask 000, an older pki/ left 0777 and
    an older key file left 0644 (O_TRUNC kept its mode) end 0700 and 0600, remade or kept."""
    pki = tmp_path / "pki"
    pki.mkdir()
    pki.chmod(0o777)
    (pki / "kubelet.key").write_bytes(b"old")
    (pki / "kubelet.key").chmod(0o644)
    old = os.umask(0)
    try:
        cert, key = self_signed(pki, "node-a", ["127.0.0.1"])
        assert (pki.stat().st_mode & 0o777, key.stat().st_mode & 0o777) == (0o700, 0o600)
        pki.chmod(0o755)
        key.chmod(0o644)
        assert self_signed(pki, "node-a", ["127.0.0.1"]) == (cert, key)  # kept, and closed again
        assert (pki.stat().st_mode & 0o777, key.stat().st_mode & 0o777) == (0o700, 0o600)
        fresh = tmp_path / "root" / "pki"
        self_signed(fresh, "node-a", [])
        assert fresh.stat().st_mode & 0o777 == 0o700 and (fresh / "kubelet.key").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


# --- the server on loopback ----------------------------------------------------------------------------

def one_pod(log_path: Path, stream_url: str = "") -> FakeCRI:
    """A runtime with one pod (default/web) of one running container (app, c1) logging to `log_path`, whose
    exec URL is `stream_url`."""
    runtime = FakeCRI()
    runtime.add_sandbox("s1", "web", "default", "u1")
    runtime.add_container("c1", "app", "s1", log_path=str(log_path))
    runtime.stream_url = stream_url
    return runtime


@pytest.fixture
def pki(tmp_path):
    ca = CA(tmp_path / "pki")
    return SimpleNamespace(ca=ca, serving=ca.issue("serving", "node-a", client=False, server=True,
                                                   hosts=("127.0.0.1",)),
                           apiserver=ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client"),
                           alice=ca.issue("alice", "alice"))


def start_server(tmp_path, pki, runtime, pod_list=None, **settings) -> KubeletServer:
    s = Settings(node_name="node-a", node_ip="127.0.0.1", address="127.0.0.1", port=0, root_dir=tmp_path / "root",
                 tls_cert_file=pki.serving.cert, tls_private_key_file=pki.serving.key,
                 client_ca_file=pki.ca.pair.cert, **settings)
    return KubeletServer(s, runtime, client=FakeReviews(allowed=True), pod_list=pod_list).start()


def test_the_server_authenticates_authorizes_and_serves(tmp_path, pki, log_file):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
           "status": {"phase": "Running"}}
    server = start_server(tmp_path, pki, one_pod(log_file), pod_list=lambda: [pod])
    base, ca = f"https://127.0.0.1:{server.port}", str(pki.ca.pair.cert)
    as_apiserver = (str(pki.apiserver.cert), str(pki.apiserver.key))
    try:
        r = requests.get(f"{base}/pods", verify=ca, cert=as_apiserver, timeout=5)
        assert r.json() == {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [pod]}
        server.metrics.pod_start_duration.observe(1.5)
        assert requests.get(f"{base}/healthz", verify=ca, timeout=5).status_code == 401
        assert requests.get(f"{base}/healthz", verify=ca, cert=as_apiserver, timeout=5).text == "ok"
        r = requests.get(f"{base}/containerLogs/default/web/app?tailLines=1&timestamps=true", verify=ca,
                         cert=as_apiserver, timeout=5)
        assert (r.status_code, r.text) == (200, f"{T2} three\n")
        r = requests.get(f"{base}/containerLogs/default/web/app?previous=true", verify=ca, cert=as_apiserver,
                         timeout=5)
        assert r.status_code == 400 and "previous terminated container" in r.text
        metrics = requests.get(f"{base}/metrics", verify=ca, cert=as_apiserver, timeout=5).text
        assert "kubelet_running_pods 1.0" in metrics
        assert 'kubelet_running_containers{container_state="running"} 1.0' in metrics
        assert 'kubelet_http_requests_total{long_running="false",method="get",path="/containerLogs"' in metrics
        assert 'kubelet_pod_start_duration_seconds_bucket{le="2.0"} 1.0' in metrics
        assert 'kubelet_pod_start_duration_seconds_bucket{le="1.0"} 0.0' in metrics
        server.authz.client.allowed = False
        r = requests.get(f"{base}/metrics/cadvisor", verify=ca, cert=(str(pki.alice.cert), str(pki.alice.key)),
                         timeout=5)
        assert r.status_code == 403
        assert "Forbidden (user=alice, verb=get, resource=nodes, subresource=metrics)" in r.text
    finally:
        server.stop()


def test_resource_and_probe_metrics_and_configz_are_served(tmp_path, pki, log_file):
    from pykubelet.prober.manager import ProbeTally

    runtime = one_pod(log_file)
    runtime.stats = [api_pb2.ContainerStats(
        attributes=api_pb2.ContainerAttributes(id="c1", metadata=api_pb2.ContainerMetadata(name="app")),
        cpu=api_pb2.CpuUsage(timestamp=2_000_000_000, usage_core_nano_seconds=api_pb2.UInt64Value(value=5 * 10**9)),
        memory=api_pb2.MemoryUsage(timestamp=2_000_000_000, working_set_bytes=api_pb2.UInt64Value(value=7)))]
    tally = ProbeTally("Readiness", "app", "web", "default", "u1", 1, 0, (1,) + (0,) * 11, 0.001)
    s = Settings(node_name="node-a", node_ip="127.0.0.1", address="127.0.0.1", port=0, root_dir=tmp_path / "root",
                 tls_cert_file=pki.serving.cert, tls_private_key_file=pki.serving.key,
                 client_ca_file=pki.ca.pair.cert)
    server = KubeletServer(s, runtime, client=FakeReviews(allowed=True), probes=lambda: [tally]).start()
    base, ca = f"https://127.0.0.1:{server.port}", str(pki.ca.pair.cert)
    as_apiserver = (str(pki.apiserver.cert), str(pki.apiserver.key))
    try:
        r = requests.get(f"{base}/metrics/resource", verify=ca, cert=as_apiserver, timeout=5)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=")
        assert 'container_cpu_usage_seconds_total{container="app",namespace="default",pod="web"} 5.0 2000' in r.text
        assert "resource_scrape_error 0.0" in r.text
        r = requests.get(f"{base}/metrics/probes", verify=ca, cert=as_apiserver, timeout=5)
        assert ('prober_probe_total{container="app",namespace="default",pod="web",pod_uid="u1",'
                'probe_type="Readiness",result="successful"} 1.0') in r.text
        r = requests.get(f"{base}/configz", verify=ca, cert=as_apiserver, timeout=5)
        assert r.headers["Content-Type"] == "application/json"
        assert r.json()["kubeletconfig"]["authentication"]["x509"] == {"clientCAFile": str(pki.ca.pair.cert)}
        server.authz.client.allowed = False
        alice = (str(pki.alice.cert), str(pki.alice.key))
        r = requests.get(f"{base}/configz", verify=ca, cert=alice, timeout=5)
        assert r.status_code == 403
        assert "Forbidden (user=alice, verb=get, resource=nodes, subresource=configz)" in r.text
    finally:
        server.stop()


def test_an_upgraded_stream_is_spliced_to_the_runtime(tmp_path, pki, log_file):
    """A stand-in streaming server answers 101 and echoes: the client's upgrade request reaches it with
    its protocol headers but not its credentials, and bytes flow both ways."""
    backend = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = backend.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(1)
            seen.append(head)
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: SPDY/3.1\r\nConnection: Upgrade\r\n\r\n")
            while data := conn.recv(100):
                conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    runtime = one_pod(log_file, f"http://127.0.0.1:{backend.getsockname()[1]}/exec/TOKEN")
    server = start_server(tmp_path, pki, runtime)
    ctx = ssl.create_default_context(cafile=str(pki.ca.pair.cert))
    ctx.load_cert_chain(pki.apiserver.cert, pki.apiserver.key)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"POST /exec/default/web/app?command=sh&command=-c&command=true&input=1&output=1&error=1&tty=1 "
                        b"HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                        b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\nAuthorization: Bearer secret\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += tls.recv(1)
            assert answer.startswith(b"HTTP/1.1 101 ")
            tls.sendall(b"hello")
            echoed = b""
            while len(echoed) < 5:
                echoed += tls.recv(5)
            assert echoed == b"HELLO"
    finally:
        server.stop()
        backend.close()
    assert seen[0].startswith(b"POST /exec/TOKEN HTTP/1.1\r\n")
    assert b"X-Stream-Protocol-Version: v4.channel.k8s.io" in seen[0] and b"secret" not in seen[0]
    req = runtime.execs[0]
    assert (list(req.cmd), req.stdin, req.stdout, req.stderr, req.tty) == (["sh", "-c", "true"], True, True, False,
                                                                           True)


def test_summary_shape(tmp_path, log_file):
    runtime = one_pod(log_file)
    stats = api_pb2.ContainerStats(
        attributes=api_pb2.ContainerAttributes(id="c1", metadata=api_pb2.ContainerMetadata(name="app")),
        cpu=api_pb2.CpuUsage(timestamp=2_000_000_000, usage_core_nano_seconds=api_pb2.UInt64Value(value=5)),
        memory=api_pb2.MemoryUsage(timestamp=2_000_000_000, working_set_bytes=api_pb2.UInt64Value(value=7),
                                   usage_bytes=api_pb2.UInt64Value(value=9)))
    runtime.stats = [stats]
    settings = Settings(node_name="node-a", root_dir=tmp_path, pod_logs_dir=tmp_path)
    summary = Summary(runtime, settings)
    first = summary.summary()
    assert first["node"]["nodeName"] == "node-a" and "usageNanoCores" not in first["node"]["cpu"]
    assert first["node"]["memory"]["availableBytes"] > 0 and first["node"]["fs"]["capacityBytes"] > 0
    [pod] = first["pods"]
    assert pod["podRef"] == {"name": "web", "namespace": "default", "uid": "u1"}
    assert pod["cpu"]["usageCoreNanoSeconds"] == 5 and pod["memory"] == {
        "time": "1970-01-01T00:00:02Z", "workingSetBytes": 7, "usageBytes": 9}
    [c] = pod["containers"]
    assert c["name"] == "app" and c["memory"]["workingSetBytes"] == 7 and "logs" in c
    assert "usageNanoCores" in summary.summary()["node"]["cpu"]  # a rate once there is a previous sample


@pytest.mark.parametrize("stalled", ["silent", "not-reading"])
def test_a_stalled_session_is_ended_after_the_idle_timeout(stalled):
    """Issue 22: the kubelet's proxy of an exec, attach or port-forward session had no idle timeout (the
    kubelet's streamingConnectionIdleTimeout): a client that said nothing, or stopped reading what the
    container wrote, held the session and its thread for ever. Now a session in which nothing moves for
    the idle timeout ends."""
    from pykubelet.server import streaming

    idle = 1.0
    client, client_peer = socket.socketpair()
    backend, backend_peer = socket.socketpair()
    done = threading.Event()

    def run() -> None:
        try:
            streaming.splice(client, backend, idle_timeout=idle)
        finally:
            done.set()

    def flood() -> None:  # the container writes; the client never reads
        try:
            while not done.is_set():
                backend_peer.sendall(b"x" * 65536)
        except OSError:
            pass

    threads = [threading.Thread(target=run, daemon=True)]
    if stalled == "not-reading":
        threads.append(threading.Thread(target=flood, daemon=True))
    try:
        for t in threads:
            t.start()
        assert done.wait(10 * idle), "the session outlived its idle timeout"
    finally:
        for s in (backend, client, client_peer, backend_peer):  # backend first: a blocked flood sees EPIPE
            s.close()
        for t in threads:
            t.join(10)


def test_serving_context_takes_tls_min_version_and_cipher_suites(tmp_path):
    from pykubelet.server.tls import serving_context

    settings = Settings(node_name="node-a", root_dir=tmp_path, tls_min_version=ssl.TLSVersion.TLSv1_3)
    assert serving_context(settings).minimum_version == ssl.TLSVersion.TLSv1_3
    settings = Settings(node_name="node-a", root_dir=tmp_path, tls_cipher_suites=["ECDHE-ECDSA-AES256-GCM-SHA384"])
    tls12 = [c["name"] for c in serving_context(settings).get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-ECDSA-AES256-GCM-SHA384"]


def test_healthz_answers_ok_and_nothing_else():
    """The plain-HTTP health check (healthzPort), apart from the authenticated server: "ok" while the kubelet's
    loops turn, and 500 naming the stock kubelet's `syncloop` check when one has been silent too long."""
    import http.client

    from pykubelet.health import MIN_WINDOW, Heartbeats
    from pykubelet.server.healthz import Healthz

    now = [0.0]
    heartbeats = Heartbeats(clock=lambda: now[0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    healthz = Healthz("127.0.0.1", port, heartbeats).start()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/healthz")
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"ok")
        conn.request("GET", "/pods")
        r = conn.getresponse()
        assert r.status == 404
        r.read()
        heartbeats.watch("pleg", 10.0)
        now[0] = MIN_WINDOW + 1
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        assert (r.status, r.read()) == (500, b"[+]ping ok\n[+]log ok\n[-]syncloop failed: reason withheld\n"
                                              b"healthz check failed\n")
        heartbeats.beat("pleg")
        conn.request("GET", "/healthz?verbose")
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"[+]ping ok\n[+]log ok\n[+]syncloop ok\nhealthz check passed\n")
        conn.close()
    finally:
        healthz.stop()
