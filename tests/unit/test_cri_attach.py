"""The supervisor.sock protocol between attach.py's client and server, over a real unix socket with
the server in a selector loop of its own (as in the supervisor) and the clients in the test."""
from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pyruntime.cri import attach
from pyruntime.errors import FailedPreconditionError, InvalidArgumentError


class Loop:
    """An AttachServer driven by one thread; `call(fn)` runs fn(server) in it and waits."""

    def __init__(self, path: str, **kw) -> None:
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.calls: list[tuple[Callable, threading.Event]] = []
        self.stop = False
        self.reopened = 0
        self.sizes: list[tuple[int, int]] = []
        self.stdin_r, stdin_w = os.pipe()
        os.set_blocking(stdin_w, False)
        options: dict[str, Any] = {"tty": False, "stdin_fd": stdin_w, "stdin_once": False, "on_reopen": self._reopen,
                   "on_resize": lambda w, h: self.sizes.append((w, h))}
        options.update(kw)
        self.fail_reopen = False
        self.server = attach.AttachServer(path, self.sel, **options)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _reopen(self) -> None:
        if self.fail_reopen:
            raise FailedPreconditionError("log_path: reopen /x: Permission denied")
        self.reopened += 1

    def _run(self) -> None:
        while not self.stop:
            for key, mask in self.sel.select():
                if key.data is None:
                    os.read(self.wake_r, 100)
                    while self.calls:
                        fn, done = self.calls.pop(0)
                        fn(self.server)
                        done.set()
                else:
                    key.data(mask)

    def call(self, fn: Callable) -> None:
        done = threading.Event()
        self.calls.append((fn, done))
        os.write(self.wake_w, b"x")
        assert done.wait(10)

    def close(self) -> None:
        self.call(lambda server: server.close())
        self.stop = True
        os.write(self.wake_w, b"x")
        self.thread.join(10)
        self.sel.close()
        for fd in (self.wake_r, self.wake_w, self.stdin_r):
            os.close(fd)


@pytest.fixture
def loop(tmp_path):
    made: list[Loop] = []

    def make(**kw) -> Loop:
        made.append(Loop(str(tmp_path / "supervisor.sock"), **kw))
        return made[-1]
    yield make
    for lp in made:
        lp.close()


def connected(loop: Loop, count: int) -> None:
    """Waits until `count` clients are attached (the server's connections that said hello)."""
    deadline = time.monotonic() + 10
    while sum(c.attached for c in loop.server._conns) < count:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_control_operations(loop, tmp_path):
    lp = loop()
    path = str(tmp_path / "supervisor.sock")
    assert os.stat(path).st_mode & 0o777 == 0o600
    attach.reopen_log(path)
    attach.resize(path, 80, 24)
    assert lp.reopened == 1 and lp.sizes == [(80, 24)]
    lp.fail_reopen = True
    with pytest.raises(FailedPreconditionError, match="Permission denied"):
        attach.reopen_log(path)
    with pytest.raises(InvalidArgumentError, match="unknown operation"):
        attach._request(path, {"op": "nope"})
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    sock.sendall(b"not json\n")
    assert b"InvalidArgumentError" in sock.recv(1000)
    sock.close()


def test_a_missing_supervisor_is_a_failed_precondition(tmp_path):
    with pytest.raises(FailedPreconditionError, match="supervisor has exited"):
        attach.attach(str(tmp_path / "gone.sock"), stdout=1)


def test_every_client_gets_the_output_and_returns_when_it_ends(loop, tmp_path):
    lp = loop()
    path = str(tmp_path / "supervisor.sock")
    results: list[tuple[bytes, bytes]] = []

    def client() -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        attach.attach(path, stdout=out_w, stderr=err_w)
        os.close(out_w)
        os.close(err_w)
        with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
            results.append((out.read(), err.read()))
    clients = [threading.Thread(target=client) for _ in range(3)]
    for t in clients:
        t.start()
    connected(lp, 3)
    lp.call(lambda s: s.broadcast(attach.STDOUT, b"out\n"))
    lp.call(lambda s: s.broadcast(attach.STDERR, b"err\n"))
    lp.call(lambda s: s.broadcast(attach.STDOUT, b"x" * 50_000))
    lp.call(lambda s: s.end_output())
    for t in clients:
        t.join(10)
        assert not t.is_alive()
    assert results == [(b"out\n" + b"x" * 50_000, b"err\n")] * 3
    attach.attach(path, stdout=1)  # output over: a late client returns at once


def test_stdin_is_interleaved_and_stdin_once_closes_it_with_the_first_client(loop, tmp_path):
    lp = loop(stdin_once=True)
    path = str(tmp_path / "supervisor.sock")
    in_r, in_w = os.pipe()
    client = threading.Thread(target=attach.attach, args=(path,), kwargs={"stdin": in_r})
    client.start()
    os.write(in_w, b"hello ")
    os.write(in_w, b"world\n")
    os.close(in_w)
    with os.fdopen(os.dup(lp.stdin_r), "rb") as f:
        assert f.read() == b"hello world\n"  # EOF: the container's stdin closed
    lp.call(lambda s: s.end_output())
    client.join(10)
    os.close(in_r)


def test_without_stdin_once_a_detach_leaves_stdin_open(loop, tmp_path):
    lp = loop()
    path = str(tmp_path / "supervisor.sock")
    for word in (b"one\n", b"two\n"):
        in_r, in_w = os.pipe()
        os.write(in_w, word)
        os.close(in_w)
        ours, theirs = socket.socketpair()
        client = threading.Thread(target=attach.attach, args=(path,), kwargs={"stdin": in_r, "stdout": ours})
        client.start()
        assert os.read(lp.stdin_r, 100) == word
        theirs.close()  # the client goes away: attach notices though no output comes
        client.join(10)
        assert not client.is_alive()
        ours.close()
        os.close(in_r)
    assert lp.server._stdin_fd is not None


def test_a_client_that_does_not_read_is_dropped(loop, tmp_path, monkeypatch):
    monkeypatch.setattr(attach, "OUT_LIMIT", 1 << 20)
    lp = loop()
    path = str(tmp_path / "supervisor.sock")
    stuck = socket.socket(socket.AF_UNIX)
    stuck.connect(path)
    stuck.sendall(b'{"op": "attach", "stdout": true}\n')
    connected(lp, 1)
    for _ in range(64):
        lp.call(lambda s: s.broadcast(attach.STDOUT, b"y" * 65536))
    assert not lp.server._conns
    stuck.close()


def test_resizes_from_a_queue_reach_the_terminal(loop, tmp_path):
    import queue
    lp = loop(tty=True)
    path = str(tmp_path / "supervisor.sock")
    sizes: queue.Queue = queue.Queue()
    client = threading.Thread(target=attach.attach, args=(path,),
                              kwargs={"stdout": 1, "tty": True, "resize": sizes})
    client.start()
    connected(lp, 1)
    sizes.put((100, 30))
    deadline = time.monotonic() + 10
    while lp.sizes != [(100, 30)]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    lp.call(lambda s: s.end_output())
    client.join(10)
    assert not client.is_alive()


def test_long_socket_paths(tmp_path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    path = str(deep / "supervisor.sock")
    lp = Loop(path)
    try:
        attach.resize(path, 1, 2)
        assert lp.sizes == [(1, 2)]
    finally:
        lp.close()
