"""The one channel between pyruntime and the processes it forks: messages, fds, size limits, error kinds.

Two protocols run over it, both across a fork: the sync protocol between the runtime and the container's
init (below, the messages named as runc's libcontainer/sync.go names them), and the CRI launcher's, between
pyruntime-cri, its fork server and the children it forks (pyruntime/cri/forkserver.py). The transport is one
SOCK_SEQPACKET socketpair, so message boundaries are kept and a message is one read: one JSON object, with
fds beside it (SCM_RIGHTS, received close-on-exec: a process that forks all the time must not hand a pipe
or a pty to a child by accident).

A failure crosses as {"error": KIND, "message": TEXT}, KIND the name of one of pyruntime.errors' kinds, and
is raised on the other side as that kind (`raise_reported`). So an error keeps its kind across any number
of forks (container init -> runtime -> supervisor -> launcher -> daemon) and a mount that the init refuses
because of the caller's spec or image reaches the CRI client as INVALID_ARGUMENT or FAILED_PRECONDITION,
not as INTERNAL. What is not a pyruntime error (a bug) crosses as InternalError with its message.

Threat model: the peer may be, or come to be, untrusted. Stage 1 and stage 2 run in the container's
namespaces and become the container's code at execve; an exec joins a container where its processes already
run; a report comes from a child that parsed an image or a pod's config. The side that reads therefore takes
nothing on trust: every message is bounded (MAX_MESSAGE bytes, or the smaller limit of its protocol, and
MAX_FDS fds, a truncated one is an error), it must be a JSON object, the sync protocol's type must be the
one the reader expects, with its fields of the expected types, fds it does not expect are closed at once,
an unknown error kind is internal and a reported message is cut at MAX_ERROR characters before it reaches a
log or a gRPC status. The sender refuses a message over the limit before sending it, naming its size.

The sync protocol. Each message is {"type": NAME, ...fields}; `recv(NAME)` fails on anything else, so a side
that skips a step is caught at the next one. "stage 1" is the first fork (it joins and unshares namespaces,
then forks "stage 2", the future container process, into the new pid namespace, and exits).

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
                                      notify fd rides along (`send_fd`), or no fd when every notify
                                      rule named a syscall this kernel lacks; the runtime hands it to
                                      the agent at listenerPath
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

Either child may instead send ERROR {error, message} at any point before READY and exit; the runtime's
pending `recv` raises it as its kind, and `Channel.peer_failed` tells the runtime that the child is gone or
going. No other fds than the seccomp notify fd cross the sync channel: the fifos and the console socket are
opened by the children themselves.

Everything here is on the runtime's start path: C-level sockets (`_socket`; the `socket` module builds
enums at import) and `fastjson`, not `json`.
"""
from __future__ import annotations

import os
import sys
from _socket import (
    AF_UNIX,
    CMSG_SPACE,
    MSG_CMSG_CLOEXEC,
    MSG_CTRUNC,
    MSG_TRUNC,
    SCM_RIGHTS,
    SOCK_SEQPACKET,
    SOL_SOCKET,
    socketpair,
)

from pyruntime import errors, fastjson
from pyruntime.errors import InternalError, InvalidArgumentError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _socket import socket
    from collections.abc import Sequence
    from typing import Any

MAX_MESSAGE = 1 << 20  # the launcher's: a job's JSON (an exec's argv and env) stays far below this
MAX_SYNC_MESSAGE = 1 << 16  # the sync protocol's, whose largest message is STATE (the container's OCI state)
MAX_FDS = 8  # the most a message carries: an exec's stdio, its pidfd and pty, a report socket
MAX_ERROR = 1 << 13  # characters of a reported failure's message kept: an ERROR fits MAX_SYNC_MESSAGE escaped
_FD_SIZE = 4  # a C int per fd in SCM_RIGHTS; decoded by hand: `array` imports collections

# the sync protocol's messages
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
# the fields a sync message must carry, by type: what the reader checks before it uses them
_FIELDS: dict[str, tuple[tuple[str, type], ...]] = {PID: (("pid", int),), STATE: (("state", dict),)}


class ChannelError(InternalError):
    """The channel broke: the peer ended before a step, or sent what the protocol does not allow (a message
    too big, not JSON, not the expected one). A failure the peer reported is raised as its own kind instead."""


# ---------------------------------------------------------------------------------------------------------------
# messages on any SOCK_SEQPACKET socket


def send(sock: socket, message: dict, fds: Sequence[int] = (), limit: int = MAX_MESSAGE) -> None:
    """One message and its fds; too big a message is refused here, naming its size, rather than truncated."""
    data = fastjson.dumps(message).encode()
    if len(data) > limit or len(fds) > MAX_FDS:
        name = f"message {message['type']!r}" if "type" in message else "a message"
        raise InvalidArgumentError(f"{name}: {len(data)} bytes and {len(fds)} fds, more than {limit} bytes or "
                                   f"{MAX_FDS} fds")
    if fds:
        sock.sendmsg([data], [(SOL_SOCKET, SCM_RIGHTS, b"".join(fd.to_bytes(_FD_SIZE, sys.byteorder)
                                                                 for fd in fds))])
    else:
        sock.send(data)


