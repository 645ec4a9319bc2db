"""The built-in pause: what holds a pod's namespaces, without an image or an exec.

A pod's network, IPC and UTS namespaces (and its pid namespace when the pod shares one) must exist
before its first container and outlive every container restart. The launcher forks a Python child that
unshares them, sets the pod's hostname and namespaced sysctls, and bind-mounts each namespace under
Layout.ns_dir. The pins alone keep a namespace alive, so a pod that does not share a pid namespace needs no
process at all: the child exits once the pins are made, as CRI-O drops the infra container of such a pod,
and the pod costs no resident process of its own (a waiting Python process is 3 MiB of a pod's memory).
A pod that shares a pid namespace keeps a process: a pid namespace without one can't be entered, and its
init must reap what the pod's containers orphan. CNI DEL and a restarted daemon reach the network
namespace through its pin whether or not a process lives (StopPodSandbox must succeed even without one).

Threat model: the child runs as root in the host's mount namespace, so the only host state it may change
is its own (the pins, its cgroup); a sysctl that is not namespaced, or one whose namespace the pod shares
with the host, would change the host and is refused. release_pause kills a pause only when pid and start
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
from dataclasses import dataclass, field

from pyruntime.errors import InternalError, InvalidArgumentError
from pyruntime.fsutil import NONE, atomic_write
from pyruntime.linux import syscalls as sc
from pyruntime.linux import userns
from pyruntime.oci.state import process_start_time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (PEP 781's idiom)
if TYPE_CHECKING:
    from pyruntime.cri.model import SandboxRecord
    from pyruntime.linux.cgroups import CgroupManager
    from pyruntime.linux.syscalls import Syscalls

# kind as /proc/PID/ns names it -> clone flag; the order the pins are made in
PINNED = (("net", sc.CLONE_NEWNET), ("ipc", sc.CLONE_NEWIPC), ("uts", sc.CLONE_NEWUTS))
# sysctls a pod may set: namespaced by net or ipc (runc's validator, the kubelet's "safe + unsafe" set)
IPC_SYSCTLS = ("kernel.shm", "kernel.msg", "fs.mqueue.")
PAUSE_CGROUP = "pause"  # the pause's leaf below the pod's cgroup parent
EXIT_WAIT = 5.0  # seconds release_pause waits for a killed pause to be gone
PIDFILE = "pause.json"  # {"pid", "start_time"} of the pause, beside its ns dir


@dataclass
class PauseJob:
    """cgroup_parent: "" for none; else a pause that stays (share_pid) joins `<cgroup_parent>/pause` (made if
    missing, as runc makes a container's cgroup). A leaf of its own rather than the parent itself, because
    on cgroup v2 a cgroup with processes can't enable controllers for the pod's container cgroups."""

    sandbox_id: str
    ns_dir: str
    hostname: str = ""
    new_net: bool = True
    new_ipc: bool = True
    new_uts: bool = True
    share_pid: bool = False
    sysctls: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    # a user namespace of the pod's own (mode POD): [container id, host id, length] ranges; none: the host's
    uid_map: list[list[int]] = field(default_factory=list)
    gid_map: list[list[int]] = field(default_factory=list)


@dataclass
class PauseInfo:
    """namespaces: kind (user, net, ipc, uts) -> the pinned file; "pid" -> /proc/PID/ns/pid when the pod shares
    a pid namespace (a pid namespace without processes can't be entered, so pinning it gains nothing).
    pid and start_time: the pause that stays, 0 for a pod without one (no shared pid namespace).
    cgroup: the pause's cgroup path ("" for none)."""

    pid: int
    start_time: int
    namespaces: dict[str, str]
    cgroup: str = ""


def stays(job: PauseJob) -> bool:
    """Whether the pod needs a process of its own: only a shared pid namespace does (see the module doc)."""
    return job.share_pid


def pause_cgroup(cgroup_parent: str) -> str:
    return f"{cgroup_parent.rstrip('/')}/{PAUSE_CGROUP}" if cgroup_parent else ""


def sysctl_path(name: str) -> str:
    """/proc/sys path of a sysctl named with dots (net.ipv4.ip_forward) or slashes (net/ipv4/ip_forward)."""
    return "/proc/sys/" + (name if "/" in name else name.replace(".", "/"))


def check_sysctls(sysctls: dict[str, str], *, new_net: bool, new_ipc: bool) -> None:
    """Refuses, naming it, a sysctl that would change the host: one not namespaced, or one of a
    namespace the pod shares with the host (hostNetwork, hostIPC)."""
    for name in sysctls:
        dotted = name.replace("/", ".")
        if dotted.startswith("net."):
            if not new_net:
                raise InvalidArgumentError(f"sysctls.{name}: not allowed in the host's network namespace")
        elif dotted.startswith(IPC_SYSCTLS) or dotted == "kernel.sem":
            if not new_ipc:
                raise InvalidArgumentError(f"sysctls.{name}: not allowed in the host's IPC namespace")
        else:
            raise InvalidArgumentError(f"sysctls.{name}: not a namespaced sysctl (allowed: net.*, kernel.shm*, "
                                       "kernel.msg*, kernel.sem, fs.mqueue.*)")
        if ".." in name.split("/") or "\0" in name:
            raise InvalidArgumentError(f"sysctls.{name}: not a sysctl name")


def _write_sysctl(name: str, value: str) -> None:
    path = sysctl_path(name)
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
    the PauseInfo's fields, or {"error": kind, "message": ...} (the launcher then undoes the pins and
    the cgroup once this process is gone). Exits once reported; the pause that stays (stays(job)) is the
    child it forks as the pod's pid 1."""
    from pyruntime.cri import launcher
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
        launcher.send_message(report, {"pid": pid, "start_time": start, "namespaces": namespaces,
                                       "cgroup": pause_cgroup(job.cgroup_parent) if cgroup is not None else ""})
    except BaseException as e:
        if pod_init:
            os.kill(pod_init, signal.SIGKILL)
            os.waitpid(pod_init, 0)
        launcher.send_error(report, e)
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
    """The pid 1 of a shared pid namespace (0 when the pod shares none): the process that stays."""
    if not job.share_pid:
        return 0
    kernel.unshare(sc.CLONE_NEWPID)
    pod_init = os.fork()
    if pod_init == 0:
        _settle(kernel)
    return pod_init


def _user_namespace_pod(job: PauseJob, kernel: Syscalls) -> tuple[dict[str, str], int]:
    """Makes the pod's namespaces owned by a user namespace of its own, so that root in the pod is not root
    on the host and its network, IPC and UTS namespaces answer to the pod's root. A child root in that
    namespace makes them (pyruntime.linux.userns); this process, still root on the host, pins them (a
    mount on the host is beyond the child's capabilities). Returns the pins and the pod's pid 1 (0 when it
    shares no pid namespace)."""
    from pyruntime.cri import launcher

    def make_namespaces(sock: socket.socket) -> None:
        try:
            _make_namespaces(job, kernel)
            launcher.send_message(sock, {"init": _pod_init(job, kernel)})
            sock.recv(64)  # pinned: the namespaces no longer need this process
        except BaseException as e:
            launcher.send_error(sock, e)
            raise

    field = "config.linux.security_context.namespace_options.userns_options"  # RunPodSandbox's
    child, ours = userns.fork_mapped(kernel, (_id_map_text(job.uid_map), f"{field}.uids"),
                                     (_id_map_text(job.gid_map), f"{field}.gids"), make_namespaces)
    init = 0
    try:
        data = ours.recv(65536)
        if not data:
            raise InternalError("pause: the child that makes a user namespace exited before it made the pod's "
                                "namespaces")
        message = json.loads(data)
        launcher.raise_reported(message, "pause")
        init = int(message["init"])
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


def _settle(kernel: Syscalls) -> None:
    """The pause's whole life after set-up: no fds, no allocations beyond the wait, reaping what a pod
    sharing its pid namespace leaves to pid 1, until SIGTERM or SIGINT."""
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


def release_pause(pause: PauseInfo | SandboxRecord, ns_dir: str, kernel: Syscalls) -> None:
    """Kills the pause (only if its pid and start time still name it), waits for it to be gone, removes
    the pins under ns_dir and the pause's cgroup. Idempotent: a pause already gone, pins already removed
    are no error, so StopPodSandbox can always finish."""
    if isinstance(pause, PauseInfo):
        pid, start, cgroup = pause.pid, pause.start_time, pause.cgroup
    else:
        pid, start, cgroup = pause.pause_pid, pause.pause_start_time, pause_cgroup(pause.cgroup_parent)
    if pid <= 0:  # a run cut short before the record had the pid: the pause's own note has it
        pid, start = _recorded_pause(ns_dir)
    if pid > 0:
        _kill_if_same(pid, start)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pidfile(ns_dir))
    unpin(ns_dir, kernel)
    if cgroup:
        from pyruntime.linux import cgroups
        manager = cgroups.manager(cgroup, "", kernel)
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
        from pyruntime.cri.launcher import wait_readable
        wait_readable(pidfd, EXIT_WAIT)
    finally:
        os.close(pidfd)
