"""The CRI streaming server: the URL that Exec, Attach and PortForward answer with, which the kubelet
hands to kubectl (or crictl uses directly), and the HTTP server behind it.

Why one-shot tokens: the URL is the only credential. The gRPC call that made it was authorized (the CRI
socket is root's); whoever presents the token gets that one request, once, within a minute
(`TOKEN_TTL`), as the kubelet's request cache works; at most `MAX_IN_FLIGHT` unused tokens exist, so a
caller can't grow the cache without bound. Everything after the token is the client's input and is
parsed with limits (h11 for HTTP/1.1, wsproto for websockets, spdy.py for SPDY).

Threads: one accept thread, one thread per connection (a session may last hours: an interactive exec).
The daemon is threaded already; nothing here forks.

Deadlines: a request's head must arrive whole within HEADER_TIMEOUT (a client dripping it a byte at a
time does not hold a thread for longer); a session in which no byte has moved either way for the idle
timeout (containerd's stream_idle_timeout, 4 hours by default) is shut down by the reaper thread, as is
one whose client stopped reading what it is sent: a silent or vanished client does not hold an exec, an
attach or a port-forward, and the thread and fds behind it, for ever.
"""
from __future__ import annotations

import base64
import logging
import queue
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs, urlsplit

import h11

from pyruntime.cri.streaming import portforward, remotecommand
from pyruntime.cri.streaming.backend import StreamBackend
from pyruntime.errors import InvalidArgumentError, UnavailableError

if TYPE_CHECKING:
    from pyruntime.cri.streaming.httpstream import Stream

log = logging.getLogger(__name__)

TOKEN_TTL = 60.0
MAX_IN_FLIGHT = 1000
TOKEN_LEN = 8
HEADER_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
IDLE_TIMEOUT = 4 * 3600.0  # containerd's stream_idle_timeout


