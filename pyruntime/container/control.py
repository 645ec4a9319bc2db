"""Operations on an existing container: status, start, kill, delete, pause, resume, update, ps, events.

Every operation that reads the state and then acts on it (signals, freezes, writes the cgroup or the
record) does both under the container's lock (ContainerStore.locked): otherwise a concurrent delete could
free the pid it signals, or a concurrent update overwrite the resources it just recorded.
Read-only queries (state, ps, stats) take no lock: the record is replaced atomically.
"""
from __future__ import annotations

import _signal  # not `signal`, which builds enums at import
import os
import select
import time

from pynode_os.proc import process_alive
from pyruntime.container.hooks import HookError, run_hooks
from pyruntime.container.store import FIFO, ContainerError, ContainerStore
from pyruntime.errors import InternalError, InvalidArgumentError
from pyruntime.linux.cgroups.base import FROZEN, CgroupError, CgroupManager
from pyruntime.oci.state import CREATED, CREATING, PAUSED, RUNNING, STOPPED, ContainerState, oci_state


def _cgroup(state: ContainerState) -> CgroupManager:
    """Loaded on first use: `start` and `state` of a created container never touch the cgroup, and the
    managers with the syscall layer (ctypes) are a quarter of what those commands would import."""
    from pyruntime.linux import cgroups
    from pyruntime.linux.syscalls import LinuxSyscalls
    return cgroups.manager(state.cgroups_path, state.id, LinuxSyscalls(), systemd=state.systemd_cgroup)


def status_of(store: ContainerStore, state: ContainerState) -> str:
    if state.pid == 0:
        return CREATING if process_alive(state.creator_pid, state.creator_start) else STOPPED
    if not process_alive(state.pid, state.pid_start):
        return STOPPED
    if os.path.exists(store.path(state.id, FIFO)):
        return CREATED
    try:
        if _cgroup(state).state() == FROZEN:
            return PAUSED
    except OSError:
        pass
    return RUNNING


def query(store: ContainerStore, cid: str) -> dict:
    state = store.load(cid)
    return oci_state(state, status_of(store, state))


def parse_signal(text: str) -> int:
    """A signal number or name (KILL, SIGKILL); 0 (kill(2)'s probe) checks that the init is alive."""
    if text.isdigit():
        num = int(text)
        if not 0 <= num < _signal.SIGRTMAX + 1:
            raise InvalidArgumentError(f"invalid signal {text!r}")
        return num
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    number = getattr(_signal, name, None) if not name.startswith("SIG_") else None  # SIG_DFL, SIG_BLOCK: not signals
    if not isinstance(number, int):
        raise InvalidArgumentError(f"invalid signal {text!r}")
    return number


def start(store: ContainerStore, cid: str) -> None:
    """Releases the init blocked on the exec fifo, then runs the poststart hooks. Returns once the init has
    its go, as runc's start does; with poststart hooks only once it has exec'd the workload, so that they
    never run before it."""
    with store.locked(cid):
        state = store.load(cid)
        status = status_of(store, state)
        if status != CREATED:
            raise ContainerError(f"cannot start container {cid!r}: it is {status}, not created")
        spec_hooks = state.hooks_of("poststart")
        fifo_path = store.path(cid, FIFO)
        try:  # the init's end (read-write) is the only reader: ENXIO once it is gone
            probe = os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise ContainerError(f"cannot start container {cid!r}: exec fifo {fifo_path}: {e.strerror}") from e
        execed = -1
        try:
            if spec_hooks:
                execed = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            # a writer opened after our reader: only then does the reader see POLLHUP when the
            # last writer closes (fs/pipe.c's w_counter), which is the init's end at execve
            with open(os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC), "wb", 0) as go:
                go.write(b"0")
            os.close(probe)
            probe = -1
            os.unlink(fifo_path)
            if execed >= 0:
                # no events asked: poll returns on POLLHUP only, not while the byte waits to be read
                waiter = select.poll()
                waiter.register(execed, 0)
                waiter.poll()
        finally:
            for fd in (probe, execed):
                if fd >= 0:
                    os.close(fd)
        if spec_hooks:
            try:
                run_hooks("poststart", spec_hooks, oci_state(state, "running"))
            except HookError:
                os.kill(state.pid, _signal.SIGKILL)
                destroy(store, state)
                raise


def kill(store: ContainerStore, cid: str, sig: int, all_processes: bool = False) -> None:
    with store.locked(cid):
        state = store.load(cid)
        status = status_of(store, state)
        private_pidns = "pid" in state.namespaces and state.namespaces["pid"] is None
        if sig == _signal.SIGKILL and not private_pidns:
            # runc's: without a pid namespace of its own, the init's death does not take the rest with
            # it, so SIGKILL goes to every process in the cgroup, even once the init is gone
            _cgroup(state).kill_all(sig)
            return
        if status == STOPPED and not all_processes:
            raise ContainerError(f"cannot kill container {cid!r}: container not running")
        if all_processes:
            _cgroup(state).kill_all(sig)
            return
        try:
            os.kill(state.pid, sig)
        except ProcessLookupError as e:
            raise ContainerError(f"cannot kill container {cid!r}: container not running") from e


