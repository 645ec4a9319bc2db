"""The resident helper: keeps pyroute2 and the plugins imported and serves plugin calls over a unix socket.

Started on demand by a plugin call (cni_plugins.launch), it serves each connection in a thread and
serialises calls for the same attachment (so a DEL that follows a killed ADD waits for that ADD here).

Threat model. The helper makes bridges, host routes and masquerade rules in its own network namespace,
so serving a caller from another netns would build that caller's node in the wrong one (a node in its
own netns, a nested node); and it runs any plugin with any config and netns it is sent, so it must serve
only the runtime's own plugin launchers, never another root process of the node's netns such as a
hostNetwork pod. Hence one helper per netns, reachable only by its node's launchers: it listens on a
socket file named after its netns inode (launch.socket_path) in a directory that must be root's (its
euid's) with mode 0700 on the node's filesystem, which a pod, in a mount namespace of its own, reaches
only through a hostPath mount of it. A flock on a file beside the socket elects the one helper of a
netns, which removes a stale socket before it binds, and both files when it exits (a killed helper's stay
until its successor's exit). Both ends then check their peer (SO_PEERCRED,
launch.peer_refusal): the helper serves only a process with its euid, its mount namespace, its netns and
its interpreter, so a pod given the path still gets refused, and a socket made here and passed elsewhere
too; the launcher talks only to such a listener (launch.connect), so a pod that squats the name first
sees no request, and the call runs in-process.
A helper also outlives upgrades: each request carries the version of the plugin code installed now
(launch.code_version); a helper that loaded other code refuses it, gives up its name and exits, and the
client serves the call in-process and starts a helper of its own code.
A helper holds its netns alive, with any veth in it: it exits when nothing else uses the netns (no other
process, no nsfs mount in any mount namespace, no open fd), checked every second, so deleting a node's
netns frees it in bounded time. It also exits after PYCNI_HELPER_IDLE seconds without calls or on
`stop`. A malformed request gets the spec's error result and a line in the log (PYCNI_HELPER_LOG,
default /run/pycni/helper.log), which also records start, refusals and exit.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import threading
import time
from collections import defaultdict

from cni_plugins import launch, plugins
from cni_plugins.skel import ERR_DECODING_FAILURE, error_reply
from pynode_os.proc import process_start_time

STOP = "__stop__"
IDLE_ENV = "PYCNI_HELPER_IDLE"
DEFAULT_IDLE = 600.0
LOG_ENV = "PYCNI_HELPER_LOG"
DEFAULT_LOG = "/run/pycni/helper.log"
TICK = 1.0
REQUEST_TIMEOUT = 10.0
BODY_MAX = 16 << 20
NS_NET = "/proc/self/ns/net"

log = logging.getLogger("cni_plugins.helper")


class MalformedRequest(Exception):
    """A request that does not follow launch.encode_request."""


class NetnsWatch:
    """Whether anything besides this process holds our netns.

    Users are processes in it, nsfs mounts of it (`ip netns add` makes one in /run/netns) in any mount
    namespace, and open fds to it. The holder found last is checked first, so the usual answer costs one
    stat or one mountinfo read; /proc is scanned only when that holder has gone, and fds and threads are
    looked at only when no process and no mount holds the netns. What the helper may not look into (a
    non-dumpable process, another user's for a helper that is not root) is taken not to hold it: a wrong
    "unused" only costs a helper restart on the next call, a wrong "used" keeps a dead netns and its veths.
    """

    def __init__(self) -> None:
        self.ino = os.stat(NS_NET).st_ino
        self.link = f"net:[{self.ino}]"
        self.me = str(os.getpid())
        self.holder: tuple[str, str] | None = None

    def in_use(self) -> bool:
        if self.holder is not None and self._holds(*self.holder):
            return True
        self.holder = self._find()
        return self.holder is not None

    def _holds(self, kind: str, path: str) -> bool:
        try:
            if kind == "ns":
                return os.stat(path).st_ino == self.ino
            if kind == "mount":
                with open(path) as f:
                    return any(line.split(" ", 4)[3] == self.link for line in f)
            return os.readlink(path) == self.link
        except (FileNotFoundError, ProcessLookupError, PermissionError):  # exited meanwhile, or not ours to see
            return False

    def _find(self) -> tuple[str, str] | None:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and p != self.me]
        for pid in pids:
            if self._holds("ns", f"/proc/{pid}/ns/net"):
                return "ns", f"/proc/{pid}/ns/net"
        mount_namespaces = {os.stat("/proc/self/ns/mnt").st_ino: "self"}
        for pid in pids:
            try:
                mount_namespaces.setdefault(os.stat(f"/proc/{pid}/ns/mnt").st_ino, pid)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass  # exited since the listing, or not ours to see: see the class docstring
        for pid in mount_namespaces.values():
            if self._holds("mount", f"/proc/{pid}/mountinfo"):
                return "mount", f"/proc/{pid}/mountinfo"
        for pid in pids:
            for kind, directory in (("ns", f"/proc/{pid}/task"), ("fd", f"/proc/{pid}/fd")):
                try:
                    names = os.listdir(directory)
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    break  # exited since the listing, or not ours to see
                for name in names:
                    path = f"{directory}/{name}/ns/net" if kind == "ns" else f"{directory}/{name}"
                    if self._holds(kind, path):
                        return kind, path
        return None


class Helper:
    def __init__(self, listener: socket.socket, path: str, lock: int, idle: float, version: str) -> None:
        self.listener = listener
        self.path = path
        self.lock = lock
        self.idle = idle
        self.version = version
        self.watch = NetnsWatch()
        self.active = 0
        self.cond = threading.Condition()
        self.keys: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self.stopping = False
        self.stop_reason = ""

    def serve(self) -> str:
        """Serves until a reason to exit comes, lets the calls in flight finish, and returns the reason."""
        self.listener.settimeout(TICK)
        idle_for = 0.0
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
                accepted = time.clock_gettime(time.CLOCK_BOOTTIME)
            except TimeoutError:
                with self.cond:
                    busy = self.active > 0
                idle_for = 0.0 if busy else idle_for + TICK
                if idle_for >= self.idle:
                    self.release(f"idle for {self.idle:g} s")
                elif not busy and not self.watch.in_use():
                    self.release(f"nothing else uses netns {self.watch.link}")
                continue
            except OSError:
                if self.stopping:  # release() closed the listener under us
                    break
                raise
            idle_for = 0.0
            with self.cond:
                self.active += 1
            threading.Thread(target=self.handle, args=(conn, accepted), daemon=True).start()
        with self.cond:
            self.cond.wait_for(lambda: self.active == 0, timeout=30)
        return self.stop_reason

    def release(self, reason: str) -> None:
        """Gives up the socket and its lock at once (a successor can bind it) and makes serve() return."""
        with self.cond:
            if self.stopping:
                return
            self.stopping, self.stop_reason = True, reason
            for path in (self.path, f"{self.path}.lock"):  # ours while we hold the lock (see _lock)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            try:
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in serve()
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    raise
            self.listener.close()
            os.close(self.lock)

    def handle(self, conn: socket.socket, accepted: float) -> None:
        try:
            with conn:
                conn.settimeout(REQUEST_TIMEOUT)
                reply, unread = self.answer(conn, accepted)
                conn.sendall(reply)
                if unread:
                    drain(conn)
        except OSError as exc:
            log.warning("could not answer a caller: %s", exc)
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()

    def answer(self, conn: socket.socket, accepted: float) -> tuple[bytes, bool]:
        """The reply to the request on `conn`, and whether the caller may have sent more than was read."""
        refusal = launch.peer_refusal(conn, accepted)
        if refusal:
            log.warning("refused a caller: %s", refusal)
            return launch.REFUSED + b" " + launch.FOREIGN.encode() + b"\n", True
        try:
            name, env, stdin, version = read_request(conn)
        except (TimeoutError, MalformedRequest, ValueError, ConnectionError) as exc:
            log.warning("malformed request: %s", exc)
            out = error_reply(ERR_DECODING_FAILURE, "malformed request to the CNI helper", str(exc))
            return b"1 %d\n" % len(out) + out, True
        if version != self.version:
            log.warning("a caller runs plugin code %s, this helper %s: exiting for a helper of the new code",
                        version, self.version)
            self.release(f"plugin code changed from {self.version} to {version}")
            return launch.REFUSED + b" " + launch.SKEW.encode() + b"\n", False
        if name == STOP:
            self.release("asked to stop")
            return b"0 0\n", False
        with self.keys[(env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", ""))]:
            rc, out = plugins.run(name, env, stdin)
        return b"%d %d\n" % (rc, len(out)) + out, False


def drain(conn: socket.socket, limit: int = 1 << 20) -> None:
    """Reads what the caller sent beyond the request before closing: closing a unix socket with unread
    data resets the connection, and the caller would lose the reply it was sent."""
    conn.shutdown(socket.SHUT_WR)
    while limit > 0:
        chunk = conn.recv(min(limit, 65536))
        if not chunk:
            return
        limit -= len(chunk)


def read_request(conn: socket.socket) -> tuple[str, dict[str, str], bytes, str]:
    """(plugin, env, stdin, code version) of one request as launch.encode_request writes it."""
    header = launch.recv_line(conn).split()
    if len(header) != 4:
        raise MalformedRequest(f"header has {len(header)} fields, expected 4 (name, env and stdin lengths, version)")
    try:
        sizes = [int(x) for x in header[:3]]
    except ValueError:
        raise MalformedRequest(f"header lengths are not integers: {b' '.join(header[:3])!r}") from None
    if not all(0 <= n <= BODY_MAX for n in sizes):
        raise MalformedRequest(f"header lengths {sizes} out of range 0..{BODY_MAX}")
    name = launch.recv_exact(conn, sizes[0]).decode()
    blob = launch.recv_exact(conn, sizes[1]).decode()
    stdin = launch.recv_exact(conn, sizes[2])
    if name != STOP and name not in plugins.MODULES:
        raise MalformedRequest(f"unknown plugin {name!r}")
    items = blob.split("\0") if blob else []
    if not all("=" in item for item in items):
        raise MalformedRequest("environment entry without '='")
    return name, dict(item.split("=", 1) for item in items), stdin, header[3].decode()


def _setup_log() -> None:
    """Appends to PYCNI_HELPER_LOG; a helper that cannot open it logs to its stderr (/dev/null) and serves on."""
    path = os.environ.get(LOG_ENV) or DEFAULT_LOG
    error = None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path)
    except OSError as exc:
        handler, error = logging.StreamHandler(), exc
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s pycni-helper[%(process)d] net:[{os.stat(NS_NET).st_ino}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    if error is not None:
        log.warning("cannot log to %s: %s", path, error.strerror)


def claim(name: str) -> tuple[socket.socket, str, int] | None:
    """The listening socket of this netns's helper `name`, its path and the fd of its lock; None when another
    helper holds the lock. Raises PermissionError when the directory is not ours to trust."""
    path = launch.socket_path(name)
    directory = os.path.dirname(path)
    os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass  # checked below like any directory we did not just make
    refusal = launch.untrusted_file(directory, launch.S_IFDIR)
    if refusal:
        raise PermissionError(refusal)
    lock = _lock(f"{path}.lock")
    if lock is None:
        return None  # this netns has its helper already
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        try:
            os.unlink(path)  # a killed helper's
        except FileNotFoundError:
            pass
        listener.bind(path)
        listener.listen(256)  # callers queue while the plugins load instead of being refused and starting helpers
        os.chmod(path, 0o600)
    except BaseException:
        listener.close()
        os.close(lock)
        raise
    return listener, path, lock


def _lock(path: str) -> int | None:
    """The flocked fd of the lock file now at `path`, None when another helper holds it. A helper removes its
    lock file when it exits, under the flock: a file we opened before that and locked after is no longer the
    name's lock (a successor may hold a new one), so we look again."""
    while True:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            return None
        held = os.fstat(lock)
        try:
            current = os.lstat(path)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            return lock
        os.close(lock)


def main(name: str) -> None:
    version = launch.code_version()  # before the plugins load: code changed after this is refused, not served
    _setup_log()
    try:
        claimed = claim(name)
    except PermissionError as exc:
        log.warning("not serving: %s", exc)
        return
    if claimed is None:
        return
    listener, path, lock = claimed
    log.info("serving %s, plugin code %s", path, version)
    plugins.preload()
    helper = Helper(listener, path, lock, float(os.environ.get(IDLE_ENV, DEFAULT_IDLE)), version)
    try:
        reason = helper.serve()
    except BaseException:
        log.exception("the helper failed")
        raise
    finally:
        helper.release("the helper failed")
    log.info("exiting: %s", reason)


def stop(name: str, timeout: float = 10.0) -> bool:
    """Asks the helper of this netns called `name` to exit and waits until it has; False when none listened."""
    conn = launch.connect(name)
    if isinstance(conn, str):
        return False
    sock, pid = conn
    try:
        sock.sendall(launch.encode_request(STOP, {}, b"", launch.code_version()))
        launch.recv_line(sock)
    except OSError:
        pass  # it went away by itself: wait for it all the same
    finally:
        sock.close()
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"helper @{name} (pid {pid}) did not exit")
        time.sleep(0.01)
    return True


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its reaper counts as exited)."""
    return process_start_time(pid) is not None
