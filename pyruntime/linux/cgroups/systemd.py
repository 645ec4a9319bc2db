"""The systemd cgroup driver (`--systemd-cgroup`): a container is a transient scope that systemd makes, as with
runc's libcontainer/cgroups/systemd, on cgroup v2 only.

A cgroupsPath is "slice:prefix:name" ("kubepods-besteffort-pod12.slice:cri-containerd:ID" as containerd and
pyruntime-cri pass it); the container is the scope "<prefix>-<name>.scope" in that slice, at
/sys/fs/cgroup/<the slice expanded>/<scope>. An empty path is the scope "pyruntime-<id>.scope" in
system.slice (runc's "runc-<id>.scope"). systemd makes the slice and its parents itself, as it does for any
unit's Slice= of the dashed form, so nothing is made for them here.

systemd makes a scope only around a process: StartTransientUnit with PIDs, Delegate=yes, Slice= and the
resource properties systemd knows (MemoryMax, CPUWeight, CPUQuotaPerSecUSec, TasksMax, AllowedCPUs...: runc
sends them in a SetUnitProperties after the start; in the start itself the scope never exists without them), so
`create` forks the container's first process plainly (needs_pid) and add() makes the scope around it, then
writes every resource to the cgroup files as the v2 driver does (runc's fs2 after its systemd properties): the
files hold what systemd would not say, and the device program is attached as with cgroupfs. `delete` stops the
unit and waits for systemd's job. The rest (freeze, stats, kill) is the v2 driver's on the scope's directory.

runc also turns device rules into DeviceAllow= properties and annotations "org.systemd.property.*" into unit
properties; neither is done here: the device program the v2 driver attaches enforces the rules either way, and
those annotations are refused (oci/validate.py) rather than dropped.
"""
from __future__ import annotations

import errno
import os
from _signal import SIGKILL  # not `signal`, which builds enums at import

from pynode_os.cgroups import CGROUP_ROOT
from pynode_os.systemd import USEC_INFINITY, SystemdBus, SystemdError, booted, expand_slice, start_unit, stop_unit
from pyruntime.errors import FailedPreconditionError
from pyruntime.linux.cgroups.base import CgroupError, CgroupManager
from pyruntime.linux.cgroups.v2 import V2Manager, shares_to_weight, swap_to_v2

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from pynode_os.systemd import Property
    from pyruntime.linux.cgroups.resources import Cpu, Resources
    from pyruntime.linux.syscalls import Syscalls

DEFAULT_SLICE = "system.slice"
DEFAULT_PREFIX = "pyruntime"
DEFAULT_CPU_PERIOD = 100000  # the kernel's cfs period, which systemd assumes when only a quota is given
CPU_QUOTA_PERIOD_VERSION = 242  # systemd knows CPUQuotaPeriodUSec since 242
ALLOWED_CPUS_VERSION = 244  # AllowedCPUs and AllowedMemoryNodes since 244
CPU_IDLE_VERSION = 252  # CPUWeight=0 sets cpu.idle since 252
MEMORY_PROPERTIES = {"memory.high": "MemoryHigh", "memory.low": "MemoryLow", "memory.min": "MemoryMin",
                     "memory.max": "MemoryMax", "memory.swap.max": "MemorySwapMax"}


def parse_path(cgroups_path: str, container_id: str) -> tuple[str, str, str]:
    """A cgroupsPath as (slice, prefix, name); raises ValueError naming the field for one the driver refuses."""
    if not cgroups_path:
        return DEFAULT_SLICE, DEFAULT_PREFIX, container_id
    parts = cgroups_path.split(":")
    if len(parts) != 3:
        raise ValueError(f'linux.cgroupsPath: expected cgroupsPath to be of format "slice:prefix:name" for systemd '
                         f"cgroups, got {cgroups_path!r} instead")
    slice_name, prefix, name = parts
    if slice_name:
        try:
            expand_slice(slice_name)
        except ValueError as e:
            raise ValueError(f"linux.cgroupsPath: {cgroups_path!r}: {e}") from e
    if not name or "/" in prefix or "/" in name or name in (".", ".."):
        raise ValueError(f"linux.cgroupsPath: {cgroups_path!r}: the prefix and name must make a unit name "
                         "(no '/', a name given)")
    if name.endswith(".slice"):
        raise ValueError(f"linux.cgroupsPath: {cgroups_path!r}: a container in a slice unit is not supported "
                         "(systemd gives a slice no processes); name a scope")
    return slice_name or DEFAULT_SLICE, prefix, name


