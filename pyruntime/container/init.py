"""The forked side of `create`: two processes that turn a fork of the runtime into the container.

Stage 1 makes itself non-dumpable (so nothing in the container can open the interpreter through
/proc/PID/exe, CVE-2019-5736's class), joins the namespaces given by path, creates the user namespace
(the runtime writes its id maps) and the others, and, once the runtime has put it in the cgroup, the
cgroup namespace; then it forks stage 2, which is born in the new pid namespace; stage 1 reports its pid and exits.
Stage 2 builds the root filesystem, pivots into it, drops privileges, tells the runtime it is ready and
blocks on the exec fifo until `start`; then it execs the workload itself, so no interpreter is left
running inside the container.
"""
from __future__ import annotations

import errno
import os

from pynode_os.sysctl import proc_path
from pyruntime import channel
from pyruntime.channel import Channel
from pyruntime.container import process, rootfs
from pyruntime.container.hooks import run_hooks
from pyruntime.linux import syscalls as sc
from pyruntime.linux.syscalls import SyscallError, Syscalls
from pyruntime.oci.spec import Spec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from pynode_os.cgroups import HostMounts

NS_FLAGS = {
    "user": sc.CLONE_NEWUSER, "mount": sc.CLONE_NEWNS, "pid": sc.CLONE_NEWPID, "network": sc.CLONE_NEWNET,
    "ipc": sc.CLONE_NEWIPC, "uts": sc.CLONE_NEWUTS, "cgroup": sc.CLONE_NEWCGROUP, "time": sc.CLONE_NEWTIME,
}
# joining order: user first (it grants the rights for the rest), mount last (paths are resolved before it)
JOIN_ORDER = ("user", "ipc", "uts", "network", "pid", "cgroup", "time", "mount")


def fail(chan: Channel | None, err: BaseException, debug: bool = False) -> None:
    """Reports a failure to the runtime, or after `ready` (when the runtime is gone) on stderr as the
    bare message, as runc's init does; `debug` (the runtime's setting) adds the traceback."""
    try:
        if chan is None and isinstance(err, OSError) and err.strerror:
            msg = err.strerror  # without "[Errno N]": the message names the call and the error
        else:
            msg = str(err) or type(err).__name__
        if debug:
            import traceback  # debug only: its import is not for every create to pay
            msg += "\n" + traceback.format_exc()
        if chan is not None:
            chan.send_error(err, msg)
        else:
            os.write(2, f"{msg}\n".encode())
    finally:
        os._exit(127 if chan is None else 1)


def join_namespaces(kernel: Syscalls, spec: Spec) -> None:
    """Every path is opened before the first setns, as runc's nsexec does: once in a joined user namespace
    we are its root, a stranger to the host's files, and the pins of a pod's other namespaces (a root-only
    directory) could no longer be opened."""
    fds: list[tuple[str, str, int]] = []
    try:
        for kind in JOIN_ORDER:
            ns = spec.linux.namespace(kind)
            if ns is None or ns.path is None:
                continue
            try:
                fds.append((kind, ns.path, os.open(ns.path, os.O_RDONLY | os.O_CLOEXEC)))
            except OSError as e:
                raise SyscallError(e.errno, f"linux.namespaces: {kind} namespace {ns.path}: {e.strerror}") from e
        for kind, path, fd in fds:
            try:
                kernel.setns(fd, NS_FLAGS[kind], f"{path} ({kind} namespace)")
            except SyscallError as e:
                if e.errno == errno.EINVAL:
                    raise SyscallError(errno.EINVAL, f"linux.namespaces: {path} is not a {kind} namespace") from e
                raise
            if kind == "user":
                kernel.setresgid(0)
                kernel.setresuid(0)
    finally:
        for _kind, _path, fd in fds:
            os.close(fd)


def write_sysctls(spec: Spec) -> None:
    for key, value in spec.linux.sysctl.items():
        path = proc_path(key)
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError as e:
            raise SyscallError(e.errno or errno.EIO, f"linux.sysctl: write {path}: {e.strerror}") from e


def preload(spec: Spec) -> None:
    """Loads now what the steps after pivot_root need, because the host's files are gone by then."""
    if spec.linux.seccomp is not None:
        from pyruntime.linux.seccomp import loader
        loader.preload()
    if spec.hooks.get("startContainer"):
        import subprocess  # noqa: F401  (run_hooks imports it after pivot_root)


