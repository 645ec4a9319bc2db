"""Websocket transports of the streaming server, over wsproto (RFC 6455 framing is not hand-rolled):

- `WebSocket`: message send/receive on an upgraded socket (pings answered, close handshake);
- `Channels`: the Kubernetes channel protocols (channel.k8s.io, base64.channel.k8s.io and their v4
  variants, v5.channel.k8s.io), where each message's first byte names the channel (stdin 0, stdout 1,
  stderr 2, error 3, resize 4; port-forward: 2 per port) and, in v5, [255, N] half-closes channel N;
- `Tunnel`: a byte stream carried in binary messages, for SPDY tunneled over a websocket
  ("SPDY/3.1+portforward.k8s.io", what client-go's port forwarder sends over websockets).

The client is untrusted: message size is bounded by wsproto's and our own limit, an unknown channel is
ignored (as the kubelet does), malformed frames end the connection.
"""
from __future__ import annotations

import base64
import binascii
import logging
import socket
import threading

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Event, Ping, TextMessage
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from pyruntime.cri.streaming.httpstream import Inbox

log = logging.getLogger(__name__)

MAX_MESSAGE = 16 << 20
STREAM_CLOSE = 255
CLOSE_TIMEOUT = 5.0

BINARY_PROTOCOLS = ("", "channel.k8s.io", "v4.channel.k8s.io", "v5.channel.k8s.io")
BASE64_PROTOCOLS = ("base64.channel.k8s.io", "v4.base64.channel.k8s.io")


class WebSocket:
    """Server side of an accepted websocket. recv() is for one reader thread; send() is thread-safe."""

    def __init__(self, sock: socket.socket, initial: bytes = b"") -> None:
        self._sock = sock
        self._ws = Connection(ConnectionType.SERVER)
        self._lock = threading.Lock()
        self._pending: list[bytes | str] = []
        self._partial: list[bytes | bytearray | str] = []
        self._size = 0
        if initial:
            self._ws.receive_data(initial)

    def _send_raw(self, event: Event) -> None:
        with self._lock:
            if self._ws.state not in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                raise BrokenPipeError("websocket closed")
            self._sock.sendall(self._ws.send(event))

    def send(self, data: bytes | str) -> None:
        self._send_raw(BytesMessage(data=data) if isinstance(data, bytes) else TextMessage(data=data))

    def recv(self) -> bytes | str | None:
        """The next whole message; None once the peer closed or the connection broke."""
        while not self._pending:
            try:
                for event in self._ws.events():
                    if isinstance(event, (BytesMessage, TextMessage)):
                        self._size += len(event.data)
                        if self._size > MAX_MESSAGE:
                            raise RemoteProtocolError(f"websocket message over {MAX_MESSAGE} bytes")
                        self._partial.append(event.data)
                        if event.message_finished:
                            parts, self._partial, self._size = self._partial, [], 0
                            if isinstance(event, BytesMessage):
                                self._pending.append(b"".join(bytes(p) for p in parts if not isinstance(p, str)))
                            else:
                                self._pending.append("".join(p for p in parts if isinstance(p, str)))
                    elif isinstance(event, Ping):
                        self._send_raw(event.response())
                    elif isinstance(event, CloseConnection):
                        with self._lock:
                            if self._ws.state == ConnectionState.REMOTE_CLOSING:
                                self._sock.sendall(self._ws.send(event.response()))
                        return None
                if self._pending:
                    break
                data = self._sock.recv(65536)
            except (OSError, LocalProtocolError, RemoteProtocolError) as e:
                log.debug("websocket receive ended: %s", e)
                return None
            if not data:
                return None
            self._ws.receive_data(data)
        return self._pending.pop(0)

    def close(self, code: int = 1000) -> None:
        """Starts the close handshake and ends our sending side; the reader sees the peer's answer. The
        socket itself is closed by its owner (the server's connection thread)."""
        try:
            with self._lock:
                if self._ws.state == ConnectionState.OPEN:
                    self._sock.sendall(self._ws.send(CloseConnection(code=code)))
        except (OSError, LocalProtocolError):
            pass
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Channels:
    """The k8s channel multiplexing over a WebSocket. `readable` channels get an Inbox fed by the demux
    thread (start()); writes to a channel that the session does not use are dropped, as the kubelet's
    IgnoreChannel does."""

    def __init__(self, ws: WebSocket, protocol: str, count: int, readable: set[int]) -> None:
        self.ws = ws
        self.protocol = protocol
        self._base64 = protocol in BASE64_PROTOCOLS
        self._close_signal = protocol == "v5.channel.k8s.io"
        self.inboxes = {n: Inbox() for n in readable if n < count}
        self.closed = threading.Event()
        self._count = count
        self._thread = threading.Thread(target=self._demux, name="ws-channels", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def write(self, channel: int, data: bytes) -> None:
        if self._base64:
            self.ws.send(chr(ord("0") + channel) + base64.b64encode(data).decode())
        else:
            self.ws.send(bytes([channel]) + data)

    def close(self) -> None:
        """Closes the websocket and waits (a while) for the client's answer, so nothing we sent is lost
        to a reset."""
        self.ws.close()
        if threading.current_thread() is not self._thread:
            self.closed.wait(CLOSE_TIMEOUT)
        self._finish()

    def _finish(self) -> None:
        for inbox in self.inboxes.values():
            inbox.finish()
        self.closed.set()

    def _demux(self) -> None:
        try:
            while (message := self.ws.recv()) is not None:
                raw = message.encode() if isinstance(message, str) else message
                if not raw:
                    continue
                if self._close_signal and raw[0] == STREAM_CLOSE:
                    if len(raw) != 2:
                        log.debug("websocket: stream close signal of %d bytes", len(raw))
                        return
                    if raw[1] in self.inboxes:
                        self.inboxes[raw[1]].finish()
                    continue
                channel = raw[0] - ord("0") if self._base64 else raw[0]
                inbox = self.inboxes.get(channel)
                if inbox is None:
                    continue
                payload = raw[1:]
                if self._base64:
                    try:
                        payload = base64.b64decode(payload, validate=True)
                    except binascii.Error:
                        log.debug("websocket: channel %d: bad base64", channel)
                        continue
                inbox.put(payload)
        finally:
            self._finish()


class Tunnel:
    """A byte-stream Transport (httpstream.Transport) over the binary messages of a WebSocket."""

    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws
        self._rest = b""

    def recv(self, n: int) -> bytes:
        while not self._rest:
            message = self._ws.recv()
            if message is None:
                return b""
            self._rest = message.encode() if isinstance(message, str) else message
        data, self._rest = self._rest[:n], self._rest[n:]
        return data

    def sendall(self, data: bytes) -> None:
        self._ws.send(data)

    def close(self) -> None:
        self._ws.close()
