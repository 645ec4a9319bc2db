"""process.capabilities parsing: types are errors, names the kernel cannot map are warnings (spec, runc >= 1.1)."""
from __future__ import annotations

import pytest

from pyruntime.linux import capabilities
from pyruntime.linux.capabilities import CAPABILITIES, Capabilities


def test_names_match_the_kernel_numbering() -> None:
    assert CAPABILITIES["CAP_CHOWN"] == 0
    assert CAPABILITIES["CAP_SYS_ADMIN"] == 21
    assert CAPABILITIES["CAP_SYS_RESOURCE"] == 24
    assert CAPABILITIES["CAP_AUDIT_READ"] == 37
    assert CAPABILITIES["CAP_CHECKPOINT_RESTORE"] == 40
    assert sorted(CAPABILITIES.values()) == list(range(41))
    assert capabilities.name(21) == "CAP_SYS_ADMIN"
    assert capabilities.name(63) == "CAP_63"


def test_last_cap_reads_the_kernel() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        assert capabilities.last_cap() == int(f.read())


def test_parses_all_sets() -> None:
    caps = Capabilities.from_spec({
        "bounding": ["CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE"],
        "effective": ["CAP_KILL"],
        "inheritable": [],
        "permitted": ["CAP_KILL", "CAP_NET_BIND_SERVICE"],
        "ambient": ["CAP_NET_BIND_SERVICE"],
    })
    assert caps == Capabilities(
        bounding=frozenset({5, 10, 29}), effective=frozenset({5}), inheritable=frozenset(),
        permitted=frozenset({5, 10}), ambient=frozenset({10}))


def test_absent_sets_are_empty() -> None:
    assert Capabilities.from_spec({"bounding": ["CAP_CHOWN"], "ambient": None}) == Capabilities(bounding=frozenset({0}))


def test_unknown_names_are_warned_about_and_dropped() -> None:
    warnings: list[str] = []
    caps = Capabilities.from_spec({"effective": ["CAP_CHOWN", "CAP_FOO"], "bounding": ["chown"]}, warn=warnings.append)
    assert caps == Capabilities(effective=frozenset({0}))
    assert warnings == [
        "process.capabilities.bounding: ignoring unknown or unavailable capability 'chown'",
        "process.capabilities.effective: ignoring unknown or unavailable capability 'CAP_FOO'",
    ]


def test_capabilities_newer_than_the_kernel_are_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capabilities, "last_cap", lambda: 37)
    warnings: list[str] = []
    caps = Capabilities.from_spec({"permitted": ["CAP_AUDIT_READ", "CAP_BPF"]}, warn=warnings.append)
    assert caps == Capabilities(permitted=frozenset({37}))
    assert warnings == ["process.capabilities.permitted: ignoring unknown or unavailable capability 'CAP_BPF'"]


@pytest.mark.parametrize("obj, message", [
    (["CAP_CHOWN"], 'process.capabilities: must be an object, got ["CAP_CHOWN"]'),
    ({"bounding": "CAP_CHOWN"}, 'process.capabilities.bounding: must be an array, got "CAP_CHOWN"'),
    ({"ambient": ["CAP_CHOWN", 3]}, "process.capabilities.ambient[1]: must be a string, got 3"),
])
def test_type_errors_name_the_field(obj: object, message: str) -> None:
    with pytest.raises(ValueError) as e:
        Capabilities.from_spec(obj)
    assert str(e.value) == message
