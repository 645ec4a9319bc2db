"""The kubelet's HTTPS server (default :10250): what the API server reaches for `kubectl logs`, `exec`,
`attach` and `port-forward`, and what metrics-server and Prometheus scrape.

Built on the standard library's ThreadingHTTPServer: a thread per connection fits long-lived log follows
and exec sessions, and the streaming routes need the raw connection after the request head to splice
the upgraded stream (an ASGI/WSGI server would hide it). The TLS handshake runs in the connection's
thread, not the accept loop, so a client that stalls its handshake stalls only itself.

Identity is per connection (the client certificate), and the API server reaches the kubelet through
pooled connections with its own certificate: any byte read as the start of a request that the client did
not frame as one runs with that identity. So the request head is read here, not by http.server: strict
lines (CRLF only, token header names, no folding) and one framing: Content-Length and Transfer-Encoding
together, several Content-Length or a bad value get 400, a coding other than chunked 501 (Go's server lets
Transfer-Encoding win and takes repeated equal lengths; RFC 9112 6.3 allows refusing both, and a proxy
in front may have read them the other way). No route takes a body: a chunked one is refused (400), a
Content-Length one is drained (at most Limits.body_bytes, else 413) and the connection then closed.
Every error answer closes the connection (after a moment's drain, so the answer is not lost to a
reset): after a refused head, where the next request starts is unknown. Bytes read past a head are kept
for what comes next on the connection (the next request, or an upgraded stream's first bytes).

A client holds a thread only while it makes progress (Limits): the TLS handshake and each request's head
have deadlines for the whole of them, not per read (a byte a second never trips a per-read timeout); a
kept-alive connection waiting for its next request is closed after Limits.idle; a response the client
stops reading times out. At most Limits.connections connections are served at once; more are closed at
accept, before the handshake, so a flood costs no thread and the connections held go on. Readiness is
asked with poll(), never select(): descriptors pass 1024 once RLIMIT_NOFILE is raised.

Every request is authenticated (authn.py) and authorized (authz.py) before its route runs: 401 for an
unknown caller, 403 naming the user and the check. Containers are found through the CRI by the
kubelet's labels on them (pod namespace/name/uid, container name), so the routes work for every pod
the runtime holds, static ones in standalone mode too.
"""
from __future__ import annotations

import io
import json
import logging
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.api.podmodel import Pod
from pykubelet.config import Settings
from pykubelet.errors import InvalidArgumentError, KubeletError
from pykubelet.pods.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID
from pykubelet.prober.manager import ProbeTally
from pykubelet.server import logs, streaming
from pykubelet.server.authn import Authenticator, User
from pykubelet.server.authz import Authorizer, attributes
from pykubelet.server.configz import configz
from pykubelet.server.metrics import CONTENT_TYPE, Metrics, ProbeCollector, ResourceCollector, registry, render
from pykubelet.server.stats import Summary
from pykubelet.server.tls import ServingTLS

log = logging.getLogger("pykubelet.server")

FOLLOW_CHECK = 1.0  # seconds between looks at the runtime while a followed log is quiet
RECV = 64 * 1024
LINGER = 1.0  # seconds a connection is drained after an error answer, before it closes
REFUSED_LOG_EVERY = 60.0  # seconds between warnings while connections are refused at the cap

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but HTAB
_DIGITS = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class Limits:
    """How long and how many: a client holds a thread only while it makes progress. The stock kubelet's
    Go server has IdleTimeout 90 s and MaxHeaderBytes 1 MiB but only a 4 h ReadTimeout, and no cap on
    connections (a goroutine is cheap; a thread here is not)."""
    handshake: float = 10.0  # the whole TLS handshake
    request: float = 10.0  # a request's head and a drained body: from its first byte (or the handshake's end)
    idle: float = 90.0  # a kept-alive connection waiting for its next request
    write: float = 60.0  # a response (not a stream) the client stops reading
    connections: int = 512  # served at once; each is a thread
    head_bytes: int = 1 << 20
    body_bytes: int = 256 << 10  # an unexpected body drained before the answer (Go drains as much)


