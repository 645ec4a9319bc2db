"""The last steps of every container process, shared by the init and by `exec`: limits, identity,
capabilities, no_new_privs, seccomp, the working directory and the exec itself.

These run in a forked, single-threaded, non-dumpable child that has already joined the container's
namespaces; the interpreter never runs in the container after execve.
"""
from __future__ import annotations

import errno
import os
import resource
import stat

from pyruntime.errors import InvalidArgumentError
from pyruntime.linux.syscalls import SyscallError, Syscalls
from pyruntime.oci.spec import Process, warn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from pyruntime.linux.seccomp.profile import Seccomp

CLOSE_RANGE_CLOEXEC = 4


class ProcessError(InvalidArgumentError):
    """The spec's process section can't be applied in this container: a program not found, a cwd that
    does not resolve, an rlimit the kernel refuses. Raised in the container's init and reported by create."""


def restrict_oom_score_adj(wanted: int) -> int:
    """Never below our own score: without CAP_SYS_RESOURCE lowering it fails, as containerd clamps it."""
    try:
        with open("/proc/self/oom_score_adj") as f:
            current = int(f.read())
    except OSError:
        return wanted
    return max(wanted, current)


def set_oom_score_adj(value: int) -> None:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(restrict_oom_score_adj(value)))


def set_rlimits(proc: Process) -> None:
    for r in proc.rlimits:
        kind = getattr(resource, r.type, None)
        if kind is None:
            raise ProcessError(f"process.rlimits: {r.type} is not known to this kernel")
        try:
            resource.setrlimit(kind, (r.soft, r.hard))
        except (ValueError, OSError) as e:
            raise ProcessError(f"setrlimit({r.type}, soft={r.soft}, hard={r.hard}): {e}") from e


def set_affinity(kernel: Syscalls, final: frozenset[int] | None) -> None:
    """An exec'd process's execCPUAffinity.final, else every CPU, which the kernel narrows to the cgroup's
    cpuset: the affinity of whoever ran the runtime (`taskset -c 0 pyruntime run`, a pinned shim) is not the
    container's, as with runc."""
    if final is not None:
        try:
            kernel.sched_setaffinity(0, set(final))
        except SyscallError as e:
            raise ProcessError(f"process.execCPUAffinity.final: {e}") from e
        return
    try:
        kernel.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    except SyscallError as e:
        if e.errno != errno.EINVAL:  # no CPU of ours is in the cpuset: keep what the kernel gave
            raise


def close_fds(kernel: Syscalls, keep: set[int]) -> None:
    """Marks every fd >= 3 except `keep` close-on-exec and closes it now, before cwd is resolved.

    A host directory fd still open when chdir runs is how CVE-2024-21626 escaped
    (cwd=/proc/self/fd/N); closing them first leaves nothing to escape through.
    """
    lo = 3
    for fd in sorted(k for k in keep if k >= 3) + [2**31 - 1]:
        if fd > lo:
            kernel.close_range(lo, fd - 1)
        lo = fd + 1


