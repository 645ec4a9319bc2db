"""linux.seccomp of config.json: validation, and compiling/loading the filter with libseccomp.

The section is read through pyruntime.fieldreader, as the rest of config.json is.

libseccomp is driven through a small ctypes binding: pyseccomp runs find_library at import, which every
runtime command would pay, and Debian's python3-seccomp lives outside the venv, while ctypes is already
loaded by the runtime. libseccomp.so.2 is opened by soname on the first call only, so importing this module costs
only its class definitions.

Behaviour follows runc where the spec is silent: syscall names unknown to libseccomp for this
architecture are skipped (reported to ``warn``), a rule whose action equals the default action is
skipped (libseccomp rejects it), several conditions on the same argument become one rule each (OR,
which Docker's default profile relies on), and the no_new_privs bit is left to process.noNewPrivileges.

A profile written before a syscall existed must not turn it into EPERM: libc falls back to an older
call only on ENOSYS (clone3 -> clone, openat2 -> openat, faccessat2 -> faccessat), so a new libc in an
image with an old profile would break. As runc does (libcontainer/seccomp/patchbpf), unless the default
action lets syscalls through, a stub in front of libseccomp's program returns ENOSYS for every syscall
number above the highest one the profile names on that architecture. libseccomp cannot express that
(its rules name syscalls it knows), so its program is exported and loaded here with seccomp(2).
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct

from pyruntime.fieldreader import Obj, SpecError, shown
from pyruntime.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeVar
    Warn = Callable[[str], None]
    T = TypeVar("T")

_ERRNO_ACTIONS = {"SCMP_ACT_ERRNO": 0x00050000, "SCMP_ACT_TRACE": 0x7FF00000}
ACTIONS: Mapping[str, int] = {
    "SCMP_ACT_KILL": 0x00000000,
    "SCMP_ACT_KILL_PROCESS": 0x80000000,
    "SCMP_ACT_KILL_THREAD": 0x00000000,
    "SCMP_ACT_TRAP": 0x00030000,
    **_ERRNO_ACTIONS,
    "SCMP_ACT_ALLOW": 0x7FFF0000,
    "SCMP_ACT_LOG": 0x7FFC0000,
    "SCMP_ACT_NOTIFY": 0x7FC00000,
}
OPERATORS: Mapping[str, int] = {
    "SCMP_CMP_NE": 1,
    "SCMP_CMP_LT": 2,
    "SCMP_CMP_LE": 3,
    "SCMP_CMP_EQ": 4,
    "SCMP_CMP_GE": 5,
    "SCMP_CMP_GT": 6,
    "SCMP_CMP_MASKED_EQ": 7,
}
# Spec name -> libseccomp's own name, which seccomp_arch_resolve_name turns into its token.
ARCHITECTURES: Mapping[str, str] = {
    "SCMP_ARCH_X86": "x86",
    "SCMP_ARCH_X86_64": "x86_64",
    "SCMP_ARCH_X32": "x32",
    "SCMP_ARCH_ARM": "arm",
    "SCMP_ARCH_AARCH64": "aarch64",
    "SCMP_ARCH_MIPS": "mips",
    "SCMP_ARCH_MIPS64": "mips64",
    "SCMP_ARCH_MIPS64N32": "mips64n32",
    "SCMP_ARCH_MIPSEL": "mipsel",
    "SCMP_ARCH_MIPSEL64": "mipsel64",
    "SCMP_ARCH_MIPSEL64N32": "mipsel64n32",
    "SCMP_ARCH_PPC": "ppc",
    "SCMP_ARCH_PPC64": "ppc64",
    "SCMP_ARCH_PPC64LE": "ppc64le",
    "SCMP_ARCH_S390": "s390",
    "SCMP_ARCH_S390X": "s390x",
    "SCMP_ARCH_PARISC": "parisc",
    "SCMP_ARCH_PARISC64": "parisc64",
    "SCMP_ARCH_RISCV64": "riscv64",
    "SCMP_ARCH_LOONGARCH64": "loongarch64",
    "SCMP_ARCH_M68K": "m68k",
    "SCMP_ARCH_SH": "sh",
    "SCMP_ARCH_SHEB": "sheb",
}
# Spec flag -> libseccomp filter attribute (SCMP_FLTATR_CTL_*), which libseccomp grants only when the
# kernel has the flag: features() asks it.
FLAGS: Mapping[str, int] = {
    "SECCOMP_FILTER_FLAG_TSYNC": 4,
    "SECCOMP_FILTER_FLAG_LOG": 6,
    "SECCOMP_FILTER_FLAG_SPEC_ALLOW": 7,
    "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV": 10,
}
# Spec flag -> seccomp(2)'s flag (linux/seccomp.h).
_KERNEL_FLAGS: Mapping[str, int] = {
    "SECCOMP_FILTER_FLAG_TSYNC": 1,
    "SECCOMP_FILTER_FLAG_LOG": 2,
    "SECCOMP_FILTER_FLAG_SPEC_ALLOW": 4,
    "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV": 32,
}
_FLAG_NEW_LISTENER = 8
_SECCOMP_SET_MODE_FILTER = 1
# Actions under which a syscall unknown to the profile should run (runc's isAllowAction): no stub.
_LETS_THROUGH = frozenset({"SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_TRACE"})
_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_X32 = 0x4000003E  # libseccomp's token; the kernel reports x86_64 with this bit in the number
_X32_SYSCALL_BIT = 0x40000000
_MAX_ARGS = 6
_SCM_RIGHTS_NAME = "seccompFd"


_UINT64_MAX = (1 << 64) - 1
_ERRNO_MAX = (1 << 16) - 1
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def _action(o: Obj, action_key: str, errno_key: str) -> tuple[str, int | None]:
    action = o.choice(action_key, ACTIONS, "action", required=True)
    errno_ret = o.int(errno_key, lo=0, hi=_ERRNO_MAX)
    if errno_ret is not None and action not in _ERRNO_ACTIONS:
        raise SpecError(f"{o.name(errno_key)}: not supported by action {action}")
    return action, errno_ret


@record
class Arg:
    index: int
    value: int
    value_two: int
    op: str

    @classmethod
    def from_spec(cls, o: Obj) -> Arg:
        return cls(
            index=o.int("index", required=True, lo=0, hi=_MAX_ARGS - 1),
            value=o.int("value", required=True, lo=0, hi=_UINT64_MAX),
            value_two=o.int("valueTwo", 0, lo=0, hi=_UINT64_MAX),
            op=o.choice("op", OPERATORS, "operator", required=True),
        )


@record
class Syscall:
    names: tuple[str, ...]
    action: str
    errno_ret: int | None = None
    args: tuple[Arg, ...] = ()

    @classmethod
    def from_spec(cls, o: Obj) -> Syscall:
        """Names unknown to this kernel are kept (load() skips them, as runc does); only their shape is checked."""
        names = tuple(o.strings("names", required=True))
        if not names:
            raise SpecError(f"{o.name('names')}: must contain at least one entry")
        for i, n in enumerate(names):
            if not n or not set(n) <= _NAME_CHARS:
                raise SpecError(f"{o.name('names')}[{i}]: {shown(n)} is not a syscall name")
        action, errno_ret = _action(o, "action", "errnoRet")
        if action == "SCMP_ACT_NOTIFY" and "write" in names:
            # the init still writes (the start fifo, its reports) once its filter is in: each would wait on
            # the agent; refused as runc refuses it, with runc's message
            raise SpecError(f"{o.name('names')}[{names.index('write')}]: SCMP_ACT_NOTIFY cannot be used for "
                            "the write syscall")
        return cls(names, action, errno_ret, tuple(Arg.from_spec(a) for a in o.objs("args")))


@record
class Seccomp:
    default_action: str
    default_errno_ret: int | None = None
    architectures: tuple[str, ...] = ()
    flags: tuple[str, ...] | None = None  # None: the field is absent (not an empty list), see effective_flags
    listener_path: str | None = None
    listener_metadata: str | None = None
    syscalls: tuple[Syscall, ...] = ()

    @classmethod
    def from_spec(cls, obj: object, where: str = "linux.seccomp") -> Seccomp:
        """Rejects at the edge what the spec forbids, so that the child's load() fails only on host limits."""
        o = Obj(obj, where)
        default_action, default_errno_ret = _action(o, "defaultAction", "defaultErrnoRet")
        if default_action == "SCMP_ACT_NOTIFY":
            raise SpecError(f"{o.name('defaultAction')}: SCMP_ACT_NOTIFY cannot be the default action")
        archs = o.strings("architectures")
        flags = o.strings("flags")
        named = o.get("flags", list) is not None
        listener_path = o.str("listenerPath") or None
        listener_metadata = o.str("listenerMetadata") or None
        if listener_metadata is not None and listener_path is None:
            raise SpecError(f"{o.name('listenerMetadata')}: set without listenerPath")
        for key, values, known, what in (("architectures", archs, ARCHITECTURES, "architecture"),
                                         ("flags", flags, FLAGS, "flag")):
            for i, v in enumerate(values):
                if v not in known:
                    raise SpecError(f"{o.name(key)}[{i}]: unknown {what} {shown(v)}")
        seccomp = cls(
            default_action=default_action,
            default_errno_ret=default_errno_ret,
            architectures=tuple(archs),
            flags=tuple(flags) if named else None,
            listener_path=listener_path,
            listener_metadata=listener_metadata,
            syscalls=tuple(Syscall.from_spec(s) for s in o.objs("syscalls")),
        )
        if seccomp.uses_notify and listener_path is None:
            raise SpecError(f"{o.name('listenerPath')}: required when SCMP_ACT_NOTIFY is used")
        return seccomp

    @property
    def uses_notify(self) -> bool:
        return any(s.action == "SCMP_ACT_NOTIFY" for s in self.syscalls)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _once(compute: Callable[[], T]) -> Callable[[], T]:
    """functools.cache for a function of no arguments, without functools' import (with collections), which
    every container with a seccomp profile would pay in `create`. A failure is not kept: the next call retries."""
    done: list[T] = []

    def cached() -> T:
        if not done:
            done.append(compute())
        return done[0]
    return cached


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


