"""The plugin executables' entry points, importing only os, sys and _socket so a CNI call starts in milliseconds.

A call is forwarded to the resident helper (cni_plugins.helper) when one listens on the socket; when none
does, the call starts one for the calls that follow and serves itself in-process, so the result never
depends on the helper being there. PYCNI_HELPER=off turns the helper off; PYCNI_HELPER_SOCKET moves it.
"""
import os
import sys

import _socket  # the C module: `socket` would pull in enum and selectors, 6 ms of a call's start-up

DEFAULT_SOCKET = "/run/pycni/helper.sock"
HELPER_ENV = "PYCNI_HELPER"
SOCKET_ENV = "PYCNI_HELPER_SOCKET"


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def encode_request(plugin: str, env: dict, stdin: bytes) -> bytes:
    blob = "\0".join(f"{k}={v}" for k, v in env.items()).encode()
    name = plugin.encode()
    return b"%d %d %d\n" % (len(name), len(blob), len(stdin)) + name + blob + stdin


def _recv_exact(sock: _socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("helper closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv_line(sock: _socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("helper closed the connection")
        line += chunk
    return line


def call_helper(path: str, plugin: str, env: dict, stdin: bytes) -> "tuple[int, bytes] | None":
    """(status, stdout) from the helper, or None when no helper took the request."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
            sock.sendall(encode_request(plugin, env, stdin))
            rc, size = _recv_line(sock).split()
        except OSError:
            return None
        return int(rc), _recv_exact(sock, int(size))
    finally:
        sock.close()


def spawn_helper(path: str) -> None:
    """Starts a detached helper for `path`; it serves later calls and exits when idle."""
    code = (f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
            f"from cni_plugins.helper import main; main({path!r})")
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        return
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 65536)
        os.execv(sys.executable, [sys.executable, "-IS", "-c", code])
    finally:
        os._exit(127)


def main(plugin: str) -> int:
    stdin = sys.stdin.buffer.read()
    env = dict(os.environ)
    netns = env.get("CNI_NETNS")
    if netns and not os.path.isabs(netns):
        env["CNI_NETNS"] = os.path.abspath(netns)
    mode = env.get(HELPER_ENV, "auto")
    if mode != "off":
        path = socket_path()
        reply = call_helper(path, plugin, env, stdin)
        if reply is None and env.get("CNI_COMMAND") not in (None, "VERSION"):
            spawn_helper(path)
        if reply is not None:
            sys.stdout.buffer.write(reply[1])
            return reply[0]
    from cni_plugins.plugins import run
    rc, out = run(plugin, env, stdin)
    sys.stdout.buffer.write(out)
    return rc


def bridge() -> int:
    return main("pybridge")


def host_local() -> int:
    return main("pyhost-local")


def loopback() -> int:
    return main("pyloopback")
