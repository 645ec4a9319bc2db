"""The built-in pause: what holds a pod's namespaces, without an image or an exec.

A pod's network, IPC and UTS namespaces (and its pid namespace when the pod shares one) must exist
before its first container and outlive every container restart. The launcher forks a Python child that
unshares them, sets the pod's hostname and namespaced sysctls, and bind-mounts each namespace under
Layout.ns_dir. The pins alone keep a namespace alive, so a pod that does not share a pid namespace needs no
process at all: the child exits once the pins are made, as CRI-O drops the infra container of such a pod,
and the pod costs no resident process of its own (bench.cri's memory per pod).
A pod that shares a pid namespace keeps a process: a pid namespace without one can't be entered, and its
init must reap what the pod's containers orphan. CNI DEL and a restarted daemon reach the network
namespace through its pin whether or not a process lives (StopPodSandbox must succeed even without one).

Threat model: the child that sets up runs as root in the host's mount namespace, so the only host state it
may change is its own (the pins, its cgroup); a sysctl that is not namespaced, or one whose namespace the
pod shares with the host, would change the host and is refused. The pause that stays is the pod's pid 1,
which every container of the pod sees in its /proc: before the launcher hears of it, it is confined as
containerd's pause container is under runc (_confine: an empty root of its own, user 65535, no
capabilities, no_new_privs, seccomp, not dumpable) and in the pod's cgroup, so root in the pod with
CAP_SYS_PTRACE reaches nothing of the host through /proc/1. The host's root still reads its /proc/PID/stat
(the start time recovery matches), ns/* and cmdline. release_pause kills a pause only when pid and start
time still name the process this module made: a recycled pid is never signalled.

A pause that stays is forked from the launcher and shares its pages copy-on-write: after reporting it
closes every fd, touches no Python objects it does not need and sleeps in sigwait.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket

from pynode_os.files import NONE, atomic_write
from pynode_os.proc import process_start_time
from pynode_os.sysctl import IPC, NET, namespace_of, normalize, proc_path
from pyruntime import channel
from pyruntime.cri.jobs import CGROUP_PREFIX, PauseInfo, PauseJob
from pyruntime.errors import InternalError, InvalidArgumentError
from pyruntime.linux import syscalls as sc
from pyruntime.linux import userns
from pyruntime.linux.cgroups.paths import DEFAULT_PARENT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.cri.model import SandboxRecord
    from pyruntime.linux.cgroups import CgroupManager
    from pyruntime.linux.syscalls import Syscalls

# kind as /proc/PID/ns names it -> clone flag; the order the pins are made in
PINNED = (("net", sc.CLONE_NEWNET), ("ipc", sc.CLONE_NEWIPC), ("uts", sc.CLONE_NEWUTS))
PAUSE_CGROUP = "pause"  # the pause's leaf below the pod's cgroup parent
EXIT_WAIT = 5.0  # seconds release_pause waits for a killed pause to be gone
PIDFILE = "pause.json"  # {"pid", "start_time"} of the pause, beside its ns dir
PAUSE_ID = 65535  # uid and gid of the pause that stays: the USER of the upstream pause image
EMPTY_ROOT_AT = "/proc"  # a directory every host has and anyone may search, hidden by the pause's empty root
READY = b"confined"  # what the pause tells its parent once _confine is done


def stays(job: PauseJob) -> bool:
    """Whether the pod needs a process of its own: only a shared pid namespace does (see the module doc)."""
    return job.share_pid


def pause_cgroup(cgroup_parent: str, sandbox_id: str, systemd: bool = False) -> str:
    """Where a pause that stays lives: a leaf of the pod's cgroup, or with no parent the cgroup a pause
    container of the pod would have (/pyruntime/<id>, as the runtime names a parentless cgroupsPath), never
    the daemon's own. `systemd`: the scope a pause container of the pod would be, in the pod's slice."""
    if systemd:
        from pyruntime.linux.cgroups.systemd import scope_path
        return scope_path(cgroup_parent, CGROUP_PREFIX, sandbox_id)
    return f"{cgroup_parent.rstrip('/')}/{PAUSE_CGROUP}" if cgroup_parent else f"/{DEFAULT_PARENT}/{sandbox_id}"


def check_sysctls(sysctls: dict[str, str], *, new_net: bool, new_ipc: bool) -> None:
    """Refuses, naming it, a sysctl that would change the host: one not namespaced by net or ipc (a pod's host
    name is its config's, so no UTS one either), or one of a namespace the pod shares with the host
    (hostNetwork, hostIPC)."""
    for name in sysctls:
        ns = namespace_of(normalize(name))
        if ns == NET:
            if not new_net:
                raise InvalidArgumentError(f"sysctls.{name}: not allowed in the host's network namespace")
        elif ns == IPC:
            if not new_ipc:
                raise InvalidArgumentError(f"sysctls.{name}: not allowed in the host's IPC namespace")
        else:
            raise InvalidArgumentError(f"sysctls.{name}: not a namespaced sysctl (allowed: net.*, kernel.shm*, "
                                       "kernel.msg*, kernel.sem, fs.mqueue.*)")
        if ".." in name.split("/") or "\0" in name:
            raise InvalidArgumentError(f"sysctls.{name}: not a sysctl name")


def _write_sysctl(name: str, value: str) -> None:
    path = proc_path(name)
    try:
        with open(path, "w") as f:
            f.write(value)
    except FileNotFoundError as e:
        raise InvalidArgumentError(f"sysctls.{name}: no such sysctl ({path})") from e
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise InvalidArgumentError(f"sysctls.{name}: value {value!r} refused: {e.strerror}") from e
        raise


def pin(job: PauseJob, kernel: Syscalls, proc: str = "self", user: bool = True) -> dict[str, str]:
    """Bind-mounts the namespaces the job makes, of process `proc` (a pid, or self), under job.ns_dir;
    `user`: its user namespace too, when the job has one (False: pinned already)."""
    os.makedirs(job.ns_dir, mode=0o700, exist_ok=True)
    pinned = {}
    kinds = [kind for kind, _flag in PINNED if getattr(job, f"new_{kind}")]
    for kind in ["user"] * (user and bool(job.uid_map)) + kinds:
        path = os.path.join(job.ns_dir, kind)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        kernel.mount(f"/proc/{proc}/ns/{kind}", path, None, sc.MS_BIND, None)
        pinned[kind] = path
    return pinned


def unpin(ns_dir: str, kernel: Syscalls) -> None:
    """Detaches and removes every pin under ns_dir, then ns_dir; a missing one is no error."""
    try:
        names = os.listdir(ns_dir)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(ns_dir, name)
        while True:  # a pin made twice (a retried request) is two mounts
            try:
                kernel.umount(path, sc.MNT_DETACH)
            except OSError as e:
                if e.errno in (errno.EINVAL, errno.ENOENT):
                    break
                raise
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    try:
        os.rmdir(ns_dir)
    except FileNotFoundError:
        pass


def pidfile(ns_dir: str) -> str:
    """Where a pause records itself beside its pins: the daemon saves the pid in the sandbox's record only
    once the launcher answers, so a daemon killed in between would otherwise lose the pause for good."""
    return os.path.join(os.path.dirname(ns_dir), PIDFILE)


def _recorded_pause(ns_dir: str) -> tuple[int, int]:
    try:
        with open(pidfile(ns_dir), "rb") as f:
            data = json.loads(f.read())
        return int(data["pid"]), int(data["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0


def become_pause(job: PauseJob, kernel: Syscalls, report: socket.socket, cgroup: CgroupManager | None) -> None:
    """Runs in a fresh child of the launcher and never returns. Sends one JSON message on `report`:
    the PauseInfo's fields, or the channel's failure (the launcher then undoes the pins and
    the cgroup once this process is gone). Exits once reported; the pause that stays (stays(job)) is the
    child it forks as the pod's pid 1."""
    pod_init = 0
    try:
        os.setsid()
        # blocked from the start: a pid namespace's init drops signals it neither handles nor blocks
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD})
        if cgroup is not None:
            cgroup.add(os.getpid())
        if job.uid_map:
            namespaces, pod_init = _user_namespace_pod(job, kernel)
        else:
            _make_namespaces(job, kernel)
            namespaces = pin(job, kernel)
            pod_init = _pod_init(job, kernel)
        pid = start = 0
        if pod_init:
            pid = pod_init
            namespaces["pid"] = f"/proc/{pid}/ns/pid"
            start = process_start_time(pid) or 0
            if not start:
                raise InternalError(f"pause {pid}: exited during its set-up")
            atomic_write(pidfile(job.ns_dir), json.dumps({"pid": pid, "start_time": start}).encode(), mode=0o600,
                         sync=NONE)
        own = pause_cgroup(job.cgroup_parent, job.sandbox_id, job.systemd_cgroup) if cgroup is not None else ""
        channel.send(report, {"pid": pid, "start_time": start, "namespaces": namespaces, "cgroup": own})
    except BaseException as e:
        if pod_init:
            os.kill(pod_init, signal.SIGKILL)
            os.waitpid(pod_init, 0)
        channel.send_error(report, e)
        os._exit(1)
    os._exit(0)  # a shared pid namespace's init carries on; its parent is the nearest subreaper from now on


