"""Compiling a seccomp profile (profile.py) into the BPF program the kernel runs, with libseccomp.

libseccomp is driven through a small ctypes binding: pyseccomp runs find_library at import, which every
runtime command would pay, and Debian's python3-seccomp lives outside the venv, while ctypes is already
loaded by the runtime. libseccomp.so.2 is opened by soname on the first call only, so importing this module
costs only its class definitions.

Behaviour follows runc where the spec is silent: syscall names unknown to libseccomp for this
architecture are skipped (reported to ``warn``), a rule whose action equals the default action is
skipped (libseccomp rejects it), several conditions on the same argument become one rule each (OR,
which Docker's default profile relies on), and the no_new_privs bit is left to process.noNewPrivileges.

A profile written before a syscall existed must not turn it into EPERM: libc falls back to an older
call only on ENOSYS (clone3 -> clone, openat2 -> openat, faccessat2 -> faccessat), so a new libc in an
image with an old profile would break. As runc does (libcontainer/seccomp/patchbpf), unless the default
action lets syscalls through, a stub in front of libseccomp's program returns ENOSYS for every syscall
number above the highest one the profile names on that architecture. libseccomp cannot express that
(its rules name syscalls it knows), so its program is exported, and loader.py loads it with seccomp(2).
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct

from pyruntime.linux.seccomp.profile import ACTIONS, ARCHITECTURES, ERRNO_ACTIONS, FLAGS, OPERATORS, Seccomp, Syscall
from pyruntime.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeVar
    Warn = Callable[[str], None]
    T = TypeVar("T")

# Spec flag -> seccomp(2)'s flag (linux/seccomp.h).
_KERNEL_FLAGS: Mapping[str, int] = {
    "SECCOMP_FILTER_FLAG_TSYNC": 1,
    "SECCOMP_FILTER_FLAG_LOG": 2,
    "SECCOMP_FILTER_FLAG_SPEC_ALLOW": 4,
    "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV": 32,
}
_FLAG_NEW_LISTENER = 8
# Actions under which a syscall unknown to the profile should run (runc's isAllowAction): no stub.
_LETS_THROUGH = frozenset({"SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_TRACE"})
_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_X32 = 0x4000003E  # libseccomp's token; the kernel reports x86_64 with this bit in the number
_X32_SYSCALL_BIT = 0x40000000


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
def libseccomp() -> ctypes.CDLL:
    """libseccomp.so.2, opened by soname on the first call and its functions typed once."""
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
    libseccomp()


def _check(rc: int, call: str) -> int:
    """libseccomp returns -errno instead of setting errno."""
    if rc < 0:
        raise OSError(-rc, f"{call}: {os.strerror(-rc)}")
    return rc


def _libseccomp_version() -> str:
    v = libseccomp().seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def _action_value(action: str, errno_ret: int | None) -> int:
    if action in ERRNO_ACTIONS:
        return ERRNO_ACTIONS[action] | (errno.EPERM if errno_ret is None else errno_ret)
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
    code.append((ret, 0, 0, ERRNO_ACTIONS["SCMP_ACT_ERRNO"] | errno.ENOSYS))
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
    lib = libseccomp()
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


@_once
def supported_flags() -> frozenset[str]:
    """The spec's flags that libseccomp accepts as attributes, which it grants only after probing the kernel
    for each; none without libseccomp. Cached: a forked init asks after pivot_root, where the probe's files
    are gone."""
    try:
        lib = libseccomp()
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
        lib = libseccomp()
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
