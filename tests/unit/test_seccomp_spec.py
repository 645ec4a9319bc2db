"""linux.seccomp validation: every rejection names the offending field, as the CLI prints it verbatim."""
from __future__ import annotations

import pytest

from pyruntime.linux.seccomp import compiler
from pyruntime.linux.seccomp.profile import ACTIONS, FLAGS, OPERATORS, Arg, Seccomp, Syscall


def parse(**fields: object) -> Seccomp:
    return Seccomp.from_spec({"defaultAction": "SCMP_ACT_ALLOW", **fields})


def test_full_config_round_trips_into_typed_fields() -> None:
    s = Seccomp.from_spec({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 38,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "flags": ["SECCOMP_FILTER_FLAG_LOG"],
        "listenerPath": "/run/agent.sock",
        "listenerMetadata": "meta",
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"},
                      {"index": 1, "value": 0xF0, "valueTwo": 0x10, "op": "SCMP_CMP_MASKED_EQ"}]},
            {"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"},
            {"names": ["ptrace"], "action": "SCMP_ACT_TRACE", "errnoRet": 1},
        ],
    })
    assert s.default_action == "SCMP_ACT_ERRNO" and s.default_errno_ret == 38
    assert s.architectures == ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32")
    assert s.flags == ("SECCOMP_FILTER_FLAG_LOG",)
    assert (s.listener_path, s.listener_metadata) == ("/run/agent.sock", "meta")
    assert s.syscalls[0] == Syscall(("read", "write"), "SCMP_ACT_ALLOW")
    assert s.syscalls[1].args == (Arg(0, 8, 0, "SCMP_CMP_EQ"), Arg(1, 0xF0, 0x10, "SCMP_CMP_MASKED_EQ"))
    assert s.syscalls[3].errno_ret == 1
    assert s.uses_notify


def test_minimal_config_has_empty_defaults() -> None:
    s = parse()
    assert s == Seccomp("SCMP_ACT_ALLOW")
    assert not s.uses_notify


def test_unknown_syscall_names_are_accepted_for_load_to_skip() -> None:
    assert parse(syscalls=[{"names": ["no_such_syscall"], "action": "SCMP_ACT_ERRNO"}]).syscalls[0].names == (
        "no_such_syscall",)


@pytest.mark.parametrize("obj, message", [
    ([], "linux.seccomp: must be an object, got []"),
    ({}, "linux.seccomp.defaultAction: required"),
    ({"defaultAction": "SCMP_ACT_FOO"}, 'linux.seccomp.defaultAction: unknown action "SCMP_ACT_FOO"'),
    ({"defaultAction": 3}, "linux.seccomp.defaultAction: must be a string, got 3"),
    ({"defaultAction": "SCMP_ACT_NOTIFY", "listenerPath": "/x"},
     "linux.seccomp.defaultAction: SCMP_ACT_NOTIFY cannot be the default action"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/x",
      "syscalls": [{"names": ["read", "write"], "action": "SCMP_ACT_NOTIFY"}]},
     "linux.seccomp.syscalls[0].names[1]: SCMP_ACT_NOTIFY cannot be used for the write syscall"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "defaultErrnoRet": 1},
     "linux.seccomp.defaultErrnoRet: not supported by action SCMP_ACT_ALLOW"),
    ({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": -1},
     "linux.seccomp.defaultErrnoRet: -1 is out of range [0, 65535]"),
    ({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": True},
     "linux.seccomp.defaultErrnoRet: must be an integer, got true"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "architectures": "SCMP_ARCH_X86"},
     'linux.seccomp.architectures: must be an array, got "SCMP_ARCH_X86"'),
    ({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86", "SCMP_ARCH_VAX"]},
     'linux.seccomp.architectures[1]: unknown architecture "SCMP_ARCH_VAX"'),
    ({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_NEW_LISTENER"]},
     'linux.seccomp.flags[0]: unknown flag "SECCOMP_FILTER_FLAG_NEW_LISTENER"'),
    ({"defaultAction": "SCMP_ACT_ALLOW", "listenerMetadata": "m"},
     "linux.seccomp.listenerMetadata: set without listenerPath"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": 7}, "linux.seccomp.listenerPath: must be a string, got 7"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]},
     "linux.seccomp.listenerPath: required when SCMP_ACT_NOTIFY is used"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": {}}, "linux.seccomp.syscalls: must be an array, got {}"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": ["read"]},
     'linux.seccomp.syscalls[0]: must be an object, got "read"'),
])
def test_top_level_errors_name_the_field(obj: object, message: str) -> None:
    with pytest.raises(ValueError) as e:
        Seccomp.from_spec(obj)
    assert str(e.value) == message


