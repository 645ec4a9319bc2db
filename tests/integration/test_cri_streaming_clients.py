"""The CRI streaming server against client-go's own executors and port forwarder (the code inside crictl
and kubectl: scripts/peers/streamclient), over SPDY and websockets, with a fake backend: what crosses
the wire is what a real exec, attach or port forward gets, without containers."""
from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from proto import api_pb2
from pyruntime.cri.streaming.server import StreamingServer
from pyruntime.errors import NotFoundError, UnavailableError

CLIENT = Path(os.environ.get("PEERS_BIN", Path.home() / ".cache/pynode/bin")) / "streamclient"
pytestmark = pytest.mark.skipif(not CLIENT.exists(), reason="needs scripts/peers/streamclient.sh (make peers)")
TRANSPORTS = ["spdy", "websocket"]


def _copy(src: int, dst: int) -> None:
    while data := os.read(src, 65536):
        os.write(dst, data)


class FakeBackend:
    """exec `exit N` prints out/err and exits N; `cat` echoes stdin; `sizes N` prints N terminal sizes;
    container "missing" does not exist. Port 9 refuses, any other port reaches `echo_port`."""

    def __init__(self, echo_port: int) -> None:
        self.echo_port = echo_port
        self.calls: list[tuple] = []

    def exec(self, container_id, cmd, *, tty, stdin, stdout, stderr, resize):
        self.calls.append(("exec", container_id, cmd, tty))
        if container_id == "missing":
            raise NotFoundError(f"container {container_id}: not found")
        if cmd[0] == "exit":
            if stdout is not None:
                os.write(stdout, b"out\n")
            if stderr is not None:
                os.write(stderr, b"err\n")
            return int(cmd[1])
        if cmd[0] == "cat":
            _copy(stdin, stdout)
            return 0
        if cmd[0] == "sizes":
            for _ in range(int(cmd[1])):
                width, height = resize()
                os.write(stdout, f"{width}x{height}\n".encode())
            return 0
        return 127

    def attach(self, container_id, *, tty, stdin, stdout, stderr, resize):
        self.calls.append(("attach", container_id, tty))
        _copy(stdin, stdout)

    def port_forward(self, sandbox_id, port):
        self.calls.append(("port_forward", sandbox_id, port))
        if port == 9:
            raise UnavailableError(f"port forward to pod {sandbox_id} port {port}: connection refused")
        return socket.create_connection(("127.0.0.1", self.echo_port))


@pytest.fixture
def echo_server():
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join()


@pytest.fixture
def server(echo_server):
    threads_before = threading.active_count()
    backend = FakeBackend(echo_server)
    srv = StreamingServer("127.0.0.1:0", backend)
    srv.start()
    srv.backend = backend  # type: ignore[attr-defined]  # the tests look at the calls
    yield srv
    srv.stop()
    assert threading.active_count() == threads_before, threading.enumerate()  # every session's thread ended


