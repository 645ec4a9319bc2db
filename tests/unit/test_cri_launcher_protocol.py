"""The launcher's wire protocol and the client's multiplexing, without root or a fork: messages with
fds, error kinds across the boundary, replies out of order to many threads, a server that goes away;
and the pause's sysctl rules (the host must never be changed by a pod's sysctl)."""
from __future__ import annotations

import fcntl
import os
import socket
import threading

import pytest

from pyruntime import channel as wire
from pyruntime import errors
from pyruntime.cri.jobs import ExecJob, PauseJob
from pyruntime.cri.launcher import Launcher
from pyruntime.cri.pause import check_sysctls, pause_cgroup
from pyruntime.errors import InternalError, InvalidArgumentError, NotFoundError, UnavailableError


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def test_a_message_and_its_fds_cross_close_on_exec(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        wire.send(a, {"id": 1, "op": "exec", "job": {"argv": ["sh"]}}, [r, w])
        got = wire.receive(b)
        assert got is not None
        message, fds = got
        assert message == {"id": 1, "op": "exec", "job": {"argv": ["sh"]}}
        assert len(fds) == 2 and all(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC for fd in fds)
        os.write(fds[1], b"x")
        assert os.read(r, 1) == b"x"
        for fd in fds:
            os.close(fd)
    finally:
        os.close(r)
        os.close(w)


def test_the_end_of_the_peer_is_none_and_garbage_is_internal(pair):
    a, b = pair
    a.send(b"not json")
    with pytest.raises(InternalError, match="not JSON"):
        wire.receive(b)
    a.send(b"[1, 2]")
    with pytest.raises(InternalError, match="not an object"):
        wire.receive(b)
    a.shutdown(socket.SHUT_WR)
    assert wire.receive(b) is None


def test_too_big_a_request_is_refused_before_sending(pair):
    a, _ = pair
    with pytest.raises(InvalidArgumentError, match="1048587 bytes and 0 fds, more than 1048576 bytes"):
        wire.send(a, {"env": "x" * wire.MAX_MESSAGE})


@pytest.mark.parametrize("error", [NotFoundError("c1: no such container"), errors.AlreadyExistsError("taken"),
                                   InvalidArgumentError("process.args: empty"), errors.FailedPreconditionError("x"),
                                   UnavailableError("later"), InternalError("broken")])
def test_errors_keep_their_kind_and_message_across(error):
    with pytest.raises(type(error), match=str(error)):
        wire.raise_reported(wire.error_message(error), "create")


def test_unplanned_errors_arrive_as_internal():
    reported = wire.error_message(KeyError("argv"))
    assert reported["error"] == "InternalError"
    with pytest.raises(InternalError, match="argv"):
        wire.raise_reported(reported, "exec")
    with pytest.raises(InternalError, match="exec: failed"):
        wire.raise_reported({"error": "NoSuchKind"}, "exec")
    wire.raise_reported({"pid": 3}, "exec")  # a success passes


def _fake_server(sock: socket.socket, count: int) -> None:
    """Answers `count` requests in reverse order of arrival, echoing the job."""
    requests = [wire.receive(sock) for _ in range(count)]
    for request in reversed(requests):
        assert request is not None
        message, fds = request
        for fd in fds:
            os.close(fd)
        if message["job"]["argv"] == ["fail"]:
            wire.send(sock, {"id": message["id"], **wire.error_message(NotFoundError("no such container"))})
        else:
            wire.send(sock, {"id": message["id"], "ok": {"argv": message["job"]["argv"]}})


def test_many_threads_each_get_their_own_reply_out_of_order(pair):
    ours, theirs = pair
    client = Launcher(ours, os.getpid())  # not our child: close() has nothing to reap
    server = threading.Thread(target=_fake_server, args=(theirs, 9))
    server.start()
    got: dict[int, object] = {}

    def call(n: int) -> None:
        try:
            got[n] = client._call("exec", {"argv": ["fail"] if n == 8 else [str(n)]}, [None, None, None])[0]
        except NotFoundError as e:
            got[n] = e

    threads = [threading.Thread(target=call, args=(n,)) for n in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    server.join(10)
    assert {n: got[n] for n in range(8)} == {n: {"argv": [str(n)]} for n in range(8)}
    assert isinstance(got[8], NotFoundError)
    client.close()


def test_waiters_fail_as_unavailable_when_the_launcher_goes(pair):
    ours, theirs = pair
    client = Launcher(ours, os.getpid())
    failures: list[Exception] = []

    def call() -> None:
        try:
            client.run_pause(PauseJob("s1", "/nonexistent"))
        except UnavailableError as e:
            failures.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(3):
        assert wire.receive(theirs) is not None
    theirs.close()  # the launcher died with three requests in flight
    for t in threads:
        t.join(10)
    assert len(failures) == 3 and all("launcher" in str(e) for e in failures)
    with pytest.raises(UnavailableError):
        client.exec(ExecJob("c1", ["true"]), None, None, None)
    client.close()
    client.close()  # idempotent


@pytest.mark.parametrize("name", ["net.ipv4.ip_forward", "net/ipv4/conf/all/rp_filter", "kernel.shmmax",
                                  "kernel.shm_rmid_forced", "kernel.msgmnb", "kernel.sem", "fs.mqueue.msg_max"])
def test_namespaced_sysctls_pass(name):
    check_sysctls({name: "1"}, new_net=True, new_ipc=True)


@pytest.mark.parametrize(("name", "net", "ipc", "match"), [
    ("kernel.hostname", True, True, "not a namespaced sysctl"),
    ("vm.swappiness", True, True, "not a namespaced sysctl"),
    ("kernel.semx", True, True, "not a namespaced sysctl"),
    ("fs.file-max", True, True, "not a namespaced sysctl"),
    ("net.core.somaxconn", False, True, "host's network namespace"),
    ("kernel.shmall", True, False, "host's IPC namespace"),
    ("net/../../kernel/hostname", True, True, "not a sysctl name"),
])
def test_sysctls_that_would_change_the_host_are_refused_by_name(name, net, ipc, match):
    with pytest.raises(InvalidArgumentError, match=f"sysctls.{name}: .*{match}"):
        check_sysctls({name: "1"}, new_net=net, new_ipc=ipc)


def test_the_pause_cgroup():
    assert pause_cgroup("", "s1") == "/pyruntime/s1"  # never the daemon's cgroup
    assert pause_cgroup("/kubepods/besteffort/pod1/", "s1") == "/kubepods/besteffort/pod1/pause"
