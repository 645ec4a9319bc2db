"""systemd as a cgroup manager: its slice naming, and its units started and stopped over D-Bus.

Both the runtime's systemd cgroup driver (containers as transient scopes) and the kubelet's (the kubepods, QoS
and pod slices) ask the same manager, org.freedesktop.systemd1 on the system bus, for the same few things,
as runc's libcontainer/cgroups/systemd does for runc and the stock kubelet alike; the kubelet may not import
the runtime (tests/unit/test_layers.py), so the one implementation is here.

The D-Bus calls go through `SystemdBus`, whose only real implementation (`DBusSystemd`) loads jeepney on
its first connection: every runtime command imports this floor's modules, and only those that make or remove
a unit under systemd pay for the client. Unit tests hand in a fake bus that records the calls. What runc adds
around the calls (a leftover failed unit reset and the start retried once, the job waited for) is in
`start_unit` and `stop_unit`, over the interface, so it is unit-tested too.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    # a unit property as D-Bus carries it, a(sv): name, (signature, value)
    Property = tuple[str, tuple[str, object]]

SYSTEMD_RUN_DIR = "/run/systemd/system"  # sd_booted(3): this directory exists only when systemd is PID 1
SYSTEMD_BUS_NAME = "org.freedesktop.systemd1"
SYSTEMD_PATH = "/org/freedesktop/systemd1"
MANAGER_INTERFACE = "org.freedesktop.systemd1.Manager"
UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"
JOB_TIMEOUT = 30.0  # runc's wait for a start or stop job
SLICE_SUFFIX = ".slice"
USEC_INFINITY = 2 ** 64 - 1  # systemd's "no limit" for a uint64 property (MemoryMax, TasksMax, CPUQuotaPerSecUSec)


class SystemdError(Exception):
    """A D-Bus call systemd refused or could not answer; `name` is the D-Bus error name ("" for a failed
    job or a bus that could not be reached)."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


def booted(run_dir: str = SYSTEMD_RUN_DIR) -> bool:
    """sd_booted(3), as runc's IsRunningSystemd: the host's init is systemd."""
    return os.path.isdir(run_dir) and not os.path.islink(run_dir)


def expand_slice(name: str) -> str:
    """A slice's cgroup path: "test-a-b.slice" is /test.slice/test-a.slice/test-a-b.slice, "-.slice" the root.
    Raises ValueError for a name systemd would refuse (runc's ExpandSlice rules)."""
    if len(name) < len(SLICE_SUFFIX) or not name.endswith(SLICE_SUFFIX) or "/" in name:
        raise ValueError(f"invalid slice name: {name}")
    stem = name[:-len(SLICE_SUFFIX)]
    if stem == "-":
        return "/"
    path, prefix = "", ""
    for component in stem.split("-"):
        if not component:  # "test--a.slice", "-test.slice"
            raise ValueError(f"invalid slice name: {name}")
        path += "/" + prefix + component + SLICE_SUFFIX
        prefix += component + "-"
    return path


def cgroup_name_to_systemd(components: list[str]) -> str:
    """The kubelet's CgroupName.ToSystemd: ["kubepods", "burstable", "pod12-34"] is
    /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice ("-" in a component is "_",
    since "-" nests), [] the root "/"."""
    if not components:
        return "/"
    return expand_slice("-".join(c.replace("-", "_") for c in components) + SLICE_SUFFIX)


def slice_properties(parent: str, name: str) -> list[Property]:
    """What runc's Apply(-1) starts a slice with, as the kubelet makes its kubepods, QoS and pod slices: wanted
    by its parent slice (a slice's parent is named by Wants=, not Slice=), accounting on as a cgroupfs
    hierarchy has its controllers, and no default dependencies."""
    return [("Description", ("s", f"libcontainer container {name}")), ("Wants", ("as", [parent])),
            ("MemoryAccounting", ("b", True)), ("CPUAccounting", ("b", True)), ("IOAccounting", ("b", True)),
            ("TasksAccounting", ("b", True)), ("DefaultDependencies", ("b", False))]