@pytest.mark.parametrize("rule, message", [
    ({"action": "SCMP_ACT_ALLOW"}, "syscalls[2].names: required"),
    ({"names": [], "action": "SCMP_ACT_ALLOW"}, "syscalls[2].names: must contain at least one entry"),
    ({"names": "read", "action": "SCMP_ACT_ALLOW"}, 'syscalls[2].names: must be an array, got "read"'),
    ({"names": ["read", 1], "action": "SCMP_ACT_ALLOW"}, "syscalls[2].names[1]: must be a string, got 1"),
    ({"names": ["read"]}, "syscalls[2].action: required"),
    ({"names": ["read"], "action": "SCMP_ACT_FOO"}, 'syscalls[2].action: unknown action "SCMP_ACT_FOO"'),
    ({"names": ["read"], "action": "SCMP_ACT_KILL", "errnoRet": 1},
     "syscalls[2].errnoRet: not supported by action SCMP_ACT_KILL"),
    ({"names": ["read"], "action": "SCMP_ACT_ERRNO", "errnoRet": 70000},
     "syscalls[2].errnoRet: 70000 is out of range [0, 65535]"),
    ({"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": {}}, "syscalls[2].args: must be an array, got {}"),
    ({"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"value": 1, "op": "SCMP_CMP_EQ"}]},
     "syscalls[2].args[0].index: required"),
    ({"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]},
     "syscalls[2].args[0].index: 6 is out of range [0, 5]"),
    ({"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1 << 64, "op": "SCMP_CMP_EQ"}]},
     f"syscalls[2].args[0].value: {1 << 64} is out of range [0, {(1 << 64) - 1}]"),
    ({"names": ["read"], "action": "SCMP_ACT_ALLOW",
      "args": [{"index": 0, "value": 1, "valueTwo": "2", "op": "SCMP_CMP_EQ"}]},
     'syscalls[2].args[0].valueTwo: must be an integer, got "2"'),
    ({"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_LIKE"}]},
     'syscalls[2].args[0].op: unknown operator "SCMP_CMP_LIKE"'),
    ({"names": ["read", "../x"], "action": "SCMP_ACT_ALLOW"}, 'syscalls[2].names[1]: "../x" is not a syscall name'),
])
def test_rule_errors_name_the_rule_and_field(rule: dict, message: str) -> None:
    ok = {"names": ["read"], "action": "SCMP_ACT_ALLOW"}
    with pytest.raises(ValueError) as e:
        parse(syscalls=[ok, ok, rule])
    assert str(e.value) == f"linux.seccomp.{message}"


def test_features_lists_spec_names() -> None:
    f = compiler.features()
    assert f["enabled"] is True
    assert set(f["actions"]) == set(ACTIONS)
    assert f["operators"] == sorted(OPERATORS)
    expected_archs = {"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"}
    assert expected_archs <= set(f["archs"])
    assert set(f["supportedFlags"]) <= set(f["knownFlags"]) == set(FLAGS)
    assert "SECCOMP_FILTER_FLAG_LOG" in f["supportedFlags"]


def test_import_does_not_load_libseccomp() -> None:
    import subprocess
    import sys

    code = ("import pyruntime.linux.seccomp.loader, pyruntime.linux.capabilities\n"
            "maps = open('/proc/self/maps').read()\n"
            "assert 'libseccomp' not in maps, 'libseccomp loaded at import'\n"
            "import sys; assert 'pyseccomp' not in sys.modules and 'prctl' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _run_bpf(program: bytes, arch: int, nr: int) -> int | str:
    """Runs a classic-BPF seccomp program on (arch, nr): its return value, or "next" when it falls off
    its end (into libseccomp's program)."""
    import struct
    code = list(struct.iter_unpack("=HBBI", program))
    pc, acc = 0, 0
    while pc < len(code):
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:
            acc = {0: nr, 4: arch}[k]
        elif op == 0x06:
            return k
        elif op == 0x05:
            pc += k
        else:
            taken = {0x15: acc == k, 0x25: acc > k, 0x45: bool(acc & k)}[op]
            pc += jt if taken else jf
    return "next"


def test_enosys_stub_answers_numbers_above_the_profiles_highest_per_arch() -> None:
    x86_64, x32, i386, arm = 0xC000003E, 0x4000003E, 0x40000003, 0x40000028
    enosys = 0x00050000 | 38
    stub = compiler.enosys_stub({x86_64: 334, x32: 0x40000000 + 300, i386: 400})
    assert _run_bpf(stub, x86_64, 334) == "next" and _run_bpf(stub, x86_64, 435) == enosys
    assert _run_bpf(stub, x86_64, 0x40000000 + 300) == "next"
    assert _run_bpf(stub, x86_64, 0x40000000 + 301) == enosys
    assert _run_bpf(stub, i386, 400) == "next" and _run_bpf(stub, i386, 1000) == enosys
    assert _run_bpf(stub, arm, 5000) == "next"  # not in the profile: libseccomp's bad-arch verdict
    only_native = compiler.enosys_stub({x86_64: 10})
    assert _run_bpf(only_native, x86_64, 0x40000000 + 1) == "next"
    assert _run_bpf(only_native, x86_64, 11) == enosys
    assert _run_bpf(compiler.enosys_stub({}), x86_64, 1000) == "next"


def test_flags_as_runc_chooses_them(monkeypatch) -> None:
    """Absent: SPEC_ALLOW where the host has it; an empty list: none; TSYNC never (one thread loads the
    filter); WAIT_KILLABLE_RECV only with a notify rule. filter_flags is what --debug reports."""
    monkeypatch.setattr(compiler, "supported_flags", lambda: frozenset(FLAGS))
    assert parse().flags is None and compiler.effective_flags(parse()) == ("SECCOMP_FILTER_FLAG_SPEC_ALLOW",)
    assert compiler.filter_flags(parse()) == 4
    assert compiler.effective_flags(parse(flags=[])) == () and compiler.filter_flags(parse(flags=[])) == 0
    both = parse(flags=["SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_SPEC_ALLOW",
                        "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"])
    assert compiler.filter_flags(both) == 2 | 4
    notify = parse(flags=["SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"], listenerPath="/run/agent.sock",
                   syscalls=[{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}])
    assert compiler.filter_flags(notify) == 32
    monkeypatch.setattr(compiler, "supported_flags", lambda: frozenset({"SECCOMP_FILTER_FLAG_LOG"}))
    assert compiler.filter_flags(parse()) == 0  # no SPEC_ALLOW on this host: none
