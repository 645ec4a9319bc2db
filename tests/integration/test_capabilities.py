"""capabilities.apply() in a forked child, checked on /proc/self/status of the busybox it then execs."""
from __future__ import annotations

import os
from collections.abc import Callable

from pyruntime.linux import capabilities
from pyruntime.linux.capabilities import CAPABILITIES, Capabilities
from pyruntime.linux.syscalls import LinuxSyscalls
from tests.kit.child import run_in_child

ALL = frozenset(range(capabilities.last_cap() + 1))
KERNEL = LinuxSyscalls()


def status_after(busybox: str, setup: Callable[[], None]) -> dict[str, str]:
    code, out = run_in_child(setup, busybox, "cat", "/proc/self/status")
    assert code == 0, out
    return {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def mask(*names: str) -> str:
    return f"{sum(1 << CAPABILITIES[n] for n in names):016x}"


def caps(**sets: list[str]) -> Capabilities:
    return Capabilities.from_spec(sets)


def test_root_keeps_the_bounding_set_and_no_new_privs(busybox: str) -> None:
    """For uid 0 execve grants the whole bounding set, so that is what the container's root holds."""
    bounding = ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE"]
    wanted = caps(bounding=bounding, effective=bounding, permitted=bounding, inheritable=["CAP_KILL"])
    status = status_after(busybox, lambda: capabilities.apply(KERNEL, wanted, uid=0, gid=0, no_new_privileges=True))
    assert status["CapBnd"] == mask(*bounding)
    assert status["CapPrm"] == status["CapEff"] == mask(*bounding)
    assert status["CapInh"] == mask("CAP_KILL")
    assert status["CapAmb"] == mask()
    assert status["NoNewPrivs"] == "1"


def test_non_root_user_gets_ambient_caps_and_ids(busybox: str) -> None:
    wanted = caps(
        bounding=["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETUID"],
        permitted=["CAP_KILL", "CAP_NET_BIND_SERVICE"],
        effective=["CAP_KILL"],
        inheritable=["CAP_NET_BIND_SERVICE"],
        ambient=["CAP_NET_BIND_SERVICE"],
    )
    status = status_after(busybox, lambda: capabilities.apply(KERNEL, wanted, uid=1000, gid=1001,
                                                              additional_gids=[10, 20]))
    assert status["CapBnd"] == mask("CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETUID")
    assert status["CapInh"] == status["CapPrm"] == status["CapEff"] == status["CapAmb"] == mask("CAP_NET_BIND_SERVICE")
    assert status["Uid"].split() == ["1000"] * 4
    assert status["Gid"].split() == ["1001"] * 4
    assert status["Groups"].split() == ["10", "20"]
    assert status["NoNewPrivs"] == "0"


def test_non_root_user_without_ambient_has_no_caps_after_exec(busybox: str) -> None:
    wanted = caps(bounding=["CAP_KILL"], permitted=["CAP_KILL"], effective=["CAP_KILL"])
    status = status_after(busybox, lambda: capabilities.apply(KERNEL, wanted, uid=1000, gid=1000))
    assert status["CapPrm"] == status["CapEff"] == status["CapAmb"] == mask()
    assert status["CapBnd"] == mask("CAP_KILL")
    assert status["Groups"] == ""


def test_sets_before_exec_are_the_requested_ones(busybox: str) -> None:
    """What the init holds right before exec, which execve then transforms for a non-root user."""
    wanted = caps(bounding=["CAP_KILL", "CAP_CHOWN"], permitted=["CAP_KILL", "CAP_CHOWN"], effective=["CAP_KILL"],
                  inheritable=["CAP_CHOWN"], ambient=["CAP_CHOWN"])

    def setup() -> None:
        capabilities.apply(KERNEL, wanted, uid=1000, gid=1000)
        with open("/proc/self/status", "rb") as f:
            os.write(1, f.read())
        os._exit(0)

    code, out = run_in_child(setup, busybox, "false")
    status = {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    assert code == 0
    assert status["CapEff"] == mask("CAP_KILL")
    assert status["CapPrm"] == mask("CAP_KILL", "CAP_CHOWN")
    assert status["CapInh"] == status["CapAmb"] == mask("CAP_CHOWN")
    assert status["CapBnd"] == mask("CAP_KILL", "CAP_CHOWN")


def test_no_capabilities_object_leaves_sets_to_setuid(busybox: str) -> None:
    status = status_after(busybox, lambda: capabilities.apply(KERNEL, None, uid=1000, gid=1000, no_new_privileges=True))
    assert status["CapEff"] == status["CapPrm"] == mask()
    assert int(status["CapBnd"], 16) == sum(1 << c for c in capabilities.bounding_set(KERNEL))
    assert status["NoNewPrivs"] == "1"


def test_caps_the_runtime_lacks_are_skipped_with_warnings(busybox: str) -> None:
    """The child first gives up CAP_SYS_RESOURCE, as a runtime in a restricted environment would lack it."""
    missing = CAPABILITIES["CAP_SYS_RESOURCE"]
    restricted = Capabilities(bounding=ALL - {missing}, effective=ALL - {missing}, permitted=ALL - {missing})
    wanted = caps(bounding=["CAP_KILL", "CAP_SYS_RESOURCE"], permitted=["CAP_KILL", "CAP_SYS_RESOURCE"],
                  effective=["CAP_KILL", "CAP_SYS_RESOURCE"], inheritable=["CAP_KILL", "CAP_SYS_RESOURCE"],
                  ambient=["CAP_KILL", "CAP_SYS_RESOURCE"])

    def setup() -> None:
        capabilities.drop_bounding(KERNEL, restricted)
        capabilities.set_capabilities(KERNEL, restricted)
        warnings: list[str] = []
        capabilities.apply(KERNEL, wanted, uid=1000, gid=1000, warn=warnings.append)
        os.write(1, "".join(f"warning: {w}\n" for w in warnings).encode())

    code, out = run_in_child(setup, busybox, "cat", "/proc/self/status")
    assert code == 0, out
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: process.capabilities.bounding: CAP_SYS_RESOURCE is not in the runtime's bounding set, not granted",
        *(f"warning: process.capabilities.{key}: CAP_SYS_RESOURCE cannot be granted, skipped"
          for key in ("permitted", "effective", "inheritable")),
        "warning: process.capabilities.ambient: can't raise ambient capability CAP_SYS_RESOURCE: it is not in "
        "both the permitted and the inheritable sets, skipped",
    ]
    status = {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    assert status["CapBnd"] == status["CapAmb"] == status["CapEff"] == mask("CAP_KILL")


def test_failures_name_the_call(busybox: str) -> None:
    """Without CAP_SETPCAP in effective the bounding set cannot be changed."""
    no_setpcap = Capabilities(bounding=ALL, permitted=ALL, effective=ALL - {CAPABILITIES["CAP_SETPCAP"]})

    def setup() -> None:
        capabilities.set_capabilities(KERNEL, no_setpcap)
        try:
            capabilities.drop_bounding(KERNEL, caps(bounding=["CAP_KILL"]))
        except OSError as e:
            os.write(1, f"{e.errno} {e.strerror}".encode())
        os._exit(0)

    code, out = run_in_child(setup, busybox, "true")
    assert (code, out) == (0, "1 prctl(PR_CAPBSET_DROP, CAP_CHOWN): Operation not permitted")
