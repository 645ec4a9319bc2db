"""The kubelet server (:10250) against clients that play tricks, over real TLS on loopback with client
certificates: a body that carries a second request (request smuggling through the API server's pooled,
per-connection-authenticated connection), ambiguous framing, slow and idle clients, more connections than
the cap, descriptors above select()'s 1024; and the review caches' keys and bounds."""
from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pykubelet.config import Settings
from pykubelet.server.app import KubeletServer, Limits
from pykubelet.server.authn import Authenticator, User
from pykubelet.server.authz import Attributes, Authorizer
from pynode_cluster.pki import CA
from tests.unit.test_kubelet_server import FakeReviews, cri_log, one_pod

REPO = Path(__file__).resolve().parents[2]
T0 = "2026-12-03T10:00:00.000000001Z"
FAST = Limits(handshake=2.0, request=2.0, idle=2.0, write=5.0)
SLOW = 60.0  # a deadline no test waits out: with every other Limits field SLOW, only the short one can close
WAIT = 30.0  # how long a test waits for what a 2 s deadline does: far past it, so a busy machine still passes


@pytest.fixture
def pki(tmp_path):
    ca = CA(tmp_path / "pki")
    return SimpleNamespace(ca=ca, serving=ca.issue("serving", "node-a", client=False, server=True,
                                                   hosts=("127.0.0.1",)),
                           apiserver=ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client"))


@pytest.fixture
def log_file(tmp_path):
    path = tmp_path / "0.log"
    path.write_bytes(cri_log((T0, "stdout", "F", "one")))
    return path


def settings(tmp_path: Path, serving_cert: str, serving_key: str, ca_cert: str) -> Settings:
    return Settings(node_name="node-a", node_ip="127.0.0.1", address="127.0.0.1", port=0,
                    root_dir=tmp_path / "root", tls_cert_file=Path(serving_cert),
                    tls_private_key_file=Path(serving_key), client_ca_file=Path(ca_cert))


@pytest.fixture
def server(tmp_path, pki, log_file, request):
    limits = getattr(request, "param", FAST)
    s = settings(tmp_path, pki.serving.cert, pki.serving.key, pki.ca.pair.cert)
    k = KubeletServer(s, one_pod(log_file), client=FakeReviews(allowed=True), limits=limits).start()
    yield k
    k.stop()


def client_context(pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca.pair.cert))
    ctx.load_cert_chain(pki.apiserver.cert, pki.apiserver.key)
    return ctx


def connect(pki, port: int, timeout: float = 5.0) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        return client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise


def read_until_close(sock: ssl.SSLSocket, wait: float) -> tuple[bytes, bool]:
    """Everything the server sends within `wait` seconds, and whether it closed the connection."""
    data, deadline = b"", time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except (ConnectionResetError, ssl.SSLError):
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def readable(sock: socket.socket, wait: float) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(wait * 1000))


