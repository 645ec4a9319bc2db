"""A SPDY/3.1 server session over a byte transport (the upgraded TCP connection, or a websocket tunnel):
client-opened streams with blocking read/write, as the kubelet's streaming handlers use them.

One reader thread per session parses frames and queues each stream's data; a stream's buffer is
bounded (`MAX_BUFFERED`): when the consumer lags, the reader thread stops reading the socket, so a fast
client is slowed by TCP instead of growing the daemon's memory (spdystream blocks the same way). Writes
from many threads are serialized by one lock, because the header compressor is one zlib stream per
session. The client is untrusted: a protocol error ends its session, never the daemon.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

from pyruntime.cri.streaming import spdy

log = logging.getLogger(__name__)

MAX_BUFFERED = 1 << 20
MAX_DATA = 32 * 1024  # bytes per DATA frame written
CLOSE_TIMEOUT = 5.0  # for the client to close its side after our GOAWAY


class Transport(Protocol):
    def recv(self, n: int) -> bytes: ...  # b"" at EOF
    def sendall(self, data: bytes) -> None: ...
    def close(self) -> None: ...


class SocketTransport:
    """A connected socket as a Transport; close() only ends our sending side, so what we wrote still
    arrives (a close with unread input would reset the connection) and the peer's EOF ends the reader."""

    def __init__(self, sock: socket.socket) -> None:
        self.recv = sock.recv
        self.sendall = sock.sendall
        self._sock = sock

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Inbox:
    """Bytes received for one reader, bounded: put() blocks the receiving thread while MAX_BUFFERED bytes
    wait. read() returns b"" once finish() was called and the buffer is empty."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._cond = threading.Condition()

    def put(self, data: bytes) -> None:
        with self._cond:
            while self._buffered >= MAX_BUFFERED and not self._done:
                self._cond.wait()
            if not self._done and data:
                self._chunks.append(data)
                self._buffered += len(data)
                self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def read(self, n: int = 65536) -> bytes:
        with self._cond:
            while not self._chunks and not self._done:
                self._cond.wait()
            if not self._chunks:
                return b""
            chunk = self._chunks.popleft()
            if len(chunk) > n:
                self._chunks.appendleft(chunk[n:])
                chunk = chunk[:n]
            self._buffered -= len(chunk)
            self._cond.notify_all()
            return chunk


class Stream:
    """One client-opened stream: read() returns b"" once the client half-closed (FIN) or reset it."""

    def __init__(self, session: SpdySession, stream_id: int, headers: spdy.Headers) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self.inbox = Inbox()
        self._local_done = False

    def header(self, name: str) -> str:
        values = self.headers.get(name.lower())
        return values[0] if values else ""

    def read(self, n: int = 65536) -> bytes:
        return self.inbox.read(n)

    def write(self, data: bytes) -> None:
        """Raises BrokenPipeError once the stream or the session is gone."""
        if self._local_done:
            raise BrokenPipeError(f"spdy stream {self.id}: write after close")
        view = memoryview(data)
        for i in range(0, len(view), MAX_DATA):
            self.session.send(spdy.Data(self.id, bytes(view[i:i + MAX_DATA])))

    def close(self) -> None:
        """Half-closes our side (DATA with FIN); the client may still send."""
        if not self._local_done:
            self._local_done = True
            try:
                self.session.send(spdy.Data(self.id, b"", spdy.FLAG_FIN))
            except OSError:
                pass

    def reset(self) -> None:
        self._local_done = True
        self.inbox.finish()
        try:
            self.session.send(spdy.RstStream(self.id, spdy.CANCEL))
        except OSError:
            pass


class SpdySession:
    """`accept(stream)` runs on the reader thread for each SYN_STREAM and must not block: True accepts it
    (the session answers SYN_REPLY, then queues the stream on `accepted`), False refuses it (RST_STREAM).
    `accepted` yields None once the session has ended."""

    def __init__(self, transport: Transport, accept: Callable[[Stream], bool], initial: bytes = b"") -> None:
        self._transport = transport
        self._accept = accept
        self.accepted: queue.Queue[Stream | None] = queue.Queue()
        self._initial = initial
        self._framer = spdy.Framer()
        self._send_lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._last_stream = 0
        self._gone = False
        self.closed = threading.Event()  # set when the reader ends (EOF, GOAWAY, error or close())
        self._thread = threading.Thread(target=self._read_loop, name="spdy-session", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, frame: spdy.Frame) -> None:
        with self._send_lock:
            if self._gone and not isinstance(frame, spdy.GoAway):
                raise BrokenPipeError("spdy session closed")
            self._transport.sendall(self._framer.encode(frame))

    def close(self) -> None:
        """GOAWAY and the end of our sending side; waits (a while) for the client to close its side.
        Streams still reading see EOF."""
        with self._send_lock:
            if self._gone:
                return
            try:
                self._transport.sendall(self._framer.encode(spdy.GoAway(self._last_stream)))
            except OSError:
                pass
            self._gone = True
        self._transport.close()
        self._end_streams()
        if threading.current_thread() is not self._thread:
            self.closed.wait(CLOSE_TIMEOUT)

    def wait(self, timeout: float | None = None) -> bool:
        return self.closed.wait(timeout)

    def _end_streams(self) -> None:
        for stream in list(self._streams.values()):
            stream.inbox.finish()

    def _read_loop(self) -> None:
        try:
            data = self._initial
            while True:
                if data:
                    for frame in self._framer.feed(data):
                        if not self._handle(frame):
                            return
                data = self._transport.recv(65536)
                if not data:
                    return
        except (OSError, spdy.SpdyError) as e:
            log.debug("spdy session ended: %s", e)
        finally:
            self._end_streams()
            self.closed.set()
            self.accepted.put(None)

    def _handle(self, frame: spdy.Frame) -> bool:
        if isinstance(frame, spdy.Data):
            stream = self._streams.get(frame.stream_id)
            if stream is not None:
                if frame.data:
                    stream.inbox.put(frame.data)
                if frame.flags & spdy.FLAG_FIN:
                    stream.inbox.finish()
        elif isinstance(frame, spdy.SynStream):
            self._syn_stream(frame)
        elif isinstance(frame, spdy.RstStream):
            stream = self._streams.pop(frame.stream_id, None)
            if stream is not None:
                stream._local_done = True
                stream.inbox.finish()
        elif isinstance(frame, spdy.HeadersFrame):
            stream = self._streams.get(frame.stream_id)
            if stream is not None and frame.flags & spdy.FLAG_FIN:
                stream.inbox.finish()
        elif isinstance(frame, spdy.Ping):
            if frame.id % 2 == 1:  # the client's ping (odd ids): echo; ours would be even
                self.send(frame)
        elif isinstance(frame, spdy.GoAway):
            return False
        return True  # SETTINGS, WINDOW_UPDATE: no flow control, as spdystream

    def _syn_stream(self, frame: spdy.SynStream) -> None:
        if frame.stream_id % 2 == 0 or frame.stream_id <= self._last_stream:
            self.send(spdy.RstStream(frame.stream_id, spdy.PROTOCOL_ERROR))
            return
        self._last_stream = frame.stream_id
        stream = Stream(self, frame.stream_id, frame.headers)
        if frame.flags & spdy.FLAG_FIN:
            stream.inbox.finish()
        if frame.flags & spdy.FLAG_UNIDIRECTIONAL:
            stream._local_done = True
        self._streams[frame.stream_id] = stream
        if not self._accept(stream):
            self._streams.pop(frame.stream_id, None)
            self.send(spdy.RstStream(frame.stream_id, spdy.REFUSED_STREAM))
            return
        self.send(spdy.SynReply(frame.stream_id, {}))
        self.accepted.put(stream)

    def remove(self, stream: Stream) -> None:
        self._streams.pop(stream.id, None)
