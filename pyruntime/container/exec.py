"""`exec`: a new process in every namespace and the cgroup of a running container.

Same shape as create: stage 1 is non-dumpable before it joins anything, is put in the cgroup by the
runtime, opens every namespace of the container's init before joining any (after the mount namespace
the runtime's /proc is gone), joins them, and forks stage 2 into the pid namespace, which finishes
the process (limits, identity, capabilities, seccomp, cwd) and execs.
"""
from __future__ import annotations

import os

from pyruntime.container import process, sync
from pyruntime.container.init import JOIN_ORDER, NS_FLAGS, fail
from pyruntime.container.store import ContainerError, Store
from pyruntime.container.sync import Channel, ChildError
from pyruntime.errors import InvalidArgumentError
from pyruntime.linux import cgroups
from pyruntime.linux import syscalls as sc
from pyruntime.linux.syscalls import LinuxSyscalls, Syscalls
from pyruntime.oci.spec import Process, Spec, parse
from pyruntime.oci.state import CREATED, RUNNING

PROC_NS_NAME = {"user": "user", "ipc": "ipc", "uts": "uts", "network": "net", "pid": "pid", "cgroup": "cgroup",
                "time": "time", "mount": "mnt"}


def _stage1(kernel: Syscalls, spec: Spec, init_pid: int, proc: Process, chan: Channel, console_socket: str | None,
            preserve_fds: int) -> None:
    try:
        kernel.prctl(sc.PR_SET_DUMPABLE, 0)
        chan.recv(sync.GO)
        fds = []
        for kind in JOIN_ORDER:
            if spec.linux.namespace(kind) is None:
                continue
            path = f"/proc/{init_pid}/ns/{PROC_NS_NAME[kind]}"
            fds.append((kind, os.open(path, os.O_RDONLY | os.O_CLOEXEC), path))
        for kind, fd, path in fds:
            if kind == "user" and os.readlink(path) == os.readlink("/proc/self/ns/user"):
                continue
            kernel.setns(fd, NS_FLAGS[kind], path)
            os.close(fd)
            if kind == "user":
                os.setresgid(0, 0, 0)
                os.setresuid(0, 0, 0)
        if proc.oom_score_adj is not None:
            process.set_oom_score_adj(proc.oom_score_adj)
        pid = os.fork()
        if pid == 0:
            _stage2(kernel, spec, proc, chan, console_socket, preserve_fds)
        chan.send(sync.PID, pid=pid)
        os._exit(0)
    except BaseException as e:
        fail(chan, e)


def _stage2(kernel: Syscalls, spec: Spec, proc: Process, chan: Channel, console_socket: str | None, preserve_fds: int) -> None:
    try:
        chan.recv(sync.PID_RECEIVED)
        if proc.terminal:
            from pyruntime.container import console
            console.become_terminal(console.connect(console_socket) if console_socket else None, proc.console_size)
        program = process.finalize(kernel, spec, proc, {chan.fileno()} | set(range(3, 3 + preserve_fds)))
        chan.send(sync.READY)
        chan.close()
        process.execute(spec, proc, program)
    except BaseException as e:
        fail(chan if chan.sock.fileno() >= 0 else None, e)


def exec_process(store: Store, cid: str, proc: Process, *, console_socket: str | None = None,
                 preserve_fds: int = 0, kernel: Syscalls | None = None) -> int:
    """Starts the process in the container and returns its pid (the caller may wait for it).
    `kernel` is the syscall layer, the real one unless a caller brings its own."""
    kernel = kernel or LinuxSyscalls()
    state = store.load(cid)
    from pyruntime.container.control import status_of
    status = status_of(store, state)
    if status not in (RUNNING, CREATED):
        raise ContainerError(f"cannot exec in container {cid!r}: it is {status}")
    if proc.terminal and not console_socket:
        raise InvalidArgumentError("a terminal needs --console-socket")
    spec = parse(state.config, state.bundle)
    parent, child = Channel.pair()
    stage1_pid = 0
    try:
        stage1_pid = os.fork()
        if stage1_pid == 0:
            parent.close()
            _stage1(kernel, spec, state.pid, proc, child, console_socket, preserve_fds)
        child.close()
        cgroups.manager(state.cgroups_path, cid, kernel).add(stage1_pid)
        parent.send(sync.GO)
        pid = parent.recv(sync.PID)["pid"]
        os.waitpid(stage1_pid, 0)
        stage1_pid = 0
        parent.send(sync.PID_RECEIVED)
        try:
            parent.recv(sync.READY)
        except ChildError:
            os.waitpid(pid, 0)
            raise
        return pid
    finally:
        if stage1_pid:
            try:
                os.kill(stage1_pid, 9)
                os.waitpid(stage1_pid, 0)
            except OSError:
                pass
        parent.close()