def statuses(data: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


def healthz(tls: ssl.SSLSocket) -> bytes:
    """One GET /healthz on a kept-alive connection: its whole answer."""
    tls.sendall(SMUGGLED)
    data = b""
    while not data.endswith(b"\r\n\r\nok"):
        chunk = tls.recv(65536)
        assert chunk, data
        data += chunk
    return data


SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n"


def test_a_body_is_never_answered_as_a_second_request(server, pki):
    """The probe of the issue: one GET /pods whose body is a GET /healthz. One answer, then the
    connection closes; the body is never read as a request."""
    with connect(pki, server.port) as tls:
        tls.sendall(b"GET /pods HTTP/1.1\r\nHost: node\r\nContent-Length: %d\r\n\r\n%s" % (len(SMUGGLED), SMUGGLED))
        data, closed = read_until_close(tls, 4)
    assert statuses(data) == [200] and b'"PodList"' in data
    assert closed


@pytest.mark.parametrize(("headers", "body", "status"), [
    # both framings: which one the peer used is ambiguous (the classic CL.TE / TE.CL desync)
    (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED, 400),
    (b"Content-Length: 0\r\nContent-Length: 37\r\n", SMUGGLED, 400),
    (b"Content-Length: 37\r\nContent-Length: 37\r\n", SMUGGLED, 400),
    (b"Content-Length: +37\r\n", SMUGGLED, 400),
    (b"Content-Length: 37, 37\r\n", SMUGGLED, 400),
    (b"Content-Length: -1\r\n", SMUGGLED, 400),
    # a name another parser would read as Content-Length, or a folded line it would join
    (b"Content-Length : 37\r\n", SMUGGLED, 400),
    (b"X-Pad: a\r\n Content-Length: 37\r\n", SMUGGLED, 400),
    (b"Transfer-Encoding: chunked\r\n", b"25\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", 400),
    (b"Transfer-Encoding: gzip\r\n", SMUGGLED, 501),
    (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED, 400),
    (b"Content-Length: 999999999\r\n", SMUGGLED, 413),
])
def test_ambiguous_or_unwanted_framing_gets_one_error_and_the_connection_closes(server, pki, headers, body,
                                                                                status):
    with connect(pki, server.port) as tls:
        tls.sendall(b"GET /pods HTTP/1.1\r\nHost: node\r\n" + headers + b"\r\n" + body)
        data, closed = read_until_close(tls, 4)
    assert statuses(data) == [status], data[:300]
    assert b"Connection: close" in data
    assert closed


def test_bare_line_feeds_are_refused(server, pki):
    with connect(pki, server.port) as tls:
        tls.sendall(b"GET /pods HTTP/1.1\r\nHost: node\nContent-Length: 37\r\n\r\n" + SMUGGLED)
        data, closed = read_until_close(tls, 4)
    assert statuses(data) == [400] and closed


def test_an_error_closes_the_connection(server, pki):
    with connect(pki, server.port) as tls:
        tls.sendall(b"GET /nothing-here HTTP/1.1\r\nHost: node\r\n\r\n" + SMUGGLED)
        data, closed = read_until_close(tls, 4)
    assert statuses(data) == [404] and closed


def test_pipelined_requests_without_bodies_are_still_served(server, pki):
    with connect(pki, server.port) as tls:
        tls.sendall(SMUGGLED + SMUGGLED)
        data, _ = read_until_close(tls, 1)
    assert statuses(data) == [200, 200]


@pytest.mark.parametrize("server", [Limits(handshake=SLOW, request=2.0, idle=SLOW, write=SLOW)], indirect=True)
def test_a_slow_request_head_is_cut_off_at_its_deadline(server, pki):
    """Slowloris: a byte of the head every half second never trips a per-read timeout; the head's
    deadline (2 s here, every other one SLOW) is what cuts the connection off while the bytes still come."""
    with connect(pki, server.port) as tls:
        tls.sendall(b"GET /pods HTTP/1.1\r\n")
        deadline, closed = time.monotonic() + WAIT, False
        while not closed and time.monotonic() < deadline:
            try:
                tls.sendall(b"X")
            except OSError:
                closed = True
                break
            data, closed = read_until_close(tls, 0.5)
            assert not statuses(data)
    assert closed


@pytest.mark.parametrize("server", [Limits(handshake=2.0, request=SLOW, idle=SLOW, write=SLOW)], indirect=True)
def test_a_slow_tls_handshake_is_cut_off_at_its_deadline(server):
    """The ClientHello a byte at a time: the handshake's deadline is for the whole handshake, and (every
    other one SLOW) the only one that can close the connection before the hello is through."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    tls = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_side=False)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = out.read()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        deadline, closed = time.monotonic() + WAIT, False
        for byte in hello:
            assert time.monotonic() < deadline, "the handshake was never cut off"
            try:
                raw.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if readable(raw, 0.3):
                try:
                    assert raw.recv(100) == b""
                except ConnectionResetError:
                    pass
                closed = True
                break
    assert closed  # before the last byte of the hello


@pytest.mark.parametrize("server", [Limits(handshake=SLOW, request=SLOW, idle=2.0, write=SLOW)], indirect=True)
def test_an_idle_keep_alive_connection_is_closed(server, pki):
    """Closed by the idle deadline: every other one is SLOW."""
    with connect(pki, server.port) as tls:
        tls.sendall(SMUGGLED)
        data, closed = read_until_close(tls, WAIT)
    assert statuses(data) == [200] and closed


@pytest.mark.parametrize("server", [Limits(handshake=2.0, request=2.0, idle=30.0, write=5.0, connections=2)],
                         indirect=True)
def test_connections_above_the_cap_are_refused_without_starving_the_others(server, pki):
    with contextlib.ExitStack() as held:
        first = held.enter_context(connect(pki, server.port))
        second = held.enter_context(connect(pki, server.port))
        assert statuses(healthz(first)) == statuses(healthz(second)) == [200]  # both served, kept alive
        # refused while both slots stay taken: a connection left waiting for one would time out instead
        # (TimeoutError, neither of these), since none is freed before this returns
        with pytest.raises((ssl.SSLError, ConnectionError)):
            healthz(held.enter_context(connect(pki, server.port)))
        assert statuses(healthz(first)) == [200]  # the connections held are still served
        first.close()
        deadline = time.monotonic() + 5
        while True:  # the slot comes back once the server has seen the close
            try:
                with connect(pki, server.port) as tls:
                    assert statuses(healthz(tls)) == [200]
                break
            except (ssl.SSLError, ConnectionError, AssertionError):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert statuses(healthz(second)) == [200]


def test_review_cache_keys_hold_the_users_extra():
    """Two users alike but for `extra` (a token's scopes, an impersonated extra): the second must get its
    own review, not the first one's cached decision."""
    calls: list = []

    class Reviews:
        def create(self, obj):
            calls.append(obj.spec.extra)
            return SimpleNamespace(status=SimpleNamespace(allowed=bool(obj.spec.extra)))

    authz = Authorizer(Reviews(), "Webhook")
    attrs = Attributes("create", "proxy", "n")
    scoped = User("alice", ("g",), "u", {"scopes.example.com": ["exec"]})
    assert authz.allowed(scoped, attrs)
    assert not authz.allowed(User("alice", ("g",), "u"), attrs)
    assert authz.allowed(User("alice", ("g",), "u", {"scopes.example.com": ["logs"]}), attrs)
    assert len(calls) == 3
    assert authz.allowed(scoped, attrs) and len(calls) == 3  # and its own decision is cached


class Tokens:
    """A lightkube client answering TokenReviews: tokens starting with "good" are alice's."""

    def __init__(self) -> None:
        self.reviewed: list[str] = []

    def create(self, obj):
        token = obj.spec.token
        self.reviewed.append(token)
        ok = token.startswith("good")
        user = SimpleNamespace(username="alice", groups=["g"], uid="u", extra={}) if ok else None
        return SimpleNamespace(status=SimpleNamespace(authenticated=ok, user=user))


def test_the_token_cache_is_bounded_and_evicts_the_least_recently_used():
    tokens = Tokens()
    authn = Authenticator(tokens, anonymous=False, webhook=True, max_tokens=3)
    for i in range(10):
        assert authn.authenticate(None, f"Bearer bad-{i}") is None
    assert len(authn._cache) == 3
    assert authn.authenticate(None, "Bearer bad-0") is None  # pushed out: reviewed again
    assert authn.authenticate(None, "Bearer bad-9") is None  # still held
    assert tokens.reviewed.count("bad-0") == 2 and tokens.reviewed.count("bad-9") == 1


def test_refused_tokens_are_cached_shorter_than_accepted_ones():
    now = [0.0]
    tokens = Tokens()
    authn = Authenticator(tokens, anonymous=False, webhook=True, cache_ttl=120, clock=lambda: now[0])
    assert authn.authenticate(None, "Bearer good") == User("alice", ("g",), "u")
    assert authn.authenticate(None, "Bearer bad") is None
    now[0] = 31
    authn.authenticate(None, "Bearer good")
    authn.authenticate(None, "Bearer bad")
    assert tokens.reviewed == ["good", "bad", "bad"]
    now[0] = 121
    authn.authenticate(None, "Bearer good")
    assert tokens.reviewed == ["good", "bad", "bad", "good"]


# --- descriptors above 1024 ----------------------------------------------------------------------------

CHILD = """
import json, os, resource, sys
from pathlib import Path
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
from tests.unit.test_kubelet_server import FakeReviews, one_pod
from tests.unit.test_kubelet_server_framing import settings
from pykubelet.server.app import KubeletServer
args = json.loads(sys.argv[1])
runtime = one_pod(Path(args["log"]), args["stream_url"])
server = KubeletServer(settings(Path(args["tmp"]), *args["pki"]), runtime, client=FakeReviews(allowed=True)).start()
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""


def test_connections_on_descriptors_above_1024_are_served(tmp_path, pki, log_file):
    """A kubelet with RLIMIT_NOFILE raised has sockets above 1024, where select() fails: an exec stream
    is spliced and a followed log is watched for the client leaving, both on such a socket."""
    if resource_hard_limit() < 1200:
        pytest.skip("RLIMIT_NOFILE's hard limit is below 1200")
    backend = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = backend.accept()
        with conn, contextlib.suppress(OSError):  # the kubelet may drop it: the client's side then fails
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(1)
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: SPDY/3.1\r\nConnection: Upgrade\r\n\r\n")
            while data := conn.recv(100):
                conn.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()
    args = {"tmp": str(tmp_path), "log": str(log_file), "pki": [str(pki.serving.cert), str(pki.serving.key),
                                                               str(pki.ca.pair.cert)],
            "stream_url": f"http://127.0.0.1:{backend.getsockname()[1]}/exec/TOKEN"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(args)], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=os.environ | {"PYTHONPATH": str(REPO)})
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        with connect(pki, port) as tls:
            tls.sendall(b"POST /exec/default/web/app?command=sh&input=1&output=1&tty=1 HTTP/1.1\r\nHost: n\r\n"
                        b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\nhello")
            answer = b""
            while b"HELLO" not in answer:
                chunk = tls.recv(4096)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 101 ")
        with connect(pki, port) as tls:
            tls.sendall(b"GET /containerLogs/default/web/app?follow=true HTTP/1.1\r\nHost: n\r\n\r\n")
            data, closed = read_until_close(tls, 2.5)
            assert statuses(data) == [200] and b"one\n" in data
            assert not closed  # still following: the look for the client leaving did not fail
    finally:
        try:
            child.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        backend.close()
    assert child.returncode == 0


def resource_hard_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def test_a_refused_large_body_still_gets_its_answer(server, pki):
    """413 for a body far larger than the drain: the server stops reading, but its answer must reach the
    client rather than be lost to the reset that closing on unread data sends."""
    with connect(pki, server.port) as tls:
        tls.settimeout(3)
        with contextlib.suppress(OSError):  # the server may close before all is sent
            tls.sendall(b"POST /pods HTTP/1.1\r\nHost: node\r\nContent-Length: 100000000\r\n\r\n" + b"x" * (1 << 20))
        data, closed = read_until_close(tls, 5)
    assert statuses(data) == [413] and closed


def test_bytes_after_an_upgrade_that_was_not_switched_are_not_a_request(server, pki):
    """What follows an upgrade request's head was meant for the stream: answered without switching
    (here a route that does not upgrade), the connection closes instead of reading it as a request."""
    with connect(pki, server.port) as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"
                    + SMUGGLED)
        data, closed = read_until_close(tls, 4)
    assert statuses(data) == [200] and closed


@pytest.mark.parametrize("server", [Limits(handshake=2.0, request=2.0, idle=30.0, write=2.0, connections=1)],
                         indirect=True)
def test_a_client_that_stops_reading_gives_its_connection_up(server, pki, log_file):
    """A client asks for a log larger than the socket buffers and reads nothing: the stalled answer
    times out and frees its slot, so with a cap of one the next client is served."""
    line = cri_log((T0, "stdout", "F", "x" * 1000))
    log_file.write_bytes(line * 32768)
    with connect(pki, server.port) as stalled:
        stalled.sendall(b"GET /containerLogs/default/web/app HTTP/1.1\r\nHost: node\r\n\r\n")
        deadline, refused = time.monotonic() + WAIT, 0
        while True:
            try:
                with connect(pki, server.port) as tls:
                    assert statuses(healthz(tls)) == [200]
                break
            except (ssl.SSLError, ConnectionError, AssertionError):
                refused += 1
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert refused  # the slot was the stalled one's until its write deadline freed it
        _, closed = read_until_close(stalled, 10)
    assert closed