class RequestCache:
    """Tokens for cached requests: each consumed at most once, expired after `ttl` seconds."""

    def __init__(self, ttl: float = TOKEN_TTL, max_in_flight: int = MAX_IN_FLIGHT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._max = max_in_flight
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def insert(self, request: Any) -> str:
        with self._lock:
            now = self._clock()
            while self._entries:
                token, (expiry, _) = next(iter(self._entries.items()))
                if expiry >= now:
                    break
                del self._entries[token]
            if len(self._entries) >= self._max:
                raise UnavailableError("maximum number of in-flight requests exceeded")
            while True:
                token = base64.urlsafe_b64encode(secrets.token_bytes(6)).decode()[:TOKEN_LEN]
                if token not in self._entries:
                    break
            self._entries[token] = (now + self._ttl, request)
            return token

    def consume(self, token: str) -> Any | None:
        with self._lock:
            entry = self._entries.pop(token, None)
        if entry is None or self._clock() > entry[0]:
            return None
        return entry[1]


def _check_streams(req: Any, which: str) -> None:
    if not req.container_id:
        raise InvalidArgumentError(f"{which}.container_id: missing required container_id")
    if req.tty and req.stderr:
        raise InvalidArgumentError(f"{which}.stderr: tty and stderr cannot both be true")
    if not (req.stdin or req.stdout or req.stderr):
        raise InvalidArgumentError(f"{which}: one of stdin, stdout, or stderr must be set")


class _Request:
    """The parts of the HTTP request the handlers look at (header names lower case, repeated ones kept)."""

    def __init__(self, event: h11.Request) -> None:
        self.method = event.method.decode()
        target = urlsplit(event.target.decode("latin-1"))
        self.path = target.path
        self.query = parse_qs(target.query)
        self.headers: dict[str, list[str]] = {}
        for name, value in event.headers:
            self.headers.setdefault(name.decode().lower(), []).append(value.decode("latin-1"))

    def values(self, name: str) -> list[str]:
        """Comma-separated values over every header line of that name."""
        return [v.strip() for line in self.headers.get(name, []) for v in line.split(",") if v.strip()]

    def has(self, name: str, token: str) -> bool:
        return token.lower() in (v.lower() for v in self.values(name))


class _Tracked:
    """A session's socket that notes when bytes last moved through it, either way: the reaper's clock.
    A send waiting on a client that does not read is not movement."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.moved = time.monotonic()

    def recv(self, n: int) -> bytes:
        data = self._sock.recv(n)
        self.moved = time.monotonic()
        return data

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)
        self.moved = time.monotonic()

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)


class StreamingServer:
    """`address`: "HOST:PORT" to listen on ("127.0.0.1:0" picks a free port; the URLs name the real one);
    `idle_timeout`: seconds a session may pass with no byte moving before it is ended (0: never)."""

    def __init__(self, address: str, backend: StreamBackend, *, idle_timeout: float = IDLE_TIMEOUT) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise InvalidArgumentError(f"streaming address {address!r}: not HOST:PORT")
        self._host = host.strip("[]") or "0.0.0.0"
        self._port = int(port)
        self._backend = backend
        self._cache = RequestCache()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._workers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._idle_timeout = idle_timeout
        self._sessions: set[_Tracked] = set()
        self._stopping = threading.Event()
        self._reaper: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self._host, self._port))
        except OSError as e:
            listener.close()
            raise UnavailableError(f"streaming server: listen on {self._host}:{self._port}: {e}") from e
        listener.listen(128)
        self._port = listener.getsockname()[1]
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="streaming-accept", daemon=True)
        self._thread.start()
        if self._idle_timeout > 0:
            self._reaper = threading.Thread(target=self._reap_idle, name="streaming-reaper", daemon=True)
            self._reaper.start()

    def stop(self) -> None:
        """Stops listening and ends every open session (their backends see their fds close); returns once
        their threads are done (a backend still blocked is waited for STOP_TIMEOUT at most)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        if self._thread is not None:
            self._thread.join()
        self._stopping.set()
        if self._reaper is not None:
            self._reaper.join()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    @property
    def base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    # --- the CRI calls ------------------------------------------------------------------------------
    def get_exec(self, req: Any) -> Any:
        from proto import api_pb2

        _check_streams(req, "exec")
        if not req.cmd:
            raise InvalidArgumentError("exec.cmd: missing the command")
        return api_pb2.ExecResponse(url=f"{self.base_url}/exec/{self._cache.insert(req)}")

    def get_attach(self, req: Any) -> Any:
        from proto import api_pb2

        _check_streams(req, "attach")
        return api_pb2.AttachResponse(url=f"{self.base_url}/attach/{self._cache.insert(req)}")

    def get_port_forward(self, req: Any) -> Any:
        from proto import api_pb2

        if not req.pod_sandbox_id:
            raise InvalidArgumentError("port_forward.pod_sandbox_id: missing required pod_sandbox_id")
        return api_pb2.PortForwardResponse(url=f"{self.base_url}/portforward/{self._cache.insert(req)}")

    # --- HTTP ---------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while (listener := self._listener) is not None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            worker = threading.Thread(target=self._serve, args=(conn,), name="streaming-conn", daemon=True)
            with self._lock:
                self._workers = {w for w in self._workers if w.is_alive()}
                self._workers.add(worker)
            worker.start()

    def _reap_idle(self) -> None:
        """Shuts down each session idle for longer than the idle timeout: its reads see the end, its
        blocked sends fail, and the session's thread ends as with a client that left."""
        while not self._stopping.wait(min(self._idle_timeout / 4, 30.0)):
            now = time.monotonic()
            with self._lock:
                idle = [t for t in self._sessions if now - t.moved > self._idle_timeout]
            for tracked in idle:
                log.info("streaming: no traffic for %gs: ending the session", self._idle_timeout)
                try:
                    tracked.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # ended meanwhile

    def _serve(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.add(sock)
        try:
            self._serve_request(sock)
        except Exception:
            log.exception("streaming: connection failed")
        finally:
            with self._lock:
                self._conns.discard(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a session's reader still in recv()
            except OSError:
                pass
            sock.close()

    def _serve_request(self, sock: socket.socket) -> None:
        head_deadline = time.monotonic() + HEADER_TIMEOUT
        conn = h11.Connection(h11.SERVER)
        event: Any = None
        request = None
        while not isinstance(event, h11.EndOfMessage):
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as e:
                self._respond(sock, conn, e.error_status_hint, f"bad request: {e}")
                return
            if event is h11.NEED_DATA:
                remaining = head_deadline - time.monotonic()
                if remaining <= 0:
                    return
                sock.settimeout(remaining)
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = _Request(event)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return
        sock.settimeout(None)
        assert request is not None
        kind, _, token = request.path.lstrip("/").partition("/")
        handler = {"exec": self._exec, "attach": self._attach, "portforward": self._port_forward}.get(kind)
        if handler is None or not token or "/" in token:
            self._respond(sock, conn, 404, "404 page not found\n")
            return
        if request.method not in ("GET", "POST"):
            self._respond(sock, conn, 405, "405 method not allowed\n")
            return
        from proto import api_pb2

        cached = self._cache.consume(token)
        wanted = {"exec": api_pb2.ExecRequest, "attach": api_pb2.AttachRequest,
                  "portforward": api_pb2.PortForwardRequest}[kind]
        if not isinstance(cached, wanted):
            self._respond(sock, conn, 404, "404 page not found\n")
            return
        tracked = _Tracked(sock)
        with self._lock:
            self._sessions.add(tracked)
        try:
            handler(cast(socket.socket, tracked), conn, request, cached)  # recv, sendall, shutdown: all used
        finally:
            with self._lock:
                self._sessions.discard(tracked)

    def _respond(self, sock: socket.socket, conn: h11.Connection, status: int, text: str,
                 headers: list[tuple[str, str]] | None = None) -> None:
        body = text.encode()
        try:
            sock.sendall(conn.send(h11.Response(status_code=status, headers=[
                ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                ("X-Content-Type-Options", "nosniff"), ("Connection", "close"), *(headers or [])])))
            sock.sendall(conn.send(h11.Data(data=body)))
            sock.sendall(conn.send(h11.EndOfMessage()))
        except (OSError, h11.LocalProtocolError) as e:
            log.debug("streaming: response not sent: %s", e)

    def _switch(self, sock: socket.socket, conn: h11.Connection, headers: list[tuple[str, str]]) -> bytes | None:
        """Sends 101 Switching Protocols; returns the bytes the client already sent past the request."""
        try:
            sock.sendall(conn.send(h11.InformationalResponse(status_code=101, headers=headers)))
        except (OSError, h11.LocalProtocolError) as e:
            log.debug("streaming: upgrade failed: %s", e)
            return None
        return conn.trailing_data[0]

    # websocket handshake (RFC 6455 4.2); the framing after it is wsproto's
    def _websocket(self, sock: socket.socket, conn: h11.Connection, request: _Request,
                   protocols: tuple[str, ...]) -> tuple[Any, str] | None:
        from wsproto.utilities import generate_accept_token

        from pyruntime.cri.streaming.websocket import WebSocket

        key = request.headers.get("sec-websocket-key", [""])[0].encode()
        if not key or request.values("sec-websocket-version") != ["13"]:
            self._respond(sock, conn, 400, "bad websocket handshake\n")
            return None
        offered = request.values("sec-websocket-protocol") or [""]
        chosen = next((p for p in offered if p in protocols), None)
        if chosen is None:
            self._respond(sock, conn, 400, f"requested protocol(s) are not supported: {offered}; "
                                           f"supports {list(protocols)}\n")
            return None
        headers = [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                   ("Sec-WebSocket-Accept", generate_accept_token(key).decode())]
        if chosen:
            headers.append(("Sec-WebSocket-Protocol", chosen))
        initial = self._switch(sock, conn, headers)
        if initial is None:
            return None
        return WebSocket(sock, initial), chosen

    def _spdy(self, sock: socket.socket, conn: h11.Connection, request: _Request, protocols: tuple[str, ...],
              accept: Callable[[Stream], bool]) -> tuple[Any, str] | None:
        """The kubelet's handshake (X-Stream-Protocol-Version), then the SPDY/3.1 upgrade."""
        from pyruntime.cri.streaming.httpstream import SocketTransport, SpdySession

        offered = request.values("x-stream-protocol-version")
        if not offered:
            self._respond(sock, conn, 400, "unable to upgrade: header X-Stream-Protocol-Version does not "
                                           "exist in request\n")
            return None
        chosen = next((p for p in offered if p in protocols), None)
        if chosen is None:
            self._respond(sock, conn, 403, f"unable to upgrade: unable to negotiate protocol: client supports "
                                           f"{offered}, server accepts {list(protocols)}\n",
                          [("X-Accepted-Stream-Protocol-Versions", p) for p in protocols])
            return None
        if not request.has("connection", "upgrade") or not any(
                "spdy/3.1" in v.lower() for v in request.values("upgrade")):
            self._respond(sock, conn, 400, "unable to upgrade: missing upgrade headers in request\n")
            return None
        initial = self._switch(sock, conn, [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                                            ("X-Stream-Protocol-Version", chosen)])
        if initial is None:
            return None
        session = SpdySession(SocketTransport(sock), accept, initial)
        session.start()
        return session, chosen

    def _is_websocket(self, request: _Request) -> bool:
        return request.has("upgrade", "websocket") and request.has("connection", "upgrade")

    def _exec(self, sock: socket.socket, conn: h11.Connection, request: _Request, req: Any) -> None:
        self._remote_command(sock, conn, request, req, list(req.cmd))

    def _attach(self, sock: socket.socket, conn: h11.Connection, request: _Request, req: Any) -> None:
        self._remote_command(sock, conn, request, req, None)

    def _remote_command(self, sock: socket.socket, conn: h11.Connection, request: _Request, req: Any,
                        cmd: list[str] | None) -> None:
        session = (self._remote_command_ws(sock, conn, request, req) if self._is_websocket(request)
                   else self._remote_command_spdy(sock, conn, request, req))
        if session is not None:
            remotecommand.run(session, self._backend, container_id=req.container_id, cmd=cmd, tty=req.tty)

    def _remote_command_spdy(self, sock: socket.socket, conn: h11.Connection, request: _Request,
                             req: Any) -> remotecommand.Session | None:
        upgraded = self._spdy(sock, conn, request, remotecommand.SPDY_PROTOCOLS,
                              lambda stream: True)
        if upgraded is None:
            return None
        session, protocol = upgraded
        expected = 1 + req.stdin + req.stdout + req.stderr
        if req.tty and protocol in ("v4.channel.k8s.io", "v3.channel.k8s.io"):
            expected += 1
        streams: dict[str, Any] = {}
        deadline = time.monotonic() + remotecommand.STREAM_CREATION_TIMEOUT
        while len(streams) < expected:
            try:
                stream = session.accepted.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                stream = None
            if stream is None:
                log.info("streaming: timed out waiting for the client to create streams")
                session.close()
                return None
            kind = stream.header("streamtype")
            if kind in ("error", "stdin", "stdout", "stderr", "resize"):
                streams[kind] = stream
            else:
                log.debug("streaming: unexpected stream type %r", kind)
        error = streams.get("error")
        if protocol == "channel.k8s.io" and error is not None:
            error.reset()  # as the kubelet does: a v1 client never gets a status
            error = None

        def write_error(data: bytes) -> None:
            if error is not None:
                error.write(data)
                error.close()
        write_status = remotecommand.status_writer(write_error, protocol == "v4.channel.k8s.io")

        def close() -> None:
            for stream in streams.values():
                stream.close()
            session.close()
        return remotecommand.Session(
            stdin=streams.get("stdin") if req.stdin else None,
            stdout=streams.get("stdout") if req.stdout else None,
            stderr=streams.get("stderr") if req.stderr else None,
            resize=streams.get("resize"), write_status=write_status, close=close)

    def _remote_command_ws(self, sock: socket.socket, conn: h11.Connection, request: _Request,
                           req: Any) -> remotecommand.Session | None:
        from pyruntime.cri.streaming.websocket import BASE64_PROTOCOLS, BINARY_PROTOCOLS, Channels

        upgraded = self._websocket(sock, conn, request, BINARY_PROTOCOLS + BASE64_PROTOCOLS)
        if upgraded is None:
            return None
        ws, protocol = upgraded
        readable = {4} | ({0} if req.stdin else set())
        channels = Channels(ws, protocol, 5, readable)
        channels.start()
        # the kubelet's first message: an empty one on the first channel in use
        channels.write(1 if req.stdout else 2 if req.stderr else 3, b"")

        class Out:
            def __init__(self, n: int) -> None:
                self.n = n

            def write(self, data: bytes) -> None:
                channels.write(self.n, data)

            def close(self) -> None:
                pass

        v4 = protocol in ("v4.channel.k8s.io", "v4.base64.channel.k8s.io", "v5.channel.k8s.io")
        return remotecommand.Session(
            stdin=channels.inboxes[0] if req.stdin else None,
            stdout=Out(1) if req.stdout else None, stderr=Out(2) if req.stderr else None,
            resize=channels.inboxes[4], write_status=remotecommand.status_writer(lambda d: channels.write(3, d), v4),
            close=channels.close)

    def _port_forward(self, sock: socket.socket, conn: h11.Connection, request: _Request, req: Any) -> None:
        from pyruntime.cri.streaming.httpstream import SpdySession
        from pyruntime.cri.streaming.websocket import Channels, Tunnel

        if self._is_websocket(request):
            offered = request.values("sec-websocket-protocol")
            if portforward.TUNNEL_PROTOCOL in offered:
                upgraded = self._websocket(sock, conn, request, (portforward.TUNNEL_PROTOCOL,))
                if upgraded is None:
                    return
                session = SpdySession(Tunnel(upgraded[0]), portforward.accept_stream)
                session.start()
            else:
                upgraded = self._websocket(sock, conn, request, ("", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"))
                if upgraded is None:
                    return
                ws, protocol = upgraded
                ports = list(req.port)
                channels = Channels(ws, protocol, 2 * len(ports), {2 * i for i in range(len(ports))})
                channels.start()
                try:
                    portforward.serve_websocket(channels, self._backend, req.pod_sandbox_id, ports)
                finally:
                    channels.close()
                return
        else:
            upgraded = self._spdy(sock, conn, request, (portforward.PROTOCOL,), portforward.accept_stream)
            if upgraded is None:
                return
            session = upgraded[0]
        try:
            portforward.serve_spdy(session, self._backend, req.pod_sandbox_id)
        finally:
            session.close()
