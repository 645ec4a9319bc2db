"""supervisor.sock: how the daemon and the streaming server reach a container's stdio, its log and its
terminal, which only the container's supervisor holds.

The supervisor owns the container's pipes (or pty master) for the container's whole life, so that the
output is drained into the CRI log whether or not anyone watches and the daemon can restart without the
container noticing. Everything else goes through this socket (mode 0600 in the supervisor's directory
under the daemon's state dir: only root reaches it). One connection is one request:

    client -> server   a JSON hello line:  {"op": "attach", "stdin": bool, "stdout": bool, "stderr": bool}
                                           {"op": "reopen-log"}
                                           {"op": "resize", "width": int, "height": int}
    server -> client   a JSON reply line:  {"ok": true, "tty": bool}  or  {"error": KIND, "message": str}
                                           (KIND: a pyruntime.errors class name); control ops end here

after which an attach connection carries frames both ways, a 1-byte type, a 4-byte big-endian length,
the payload: STDIN, CLOSE_STDIN (the client's stdin ended) and RESIZE (width, height as two big-endian
u16) from the client, STDOUT and STDERR to it (a tty's output is all STDOUT). The server closes the
connection once the container's output has ended and was sent; the client closes it to detach.

The server never blocks on a client: output is queued per client and a client that falls more than
OUT_LIMIT behind is dropped (the container and its log must not wait for a stuck `kubectl attach`);
a client whose hello or frames are malformed is dropped too. A container's stdin is closed when the
first stdin-attached client's stdin ends if the container asked for stdin_once (not with a tty, as
containerd does: kubectl closes a tty's stdin on every detach). Several clients may be attached at once:
each gets all the output from when it attached, and their stdin is interleaved.
"""
from __future__ import annotations

import errno
import json
import os
import select
import selectors
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from pyruntime import errors

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading

STDIN, STDOUT, STDERR, RESIZE, CLOSE_STDIN = range(5)
FRAME = struct.Struct(">BI")
SIZE = struct.Struct(">HH")
MAX_FRAME = 1 << 20  # a frame's payload; the client sends at most 64 KiB
HELLO_LIMIT = 4096
OUT_LIMIT = 8 << 20  # output queued for one client before it is dropped
STDIN_LIMIT = 1 << 20  # stdin queued for the container before the clients' sockets are no longer read
_UNIX_PATH_MAX = 107  # sun_path's 108 bytes with the terminating NUL

Stream = socket.socket | int


@contextmanager
def unix_address(path: str) -> Iterator[str]:
    """`path` as an address bind/connect accept: a path longer than sun_path (a 64-hex container id under
    the state dir can make one) is reached through an O_PATH descriptor of its directory, which the
    kernel resolves like the directory itself; a forked child inheriting it may use the address too."""
    if len(os.fsencode(path)) <= _UNIX_PATH_MAX:
        yield path
        return
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}"
    finally:
        os.close(dir_fd)


def frame(kind: int, payload: bytes = b"") -> bytes:
    return FRAME.pack(kind, len(payload)) + payload


# client side (the daemon, the streaming server): blocking calls, safe from any thread


