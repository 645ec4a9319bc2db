"""Every raw kernel call the runtime makes, as small typed functions behind one interface.

The container set-up logic (rootfs, namespaces, init), the layer unpacker and the snapshotter talk only
to a `Syscalls` object they are handed, so their unit tests run without root against `FakeSyscalls`
(tests/unit), the way youki tests its syscall trait. There is deliberately no module-level instance:
only the entry points (the CLI, `create`, `exec`, the image store) make a `LinuxSyscalls`, so a module
that forgets to take the object has nothing to fall back on, and tests/unit/test_syscall_layer.py fails
on any raw call (os.mknod, os.chown, ctypes, ...) made outside this module.
Each failure raises `SyscallError`, an OSError whose message names the call and the path, because an
error such as "Invalid argument" alone never tells a user which of forty mounts went wrong.

Only ctypes and os are imported: this module is on the container start path.
"""
from __future__ import annotations

import ctypes
import errno
import os
from _signal import SIGCHLD  # not `signal`, which builds enums at import

from pynode_os import mounts
from pynode_os.libc import libc

# mount(2)'s flags, which the runtime's modules name sc.MS_* (re-exported)
from pynode_os.mounts import MNT_DETACH as MNT_DETACH
from pynode_os.mounts import MS_BIND as MS_BIND
from pynode_os.mounts import MS_DIRSYNC as MS_DIRSYNC
from pynode_os.mounts import MS_LAZYTIME as MS_LAZYTIME
from pynode_os.mounts import MS_MANDLOCK as MS_MANDLOCK
from pynode_os.mounts import MS_MOVE as MS_MOVE
from pynode_os.mounts import MS_NOATIME as MS_NOATIME
from pynode_os.mounts import MS_NODEV as MS_NODEV
from pynode_os.mounts import MS_NODIRATIME as MS_NODIRATIME
from pynode_os.mounts import MS_NOEXEC as MS_NOEXEC
from pynode_os.mounts import MS_NOSUID as MS_NOSUID
from pynode_os.mounts import MS_NOSYMFOLLOW as MS_NOSYMFOLLOW
from pynode_os.mounts import MS_PRIVATE as MS_PRIVATE
from pynode_os.mounts import MS_RDONLY as MS_RDONLY
from pynode_os.mounts import MS_REC as MS_REC
from pynode_os.mounts import MS_RELATIME as MS_RELATIME
from pynode_os.mounts import MS_REMOUNT as MS_REMOUNT
from pynode_os.mounts import MS_SHARED as MS_SHARED
from pynode_os.mounts import MS_SILENT as MS_SILENT
from pynode_os.mounts import MS_SLAVE as MS_SLAVE
from pynode_os.mounts import MS_STRICTATIME as MS_STRICTATIME
from pynode_os.mounts import MS_SYNCHRONOUS as MS_SYNCHRONOUS
from pynode_os.mounts import MS_UNBINDABLE as MS_UNBINDABLE
from pyruntime.errors import InternalError

libc.syscall.restype = ctypes.c_long
# typed once: the init reads and drops every capability bit through prctl, and would otherwise make four
# c_ulong objects per call
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)

# the new mount API (fsopen/fsconfig/fsmount/move_mount)
FSOPEN_CLOEXEC = FSMOUNT_CLOEXEC = 1
FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 1, 6
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_SYMLINKS = 0x10
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
# mount_setattr(2) attributes
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
MOUNT_ATTR__ATIME = 0x70
MOUNT_ATTR_RELATIME = 0x0
MOUNT_ATTR_NOATIME = 0x10
MOUNT_ATTR_STRICTATIME = 0x20
MOUNT_ATTR_NODIRATIME = 0x80
MOUNT_ATTR_NOSYMFOLLOW = 0x200000
MOUNT_ATTR_IDMAP = 0x100000
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC

M_ARENA_MAX = -8  # mallopt(3)

# interface flags (linux/sockios.h, linux/if.h)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

# namespaces
CLONE_NEWNS = 0x00020000
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3), linux/nsfs.h
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080