@_once
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libseccomp.so.2")
    ctx = ctypes.c_void_p
    for fn, restype, argtypes in (
        ("seccomp_init", ctx, [ctypes.c_uint32]),
        ("seccomp_release", None, [ctx]),
        ("seccomp_attr_set", ctypes.c_int, [ctx, ctypes.c_int, ctypes.c_uint32]),
        ("seccomp_arch_resolve_name", ctypes.c_uint32, [ctypes.c_char_p]),
        ("seccomp_arch_add", ctypes.c_int, [ctx, ctypes.c_uint32]),
        ("seccomp_syscall_resolve_name", ctypes.c_int, [ctypes.c_char_p]),
        ("seccomp_rule_add_array", ctypes.c_int, [ctx, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                                  ctypes.POINTER(_ArgCmp)]),
        ("seccomp_arch_native", ctypes.c_uint32, []),
        ("seccomp_syscall_resolve_name_arch", ctypes.c_int, [ctypes.c_uint32, ctypes.c_char_p]),
        ("seccomp_export_bpf", ctypes.c_int, [ctx, ctypes.c_int]),
        ("seccomp_version", ctypes.POINTER(_Version), []),
    ):
        getattr(lib, fn).restype = restype
        getattr(lib, fn).argtypes = argtypes
    return lib


