"""Capability sets of the container process (process.capabilities) and their application.

The kernel calls happen in the container's init right before exec, through the syscall layer it is
handed (prctl(2), capget(2) and capset(2) by ctypes, already loaded by the runtime, not python-prctl).

The spec asks that a capability which cannot be mapped or granted be logged as a warning and not fail
the container (runc >= 1.1 does the same), so every such name goes to the caller's ``warn`` callback and
is skipped; failures of the calls themselves still raise, naming the call. The section is read through
pyruntime.fieldreader, as the rest of config.json is.

Order in the init (what ``apply`` does, mirroring runc's finalizeNamespace):
``drop_bounding`` -> ``PR_SET_KEEPCAPS(1)`` -> ``set_ids`` -> ``PR_SET_KEEPCAPS(0)`` -> ``set_capabilities``.
Keep-caps is what lets the permitted set survive the switch from uid 0 to the container's user.
"""
from __future__ import annotations

import os

from pyruntime.fieldreader import Obj
from pyruntime.linux.syscalls import SyscallError, Syscalls
from pyruntime.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    Warn = Callable[[str], None]

CAPABILITIES: Mapping[str, int] = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_SETPCAP": 8,
    "CAP_LINUX_IMMUTABLE": 9,
    "CAP_NET_BIND_SERVICE": 10,
    "CAP_NET_BROADCAST": 11,
    "CAP_NET_ADMIN": 12,
    "CAP_NET_RAW": 13,
    "CAP_IPC_LOCK": 14,
    "CAP_IPC_OWNER": 15,
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_RAWIO": 17,
    "CAP_SYS_CHROOT": 18,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_PACCT": 20,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_BOOT": 22,
    "CAP_SYS_NICE": 23,
    "CAP_SYS_RESOURCE": 24,
    "CAP_SYS_TIME": 25,
    "CAP_SYS_TTY_CONFIG": 26,
    "CAP_MKNOD": 27,
    "CAP_LEASE": 28,
    "CAP_AUDIT_WRITE": 29,
    "CAP_AUDIT_CONTROL": 30,
    "CAP_SETFCAP": 31,
    "CAP_MAC_OVERRIDE": 32,
    "CAP_MAC_ADMIN": 33,
    "CAP_SYSLOG": 34,
    "CAP_WAKE_ALARM": 35,
    "CAP_BLOCK_SUSPEND": 36,
    "CAP_AUDIT_READ": 37,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
    "CAP_CHECKPOINT_RESTORE": 40,
}
_NAMES = {number: name for name, number in CAPABILITIES.items()}
SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")

PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_KEEPCAPS = 8
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4


def name(cap: int) -> str:
    """Kernels newer than this table have numbered capabilities we cannot name; errors still show them."""
    return _NAMES.get(cap, f"CAP_{cap}")