class HTTPError(KubeletError):
    """An answer other than 200 to a request of the kubelet's API; its kind is its HTTP status, the one
    thing the client acts on, so it derives from no kind of its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Refused(HTTPError):
    """A request head the server does not take: answered with `status` and the connection closed."""


def _true(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or [""])[-1].lower() in ("1", "true")


class KubeletServer:
    """`client`: the kubelet's lightkube client (None in standalone mode); `pods(uid)`: the desired pod
    (PodWorkers.pod) for restart policies, when there is an API server; `pod_list()`: every pod the
    kubelet has, with its status (PodWorkers.pods), for /pods; `metrics`: the kubelet's Metrics (the pod
    workers observe into it), a fresh one if not given; `probes()`: the probes' counts (ProbeManager.tallies)
    for /metrics/probes; `tls`: the serving context a certificate manager swaps on rotation
    (serverTLSBootstrap), else one made from the settings."""

    def __init__(self, settings: Settings, runtime: cri.CRIRuntime, client=None,
                 pods: Callable[[str], Pod | None] | None = None,
                 pod_list: Callable[[], list[dict]] | None = None, metrics: Metrics | None = None,
                 probes: Callable[[], list[ProbeTally]] | None = None, limits: Limits | None = None,
                 tls: ServingTLS | None = None) -> None:
        self.settings, self.runtime, self.pods, self.pod_list = settings, runtime, pods, pod_list
        self.tls = tls
        self.limits = limits or Limits()
        self.authn = Authenticator(client, anonymous=settings.anonymous_auth,
                                   webhook=settings.webhook_authentication,
                                   cache_ttl=settings.authentication_webhook_cache_ttl)
        self.authz = Authorizer(client, settings.authorization_mode,
                                settings.authorization_webhook_cache_authorized_ttl,
                                settings.authorization_webhook_cache_unauthorized_ttl)
        self.metrics = metrics or Metrics(runtime, settings.node_name)
        self.summary = Summary(runtime, settings)
        self.resource_metrics = registry(ResourceCollector(self.summary.cpu_and_memory))
        self.probe_metrics = registry(ProbeCollector(probes or list))
        if client is None and (settings.webhook_authentication or settings.authorization_mode == "Webhook"):
            log.warning("no API server: bearer tokens are refused%s", " and every request is denied "
                        "(authorization mode Webhook)" if settings.authorization_mode == "Webhook" else "")
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def start(self) -> KubeletServer:
        try:
            server = _Server((self.settings.address, self.settings.port), self)
        except OSError as e:
            raise OSError(e.errno, f"kubelet server: listen on {self.settings.address}:{self.settings.port}: "
                                   f"{e.strerror}") from e
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="kubelet-server", daemon=True)
        self._thread.start()
        log.info("kubelet server listening on https://%s:%d", self.settings.address, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- finding what a request names -------------------------------------------------------------

    def sandbox(self, namespace: str, pod: str, uid: str | None = None) -> api_pb2.PodSandbox:
        selector = {POD_NAMESPACE: namespace, POD_NAME: pod} | ({POD_UID: uid} if uid else {})
        sandboxes = self.runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector=selector))
        if not sandboxes:
            raise HTTPError(404, f"pod {namespace}/{pod} not found")
        return max(sandboxes, key=lambda s: (s.state == api_pb2.SANDBOX_READY, s.created_at))

    def attempts(self, sandbox: api_pb2.PodSandbox, container: str) -> list[api_pb2.Container]:
        """The container's attempts in the pod, newest first."""
        found = self.runtime.list_containers(api_pb2.ContainerFilter(label_selector={
            POD_UID: sandbox.metadata.uid, CONTAINER_NAME: container}))
        return sorted(found, key=lambda c: (c.metadata.attempt, c.created_at), reverse=True)

    def container(self, namespace: str, pod: str, container: str, uid: str | None = None) -> api_pb2.Container:
        sandbox = self.sandbox(namespace, pod, uid)
        attempts = self.attempts(sandbox, container)
        if not attempts:
            raise HTTPError(404, f"container {container!r} in pod {namespace}/{pod} not found")
        return attempts[0]

    def log_path(self, container_id: str) -> Path:
        path = self.runtime.container_status(container_id).status.log_path
        if not path:
            raise HTTPError(404, f"container {container_id}: the runtime has no log path for it")
        return Path(path)

    def next_log(self, sandbox: api_pb2.PodSandbox, current: api_pb2.Container):
        """For logs.write_logs while following `current`: see there."""
        following, checked = current.id, 0.0

        def check() -> Path | None:
            nonlocal following, checked
            now = time.monotonic()
            if now - checked < FOLLOW_CHECK:
                return None
            checked = now
            try:
                attempts = self.attempts(sandbox, current.metadata.name)
                if attempts and attempts[0].id != following:
                    path = self.log_path(attempts[0].id)
                    if not path.exists():
                        return None  # the next attempt has not written yet
                    following = attempts[0].id
                    return path
                status = self.runtime.container_status(following).status
            except (cri.NotFound, HTTPError):
                raise StopIteration from None
            if status.state in (api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_CREATED):
                return None
            if not self._restarts(sandbox, status.exit_code):
                raise StopIteration
            return None

        return check

    def _restarts(self, sandbox: api_pb2.PodSandbox, exit_code: int) -> bool:
        """Whether an exited container of this pod comes back (the sandbox still runs and the pod's
        restart policy says so)."""
        try:
            ready = self.runtime.pod_sandbox_status(sandbox.id).status.state == api_pb2.SANDBOX_READY
        except cri.NotFound:
            return False
        try:
            pod = self.pods(sandbox.metadata.uid) if self.pods is not None else None
        except InvalidArgumentError:  # a pod the workers do not run either
            pod = None
        policy = pod.spec.restart_policy if pod is not None else "Always"
        return ready and (policy == "Always" or (policy == "OnFailure" and exit_code != 0))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], kubelet: KubeletServer) -> None:
        self.kubelet = kubelet
        self.limits = kubelet.limits
        self.tls = kubelet.tls or ServingTLS(kubelet.settings)
        self.slots = threading.BoundedSemaphore(self.limits.connections)
        self.refused_logged = 0.0
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def process_request(self, request, client_address) -> None:
        """In the accept loop: a thread for the connection if a slot is free, else the connection closed."""
        if not self.slots.acquire(blocking=False):
            now = time.monotonic()
            if now - self.refused_logged > REFUSED_LOG_EVERY:
                self.refused_logged = now
                log.warning("kubelet server: %d connections served, refusing more (from %s)",
                            self.limits.connections, client_address[0])
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def finish_request(self, request, client_address) -> None:
        """Runs in the connection's thread: the TLS handshake first, then the HTTP exchange. With a
        timeout on the socket, CPython's SSLSocket.do_handshake waits against one deadline for the whole
        call, not per read."""
        try:
            tls = self.tls.context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except (ssl.SSLError, OSError) as e:
            log.debug("TLS with %s: %s", client_address, e)
            return
        try:
            tls.settimeout(self.limits.handshake)
            tls.do_handshake()
        except (ssl.SSLError, OSError) as e:
            log.debug("TLS handshake with %s: %s", client_address, e)
            tls.close()
            return
        try:
            Handler(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request, client_address) -> None:
        log.exception("kubelet server: request from %s", client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    connection: ssl.SSLSocket

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the head is read by read_head; http.server parses it from memory
        self.rfile = io.BytesIO()
        self.buffered = b""  # read past the last head: the next request's bytes, or an upgraded stream's
        self.deadline = time.monotonic() + self.server.limits.request  # the first head's
        self.refused = False

    def finish(self) -> None:
        super().finish()
        if self.refused:
            self.linger()

    def linger(self) -> None:
        """After an error answer the client may still be sending (a body the server will not read), and
        closing on unread bytes sends a reset that can destroy the answer before the client reads it. So
        the sending side is shut first and what comes is dropped for a moment, as Go's server does
        (closeWriteAndWait)."""
        sock = self.connection
        deadline = time.monotonic() + LINGER
        try:
            sock.shutdown(socket.SHUT_WR)  # ends TLS on this socket too: what comes is read raw
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                if not sock.recv(RECV):
                    return
        except OSError:
            return

    def log_message(self, format: str, *args) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def handle_expect_100(self) -> bool:
        return True  # no 100 Continue: no route reads a body

    def handle_one_request(self) -> None:
        self.close_connection = True
        self.command, self.request_version, self.requestline = "", "HTTP/1.1", ""
        limits = self.server.limits
        try:
            head = self.read_head()
            if head is None:
                return
            self.rfile = io.BytesIO(head)
            self.raw_requestline = self.rfile.readline(65537)
            if not self.parse_request():
                self.refused = True
                return  # answered by http.server, with Connection: close
            self.rfile = io.BytesIO()
            self.check_framing(head)
            if "upgrade" in self.headers:
                self.close_connection = True  # what follows was meant for a stream, switched to or not
            self.connection.settimeout(limits.write)
            handler = getattr(self, "do_" + self.command, None)
            if handler is None:
                raise _Refused(501, f"unsupported method {self.command!r}")
            handler()
            self.wfile.flush()
        except _Refused as e:
            log.debug("%s: refused %r: %s", self.address_string(), self.requestline, e)
            try:
                self.reply(e.status, str(e))
            except OSError:
                self.close_connection = True
        except TimeoutError:
            self.close_connection = True  # a deadline passed, or the client stopped reading
        except OSError as e:
            log.debug("%s: %s", self.address_string(), e)
            self.close_connection = True

    def read_head(self) -> bytes | None:
        """The next request's head, through its blank line; None when the client closed the connection,
        or stayed idle too long, before one began. Raises TimeoutError past the head's deadline."""
        sock, limits = self.connection, self.server.limits
        buf, self.buffered = self.buffered, b""
        if self.deadline == 0.0:  # a kept-alive connection: the head's deadline starts with its first byte
            if not buf.strip(b"\r\n"):
                sock.settimeout(limits.idle)
                try:
                    data = sock.recv(RECV)
                except TimeoutError:
                    return None
                if not data:
                    return None
                buf += data
            self.deadline = time.monotonic() + limits.request
        seen = 0
        while True:
            buf = buf.lstrip(b"\r\n")  # empty lines before a request line are skipped (RFC 9112 2.2)
            end = _HEAD_END.search(buf, max(0, seen - 3))
            if end is not None:
                self.buffered, self.deadline = buf[end.end():], 0.0
                return buf[:end.end()]
            if len(buf) > limits.head_bytes:
                raise _Refused(431, "request header too large")
            seen = len(buf)
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request head deadline")
            sock.settimeout(left)
            data = sock.recv(RECV)
            if not data:
                return None
            buf += data

    def check_framing(self, head: bytes) -> None:
        """Refuses a head whose lines or body framing two parsers could read differently, and drains a
        Content-Length body (no route takes one; it must never be read as the next request)."""
        lines = head.split(b"\r\n")
        if not head.endswith(b"\r\n\r\n") or any(b"\n" in line or b"\r" in line for line in lines):
            raise _Refused(400, "malformed request: lines must end in CRLF")
        lengths: list[str] = []
        codings: list[str] = []
        for line in lines[1:-2]:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                raise _Refused(400, f"malformed request header line {line[:64]!r}")
            if _BAD_VALUE.search(value):
                raise _Refused(400, f"header {name.decode()}: control character in the value")
            lowered = name.lower()
            if lowered == b"content-length":
                lengths.append(value.strip(b" \t").decode("latin-1"))
            elif lowered == b"transfer-encoding":
                codings.append(value.strip(b" \t").decode("latin-1"))
        if lengths and codings:
            raise _Refused(400, "both Transfer-Encoding and Content-Length")
        if len(codings) > 1:
            raise _Refused(400, "too many Transfer-Encoding headers")
        if codings:
            if codings[0].lower() != "chunked":
                raise _Refused(501, f"unsupported transfer encoding {codings[0]!r}")
            raise _Refused(400, f"{self.command} {self.path.split('?', 1)[0]}: takes no request body")
        if len(lengths) > 1:
            raise _Refused(400, "several Content-Length headers")
        if not lengths:
            return
        if not _DIGITS.fullmatch(lengths[0]):
            raise _Refused(400, f"bad Content-Length {lengths[0][:32]!r}")
        length = int(lengths[0])
        if length > self.server.limits.body_bytes:
            raise _Refused(413, f"{self.command} {self.path.split('?', 1)[0]}: takes no request body")
        if length:
            self.drain(length)
            self.close_connection = True

    def drain(self, length: int) -> None:
        """Reads and drops `length` body bytes, within Limits.request."""
        sock, deadline = self.connection, time.monotonic() + self.server.limits.request
        skip = min(length, len(self.buffered))
        self.buffered, length = self.buffered[skip:], length - skip
        while length:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request body deadline")
            sock.settimeout(left)
            data = sock.recv(min(RECV, length))
            if not data:
                raise ConnectionError("the client closed the connection in the request body")
            length -= len(data)

    def do_GET(self) -> None:
        self.dispatch()

    do_POST = do_PUT = do_HEAD = do_DELETE = do_PATCH = do_GET

    @property
    def kubelet(self) -> KubeletServer:
        return self.server.kubelet

    def dispatch(self) -> None:
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query, keep_blank_values=True)
        user = self.kubelet.authn.authenticate(self.connection.getpeercert(), self.headers.get("Authorization"))
        if user is None:
            return self.reply(401, "Unauthorized")
        checks = attributes(self.command, path, self.kubelet.settings.node_name)
        if not any(self.kubelet.authz.allowed(user, a) for a in checks):
            log.info("refused %s %s: %s", self.command, path, checks[0].describe(user))
            return self.reply(403, checks[0].describe(user))
        parts = [p for p in path.split("/") if p]
        long_running = bool(parts) and (parts[0] in ("exec", "attach", "portForward") or (
            parts[0] == "containerLogs" and _true(query, "follow")))
        self.kubelet.metrics.request(self.command, path, long_running)
        try:
            self.route(parts, query, user)
        except HTTPError as e:
            self.reply(e.status, str(e))
        except cri.NotFound as e:
            self.reply(404, str(e))
        except cri.CRIError as e:
            self.reply(500, str(e))

    def route(self, parts: list[str], query: dict[str, list[str]], user: User) -> None:
        head, args = (parts[0], parts[1:]) if parts else ("", [])
        if head == "healthz" and not args:
            return self.reply(200, "ok")
        if head == "metrics" and not args:
            return self.reply(200, self.kubelet.metrics.render(), CONTENT_TYPE)
        if head == "metrics" and args == ["resource"]:
            return self.reply(200, render(self.kubelet.resource_metrics), CONTENT_TYPE)
        if head == "metrics" and args == ["probes"]:
            return self.reply(200, render(self.kubelet.probe_metrics), CONTENT_TYPE)
        if head == "configz" and not args:
            return self.reply(200, configz(self.kubelet.settings), "application/json")
        if head == "stats" and args in (["summary"], []):
            return self.reply(200, json.dumps(self.kubelet.summary.summary(), indent=2).encode(),
                              "application/json")
        if head == "pods" and not args:
            items = self.kubelet.pod_list() if self.kubelet.pod_list is not None else []
            return self.reply(200, json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                               "items": items}).encode(), "application/json")
        if head == "containerLogs" and len(args) == 3:
            return self.container_logs(args[0], args[1], args[2], query)
        if head in ("exec", "attach") and len(args) in (3, 4):
            return self.stream(head, args, query, user)
        if head == "portForward" and len(args) in (2, 3):
            return self.stream(head, args, query, user)
        raise HTTPError(404, f"{self.command} /{'/'.join(parts)}: not found")

    # --- responses ------------------------------------------------------------------------------------

    def reply(self, status: int, body: str | bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        data = body.encode() if isinstance(body, str) else body
        if status >= 400 and not data.endswith(b"\n"):
            data += b"\n"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if status >= 400:
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Connection", "close")  # sets close_connection
            self.refused = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def container_logs(self, namespace: str, pod: str, container: str, query: dict[str, list[str]]) -> None:
        try:
            opts = logs.LogOptions.from_query(query)
        except logs.LogOptionError as e:
            raise HTTPError(400, str(e)) from e
        k = self.kubelet
        sandbox = k.sandbox(namespace, pod)
        attempts = k.attempts(sandbox, container)
        if opts.previous:
            if len(attempts) < 2:
                raise HTTPError(400, f"previous terminated container {container!r} in pod {pod!r} not found")
            target = attempts[1]
        elif attempts:
            target = attempts[0]
        else:
            raise HTTPError(400, f"container {container!r} in pod {pod!r} is waiting to start")
        path = k.log_path(target.id)
        if not path.exists():
            raise HTTPError(404, f"container {container!r} in pod {namespace}/{pod}: no log at {path}")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            logs.write_logs(path, opts, write, next_path=k.next_log(sandbox, target) if opts.follow else None,
                            gone=self.client_gone)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True  # the client left mid-stream

    def client_gone(self) -> bool:
        """Whether the client closed its end (it sends nothing while it reads a followed log)."""
        sock = self.connection
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return False
        timeout = sock.gettimeout()
        sock.settimeout(0.05)
        try:
            data = sock.recv(1)
        except (TimeoutError, ssl.SSLWantReadError):
            return False
        except OSError:
            return True
        finally:
            sock.settimeout(timeout)
        if data:
            self.close_connection = True  # a byte of whatever the client sent next is gone
        return data == b""

    def stream(self, kind: str, args: list[str], query: dict[str, list[str]], user: User) -> None:
        k = self.kubelet
        if kind == "portForward":
            sandbox = k.sandbox(args[0], args[1], args[2] if len(args) == 3 else None)
            try:
                ports = [int(p) for p in query.get("port", [])]
            except ValueError as e:
                raise HTTPError(400, f"port: expected port numbers, got {query.get('port')}") from e
            url = k.runtime.port_forward(api_pb2.PortForwardRequest(pod_sandbox_id=sandbox.id, port=ports))
        else:
            namespace, pod, container = args[0], args[1], args[-1]
            c = k.container(namespace, pod, container, args[2] if len(args) == 4 else None)
            # the API server's names (api.ExecStdinParam...): input, output, error, tty
            stdin, stdout, stderr, tty = (_true(query, n) for n in ("input", "output", "error", "tty"))
            if not (stdin or stdout or stderr):
                raise HTTPError(400, "you must specify at least 1 of stdin, stdout, stderr")
            stderr = stderr and not tty  # a terminal has one output stream
            if kind == "exec":
                command = query.get("command", [])
                if not command:
                    raise HTTPError(400, "command: required")
                url = k.runtime.exec(api_pb2.ExecRequest(container_id=c.id, cmd=command, tty=tty, stdin=stdin,
                                                         stdout=stdout, stderr=stderr))
            else:
                url = k.runtime.attach(api_pb2.AttachRequest(container_id=c.id, tty=tty, stdin=stdin,
                                                             stdout=stdout, stderr=stderr))
        log.info("%s %s by %s: proxied to the runtime's streaming server", kind, "/".join(args), user.name)
        try:
            backend = streaming.connect(url)
        except streaming.StreamError as e:
            raise HTTPError(502, str(e)) from e
        self.close_connection = True  # the connection is the stream's from here on
        early, self.buffered = self.buffered, b""
        try:
            backend.sendall(streaming.request_head(self.command, url, list(self.headers.items())) + early)
            self.wfile.flush()
            streaming.splice(self.connection, backend, idle_timeout=k.settings.streaming_connection_idle_timeout)
        except OSError as e:
            log.debug("%s session ended: %s", kind, e)
        finally:
            backend.close()