def _make_namespaces(job: PauseJob, kernel: Syscalls) -> None:
    flags = 0
    for kind, flag in PINNED:
        if getattr(job, f"new_{kind}"):
            flags |= flag
    if flags:
        kernel.unshare(flags)
    if job.new_uts and job.hostname:
        kernel.sethostname(job.hostname)
    for name, value in job.sysctls.items():
        _write_sysctl(name, value)


def _pod_init(job: PauseJob, kernel: Syscalls) -> int:
    """The pid 1 of a shared pid namespace (0 when the pod shares none): the process that stays, returned
    once it is confined (_confine), so that no container of the pod ever sees it otherwise."""
    if not job.share_pid:
        return 0
    kernel.unshare(sc.CLONE_NEWPID)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    pod_init = os.fork()
    if pod_init == 0:
        os.close(ready_r)
        _settle(job, kernel, ready_w)
    os.close(ready_w)
    try:
        answer = os.read(ready_r, 4096)
    finally:
        os.close(ready_r)
    if answer != READY:
        os.waitpid(pod_init, 0)  # it exits once it has said why
        raise InternalError(f"pause: confining the pod's pid 1: {answer.decode(errors='replace') or 'it exited'}")
    return pod_init


def _user_namespace_pod(job: PauseJob, kernel: Syscalls) -> tuple[dict[str, str], int]:
    """Makes the pod's namespaces owned by a user namespace of its own, so that root in the pod is not root
    on the host and its network, IPC and UTS namespaces answer to the pod's root. A child root in that
    namespace makes them (pyruntime.linux.userns); this process, still root on the host, pins them (a
    mount on the host is beyond the child's capabilities). Returns the pins and the pod's pid 1 (0 when it
    shares no pid namespace)."""

    def make_namespaces(sock: socket.socket) -> None:
        try:
            _make_namespaces(job, kernel)
            channel.send(sock, {"init": _pod_init(job, kernel)})
            sock.recv(64)  # pinned: the namespaces no longer need this process
        except BaseException as e:
            channel.send_error(sock, e)
            raise

    field = "config.linux.security_context.namespace_options.userns_options"  # RunPodSandbox's
    child, ours = userns.fork_mapped(kernel, (_id_map_text(job.uid_map), f"{field}.uids"),
                                     (_id_map_text(job.gid_map), f"{field}.gids"), make_namespaces)
    init = 0
    try:
        got = channel.receive(ours, channel.MAX_SYNC_MESSAGE, max_fds=0)  # one small message, as stage 1's PID
        if got is None:
            raise InternalError("pause: the child that makes a user namespace exited before it made the pod's "
                                "namespaces")
        channel.raise_reported(got[0], "pause")
        pid = got[0].get("init")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
            raise InternalError(f"pause: the user namespace's child sent no pid: {got[0]!r:.100}")
        init = pid
        namespaces = pin(job, kernel, str(child))
        ours.send(b"pinned")
        return namespaces, init
    except BaseException:
        if init:
            os.kill(init, signal.SIGKILL)  # not our child: the pid is safe until its parent, waited below, is gone
        raise
    finally:
        ours.close()
        os.waitpid(child, 0)


