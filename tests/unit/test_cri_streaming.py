"""The streaming server's pure parts: SPDY/3.1 framing against byte vectors (one captured from
client-go's executor), the one-shot token cache, the status JSON that kubectl and crictl parse, the
resize stream, and the HTTP answers to bad requests."""
from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
import zlib

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, TextMessage
from wsproto.events import Request as WsRequest

from proto import api_pb2
from pyruntime.cri.streaming import remotecommand, spdy
from pyruntime.cri.streaming.httpstream import Inbox
from pyruntime.cri.streaming.server import RequestCache, StreamingServer
from pyruntime.errors import InvalidArgumentError, UnavailableError

# client-go v0.37.2's SPDY executor: its first frame after the upgrade, SYN_STREAM 1 {streamtype: error}
CLIENT_GO_SYN_STREAM = bytes.fromhex(
    "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a6800000000ffff")


def test_dictionary_is_spdy3s():
    assert len(spdy.DICTIONARY) == 1423
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert b"\x00\x00\x00\x06200 OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1" in spdy.DICTIONARY
    assert spdy.DICTIONARY.endswith(b"charset=iso-8859-1,utf-,*,enq=0.")


def test_decodes_client_go_syn_stream():
    framer = spdy.Framer()
    # byte by byte: a frame split anywhere waits for the rest
    frames = [f for b in CLIENT_GO_SYN_STREAM for f in framer.feed(bytes([b]))]
    assert frames == [spdy.SynStream(1, {"streamtype": ["error"]})]


FIXED: list[tuple[spdy.Frame, str]] = [
    (spdy.Data(1, b"hi", spdy.FLAG_FIN), "00000001 01000002 6869"),
    (spdy.RstStream(3, spdy.CANCEL), "80030003 00000008 00000003 00000005"),
    (spdy.Ping(7), "80030006 00000004 00000007"),
    (spdy.GoAway(5), "80030007 00000008 00000005 00000000"),
    (spdy.Settings([(0, 7, 65536)]), "80030004 0000000c 00000001 00000007 00010000"),
    (spdy.WindowUpdate(1, 1024), "80030009 00000008 00000001 00000400"),
]


@pytest.mark.parametrize("frame, wire", FIXED)
def test_fixed_frames(frame: spdy.Frame, wire: str):
    raw = bytes.fromhex(wire.replace(" ", ""))
    assert spdy.Framer().encode(frame) == raw
    assert spdy.Framer().feed(raw) == [frame]


def test_header_frames_round_trip_and_share_one_zlib_stream():
    a, b = spdy.Framer(), spdy.Framer()
    frames: list[spdy.Frame] = [
        spdy.SynReply(1, {}), spdy.SynStream(3, {"port": ["80"], "streamtype": ["data"], "x": ["1", "2"]}),
        spdy.HeadersFrame(3, {"a": ["b"]}, spdy.FLAG_FIN)]
    wire = b"".join(a.encode(f) for f in frames)
    assert b.feed(wire) == frames
    assert b.feed(a.encode(spdy.SynReply(5, {"port": ["80"]}))) == [spdy.SynReply(5, {"port": ["80"]})]


def test_header_block_as_the_spec_lays_it_out():
    block = spdy.encode_header_block({"Port": ["80"], "v": ["a", "b"]})
    assert block == bytes.fromhex("00000002" "00000004") + b"port" + bytes.fromhex("00000002") + b"80" + \
        bytes.fromhex("00000001") + b"v" + bytes.fromhex("00000003") + b"a\0b"
    assert spdy.decode_header_block(block) == {"port": ["80"], "v": ["a", "b"]}


def _compressed_syn_stream(block: bytes) -> bytes:
    deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
    body = bytes.fromhex("00000001 00000000 0000".replace(" ", "")) + deflate.compress(block) + \
        deflate.flush(zlib.Z_SYNC_FLUSH)
    return bytes.fromhex("80030001") + len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("wire, message", [
    (bytes.fromhex("80020001 00000000".replace(" ", "")), "version 2"),
    (bytes.fromhex("80030003 00000004 00000001".replace(" ", "")), "RST_STREAM frame: 4 bytes"),
    (bytes.fromhex("80030004 00000004 00000010".replace(" ", "")), "16 entries"),
    (_compressed_syn_stream(bytes.fromhex("00000001 00000004".replace(" ", "")) + b"Port" + b"\0\0\0\0"),
     "not lower case"),
    (_compressed_syn_stream(bytes.fromhex("00000001 000000ff".replace(" ", "")) + b"x"), "overruns"),
    (bytes.fromhex("80030001 0000000e 00000001 00000000 0000".replace(" ", "")) + b"junk", "does not decompress"),
])
def test_malformed_frames_are_spdy_errors(wire, message):
    with pytest.raises(spdy.SpdyError, match=message):
        spdy.Framer().feed(wire)


