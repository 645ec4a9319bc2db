"""The resident helper: keeps pyroute2 and the plugins imported and serves plugin calls over a unix socket.

Started on demand by a plugin call (cni_plugins.launch), it holds a flock next to its socket so only one
runs per socket path, serves each connection in a thread, serialises calls for the same attachment (so a
DEL that follows a killed ADD waits for that ADD to finish here) and exits after PYCNI_HELPER_IDLE seconds
without calls or on a `stop` request.
"""
from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections import defaultdict

from cni_plugins import launch, plugins

STOP = "__stop__"
IDLE_ENV = "PYCNI_HELPER_IDLE"
DEFAULT_IDLE = 600.0


class Helper:
    def __init__(self, path: str, idle: float) -> None:
        self.path = path
        self.listener: socket.socket | None = None
        self.idle = idle
        self.active = 0
        self.cond = threading.Condition()
        self.keys: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self.stopping = False

    def serve(self, listener: socket.socket) -> None:
        self.listener = listener
        listener.settimeout(1.0)
        idle_for = 0.0
        while not self.stopping:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                with self.cond:
                    idle_for = idle_for + 1.0 if self.active == 0 else 0.0
                if idle_for >= self.idle:
                    return
                continue
            except OSError:
                break
            idle_for = 0.0
            with self.cond:
                self.active += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
        with self.cond:
            self.cond.wait_for(lambda: self.active == 0, timeout=30)

    def handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                header = launch._recv_line(conn).split()
                name_len, env_len, stdin_len = (int(x) for x in header)
                name = launch._recv_exact(conn, name_len).decode()
                blob = launch._recv_exact(conn, env_len).decode()
                stdin = launch._recv_exact(conn, stdin_len)
                env = dict(item.split("=", 1) for item in blob.split("\0") if "=" in item)
                if name == STOP:
                    self.stopping = True
                    self.listener.shutdown(socket.SHUT_RDWR)
                    rc, out = 0, b""
                else:
                    with self.keys[(env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", ""))]:
                        rc, out = plugins.run(name, env, stdin)
                conn.sendall(b"%d %d\n" % (rc, len(out)) + out)
        except (OSError, ValueError, KeyError):
            pass
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()


def main(path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    plugins.preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    old = os.umask(0o077)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(256)
    try:
        Helper(path, float(os.environ.get(IDLE_ENV, DEFAULT_IDLE))).serve(listener)
    finally:
        os.unlink(path)
        listener.close()


def stop(path: str, timeout: float = 10.0) -> bool:
    """Asks the helper on `path` to exit and waits until it has (its lock is free); False when none was listening."""
    if launch.call_helper(path, STOP, {}, b"") is None:
        return False
    deadline = time.monotonic() + timeout
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"helper on {path} did not exit") from None
                time.sleep(0.01)
    finally:
        os.close(fd)
