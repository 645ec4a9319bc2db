"""The runtime <-> container-process channel: what a child sent before it went is what the runtime reports."""
from __future__ import annotations

import json

import pytest

from pyruntime.container import sync
from pyruntime.container.sync import Channel, ChildError


def _error_then_exit(child: Channel, message: str) -> None:
    child.sock.send(json.dumps({"type": sync.ERROR, "message": message}).encode())
    child.close()


def test_error_sent_by_a_child_that_left_our_message_unread_is_reported():
    """Stage 2 fails while PID_RECEIVED waits unread in its queue: the kernel's ECONNRESET comes first
    on a SOCK_SEQPACKET socket, and must not hide the error (it once did: "Connection reset by peer")."""
    parent, child = Channel.pair()
    parent.send(sync.PID_RECEIVED)
    _error_then_exit(child, "/proc must be mounted on ordinary directory")
    with pytest.raises(ChildError, match="must be mounted on ordinary directory"):
        parent.recv(sync.HOOKS)
    parent.close()


def test_error_is_reported_by_a_send_to_a_child_that_is_gone():
    parent, child = Channel.pair()
    _error_then_exit(child, "no such file: /bin/sh")
    with pytest.raises(ChildError, match="no such file: /bin/sh"):
        parent.send(sync.PID_RECEIVED)
    parent.close()


def test_child_gone_without_a_word():
    parent, child = Channel.pair()
    parent.send(sync.PID_RECEIVED)
    child.close()
    with pytest.raises(ChildError, match="exited before sending 'hooks'"):
        parent.recv(sync.HOOKS)
    parent.close()


def test_a_message_out_of_sequence_is_a_protocol_error():
    parent, child = Channel.pair()
    child.send(sync.READY)
    with pytest.raises(ChildError, match="expected 'hooks', got 'ready'"):
        parent.recv(sync.HOOKS)
    parent.close()
    child.close()


def test_an_fd_crosses_the_channel():
    """The seccomp notify fd's way from the init to the runtime (SCM_RIGHTS, decoded without `array`)."""
    import os
    parent, child = Channel.pair()
    read, write = os.pipe()
    child.send_fd(sync.SECCOMP, write)
    os.close(write)
    got = parent.recv_fd(sync.SECCOMP)
    assert got is not None
    os.write(got, b"through")
    os.close(got)
    assert os.read(read, 16) == b"through"
    os.close(read)
    child.send(sync.SECCOMP)  # no fd: every notify rule named a syscall the kernel lacks
    assert parent.recv_fd(sync.SECCOMP) is None
    parent.close()
    child.close()
