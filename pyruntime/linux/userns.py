"""A child in a user namespace of its own, its maps written from outside.

A process that unshares a user namespace can write no map beyond its own id, and its capabilities end at
the namespace's border: so a child unshares, and its parent, still root on the host, writes the maps. The
runtime needs that twice: a user namespace that only holds an idmapped mount's mappings (the child waits
while the parent opens it) and a pod's user namespace (the child, root in it, makes the namespaces it will
own). This module is the part they share; what the child does once mapped is the caller's.

Threat model: the maps are written by the host's root into a child of its own, never into a process that
could have been replaced; a child that fails or is released exits without running anything else.
"""
from __future__ import annotations

import os

from pyruntime.errors import InternalError, InvalidArgumentError
from pyruntime.linux.syscalls import CLONE_NEWUSER, Syscalls

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

UNSHARED, MAPPED = b"unshared", b"mapped"


def write_id_map(pid: int, name: str, text: str, field: str) -> None:
    """`name`: uid_map or gid_map; `field`: the request's field the map came from, named in the error."""
    path = f"/proc/{pid}/{name}"
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise InvalidArgumentError(f"{field}: write {path}: {e.strerror}") from e


def fork_mapped(kernel: Syscalls, uid_map: tuple[str, str], gid_map: tuple[str, str],
                then: Callable[[socket.socket], object]) -> tuple[int, socket.socket]:
    """Forks a child that unshares a user namespace; once `uid_map` and `gid_map` (each the text and the
    field it came from) are written, the child, root of its namespace, runs then(sock) and exits. Returns
    the child's pid and the parent's end of the SOCK_SEQPACKET pair `then` talks through; the caller closes
    it and waits for the child. When the mapping fails, the child is gone before the error is raised."""
    import socket  # here: `create` of a container without user namespaces never pays its enums
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            ours.close()
            try:
                kernel.unshare(CLONE_NEWUSER)
            except OSError as e:
                theirs.send(str(e).encode()[:4096])
                raise
            theirs.send(UNSHARED)
            if theirs.recv(16) == MAPPED:
                kernel.setresgid(0)
                kernel.setresuid(0)
                then(theirs)
                status = 0
        finally:
            os._exit(status)
    theirs.close()
    try:
        answer = ours.recv(4096)
        if answer != UNSHARED:
            raise InternalError(f"unshare a user namespace: {answer.decode(errors='replace') or 'the child exited'}")
        for name, (text, field) in (("uid_map", uid_map), ("gid_map", gid_map)):
            write_id_map(pid, name, text, field)
        ours.send(MAPPED)
    except BaseException:
        ours.close()  # the child reads the end of the socket and exits
        os.waitpid(pid, 0)
        raise
    return pid, ours