def test_header_bomb_is_refused():
    huge = spdy.encode_header_block({"x": ["a" * (spdy.MAX_HEADER_BLOCK + 10)]})
    with pytest.raises(spdy.SpdyError, match="larger than"):
        spdy.Framer().feed(_compressed_syn_stream(huge))


def test_unknown_control_frames_are_skipped():
    wire = bytes.fromhex("8003000a 00000002 abcd".replace(" ", "")) + spdy.Framer().encode(spdy.Ping(1))
    assert spdy.Framer().feed(wire) == [spdy.Ping(1)]


# --- token cache ------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tokens_are_one_shot_and_expire():
    clock = Clock()
    cache = RequestCache(clock=clock)
    token = cache.insert("a")
    assert len(token) == 8 and token.replace("-", "").replace("_", "").isalnum()
    assert cache.consume(token) == "a"
    assert cache.consume(token) is None
    late = cache.insert("b")
    clock.now += 60.5
    assert cache.consume(late) is None
    assert cache.consume("nonsense") is None


def test_in_flight_tokens_are_bounded_and_expired_ones_make_room():
    clock = Clock()
    cache = RequestCache(max_in_flight=3, clock=clock)
    for i in range(3):
        cache.insert(i)
    with pytest.raises(UnavailableError, match="maximum number of in-flight requests exceeded"):
        cache.insert(3)
    clock.now += 61
    assert cache.consume(cache.insert(4)) == 4


# --- status JSON ------------------------------------------------------------------------------------

def test_exit_status_is_the_kubelets_json():
    assert remotecommand.go_json(remotecommand.exit_status(["sh", "-c", "exit 3"], 3)) == (
        b'{"status":"Failure","message":"command terminated with non-zero exit code: error executing command '
        b'[sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode",'
        b'"message":"3"}]}}')
    assert remotecommand.go_json(remotecommand.SUCCESS) == b'{"status":"Success"}'
    assert remotecommand.go_json(remotecommand.internal_error("boom <&>")) == (
        b'{"status":"Failure","message":"Internal error occurred: boom \\u003c\\u0026\\u003e",'
        b'"reason":"InternalError","code":500}')


def test_v1_to_v3_status_is_the_failure_message_only():
    written: list[bytes] = []
    write = remotecommand.status_writer(written.append, v4=False)
    write(remotecommand.SUCCESS)
    write(remotecommand.exit_status(["false"], 1))
    assert written == [b"command terminated with non-zero exit code: error executing command [false], exit code 1"]
    v4: list[bytes] = []
    remotecommand.status_writer(v4.append, v4=True)(remotecommand.SUCCESS)
    assert json.loads(v4[0]) == {"status": "Success"}


def test_resize_stream_parses_concatenated_json():
    inbox = Inbox()
    for part in (b'{"Width":80,"Height":24}{"Wid', b'th":100, "Height":30}\n', b'[1]', b'{"Width":1,"Height":2}'):
        inbox.put(part)
    inbox.finish()
    next_size = remotecommand.resize_source(inbox)
    assert [next_size(), next_size(), next_size(), next_size()] == [(80, 24), (100, 30), (1, 2), None]
    assert remotecommand.resize_source(None)() is None


# --- the CRI calls and the HTTP answers -------------------------------------------------------------

@pytest.fixture
def server():
    srv = StreamingServer("127.0.0.1:0", backend=None)  # type: ignore[arg-type]  # no session gets that far
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("req, message", [
    (api_pb2.ExecRequest(cmd=["ls"], stdout=True), r"exec\.container_id"),
    (api_pb2.ExecRequest(container_id="c", cmd=["ls"], tty=True, stderr=True), "tty and stderr"),
    (api_pb2.ExecRequest(container_id="c", cmd=["ls"]), "one of stdin, stdout, or stderr"),
    (api_pb2.ExecRequest(container_id="c", stdout=True), r"exec\.cmd"),
])
def test_bad_exec_requests(server, req, message):
    with pytest.raises(InvalidArgumentError, match=message):
        server.get_exec(req)


