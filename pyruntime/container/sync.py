"""The message channel between the runtime and the processes it forks into a container.

A SOCK_SEQPACKET socketpair keeps message boundaries, so each JSON message is one read; an `error`
message from a child becomes the runtime's error, so a failure deep in container set-up is reported
by `create` with the step that failed, not as a bare exit status.

Every message the two sides exchange is named below, and its place in the sequence documented, as
runc's libcontainer/sync.go does; create.py, init.py and exec.py use only these names. Each message is
one JSON object {"type": NAME, ...fields}; `recv(NAME)` fails on anything else, so a side that skips
a step is caught at the next one. "stage 1" is the first fork (it joins and unshares namespaces, then
forks "stage 2", the future container process, into the new pid namespace, and exits).

`create` (container/create.py with container/init.py):

    stage 1 -> runtime  USERNS        only for a new user namespace: unshared, write my id maps
    runtime -> stage 1  MAPPED        uid_map and gid_map are written; stage 1 becomes root in it
    runtime -> stage 1  GO            stage 1 is in the container's cgroup: unshare the cgroup
                                      namespace (its root is then the container's cgroup) and fork
    stage 1 -> runtime  PID {pid}     stage 2's pid in the runtime's pid namespace; stage 1 exits
    runtime -> stage 2  PID_RECEIVED  stage 1 is reaped; the channel now belongs to stage 2 alone
                                      (stage 2 builds the rootfs meanwhile and waits for this only
                                      before HOOKS; an ERROR it sends earlier is what the runtime's
                                      recv of PID, or its send of this, raises)
    stage 2 -> runtime  HOOKS         the rootfs is built, pivot_root is next: run the runtime's hooks
    runtime -> stage 2  STATE {state} prestart and createRuntime hooks ran; the OCI state for the
                                      container's createContainer hooks
    stage 2 -> runtime  SECCOMP       only with SCMP_ACT_NOTIFY rules, once the filter is loaded: the
                                      notify fd rides along (SCM_RIGHTS, `send_fd`), or no fd when
                                      every notify rule named a syscall this kernel lacks; the
                                      runtime hands it to the agent at listenerPath
    stage 2 -> runtime  READY         set up and waiting on the exec fifo; stage 2 closes the channel
                                      and `create` returns (`start` opens the fifo later)

Without a stage 1 (init.clone_flags: no user namespace, no joined pid or time namespace, no new time
namespace, and a cgroup2 directory to clone into), the runtime clones the init straight into its new
namespaces and cgroup, one fork instead of two. The init does stage 1's work but for making those
namespaces (it joins the others and unshares the cgroup one), then stage 2's; the runtime has its pid
from the clone, skips USERNS to PID and sends PID_RECEIVED at once; the rest is as above.

`exec` (container/exec.py):

    runtime -> stage 1  GO            stage 1 is in the container's cgroup: join the namespaces, fork
    stage 1 -> runtime  PID {pid}     stage 2's pid; stage 1 exits
    runtime -> stage 2  PID_RECEIVED  stage 1 is reaped; the channel is stage 2's
    stage 2 -> runtime  READY         about to execve; stage 2 closes the channel

Either child may instead send ERROR {message} at any point before READY and exit; the runtime's
pending `recv` raises it as a ChildError. No other fds than the seccomp notify fd cross the channel:
the fifos and the console socket are opened by the children themselves.
"""
from __future__ import annotations

import sys
from _socket import AF_UNIX, CMSG_LEN, SCM_RIGHTS, SOCK_SEQPACKET, SOL_SOCKET, socketpair

from pyruntime import fastjson
from pyruntime.errors import InternalError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _socket import socket
    from typing import Any

USERNS = "userns"
MAPPED = "mapped"
GO = "go"
PID = "pid"
PID_RECEIVED = "pid-received"
HOOKS = "hooks"
STATE = "state"
SECCOMP = "seccomp"
READY = "ready"
ERROR = "error"



class ChildError(InternalError):
    """A failure reported by a forked container process. Only its message crosses the channel, so the
    kind of the child's own error is lost and the failure is internal to the runtime."""


class Channel:
    def __init__(self, sock: socket) -> None:
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple[Channel, Channel]:
        """C-level sockets (`_socket`): the `socket` module builds enums at import, on `create`'s start."""
        a, b = socketpair(AF_UNIX, SOCK_SEQPACKET)
        return cls(a), cls(b)

    def send(self, kind: str, **fields: Any) -> None:
        try:
            self.sock.send(fastjson.dumps({"type": kind, **fields}).encode())
        except (BrokenPipeError, ConnectionResetError) as e:
            # the other side is gone; the error it sent before going says why
            self._check(self._recv()[0], f"a reply to {kind!r}")
            raise ChildError(f"container process exited before {kind!r} could be sent") from e

    def send_fd(self, kind: str, fd: int) -> None:
        fd_bytes = fd.to_bytes(4, sys.byteorder)  # a C int
        self.sock.sendmsg([fastjson.dumps({"type": kind}).encode()], [(SOL_SOCKET, SCM_RIGHTS, fd_bytes)])

    def recv_fd(self, expect: str) -> int | None:
        data, fds = self._recv(maxfds=1)
        self._check(data, expect)
        return fds[0] if fds else None

    def recv(self, expect: str) -> dict:
        return self._check(self._recv()[0], expect)

    def _recv(self, maxfds: int = 0) -> tuple[bytes, list[int]]:
        try:
            data, ancillary, _flags, _addr = self.sock.recvmsg(65536, CMSG_LEN(maxfds * 4))
        except ConnectionResetError:
            # A side that exits with a message of ours unread (stage 2 sends ERROR while PID_RECEIVED
            # waits in its queue) leaves ECONNRESET on our socket, and a SOCK_SEQPACKET recv reports
            # that error before the messages queued ahead of it. Reporting consumes the error: what
            # the other side sent before going (its ERROR) is the next read.
            data, ancillary, _flags, _addr = self.sock.recvmsg(65536, CMSG_LEN(maxfds * 4))
        # a C int per fd, decoded by hand: `array` imports collections
        fds = [int.from_bytes(payload[i:i + 4], sys.byteorder, signed=True)
               for level, kind, payload in ancillary if level == SOL_SOCKET and kind == SCM_RIGHTS
               for i in range(0, len(payload) - 3, 4)]
        return data, fds

    def _check(self, data: bytes, expect: str) -> dict:
        if not data:
            raise ChildError(f"container process exited before sending {expect!r}")
        msg = fastjson.loads(data)
        if msg["type"] == ERROR:
            raise ChildError(msg["message"])
        if msg["type"] != expect:
            raise ChildError(f"protocol error: expected {expect!r}, got {msg['type']!r}")
        return msg

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