# prctl
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# openat2 resolve flags
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

O_PATH = getattr(os, "O_PATH", 0o10000000)

_SYSCALL_NR = {
    "x86_64": {"pivot_root": 155, "rt_sigaction": 13, "setns": 308, "openat2": 437, "close_range": 436,
               "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
               "mount_setattr": 442, "sched_setattr": 314, "ioprio_set": 251, "personality": 135, "clone3": 435,
               "bpf": 321},
    "aarch64": {"pivot_root": 41, "rt_sigaction": 134, "setns": 268, "openat2": 437, "close_range": 436,
                "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
                "mount_setattr": 442, "sched_setattr": 274, "ioprio_set": 30, "personality": 92, "clone3": 435,
                "bpf": 280},
}[os.uname().machine]

# bpf(2) commands, program and attach types, attach flags (linux/bpf.h)
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_DETACH, BPF_PROG_GET_FD_BY_ID, BPF_PROG_QUERY = 5, 8, 9, 13, 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2

CLONE_INTO_CGROUP = 0x200000000
_libc_gil = ctypes.PyDLL(None, use_errno=True)


class _CloneArgs(ctypes.Structure):  # struct clone_args, up to `cgroup` (CLONE_ARGS_SIZE_VER2)
    _fields_ = [(name, ctypes.c_uint64) for name in ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal",
                                                      "stack", "stack_size", "tls", "set_tid", "set_tid_size",
                                                      "cgroup")]


def _path_of_fd(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd {fd}"


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32),
                ("sched_runtime", ctypes.c_uint64), ("sched_deadline", ctypes.c_uint64),
                ("sched_period", ctypes.c_uint64)]


class SyscallError(InternalError, OSError):
    """An OSError that names the call and the path it was made on; `errno` stays for callers that branch on it."""


def _fail(call: str, path: str | None = None) -> SyscallError:
    err = ctypes.get_errno()
    where = f" {path}" if path else ""
    return SyscallError(err, f"{call}{where}: {os.strerror(err)}")


def _os_fail(call: str, path: str | int, dir_fd: int | None, e: OSError) -> SyscallError:
    """The same error for a call made through os: the errno kept, the call and the path named (relative
    paths with the directory fd they were resolved from, which /proc/self/fd names)."""
    where = f"fd {path}" if isinstance(path, int) else path
    if dir_fd is not None:
        where = f"{where} (in {_fd_target(dir_fd)})"
    err = SyscallError(e.errno, f"{call} {where}: {e.strerror}")
    err.filename = e.filename
    return err


def _set_ids(fn, *args: object, call: str) -> None:
    try:
        fn(*args)
    except OSError as e:
        raise SyscallError(e.errno, f"{call}: {e.strerror}") from e


def _fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd {fd}"


