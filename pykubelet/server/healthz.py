"""The kubelet's health check: plain HTTP, GET /healthz answers "ok", on healthzBindAddress:healthzPort
(127.0.0.1:10248; port 0: none). kubeadm waits on it after starting the kubelet, and systemd units and
monitoring probe it, so it is apart from the :10250 server: no TLS, no authentication, nothing else served.

A port that is taken does not stop the kubelet, as with the stock kubelet (another kubelet may hold it
for a moment): the listen is tried again every few seconds, with a warning, until it succeeds or the
kubelet stops.
"""
from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

RETRY = 5.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds a connection may stay silent: an idle or slow client does not keep its thread

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/healthz":
            self._answer(200, b"ok")
        else:
            self._answer(404, b"404 page not found\n")

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        log.debug("healthz %s: " + format, self.client_address[0], *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class Healthz:
    """start() listens (or keeps trying, in a thread); stop() closes it."""

    def __init__(self, address: str, port: int) -> None:
        self.address, self.port = address, port
        self._server: _Server | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> Healthz:
        self._thread = threading.Thread(target=self._run, name="healthz", daemon=True)
        self._thread.start()
        return self

    def _listen(self) -> _Server | None:
        server_class = _Server6 if ":" in self.address else _Server
        try:
            return server_class((self.address, self.port), _Handler)
        except OSError as e:
            log.warning("healthz server: listen on %s:%d: %s; trying again in %gs", self.address, self.port,
                        e.strerror, RETRY)
            return None

    def _run(self) -> None:
        while True:
            server = self._listen()
            with self._lock:  # a stop() from now on sees the server and shuts it down
                if self._stop.is_set():
                    if server is not None:
                        server.server_close()
                    return
                self._server = server
            if server is not None:
                break
            if self._stop.wait(RETRY):
                return
        log.info("healthz server listening on http://%s:%d/healthz", self.address, self.port)
        server.serve_forever(poll_interval=0.5)
        server.server_close()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            server = self._server
        if server is not None:
            server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)
