"""Work inside a network namespace without moving the process.

setns(CLONE_NEWNET) changes only the calling thread, so each piece of in-namespace work runs in a short
thread that joins the namespace and then ends; netlink sockets and /proc/sys/net files opened there belong
to that namespace. This keeps the resident helper's other threads where they were, and unlike pyroute2's
`netns=` it forks nothing.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from cni_plugins.skel import ERR_INVALID_ENVIRONMENT, ERR_UNKNOWN_CONTAINER, CNIError
from pynode_os.libc import libc

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703
T = TypeVar("T")


class NetNSGone(CNIError):
    """CNI_NETNS does not exist (any more)."""

    def __init__(self, path: str) -> None:
        super().__init__(ERR_UNKNOWN_CONTAINER, f"network namespace {path} does not exist")


def open_netns(path: str) -> int:
    """An fd for the netns at `path`; raises NetNSGone when the path is missing and code 4 if it is no netns."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetNSGone(path) from None
    except OSError as exc:
        raise CNIError(ERR_INVALID_ENVIRONMENT, f"failed to open netns {path}: {exc.strerror}") from exc
    try:
        kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError:
        kind = 0
    if kind != CLONE_NEWNET:
        os.close(fd)
        raise CNIError(ERR_INVALID_ENVIRONMENT, f"CNI_NETNS {path} is not a network namespace")
    return fd


def run_in(nsfd: int, fn: Callable[..., T], *args: object) -> T:
    """Calls fn(*args) in a thread that has joined the netns `nsfd`, and returns or raises what it did."""
    return start_in(nsfd, fn, *args)()


def start_in(nsfd: int, fn: Callable[..., T], *args: object) -> Callable[[], T]:
    """run_in, returning at once: the call it returns waits for fn and returns or raises what it did. `nsfd`
    must stay open until then."""
    value: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        if libc.setns(nsfd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            error.append(CNIError(ERR_INVALID_ENVIRONMENT,
                                  f"setns into the container netns failed: {os.strerror(err)}"))
            return
        try:
            value.append(fn(*args))
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="netns")
    thread.start()

    def wait() -> T:
        thread.join()
        if error:
            raise error[0]
        return value[0]
    return wait


def sysctl_set(key: str, value: str) -> bool:
    """Writes /proc/sys/<key> in the calling thread's netns; False when the knob does not exist (no IPv6)."""
    try:
        with open(f"/proc/sys/{key}", "w") as f:
            f.write(value)
    except FileNotFoundError:
        return False
    return True


def sysctl_get(key: str) -> str | None:
    try:
        with open(f"/proc/sys/{key}") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None