def preload() -> None:
    """Opens libseccomp while the host's /usr/lib is still visible: a container's init loads its
    filter after pivot_root, where the image may have no libseccomp at all."""
    _lib()


def _check(rc: int, call: str) -> int:
    """libseccomp returns -errno instead of setting errno."""
    if rc < 0:
        raise OSError(-rc, f"{call}: {os.strerror(-rc)}")
    return rc


def _libseccomp_version() -> str:
    v = _lib().seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def _action_value(action: str, errno_ret: int | None) -> int:
    if action in _ERRNO_ACTIONS:
        return _ERRNO_ACTIONS[action] | (errno.EPERM if errno_ret is None else errno_ret)
    return ACTIONS[action]


def _set_flag(lib: ctypes.CDLL, ctx: int, flag: str) -> None:
    """Asks libseccomp, which knows whether this kernel has the flag, before seccomp(2) gets it."""
    rc = lib.seccomp_attr_set(ctx, FLAGS[flag], 1)
    if rc == -errno.EINVAL:
        raise OSError(-rc, f"seccomp_attr_set({flag}): not supported by libseccomp {_libseccomp_version()}")
    _check(rc, f"seccomp_attr_set({flag})")


def _add_rules(lib: ctypes.CDLL, ctx: int, syscall: Syscall, action: int, warn: Warn | None) -> int:
    """Returns how many rules went into the filter, which is none when libseccomp knows none of the names."""
    conds = [_ArgCmp(a.index, OPERATORS[a.op], a.value, a.value_two if a.op == "SCMP_CMP_MASKED_EQ" else 0)
             for a in syscall.args]
    indexes = [a.index for a in syscall.args]
    groups = [conds] if len(set(indexes)) == len(indexes) else [[c] for c in conds]
    added = 0
    for name in syscall.names:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr == -1:
            if warn is not None:
                warn(f"seccomp: unknown syscall {name!r} ignored")
            continue
        for group in groups:
            array = (_ArgCmp * len(group))(*group)
            _check(lib.seccomp_rule_add_array(ctx, action, nr, len(group), array),
                   f"seccomp_rule_add({name}, {syscall.action})")
            added += 1
    return added