def clone_flags(spec: Spec) -> int:
    """The CLONE_NEW* flags with which the runtime may clone the init straight into its namespaces, with no
    stage 1 (see pyruntime/channel.py), or 0 when it may not: a user namespace (a new one is mapped from outside before
    the rest are made in it; in a joined one the new ones must be made inside it), a joined pid or time
    namespace or a new time namespace (setns and unshare of those take effect for children only), or no
    new namespace at all. The cgroup namespace is never among them: the init unshares it once it is in
    the container's v1 cgroups, so that its root is the container's cgroup in every hierarchy."""
    if spec.linux.namespace("user") is not None:
        return 0
    flags = 0
    for kind, flag in NS_FLAGS.items():
        ns = spec.linux.namespace(kind)
        if ns is None or kind == "cgroup":
            continue
        if kind == "time" or (kind == "pid" and ns.path is not None):
            return 0
        if ns.path is None:
            flags |= flag
    return flags


def _first_steps(kernel: Syscalls, spec: Spec, bundle: str, fifo_path: str, console_socket: str | None,
                 idmap_fds: dict[int, int], enter_cgroup: Callable[[], None] | None,
                 host_cgroups: HostMounts | None) -> tuple[int, object, rootfs.MountFds]:
    """What the container's first process does while still root on the host, before it joins a namespace
    (or, as stage 1, makes one): (the exec fifo, the console socket's connection or None, the mount fds)."""
    if enter_cgroup is not None:
        enter_cgroup()
    kernel.prctl(sc.PR_SET_DUMPABLE, 0)
    # opened before a user namespace makes us an unmapped stranger to the runtime's own files
    fifo = os.open(fifo_path, os.O_RDWR | os.O_CLOEXEC)
    console = None
    if spec.process is not None and spec.process.terminal:
        from pyruntime.container import console as console_mod
        console = console_mod.connect(console_socket) if console_socket else None
    preload(spec)
    if spec.process is not None and spec.process.oom_score_adj is not None:
        # while still root on the host: a joined user namespace's root may not write it
        process.set_oom_score_adj(spec.process.oom_score_adj)
    in_userns = spec.linux.namespace("user") is not None
    mount_ns = spec.linux.namespace("mount")
    if mount_ns is not None and mount_ns.path is not None:
        host_cgroups = None  # a joined mount namespace has mounts of its own: the init reads them there
    fds = rootfs.MountFds(idmap_fds, rootfs.open_sources(kernel, spec, bundle, idmap_fds) if in_userns else {},
                          host_cgroups)
    if in_userns:
        rootfs.enter_bundle(spec)
    return fifo, console, fds


def cloned_init(kernel: Syscalls, spec: Spec, bundle: str, chan: Channel, fifo_path: str,
                console_socket: str | None, preserve_fds: int, idmap_fds: dict[int, int], debug: bool,
                enter_cgroup: Callable[[], None] | None, host_cgroups: HostMounts | None) -> None:
    """The init when the runtime cloned it straight into its new namespaces (clone_flags): stage 1's work
    but for making those namespaces, then stage 2's, in one process. Saves a fork of the runtime and a
    round trip on the channel. Arguments as stage1's."""
    try:
        fifo, console, fds = _first_steps(kernel, spec, bundle, fifo_path, console_socket, idmap_fds,
                                          enter_cgroup, host_cgroups)
        join_namespaces(kernel, spec)
        cgroup_ns = spec.linux.namespace("cgroup")
        if cgroup_ns is not None and cgroup_ns.path is None:
            kernel.unshare(sc.CLONE_NEWCGROUP)
        stage2(kernel, spec, bundle, chan, fifo, console, preserve_fds, False, fds, debug)  # never returns
    except BaseException as e:
        fail(chan, e, debug)