def version_number(text: str) -> int:
    """The number of a systemd Version property ("v245.4-1.fc32", "252.36-1~deb12u1", "245"); -1 if none."""
    digits = ""
    for ch in text.lstrip('"v'):
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else -1


class SystemdBus(ABC):
    """The Manager calls the cgroup drivers make; each raises SystemdError with the D-Bus error's name."""

    @abstractmethod
    def start_transient_unit(self, name: str, properties: list[Property]) -> str:
        """StartTransientUnit(name, "replace", properties, []): the job's object path."""

    @abstractmethod
    def stop_unit(self, name: str) -> str:
        """StopUnit(name, "replace"): the job's object path."""

    @abstractmethod
    def wait_job(self, job: str, timeout: float) -> str:
        """The result of the job at `job` once it is removed ("done", "failed", "canceled", ...); raises
        TimeoutError after `timeout` seconds."""

    @abstractmethod
    def reset_failed_unit(self, name: str) -> None: ...

    @abstractmethod
    def set_unit_properties(self, name: str, properties: list[Property]) -> None:
        """SetUnitProperties(name, runtime=true, properties): changed until the next boot."""

    @abstractmethod
    def version(self) -> int:
        """The Manager's Version property as a number (version_number), -1 when unreadable."""

    @abstractmethod
    def close(self) -> None: ...


def start_unit(bus: SystemdBus, name: str, properties: list[Property], ignore_exists: bool = False) -> None:
    """Starts a transient unit and waits for its job, as runc's startUnit: a unit of that name that exists
    already is a leftover failed one, reset and the start tried once more, unless `ignore_exists` (a slice
    the caller only makes sure of); a job that ends other than "done" leaves the unit reset and fails."""
    for attempt in (1, 2):
        try:
            job = bus.start_transient_unit(name, properties)
            break
        except SystemdError as e:
            if not e.name.endswith(UNIT_EXISTS):
                raise SystemdError(f"start {name}: {e}", e.name) from e
            if ignore_exists:
                return
            if attempt == 2:
                raise SystemdError(f"start {name}: {e}", e.name) from e
            try:
                bus.reset_failed_unit(name)
            except SystemdError:
                pass  # not a failed unit: the retry reports it existing
    try:
        result = bus.wait_job(job, JOB_TIMEOUT)
    except TimeoutError as e:
        _reset_quietly(bus, name)
        raise SystemdError(f"start {name}: timed out after {JOB_TIMEOUT:g}s waiting for systemd to make it") from e
    if result != "done":
        _reset_quietly(bus, name)
        raise SystemdError(f"start {name}: systemd's job ended {result!r}")


def stop_unit(bus: SystemdBus, name: str) -> None:
    """Stops a unit and waits for the job, as runc's stopUnit: a unit that is gone already (NoSuchUnit) counts
    as stopped, and a failed one is reset so that systemd forgets it. Raises SystemdError only when the job
    does not end in time."""
    try:
        job = bus.stop_unit(name)
    except SystemdError:
        job = ""
    if job:
        try:
            bus.wait_job(job, JOB_TIMEOUT)
        except TimeoutError as e:
            raise SystemdError(f"stop {name}: timed out after {JOB_TIMEOUT:g}s waiting for systemd to remove it") from e
    _reset_quietly(bus, name)


def _reset_quietly(bus: SystemdBus, name: str) -> None:
    try:
        bus.reset_failed_unit(name)
    except SystemdError:
        pass