def scope_path(parent: str, prefix: str, name: str) -> str:
    """The cgroupsPath of a container `name` in the pod slice `parent`, which the kubelet gives as the slice's
    name or its expanded path (/kubepods.slice/.../kubepods-podX.slice: the last is the slice), as containerd
    builds it; no parent is system.slice."""
    return f"{os.path.basename(parent.rstrip('/')) or DEFAULT_SLICE}:{prefix}:{name}"


def unit_name(prefix: str, name: str) -> str:
    return f"{prefix}-{name}.scope"


def require_systemd(cgroup_version: str) -> None:
    """Refuses the driver on a host it cannot work on: one whose init is not systemd, or a cgroup v1 (or hybrid)
    one, which this driver does not handle (runc's v1 systemd driver is legacy)."""
    if not booted():
        raise FailedPreconditionError("--systemd-cgroup: systemd is not running on this host (no /run/systemd/system); "
                                      "use the cgroupfs driver")
    if cgroup_version != "v2":
        raise FailedPreconditionError("--systemd-cgroup: the systemd cgroup driver needs a cgroup v2 (unified) host; "
                                      "this one uses cgroup v1 (legacy or hybrid): use the cgroupfs driver")


def range_to_bits(text: str) -> bytes:
    """A cpuset list ("0-2,7") as the byte mask AllowedCPUs/AllowedMemoryNodes take: runc's RangeToBits, the
    lowest CPUs in the first byte."""
    mask = 0
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        start, sep, end = item.partition("-")
        if not start.strip().isdigit() or (sep and not end.strip().isdigit()):
            raise ValueError(f"invalid cpuset range {item!r}")
        first, last = int(start), int(end) if sep else int(start)
        if first > last:
            raise ValueError(f"invalid range: {item}")
        for bit in range(first, last + 1):
            mask |= 1 << bit
    if not mask:
        raise ValueError("empty value")
    return mask.to_bytes((mask.bit_length() + 7) // 8, "little")


def _uint(value: int) -> int:
    """An OCI int64 as systemd's uint64: negative is unlimited (runc's uint64(-1))."""
    return USEC_INFINITY if value < 0 else value


def cpu_quota_properties(quota: int, period: int, version: int) -> tuple[list[Property], int]:
    """runc's addCPUQuota: CPUQuotaPeriodUSec (systemd 242+) and CPUQuotaPerSecUSec, and the quota rounded
    as systemd rounds it (to 1% of a CPU: 10ms per second), which is what the cgroup file then gets too, so
    that systemd and the file agree."""
    props: list[Property] = []
    if period and version >= CPU_QUOTA_PERIOD_VERSION:
        props.append(("CPUQuotaPeriodUSec", ("t", period)))
    if quota or period:
        per_sec = USEC_INFINITY
        if quota > 0:
            period = period or DEFAULT_CPU_PERIOD
            per_sec = quota * 1000000 // period
            if per_sec % 10000:
                per_sec = (per_sec // 10000 + 1) * 10000
                quota = per_sec * period // 1000000
        props.append(("CPUQuotaPerSecUSec", ("t", per_sec)))
    return props, quota


def _unified_properties(unified: dict[str, str], version: int) -> list[Property]:
    """runc's unifiedResToSystemdProps: the keys systemd has a property for; the rest only reach the files."""
    props: list[Property] = []
    idle = unified.get("cpu.idle", "").strip() == "1" and version >= CPU_IDLE_VERSION
    for key in sorted(unified):
        value = unified[key].strip()
        where = f"linux.resources.unified.{key}"
        try:
            if key == "cpu.idle" and idle:
                props.append(("CPUWeight", ("t", 0)))
            elif key == "cpu.max":
                fields = value.split()
                if not 1 <= len(fields) <= 2:
                    raise ValueError(f"invalid value {value!r}")
                quota = 0 if fields[0] == "max" else int(fields[0])
                period = int(fields[1]) if len(fields) == 2 else DEFAULT_CPU_PERIOD
                props += cpu_quota_properties(quota, period, version)[0]
            elif key == "cpu.weight" and not idle:
                props.append(("CPUWeight", ("t", int(value))))
            elif key in ("cpuset.cpus", "cpuset.mems") and version >= ALLOWED_CPUS_VERSION:
                name = "AllowedCPUs" if key == "cpuset.cpus" else "AllowedMemoryNodes"
                props.append((name, ("ay", range_to_bits(value))))
            elif key in MEMORY_PROPERTIES:
                props.append((MEMORY_PROPERTIES[key], ("t", USEC_INFINITY if value == "max" else int(value))))
            elif key == "pids.max":
                props.append(("TasksMax", ("t", USEC_INFINITY if value == "max" else int(value))))
        except ValueError as e:
            raise CgroupError(errno.EINVAL, f"{where}: {e}") from e
    return props


def resource_properties(resources: Resources, version: int) -> tuple[list[Property], Resources]:
    """The unit properties runc's genV2ResourcesProperties sets for `resources`, and the resources to write to
    the files afterwards (the cpu quota rounded as systemd rounds it)."""
    from pyruntime.record import replace
    props: list[Property] = []
    m = resources.memory
    if m is not None:
        if m.limit:
            props.append(("MemoryMax", ("t", _uint(m.limit))))
        if m.reservation:
            props.append(("MemoryLow", ("t", _uint(m.reservation))))
        if m.limit is not None:
            swap = -1 if m.limit == -1 and not m.swap else (swap_to_v2(m.swap, m.limit) if m.swap else None)
            if swap:
                props.append(("MemorySwapMax", ("t", _uint(swap))))
    c = resources.cpu
    if c is not None:
        props += _cpu_properties(c, version)
        quota_props, quota = cpu_quota_properties(c.quota or 0, c.period or 0, version)
        props += quota_props
        if c.quota and quota != c.quota:
            resources = replace(resources, cpu=replace(c, quota=quota))
    if resources.pids is not None and resources.pids.limit is not None and (resources.pids.limit > 0
                                                                             or resources.pids.limit == -1):
        props.append(("TasksMax", ("t", _uint(resources.pids.limit))))
    if c is not None and version >= ALLOWED_CPUS_VERSION:
        for name, value, key in (("AllowedCPUs", c.cpus, "cpus"), ("AllowedMemoryNodes", c.mems, "mems")):
            if value:
                try:
                    props.append((name, ("ay", range_to_bits(value))))
                except ValueError as e:
                    raise CgroupError(errno.EINVAL, f"linux.resources.cpu.{key}: {value!r}: {e}") from e
    if resources.unified:
        props += _unified_properties(resources.unified, version)
    return props, resources


def _cpu_properties(c: Cpu, version: int) -> list[Property]:
    """cpu.idle=1 is CPUWeight=0 to systemd 252+, and wins over a weight, as in runc."""
    if c.idle == 1 and version >= CPU_IDLE_VERSION:
        return [("CPUWeight", ("t", 0))]
    if c.shares:
        return [("CPUWeight", ("t", shares_to_weight(c.shares)))]
    return []


def unit_properties(slice_name: str, name: str, pid: int, resources: Resources, version: int,
                    ) -> tuple[list[Property], Resources]:
    """What runc's Apply starts a container's scope with: where it goes, that it is delegated, its first
    process, accounting on (as the cgroupfs driver's controllers are), no default dependencies (a container
    must not be stopped with the basic target at shutdown ordering), and the resources."""
    props: list[Property] = [
        ("Description", ("s", f"pyruntime container {name}")),
        ("Slice", ("s", slice_name)),
        ("Delegate", ("b", True)),
        ("PIDs", ("au", [pid])),
        ("MemoryAccounting", ("b", True)),
        ("CPUAccounting", ("b", True)),
        ("IOAccounting", ("b", True)),
        ("TasksAccounting", ("b", True)),
        ("DefaultDependencies", ("b", False)),
    ]
    resource_props, resources = resource_properties(resources, version)
    return props + resource_props, resources


class SystemdManager(CgroupManager):
    """A container's scope. `bus`: systemd over D-Bus, connected for each call that needs it (a DBusSystemd)
    unless the caller brings one (a test's fake). `kernel`: as the v2 driver's, for the device program."""

    def __init__(self, cgroups_path: str, container_id: str, kernel: Syscalls | None = None,
                 bus: SystemdBus | None = None, mountpoint: str = CGROUP_ROOT) -> None:
        self.slice, prefix, self.name = parse_path(cgroups_path, container_id)
        self.unit = unit_name(prefix, self.name)
        self.path = mountpoint.rstrip("/") + expand_slice(self.slice).rstrip("/") + "/" + self.unit
        self._fs = V2Manager(mountpoint, self.path, (), (), kernel)
        self._bus = bus
        self._pending: Resources | None = None  # set() before the scope exists: applied when add() makes it

    def _talk(self, call: Callable[[SystemdBus], Resources | None]) -> Resources | None:
        """`call` with the bus; a connection made here is closed after it, so that a long-running caller
        (pyruntime-cri's runtime) keeps no connection per container."""
        from pynode_os.systemd import DBusSystemd
        bus = self._bus or DBusSystemd()
        try:
            return call(bus)
        except SystemdError as e:
            raise CgroupError(errno.EIO, f"systemd unit {self.unit}: {e}") from e
        finally:
            if bus is not self._bus:
                bus.close()

    def needs_pid(self) -> bool:
        """True until the scope exists: systemd makes it only around a first process, which the caller forks
        outside any cgroup and hands to add()."""
        return not self.exists()

    def create(self) -> bool:
        return not self.exists()

    def add(self, pid: int) -> None:
        """Makes the scope around `pid` (the first process) and applies the resources set() was given; into a
        scope that exists, moves `pid` as the v2 driver does."""
        if self.exists():
            self._fs.add(pid)
            return
        from pyruntime.linux.cgroups.resources import Resources

        def start(bus: SystemdBus) -> Resources:
            props, files = unit_properties(self.slice, self.name, pid, self._pending or Resources(), bus.version())
            start_unit(bus, self.unit, props)
            return files
        files = self._talk(start)
        self._pending = None
        # the scope's directory is systemd's; this enables the controllers down the slices to it, as runc's
        # fs2.CreateCgroupPath after the start
        self._fs.create()
        if files is not None:
            self._fs.set(files)

    def cgroup2_dir(self) -> str | None:
        return self.path

    def enter_v1(self) -> None:
        pass

    def set(self, resources: Resources) -> None:
        """Before the scope exists the resources wait for add(); after, they go to systemd (SetUnitProperties)
        and then to the files, as runc's Set."""
        if not self.exists():
            self._pending = resources if self._pending is None else self._pending.merge(resources)
            return

        def update(bus: SystemdBus) -> Resources:
            props, files = resource_properties(resources, bus.version())
            if props:
                bus.set_unit_properties(self.unit, props)
            return files
        files = self._talk(update)
        if files is not None:
            self._fs.set(files)

    def freeze(self) -> None:
        self._fs.freeze()

    def thaw(self) -> None:
        self._fs.thaw()

    def state(self) -> str:
        return self._fs.state()

    def pids(self) -> list[int]:
        return self._fs.pids()

    def kill_all(self, sig: int = SIGKILL) -> None:
        self._fs.kill_all(sig)

    def stats(self) -> dict:
        return self._fs.stats()

    def oom_kill_count(self) -> int:
        return self._fs.oom_kill_count()

    def destroy(self) -> None:
        """Stops the unit, waiting for systemd's job (a scope whose processes are all gone is stopped by
        systemd already, which counts as done), then removes what systemd leaves (sub-cgroups the container
        made, which systemd before 240 keeps)."""
        self._talk(lambda bus: stop_unit(bus, self.unit))
        self._fs.destroy()

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def read(self, name: str) -> str:
        return self._fs.read(name)