def receive(sock: socket, limit: int = MAX_MESSAGE, max_fds: int = MAX_FDS) -> tuple[dict, list[int]] | None:
    """One message and its fds (close-on-exec); None when the peer closed its end. A message that is not a
    JSON object, or was cut (more than `limit` bytes or `max_fds` fds), raises ChannelError with its fds closed."""
    try:
        data, ancillary, flags, _addr = sock.recvmsg(limit, CMSG_SPACE(max_fds * _FD_SIZE), MSG_CMSG_CLOEXEC)
    except ConnectionResetError:
        # A side that exits with a message of ours unread (stage 2 sends ERROR while PID_RECEIVED waits in its
        # queue) leaves ECONNRESET on our socket, and a SOCK_SEQPACKET recv reports that error before the
        # messages queued ahead of it. Reporting consumes the error: what the other side sent before going
        # (its ERROR) is the next read.
        data, ancillary, flags, _addr = sock.recvmsg(limit, CMSG_SPACE(max_fds * _FD_SIZE), MSG_CMSG_CLOEXEC)
    fds = [int.from_bytes(payload[i:i + _FD_SIZE], sys.byteorder, signed=True)
           for level, kind, payload in ancillary if level == SOL_SOCKET and kind == SCM_RIGHTS
           for i in range(0, len(payload) - _FD_SIZE + 1, _FD_SIZE)]
    if not data and not fds:
        return None
    try:
        if flags & (MSG_TRUNC | MSG_CTRUNC):
            raise ChannelError(f"message truncated: more than {limit} bytes or {max_fds} fds")
        try:
            message = fastjson.loads(data)
        except ValueError as e:
            raise ChannelError(f"message is not JSON: {data[:100]!r}") from e
        if not isinstance(message, dict):
            raise ChannelError(f"message is not an object: {data[:100]!r}")
    except ChannelError:
        _close(fds)
        raise
    return message, fds


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def wait_readable(fd: int, timeout: float | None) -> bool:
    """Whether a message (or the end of the peer) is waiting on `fd` within `timeout` seconds (None: no limit).
    poll(2), not select(2): the daemon's fds go past FD_SETSIZE with a few hundred pods."""
    import select  # here: the runtime's start path never waits this way
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))


# ---------------------------------------------------------------------------------------------------------------
# failures across the fork


def error_message(error: BaseException) -> dict:
    """{"error": kind name, "message": ...}: what crosses a fork of a failure."""
    return {"error": errors.kind_of(error).__name__, "message": (str(error) or type(error).__name__)[:MAX_ERROR]}


def reported(message: dict, what: str) -> errors.PyRuntimeError | None:
    """The failure a message reports, as its kind; None for any other message."""
    return _failure(message, what) if "error" in message else None


def _failure(message: dict, what: str) -> errors.PyRuntimeError:
    """An unknown or missing kind is internal; a message that is no text is replaced by `what` failed."""
    kind = next((k for k in errors.KINDS if k.__name__ == message.get("error")), InternalError)
    text = message.get("message")
    return kind(text[:MAX_ERROR] if isinstance(text, str) and text else f"{what}: failed")


def raise_reported(message: dict, what: str) -> None:
    """Re-raises a reported failure as the same pyruntime.errors kind; any other message passes."""
    error = reported(message, what)
    if error is not None:
        raise error


def send_error(sock: socket, error: BaseException) -> None:
    """Reports `error` on a report socket; a reader that is gone is no error (its side sees no report)."""
    try:
        send(sock, error_message(error))
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------------------
# the sync protocol's end of the channel


class Channel:
    """One end of the sync protocol's socketpair (see the module doc)."""

    def __init__(self, sock: socket) -> None:
        self.sock = sock
        self.peer_failed = False  # the peer reported a failure or ended: it is gone or exits now

    @classmethod
    def pair(cls) -> tuple[Channel, Channel]:
        a, b = socketpair(AF_UNIX, SOCK_SEQPACKET)
        return cls(a), cls(b)

    def send(self, kind: str, **fields: Any) -> None:
        self._send({"type": kind, **fields}, ())

    def send_fd(self, kind: str, fd: int) -> None:
        self._send({"type": kind}, (fd,))

    def send_error(self, error: BaseException, message: str) -> None:
        """ERROR with `error`'s kind and `message` (the caller's wording of it)."""
        self._send({"type": ERROR, **error_message(error), "message": message[:MAX_ERROR]}, ())

    def recv(self, expect: str) -> dict:
        return self._recv(expect, 0)[0]

    def recv_fd(self, expect: str) -> int | None:
        fds = self._recv(expect, 1)[1]
        return fds[0] if fds else None

    def _send(self, message: dict, fds: Sequence[int]) -> None:
        try:
            send(self.sock, message, fds, MAX_SYNC_MESSAGE)
        except (BrokenPipeError, ConnectionResetError) as e:
            # the other side is gone; the error it sent before going says why
            self._recv(f"a reply to {message['type']!r}", 0)
            raise ChannelError(f"container process exited before {message['type']!r} could be sent") from e

    def _recv(self, expect: str, max_fds: int) -> tuple[dict, list[int]]:
        # garbage (ChannelError) leaves peer_failed unset: a peer that sends it may run on, and is not waited for
        got = receive(self.sock, MAX_SYNC_MESSAGE, max_fds)
        if got is None:
            self.peer_failed = True
            raise ChannelError(f"container process exited before sending {expect!r}")
        message, fds = got
        kind = message.get("type")
        if kind == ERROR:
            _close(fds)
            self.peer_failed = True
            raise _failure(message, expect)
        try:
            if kind != expect:
                raise ChannelError(f"protocol error: expected {expect!r}, got {str(kind)[:100]!r}")
            for name, typ in _FIELDS.get(kind, ()):
                if not isinstance(message.get(name), typ) or isinstance(message[name], bool):
                    raise ChannelError(f"protocol error: {kind!r} without a valid {name!r}")
        except ChannelError:
            _close(fds)
            raise
        return message, fds

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
