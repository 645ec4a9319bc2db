"""The kubelet's HTTPS server (default :10250): what the API server reaches for `kubectl logs`, `exec`,
`attach` and `port-forward`, and what metrics-server and Prometheus scrape.

Built on the standard library's ThreadingHTTPServer: a thread per connection fits long-lived log follows
and exec sessions, and the streaming routes need the raw connection after the request head to splice
the upgraded stream (an ASGI/WSGI server would hide it). The TLS handshake runs in the connection's
thread, not the accept loop, so a client that stalls its handshake stalls only itself. Headers are read
unbuffered so no byte of an upgraded stream is swallowed by a read-ahead buffer.

Every request is authenticated (authn.py) and authorized (authz.py) before its route runs: 401 for an
unknown caller, 403 naming the user and the check. Containers are found through the CRI by the
kubelet's labels on them (pod namespace/name/uid, container name), so the routes work for every pod
the runtime holds, static ones in standalone mode too.
"""
from __future__ import annotations

import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.config import Settings
from pykubelet.pods.sync import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID
from pykubelet.server import logs, streaming
from pykubelet.server.authn import Authenticator, User
from pykubelet.server.authz import Authorizer, attributes
from pykubelet.server.metrics import CONTENT_TYPE, Metrics
from pykubelet.server.stats import Summary
from pykubelet.server.tls import serving_context

log = logging.getLogger("pykubelet.server")

HANDSHAKE_TIMEOUT = 10.0
FOLLOW_CHECK = 1.0  # seconds between looks at the runtime while a followed log is quiet


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _true(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or [""])[-1].lower() in ("1", "true")


class KubeletServer:
    """`client`: the kubelet's lightkube client (None in standalone mode); `pods(uid)`: the desired pod
    (PodWorkers.pod) for restart policies, when there is an API server; `pod_list()`: every pod the
    kubelet has, with its status (PodWorkers.pods), for /pods; `metrics`: the kubelet's Metrics (the pod
    workers observe into it), a fresh one if not given."""

    def __init__(self, settings: Settings, runtime: cri.CRIRuntime, client=None,
                 pods: Callable[[str], dict | None] | None = None,
                 pod_list: Callable[[], list[dict]] | None = None, metrics: Metrics | None = None) -> None:
        self.settings, self.runtime, self.pods, self.pod_list = settings, runtime, pods, pod_list
        self.authn = Authenticator(client, anonymous=settings.anonymous_auth,
                                   webhook=settings.webhook_authentication,
                                   cache_ttl=settings.authentication_webhook_cache_ttl)
        self.authz = Authorizer(client, settings.authorization_mode,
                                settings.authorization_webhook_cache_authorized_ttl,
                                settings.authorization_webhook_cache_unauthorized_ttl)
        self.metrics = metrics or Metrics(runtime, settings.node_name)
        self.summary = Summary(runtime, settings)
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
        pod = self.pods(sandbox.metadata.uid) if self.pods is not None else None
        policy = (pod or {}).get("spec", {}).get("restartPolicy", "Always")
        return ready and (policy == "Always" or (policy == "OnFailure" and exit_code != 0))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], kubelet: KubeletServer) -> None:
        self.kubelet = kubelet
        self.context = serving_context(kubelet.settings)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def finish_request(self, request, client_address) -> None:
        """Runs in the connection's thread: the TLS handshake first, then the HTTP exchange."""
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log.debug("TLS handshake with %s: %s", client_address, e)
            return
        tls.settimeout(None)
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
    rbufsize = 0  # no read-ahead: the bytes after an upgrade request's head belong to the stream
    server: _Server
    connection: ssl.SSLSocket

    def log_message(self, format: str, *args) -> None:
        log.debug("%s %s", self.address_string(), format % args)

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
        if not select.select([sock], [], [], 0)[0]:
            return False
        sock.settimeout(0.05)
        try:
            return sock.recv(1) == b""
        except (TimeoutError, ssl.SSLWantReadError):
            return False
        except OSError:
            return True
        finally:
            sock.settimeout(None)

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
        try:
            backend.sendall(streaming.request_head(self.command, url, list(self.headers.items())))
            self.wfile.flush()
            streaming.splice(self.connection, backend)
        except OSError as e:
            log.debug("%s session ended: %s", kind, e)
        finally:
            backend.close()
