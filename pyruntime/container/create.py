"""The runtime's side of create and run (start, which only needs the stored state, is in control.py).

`create` validates the bundle, makes the cgroup, forks the container (init.py) and
answers its requests: id maps for a new user namespace, the create-time hooks, and finally `ready`.
Any failure undoes every step before the error is reported (the spec's "as if never attempted"): the
container's processes are killed, the cgroup and the state directory removed.
"""
from __future__ import annotations

import os
import time

# `_signal`, not `signal`, which builds enums at import, on every runtime command's start
from _signal import SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, signal

from pynode_os.files import NONE, atomic_write
from pynode_os.proc import process_start_time
from pyruntime import channel
from pyruntime.channel import Channel
from pyruntime.container import init
from pyruntime.container.hooks import run_hooks
from pyruntime.container.store import FIFO, ContainerStore, validate_id
from pyruntime.errors import FailedPreconditionError, InvalidArgumentError
from pyruntime.linux import cgroups, userns
from pyruntime.linux.cgroups.resources import DeviceRule, Resources
from pyruntime.linux.syscalls import PR_SET_CHILD_SUBREAPER, LinuxSyscalls, Syscalls
from pyruntime.oci.spec import IDMapping, Spec, load_bundle
from pyruntime.oci.state import ContainerState, oci_state
from pyruntime.oci.validate import validate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from pyruntime.linux.seccomp.profile import Seccomp


def silent(_msg: str) -> None:
    pass


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def linux_device_rules(spec: Spec) -> tuple[DeviceRule, ...]:
    if spec.linux.resources is not None and spec.linux.resources.devices:
        return ()
    return tuple(DeviceRule(True, d.type if d.type != "u" else "c", d.major, d.minor, "rwm")
                 for d in spec.linux.devices if d.type in ("c", "b", "u"))


def cgroup_resources(spec: Spec) -> Resources:
    """The configured resources with the devices every container needs allowed after its own rules.

    The devices of linux.devices are allowed only when linux.resources.devices is empty: rules given
    there are the whole policy, as with runc, so a deny rule holds for a device the container has."""
    return (spec.linux.resources or Resources()).with_device_policy(linux_device_rules(spec))


def _id_map_text(maps: tuple[IDMapping, ...]) -> str:
    return "".join(f"{m.container_id} {m.host_id} {m.size}\n" for m in maps)


def _idmap_usernses(kernel: Syscalls, spec: Spec) -> dict[int, int]:
    """An fd of a user namespace holding each idmapped mount's mappings, by its index in spec.mounts:
    mount_setattr(2) takes a mapping as a user namespace, not as numbers. Made here, root on the host,
    before the init forks (it inherits them; close-on-exec keeps them from the workload)."""
    fds: dict[int, int] = {}
    user_ns = spec.linux.namespace("user")
    try:
        for i, m in enumerate(spec.mounts):
            if not m.uid_mappings and not {"idmap", "ridmap"} & set(m.options):
                continue
            if not m.uid_mappings and user_ns is not None and user_ns.path is not None:
                fds[i] = _open_ns(user_ns.path, f"mounts[{i}]")  # the joined namespace is the mapping
            else:  # without mappings of its own: the container's
                fds[i] = _mapped_userns(kernel, m.uid_mappings or spec.linux.uid_mappings,
                                        m.gid_mappings or spec.linux.gid_mappings, f"mounts[{i}]")
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _open_ns(path: str, where: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise InvalidArgumentError(f"{where}: the container's user namespace {path}: {e.strerror}") from e


def _mapped_userns(kernel: Syscalls, uids: tuple[IDMapping, ...], gids: tuple[IDMapping, ...], where: str) -> int:
    """The child holding the mapped namespace waits until it is opened here: the open fd alone keeps it."""
    pid, sock = userns.fork_mapped(kernel, (_id_map_text(uids), f"{where}.uidMappings"),
                                   (_id_map_text(gids), f"{where}.gidMappings"), lambda s: s.recv(1))
    try:
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        sock.close()
        os.waitpid(pid, 0)


def fork_in_cgroup(kernel: Syscalls, cg: cgroups.CgroupManager, namespaces: int = 0) -> tuple[int, bool, bool]:
    """Forks the container's first process without moving it afterwards: born in the cgroup's cgroup2
    directory (if it has one), it enters the v1 ones itself (in_cgroup True). Where the kernel refuses the
    first (before 5.7), forked plainly, for the caller to move (False). Either way no process waits on the
    kernel's cgroup lock but the last. A cgroup made only around its first process (the systemd driver's
    scope: CgroupManager.needs_pid) gets it forked plainly too, for end_stage1 to add(). `namespaces`
    (init.clone_flags): born in these new namespaces too, the child is the container's init (cloned True), with
    no stage 1; a host where it can't be (no cgroup2 part to clone into, or a refusal) gets a stage 1. Returns
    (pid or 0 in the child, in_cgroup, cloned)."""
    if cg.needs_pid():
        return os.fork(), False, False
    path = cg.cgroup2_dir()
    if path is None:
        return os.fork(), True, False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if namespaces:
            try:
                return kernel.fork_into_cgroup(fd, namespaces), True, True
            except OSError:
                pass
        return kernel.fork_into_cgroup(fd), True, False
    except OSError:
        return os.fork(), False, False
    finally:
        os.close(fd)


def end_stage1(parent: Channel, cg: cgroups.CgroupManager, stage1_pid: int, in_cgroup: bool) -> int:
    """Stage 1's end as `create` and `exec` see it (pyruntime/channel.py): moved into the cgroup unless it was born
    there, it gets its go and reports the pid of the process it forked, and is reaped. Returns that pid;
    the caller then sends PID_RECEIVED. A failure before the reaping leaves stage 1 to the caller to kill."""
    if not in_cgroup:
        cg.add(stage1_pid)
    parent.send(channel.GO)
    pid = parent.recv(channel.PID)["pid"]
    os.waitpid(stage1_pid, 0)
    return pid


def write_pid_file(path: str, pid: int) -> None:
    atomic_write(path, str(pid).encode(), tmp=f"{path}.{os.getpid()}.tmp", sync=NONE)


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, SIGKILL)
    except ProcessLookupError:
        return
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def hand_over_notify_fd(profile: Seccomp, chan: Channel, pid: int, state: dict) -> None:
    """The seccomp notify fd of the process `pid` (the init, or one that exec started) goes to the agent at
    listenerPath, with the container's state, as runc sends it (the agent lives in the runtime's mount
    namespace, where the container can't reach)."""
    from pyruntime.linux.seccomp import loader
    fd = chan.recv_fd(channel.SECCOMP)
    if fd is None:
        return  # every notify rule named syscalls this kernel lacks: no filter fd was made
    try:
        loader.send_listener_fd(profile, fd, pid=pid, state=state)
    finally:
        os.close(fd)