def run_exec(url: str, transport: str, *flags: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([str(CLIENT), "exec", url, transport, *flags], input=stdin, capture_output=True,
                          timeout=60)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exec_exit_code_and_streams(server, transport):
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["exit", "3"], stdout=True,
                                              stderr=True)).url
    assert url.startswith(server.base_url + "/exec/")
    proc = run_exec(url, transport)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == b"out\n"
    assert proc.stderr.startswith(b"err\n")
    assert b"exit code 3: command terminated with exit code 3" in proc.stderr  # client-go's words from the status


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exec_success_and_stdin(server, transport):
    data = os.urandom(3 << 20)  # well past every buffer on the way
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["cat"], stdin=True, stdout=True)).url
    proc = run_exec(url, transport, "-stdin", stdin=data)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exec_tty_resize(server, transport):
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["sizes", "2"], tty=True, stdout=True)).url
    proc = run_exec(url, transport, "-tty", "-resize", "80x24,132x43")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"80x24\n132x43\n"
    assert server.backend.calls == [("exec", "c1", ["sizes", "2"], True)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exec_backend_error_is_internal_error(server, transport):
    url = server.get_exec(api_pb2.ExecRequest(container_id="missing", cmd=["true"], stdout=True)).url
    proc = run_exec(url, transport)
    assert proc.returncode == 100
    assert b"Internal error occurred: error executing command in container: container missing: not found" \
        in proc.stderr


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_attach(server, transport):
    url = server.get_attach(api_pb2.AttachRequest(container_id="c2", stdin=True, stdout=True)).url
    proc = run_exec(url, transport, "-stdin", stdin=b"hello\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"hello\n"
    assert server.backend.calls == [("attach", "c2", False)]


def test_token_is_one_shot(server):
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["exit", "0"], stdout=True,
                                              stderr=True)).url
    assert run_exec(url, "spdy").returncode == 0
    proc = run_exec(url, "spdy")
    assert proc.returncode == 100
    assert b"404" in proc.stderr or b"not found" in proc.stderr.lower()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_port_forward(server, transport):
    url = server.get_port_forward(api_pb2.PortForwardRequest(pod_sandbox_id="pod1", port=[8080])).url
    proc = subprocess.Popen([str(CLIENT), "portforward", url, transport, "0:8080", "0:9"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline().decode().split()
        assert line[0] == "ready", proc.stderr.read() if proc.poll() is not None else line
        good, bad = int(line[1]), int(line[2])
        for _ in range(2):  # two connections through one session
            with socket.create_connection(("127.0.0.1", good), timeout=10) as conn:
                payload = os.urandom(1 << 20)
                sender = threading.Thread(target=conn.sendall, args=(payload,))
                sender.start()
                got = b""
                while len(got) < len(payload):
                    chunk = conn.recv(65536)
                    assert chunk
                    got += chunk
                sender.join()
                assert got == payload
        with socket.create_connection(("127.0.0.1", bad), timeout=10) as conn:
            conn.sendall(b"x")
            try:
                assert conn.recv(10) == b""
            except ConnectionResetError:
                pass
        proc.wait(timeout=30)  # stdin still open: the client ends on its own
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    # client-go drops the whole session after a failed connection (kubectl's "lost connection to pod")
    assert proc.returncode == 100 and b"lost connection to pod" in err, err
    assert b"error forwarding port 9 to pod pod1, uid : port forward to pod pod1 port 9: connection refused" in err
    assert [c for c in server.backend.calls if c[2] == 8080] == [("port_forward", "pod1", 8080)] * 2


@pytest.mark.parametrize("protocol", ["v3.channel.k8s.io", "v2.channel.k8s.io"])
def test_exec_older_spdy_protocols(server, protocol):
    """Before v4 the error stream carries only a failure's message: client-go reports it as an error."""
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["exit", "4"], stdout=True, stderr=True)).url
    proc = run_exec(url, "spdy", "-protocol", protocol)
    assert proc.returncode == 100
    assert proc.stdout == b"out\n"
    assert b"error executing command [exit 4], exit code 4" in proc.stderr
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["exit", "0"], stdout=True, stderr=True)).url
    assert run_exec(url, "spdy", "-protocol", protocol).returncode == 0


def test_exec_v1_gets_no_status(server):
    """The kubelet resets a channel.k8s.io client's error stream at once: it never learns an exit code."""
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["exit", "4"], stdout=True, stderr=True)).url
    proc = run_exec(url, "spdy", "-protocol", "channel.k8s.io")
    assert (proc.returncode, proc.stdout) == (0, b"out\n"), proc.stderr


def test_exec_v3_tty_resize(server):
    url = server.get_exec(api_pb2.ExecRequest(container_id="c1", cmd=["sizes", "1"], tty=True, stdout=True)).url
    proc = run_exec(url, "spdy", "-tty", "-resize", "100x50", "-protocol", "v3.channel.k8s.io")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"100x50\n"