def enosys_stub(highest: Mapping[int, int]) -> bytes:
    """The classic-BPF program that returns ENOSYS for a syscall number above highest[arch] (libseccomp
    arch tokens, which are the kernel's AUDIT_ARCH values) and falls through to the program after it
    otherwise, as runc's patchbpf stub. x32 shares x86_64's AUDIT_ARCH, told apart by the number's x32 bit."""
    ld_abs, jeq, jgt, jset, ja, ret = 0x20, 0x15, 0x25, 0x45, 0x05, 0x06
    # (code, jump-if-true label, jump-if-false label, k); a label is an index into `code` or "end"
    code: list[tuple[int, object, object, object]] = [(ld_abs, 0, 0, 4)]  # seccomp_data.arch
    blocks: list[tuple[int, list[tuple[int, object, object, object]]]] = []
    arches = {(_AUDIT_ARCH_X86_64 if a == _AUDIT_ARCH_X32 else a) for a in highest}
    for arch in sorted(arches):
        block: list[tuple[int, object, object, object]] = [(ld_abs, 0, 0, 0)]  # seccomp_data.nr
        if arch == _AUDIT_ARCH_X86_64:
            block.append((jset, "x32", None, _X32_SYSCALL_BIT))
        native = highest.get(arch)
        block.append((jgt, "enosys", "end", native) if native is not None else (ja, 0, 0, "end"))
        if arch == _AUDIT_ARCH_X86_64:
            x32 = highest.get(_AUDIT_ARCH_X32)
            block.append((jgt, "enosys", "end", x32) if x32 is not None else (ja, 0, 0, "end"))
        blocks.append((arch, block))
    for arch, _ in blocks:
        code.append((jeq, ("block", arch), None, arch))
    code.append((ja, 0, 0, "end"))  # an architecture the profile does not know: libseccomp's verdict
    starts = {}
    for arch, block in blocks:
        starts[arch] = len(code)
        code.extend(block)
    enosys = len(code)
    code.append((ret, 0, 0, _ERRNO_ACTIONS["SCMP_ACT_ERRNO"] | errno.ENOSYS))
    end = len(code)
    out = bytearray()
    for i, (op, jt, jf, k) in enumerate(code):
        def target(label: object, here: int = i) -> int:
            if label is None or label == 0:
                return here + 1
            if label == "end":
                return end
            if label == "enosys":
                return enosys
            if label == "x32":
                return here + 2  # the x32 comparison follows the native one
            return starts[label[1]]  # type: ignore[index]  # label is ("block", arch) here, typed object
        if op == ja:
            jt = jf = 0
            k = target(k) - i - 1
        elif op != ld_abs and op != ret:
            jt, jf = target(jt) - i - 1, target(jf) - i - 1
        out += struct.pack("=HBBI", op, jt, jf, k)
    return bytes(out)


