"""`exec`: a new process in every namespace and the cgroup of a running container.

Same shape as create: stage 1 is non-dumpable before it joins anything, is put in the cgroup by the
runtime, opens every namespace of the container's init before joining any (after the mount namespace
the runtime's /proc is gone), joins them, and forks stage 2 into the pid namespace, which finishes
the process (limits, identity, capabilities, seccomp, cwd) and execs.
"""
from __future__ import annotations

import os

from pyruntime import channel
from pyruntime.channel import Channel
from pyruntime.container import process
from pyruntime.container.create import (
    become_subreaper,
    end_stage1,
    fork_in_cgroup,
    hand_over_notify_fd,
    require_single_thread,
    silent,
)
from pyruntime.container.init import JOIN_ORDER, NS_FLAGS, fail
from pyruntime.container.store import ContainerError, ContainerStore
from pyruntime.errors import InvalidArgumentError
from pyruntime.linux import cgroups
from pyruntime.linux import syscalls as sc
from pyruntime.linux.syscalls import LinuxSyscalls, Syscalls
from pyruntime.oci.spec import Process
from pyruntime.oci.state import CREATED, PAUSED, RUNNING, ContainerState, oci_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

    from pyruntime.linux.seccomp.profile import Seccomp

PROC_NS_NAME = {"user": "user", "ipc": "ipc", "uts": "uts", "network": "net", "pid": "pid", "cgroup": "cgroup",
                "time": "time", "mount": "mnt"}


def _stage1(kernel: Syscalls, state: ContainerState, seccomp: Seccomp | None, proc: Process, chan: Channel,
            console_sock: socket.socket | None, preserve_fds: int, debug: bool,
            enter_cgroup: Callable[[], None] | None) -> None:
    """`enter_cgroup`: as init.stage1's, once the runtime says go (after it set the initial CPU affinity)."""
    namespaces, init_pid = state.namespaces, state.pid
    try:
        kernel.prctl(sc.PR_SET_DUMPABLE, 0)
        chan.recv(channel.GO)
        if enter_cgroup is not None:
            enter_cgroup()
        if proc.oom_score_adj is not None:  # before the mount namespace: its /proc has no /proc/self for us yet
            process.set_oom_score_adj(proc.oom_score_adj)
        fds = []
        for kind in JOIN_ORDER:
            if kind not in namespaces:
                continue
            path = f"/proc/{init_pid}/ns/{PROC_NS_NAME[kind]}"
            fds.append((kind, os.open(path, os.O_RDONLY | os.O_CLOEXEC), path))
        for kind, fd, path in fds:
            if kind == "user" and os.readlink(path) == os.readlink("/proc/self/ns/user"):
                continue
            kernel.setns(fd, NS_FLAGS[kind], path)
            os.close(fd)
            if kind == "user":
                kernel.setresgid(0)
                kernel.setresuid(0)
        pid = os.fork()
        if pid == 0:
            _stage2(kernel, state, seccomp, proc, chan, console_sock, preserve_fds, debug)
        chan.send(channel.PID, pid=pid)
        os._exit(0)
    except BaseException as e:
        fail(chan, e, debug)


def _stage2(kernel: Syscalls, state: ContainerState, seccomp: Seccomp | None, proc: Process, chan: Channel,
            console_sock: socket.socket | None, preserve_fds: int, debug: bool) -> None:
    try:
        chan.recv(channel.PID_RECEIVED)
        if proc.terminal:
            from pyruntime.container import console  # loaded by _exec before the namespaces were joined
            console.become_terminal(kernel, console_sock, proc.console_size, proc.user.uid)
        cpus = (state.resources.get("cpu") or {}).get("cpus")
        affinity = proc.exec_cpu_affinity.final if proc.exec_cpu_affinity else None
        sent: list[int] = []

        def notify(fd: int) -> None:
            chan.send_fd(channel.SECCOMP, fd)
            sent.append(fd)
        program, env = process.finalize(kernel, seccomp, proc, {chan.fileno()} | set(range(3, 3 + preserve_fds)),
                                        notify, personality=state.personality, cpus_restricted=bool(cpus),
                                        affinity=affinity)
        if seccomp is not None and seccomp.uses_notify and not sent:
            chan.send(channel.SECCOMP)  # every notify rule named a syscall this kernel lacks: no fd
        chan.send(channel.READY)
        chan.close()
        process.execute(seccomp, proc, program, env)
    except BaseException as e:
        fail(chan if chan.sock.fileno() >= 0 else None, e, debug)


def _initial_affinity(kernel: Syscalls, pid: int, cpus: frozenset[int], trace: Callable[[str], None]) -> None:
    """execCPUAffinity.initial, set before the process joins the cgroup (where a cpuset narrows it, and
    `final` or every CPU is set in stage 2); traced in runc's words, which its tests read."""
    try:
        kernel.sched_setaffinity(pid, set(cpus))
    except sc.SyscallError as e:
        raise process.ProcessError(f"process.execCPUAffinity.initial: {e}") from e
    trace(f"nsexec-1[{pid}]: affinity: {hex(sum(1 << c for c in cpus))}")