def last_cap() -> int:
    """The running kernel's highest capability, a constant until reboot: read once per process, by the
    runtime when it parses the spec, so that the init (a fork) never reads it after pivot_root, where
    /proc is the container's (or the image's own files when the config mounts none)."""
    if not _LAST_CAP:
        fd = os.open("/proc/sys/kernel/cap_last_cap", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _LAST_CAP.append(int(os.read(fd, 32)))
        finally:
            os.close(fd)
    return _LAST_CAP[0]


_LAST_CAP: list[int] = []


def _names(o: Obj, key: str, supported: int, warn: Warn | None) -> frozenset[int]:
    caps = set()
    for item in o.strings(key):
        cap = CAPABILITIES.get(item)
        if cap is None or cap > supported:
            if warn is not None:
                warn(f"{o.name(key)}: ignoring unknown or unavailable capability {item!r}")
            continue
        caps.add(cap)
    return frozenset(caps)


@record
class Capabilities:
    """Capability numbers per set; a set absent from the config is empty (as in runc), not "unchanged"."""

    bounding: frozenset[int] = frozenset()
    effective: frozenset[int] = frozenset()
    inheritable: frozenset[int] = frozenset()
    permitted: frozenset[int] = frozenset()
    ambient: frozenset[int] = frozenset()

    @classmethod
    def from_spec(
        cls, obj: object, *, where: str = "process.capabilities", warn: Warn | None = None
    ) -> Capabilities:
        """Validates types strictly; names the running kernel cannot map are passed to ``warn`` and dropped."""
        o = Obj(obj, where)
        supported = last_cap()
        return cls(**{key: _names(o, key, supported, warn) for key in SETS})


def _prctl(kernel: Syscalls, call: str, option: int, *args: int, cap: int = -1) -> int:
    """`call` names the prctl in its error; its "{}" is `cap`'s name, formatted only then: the loops over
    every capability would build a string per call, in the init, where each allocation costs."""
    try:
        return kernel.prctl(option, *args)
    except SyscallError as e:
        raise SyscallError(e.errno, f"{call.format(name(cap))}: {os.strerror(e.errno)}") from e  # type: ignore[arg-type]  # a SyscallError has one


def _bits(caps: Iterable[int]) -> int:
    mask = 0
    for cap in caps:
        mask |= 1 << cap
    return mask


def _caps(mask: int) -> frozenset[int]:
    return frozenset(cap for cap in range(mask.bit_length()) if mask >> cap & 1)


def bounding_set(kernel: Syscalls) -> frozenset[int]:
    return frozenset(cap for cap in range(last_cap() + 1)
                     if _prctl(kernel, "prctl(PR_CAPBSET_READ, {})", PR_CAPBSET_READ, cap, cap=cap))


def drop_bounding(kernel: Syscalls, caps: Capabilities, *, warn: Warn | None = None) -> frozenset[int]:
    """Drops every capability not in ``caps.bounding``; one we were never given cannot be kept, only
    reported. Returns the bounding set left."""
    current = bounding_set(kernel)
    if warn is not None:
        for cap in sorted(caps.bounding - current):
            warn(f"process.capabilities.bounding: {name(cap)} is not in the runtime's bounding set, not granted")
    for cap in sorted(current - caps.bounding):
        _prctl(kernel, "prctl(PR_CAPBSET_DROP, {})", PR_CAPBSET_DROP, cap, cap=cap)
    return current & caps.bounding


def set_keep_caps(kernel: Syscalls, keep: bool) -> None:
    _prctl(kernel, f"prctl(PR_SET_KEEPCAPS, {int(keep)})", PR_SET_KEEPCAPS, int(keep))


def set_ids(kernel: Syscalls, uid: int, gid: int, additional_gids: Iterable[int] = ()) -> None:
    """Groups before gid before uid: each step needs the privilege the next one gives up.

    setgroups(2) is skipped when nothing is asked and a user namespace forbids it (/proc/self/setgroups
    "deny"), as it would fail there for no benefit.
    """
    groups = list(additional_gids)
    if groups or _setgroups_allowed():
        kernel.setgroups(groups)
    kernel.setresgid(gid)
    kernel.setresuid(uid)


def _setgroups_allowed() -> bool:
    try:
        with open("/proc/self/setgroups") as f:
            return f.read().strip() != "deny"
    except FileNotFoundError:
        return True


def set_capabilities(kernel: Syscalls, caps: Capabilities, *, warn: Warn | None = None,
                     bounding: frozenset[int] | None = None) -> None:
    """Sets effective/permitted/inheritable with capset(2), then the ambient set. `bounding`: the bounding
    set as drop_bounding left it (read from the kernel if None).

    Only what the kernel would let capset(2) and PR_CAP_AMBIENT_RAISE grant is requested: permitted
    within our own permitted set, effective within the new permitted set, inheritable within what was
    inheritable or permitted and is still bounded, ambient within new permitted and inheritable. The
    rest goes to ``warn``, so a runtime running with fewer capabilities still starts the container.
    """
    _, old_permitted, old_inheritable = kernel.capget()
    bounding_mask = _bits(bounding_set(kernel) if bounding is None else bounding)
    permitted = _bits(caps.permitted) & old_permitted
    effective = _bits(caps.effective) & permitted
    inheritable = _bits(caps.inheritable) & (old_inheritable | old_permitted) & (old_inheritable | bounding_mask)
    ambient = _bits(caps.ambient) & permitted & inheritable
    if warn is not None:
        for key, granted in (("permitted", permitted), ("effective", effective),
                             ("inheritable", inheritable), ("ambient", ambient)):
            for cap in sorted(getattr(caps, key) - _caps(granted)):
                if key == "ambient":  # runc's words, which tools match
                    warn(f"process.capabilities.ambient: can't raise ambient capability {name(cap)}: "
                         "it is not in both the permitted and the inheritable sets, skipped")
                else:
                    warn(f"process.capabilities.{key}: {name(cap)} cannot be granted, skipped")
    kernel.capset(effective, permitted, inheritable)
    _prctl(kernel, "prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in sorted(_caps(ambient)):
        _prctl(kernel, "prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, {})", PR_CAP_AMBIENT,
               PR_CAP_AMBIENT_RAISE, cap, cap=cap)


def set_no_new_privileges(kernel: Syscalls) -> None:
    _prctl(kernel, "prctl(PR_SET_NO_NEW_PRIVS, 1)", PR_SET_NO_NEW_PRIVS, 1)


def apply(
    kernel: Syscalls,
    caps: Capabilities | None,
    *,
    uid: int,
    gid: int,
    additional_gids: Iterable[int] = (),
    no_new_privileges: bool = False,
    warn: Warn | None = None,
) -> None:
    """Everything identity-related the init does before exec, in the only order that works.

    ``caps`` None means the config has no process.capabilities: the sets are left as the kernel makes
    them (a switch to a non-root uid then clears them, as for any setuid). A seccomp filter loaded
    without no_new_privileges must be loaded before this call, while CAP_SYS_ADMIN is still held.
    """
    if no_new_privileges:
        set_no_new_privileges(kernel)
    if caps is None:
        set_ids(kernel, uid, gid, additional_gids)
        return
    bounding = drop_bounding(kernel, caps, warn=warn)
    set_keep_caps(kernel, True)
    set_ids(kernel, uid, gid, additional_gids)
    set_keep_caps(kernel, False)
    set_capabilities(kernel, caps, warn=warn, bounding=bounding)
