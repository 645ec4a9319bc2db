"""The message channel between the runtime and the processes it forks into a container.

A SOCK_SEQPACKET socketpair keeps message boundaries, so each JSON message is one read; an `error`
message from a child becomes the runtime's error, so a failure deep in container set-up is reported
by `create` with the step that failed, not as a bare exit status.
"""
from __future__ import annotations

import json
import socket
from typing import Any


class ChildError(Exception):
    """A failure reported by a forked container process."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple["Channel", "Channel"]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(a), cls(b)

    def send(self, kind: str, **fields: Any) -> None:
        self.sock.send(json.dumps({"type": kind, **fields}).encode())

    def recv(self, expect: str) -> dict:
        data = self.sock.recv(65536)
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
