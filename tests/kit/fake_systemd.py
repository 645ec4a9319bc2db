"""A systemd Manager on a fake bus: records every call the cgroup drivers make (pynode_os.systemd.SystemdBus),
keeps the units it was asked to start, and answers as systemd does (UnitExists, NoSuchUnit, job results)."""
from __future__ import annotations

from pynode_os.systemd import SystemdBus, SystemdError

NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"


class FakeSystemd(SystemdBus):
    """`on_start(name, properties)`: what systemd does besides recording the unit (a test makes the scope's
    directory there); `job_result`: how every job ends; `failed`: units that exist as failed leftovers."""

    def __init__(self, version: int = 252, job_result: str = "done", on_start=None) -> None:
        self.calls: list[tuple] = []
        self.units: dict[str, list] = {}
        self.failed: set[str] = set()
        self._version, self.job_result, self.on_start = version, job_result, on_start
        self._jobs = 0
        self.closed = False

    def _job(self) -> str:
        self._jobs += 1
        return f"/org/freedesktop/systemd1/job/{self._jobs}"

    def start_transient_unit(self, name: str, properties: list) -> str:
        self.calls.append(("StartTransientUnit", name, "replace", properties))
        if name in self.units or name in self.failed:
            raise SystemdError(f"Unit {name} already exists.", UNIT_EXISTS)
        self.units[name] = properties
        if self.on_start is not None:
            self.on_start(name, properties)
        return self._job()

    def stop_unit(self, name: str) -> str:
        self.calls.append(("StopUnit", name, "replace"))
        if self.units.pop(name, None) is None:
            raise SystemdError(f"Unit {name} not loaded.", NO_SUCH_UNIT)
        return self._job()

    def wait_job(self, job: str, timeout: float) -> str:
        self.calls.append(("wait", job))
        return self.job_result

    def reset_failed_unit(self, name: str) -> None:
        self.calls.append(("ResetFailedUnit", name))
        if name not in self.failed:
            raise SystemdError(f"Unit {name} not loaded.", NO_SUCH_UNIT)
        self.failed.discard(name)

    def set_unit_properties(self, name: str, properties: list) -> None:
        self.calls.append(("SetUnitProperties", name, True, properties))

    def version(self) -> int:
        return self._version

    def close(self) -> None:
        self.closed = True

    def names(self) -> list[str]:
        """The calls' names in order, for a test of the sequence."""
        return [c[0] for c in self.calls]