def lookup(program: str, env: tuple[str, ...]) -> str:
    """Finds the program as the container's own shell would, so a typo fails at create, not at start.
    Checked with the effective ids and capabilities (faccessat AT_EACCESS, runc's Eaccess), as execve
    will: a user with CAP_DAC_OVERRIDE may run a file whose execute bit is only its owner's."""
    if "/" in program:
        if os.access(program, os.X_OK, effective_ids=True):
            return program
        raise ProcessError(f"exec: {program!r}: no such executable file in the container")
    path = next((e[5:] for e in env if e.startswith("PATH=")),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    for d in path.split(":"):
        candidate = os.path.join(d or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK, effective_ids=True):
            return candidate
    raise ProcessError(f"exec: {program!r}: executable file not found in $PATH")


def enter_cwd(cwd: str, retry_later: bool = False) -> bool:
    """Returns False, with `retry_later`, when the cwd refused us with EACCES: root is refused where a
    root-squashing NFS export lets only the user in, so the caller tries again as the user."""
    try:
        os.chdir(cwd)
        here = os.getcwd()
    except FileNotFoundError as e:
        raise ProcessError(f"process.cwd {cwd!r}: does not resolve inside the container's root") from e
    except PermissionError as e:
        if retry_later:
            return False
        raise ProcessError(f"process.cwd {cwd!r}: chdir: {e.strerror}") from e
    except OSError as e:
        raise ProcessError(f"process.cwd {cwd!r}: chdir: {e.strerror}") from e
    if not here.startswith("/"):
        raise ProcessError(f"process.cwd {cwd!r}: resolves outside the container's root")
    return True


def environment(env: tuple[str, ...], uid: int) -> dict[str, str]:
    """The process's environment, the last of repeated names winning; an empty or absent HOME is the
    user's home from the container's /etc/passwd ("/" if it has none), as runc and a login would set it."""
    out = dict(e.partition("=")[::2] for e in env)
    if not out.get("HOME"):
        out["HOME"] = _passwd_home(uid)
    return out


def _passwd_home(uid: int) -> str:
    try:
        # non-blocking and regular-only: the image chooses what /etc/passwd is, a fifo included
        fd = os.open("/etc/passwd", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return "/"
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "/"
        for line in f.read(1 << 20).decode(errors="replace").splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[2] == str(uid) and fields[5]:
                return fields[5]
    return "/"


def load_seccomp(profile: Seccomp | None, notify: Callable[[int], None] | None = None) -> None:
    """Loads the filter; a notify fd (SCMP_ACT_NOTIFY rules) goes to `notify`, which hands it to the
    runtime for the agent at listenerPath, and is closed here either way (unwatched, those syscalls
    then fail with ENOSYS)."""
    if profile is None:
        return
    from pyruntime.linux.seccomp import loader
    fd = loader.load(profile, warn=warn)
    if fd is not None:
        try:
            if notify is not None:
                notify(fd)
        finally:
            os.close(fd)


def _uses_notify(profile: Seccomp | None) -> bool:
    return profile is not None and profile.uses_notify


SCHED_POLICY = {"SCHED_OTHER": 0, "SCHED_FIFO": 1, "SCHED_RR": 2, "SCHED_BATCH": 3, "SCHED_ISO": 4, "SCHED_IDLE": 5,
                "SCHED_DEADLINE": 6}
SCHED_FLAG = {"SCHED_FLAG_RESET_ON_FORK": 0x01, "SCHED_FLAG_RECLAIM": 0x02, "SCHED_FLAG_DL_OVERRUN": 0x04,
              "SCHED_FLAG_KEEP_POLICY": 0x08, "SCHED_FLAG_KEEP_PARAMS": 0x10, "SCHED_FLAG_UTIL_CLAMP_MIN": 0x20,
              "SCHED_FLAG_UTIL_CLAMP_MAX": 0x40}
IOPRIO_CLASS = {"IOPRIO_CLASS_RT": 1, "IOPRIO_CLASS_BE": 2, "IOPRIO_CLASS_IDLE": 3}
IOPRIO_WHO_PGRP = 1
PERSONA = {"LINUX": 0x0000, "LINUX32": 0x0008}


def set_scheduling(kernel: Syscalls, proc: Process, personality: str | None, cpus_restricted: bool) -> None:
    """process.scheduler, process.ioPriority (for the process group, as runc) and linux.personality, while
    the process still has the capabilities a real-time policy or a negative nice needs."""
    s = proc.scheduler
    if s is not None:
        flags = 0
        for flag in s.flags:
            flags |= SCHED_FLAG[flag]
        try:
            kernel.sched_setattr(SCHED_POLICY[s.policy], flags, s.nice, s.priority, s.runtime, s.deadline, s.period)
        except OSError as e:
            if e.errno == errno.EPERM and cpus_restricted:
                # the kernel's reason (sched_setattr(2)): the affinity mask does not hold every CPU
                raise ProcessError("process.scheduler: process scheduler can't be used together with AllowedCPUs "
                                   "(linux.resources.cpu.cpus)") from e
            raise ProcessError(f"process.scheduler: {e}") from e
    if proc.io_priority is not None:
        io = proc.io_priority
        try:
            kernel.ioprio_set(IOPRIO_WHO_PGRP, 0, IOPRIO_CLASS[io.klass] << 13 | io.priority)
        except OSError as e:
            raise ProcessError(f"process.ioPriority: {e}") from e
    if personality is not None:
        kernel.personality(PERSONA[personality])


def finalize(kernel: Syscalls, profile: Seccomp | None, proc: Process, keep_fds: set[int],
             notify: Callable[[int], None] | None = None, personality: str | None = None,
             cpus_restricted: bool = False, affinity: frozenset[int] | None = None) -> tuple[str, dict[str, str]]:
    """Everything up to the exec; returns the resolved program path and the environment. Errors name the
    step. The cwd is entered as root, before the user and capabilities change (runc's order: a cwd only
    root can enter works), and again as the user where root was refused.

    A filter with notify rules is loaded here even with no_new_privs, while the runtime still listens
    for its fd; otherwise a no_new_privs filter waits for `execute`, the last step before exec."""
    set_rlimits(proc)
    kernel.reset_signals()  # before any seccomp filter, which may not allow rt_sigaction
    set_affinity(kernel, affinity)
    set_scheduling(kernel, proc, personality, cpus_restricted)
    close_fds(kernel, keep_fds)
    env = environment(proc.env, proc.user.uid)
    entered = enter_cwd(proc.cwd, retry_later=True)
    nnp = proc.no_new_privileges
    if not nnp:
        # without no_new_privs, loading a filter needs CAP_SYS_ADMIN, which the next step may drop
        load_seccomp(profile, notify)
    from pyruntime.linux import capabilities
    capabilities.apply(kernel, proc.capabilities, uid=proc.user.uid, gid=proc.user.gid,
                       additional_gids=proc.user.additional_gids, no_new_privileges=nnp, warn=warn)
    if nnp and _uses_notify(profile):
        load_seccomp(profile, notify)
    os.umask(proc.user.umask if proc.user.umask is not None else 0o022)
    if not entered:
        enter_cwd(proc.cwd)
    return lookup(proc.args[0], tuple(f"{k}={v}" for k, v in env.items())), env


def execute(profile: Seccomp | None, proc: Process, program: str, env: dict[str, str],
            before_exec: Callable[[], None] | None = None) -> None:
    """Loads the no_new_privs seccomp filter, runs `before_exec` (the startContainer hooks: under the filter,
    as runc runs them), then becomes the workload."""
    if proc.no_new_privileges and not _uses_notify(profile):
        load_seccomp(profile)
    if before_exec is not None:
        before_exec()
    try:
        os.execve(program, list(proc.args), env)
    except OSError as e:
        # runc's (Go's) wording, which tools match: "exec /run.sh: no such file or directory"
        strerror = e.strerror or os.strerror(e.errno or 0)
        raise SyscallError(e.errno, f"exec {program}: {strerror[:1].lower()}{strerror[1:]}") from e