def stage1(kernel: Syscalls, spec: Spec, bundle: str, chan: Channel, fifo_path: str,
           console_socket: str | None, preserve_fds: int, idmap_fds: dict[int, int], debug: bool = False,
           enter_cgroup: Callable[[], None] | None = None, host_cgroups: HostMounts | None = None) -> None:
    """`enter_cgroup`: moves this process into the container's cgroup (CgroupManager.enter_v1), first of all,
    while it is still root on the host and sees the host's cgroup mounts; None: the runtime moves it.
    `host_cgroups`: the host's cgroup hierarchies as the runtime read them (MountFds.cgroups)."""
    try:
        fifo, console, fds = _first_steps(kernel, spec, bundle, fifo_path, console_socket, idmap_fds,
                                          enter_cgroup, host_cgroups)
        in_userns = spec.linux.namespace("user") is not None
        join_namespaces(kernel, spec)
        new = [k for k in NS_FLAGS if (ns := spec.linux.namespace(k)) is not None and ns.path is None]
        if "user" in new:
            kernel.unshare(sc.CLONE_NEWUSER)
            chan.send(channel.USERNS)
            chan.recv(channel.MAPPED)
            kernel.setresgid(0)
            kernel.setresuid(0)
        flags = 0
        for kind in new:
            if kind not in ("user", "cgroup"):
                flags |= NS_FLAGS[kind]
        if flags:
            kernel.unshare(flags)
        # the runtime puts us in the cgroup meanwhile (its first write can wait out an RCU grace period);
        # only the cgroup namespace has to come after, so that its root is the container's cgroup
        chan.recv(channel.GO)
        if "cgroup" in new:
            kernel.unshare(sc.CLONE_NEWCGROUP)
        pid = os.fork()
        if pid == 0:
            stage2(kernel, spec, bundle, chan, fifo, console, preserve_fds, in_userns, fds, debug)
        chan.send(channel.PID, pid=pid)
        os._exit(0)
    except BaseException as e:
        fail(chan, e, debug)


def stage2(kernel: Syscalls, spec: Spec, bundle: str, chan: Channel, fifo: int, console,
           preserve_fds: int, in_userns: bool, fds: rootfs.MountFds, debug: bool = False) -> None:
    """`fifo`: the exec fifo, open for reading and writing (the only fd of the runtime's that the
    container's init holds): `start` writes the byte this process waits for, and this fd's closing at
    execve tells `start` that the workload runs, so that poststart hooks never run before it."""
    try:
        proc = spec.process
        assert proc is not None
        write_sysctls(spec)  # oci/validate.py allowed only sysctls of the container's own namespaces
        os.umask(0)

        state: dict = {}

        def before_pivot() -> None:
            # the channel is shared with stage 1 until the runtime has its report: the first message
            # waits for that, the mounts before it need not (an ERROR may come first: the runtime's
            # recv of the pid raises it as well)
            chan.recv(channel.PID_RECEIVED)
            chan.send(channel.HOOKS)
            state.update(chan.recv(channel.STATE)["state"], pid=os.getpid())
            run_hooks("createContainer", spec.hooks.get("createContainer", ()), state, cwd=spec.root.path)

        rootfs.prepare(kernel, spec, bundle, in_userns, before_pivot, fds)
        if spec.hostname is not None:
            kernel.sethostname(spec.hostname)
        if spec.domainname is not None:
            kernel.setdomainname(spec.domainname)
        if proc.terminal:
            from pyruntime.container import console as console_mod
            console_mod.become_terminal(kernel, console, proc.console_size, proc.user.uid)
        keep = {chan.fileno(), fifo} | set(range(3, 3 + preserve_fds))
        sent: list[int] = []

        def notify(fd: int) -> None:
            chan.send_fd(channel.SECCOMP, fd)
            sent.append(fd)
        cpus = ((spec.raw.get("linux") or {}).get("resources") or {}).get("cpu") or {}
        program, env = process.finalize(kernel, spec.linux.seccomp, proc, keep, notify,
                                        personality=spec.linux.personality, cpus_restricted=bool(cpus.get("cpus")))
        if spec.linux.seccomp is not None and spec.linux.seccomp.uses_notify and not sent:
            chan.send(channel.SECCOMP)
        chan.send(channel.READY)
        chan.close()  # from here on, failures go to stderr: the runtime is gone
        os.read(fifo, 1)
        process.execute(spec.linux.seccomp, proc, program, env, lambda: run_hooks(
            "startContainer", spec.hooks.get("startContainer", ()), dict(state, status="running"), env))
    except BaseException as e:
        fail(chan if chan.sock.fileno() >= 0 else None, e, debug)
