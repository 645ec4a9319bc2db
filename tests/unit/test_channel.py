"""The channel to forked processes (pyruntime/channel.py): what a child sent before it went is what the runtime
reports, with its error kind, through every fork up to the CRI caller's status code; and what a peer sends is
bounded and checked before it is used."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket

import grpc
import pytest

from pyruntime import channel
from pyruntime.channel import Channel, ChannelError
from pyruntime.container.process import ProcessError
from pyruntime.container.rootfs import MountRefused, MountSourceError
from pyruntime.cri.service import instrument
from pyruntime.errors import (
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PyRuntimeError,
)


def _error_then_exit(child: Channel, message: str) -> None:
    child.sock.send(json.dumps({"type": channel.ERROR, "message": message}).encode())
    child.close()


def test_error_sent_by_a_child_that_left_our_message_unread_is_reported():
    """Stage 2 fails while PID_RECEIVED waits unread in its queue: the kernel's ECONNRESET comes first
    on a SOCK_SEQPACKET socket, and must not hide the error (it once did: "Connection reset by peer")."""
    parent, child = Channel.pair()
    parent.send(channel.PID_RECEIVED)
    _error_then_exit(child, "/proc must be mounted on ordinary directory")
    with pytest.raises(InternalError, match="must be mounted on ordinary directory"):
        parent.recv(channel.HOOKS)
    assert parent.peer_failed
    parent.close()


def test_error_is_reported_by_a_send_to_a_child_that_is_gone():
    parent, child = Channel.pair()
    _error_then_exit(child, "no such file: /bin/sh")
    with pytest.raises(InternalError, match="no such file: /bin/sh"):
        parent.send(channel.PID_RECEIVED)
    parent.close()


def test_child_gone_without_a_word():
    parent, child = Channel.pair()
    parent.send(channel.PID_RECEIVED)
    child.close()
    with pytest.raises(ChannelError, match="exited before sending 'hooks'"):
        parent.recv(channel.HOOKS)
    assert parent.peer_failed
    parent.close()


def test_a_message_out_of_sequence_is_a_protocol_error():
    parent, child = Channel.pair()
    child.send(channel.READY)
    with pytest.raises(ChannelError, match="expected 'hooks', got 'ready'"):
        parent.recv(channel.HOOKS)
    assert not parent.peer_failed  # a peer that skipped a step has not said it is going: nobody waits for it
    parent.close()
    child.close()


def test_an_fd_crosses_the_channel():
    """The seccomp notify fd's way from the init to the runtime (SCM_RIGHTS, decoded without `array`)."""
    parent, child = Channel.pair()
    read, write = os.pipe()
    child.send_fd(channel.SECCOMP, write)
    os.close(write)
    got = parent.recv_fd(channel.SECCOMP)
    assert got is not None
    assert fcntl.fcntl(got, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    os.write(got, b"through")
    os.close(got)
    assert os.read(read, 16) == b"through"
    os.close(read)
    child.send(channel.SECCOMP)  # no fd: every notify rule named a syscall the kernel lacks
    assert parent.recv_fd(channel.SECCOMP) is None
    parent.close()
    child.close()


# error kinds across the fork

@pytest.mark.parametrize(("error", "kind"), [
    (MountRefused(errno.ELOOP, "masked path /etc/secret is a symlink: refusing to follow it"), FailedPreconditionError),
    (MountSourceError(errno.ENOENT, "mount /data: bind source /gone: No such file or directory"),
     InvalidArgumentError),
    (ProcessError("process.user: no such user 'nobody2'"), InvalidArgumentError),
    (NotFoundError("no such thing"), NotFoundError),
    (KeyError("bug"), InternalError),
])
def test_a_childs_error_keeps_its_kind(error, kind):
    """What container init sends (init.fail: the error and its message) is raised as the same kind."""
    parent, child = Channel.pair()
    child.send_error(error, str(error))
    with pytest.raises(kind, match=re.escape(str(error))) as raised:
        parent.recv(channel.READY)
    assert type(raised.value) is kind
    parent.close()
    child.close()


@pytest.mark.parametrize(("error", "code"), [
    (MountRefused(errno.ENOTDIR, "mount /proc: filesystem 'proc' must be mounted on ordinary directory"),
     grpc.StatusCode.FAILED_PRECONDITION),
    (MountSourceError(errno.ENOENT, "mount /data: bind source /gone: No such file or directory"),
     grpc.StatusCode.INVALID_ARGUMENT),
])
def test_a_refused_mount_reaches_the_cri_caller_as_its_code(error, code):
    """The whole way of a mount refused in container init: init -> runtime (the sync channel), the runtime's
    create child -> supervisor (a report line), supervisor -> fork server -> daemon (the launcher's channel),
    the daemon -> the gRPC status (service/instrument.py's table)."""
    parent, child = Channel.pair()
    child.send_error(error, str(error))
    with pytest.raises(PyRuntimeError) as in_runtime:  # which kind is the point
        parent.recv(channel.HOOKS)
    parent.close()
    child.close()
    create_report = json.loads(json.dumps(channel.error_message(in_runtime.value)) + "\n")  # supervisor's pipe
    with pytest.raises(PyRuntimeError) as in_supervisor:
        channel.raise_reported(create_report, "create c1")
    daemon, forkserver = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with daemon, forkserver:
        channel.send(forkserver, {"id": 7, **channel.error_message(in_supervisor.value)})
        got = channel.receive(daemon)
    assert got is not None
    with pytest.raises(PyRuntimeError) as in_daemon:
        channel.raise_reported(got[0], "create")
    assert instrument.status_of(in_daemon.value) == code
    assert str(error) in str(in_daemon.value)


def test_an_unknown_kind_is_internal_and_a_long_message_is_cut():
    with pytest.raises(InternalError, match="create: failed"):
        channel.raise_reported({"error": "SystemExit"}, "create")
    with pytest.raises(InternalError) as raised:
        channel.raise_reported({"error": "NoSuchKind", "message": "x" * (channel.MAX_ERROR * 2)}, "create")
    assert len(str(raised.value)) == channel.MAX_ERROR
    with pytest.raises(NotFoundError, match="create: failed"):
        channel.raise_reported({"error": "NotFoundError", "message": ["not", "text"]}, "create")
    channel.raise_reported({"pid": 3}, "create")  # a success passes


# bounds and checks on what a peer sends

def test_a_sync_message_over_its_limit_is_refused_by_the_sender():
    parent, child = Channel.pair()
    with pytest.raises(InvalidArgumentError, match=r"message 'state': .* more than 65536 bytes"):
        parent.send(channel.STATE, state={"annotations": {"a": "x" * channel.MAX_SYNC_MESSAGE}})
    parent.close()
    child.close()


def test_a_message_cut_by_the_limit_is_an_error_not_a_parse():
    parent, child = Channel.pair()
    child.sock.send(json.dumps({"type": channel.PID, "pid": 5, "pad": "x" * channel.MAX_SYNC_MESSAGE}).encode())
    with pytest.raises(ChannelError, match="truncated"):
        parent.recv(channel.PID)
    parent.close()
    child.close()


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"type": "pid"}', b'{"type": "pid", "pid": "5"}',
                                 b'{"type": "pid", "pid": true}', b'{"type": "state", "state": []}'])
def test_garbage_and_missing_fields_are_protocol_errors(raw):
    parent, child = Channel.pair()
    child.sock.send(raw)
    expect = channel.STATE if b"state" in raw else channel.PID
    with pytest.raises(ChannelError):
        parent.recv(expect)
    parent.close()
    child.close()


def test_fds_a_message_should_not_carry_are_not_kept():
    """A message with fds where none is expected (HOOKS) is cut short of them: none stays open here."""
    parent, child = Channel.pair()
    read, write = os.pipe()
    before = set(os.listdir("/proc/self/fd"))
    channel.send(child.sock, {"type": channel.HOOKS}, [read, write])
    os.close(read)
    os.close(write)
    with pytest.raises(ChannelError, match="truncated"):
        parent.recv(channel.HOOKS)
    assert set(os.listdir("/proc/self/fd")) <= before
    parent.close()
    child.close()


def test_too_many_fds_are_refused_by_the_sender():
    parent, child = Channel.pair()
    with pytest.raises(InvalidArgumentError, match=r"more than .* 8 fds"):
        channel.send(child.sock, {"type": "x"}, [0] * (channel.MAX_FDS + 1))
    parent.close()
    child.close()