def _id_map_text(ranges: list[list[int]]) -> str:
    return "".join(f"{inside} {outside} {length}\n" for inside, outside, length in ranges)


def _pause_id(ranges: list[list[int]]) -> int:
    """PAUSE_ID, unless the pod's user namespace (its [inside, outside, length] ranges) leaves it unmapped:
    then the namespace's root, which holds nothing on the host."""
    if not ranges or any(inside <= PAUSE_ID < inside + length for inside, _outside, length in ranges):
        return PAUSE_ID
    return 0


def _confine(job: PauseJob, kernel: Syscalls) -> None:
    """Makes the pause what containerd's pause container is under runc: the containers of its pod see it as
    their pid 1, and root among them with CAP_SYS_PTRACE would otherwise reach the host's `/` through
    /proc/1/root and /proc/1/cwd. An empty read-only root in a mount namespace of its own (after the pivot
    no path of the host's is left to it), user PAUSE_ID, no capabilities in any set, no_new_privs, the
    RuntimeDefault seccomp filter, and not dumpable last (a change of uid resets it): the kernel then refuses
    its /proc/PID/root, cwd, exe, fd, environ, mem and ptrace to anyone without CAP_SYS_PTRACE in the host's
    user namespace, root in the pod included."""
    from pyruntime.container import rootfs
    from pyruntime.cri.seccomp_default import DEFAULT_CAPS, default_profile
    from pyruntime.linux import capabilities
    from pyruntime.linux.seccomp import loader
    from pyruntime.linux.seccomp.profile import Seccomp
    capabilities.last_cap()  # read now: there is no /proc after the pivot
    profile = Seccomp.from_spec(default_profile(list(DEFAULT_CAPS)))  # the launcher's precompiled one
    loader.preload()
    kernel.unshare(sc.CLONE_NEWNS)
    kernel.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE, None)  # nothing below reaches the host's mounts
    kernel.mount("tmpfs", EMPTY_ROOT_AT, "tmpfs", sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC,
                 "mode=0555")
    rootfs.pivot(kernel, EMPTY_ROOT_AT)
    capabilities.apply(kernel, capabilities.Capabilities(), uid=_pause_id(job.uid_map),
                       gid=_pause_id(job.gid_map), no_new_privileges=True)
    loader.load(profile)
    kernel.prctl(sc.PR_SET_DUMPABLE, 0)


