"""Terminals: the pty is made inside the container and its master handed to the caller, as runc does.

With `--console-socket`, the master fd goes over that unix socket (SCM_RIGHTS, with the pty's name as
the message), so a shim can own the terminal; the container only ever holds the slave side.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios

from pyruntime.errors import FailedPreconditionError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.linux.syscalls import Syscalls


class ConsoleError(FailedPreconditionError):
    """The terminal could not be handed over: nothing listens on the console socket, none was given, or
    the container sent no pty. The request is well formed; the socket it names is not in a usable state."""


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise ConsoleError(f"--console-socket {path}: connect: {e.strerror}") from e
    return sock


def become_terminal(kernel: Syscalls, sock: socket.socket | None, size: tuple[int, int] | None, uid: int) -> None:
    """Opens a pty from the container's devpts, sends its master away and makes the slave our stdio.

    As runc's: the slave belongs to the process's user (its group stays devpts' gid=, the tty group), so a
    non-root process can set its own terminal; and output newlines are not turned into CRLF (ONLCR off),
    so what a container prints reaches a log or a pipe byte for byte."""
    if sock is None:
        raise ConsoleError("process.terminal is true but no --console-socket was given")
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        kernel.chown(slave, uid, -1)
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.ONLCR
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        if size and all(size):
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        socket.send_fds(sock, [name.encode()], [master])
    finally:
        os.close(master)
        sock.close()
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    if slave > 2:
        os.close(slave)


def listen(path: str) -> socket.socket:
    """A console socket of our own, for a foreground `run`/`exec -t` without --console-socket.

    The container connects and sends the master while `create` is still running; the listen backlog
    holds the connection and the fd until we accept after `create` returns.
    """
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    return server


def receive_master(server: socket.socket) -> int:
    conn, _ = server.accept()
    with conn:
        _msg, fds, _flags, _addr = socket.recv_fds(conn, 4096, 1)
    if not fds:
        raise ConsoleError("the container sent no terminal")
    return fds[0]


def proxy(master: int) -> None:
    """Copies our stdin to the pty and the pty to our stdout, in raw mode, until the pty hangs up
    (every process holding its slave side, the container's pid 1 first, has exited)."""
    import select
    import tty
    saved = None
    if os.isatty(0):
        saved = termios.tcgetattr(0)
        tty.setraw(0)
        size = fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(master, termios.TIOCSWINSZ, size)
    poller = select.poll()  # not select(2): the fd may pass FD_SETSIZE in a daemon with many pods
    poller.register(master, select.POLLIN)
    poller.register(0, select.POLLIN)
    try:
        while True:
            ready = dict(poller.poll(100))
            if ready.get(master):
                try:
                    data = os.read(master, 65536)
                except OSError:
                    data = b""
                if not data:
                    break
                os.write(1, data)
            if ready.get(0):
                data = os.read(0, 65536)
                if data:
                    os.write(master, data)
                else:
                    poller.unregister(0)
    finally:
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        os.close(master)
