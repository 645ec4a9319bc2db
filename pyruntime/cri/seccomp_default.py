"""The seccomp profile a CRI `RuntimeDefault` asks for: the syscall allow-list containerd and moby ship.

Workloads are written and tested against that profile (a program that runs under containerd's default
must run here, and one it blocks should be blocked here), so the lists below are its data: everything
not allowed fails with EPERM; `personality` only with the values glibc and the 32-bit emulation use;
`clone` only without namespace flags unless the container holds CAP_SYS_ADMIN; `clone3` (whose flags a
filter cannot read) fails with ENOSYS so libcs fall back to `clone`. A capability in the container's
bounding set unlocks the syscalls that capability guards, as in the reference profile; kernels that do
not know a name skip it (pyruntime/linux/seccomp/compiler.py does, as runc).

Most containers have containerd's default capability set, so most RuntimeDefault containers get one and the
same profile: precompile() has the launcher compile it once (libseccomp's compile is a large part of a
create: bench.cri), and the containers it forks load the result.
"""
from __future__ import annotations

import errno
import platform

# containerd's default capability set for a container (oci/spec.go's defaultUnixCaps)
DEFAULT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
                "CAP_KILL", "CAP_AUDIT_WRITE")

# allowed for every container
_ALLOWED = """
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown chown32 clock_adjtime
clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1
epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit
exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchown
fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64
fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_time64 futex_waitv futimesat getcpu getcwd
getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer
getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid getresuid32
getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday getuid
getuid32 getxattr inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy
io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit io_uring_enter
io_uring_register io_uring_setup ipc kill landlock_add_rule landlock_create_ruleset landlock_restrict_self
lchown lchown32 lgetxattr link linkat listen listxattr llistxattr _llseek lremovexattr lseek lsetxattr lstat
lstat64 madvise membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall
mmap mmap2 mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend
mq_timedsend_time64 mq_unlink mremap msgctl msgget msgrcv msgsnd msync munlock munlockall munmap nanosleep
newfstatat _newselect open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 poll ppoll
ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64 pwritev
pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg
remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending
rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64
rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min
sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr
sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop semtimedop_time64
send sendfile sendfile64 sendmmsg sendmsg sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32
setgroups setgroups32 setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid
setresuid32 setreuid setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address
setuid setuid32 setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn
socket socketcall socketpair splice stat stat64 statfs statfs64 statx symlink symlinkat sync sync_file_range
syncfs sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64
timer_settime timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime
timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat utime utimensat
utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev ptrace
"""

# personality(2) values allowed: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and the query
_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

# by machine (platform.machine()): the architectures the filter covers and syscalls only they have
_ARCHES = {
    "x86_64": (("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"), "arch_prctl modify_ldt"),
    "aarch64": (("SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64"),
                "arm_fadvise64_64 arm_sync_file_range sync_file_range2 breakpoint cacheflush set_tls"),
    "ppc64le": (("SCMP_ARCH_PPC64LE",), "sync_file_range2 swapcontext"),
    "s390x": (("SCMP_ARCH_S390", "SCMP_ARCH_S390X"), "s390_pci_mmio_read s390_pci_mmio_write s390_runtime_instr"),
    "riscv64": (("SCMP_ARCH_RISCV64",), "riscv_flush_icache"),
}

# allowed when the capability is in the bounding set
_BY_CAPABILITY = {
    "CAP_DAC_READ_SEARCH": "open_by_handle_at",
    "CAP_SYS_ADMIN": "bpf clone clone3 fanotify_init fsconfig fsmount fsopen fspick lookup_dcookie mount "
                     "mount_setattr move_mount name_to_handle_at open_tree perf_event_open quotactl quotactl_fd "
                     "setdomainname sethostname setns syslog umount umount2 unshare",
    "CAP_SYS_BOOT": "reboot",
    "CAP_SYS_CHROOT": "chroot",
    "CAP_SYS_MODULE": "delete_module init_module finit_module",
    "CAP_SYS_PACCT": "acct",
    "CAP_SYS_PTRACE": "kcmp pidfd_getfd process_madvise process_vm_readv process_vm_writev ptrace",
    "CAP_SYS_RAWIO": "iopl ioperm",
    "CAP_SYS_TIME": "settimeofday stime clock_settime clock_settime64",
    "CAP_SYS_TTY_CONFIG": "vhangup",
    "CAP_SYSLOG": "syslog",
    "CAP_BPF": "bpf",
    "CAP_PERFMON": "perf_event_open",
}

# CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP
_CLONE_NS_FLAGS = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x02000000


def _allow(names: str, args: list[dict] | None = None) -> dict:
    rule: dict = {"names": names.split(), "action": "SCMP_ACT_ALLOW"}
    if args:
        rule["args"] = args
    return rule


def default_profile(bounding: list[str], machine: str | None = None) -> dict:
    """The `linux.seccomp` object for a container whose bounding capability set is `bounding`
    ("CAP_..." names), on `machine` (this host's by default)."""
    machine = machine or platform.machine()
    arches, arch_names = _ARCHES.get(machine, ((), ""))
    rules = [_allow(_ALLOWED)]
    rules += [_allow("personality", [{"index": 0, "value": v, "op": "SCMP_CMP_EQ"}]) for v in _PERSONALITIES]
    if arch_names:
        rules.append(_allow(arch_names))
    caps = set(bounding)
    rules += [_allow(names) for cap, names in _BY_CAPABILITY.items() if cap in caps]
    if "CAP_SYS_ADMIN" not in caps:
        index = 1 if machine.startswith("s390") else 0  # s390's clone takes the flags second
        rules.append(_allow("clone", [{"index": index, "value": _CLONE_NS_FLAGS, "valueTwo": 0,
                                       "op": "SCMP_CMP_MASKED_EQ"}]))
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    return {"defaultAction": "SCMP_ACT_ERRNO", "architectures": list(arches), "syscalls": rules}


def precompile() -> None:
    """Compiles the profile of a container with the default capabilities into this process's filter cache
    (pyruntime.linux.seccomp.compiler.compile_filter), for the processes it forks; a host where that fails (no
    libseccomp) leaves the error to the containers that ask for the profile."""
    from pyruntime.linux.seccomp.compiler import compile_filter
    from pyruntime.linux.seccomp.profile import Seccomp
    try:
        compile_filter(Seccomp.from_spec(default_profile(list(DEFAULT_CAPS))))
    except OSError:
        pass
