"""The message channel between the runtime and the processes it forks into a container.

A SOCK_SEQPACKET socketpair keeps message boundaries, so each JSON message is one read; an `error`
message from a child becomes the runtime's error, so a failure deep in container set-up is reported
by `create` with the step that failed, not as a bare exit status.
"""
from __future__ import annotations

import json
import socket
from typing import Any

from pyruntime.errors import InternalError


class ChildError(InternalError):
    """A failure reported by a forked container process. Only its message crosses the channel, so the
    kind of the child's own error is lost and the failure is internal to the runtime."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple["Channel", "Channel"]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(a), cls(b)

    def send(self, kind: str, **fields: Any) -> None:
        try:
            self.sock.send(json.dumps({"type": kind, **fields}).encode())
        except (BrokenPipeError, ConnectionResetError) as e:
            # the other side is gone; the error it sent before going says why
            self._check(self.sock.recv(65536), f"a reply to {kind!r}")
            raise ChildError(f"container process exited before {kind!r} could be sent") from e

    def send_fd(self, kind: str, fd: int) -> None:
        socket.send_fds(self.sock, [json.dumps({"type": kind}).encode()], [fd])

    def recv_fd(self, expect: str) -> int | None:
        data, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 1)
        self._check(data, expect)
        return fds[0] if fds else None

    def recv(self, expect: str) -> dict:
        return self._check(self.sock.recv(65536), expect)

    def _check(self, data: bytes, expect: str) -> dict:
        if not data:
            raise ChildError(f"container process exited before sending {expect!r}")
        msg = json.loads(data)
        if msg["type"] == "error":
            raise ChildError(msg["message"])
        if msg["type"] != expect:
            raise ChildError(f"protocol error: expected {expect!r}, got {msg['type']!r}")
        return msg

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