def _connect(sock_path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with unix_address(sock_path) as address:
            sock.connect(address)
    except OSError as e:
        sock.close()
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
            raise errors.FailedPreconditionError(
                f"{sock_path}: connect: {e.strerror} (the container's supervisor has exited)") from e
        raise errors.UnavailableError(f"{sock_path}: connect: {e.strerror}") from e
    return sock


def _request(sock_path: str, hello: dict) -> tuple[socket.socket, dict, bytes]:
    """Sends the hello, reads the reply: (the socket, the reply, bytes already read after it)."""
    sock = _connect(sock_path)
    try:
        sock.sendall(json.dumps(hello).encode() + b"\n")
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(4096)
            if not chunk or len(data) > HELLO_LIMIT:
                raise errors.UnavailableError(f"{sock_path}: {hello['op']}: the supervisor closed the connection")
            data += chunk
        line, rest = data.split(b"\n", 1)
        reply = json.loads(line)
        if "error" in reply:
            kind = next((k for k in errors.KINDS if k.__name__ == reply["error"]), errors.InternalError)
            raise kind(reply.get("message", ""))
        return sock, reply, rest
    except BaseException:
        sock.close()
        raise


def reopen_log(sock_path: str) -> None:
    """The supervisor reopens the container's log path (ReopenContainerLog, after the kubelet renamed it)."""
    sock, _, _ = _request(sock_path, {"op": "reopen-log"})
    sock.close()


def resize(sock_path: str, width: int, height: int) -> None:
    """Sets the size of the container's terminal (no effect without one)."""
    sock, _, _ = _request(sock_path, {"op": "resize", "width": width, "height": height})
    sock.close()


def _fd(stream: Stream) -> int:
    return stream if isinstance(stream, int) else stream.fileno()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _send_resizes(sock: socket.socket, lock: threading.Lock, sizes: Any, done: threading.Event) -> None:
    def send(size: tuple[int, int] | None) -> None:
        if size:
            with lock:
                sock.sendall(frame(RESIZE, SIZE.pack(*size)))
    try:
        if hasattr(sizes, "get"):  # a queue: polled, so the thread ends with the attach
            import queue
            while not done.is_set():
                try:
                    send(sizes.get(timeout=0.1))
                except queue.Empty:
                    continue
        else:
            for size in sizes:
                if done.is_set():
                    break
                send(size)
    except OSError:
        pass  # the connection ended: the attach returns on its own


def attach(sock_path: str, *, stdin: Stream | None = None, stdout: Stream | None = None,
           stderr: Stream | None = None, tty: bool = False,
           resize: Iterable[tuple[int, int]] | Any | None = None) -> None:
    """Connects the caller's streams to the container's: `stdin` is read until EOF (then the container's
    stdin closes if it is stdin_once), the container's output is written to `stdout`/`stderr` (None: not
    wanted; with a tty, all output goes to stdout). Each stream is a socket or a file descriptor.
    `resize`, with `tty`: (width, height) sizes for the terminal, as a queue.Queue (polled) or an iterable
    (read by a helper thread; it should end when the caller's stream ends). Returns when the container's
    output has ended or `stdout`/`stderr` can no longer be written (the client went away)."""
    sock, reply, rest = _request(sock_path, {"op": "attach", "stdin": stdin is not None,
                                             "stdout": stdout is not None, "stderr": stderr is not None})
    import threading  # here: the supervisors, which import this module for its server, have no threads
    lock, done = threading.Lock(), threading.Event()
    helper = None
    if tty and resize is not None and reply.get("tty"):
        helper = threading.Thread(target=_send_resizes, args=(sock, lock, resize, done), daemon=True,
                                  name=f"attach-resize {os.path.basename(os.path.dirname(sock_path))}")
        helper.start()
    # poll, not a selector: an output registered for no event still reports POLLHUP/POLLERR, which is how
    # a client that went away (a closed socket or pipe reader) is noticed while the container is silent
    poller = select.poll()
    stdin_fd = _fd(stdin) if stdin is not None else None
    outputs = {_fd(t) for t in (stdout, stderr) if t is not None}

    def watch(fd: int) -> None:
        poller.register(fd, (select.POLLIN if fd in (sock.fileno(), stdin_fd) else 0))
    for fd in {sock.fileno(), *outputs, *([stdin_fd] if stdin_fd is not None else [])}:
        watch(fd)
    targets = {STDOUT: stdout, STDERR: stderr}
    buf = bytearray(rest)
    try:
        while True:
            while len(buf) >= FRAME.size:
                kind, size = FRAME.unpack_from(buf)
                if len(buf) < FRAME.size + size:
                    break
                target = targets.get(kind)
                if target is not None:
                    try:
                        _write_all(_fd(target), bytes(buf[FRAME.size:FRAME.size + size]))
                    except OSError:
                        return  # the client went away
                del buf[:FRAME.size + size]
            for fd, events in poller.poll():
                if fd == sock.fileno():
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        return  # the output ended
                    buf += chunk
                elif fd == stdin_fd:
                    try:
                        data = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    with lock:
                        sock.sendall(frame(STDIN, data) if data else frame(CLOSE_STDIN))
                    if not data:
                        stdin_fd = None
                        poller.unregister(fd)
                        if fd in outputs:
                            watch(fd)
                elif events & (select.POLLHUP | select.POLLERR):
                    return  # the client went away
    except (BrokenPipeError, ConnectionResetError):
        return  # the supervisor went away with the container
    finally:
        done.set()
        with lock:
            sock.close()
        if helper is not None:
            helper.join(timeout=1)


# server side (the supervisor's single-threaded loop)


class _Conn:
    __slots__ = ("attached", "close_when_sent", "events", "inbuf", "outbuf", "sock", "stderr", "stdin", "stdout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.attached = self.stdout = self.stderr = self.stdin = self.close_when_sent = False
        self.events = 0


class AttachServer:
    """The listening supervisor.sock inside the supervisor's selector loop: callbacks are registered as
    the selector keys' data, `handler(mask)`. `stdin_fd`: the write end of the container's stdin (with a
    tty, a dup of the pty master, as the selector takes each descriptor once), non-blocking, owned by the
    server from now on; None: no stdin.
    `on_reopen()` and `on_resize(width, height)` raise a pyruntime error to fail the request."""

    def __init__(self, path: str, sel: selectors.BaseSelector, *, tty: bool, stdin_fd: int | None,
                 stdin_once: bool, on_reopen: Callable[[], None], on_resize: Callable[[int, int], None]) -> None:
        self.path, self.sel, self.tty = path, sel, tty
        self.stdin_once, self.on_reopen, self.on_resize = stdin_once, on_reopen, on_resize
        self.has_stdin = stdin_fd is not None
        self._stdin_fd = stdin_fd
        self._stdin_buf = bytearray()
        self._stdin_closing = False
        self._stdin_registered = False
        self._paused = False
        self._ended = False
        self._conns: set[_Conn] = set()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        umask = os.umask(0o177)  # the socket file is made 0600 (the supervisor has no other thread)
        try:
            with unix_address(path) as address:
                self.listener.bind(address)
            self.listener.listen(16)
        except OSError:
            self.listener.close()
            raise
        finally:
            os.umask(umask)
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ, self._accept)

    # output

    def broadcast(self, kind: int, data: bytes) -> None:
        """Queues the container's output to every client that asked for this stream."""
        packet = frame(kind, data)
        for conn in list(self._conns):
            if conn.attached and (conn.stdout if kind == STDOUT else conn.stderr):
                self._send(conn, packet)

    def end_output(self) -> None:
        """The container's output ended: each attached client is closed once its queue is sent, and later
        ones at once (after their reply)."""
        self._ended = True
        for conn in list(self._conns):
            if conn.attached:
                conn.close_when_sent = True
                self._send(conn, b"")

    def sending(self) -> bool:
        return any(conn.outbuf for conn in self._conns)

    def close(self) -> None:
        for conn in list(self._conns):
            self._drop(conn)
        self.sel.unregister(self.listener)
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self._close_stdin()

    # connections

    def _accept(self, _mask: int) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        conn = _Conn(sock)
        self._conns.add(conn)
        self._update(conn)

    def _update(self, conn: _Conn) -> None:
        want = (0 if self._paused and conn.attached else selectors.EVENT_READ)
        if conn.outbuf:
            want |= selectors.EVENT_WRITE
        if want == conn.events:
            return
        if conn.events and want:
            self.sel.modify(conn.sock, want, lambda mask, c=conn: self._ready(c, mask))
        elif want:
            self.sel.register(conn.sock, want, lambda mask, c=conn: self._ready(c, mask))
        else:
            self.sel.unregister(conn.sock)
        conn.events = want

    def _ready(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._send(conn, b"")
        if mask & selectors.EVENT_READ and conn in self._conns:
            try:
                data = conn.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                return
            conn.inbuf += data
            if conn.attached:
                self._frames(conn)
            else:
                self._hello(conn)

    def _send(self, conn: _Conn, data: bytes) -> None:
        conn.outbuf += data
        if len(conn.outbuf) > OUT_LIMIT:
            self._drop(conn)
            return
        try:
            while conn.outbuf:
                sent = conn.sock.send(conn.outbuf)
                del conn.outbuf[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(conn)
            return
        if not conn.outbuf and conn.close_when_sent:
            self._drop(conn)
            return
        self._update(conn)

    def _drop(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        if conn.events:
            self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn.stdin:
            self._stdin_ended(conn)

    def _reply(self, conn: _Conn, reply: dict, close: bool) -> None:
        conn.close_when_sent = close
        self._send(conn, json.dumps(reply).encode() + b"\n")

    def _hello(self, conn: _Conn) -> None:
        if b"\n" not in conn.inbuf:
            if len(conn.inbuf) > HELLO_LIMIT:
                self._drop(conn)
            return
        line, rest = bytes(conn.inbuf).split(b"\n", 1)
        conn.inbuf = bytearray(rest)
        try:
            hello = json.loads(line)
            op = hello["op"]
            if op == "attach":
                if hello.get("stdin") and not self.has_stdin:
                    raise errors.InvalidArgumentError("stdin: the container was not created with stdin")
                conn.attached = True
                conn.stdout, conn.stderr = bool(hello.get("stdout")), bool(hello.get("stderr"))
                conn.stdin = bool(hello.get("stdin")) and self._stdin_fd is not None
                self._reply(conn, {"ok": True, "tty": self.tty}, close=self._ended)
                if conn in self._conns and conn.inbuf:
                    self._frames(conn)
                return
            if op == "reopen-log":
                self.on_reopen()
            elif op == "resize":
                self.on_resize(int(hello["width"]), int(hello["height"]))
            else:
                raise errors.InvalidArgumentError(f"op: unknown operation {op!r}")
        except errors.PyRuntimeError as e:
            self._reply(conn, {"error": errors.kind_of(e).__name__, "message": str(e)}, close=True)
            return
        except (ValueError, KeyError, TypeError) as e:
            self._reply(conn, {"error": "InvalidArgumentError", "message": f"hello: malformed: {e}"}, close=True)
            return
        self._reply(conn, {"ok": True}, close=True)

    def _frames(self, conn: _Conn) -> None:
        buf = conn.inbuf
        while len(buf) >= FRAME.size and conn in self._conns:
            kind, size = FRAME.unpack_from(buf)
            if size > MAX_FRAME:
                self._drop(conn)
                return
            if len(buf) < FRAME.size + size:
                return
            payload = bytes(buf[FRAME.size:FRAME.size + size])
            del buf[:FRAME.size + size]
            if kind == STDIN:
                if conn.stdin:
                    self._write_stdin(payload)
            elif kind == CLOSE_STDIN:
                if conn.stdin:
                    self._stdin_ended(conn)
            elif kind == RESIZE and size == SIZE.size:
                try:
                    self.on_resize(*SIZE.unpack(payload))
                except errors.PyRuntimeError:
                    pass  # a resize that fails (the terminal is gone) is not worth dropping the client for
            else:
                self._drop(conn)
                return

    # the container's stdin

    def _stdin_ended(self, conn: _Conn) -> None:
        conn.stdin = False
        if self.stdin_once and not self.tty:
            self._stdin_closing = True
            self._flush_stdin(0)

    def _write_stdin(self, data: bytes) -> None:
        if self._stdin_fd is None or self._stdin_closing:
            return
        self._stdin_buf += data
        self._flush_stdin(0)

    def _flush_stdin(self, _mask: int) -> None:
        fd = self._stdin_fd
        if fd is None:
            return
        try:
            while self._stdin_buf:
                del self._stdin_buf[:os.write(fd, self._stdin_buf)]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the container closed its stdin (or exited): what it would have read is dropped
            self._stdin_buf.clear()
            self._close_stdin()
            return
        if not self._stdin_buf and self._stdin_closing:
            self._close_stdin()
            return
        want_write = bool(self._stdin_buf)
        if want_write != self._stdin_registered:
            if want_write:
                self.sel.register(fd, selectors.EVENT_WRITE, self._flush_stdin)
            else:
                self.sel.unregister(fd)
            self._stdin_registered = want_write
        self._set_paused(len(self._stdin_buf) > STDIN_LIMIT)

    def _close_stdin(self) -> None:
        fd, self._stdin_fd = self._stdin_fd, None
        if fd is None:
            return
        if self._stdin_registered:
            self.sel.unregister(fd)
            self._stdin_registered = False
        self._stdin_buf.clear()
        self._set_paused(False)
        os.close(fd)
        for conn in self._conns:
            conn.stdin = False

    def _set_paused(self, paused: bool) -> None:
        if paused != self._paused:
            self._paused = paused
            for conn in list(self._conns):
                self._update(conn)