def wait_gone(pid: int, start: int, timeout: float) -> bool:
    """Waits for a process that is not our child to exit (a zombie counts as gone)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return True
    try:
        poller = select.poll()  # not select(2): the pidfd passes FD_SETSIZE in a daemon with many pods
        poller.register(pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while process_alive(pid, start):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(max(1, int(min(left, 0.1) * 1000)))
        return True
    finally:
        os.close(pidfd)


def destroy(store: ContainerStore, state: ContainerState) -> None:
    """Undoes create: the cgroup and the state directory go, then the poststop hooks run (warnings only).

    The cgroup-wide SIGKILL (a freeze, a read of every hierarchy's processes, a thaw) is skipped, as runc's
    destroy skips it, when the init had a pid namespace of its own and is dead: the kernel killed every
    process of that namespace before the init's exit completed. A cgroup still busy then (a process moved
    in from outside) gets the kill after all."""
    cg = _cgroup(state)
    alone = state.namespaces.get("pid", "") is None and not process_alive(state.pid, state.pid_start)
    if not alone:
        cg.kill_all(_signal.SIGKILL)
    try:
        cg.destroy()
    except CgroupError:
        if not alone:
            raise
        cg.kill_all(_signal.SIGKILL)
        cg.destroy()
    store.remove(state.id)
    try:
        run_hooks("poststop", state.hooks_of("poststop"), oci_state(state, STOPPED))
    except HookError as e:
        os.write(2, f"warning: {e}\n".encode())


def delete(store: ContainerStore, cid: str, force: bool = False) -> None:
    with store.locked(cid):
        try:
            state = store.load(cid)
        except InternalError:
            if not force:
                raise
            # a record this runtime cannot read names no process or cgroup it could clean up safely
            store.remove(cid)
            return
        status = status_of(store, state)
        if status in (RUNNING, PAUSED, CREATING) and not force:
            raise ContainerError(f"cannot delete container {cid!r} that is not stopped: {status} "
                                 "(use --force to kill it first)")
        if status != STOPPED:
            cg = _cgroup(state)
            if status == PAUSED:
                cg.kill_all(_signal.SIGKILL)
                cg.thaw()
            if state.pid:
                os.kill(state.pid, _signal.SIGKILL)
            cg.kill_all(_signal.SIGKILL)
            if not wait_gone(state.pid, state.pid_start, 10):
                raise InternalError(f"container {cid!r}: init {state.pid} did not die after SIGKILL")
        destroy(store, state)


def pause(store: ContainerStore, cid: str) -> None:
    with store.locked(cid):
        state = store.load(cid)
        status = status_of(store, state)
        if status not in (RUNNING, CREATED):
            raise ContainerError(f"cannot pause container {cid!r}: it is {status}")
        _cgroup(state).freeze()


def resume(store: ContainerStore, cid: str) -> None:
    with store.locked(cid):
        state = store.load(cid)
        if status_of(store, state) != PAUSED:
            raise ContainerError(f"cannot resume container {cid!r}: it is not paused")
        _cgroup(state).thaw()


def update(store: ContainerStore, cid: str, raw_resources: dict) -> None:
    """Merges `raw_resources` (linux.resources of the spec, any subset) into the container's and applies
    the result; the lock spans read, cgroup write and record write, so concurrent updates serialize."""
    from pyruntime.linux.cgroups.resources import Resources
    raw_resources = _fixed_up(raw_resources)
    try:
        new = Resources.from_spec(raw_resources)
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from e
    with store.locked(cid):
        state = store.load(cid)
        if status_of(store, state) == STOPPED:
            raise ContainerError(f"cannot update container {cid!r}: it is stopped")
        merged = state.resources_spec().merge(new)
        # without rules of the spec's, the devices `create` allowed (linux.devices among them) stay as they are
        _cgroup(state).set(merged.with_device_policy() if merged.devices else merged)
        state.resources = _merge_raw(state.resources, raw_resources)
        store.save(state)


def _fixed_up(raw: dict) -> dict:
    """runc update's fix-ups, which make an update of one value drop another the container had (0: unset)
    rather than apply it again where the kernel would refuse the pair: an update of cpu.idle alone drops the
    shares (an idle group refuses cpu.shares and cpu.weight), and one of memory.limit -1 alone drops the
    swap limit (an unlimited memory under a finite memory+swap is refused; the cgroup driver then makes swap
    unlimited too)."""
    cpu, memory = raw.get("cpu"), raw.get("memory")
    if isinstance(cpu, dict) and "idle" in cpu and "shares" not in cpu:
        raw = {**raw, "cpu": {**cpu, "shares": 0}}
    if isinstance(memory, dict) and memory.get("limit") == -1 and "swap" not in memory:
        raw = {**raw, "memory": {**memory, "swap": 0}}
    return raw


def _merge_raw(current: dict, update: dict) -> dict:
    out = dict(current)
    for key, value in update.items():
        out[key] = _merge_raw(out.get(key) or {}, value) if isinstance(value, dict) and key != "unified" else value
    return out


def pids(store: ContainerStore, cid: str) -> list[int]:
    state = store.load(cid)
    if status_of(store, state) == STOPPED:
        return []
    return sorted(_cgroup(state).pids())


def stats(store: ContainerStore, cid: str) -> dict:
    state = store.load(cid)
    if status_of(store, state) == STOPPED:
        raise ContainerError(f"container {cid!r} is stopped")
    return {"type": "stats", "id": cid, "data": _cgroup(state).stats()}


def oom_count(store: ContainerStore, cid: str) -> int:
    return _cgroup(store.load(cid)).oom_kill_count()