def _b(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class Syscalls:
    """The kernel interface the container logic uses; `LinuxSyscalls` is real, `FakeSyscalls` records.

    A plain base class rather than a typing.Protocol: every CLI command (kill, state, delete reach
    this module through the cgroup driver) would pay typing's import.
    """

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        raise NotImplementedError

    def umount(self, target: str, flags: int = 0) -> None:
        raise NotImplementedError

    def pivot_root(self, new_root: str, put_old: str) -> None:
        raise NotImplementedError

    def unshare(self, flags: int) -> None:
        raise NotImplementedError

    def setns(self, fd: int, nstype: int, path: str) -> None:
        raise NotImplementedError

    def sethostname(self, name: str) -> None:
        raise NotImplementedError

    def setdomainname(self, name: str) -> None:
        raise NotImplementedError

    def openat2(self, dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
        raise NotImplementedError

    def mknod(self, path: str, mode: int, device: int, dir_fd: int | None = None) -> None:
        raise NotImplementedError

    def chmod(self, path: str | int, mode: int, dir_fd: int | None = None, follow_symlinks: bool = True) -> None:
        raise NotImplementedError

    def chown(self, path: str | int, uid: int, gid: int, dir_fd: int | None = None,
              follow_symlinks: bool = True) -> None:
        raise NotImplementedError

    def symlink(self, target: str, path: str, dir_fd: int | None = None) -> None:
        raise NotImplementedError

    def statfs_type(self, path: str) -> int:
        raise NotImplementedError

    def statvfs_flags(self, path: str) -> int:
        raise NotImplementedError

    def statvfs(self, path: str) -> os.statvfs_result:
        raise NotImplementedError

    def ns_type(self, path: str) -> int | None:
        raise NotImplementedError

    def malloc_arenas(self, most: int) -> None:
        """mallopt(M_ARENA_MAX): at most `most` glibc malloc arenas for the whole process (as the
        MALLOC_ARENA_MAX variable would), which only threads started afterwards obey."""
        raise NotImplementedError

    def loopback_up(self, netns: str) -> None:
        """Sets `lo` up in the network namespace pinned at `netns` (as CRI-O's ocicni does, instead of a
        loopback CNI plugin exec)."""
        raise NotImplementedError

    def prctl(self, option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
        raise NotImplementedError

    def set_process_name(self, name: bytes) -> None:
        """prctl(PR_SET_NAME): this thread's comm (ps, top), truncated to 15 bytes."""
        raise NotImplementedError

    def capget(self) -> tuple[int, int, int]:
        raise NotImplementedError

    def capset(self, effective: int, permitted: int, inheritable: int) -> None:
        raise NotImplementedError

    def setgroups(self, groups: list[int]) -> None:
        raise NotImplementedError

    def setresgid(self, gid: int) -> None:
        """The real, effective and saved gid, all three: an id kept saved would let the workload switch back."""
        raise NotImplementedError

    def setresuid(self, uid: int) -> None:
        """The real, effective and saved uid, all three (see setresgid)."""
        raise NotImplementedError

    def close_range(self, first: int, last: int, flags: int = 0) -> None:
        raise NotImplementedError

    def reset_signals(self) -> None:
        """Every signal's disposition back to the default, as a freshly exec'd runc init leaves them: an
        ignored disposition survives execve, and Python (SIGPIPE, SIGXFSZ) or whatever started us (GNU make
        ignores 32 and 33) would pass it on to the workload. The raw rt_sigaction, since glibc refuses to
        touch the two signals it reserves."""
        raise NotImplementedError

    def sched_setaffinity(self, pid: int, cpus: set[int]) -> None:
        raise NotImplementedError

    def sched_setattr(self, policy: int, flags: int, nice: int, priority: int, runtime: int, deadline: int,
                      period: int) -> None:
        """sched_setattr(2) on the calling thread."""
        raise NotImplementedError

    def ioprio_set(self, which: int, who: int, ioprio: int) -> None:
        raise NotImplementedError

    def personality(self, persona: int) -> None:
        raise NotImplementedError

    def mount_with_fsconfig(self, fstype: str, settings: list[tuple[str, str]], target: str) -> None:
        raise NotImplementedError

    def mount_setattr_recursive(self, fd: int, attr_set: int, attr_clr: int, path: str) -> None:
        raise NotImplementedError

    def clone_mount(self, source: str, recursive: bool, userns_fd: int | None = None, ridmap: bool = False) -> int:
        """open_tree(OPEN_TREE_CLONE): a detached copy of the mount at `source` (with its submounts if
        `recursive`), which attach_mount can put in another mount namespace; the caller closes it. With
        `userns_fd`, the copy is idmapped through that user namespace (its submounts too with `ridmap`)."""
        raise NotImplementedError

    def attach_mount(self, tree: int, target: str) -> None:
        """move_mount(2) of a detached tree onto `target` (a /proc/self/fd magic link is followed)."""
        raise NotImplementedError

    def mount_idmapped(self, source: str, userns_fd: int, target: str, *, rbind: bool = False,
                       ridmap: bool = False) -> None:
        """Mounts at `target` a clone of the mount at `source` (a bind mount of it; with `rbind` its submounts
        too) whose file ids are shifted through the user namespace `userns_fd`: a file owned by 0 on disk is
        owned by whatever 0 maps to in that namespace. `ridmap`: the submounts are idmapped too."""
        raise NotImplementedError

    def bpf_prog_load(self, prog_type: int, program: bytes, license: str, name: str) -> int:
        """BPF_PROG_LOAD of `program` (struct bpf_insn's, concatenated): the program's fd, close-on-exec, which
        the caller closes. The verifier's log is in the error of a program it refuses."""
        raise NotImplementedError

    def bpf_prog_attach(self, target_fd: int, prog_fd: int, attach_type: int, flags: int) -> None:
        """BPF_PROG_ATTACH to the cgroup directory `target_fd`; the cgroup holds the program from then on."""
        raise NotImplementedError

    def bpf_prog_detach(self, target_fd: int, prog_fd: int, attach_type: int) -> None:
        raise NotImplementedError

    def bpf_prog_query(self, target_fd: int, attach_type: int) -> list[int]:
        """BPF_PROG_QUERY: the ids of the programs attached to the cgroup itself (not its ancestors')."""
        raise NotImplementedError

    def bpf_prog_get_fd_by_id(self, prog_id: int) -> int:
        """An fd (close-on-exec) of the loaded program `prog_id`, which the caller closes."""
        raise NotImplementedError

    def fork_into_cgroup(self, cgroup_fd: int, namespaces: int = 0) -> int:
        """fork(2) whose child starts in the cgroup2 directory `cgroup_fd` (clone3 CLONE_INTO_CGROUP): 0 in
        the child, its pid in the parent. A process moved by a cgroup.procs write waits on the kernel's
        cgroup threadgroup lock (an RCU grace period: bench.runtime); one born in its cgroup does not.
        `namespaces`: CLONE_NEW* flags of namespaces the child is born in (a new pid namespace makes it
        its pid 1). CPython's fork bookkeeping (PyOS_BeforeFork and the AfterFork pair) runs around it as
        os.fork's. OSError when the kernel refuses (before 5.7: ENOSYS; a cgroup that can't take processes)."""
        raise NotImplementedError


class LinuxSyscalls(Syscalls):
    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        try:
            mounts.mount(source, target, fstype, flags, data)
        except mounts.MountError as e:
            raise SyscallError(e.errno, e.strerror) from None

    def umount(self, target: str, flags: int = 0) -> None:
        try:
            mounts.umount(target, flags)
        except mounts.MountError as e:
            raise SyscallError(e.errno, e.strerror) from None

    def pivot_root(self, new_root: str, put_old: str) -> None:
        if libc.syscall(_SYSCALL_NR["pivot_root"], _b(new_root), _b(put_old)) != 0:
            raise _fail("pivot_root", f"{new_root} (old root at {put_old})")

    def unshare(self, flags: int) -> None:
        if libc.unshare(flags) != 0:
            raise _fail(f"unshare({flags:#x})")

    def setns(self, fd: int, nstype: int, path: str) -> None:
        if libc.setns(fd, nstype) != 0:
            raise _fail("setns", path)

    def sethostname(self, name: str) -> None:
        raw = name.encode()
        if libc.sethostname(raw, len(raw)) != 0:
            raise _fail(f"sethostname({name!r})")

    def setdomainname(self, name: str) -> None:
        raw = name.encode()
        if libc.setdomainname(raw, len(raw)) != 0:
            raise _fail(f"setdomainname({name!r})")

    def openat2(self, dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
        how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
        fd = libc.syscall(_SYSCALL_NR["openat2"], dirfd, _b(path), ctypes.byref(how), ctypes.sizeof(how))
        if fd < 0:
            raise _fail("openat2", path)
        return fd

    def mknod(self, path: str, mode: int, device: int, dir_fd: int | None = None) -> None:
        try:
            os.mknod(path, mode, device, dir_fd=dir_fd)
        except OSError as e:
            raise _os_fail("mknod", path, dir_fd, e) from e

    def chmod(self, path: str | int, mode: int, dir_fd: int | None = None, follow_symlinks: bool = True) -> None:
        try:
            os.chmod(path, mode, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        except OSError as e:
            raise _os_fail(f"chmod({mode:#o})", path, dir_fd, e) from e

    def chown(self, path: str | int, uid: int, gid: int, dir_fd: int | None = None,
              follow_symlinks: bool = True) -> None:
        try:
            os.chown(path, uid, gid, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        except OSError as e:
            raise _os_fail(f"chown({uid}:{gid})", path, dir_fd, e) from e

    def symlink(self, target: str, path: str, dir_fd: int | None = None) -> None:
        try:
            os.symlink(target, path, dir_fd=dir_fd)
        except OSError as e:
            raise _os_fail(f"symlink(-> {target})", path, dir_fd, e) from e

    def statfs_type(self, path: str) -> int:
        """The filesystem's magic number (f_type), which os.statvfs does not report."""
        try:
            return mounts.statfs_type(path)
        except mounts.MountError as e:
            raise SyscallError(e.errno, e.strerror) from None

    def statvfs_flags(self, path: str) -> int:
        return self.statvfs(path).f_flag

    def statvfs(self, path: str) -> os.statvfs_result:
        try:
            return os.statvfs(path)
        except OSError as e:
            raise _os_fail("statvfs", path, None, e) from e

    def ns_type(self, path: str) -> int | None:
        """The CLONE_NEW* flag of the namespace file at `path` (a /proc/PID/ns link, or a bind mount of one
        such as /run/netns/NAME) by the NS_GET_NSTYPE ioctl; None when the file is not a namespace."""
        import fcntl
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as e:
            raise _os_fail("open", path, None, e) from e
        try:
            return fcntl.ioctl(fd, NS_GET_NSTYPE)
        except OSError as e:
            if e.errno in (errno.ENOTTY, errno.EINVAL):
                return None
            raise _os_fail("ioctl(NS_GET_NSTYPE)", path, None, e) from e
        finally:
            os.close(fd)

    def malloc_arenas(self, most: int) -> None:
        if libc.mallopt(M_ARENA_MAX, most) != 1:  # mallopt returns 1 on success, without errno
            raise SyscallError(errno.EINVAL, f"mallopt(M_ARENA_MAX, {most}): refused")

    def loopback_up(self, netns: str) -> None:
        """From a thread of its own that enters the namespace and ends: a network namespace is per thread,
        so the calling process (a threaded daemon, which must not fork) never leaves its own."""
        import fcntl
        import socket
        import struct
        import threading
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise _os_fail("open", netns, None, e) from e
        failure: list[BaseException] = []

        def bring_up() -> None:
            try:
                self.setns(fd, CLONE_NEWNET, netns)
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    request = struct.pack("16sh22x", b"lo", 0)
                    try:
                        flags = struct.unpack_from("16xh", fcntl.ioctl(s, SIOCGIFFLAGS, request))[0]
                        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))
                    except OSError as e:
                        raise _os_fail("ioctl(SIOCSIFFLAGS, lo)", netns, None, e) from e
            except BaseException as e:
                failure.append(e)

        try:
            thread = threading.Thread(target=bring_up, name="loopback-up")
            thread.start()
            thread.join()
        finally:
            os.close(fd)
        if failure:
            raise failure[0]

    def prctl(self, option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
        ret = libc.prctl(option, arg2, arg3, arg4, arg5)
        if ret < 0:
            raise _fail(f"prctl({option})")
        return ret

    def set_process_name(self, name: bytes) -> None:
        buffer = ctypes.create_string_buffer(name[:15])  # alive until prctl returns
        self.prctl(PR_SET_NAME, ctypes.addressof(buffer))

    def capget(self) -> tuple[int, int, int]:
        """(effective, permitted, inheritable) of the calling thread as 64-bit masks."""
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        if libc.capget(ctypes.byref(header), data) != 0:
            raise _fail("capget")
        lo, hi = data
        return (lo.effective | hi.effective << 32, lo.permitted | hi.permitted << 32,
                lo.inheritable | hi.inheritable << 32)

    def capset(self, effective: int, permitted: int, inheritable: int) -> None:
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        for i in range(2):
            shift = 32 * i
            data[i].effective = effective >> shift & 0xFFFFFFFF
            data[i].permitted = permitted >> shift & 0xFFFFFFFF
            data[i].inheritable = inheritable >> shift & 0xFFFFFFFF
        if libc.capset(ctypes.byref(header), data) != 0:
            raise _fail(f"capset(effective={effective:#x}, permitted={permitted:#x}, inheritable={inheritable:#x})")

    def setgroups(self, groups: list[int]) -> None:
        _set_ids(os.setgroups, groups, call=f"setgroups({groups})")

    def setresgid(self, gid: int) -> None:
        _set_ids(os.setresgid, gid, gid, gid, call=f"setresgid({gid}, {gid}, {gid})")

    def setresuid(self, uid: int) -> None:
        _set_ids(os.setresuid, uid, uid, uid, call=f"setresuid({uid}, {uid}, {uid})")

    def close_range(self, first: int, last: int, flags: int = 0) -> None:
        nr = _SYSCALL_NR["close_range"]
        if libc.syscall(nr, ctypes.c_uint(first), ctypes.c_uint(last), ctypes.c_uint(flags)) != 0:
            raise _fail(f"close_range({first}, {last})")

    def reset_signals(self) -> None:
        default = (ctypes.c_ulong * 4)()  # struct kernel_sigaction, all zero: SIG_DFL, no flags, empty mask
        for sig in range(1, 65):
            if sig in (9, 19):  # SIGKILL, SIGSTOP: theirs can't change
                continue
            if libc.syscall(_SYSCALL_NR["rt_sigaction"], sig, ctypes.byref(default), None, 8) != 0:
                raise _fail(f"rt_sigaction({sig}, SIG_DFL)")

    def sched_setaffinity(self, pid: int, cpus: set[int]) -> None:
        try:
            os.sched_setaffinity(pid, cpus)
        except OSError as e:
            raise SyscallError(e.errno, f"sched_setaffinity({pid}, {sorted(cpus)}): {e.strerror}") from e

    def sched_setattr(self, policy: int, flags: int, nice: int, priority: int, runtime: int, deadline: int,
                      period: int) -> None:
        attr = _SchedAttr(ctypes.sizeof(_SchedAttr), policy, flags, nice, priority, runtime, deadline, period)
        self._new_api("sched_setattr", 0, ctypes.byref(attr), 0,
                      what=f"sched_setattr(policy={policy}, flags={flags:#x}, nice={nice}, priority={priority})")

    def ioprio_set(self, which: int, who: int, ioprio: int) -> None:
        self._new_api("ioprio_set", which, who, ioprio, what=f"ioprio_set({which}, {who}, {ioprio:#x})")

    def personality(self, persona: int) -> None:
        self._new_api("personality", ctypes.c_ulong(persona), what=f"personality({persona:#x})")

    def _new_api(self, name: str, *args, what: str) -> int:
        ret = libc.syscall(_SYSCALL_NR[name], *args)
        if ret < 0:
            raise _fail(what)
        return ret

    def mount_setattr_recursive(self, fd: int, attr_set: int, attr_clr: int, path: str) -> None:
        """Changes the attributes of the mount at `fd` and of every mount below it (mount_setattr(2)
        with AT_RECURSIVE); `path` names it in errors."""
        attr = (ctypes.c_uint64 * 4)(attr_set, attr_clr, 0, 0)  # struct mount_attr, without propagation/userns
        self._new_api("mount_setattr", fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr),
                      ctypes.sizeof(attr), what=f"mount_setattr {path} (set {attr_set:#x}, clear {attr_clr:#x})")

    def clone_mount(self, source: str, recursive: bool, userns_fd: int | None = None, ridmap: bool = False) -> int:
        tree = self._new_api("open_tree", AT_FDCWD, source.encode(),
                             OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (AT_RECURSIVE if recursive else 0),
                             what=f"open_tree {source} (clone)")
        if userns_fd is None:
            return tree
        try:
            attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)  # struct mount_attr
            self._new_api("mount_setattr", tree, b"", AT_EMPTY_PATH | (AT_RECURSIVE if ridmap else 0),
                          ctypes.byref(attr), ctypes.sizeof(attr), what=f"mount_setattr {source} (idmap)")
        except BaseException:
            os.close(tree)
            raise
        return tree

    def attach_mount(self, tree: int, target: str) -> None:
        self._new_api("move_mount", tree, b"", AT_FDCWD, target.encode(),
                      MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_SYMLINKS, what=f"move_mount to {target}")

    def mount_idmapped(self, source: str, userns_fd: int, target: str, *, rbind: bool = False,
                       ridmap: bool = False) -> None:
        tree = self.clone_mount(source, rbind, userns_fd, ridmap)
        try:
            self.attach_mount(tree, target)
        finally:
            os.close(tree)

    def _bpf(self, cmd: int, attr: ctypes.Array, what: str) -> int:
        return self._new_api("bpf", cmd, ctypes.byref(attr), ctypes.sizeof(attr), what=what)

    def bpf_prog_load(self, prog_type: int, program: bytes, license: str, name: str) -> int:
        insns = ctypes.create_string_buffer(program, len(program))
        lic = ctypes.create_string_buffer(license.encode())
        attr = (ctypes.c_uint64 * 16)()  # union bpf_attr up to expected_attach_type, zeroed
        raw = memoryview(attr).cast("B")
        for offset, value in ((0, prog_type), (4, len(program) // 8)):
            raw[offset:offset + 4] = value.to_bytes(4, "little")
        raw[8:16] = ctypes.addressof(insns).to_bytes(8, "little")
        raw[16:24] = ctypes.addressof(lic).to_bytes(8, "little")
        raw[48:48 + len(name[:15])] = name[:15].encode()
        what = f"bpf(BPF_PROG_LOAD, type {prog_type}, {len(program) // 8} instructions)"
        try:
            return self._bpf(BPF_PROG_LOAD, attr, what)
        except SyscallError as e:
            if e.errno not in (errno.EINVAL, errno.EACCES):
                raise
            log = ctypes.create_string_buffer(65536)  # loaded again with the verifier's log, for the error
            raw[24:28] = (1).to_bytes(4, "little")
            raw[28:32] = len(log).to_bytes(4, "little")
            raw[32:40] = ctypes.addressof(log).to_bytes(8, "little")
            try:
                fd = self._bpf(BPF_PROG_LOAD, attr, what)
            except SyscallError as again:
                verifier = [line for line in log.value.decode(errors="replace").strip().splitlines()
                            if not line.startswith("processed ")]  # the verifier's statistics
                raise SyscallError(again.errno, f"{again.strerror}: {' / '.join(verifier[-2:])}") from e
            return fd  # the first refusal was not the program's

    def bpf_prog_attach(self, target_fd: int, prog_fd: int, attach_type: int, flags: int) -> None:
        attr = (ctypes.c_uint32 * 5)(target_fd, prog_fd, attach_type, flags, 0)
        self._bpf(BPF_PROG_ATTACH, attr, f"bpf(BPF_PROG_ATTACH, type {attach_type}, flags {flags:#x}) to "
                                         f"{_path_of_fd(target_fd)}")

    def bpf_prog_detach(self, target_fd: int, prog_fd: int, attach_type: int) -> None:
        attr = (ctypes.c_uint32 * 5)(target_fd, prog_fd, attach_type, 0, 0)
        self._bpf(BPF_PROG_DETACH, attr, f"bpf(BPF_PROG_DETACH, type {attach_type}) from {_path_of_fd(target_fd)}")

    def bpf_prog_query(self, target_fd: int, attach_type: int) -> list[int]:
        what = f"bpf(BPF_PROG_QUERY, type {attach_type}) of {_path_of_fd(target_fd)}"
        count = 64
        while True:
            ids = (ctypes.c_uint32 * count)()
            attr = (ctypes.c_uint32 * 10)(target_fd, attach_type, 0, 0)  # up to prog_cnt, with revision's room
            raw = memoryview(attr).cast("B")
            raw[16:24] = ctypes.addressof(ids).to_bytes(8, "little")
            attr[6] = count
            try:
                self._bpf(BPF_PROG_QUERY, attr, what)
            except SyscallError as e:
                if e.errno != errno.ENOSPC:
                    raise
                count = attr[6]  # more programs than room: the kernel says how many
                continue
            return list(ids[:attr[6]])

    def bpf_prog_get_fd_by_id(self, prog_id: int) -> int:
        attr = (ctypes.c_uint32 * 3)(prog_id, 0, 0)
        return self._bpf(BPF_PROG_GET_FD_BY_ID, attr, f"bpf(BPF_PROG_GET_FD_BY_ID, {prog_id})")

    def fork_into_cgroup(self, cgroup_fd: int, namespaces: int = 0) -> int:
        args = _CloneArgs(flags=CLONE_INTO_CGROUP | namespaces, exit_signal=SIGCHLD, cgroup=cgroup_fd)
        ctypes.pythonapi.PyOS_BeforeFork()
        # through PyDLL: the GIL stays held across the clone, as os.fork holds it
        pid = _libc_gil.syscall(_SYSCALL_NR["clone3"], ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
        if pid == 0:
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0
        err = ctypes.get_errno()
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        if pid < 0:
            raise SyscallError(err, f"clone3(CLONE_INTO_CGROUP{f' | {namespaces:#x}' if namespaces else ''}) into "
                                    f"{_path_of_fd(cgroup_fd)}: {os.strerror(err)}")
        return pid

    def mount_with_fsconfig(self, fstype: str, settings: list[tuple[str, str]], target: str) -> None:
        """A mount through fsopen/fsconfig/fsmount/move_mount, for options too many for mount(2)'s one
        data page (an overlay with dozens of layers)."""
        fs = self._new_api("fsopen", fstype.encode(), FSOPEN_CLOEXEC, what=f"fsopen {fstype}")
        try:
            for key, value in settings:
                self._new_api("fsconfig", fs, FSCONFIG_SET_STRING, key.encode(), value.encode(), 0,
                              what=f"fsconfig {fstype} {key}={value}")
            self._new_api("fsconfig", fs, FSCONFIG_CMD_CREATE, None, None, 0, what=f"fsconfig {fstype} create")
            mnt = self._new_api("fsmount", fs, FSMOUNT_CLOEXEC, 0, what=f"fsmount {fstype}")
            try:
                self._new_api("move_mount", mnt, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH,
                              what=f"move_mount {fstype} to {target}")
            finally:
                os.close(mnt)
        finally:
            os.close(fs)


class FakeSyscalls(Syscalls):
    """Records every call instead of making it, for unit tests of the set-up logic without root.

    Lookups (openat2, statfs, statvfs, the namespace type) need no privilege and their result is what the logic
    under test acts on, so they are made for real and recorded; everything that changes the system is only recorded.
    Every method of `Syscalls` is overridden (below the class), so none can reach the kernel by mistake.
    """

    PASS_THROUGH = frozenset({"openat2", "statfs_type", "statvfs_flags", "ns_type"})

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._real = LinuxSyscalls()

    def named(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]


def _recorder(name: str):
    def record(self: FakeSyscalls, *args, **kwargs):
        self.calls.append((name, *args, *kwargs.values()))
        return getattr(self._real, name)(*args, **kwargs) if name in self.PASS_THROUGH else 0
    record.__name__ = record.__qualname__ = name
    return record


for _name in [n for n in vars(Syscalls) if not n.startswith("_")]:
    setattr(FakeSyscalls, _name, _recorder(_name))
