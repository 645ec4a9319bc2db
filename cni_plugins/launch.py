"""The plugin executables' entry points, importing only os, sys and built-in C modules (_socket, _signal,
errno) so a CNI call starts in milliseconds.

A call is forwarded to the resident helper (cni_plugins.helper) of the caller's network namespace when one
listens; when none does, the call starts one for the calls that follow and serves itself in-process, so
the result never depends on the helper being there. PYCNI_HELPER=off turns the helper off;
PYCNI_HELPER_SOCKET renames its socket (a test's own helper), PYCNI_HELPER_DIR moves its directory.

Threat model. Any uid-0 process in the node's netns may try to reach the helper or to pose as it: a
hostNetwork root pod shares the netns (so an abstract socket would be open to it) but has a mount
namespace of its own. So the helper's socket is a file named after the netns inode in a directory that
must be ours (lstat: a real directory, our euid, mode 0700), which a pod reaches only through a hostPath
mount; and each end checks the other with SO_PEERCRED (peer_refusal): our euid, our mount namespace, our
netns and our interpreter, read race-free through a pidfd. A launcher that finds anything it did not
verify (a foreign directory or socket file, a listener of another user or mount namespace: a squatter)
sends it nothing and serves the call in-process, as it does when no helper runs.
"""
import _signal  # loaded by the interpreter already; `signal` would pull in enum
import _socket  # the C module: `socket` would pull in enum and selectors at every call's start
import errno
import os
import sys

from pynode_os.proc import stat_fields

DEFAULT_NAME = "pycni-helper"
HELPER_ENV = "PYCNI_HELPER"
SOCKET_ENV = "PYCNI_HELPER_SOCKET"
DIR_ENV = "PYCNI_HELPER_DIR"
DEFAULT_DIR = "/run/pycni/helper"
LINE_MAX = 4096
REFUSED = b"refused"
# why a call was not served; the helper sends the last two after REFUSED
ABSENT = "absent"  # nobody listens (or the helper went away mid-call): start one
UNTRUSTED = "untrusted"  # the socket or its listener is not the helper's: never send it a request, never start one
SKEW = "skew"  # the helper runs other plugin code than ours: it has exited, start one of ours
FOREIGN = "foreign"  # the helper found the caller of another user, mount namespace, netns or executable
RESTART = (ABSENT, SKEW)
PACKAGE = os.path.dirname(os.path.abspath(__file__))
FLOOR = os.path.join(os.path.dirname(PACKAGE), "pynode_os")  # the plugins' code too, installed beside them
SO_PEERPIDFD = 77  # Linux 6.5; the constant is not in Python 3.11's _socket
S_IFMT, S_IFDIR, S_IFSOCK = 0o170000, 0o040000, 0o140000


def socket_name() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_NAME


def helper_dir() -> str:
    return os.environ.get(DIR_ENV) or DEFAULT_DIR


def socket_path(name: str, netns_ino: int | None = None) -> str:
    """The socket of the helper called `name` of a netns (default: ours), named after the netns's inode.

    A helper keeps its netns alive, so no later netns can take the inode of a netns whose helper listens;
    a stale file left by a killed helper only refuses connections.
    """
    if netns_ino is None:
        netns_ino = os.stat("/proc/self/ns/net").st_ino
    return f"{helper_dir()}/{name}.net-{netns_ino}"


def untrusted_file(path: str, kind: int) -> str:
    """Why `path` (lstat: symlinks are refused) is not ours to trust ("" when it is): its type is not
    `kind`, its owner is not our euid, or (a directory) its mode is not 0700."""
    st = os.lstat(path)
    if st.st_mode & S_IFMT != kind:
        return f"{path} is not a {'directory' if kind == S_IFDIR else 'socket'}"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}"
    if kind == S_IFDIR and st.st_mode & 0o7777 != 0o700:
        return f"{path} has mode {st.st_mode & 0o7777:04o}, not 0700"
    return ""


def peer_refusal(sock: _socket.socket, started_by: float | None = None) -> str:
    """Why the process at the other end of `sock` is not one of ours ("" when it is).

    Ours: our euid, and our mount namespace, netns and executable (compared by device and inode). The
    pid SO_PEERCRED gives is the peer's as it connected (or listened); the checks read /proc/PID while a
    pidfd holds the peer, and end by signalling 0 through it, so a peer that exited meanwhile (its pid
    free for another process) is refused. Since Linux 6.5 the kernel hands out the peer's own pidfd
    (SO_PEERPIDFD); before, pidfd_open(pid) may open a process that took the pid of a peer that exited
    before it, so `started_by` (CLOCK_BOOTTIME seconds, when the connection was accepted) refuses a
    process started later. What is left is a peer that exits and whose pid is taken by one of ours
    between its connect() and our accept().
    """
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid, uid = int.from_bytes(cred[0:4], sys.byteorder, signed=True), int.from_bytes(cred[4:8], sys.byteorder)
    if uid != os.geteuid():
        return f"pid {pid} runs as uid {uid}, we as {os.geteuid()}"
    if pid <= 0:
        return "the peer's pid is not visible in our pid namespace"
    pidfd = -1
    try:
        try:
            pidfd = sock.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as exc:
            if exc.errno != errno.ENOPROTOOPT:
                raise
            pidfd = os.pidfd_open(pid)
            if started_by is not None:
                ticks = int(stat_fields(pid)[19])  # the start time, proc(5)'s field 22
                if ticks / os.sysconf("SC_CLK_TCK") > started_by:
                    return f"pid {pid} started after the connection: the peer's pid was reused"
        for what in ("ns/mnt", "ns/net", "exe"):
            theirs, ours = os.stat(f"/proc/{pid}/{what}"), os.stat(f"/proc/self/{what}")
            if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
                return (f"pid {pid} has another {what} than ours "
                        f"({theirs.st_dev}:{theirs.st_ino}, ours {ours.st_dev}:{ours.st_ino})")
        _signal.pidfd_send_signal(pidfd, 0)  # the peer still runs: /proc/{pid} was its own throughout
    except OSError as exc:
        return f"cannot check pid {pid}: {exc.strerror}"
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return ""


def code_version() -> str:
    """Identifies the plugin code installed now (cni_plugins and the pynode_os modules they import): path,
    inode, size and mtime of every module, folded.

    A stat per module and no hashing module to import, so every call can afford it. An upgrade or an edit
    changes it; the helper takes it before loading the plugins, so it never claims newer code than it has.
    """
    entries = []
    dirs = [PACKAGE, FLOOR]
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

    Only a socket file of ours in a directory of ours, whose listener passes peer_refusal, is trusted.
    """
    path = socket_path(name)
    try:
        if untrusted_file(os.path.dirname(path), S_IFDIR) or untrusted_file(path, S_IFSOCK):
            return UNTRUSTED
    except OSError:
        return ABSENT  # no directory or no socket yet
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
        refusal = peer_refusal(sock)
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    except OSError:
        sock.close()
        return ABSENT  # a stale socket file, or the helper went away
    if refusal:
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