def _settle(job: PauseJob, kernel: Syscalls, ready: int) -> None:
    """The pause's whole life after set-up: confined, then no fds, no allocations beyond the wait, reaping
    what a pod sharing its pid namespace leaves to pid 1, until SIGTERM or SIGINT. `ready`: the pipe on
    which READY or the error that stopped the confinement is told to the parent."""
    try:
        ready = os.dup2(ready, 0, inheritable=False)  # the only fd it keeps until it has answered
        kernel.close_range(1, 0xFFFFFFFF)
        _confine(job, kernel)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(ready, str(e).encode(errors="replace")[:4096] or type(e).__name__.encode())
        os._exit(1)
    os.write(ready, READY)
    kernel.close_range(0, 0xFFFFFFFF)
    waited = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    while True:
        if signal.sigwait(waited) != signal.SIGCHLD:
            os._exit(0)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass


def release_pause(pause: PauseInfo | SandboxRecord, ns_dir: str, kernel: Syscalls, systemd: bool = False) -> None:
    """Kills the pause (only if its pid and start time still name it), waits for it to be gone, removes
    the pins under ns_dir and the pause's cgroup (`systemd`: its scope). Idempotent: a pause already gone, pins
    already removed are no error, so StopPodSandbox can always finish."""
    if isinstance(pause, PauseInfo):
        pid, start, cgroup = pause.pid, pause.start_time, pause.cgroup
    else:
        pid, start = pause.pause_pid, pause.pause_start_time
        cgroup = pause_cgroup(pause.cgroup_parent, pause.id, systemd)
    if pid <= 0:  # a run cut short before the record had the pid: the pause's own note has it
        pid, start = _recorded_pause(ns_dir)
    if pid > 0:
        _kill_if_same(pid, start)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pidfile(ns_dir))
    unpin(ns_dir, kernel)
    if cgroup:
        from pyruntime.linux import cgroups
        manager = cgroups.manager(cgroup, "", kernel, systemd=systemd)
        if manager.exists():
            manager.destroy()


def _kill_if_same(pid: int, start: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        # checked after the pidfd pins the process: the pid can't be reused between the check and the kill
        if process_start_time(pid) != start:
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            return
        channel.wait_readable(pidfd, EXIT_WAIT)
    finally:
        os.close(pidfd)
