"""Port forwarding sessions: client connections carried to a TCP port inside a pod.

- SPDY (portforward.k8s.io), also tunneled in a websocket ("SPDY/3.1+portforward.k8s.io", what
  client-go's port forwarder sends over websockets): per forwarded connection the client opens an error
  stream and a data stream with the same requestID and port headers; once both are there, the data
  stream is spliced to a new connection in the pod. A failure is reported as text on the error stream,
  in the kubelet's words, and both streams are reset.
- websocket (v4.channel.k8s.io, v4.base64.channel.k8s.io): one connection per port of the CRI request,
  channels 2i (data) and 2i+1 (error), each opened by a message of the port as 2 little-endian bytes.

A client that opens half a pair gets it dropped after STREAM_CREATION_TIMEOUT, so it can't hold the
server's memory.
"""
from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Callable

from pyruntime.cri.streaming.backend import StreamBackend
from pyruntime.cri.streaming.httpstream import SpdySession, Stream
from pyruntime.cri.streaming.remotecommand import STREAM_CREATION_TIMEOUT
from pyruntime.cri.streaming.websocket import Channels

log = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"
TUNNEL_PROTOCOL = "SPDY/3.1+" + PROTOCOL


def _error_message(port: int, sandbox_id: str, error: Exception) -> str:
    return f"error forwarding port {port} to pod {sandbox_id}, uid : {error}"


def _splice(sock: socket.socket, read: Callable[[int], bytes], write: Callable[[bytes], None],
            close_write: Callable[[], None]) -> None:
    """Copies the client's data into sock (in a helper thread) and sock's data to the client, until both
    directions ended."""
    def client_to_pod() -> None:
        try:
            while data := read(65536):
                sock.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    upstream = threading.Thread(target=client_to_pod, daemon=True)
    upstream.start()
    try:
        while data := sock.recv(65536):
            write(data)
    except OSError:
        pass
    finally:
        close_write()
        upstream.join()


def _port_of(stream: Stream) -> int:
    try:
        port = int(stream.header("port"))
    except ValueError:
        return 0
    return port if 0 < port < 65536 else 0


def serve_spdy(session: SpdySession, backend: StreamBackend, sandbox_id: str) -> None:
    """Runs until the client ends the session; every forwarded connection has its own thread."""
    pairs: dict[str, dict[str, Stream]] = {}
    timers: dict[str, threading.Timer] = {}
    forwards: list[threading.Thread] = []
    pod_socks: set[socket.socket] = set()
    lock = threading.Lock()

    def request_id(stream: Stream) -> str:
        rid = stream.header("requestid")
        if rid:
            return rid
        # clients older than requestID: the error stream comes first, its data stream two ids later
        return str(stream.id if stream.header("streamtype") == "error" else stream.id - 2)

    def expire(rid: str) -> None:
        with lock:
            pair = pairs.pop(rid, None)
            timers.pop(rid, None)
        if pair is not None:
            log.debug("port forward %s: request %s timed out waiting for streams", sandbox_id, rid)
            for stream in pair.values():
                if stream.header("streamtype") == "error":
                    _try_write(stream, f"timed out waiting for streams of request {rid}".encode())
                stream.reset()

    def forward(data: Stream, error: Stream) -> None:
        port = _port_of(data)
        try:
            sock = backend.port_forward(sandbox_id, port)
        except Exception as e:
            log.info("port forward %s: %s", sandbox_id, e)
            _try_write(error, _error_message(port, sandbox_id, e).encode())
            data.reset()
            error.reset()
            return
        with lock:
            pod_socks.add(sock)
        try:
            _splice(sock, data.read, data.write, data.close)
        finally:
            with lock:
                pod_socks.discard(sock)
            sock.close()
            error.close()
            session.remove(data)
            session.remove(error)

    try:
        while (stream := session.accepted.get()) is not None:
            rid = request_id(stream)
            kind = stream.header("streamtype")
            with lock:
                pair = pairs.setdefault(rid, {})
                if kind in pair:
                    _try_write(stream, f"{kind} stream already assigned for request {rid}".encode())
                    stream.reset()
                    continue
                pair[kind] = stream
                if len(pair) == 1:
                    timer = timers[rid] = threading.Timer(STREAM_CREATION_TIMEOUT, expire, args=(rid,))
                    timer.daemon = True
                    timer.start()
                    continue
                del pairs[rid]
                timers.pop(rid).cancel()
            forward_thread = threading.Thread(target=forward, args=(pair["data"], pair["error"]), daemon=True,
                                              name=f"portforward-{rid}")
            forwards.append(forward_thread)
            forward_thread.start()
    finally:
        # the client is gone: nothing it opened outlives the session
        with lock:
            for timer in timers.values():
                timer.cancel()
            for sock in pod_socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for forward_thread in forwards:
            forward_thread.join()


def accept_stream(stream: Stream) -> bool:
    """The kubelet refuses a stream without a valid port or stream type before replying to it."""
    return _port_of(stream) > 0 and stream.header("streamtype") in ("data", "error")


def _try_write(stream: Stream, data: bytes) -> None:
    try:
        stream.write(data)
    except OSError:
        pass


def serve_websocket(channels: Channels, backend: StreamBackend, sandbox_id: str, ports: list[int]) -> None:
    """One connection per port, all at once; returns when every one ended (the connection is closed by
    the caller)."""
    def one(i: int, port: int) -> None:
        data_ch, error_ch = 2 * i, 2 * i + 1
        inbox = channels.inboxes[data_ch]
        try:
            sock = backend.port_forward(sandbox_id, port)
        except Exception as e:
            log.info("port forward %s: %s", sandbox_id, e)
            try:
                channels.write(error_ch, _error_message(port, sandbox_id, e).encode())
            except OSError:
                pass
            return
        try:
            _splice(sock, inbox.read, lambda data: channels.write(data_ch, data), lambda: None)
        finally:
            sock.close()

    prefix = [struct.pack("<H", port) for port in ports]
    for i, raw in enumerate(prefix):
        channels.write(2 * i, raw)
        channels.write(2 * i + 1, raw)
    threads = [threading.Thread(target=one, args=(i, port), daemon=True) for i, port in enumerate(ports)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
