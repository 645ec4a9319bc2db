"""The plugin executables' entry points, importing only os, sys and _socket so a CNI call starts in milliseconds.

A call is forwarded to the resident helper (cni_plugins.helper) of the caller's network namespace when one
listens; when none does, the call starts one for the calls that follow and serves itself in-process, so
the result never depends on the helper being there. The helper listens on an abstract unix socket, which
the kernel scopes to a netns, so a caller only ever reaches the helper of its own netns (see helper.py for
why that matters and for the checks both ends make). PYCNI_HELPER=off turns the helper off;
PYCNI_HELPER_SOCKET renames its socket (a test's own helper).
"""
import _socket  # the C module: `socket` would pull in enum and selectors, 6 ms of a call's start-up
import os
import sys

DEFAULT_NAME = "pycni-helper"
HELPER_ENV = "PYCNI_HELPER"
SOCKET_ENV = "PYCNI_HELPER_SOCKET"
LINE_MAX = 4096
REFUSED = b"refused"
# why a call was not served; the helper sends the last two after REFUSED
ABSENT = "absent"  # nobody listens (or the helper went away mid-call): start one
UNTRUSTED = "untrusted"  # the listener runs as another user: never send it a request, never start one
SKEW = "skew"  # the helper runs other plugin code than ours: it has exited, start one of ours
FOREIGN = "foreign"  # the helper found the caller outside its netns or of another user
RESTART = (ABSENT, SKEW)
PACKAGE = os.path.dirname(os.path.abspath(__file__))


def socket_name() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_NAME


def address(name: str) -> bytes:
    """The abstract socket address of the helper called `name` (in the netns of whoever uses it)."""
    return b"\0" + name.encode()


def code_version() -> str:
    """Identifies the plugin code installed now: path, inode, size and mtime of every module, folded.

    A stat per module (about 0.1 ms for the package), no hashing module to import. An upgrade or an edit
    changes it; the helper takes it before loading the plugins, so it never claims newer code than it has.
    """
    entries = []
    dirs = [PACKAGE]
    while dirs:
        with os.scandir(dirs.pop()) as it:
            for entry in it:
                if entry.name.endswith(".py"):
                    st = entry.stat()
                    entries.append(f"{entry.path} {st.st_ino} {st.st_size} {st.st_mtime_ns}")
                elif entry.name != "__pycache__" and entry.is_dir():
                    dirs.append(entry.path)
    folded = int.from_bytes("\n".join(sorted(entries)).encode(), "big") % ((1 << 61) - 1)
    return f"{folded:016x}"


def encode_request(plugin: str, env: dict, stdin: bytes, version: str) -> bytes:
    blob = "\0".join(f"{k}={v}" for k, v in env.items()).encode()
    name = plugin.encode()
    return b"%d %d %d %s\n" % (len(name), len(blob), len(stdin), version.encode()) + name + blob + stdin


def recv_exact(sock: _socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_line(sock: _socket.socket, limit: int = LINE_MAX) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        if len(line) >= limit:
            raise ValueError(f"no end of line in the first {limit} bytes")
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        line += chunk
    return line


def connect(name: str) -> "tuple[_socket.socket, int] | str":
    """A connection to this netns's helper and the helper's pid, or why there is none (ABSENT, UNTRUSTED).

    An abstract name has no file permissions, so anyone could listen on it: only a listener with our euid
    (SO_PEERCRED) is sent a request.
    """
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(address(name))
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    except OSError:
        sock.close()
        return ABSENT
    if int.from_bytes(cred[4:8], sys.byteorder) != os.geteuid():
        sock.close()
        return UNTRUSTED
    return sock, int.from_bytes(cred[0:4], sys.byteorder)


def call_helper(name: str, plugin: str, env: dict, stdin: bytes) -> "tuple[int, bytes] | str":
    """(status, stdout) from the helper, or why it did not serve the call (ABSENT, UNTRUSTED, SKEW, FOREIGN)."""
    conn = connect(name)
    if isinstance(conn, str):
        return conn
    sock = conn[0]
    try:
        try:
            sock.sendall(encode_request(plugin, env, stdin, code_version()))
            reply = recv_line(sock).split()
        except OSError:
            return ABSENT
        if reply[0] == REFUSED:
            return reply[1].decode()
        rc, size = reply
        return int(rc), recv_exact(sock, int(size))
    finally:
        sock.close()


def spawn_helper(name: str) -> None:
    """Starts a detached helper in this netns; it serves later calls and exits when idle or its netns is gone."""
    code = (f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
            f"from cni_plugins.helper import main; main({name!r})")
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
        name = socket_name()
        reply = call_helper(name, plugin, env, stdin)
        if not isinstance(reply, str):
            sys.stdout.buffer.write(reply[1])
            return reply[0]
        if reply in RESTART and env.get("CNI_COMMAND") not in (None, "VERSION"):
            spawn_helper(name)
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


def portmap() -> int:
    return main("pyportmap")
