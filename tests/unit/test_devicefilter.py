"""The device program compiler against a model of the v1 devices cgroup: the emitted instructions are run
by a small interpreter of the eBPF subset, and must answer every probe (type, numbers, access) as the v1
kernel would answer it after the same rules were written to devices.allow/deny. The model is written
after security/device_cgroup.c (an exception list; add merges access, remove takes it from the exact
entry only; full match in deny-all mode, partial match in allow-all mode), not after the compiler."""
from __future__ import annotations

import random
import struct

import pytest

from pyruntime.fieldreader import SpecError
from pyruntime.linux.cgroups import devicefilter as df
from pyruntime.linux.cgroups.resources import DEFAULT_ALLOWED_DEVICES, DeviceRule, Resources

CTX = object()  # what R1 holds on entry: the context, readable only through loads


def run(program: bytes, type_: str, major: int, minor: int, access: str) -> bool:
    """Runs the program on one struct bpf_cgroup_dev_ctx; True when it allows."""
    assert len(program) % 8 == 0 and len(program) // 8 <= 4096
    bits = sum(df.ACCESS_BITS[a] for a in access)
    ctx = struct.pack("<III", df.TYPES[type_] | bits << 16, major, minor)
    regs: dict[int, object] = {1: CTX}
    insns = [struct.unpack_from("<BBhi", program, i) for i in range(0, len(program), 8)]
    pc = 0
    while True:
        code, regs_byte, off, imm = insns[pc]
        dst, src = regs_byte & 0xF, regs_byte >> 4
        u_imm = imm & 0xFFFFFFFF
        pc += 1
        if code == df.LDX_MEM_W:
            assert regs[src] is CTX and off in (0, 4, 8)
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
            continue
        if code == df.EXIT:
            assert isinstance(regs.get(0), int)
            return regs[0] != 0
        if code == df.ALU32_MOV_K:
            regs[dst] = u_imm
            continue
        if code == df.ALU32_MOV_X:
            regs[dst] = regs[src]
            continue
        value = regs[dst]
        assert isinstance(value, int), f"instruction {pc - 1} reads register {dst} that holds no number"
        if code == df.ALU32_AND_K:
            regs[dst] = value & u_imm
        elif code == df.ALU32_RSH_K:
            regs[dst] = (value & 0xFFFFFFFF) >> u_imm
        elif code in (df.JMP32_JNE_K, df.JMP32_JEQ_K, df.JMP32_JNE_X):
            other = regs[src] if code == df.JMP32_JNE_X else u_imm
            assert isinstance(other, int) and off >= 0
            equal = value & 0xFFFFFFFF == other & 0xFFFFFFFF
            if equal == (code == df.JMP32_JEQ_K):
                pc += off
            assert pc < len(insns)
        else:
            raise AssertionError(f"unknown opcode {code:#x}")


class V1Model:
    """The v1 devices cgroup of one task, written the way v1.py writes it (deny "a" first, then each rule)."""

    def __init__(self) -> None:
        self.default_allow = False
        self.exceptions: list[list] = []  # [type, major, minor, access letters]; None is *
        self.ignored_inside_wildcard = False  # a removal the kernel drops silently (the compiler refuses it)

    def write(self, rule: DeviceRule) -> None:
        if rule.type == "a":
            self.default_allow, self.exceptions = rule.allow, []
            return
        access = set(rule.access)
        if rule.allow == self.default_allow:  # dev_exception_rm: exact entry only
            for ex in self.exceptions:
                if ex[0] == rule.type and (ex[1], ex[2]) != (rule.major, rule.minor) \
                        and ex[1] in (None, rule.major) and ex[2] in (None, rule.minor) and ex[3] & access:
                    self.ignored_inside_wildcard = True
            for ex in list(self.exceptions):
                if ex[:3] == [rule.type, rule.major, rule.minor]:
                    ex[3] = ex[3] - access
                    if not ex[3]:
                        self.exceptions.remove(ex)
            return
        for ex in self.exceptions:  # dev_exception_add: merged into an equal entry
            if ex[:3] == [rule.type, rule.major, rule.minor]:
                ex[3] = ex[3] | access
                return
        self.exceptions.append([rule.type, rule.major, rule.minor, access])

    def allows(self, type_: str, major: int, minor: int, access: str) -> bool:
        asked = set(access)
        for t, ma, mi, acc in self.exceptions:
            if t != type_ or ma not in (None, major) or mi not in (None, minor):
                continue
            if self.default_allow and asked & acc:  # match_exception_partial
                return False
            if not self.default_allow and asked <= acc:  # match_exception
                return True
        return self.default_allow