def _highest_syscalls(lib: ctypes.CDLL, seccomp: Seccomp) -> dict[int, int]:
    """The highest syscall number the profile names, per architecture of the filter."""
    arches = {lib.seccomp_arch_native()} | {lib.seccomp_arch_resolve_name(ARCHITECTURES[a].encode())
                                            for a in seccomp.architectures}
    names = {n.encode() for syscall in seccomp.syscalls for n in syscall.names}
    highest: dict[int, int] = {}
    for arch in arches:
        numbers = [nr for nr in (lib.seccomp_syscall_resolve_name_arch(arch, n) for n in names) if nr >= 0]
        if numbers:
            highest[arch] = max(numbers)
    return highest


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@record
class Program:
    """A compiled filter: the BPF program (the ENOSYS stub, then libseccomp's), the seccomp(2) flags, and
    whether it has notify rules (then the kernel hands back a listener fd)."""
    bpf: bytes
    flags: int
    notify: bool


# compiled filters of this process, by profile: compiling a RuntimeDefault profile is a large part of a create
# (a rule per syscall per architecture, then the BPF generation: bench.cri); a CRI launcher compiles its default
# profile once and every container it forks inherits the result (precompile)
_compiled: dict[Seccomp, Program] = {}


def compile_filter(seccomp: Seccomp, *, warn: Warn | None = None) -> Program:
    """The filter `seccomp` describes, compiled by libseccomp, or this process's earlier compilation of an
    equal profile (whose warnings were given then)."""
    program = _compiled.get(seccomp)
    if program is not None:
        return program
    lib = _lib()
    default = _action_value(seccomp.default_action, seccomp.default_errno_ret)
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise OSError(errno.EINVAL, f"seccomp_init({seccomp.default_action}): failed")
    try:
        for arch in seccomp.architectures:
            token = lib.seccomp_arch_resolve_name(ARCHITECTURES[arch].encode())
            if token == 0:
                raise OSError(errno.EINVAL, f"seccomp_arch_add({arch}): not supported by libseccomp "
                                            f"{_libseccomp_version()}")
            rc = lib.seccomp_arch_add(ctx, token)
            if rc != -errno.EEXIST:
                _check(rc, f"seccomp_arch_add({arch})")
        notify_rules = 0
        for syscall in seccomp.syscalls:
            action = _action_value(syscall.action, syscall.errno_ret)
            if action != default:
                added = _add_rules(lib, ctx, syscall, action, warn)
                notify_rules += added if syscall.action == "SCMP_ACT_NOTIFY" else 0
        for flag in effective_flags(seccomp):
            _set_flag(lib, ctx, flag)
        flags = filter_flags(seccomp)
        if notify_rules:  # as libseccomp: the listener, and only then killable waits (a notify rule may name
            flags |= _FLAG_NEW_LISTENER  # only syscalls this libseccomp does not know: no rule, no listener)
        else:
            flags &= ~_KERNEL_FLAGS["SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"]
        stub = b"" if seccomp.default_action in _LETS_THROUGH else enosys_stub(_highest_syscalls(lib, seccomp))
        fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "seccomp_export_bpf")
            program = Program(stub + os.pread(fd, os.fstat(fd).st_size, 0), flags, bool(notify_rules))
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    _compiled[seccomp] = program
    return program


def _install(program: Program) -> int:
    """Loads the program into the calling thread with seccomp(2); returns its result (the listener fd with
    SECCOMP_FILTER_FLAG_NEW_LISTENER)."""
    from pyruntime.linux._libc import libc

    buf = ctypes.create_string_buffer(program.bpf, len(program.bpf))
    fprog = _SockFprog(len(program.bpf) // 8, ctypes.addressof(buf))
    rc = libc.syscall(_lib().seccomp_syscall_resolve_name(b"seccomp"), _SECCOMP_SET_MODE_FILTER, program.flags,
                      ctypes.byref(fprog))
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"seccomp(SECCOMP_SET_MODE_FILTER, {program.flags:#x}): {os.strerror(e)}")
    return rc