class DBusSystemd(SystemdBus):
    """The system bus's systemd, through jeepney (pure Python; README: why jeepney). The connection listens for
    the Manager's JobRemoved signals from the start, so a job that ends before its call returns is not missed;
    it is opened on the first call, so a manager that is made but never asks anything costs no connection."""

    def __init__(self, address: str = "SYSTEM") -> None:
        self._address = address
        self._conn: Any = None
        self._jobs: Any = None  # jeepney's filter queue (a deque) of JobRemoved signals
        self._version: int | None = None

    def _connect(self) -> Any:
        if self._conn is not None:
            return self._conn
        from collections import deque

        from jeepney import MatchRule, message_bus
        conn = open_bus(self._address)
        # the bus delivers only systemd's JobRemoved (it resolves the sender's name); a message names its sender
        # by its unique name (":1.0"), so jeepney's own filter, which compares names, must not ask for systemd's
        rule = MatchRule(type="signal", interface=MANAGER_INTERFACE, member="JobRemoved", path=SYSTEMD_PATH)
        try:
            self._jobs = conn.filter(rule, queue=deque()).queue  # the handle stays in the connection's filters
            reply(conn, message_bus.AddMatch(MatchRule(sender=SYSTEMD_BUS_NAME, **rule.header_fields,
                                                       type="signal")))
            reply(conn, manager_call("Subscribe", None, ()))
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _call(self, member: str, signature: str | None, *body: object) -> tuple:
        return reply(self._connect(), manager_call(member, signature, body))

    def start_transient_unit(self, name: str, properties: list[Property]) -> str:
        return str(self._call("StartTransientUnit", "ssa(sv)a(sa(sv))", name, "replace", properties, [])[0])

    def stop_unit(self, name: str) -> str:
        return str(self._call("StopUnit", "ss", name, "replace")[0])

    def wait_job(self, job: str, timeout: float) -> str:
        import time
        conn = self._connect()
        deadline = time.monotonic() + timeout
        while True:
            while self._jobs:
                _id, path, _unit, result = self._jobs.popleft().body
                if path == job:
                    return str(result)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job}")
            try:  # jeepney pops the signal it waited for off the queue and returns it: back it goes
                self._jobs.appendleft(conn.recv_until_filtered(self._jobs, timeout=left))
            except TimeoutError:
                raise TimeoutError(f"job {job}") from None

    def reset_failed_unit(self, name: str) -> None:
        self._call("ResetFailedUnit", "s", name)

    def set_unit_properties(self, name: str, properties: list[Property]) -> None:
        self._call("SetUnitProperties", "sba(sv)", name, True, properties)

    def version(self) -> int:
        if self._version is None:
            from jeepney import DBusAddress, Properties
            get = Properties(DBusAddress(SYSTEMD_PATH, SYSTEMD_BUS_NAME, MANAGER_INTERFACE)).get("Version")
            try:
                (value,) = reply(self._connect(), get)
                self._version = version_number(str(value[1]))
            except SystemdError:
                self._version = -1
        return self._version

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def open_bus(address: str = "SYSTEM", enable_fds: bool = False) -> Any:
    """A jeepney connection to the bus at `address` ("SYSTEM": the system bus); `enable_fds` lets replies carry
    file descriptors (logind's inhibitor locks, pynode_os/logind.py). Raises SystemdError when none answers."""
    from jeepney.io.blocking import open_dbus_connection
    try:
        return open_dbus_connection(bus=address, enable_fds=enable_fds)
    except (OSError, ValueError, KeyError) as e:
        raise SystemdError(f"connect to the D-Bus system bus: {e}") from e


def manager_call(member: str, signature: str | None, body: tuple) -> Any:
    """A call of systemd's Manager (org.freedesktop.systemd1.Manager)."""
    from jeepney import DBusAddress, new_method_call
    return new_method_call(DBusAddress(SYSTEMD_PATH, SYSTEMD_BUS_NAME, MANAGER_INTERFACE), member, signature, body)


def reply(conn: Any, message: Any) -> tuple:
    """The body of the reply to `message`; an error reply raises SystemdError with its D-Bus name."""
    from jeepney import DBusErrorResponse, MessageType
    answer = conn.send_and_get_reply(message, timeout=JOB_TIMEOUT)
    if answer.header.message_type == MessageType.error:
        error = DBusErrorResponse(answer)
        raise SystemdError(f"{error.name}: {' '.join(str(d) for d in error.data)}", error.name)
    return tuple(answer.body)
