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


class ConsoleError(Exception):
    pass


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise ConsoleError(f"--console-socket {path}: connect: {e.strerror}") from None
    return sock


def become_terminal(sock: socket.socket | None, size: tuple[int, int] | None) -> None:
    """Opens a pty from the container's devpts, sends its master away and makes the slave our stdio."""
    if sock is None:
        raise ConsoleError("process.terminal is true but no --console-socket was given")
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
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