def require_single_thread(call: str) -> None:
    """Raises before `call` forks from a process with other threads: a fork copies only the calling
    thread, and a lock another one held (in malloc, the import system, a gRPC core thread) stays held
    forever in the child, which hangs in the container's set-up. /proc counts the threads that
    threading.active_count() misses, those of C extensions."""
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        raise FailedPreconditionError(
            f"{call}: refusing to fork from a process with {threads} threads (the child could deadlock on a lock "
            "another thread held); call it from a single-threaded process such as a fork server")


def _refuse_used_cgroup(cg: cgroups.CgroupManager, path: str | None, made: bool) -> None:
    """runc's refusals, with its words: a container sharing a cgroup would be killed, frozen and removed
    with another's, and an init forked into a frozen cgroup would stop before it could report, hanging
    `create`. `made`: the cgroup is new (CgroupManager.create), so it has no process to look for; a new
    cgroup under a frozen v1 parent is frozen all the same."""
    where = f"linux.cgroupsPath {path!r}: " if path else ""
    if not made and cg.pids():
        raise FailedPreconditionError(f"{where}container's cgroup is not empty")
    if cg.state() == cgroups.FROZEN:
        raise FailedPreconditionError(f"{where}container's cgroup unexpectedly frozen")


def create(store: ContainerStore, cid: str, bundle: str, *, spec: Spec | None = None, console_socket: str | None = None,
           pid_file: str | None = None, preserve_fds: int = 0, debug: bool = False,
           kernel: Syscalls | None = None, trace: Callable[[str], None] | None = None,
           systemd_cgroup: bool = False) -> ContainerState:
    """`spec`: the bundle's config already parsed by the caller; read from the bundle if None. Validated
    here either way, before the id is claimed. `kernel` is the syscall layer the container is set up
    through, the real one unless a caller brings its own. `trace` (--debug) hears of each stage, in runc's words.
    `systemd_cgroup`: the container is a systemd scope (linux/cgroups/systemd.py), recorded in its state so that
    later commands manage it so whatever their flags."""
    trace = trace or silent
    require_single_thread(f"create {cid}")
    kernel = kernel or LinuxSyscalls()
    validate_id(cid)
    bundle = os.path.abspath(bundle)
    spec = load_bundle(bundle) if spec is None else spec
    driver = cgroups.detect(kernel)
    if systemd_cgroup:
        from pyruntime.linux.cgroups.systemd import require_systemd
        require_systemd(driver)
        driver = "systemd"
    validate(spec, driver, kernel)
    if spec.process is None:
        raise InvalidArgumentError("process: required to create a container")
    if spec.process.terminal and not console_socket:
        raise InvalidArgumentError("process.terminal is true: --console-socket is required (or use `run` with a tty)")
    store.reserve(cid, kernel)
    state = ContainerState.of_spec(cid, spec, bundle=bundle, created=_now(), owner="root", creator_pid=os.getpid(),
                                   creator_start=process_start_time(os.getpid()) or 0, systemd_cgroup=systemd_cgroup)
    cg = None
    stage1_pid = init_pid = 0
    parent, child = Channel.pair()
    try:
        store.save(state)
        host_cgroups = cgroups.mounts()  # the init's cgroup mount needs them too
        made = cgroups.manager(spec.linux.cgroups_path, cid, kernel, host_cgroups, systemd=systemd_cgroup)
        _refuse_used_cgroup(made, spec.linux.cgroups_path, made.create())
        cg = made  # from here on ours to undo; a refused one belongs to someone else
        cg.set(cgroup_resources(spec))
        os.mkfifo(store.path(cid, FIFO), 0o600)
        trace("nsexec container setup")
        idmap_fds = _idmap_usernses(kernel, spec)
        try:
            pid, in_cgroup, cloned = fork_in_cgroup(kernel, cg, init.clone_flags(spec))
            if pid == 0:
                parent.close()
                start = init.cloned_init if cloned else init.stage1
                start(kernel, spec, bundle, child, store.path(cid, FIFO), console_socket, preserve_fds, idmap_fds,
                      debug, cg.enter_v1 if in_cgroup else None, host_cgroups)
        finally:
            for fd in idmap_fds.values():
                os.close(fd)
        child.close()
        if cloned:
            init_pid = pid
        else:
            stage1_pid = pid
            user_ns = spec.linux.namespace("user")
            if user_ns is not None and user_ns.path is None:
                parent.recv(channel.USERNS)
                userns.write_id_map(stage1_pid, "uid_map", _id_map_text(spec.linux.uid_mappings),
                                    "linux.uidMappings")
                userns.write_id_map(stage1_pid, "gid_map", _id_map_text(spec.linux.gid_mappings),
                                    "linux.gidMappings")
                parent.send(channel.MAPPED)
            init_pid = end_stage1(parent, cg, stage1_pid, in_cgroup)
            stage1_pid = 0
        parent.send(channel.PID_RECEIVED)
        trace(f"child process in init() (pid {init_pid})")
        state.pid, state.pid_start = init_pid, process_start_time(init_pid) or 0
        parent.recv(channel.HOOKS)
        runtime_view = oci_state(state, "creating")
        run_hooks("prestart", spec.hooks.get("prestart", ()), runtime_view, cwd=bundle)
        run_hooks("createRuntime", spec.hooks.get("createRuntime", ()), runtime_view, cwd=bundle)
        parent.send(channel.STATE, state=runtime_view)
        if spec.linux.seccomp is not None and spec.linux.seccomp.uses_notify:
            hand_over_notify_fd(spec.linux.seccomp, parent, init_pid, runtime_view)
        parent.recv(channel.READY)
        if spec.linux.seccomp is not None and trace is not silent:  # the init loaded it with these (runc's words)
            from pyruntime.linux.seccomp import compiler
            trace(f"seccomp filter flags: {compiler.filter_flags(spec.linux.seccomp)}")
        trace("init: closing the pipe to signal completion")
        store.save(state)
        if pid_file:
            write_pid_file(pid_file, init_pid)
        return state
    except BaseException:
        for pid in (stage1_pid, init_pid):
            if pid:
                _kill_and_reap(pid)
        if cg is not None:
            cg.kill_all()
            cg.destroy()
        store.remove(cid)
        raise
    finally:
        parent.close()
        child.close()  # closed at the fork; still open when the set-up before it failed


def become_subreaper(kernel: Syscalls | None) -> None:
    """The init's parent (stage 1) exits at once; as subreaper we inherit it and can wait for its exit.
    `kernel`: None picks the real one, as `create` does (a Runtime made without one)."""
    (kernel or LinuxSyscalls()).prctl(PR_SET_CHILD_SUBREAPER, 1)


def wait_exit(pid: int) -> int:
    """Waits for the container's init, forwarding the signals a foreground runtime gets, like runc."""
    forwarded = (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH)
    for sig in forwarded:
        signal(sig, lambda s, _f: os.kill(pid, s))
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 255
        if got == pid:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