def with_defaults(proc: Process, state: ContainerState) -> Process:
    """The exec'd process takes config.json's scheduler, I/O priority and exec CPU affinity unless it has its
    own (runc's)."""
    if (proc.scheduler is not None or not state.process.get("scheduler")) and (
            proc.io_priority is not None or not state.process.get("ioPriority")) and (
            proc.exec_cpu_affinity is not None or not state.process.get("execCPUAffinity")):
        return proc
    from pyruntime.record import replace
    config = state.process_spec()
    return replace(proc, scheduler=proc.scheduler or config.scheduler,
                   io_priority=proc.io_priority or config.io_priority,
                   exec_cpu_affinity=proc.exec_cpu_affinity or config.exec_cpu_affinity)


def exec_process(store: ContainerStore, cid: str, proc: Process, *, console_socket: str | None = None,
                 preserve_fds: int = 0, debug: bool = False, kernel: Syscalls | None = None,
                 trace: Callable[[str], None] | None = None) -> int:
    """Starts the process in the container and returns its pid (the caller may wait for it).
    `kernel` is the syscall layer, the real one unless a caller brings its own.

    The container's lock is held until the process is in the cgroup and every namespace, so a
    concurrent delete can't free the init whose namespaces it joins."""
    require_single_thread(f"exec in {cid}")
    if proc.terminal and not console_socket:
        raise InvalidArgumentError("a terminal needs --console-socket")
    kernel = kernel or LinuxSyscalls()
    with store.locked(cid):
        state = store.load(cid)
        from pyruntime.container.control import status_of
        status = status_of(store, state)
        if status == PAUSED:  # runc's words, which tools match; its --ignore-paused is not ours
            raise ContainerError(f"cannot exec in a paused container {cid!r}: it is paused; resume it first")
        if status not in (RUNNING, CREATED):
            raise ContainerError(f"cannot exec in container {cid!r}: it is {status}")
        return _exec(kernel, state, status, proc, console_socket, preserve_fds, debug, trace or silent)


def _exec(kernel: Syscalls, state: ContainerState, status: str, proc: Process, console_socket: str | None,
          preserve_fds: int, debug: bool, trace: Callable[[str], None]) -> int:
    seccomp = state.seccomp_spec()
    # loaded now: stage 2 needs them after it joined the container's mount namespace, where the host's files are gone
    from pyruntime.linux import capabilities  # noqa: F401
    if seccomp is not None:
        from pyruntime.linux.seccomp import loader
        loader.preload()
    # connected here: the socket's path is the caller's, which stage 2 can no longer reach
    console_sock = None
    if proc.terminal and console_socket:
        from pyruntime.container import console
        console_sock = console.connect(console_socket)
    # Stage 2 is stage 1's child; when stage 1 exits it comes to us, the nearest subreaper, so that we can
    # reap it if it fails before exec (as runc's exec'd process is runc's child). After we return it
    # belongs to whoever waits for it: our caller, or our own subreaper once a detached `exec` exits.
    become_subreaper(kernel)
    proc = with_defaults(proc, state)
    parent, child = Channel.pair()
    stage1_pid = 0
    try:
        trace("nsexec container setup")
        cg = cgroups.manager(state.cgroups_path, state.id, kernel, systemd=state.systemd_cgroup)
        initial = proc.exec_cpu_affinity is not None and proc.exec_cpu_affinity.initial is not None
        if initial:  # set before the process is in the cgroup, whose cpuset may not hold those CPUs
            stage1_pid, in_cgroup = os.fork(), False
        else:
            stage1_pid, in_cgroup, _cloned = fork_in_cgroup(kernel, cg)
        if stage1_pid == 0:
            parent.close()
            _stage1(kernel, state, seccomp, proc, child, console_sock, preserve_fds, debug,
                    cg.enter_v1 if in_cgroup else None)
        child.close()
        if console_sock is not None:
            console_sock.close()
            console_sock = None
        if initial:
            assert proc.exec_cpu_affinity is not None and proc.exec_cpu_affinity.initial is not None
            _initial_affinity(kernel, stage1_pid, proc.exec_cpu_affinity.initial, trace)
        pid = end_stage1(parent, cg, stage1_pid, in_cgroup)
        stage1_pid = 0
        try:
            parent.send(channel.PID_RECEIVED)
            trace(f"child process in init() (pid {pid})")
            if seccomp is not None and seccomp.uses_notify:  # its own filter's fd, for the agent as the init's
                hand_over_notify_fd(seccomp, parent, pid, oci_state(state, status))
            parent.recv(channel.READY)
        except BaseException:
            # it reported why it failed, or died (killed with its pid namespace when the container's init
            # ended): reaped here, its status adding nothing, since that init's own exit waits until every
            # process of the namespace is reaped, and our caller, which gets no pid, cannot
            if parent.peer_failed:
                os.waitpid(pid, 0)
            raise
        if seccomp is not None and trace is not silent:  # the process loads it with these (runc's words)
            from pyruntime.linux.seccomp import compiler
            trace(f"seccomp filter flags: {compiler.filter_flags(seccomp)}")
        trace("setns_init: about to exec")
        return pid
    finally:
        if stage1_pid:
            try:
                os.kill(stage1_pid, 9)
                os.waitpid(stage1_pid, 0)
            except OSError:
                pass
        parent.close()
        child.close()  # closed at the fork; still open when the set-up before it failed
        if console_sock is not None:
            console_sock.close()
