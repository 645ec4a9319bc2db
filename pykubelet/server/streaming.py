"""Exec, attach and port-forward sessions: the kubelet asks the runtime (CRI Exec/Attach/PortForward) for
a URL on the runtime's streaming server and proxies the client's upgrade request to it, then copies
bytes both ways until either side ends, as upstream's UpgradeAwareHandler does (it never redirects: the
runtime's server listens on the node's loopback only and knows nothing of the cluster's authentication).

The proxy is protocol-blind: SPDY/3.1 and websocket (v4/v5 channel protocols, SPDY tunnelled in a
websocket for port-forward) all pass through, because the request goes on with its Upgrade,
Connection, Sec-WebSocket-* and X-Stream-Protocol-Version headers and the runtime's answer (101 and its
negotiated protocol, or an error) comes back untouched. The client's own credentials stop here: the
Authorization header is not forwarded.

One thread runs a session, with poll over both sockets (never select(): descriptors pass 1024 once
RLIMIT_NOFILE is raised); the TLS side is drained of what its record layer already decrypted
(SSLSocket.pending) before waiting again, so no byte sits unseen. A session in which nothing moves for
streamingConnectionIdleTimeout (4 hours by default, as the kubelet's) ends, a client that stopped reading
included: neither holds the thread and the runtime's session behind it for ever.
"""
from __future__ import annotations

import select
import socket
import ssl
from urllib.parse import urlsplit

from pykubelet.errors import UnavailableError

BUFFER = 64 * 1024
IDLE_TIMEOUT = 4 * 3600.0  # the kubelet's streamingConnectionIdleTimeout
DROPPED = {"host", "authorization", "content-length", "transfer-encoding"}


class StreamError(UnavailableError):
    """The runtime's streaming URL cannot be reached; the message names it."""


def request_head(method: str, url: str, headers: list[tuple[str, str]]) -> bytes:
    """The request the runtime's streaming server gets: the CRI URL's path and query, the client's
    headers but its credentials and framing."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in DROPPED]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StreamError(f"streaming URL {url!r}: expected http:// or https://")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        sock = socket.create_connection((parts.hostname, port), timeout=timeout)
        if parts.scheme == "https":
            # the runtime's own self-signed certificate on the node's loopback, as upstream's proxy accepts it
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            sock = ctx.wrap_socket(sock, server_hostname=parts.hostname)
    except OSError as e:
        raise StreamError(f"streaming URL {url}: {e}") from e
    sock.settimeout(None)
    return sock


def _pending(sock: socket.socket) -> bool:
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


def splice(client: socket.socket, backend: socket.socket, *, idle_timeout: float = IDLE_TIMEOUT) -> None:
    """Copies bytes both ways until the backend ends (the session is over) or the client leaves, or for
    `idle_timeout` seconds (0: no limit) nothing could be read or written (a client that says nothing, or
    stopped reading). The client's end of input (half-close) is passed on as the backend's; the sockets
    stay open (the caller closes them)."""
    idle = idle_timeout if idle_timeout > 0 else None
    for sock in (client, backend):
        sock.settimeout(idle)  # a send to a client that stopped reading
    peers = {client: backend, backend: client}
    by_fd = {client.fileno(): client, backend.fileno(): backend}
    reading = [client, backend]
    poller = select.poll()
    for sock in reading:
        poller.register(sock, select.POLLIN)
    while backend in reading:
        ready = [s for s in reading if _pending(s)]
        if not ready:
            ready = [by_fd[fd] for fd, _ in poller.poll(None if idle is None else idle * 1000)]
            if not ready:
                return  # idle
        for src in ready:
            try:
                data = src.recv(BUFFER)
            except ssl.SSLWantReadError:
                continue
            except OSError:
                data = b""
            if not data:
                reading.remove(src)
                poller.unregister(src)
                if src is backend:
                    return
                try:
                    backend.shutdown(socket.SHUT_WR)
                except OSError:
                    return
                continue
            try:
                peers[src].sendall(data)
            except OSError:
                return
