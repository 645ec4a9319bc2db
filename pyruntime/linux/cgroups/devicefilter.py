"""OCI device rules compiled into the eBPF program that enforces them on cgroup v2.

cgroup v2 has no devices controller: a BPF_PROG_TYPE_CGROUP_DEVICE program attached to the container's
cgroup answers every mknod and every open of a device node, and without one a root container with
CAP_MKNOD can make a node for the host's disk and read it. The program must give what the v1 devices
cgroup gives for the same rule list (v1.py writes it to devices.allow/deny), so the list is first
replayed as the v1 kernel replays it (security/device_cgroup.c), and the program is built from the
resulting state rather than from the rules one by one, as runc's devicefilter builds it from its
emulator's state:

- a type "a" rule (whatever its numbers, as the kernel reads only the letter) resets the state to
  allow-all or deny-all, with no exceptions;
- a rule of the other verdict adds its access to the exception of exactly its type and numbers;
- a rule of the default's verdict takes its access away from that exact exception. The kernel silently
  ignores one that falls inside a wildcard exception ("c *:* rwm" then deny "c 1:3 rwm" leaves 1:3
  allowed); a config that relies on it would believe a device denied that is not, so such a rule is
  refused here, as runc refuses it.

A check then asks, as the kernel does: in deny-all mode, is there an exception that matches the device
and covers every access asked for; in allow-all mode, is there one that matches it and any access asked.
Pure logic: no kernel call, so that unit tests run it over many rule lists against a model.
"""
from __future__ import annotations

import struct

from pyruntime.fieldreader import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.linux.cgroups.resources import DeviceRule

# struct bpf_cgroup_dev_ctx's access_type: the device type in the low 16 bits, the access in the high ones
DEV_BLOCK, DEV_CHAR = 1, 2
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4
ACCESS_BITS = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}
TYPES = {"b": DEV_BLOCK, "c": DEV_CHAR}
LICENSE = "Apache-2.0"  # any string does for a program that calls no GPL-only helper
U32_MAX = (1 << 32) - 1

# instruction classes and operations (linux/bpf.h, linux/bpf_common.h)
LDX_MEM_W = 0x61          # BPF_LDX | BPF_MEM | BPF_W
ALU32_AND_K = 0x54        # BPF_ALU | BPF_AND | BPF_K
ALU32_RSH_K = 0x74        # BPF_ALU | BPF_RSH | BPF_K
ALU32_MOV_K = 0xB4        # BPF_ALU | BPF_MOV | BPF_K
ALU32_MOV_X = 0xBC        # BPF_ALU | BPF_MOV | BPF_X
JMP32_JNE_K = 0x56        # BPF_JMP32 | BPF_JNE | BPF_K: 32-bit compares, so minors above 2^31 compare right
JMP32_JEQ_K = 0x16        # BPF_JMP32 | BPF_JEQ | BPF_K
JMP32_JNE_X = 0x5E        # BPF_JMP32 | BPF_JNE | BPF_X
EXIT = 0x95               # BPF_JMP | BPF_EXIT

# registers: R1 holds the context on entry, R0 the verdict on exit (1 allows, 0 refuses with EPERM)
R0, R1, R2, R3, R4, R5 = range(6)

Key = tuple[int, "int | None", "int | None"]  # (type, major, minor); None is the * wildcard


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One struct bpf_insn (little-endian: dst_reg in the low nibble); imm as its 32-bit pattern."""
    if imm > 0x7FFFFFFF:
        imm -= 1 << 32
    return struct.pack("<BBhi", code, dst | src << 4, off, imm)


def _access(rule: DeviceRule) -> int:
    bits = 0
    for letter in rule.access:
        bits |= ACCESS_BITS[letter]
    return bits


def _number(value: int | None, field: str, where: str) -> int | None:
    if value is not None and not 0 <= value <= U32_MAX:
        raise SpecError(f"{where}.{field}: must be between 0 and {U32_MAX} (or absent for any), got {value}")
    return value


def emulate(rules: tuple[DeviceRule, ...],
            where: str = "linux.resources.devices") -> tuple[bool, dict[Key, int]]:
    """(allow-by-default, exceptions with their access bits) after `rules` are applied in order to a
    deny-all cgroup, as the v1 kernel applies them; SpecError for a rule the program can't express."""
    default_allow = False
    exceptions: dict[Key, int] = {}
    for i, rule in enumerate(rules):
        at = f"{where}[{i}]"
        if rule.type == "a":
            default_allow, exceptions = rule.allow, {}
            continue
        key: Key = (TYPES[rule.type], _number(rule.major, "major", at), _number(rule.minor, "minor", at))
        access = _access(rule)
        if rule.allow != default_allow:
            exceptions[key] = exceptions.get(key, 0) | access
            continue
        _, major, minor = key
        for wider in ((key[0], None, minor), (key[0], major, None), (key[0], None, None)):
            if wider != key and exceptions.get(wider, 0) & access:
                shown_wider = f"{rule.type} " + ":".join("*" if n is None else str(n) for n in wider[1:])
                raise SpecError(f"{at} ({'allow' if rule.allow else 'deny'} {rule.v1_entry()}): cannot take access "
                                f"away from inside the wider rule {shown_wider} (cgroup v1 would ignore it)")
        left = exceptions.pop(key, 0) & ~access
        if left:
            exceptions[key] = left
    return default_allow, exceptions


def compile_rules(rules: tuple[DeviceRule, ...], where: str = "linux.resources.devices") -> bytes:
    """The BPF_PROG_TYPE_CGROUP_DEVICE program (8-byte instructions, concatenated) for `rules`."""
    default_allow, exceptions = emulate(rules, where)
    program = [
        insn(LDX_MEM_W, R2, R1, 0), insn(ALU32_AND_K, R2, imm=0xFFFF),  # R2: device type
        insn(LDX_MEM_W, R3, R1, 0), insn(ALU32_RSH_K, R3, imm=16),      # R3: access asked
        insn(LDX_MEM_W, R4, R1, 4),                                     # R4: major
        insn(LDX_MEM_W, R5, R1, 8),                                     # R5: minor
    ]
    for (type_, major, minor), access in exceptions.items():
        # each test jumps past the block's end (the verdict) to the next block when it fails
        tests: list[tuple[int, int, int, int]] = [(JMP32_JNE_K, R2, 0, type_)]
        if default_allow:  # a deny exception matches when any access asked is in it
            tests.append((ALU32_MOV_X, R1, R3, 0))
            tests.append((ALU32_AND_K, R1, 0, access))
            tests.append((JMP32_JEQ_K, R1, 0, 0))
        elif access != ACC_MKNOD | ACC_READ | ACC_WRITE:  # an allow exception, when it has every access asked
            tests.append((ALU32_MOV_X, R1, R3, 0))
            tests.append((ALU32_AND_K, R1, 0, access))
            tests.append((JMP32_JNE_X, R1, R3, 0))
        if major is not None:
            tests.append((JMP32_JNE_K, R4, 0, major))
        if minor is not None:
            tests.append((JMP32_JNE_K, R5, 0, minor))
        length = len(tests) + 2
        for j, (code, dst, src, imm) in enumerate(tests):
            jumps = code in (JMP32_JNE_K, JMP32_JEQ_K, JMP32_JNE_X)
            program.append(insn(code, dst, src, length - j - 1 if jumps else 0, imm))
        program += [insn(ALU32_MOV_K, R0, imm=0 if default_allow else 1), insn(EXIT)]
    program += [insn(ALU32_MOV_K, R0, imm=1 if default_allow else 0), insn(EXIT)]
    return b"".join(program)
