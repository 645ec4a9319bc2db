"""What the streaming server needs from the runtime (`StreamBackend`), and its implementation over the
launcher's exec helper, the supervisors' attach sockets and the pods' pinned network namespaces.

The server speaks the protocols and owns the client's streams; a backend only runs things on file
descriptors, so a fake backend in tests exercises every protocol path without containers. The fds a
backend gets belong to the server: it reads/writes them (or passes them on: the launcher sends copies by
SCM_RIGHTS) but never closes them. It runs in the session's own thread and may block until the end.

Port forwarding opens the TCP connection from a thread that enters the pod's network namespace just
for socket(): a socket stays in the namespace it was made in, so the thread returns to its own at once
and the daemon never has a thread left inside a pod. The target is always 127.0.0.1 in the pod, as the
kubelet's CRI runtimes do.
"""
from __future__ import annotations

import fcntl
import importlib
import logging
import os
import socket
import struct
import termios
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from pyruntime.errors import InternalError, UnavailableError

if TYPE_CHECKING:
    from pyruntime.cri.model import Layout
    from pyruntime.linux.syscalls import Syscalls

log = logging.getLogger(__name__)

Resize = Callable[[], "tuple[int, int] | None"]
CONNECT_TIMEOUT = 10.0
TTY_DRAIN_GRACE = 2.0


class StreamBackend(Protocol):
    def exec(self, container_id: str, cmd: list[str], *, tty: bool, stdin: int | None, stdout: int | None,
             stderr: int | None, resize: Resize) -> int:
        """Runs cmd in the container with these fds as its stdio (None: none; with tty, stderr is None and
        the terminal's output goes to stdout) until it exits; returns its exit code (128+N for signal N).
        `resize()` blocks for the client's next terminal size (width, height), None when there are no
        more. Raises a pyruntime.errors kind when the command can't be run (no such container, binary)."""
        ...

    def attach(self, container_id: str, *, tty: bool, stdin: int | None, stdout: int | None,
               stderr: int | None, resize: Resize) -> None:
        """Connects these fds to the running container's stdio until its output ends or stdin closes
        (with stdin_once) or the client goes; raises like exec."""
        ...

    def port_forward(self, sandbox_id: str, port: int) -> socket.socket:
        """A TCP connection to 127.0.0.1:port inside the pod's network namespace (the caller closes it);
        raises NotFoundError for an unknown sandbox, UnavailableError when nothing answers."""
        ...


def set_winsize(fd: int, width: int, height: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))


def _copy(src: int, dst: int) -> None:
    """Copies until EOF/EIO (a pty master reads EIO once the terminal's last holder is gone)."""
    try:
        while data := os.read(src, 65536):
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view):]
    except OSError:
        pass


def _copy_and_close(src: int, dst: int, close: tuple[int, ...]) -> None:
    try:
        _copy(src, dst)
    finally:
        for fd in close:
            os.close(fd)


def _follow_resize(resize: Resize, apply: Callable[[int, int], None]) -> None:
    while (size := resize()) is not None:
        try:
            apply(*size)
        except OSError as e:  # the terminal is gone: the command has ended
            log.debug("resize: %s", e)
            return


def socket_in_netns(netns: str, kernel: Syscalls) -> socket.socket:
    """A TCP socket created inside the network namespace pinned at `netns` (by this thread, which goes
    back to its own namespace before returning)."""
    from pyruntime.linux.syscalls import CLONE_NEWNET

    own_path = "/proc/thread-self/ns/net"
    own = os.open(own_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise UnavailableError(f"port forward: network namespace {netns}: gone") from e
        try:
            kernel.setns(target, CLONE_NEWNET, netns)
        finally:
            os.close(target)
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            try:
                kernel.setns(own, CLONE_NEWNET, own_path)
            except OSError as e:
                # never let this thread serve anything else from inside a pod
                log.critical("port forward: thread %d stuck in %s: %s", threading.get_native_id(), netns, e)
                raise InternalError(f"port forward: setns back from {netns}: {e}") from e
    finally:
        os.close(own)


class ExecLauncher(Protocol):
    """The part of pyruntime.cri.launcher.Launcher used here (its exec returns an ExecHandle: pid, pty,
    wait(timeout), kill(), close())."""

    def exec(self, job: Any, stdin: int | None, stdout: int | None, stderr: int | None) -> Any: ...


class RuntimeStreamBackend:
    """StreamBackend over the CRI server's parts. `sandbox_netns(sandbox_id)` names the pinned network
    namespace of a pod (SandboxRecord.namespaces.get("net"); None for a hostNetwork pod) and raises
    NotFoundError for an unknown one: the daemon passes a lookup in its store."""

    def __init__(self, launcher: ExecLauncher, layout: Layout, sandbox_netns: Callable[[str], str | None],
                 kernel: Syscalls) -> None:
        self._launcher = launcher
        self._layout = layout
        self._sandbox_netns = sandbox_netns
        self._kernel = kernel

    def exec(self, container_id: str, cmd: list[str], *, tty: bool, stdin: int | None, stdout: int | None,
             stderr: int | None, resize: Resize) -> int:
        exec_job = importlib.import_module("pyruntime.cri.jobs").ExecJob
        handle = self._launcher.exec(exec_job(container_id=container_id, argv=list(cmd), tty=tty),
                                     stdin, stdout, stderr)
        try:
            output = None
            if tty and handle.pty is not None:
                pty = handle.pty
                if stdin is not None:
                    src = os.dup(stdin)
                    threading.Thread(target=_copy_and_close, args=(src, pty, (src,)), daemon=True).start()
                if stdout is not None:
                    dst = os.dup(stdout)
                    output = threading.Thread(target=_copy_and_close, args=(pty, dst, (dst,)), daemon=True)
                    output.start()
                threading.Thread(target=_follow_resize, args=(resize, lambda w, h: set_winsize(pty, w, h)),
                                 daemon=True).start()
            code = handle.wait(None)
            if output is not None:
                output.join(TTY_DRAIN_GRACE)
            return code if code is not None else 255
        finally:
            handle.close()

    def attach(self, container_id: str, *, tty: bool, stdin: int | None, stdout: int | None,
               stderr: int | None, resize: Resize) -> None:
        attach = importlib.import_module("pyruntime.cri.attach")

        def sizes() -> Iterator[tuple[int, int]]:
            while (size := resize()) is not None:
                yield size

        sock = os.path.join(self._layout.supervisor_dir(container_id), "supervisor.sock")
        attach.attach(sock, stdin=stdin, stdout=stdout, stderr=stderr, tty=tty, resize=sizes())

    def port_forward(self, sandbox_id: str, port: int) -> socket.socket:
        netns = self._sandbox_netns(sandbox_id)
        sock = socket_in_netns(netns, self._kernel) if netns else socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.connect(("127.0.0.1", port))
            sock.settimeout(None)
        except OSError as e:
            sock.close()
            raise UnavailableError(f"port forward to pod {sandbox_id} port {port}: {e}") from e
        return sock