def load(seccomp: Seccomp, *, warn: Warn | None = None) -> int | None:
    """Loads the filter into the calling thread; returns the notify fd when a SCMP_ACT_NOTIFY rule was loaded.

    The notify fd (close-on-exec) belongs to the caller, which hands it to whoever calls
    send_listener_fd: listenerPath is a host path, outside the container's mount namespace. Without
    no_new_privs this needs CAP_SYS_ADMIN, so call it before capabilities are dropped in that case.
    """
    program = compile_filter(seccomp, warn=warn)
    fd = _install(program)
    return fd if program.notify else None


def send_listener_fd(seccomp: Seccomp, fd: int, *, pid: int, state: Mapping[str, object]) -> None:
    """Sends the container process state and the notify fd to the agent at listenerPath, once, as runc.

    ``state`` is the container's state (runtime.md#state) as `pyruntime state` would print it.
    """
    import array
    import json
    import socket

    if seccomp.listener_path is None:
        raise ValueError("linux.seccomp.listenerPath: not set")
    message: dict[str, object] = {
        "ociVersion": state.get("ociVersion"),
        "fds": [_SCM_RIGHTS_NAME],
        "pid": pid,
        "metadata": seccomp.listener_metadata or "",
        "state": dict(state),
    }
    payload = json.dumps(message).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(seccomp.listener_path)
            sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        except OSError as e:
            raise OSError(e.errno, "failed to connect with seccomp agent specified in the seccomp profile: "
                                   f"{seccomp.listener_path}: {e.strerror}") from e


@_once
def supported_flags() -> frozenset[str]:
    """The spec's flags that libseccomp accepts as attributes, which it grants only after probing the kernel
    for each; none without libseccomp. Cached: a forked init asks after pivot_root, where the probe's files
    are gone."""
    try:
        lib = _lib()
    except OSError:
        return frozenset()
    ctx = lib.seccomp_init(ACTIONS["SCMP_ACT_ALLOW"])
    try:
        return frozenset(flag for flag, attr in FLAGS.items() if lib.seccomp_attr_set(ctx, attr, 1) == 0)
    finally:
        lib.seccomp_release(ctx)


def effective_flags(seccomp: Seccomp) -> tuple[str, ...]:
    """The flags the filter is loaded with, chosen as runc chooses them: the spec's, less TSYNC (the process
    that loads the filter has one thread: nothing to synchronise); when the spec names none (the field absent,
    not an empty list), SPEC_ALLOW where libseccomp and the kernel have it, runc's default: the filter then
    forces no Speculative Store Bypass mitigation on the workload, which can still ask for one with prctl."""
    if seccomp.flags is None:
        spec_allow = "SECCOMP_FILTER_FLAG_SPEC_ALLOW"
        return (spec_allow,) if spec_allow in supported_flags() else ()
    return tuple(f for f in seccomp.flags if f != "SECCOMP_FILTER_FLAG_TSYNC")


def filter_flags(seccomp: Seccomp) -> int:
    """seccomp(2)'s flags for effective_flags, which --debug reports as runc does ("seccomp filter flags: 4");
    WAIT_KILLABLE_RECV only with a notify rule (it changes how a notified syscall waits, and the kernel refuses
    it without a listener)."""
    flags = 0
    for flag in effective_flags(seccomp):
        if flag != "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV" or seccomp.uses_notify:
            flags |= _KERNEL_FLAGS[flag]
    return flags


def features() -> dict:
    """The seccomp part of `pyruntime features`: what this runtime and the host's libseccomp understand.

    A flag is supported when libseccomp accepts its attribute, which libseccomp itself grants only
    after probing the kernel for the flag.
    """
    try:
        lib = _lib()
    except OSError:
        return {"enabled": False}
    supported = sorted(supported_flags())
    return {
        "enabled": True,
        "actions": sorted(ACTIONS),
        "operators": sorted(OPERATORS),
        "archs": sorted(a for a, n in ARCHITECTURES.items() if lib.seccomp_arch_resolve_name(n.encode()) != 0),
        "knownFlags": sorted(FLAGS),
        "supportedFlags": supported,
    }
