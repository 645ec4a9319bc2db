"""The linux.seccomp section of config.json as a validated profile, read through pyruntime.fieldreader as the
rest of config.json is.

Whatever the spec forbids is refused here, at the edge, so that a profile that parses fails later only on the
host's limits (an architecture or a flag this libseccomp or kernel lacks). The maps below are the spec's words
and what each means to libseccomp and the kernel, which compiler.py turns into a filter. Importing this module
loads no libseccomp: validation runs on every create.
"""
from __future__ import annotations

from pyruntime.fieldreader import Obj, SpecError, shown
from pyruntime.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ERRNO_ACTIONS = {"SCMP_ACT_ERRNO": 0x00050000, "SCMP_ACT_TRACE": 0x7FF00000}
ACTIONS: Mapping[str, int] = {
    "SCMP_ACT_KILL": 0x00000000,
    "SCMP_ACT_KILL_PROCESS": 0x80000000,
    "SCMP_ACT_KILL_THREAD": 0x00000000,
    "SCMP_ACT_TRAP": 0x00030000,
    **ERRNO_ACTIONS,
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
_MAX_ARGS = 6
_UINT64_MAX = (1 << 64) - 1
_ERRNO_MAX = (1 << 16) - 1
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def _action(o: Obj, action_key: str, errno_key: str) -> tuple[str, int | None]:
    action = o.choice(action_key, ACTIONS, "action", required=True)
    errno_ret = o.int(errno_key, lo=0, hi=_ERRNO_MAX)
    if errno_ret is not None and action not in ERRNO_ACTIONS:
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
        names = o.strings("names", required=True)
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
            architectures=archs,
            flags=flags if named else None,
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
