"""The last steps of every container process, shared by the init and by `exec`: limits, identity,
capabilities, no_new_privs, seccomp, the working directory and the exec itself.

These run in a forked, single-threaded, non-dumpable child that has already joined the container's
namespaces; the interpreter never runs in the container after execve.
"""
from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable

from pyruntime.errors import InvalidArgumentError
from pyruntime.linux.syscalls import SyscallError, Syscalls
from pyruntime.oci.spec import Process, warn

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (PEP 781's idiom)
if TYPE_CHECKING:
    from pyruntime.linux.seccomp import Seccomp

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
    """Finds the program as the container's own shell would, so a typo fails at create, not at start."""
    if "/" in program:
        if os.access(program, os.X_OK):
            return program
        raise ProcessError(f"exec: {program!r}: no such executable file in the container")
    path = next((e[5:] for e in env if e.startswith("PATH=")),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    for d in path.split(":"):
        candidate = os.path.join(d or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ProcessError(f"exec: {program!r}: executable file not found in $PATH")


def enter_cwd(cwd: str) -> None:
    try:
        os.chdir(cwd)
        here = os.getcwd()
    except FileNotFoundError as e:
        raise ProcessError(f"process.cwd {cwd!r}: does not resolve inside the container's root") from e
    except OSError as e:
        raise ProcessError(f"process.cwd {cwd!r}: chdir: {e.strerror}") from e
    if not here.startswith("/"):
        raise ProcessError(f"process.cwd {cwd!r}: resolves outside the container's root")


def load_seccomp(profile: Seccomp | None, notify: Callable[[int], None] | None = None) -> None:
    """Loads the filter; a notify fd (SCMP_ACT_NOTIFY rules) goes to `notify`, which hands it to the
    runtime for the agent at listenerPath, and is closed here either way (unwatched, those syscalls
    then fail with ENOSYS)."""
    if profile is None:
        return
    from pyruntime.linux import seccomp
    fd = seccomp.load(profile, warn=warn)
    if fd is not None:
        try:
            if notify is not None:
                notify(fd)
        finally:
            os.close(fd)


def _uses_notify(profile: Seccomp | None) -> bool:
    return profile is not None and profile.uses_notify


def finalize(kernel: Syscalls, profile: Seccomp | None, proc: Process, keep_fds: set[int],
             notify: Callable[[int], None] | None = None) -> str:
    """Everything up to the exec; returns the resolved program path. Errors name the step.

    A filter with notify rules is loaded here even with no_new_privs, while the runtime still listens
    for its fd; otherwise a no_new_privs filter waits for `execute`, the last step before exec."""
    set_rlimits(proc)
    close_fds(kernel, keep_fds)
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
    enter_cwd(proc.cwd)
    return lookup(proc.args[0], proc.env)


def execute(profile: Seccomp | None, proc: Process, program: str,
            before_exec: Callable[[], None] | None = None) -> None:
    """Loads the no_new_privs seccomp filter as the very last step, then becomes the workload."""
    if before_exec is not None:
        before_exec()
    if proc.no_new_privileges and not _uses_notify(profile):
        load_seccomp(profile)
    env = dict(e.split("=", 1) for e in proc.env)
    # ignored dispositions survive execve: undo the ones Python set at start-up, or the workload would
    # never die of SIGPIPE (`yes | head` spinning on EPIPE) as it does under runc
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execve(program, list(proc.args), env)
    except OSError as e:
        raise SyscallError(e.errno, f"exec {program}: {e.strerror}") from e