MAJORS = (1, 5, 8, 136, 254, (1 << 31) + 5, (1 << 32) - 1)
MINORS = (0, 3, 9, (1 << 31) + 5)
PROBES = [(t, ma, mi, acc) for t in "bc" for ma in MAJORS for mi in MINORS for acc in ("m", "r", "w", "rw")]


def agree(rules: tuple[DeviceRule, ...]) -> None:
    model = V1Model()
    for rule in rules:
        model.write(rule)
    try:
        program = df.compile_rules(rules)
    except SpecError as e:
        assert model.ignored_inside_wildcard, f"{rules}: refused ({e}) though v1 would apply every rule"
        return
    assert not model.ignored_inside_wildcard, f"{rules}: compiled though v1 would silently ignore a rule"
    wrong = [p for p in PROBES if run(program, *p) != model.allows(*p)]
    assert wrong == [], f"{rules}: the program and v1 disagree on {wrong[:5]}"


def random_rule(rng: random.Random) -> DeviceRule:
    access = "".join(a for a in "rwm" if rng.random() < 0.5) or rng.choice("rwm")
    return DeviceRule(rng.random() < 0.5, rng.choice("abcc"), rng.choice((None, None, 8, 136, (1 << 31) + 5)),
                      rng.choice((None, None, 0, 3, (1 << 31) + 5)), access)


def test_random_rule_lists_answer_as_v1():
    rng = random.Random(22)
    refused = 0
    for _ in range(800):
        rules = tuple(random_rule(rng) for _ in range(rng.randrange(0, 9)))
        agree(rules)
        rules = (DeviceRule(False),) + rules + DEFAULT_ALLOWED_DEVICES  # as create applies them
        try:
            df.compile_rules(rules)
        except SpecError:
            refused += 1
        agree(rules)
    assert refused < 250  # most lists compile: the comparison above is not vacuous


def test_default_policy_is_runcs_allow_list():
    rules = Resources().with_device_policy().devices
    assert rules is not None
    program = df.compile_rules(rules)
    assert run(program, "c", 1, 3, "rw") and run(program, "c", 136, 4, "rw") and run(program, "c", 10, 200, "r")
    assert run(program, "b", 254, 0, "m") and run(program, "c", 4, 1, "m")  # mknod of any node, as runc allows
    assert not run(program, "b", 254, 0, "r") and not run(program, "b", 8, 0, "w") and not run(program, "c", 4, 1, "r")
    agree(rules)


@pytest.mark.parametrize("rules", [
    (),  # deny all: nothing to attach besides
    (DeviceRule(True),),
    (DeviceRule(True), DeviceRule(False, "b", 8, None, "r")),
    (DeviceRule(False), DeviceRule(True, "c", 1, 3, "r"), DeviceRule(True, "c", 1, None, "w")),
    (DeviceRule(True, "c", 1, 3, "r"), DeviceRule(True, "a", 5, 5, "m")),  # "a" with numbers still means all
    (DeviceRule(False), DeviceRule(True, "c", None, None, "rwm"), DeviceRule(False, "c", None, None, "w")),
    (DeviceRule(True, "b", 8, 0, "rw"), DeviceRule(False, "b", 8, 0, "w")),
    (DeviceRule(True), DeviceRule(False, "c", 1, 3, "rw"), DeviceRule(True, "c", 1, 3, "w")),
])
def test_chosen_lists(rules):
    agree(rules)


def test_hole_in_a_wildcard_is_refused_naming_the_rule():
    rules = (DeviceRule(True), DeviceRule(False, "c", None, None, "rwm")) + DEFAULT_ALLOWED_DEVICES
    with pytest.raises(SpecError, match=r"^linux.resources.devices\[4\] \(allow c 1:3 rwm\): cannot take access "
                                        r"away from inside the wider rule c \*:\* \(cgroup v1 would ignore it\)$"):
        df.compile_rules(rules)


@pytest.mark.parametrize("field, value", [("major", -1), ("minor", 1 << 32)])
def test_numbers_outside_u32_are_refused(field, value):
    rule = DeviceRule(True, "c", **{"major": 1, "minor": 3, field: value})
    with pytest.raises(SpecError, match=rf"^linux.resources.devices\[1\].{field}: must be between 0 and 4294967295"):
        df.compile_rules((DeviceRule(False), rule))