def test_bad_attach_and_port_forward_requests(server):
    with pytest.raises(InvalidArgumentError, match=r"attach\.container_id"):
        server.get_attach(api_pb2.AttachRequest(stdout=True))
    with pytest.raises(InvalidArgumentError, match="pod_sandbox_id"):
        server.get_port_forward(api_pb2.PortForwardRequest(port=[80]))


def test_bad_address():
    with pytest.raises(InvalidArgumentError, match="not HOST:PORT"):
        StreamingServer("localhost", backend=None)  # type: ignore[arg-type]  # never started


def _http(server: StreamingServer, request: str) -> bytes:
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request.encode())
        out = b""
        while data := conn.recv(65536):
            out += data
    return out


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def test_unknown_or_used_token_is_404(server):
    assert _http(server, "GET /exec/nope HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert _http(server, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    url = server.get_port_forward(api_pb2.PortForwardRequest(pod_sandbox_id="p", port=[80])).url
    # a port-forward token does not open an exec
    assert _http(server, f"GET {_path(url).replace('portforward', 'exec')} HTTP/1.1\r\nHost: x\r\n\r\n") \
        .startswith(b"HTTP/1.1 404 ")


def test_spdy_handshake_errors(server):
    def exec_url() -> str:
        return _path(server.get_exec(api_pb2.ExecRequest(container_id="c", cmd=["ls"], stdout=True)).url)

    answer = _http(server, f"POST {exec_url()} HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"X-Stream-Protocol-Version does not exist" in answer
    answer = _http(server, f"POST {exec_url()} HTTP/1.1\r\nHost: x\r\nX-Stream-Protocol-Version: v9\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"x-accepted-stream-protocol-versions: v4.channel.k8s.io" in answer.lower()
    answer = _http(server, f"POST {exec_url()} HTTP/1.1\r\nHost: x\r\nX-Stream-Protocol-Version: channel.k8s.io"
                           "\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"missing upgrade headers" in answer


def test_garbage_is_a_400(server):
    assert _http(server, "NOT HTTP\r\n\r\n").startswith(b"HTTP/1.1 400 ")


# --- the websocket protocols client-go no longer speaks (older kubectl, other clients) ---------------

class EchoBackend:
    """exec: echoes one read of stdin to stdout, exits 2 (before v5 a client can't end stdin alone);
    port_forward: a socketpair whose far end echoes."""

    def exec(self, container_id, cmd, *, tty, stdin, stdout, stderr, resize):
        os.write(stdout, os.read(stdin, 65536))
        return 2

    def port_forward(self, sandbox_id, port):
        if port == 9:
            raise UnavailableError("connection refused")
        ours, theirs = socket.socketpair()

        def echo() -> None:
            with theirs:
                while data := theirs.recv(65536):
                    theirs.sendall(data)
        threading.Thread(target=echo, daemon=True).start()
        return ours


class WsClient:
    def __init__(self, url: str, protocol: str) -> None:
        host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(WsRequest(host=host, target="/" + url.split("/", 3)[3],
                                                 subprotocols=[protocol])))
        self.messages: list[bytes | str] = []
        self.accepted: AcceptConnection | None = None
        self.closed = False
        while self.accepted is None:
            self._pump()

    def _pump(self) -> None:
        data = self.sock.recv(65536)
        self.ws.receive_data(data or None)
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                self.accepted = event
            elif isinstance(event, (BytesMessage, TextMessage)):
                self.messages.append(bytes(event.data) if isinstance(event, BytesMessage) else event.data)
            elif isinstance(event, CloseConnection):
                self.closed = True
                if self.ws.state.name == "REMOTE_CLOSING":
                    self.sock.sendall(self.ws.send(event.response()))
        if not data:
            self.closed = True

    def send(self, data: bytes | str) -> None:
        self.sock.sendall(self.ws.send(BytesMessage(data=data) if isinstance(data, bytes) else TextMessage(data=data)))

    def until_closed(self) -> list[bytes | str]:
        while not self.closed:
            self._pump()
        self.sock.close()
        return self.messages


@pytest.fixture
def echo_server():
    threads_before = threading.active_count()
    srv = StreamingServer("127.0.0.1:0", EchoBackend())  # type: ignore[arg-type]  # exec and port_forward only
    srv.start()
    yield srv
    srv.stop()
    # a session's copying threads end once their sockets close, just after stop() joined the session
    deadline = time.monotonic() + 5
    while threading.active_count() != threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads_before, threading.enumerate()


def test_websocket_v4_base64_exec(echo_server):
    url = echo_server.get_exec(api_pb2.ExecRequest(container_id="c", cmd=["cat"], stdin=True, stdout=True)).url
    client = WsClient(url, "v4.base64.channel.k8s.io")
    assert client.accepted is not None and client.accepted.subprotocol == "v4.base64.channel.k8s.io"
    client.send("0" + base64.b64encode(b"hi there").decode())
    messages = client.until_closed()
    assert messages[0] == "1"  # the kubelet's opening empty stdout frame
    assert "1" + base64.b64encode(b"hi there").decode() in messages
    status = json.loads(base64.b64decode(messages[-1][1:]))
    assert messages[-1][0] == "3" and status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "2"}]


def test_websocket_v4_port_forward(echo_server):
    url = echo_server.get_port_forward(api_pb2.PortForwardRequest(pod_sandbox_id="p", port=[80, 9])).url
    client = WsClient(url, "v4.channel.k8s.io")
    while len(client.messages) < 4:
        client._pump()
    port80, port9 = struct.pack("<H", 80), struct.pack("<H", 9)
    assert sorted(client.messages[:4]) == sorted([b"\0" + port80, b"\1" + port80, b"\2" + port9, b"\3" + port9])
    client.send(b"\0ping")
    refused = b"\3error forwarding port 9 to pod p, uid : connection refused"
    while b"\0ping" not in client.messages or refused not in client.messages:
        client._pump()
    client.sock.sendall(client.ws.send(CloseConnection(code=1000)))
    client.until_closed()


# --- deadlines ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["exec", "portforward"])
def test_a_silent_session_is_ended_after_the_idle_timeout(kind):
    """Issue 22: a session had no idle timeout, so a client that opened an exec or a port-forward and then
    said nothing (or vanished without a FIN) held the session, its thread and the container's process
    for ever. Now one with no traffic for the idle timeout (containerd's stream_idle_timeout) is closed."""
    idle = 1.0
    threads_before = threading.active_count()
    srv = StreamingServer("127.0.0.1:0", EchoBackend(), idle_timeout=idle)  # type: ignore[arg-type]  # exec and port_forward only
    srv.start()
    try:
        if kind == "exec":
            url = srv.get_exec(api_pb2.ExecRequest(container_id="c", cmd=["cat"], stdin=True, stdout=True)).url
        else:
            url = srv.get_port_forward(api_pb2.PortForwardRequest(pod_sandbox_id="p", port=[80])).url
        client = WsClient(url, "v4.channel.k8s.io")
        client.sock.settimeout(10 * idle)
        client.until_closed()  # a TimeoutError here: the session outlived its idle timeout ten times over
    finally:
        srv.stop()
    deadline = time.monotonic() + 5
    while threading.active_count() != threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads_before, threading.enumerate()


def test_a_request_head_dripped_a_byte_at_a_time_is_cut_at_the_header_timeout(monkeypatch):
    """The head had a timeout per read: a client dripping it held its thread for as long as it liked."""
    from pyruntime.cri.streaming import server as server_module

    monkeypatch.setattr(server_module, "HEADER_TIMEOUT", 1.0)
    srv = StreamingServer("127.0.0.1:0", backend=None)  # type: ignore[arg-type]  # no session gets that far
    srv.start()
    host, port = srv.base_url.removeprefix("http://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            head = b"GET /exec/x HTTP/1.1\r\nHost: x\r\nX-Drip: " + b"a" * 4000
            started = time.monotonic()
            for i in range(len(head)):
                try:
                    conn.sendall(head[i:i + 1])
                except OSError:
                    break  # the server closed it
                time.sleep(0.1)
                if time.monotonic() - started > 10 * 1.0:
                    pytest.fail("the server kept reading a head dripped past its header timeout")
    finally:
        srv.stop()
