"""Loading a compiled seccomp filter (compiler.py) into the calling thread, and handing a notify listener to
its agent.

The filter goes in with seccomp(2), not libseccomp's seccomp_load: the program carries runc's ENOSYS stub in
front of libseccomp's, which libseccomp cannot load. The listener fd and the container's state go to the
agent at listenerPath as runc sends them.
"""
from __future__ import annotations

import ctypes
import os

from pyruntime.linux.seccomp.compiler import Program, compile_filter, libseccomp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyruntime.linux.seccomp.compiler import Warn
    from pyruntime.linux.seccomp.profile import Seccomp

_SECCOMP_SET_MODE_FILTER = 1
_SCM_RIGHTS_NAME = "seccompFd"


def preload() -> None:
    """Imports the loader and opens libseccomp while the host's files are still visible: a container's
    init (and an exec's stage 2) loads its filter after pivot_root or setns, where neither this package's
    modules nor libseccomp can be found any more."""
    from pyruntime.linux.seccomp import compiler
    compiler.preload()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install(program: Program) -> int:
    """Loads the program into the calling thread with seccomp(2); returns its result (the listener fd with
    SECCOMP_FILTER_FLAG_NEW_LISTENER)."""
    from pynode_os.libc import libc

    buf = ctypes.create_string_buffer(program.bpf, len(program.bpf))
    fprog = _SockFprog(len(program.bpf) // 8, ctypes.addressof(buf))
    rc = libc.syscall(libseccomp().seccomp_syscall_resolve_name(b"seccomp"), _SECCOMP_SET_MODE_FILTER, program.flags,
                      ctypes.byref(fprog))
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"seccomp(SECCOMP_SET_MODE_FILTER, {program.flags:#x}): {os.strerror(e)}")
    return rc


def load(seccomp: Seccomp, *, warn: Warn | None = None) -> int | None:
    """Loads the filter into the calling thread; returns the notify fd when a SCMP_ACT_NOTIFY rule was loaded.

    The notify fd (close-on-exec) belongs to the caller, which hands it to whoever calls
    send_listener_fd: listenerPath is a host path, outside the container's mount namespace. Without
    no_new_privs this needs CAP_SYS_ADMIN, so call it before capabilities are dropped in that case.
    """
    program = compile_filter(seccomp, warn=warn)
    fd = _install(program)
    return fd if program.notify else None


def send_listener_fd(seccomp: Seccomp, fd: int, *, pid: int, state: Mapping[str, object]) -> None:
    """Sends the container process state and the notify fd to the agent at listenerPath, once, as runc.

    ``state`` is the container's state (runtime.md#state) as `pyruntime state` would print it.
    """
    import array
    import json
    import socket

    if seccomp.listener_path is None:
        raise ValueError("linux.seccomp.listenerPath: not set")
    message: dict[str, object] = {
        "ociVersion": state.get("ociVersion"),
        "fds": [_SCM_RIGHTS_NAME],
        "pid": pid,
        "metadata": seccomp.listener_metadata or "",
        "state": dict(state),
    }
    payload = json.dumps(message).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(seccomp.listener_path)
            sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        except OSError as e:
            raise OSError(e.errno, "failed to connect with seccomp agent specified in the seccomp profile: "
                                   f"{seccomp.listener_path}: {e.strerror}") from e
