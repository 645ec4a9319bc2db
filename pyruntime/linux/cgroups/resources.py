"""The OCI `linux.resources` object as typed values, validated once where the spec enters the runtime.

Every field is optional and `None` means "not given": `set()` writes only what was given, so the same
types carry a full config at create time and a partial one for `update`. Validation happens here so
that a bad config fails with the name of the offending field before any cgroup is touched; the drivers
trust these objects. Fields are read through pyruntime.fieldreader, as the rest of config.json is, so
the wording of errors is the same everywhere. `network` and `rdma` are not parsed: neither controller
is managed by this runtime. memory.kernel, useHierarchy and checkBeforeUpdate are parsed but not
applied, as in runc: kernel memory limits are deprecated and inert on current kernels, hierarchy is
always on, and v1 checks by itself.
"""
from __future__ import annotations

from pyruntime.fieldreader import Obj, SpecError, shown
from pyruntime.record import fields, record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
UINT16_MAX = (1 << 16) - 1


@record
class Memory:
    limit: int | None = None
    reservation: int | None = None
    swap: int | None = None
    kernel: int | None = None
    kernel_tcp: int | None = None
    swappiness: int | None = None
    disable_oom_killer: bool | None = None
    use_hierarchy: bool | None = None
    check_before_update: bool | None = None


@record
class Cpu:
    shares: int | None = None
    quota: int | None = None
    burst: int | None = None
    period: int | None = None
    realtime_runtime: int | None = None
    realtime_period: int | None = None
    cpus: str | None = None
    mems: str | None = None
    idle: int | None = None


@record
class Pids:
    limit: int | None = None


@record
class WeightDevice:
    major: int
    minor: int
    weight: int | None = None
    leaf_weight: int | None = None


@record
class ThrottleDevice:
    major: int
    minor: int
    rate: int


@record
class BlockIO:
    weight: int | None = None
    leaf_weight: int | None = None
    weight_device: tuple[WeightDevice, ...] | None = None
    throttle_read_bps_device: tuple[ThrottleDevice, ...] | None = None
    throttle_write_bps_device: tuple[ThrottleDevice, ...] | None = None
    throttle_read_iops_device: tuple[ThrottleDevice, ...] | None = None
    throttle_write_iops_device: tuple[ThrottleDevice, ...] | None = None


@record
class HugepageLimit:
    page_size: str
    limit: int


@record
class DeviceRule:
    allow: bool
    type: str = "a"
    major: int | None = None
    minor: int | None = None
    access: str = "rwm"

    def v1_entry(self) -> str:
        """The line devices.allow/devices.deny take, where an unset number is the `*` wildcard."""
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"


def _dev(type_: str, major: int | None, minor: int | None, access: str = "rwm") -> DeviceRule:
    return DeviceRule(allow=True, type=type_, major=major, minor=minor, access=access)


# runc's default allow-list (libcontainer/specconv AllowedDevices), for a runtime to put after its
# deny-all rule; cgroup v2 accepts exactly these rules without an eBPF device program.
DEFAULT_ALLOWED_DEVICES: tuple[DeviceRule, ...] = (
    _dev("c", None, None, "m"),
    _dev("b", None, None, "m"),
    _dev("c", 1, 3),     # /dev/null
    _dev("c", 1, 8),     # /dev/random
    _dev("c", 1, 7),     # /dev/full
    _dev("c", 5, 0),     # /dev/tty
    _dev("c", 1, 5),     # /dev/zero
    _dev("c", 1, 9),     # /dev/urandom
    _dev("c", 5, 1),     # /dev/console
    _dev("c", 136, None),  # /dev/pts/*
    _dev("c", 5, 2),     # /dev/ptmx
    _dev("c", 10, 200),  # /dev/net/tun
)


@record
class Resources:
    memory: Memory | None = None
    cpu: Cpu | None = None
    pids: Pids | None = None
    block_io: BlockIO | None = None
    hugepage_limits: tuple[HugepageLimit, ...] | None = None
    devices: tuple[DeviceRule, ...] | None = None
    unified: dict[str, str] | None = None

    @classmethod
    def from_spec(cls, obj: Any, where: str = "linux.resources") -> Resources:
        """Parses the OCI object; a SpecError names the exact field that is wrong."""
        if obj is None:
            return cls()
        o = Obj(obj, where)
        return cls(
            memory=_section(o, "memory", _memory),
            cpu=_section(o, "cpu", _cpu),
            pids=_section(o, "pids", _pids),
            block_io=_section(o, "blockIO", _block_io),
            hugepage_limits=_list(o, "hugepageLimits", _hugepage_limit),
            devices=_list(o, "devices", _device),
            unified=_unified(o),
        )

    def with_device_policy(self, extra: tuple[DeviceRule, ...] = ()) -> Resources:
        """The resources as applied: the spec's device rules (deny-all if none) followed by the devices
        every container needs and `extra`. `create` and `update` both apply this, so an update never
        drops the default devices (a bare deny-all would take /dev/null away)."""
        rules = (self.devices or (DeviceRule(False),)) + DEFAULT_ALLOWED_DEVICES + extra
        return Resources(self.memory, self.cpu, self.pids, self.block_io, self.hugepage_limits, rules, self.unified)

    def merge(self, update: Resources) -> Resources:
        """The resources after an `update`: every field the update gives replaces the current one.

        Lists (devices, hugepage limits, throttle lists) are replaced whole, and `unified` keys are
        merged, which is what `runc update` does.
        """
        return _merge(self, update)


def _merge(current: Any, update: Any) -> Any:
    if update is None:
        return current
    if current is None:
        return update
    if isinstance(update, dict):
        return {**current, **update}
    if hasattr(update, "__value_fields__") and type(update) is type(current):
        changes = {name: _merge(getattr(current, name), getattr(update, name)) for name in fields(update)}
        return replace(current, **changes)
    return update


def _section(o: Obj, key: str, parse: Callable[[Obj], Any]) -> Any:
    sub = o.obj(key)
    return None if sub is None else parse(sub)


def _list(o: Obj, key: str, parse: Callable[[Obj], Any]) -> tuple | None:
    """None when absent (an update that leaves the list alone), else every item parsed."""
    if o.raw.get(key) is None:
        return None
    return tuple(parse(item) for item in o.objs(key))


def _memory(o: Obj) -> Memory:
    return Memory(
        limit=o.int("limit", lo=INT64_MIN, hi=INT64_MAX),
        reservation=o.int("reservation", lo=INT64_MIN, hi=INT64_MAX),
        swap=o.int("swap", lo=INT64_MIN, hi=INT64_MAX),
        kernel=o.int("kernel", lo=INT64_MIN, hi=INT64_MAX),
        kernel_tcp=o.int("kernelTCP", lo=INT64_MIN, hi=INT64_MAX),
        swappiness=o.int("swappiness", lo=0, hi=100),
        disable_oom_killer=o.bool("disableOOMKiller", None),
        use_hierarchy=o.bool("useHierarchy", None),
        check_before_update=o.bool("checkBeforeUpdate", None),
    )


def _cpu(o: Obj) -> Cpu:
    cpu = Cpu(
        shares=o.int("shares", lo=0, hi=UINT64_MAX),
        quota=o.int("quota", lo=INT64_MIN, hi=INT64_MAX),
        burst=o.int("burst", lo=0, hi=UINT64_MAX),
        period=o.int("period", lo=0, hi=UINT64_MAX),
        realtime_runtime=o.int("realtimeRuntime", lo=INT64_MIN, hi=INT64_MAX),
        realtime_period=o.int("realtimePeriod", lo=0, hi=UINT64_MAX),
        cpus=o.cpu_list("cpus"),
        mems=o.cpu_list("mems"),
        idle=o.int("idle", lo=0, hi=1),
    )
    if cpu.burst is not None and cpu.quota is not None and cpu.quota > 0 and cpu.burst > cpu.quota:
        raise SpecError(f"{o.name('burst')}: must not be larger than quota {cpu.quota}, got {cpu.burst}")
    return cpu


def _pids(o: Obj) -> Pids:
    return Pids(limit=o.int("limit", lo=INT64_MIN, hi=INT64_MAX))


def _weight_device(o: Obj) -> WeightDevice:
    dev = WeightDevice(
        major=o.int("major", required=True, lo=INT64_MIN, hi=INT64_MAX),
        minor=o.int("minor", required=True, lo=INT64_MIN, hi=INT64_MAX),
        weight=o.int("weight", lo=0, hi=UINT16_MAX),
        leaf_weight=o.int("leafWeight", lo=0, hi=UINT16_MAX),
    )
    if dev.weight is None and dev.leaf_weight is None:
        raise SpecError(f"{o.path}: needs weight or leafWeight")
    return dev


def _throttle_device(o: Obj) -> ThrottleDevice:
    return ThrottleDevice(
        major=o.int("major", required=True, lo=INT64_MIN, hi=INT64_MAX),
        minor=o.int("minor", required=True, lo=INT64_MIN, hi=INT64_MAX),
        rate=o.int("rate", required=True, lo=0, hi=UINT64_MAX),
    )


def _block_io(o: Obj) -> BlockIO:
    return BlockIO(
        weight=o.int("weight", lo=0, hi=UINT16_MAX),
        leaf_weight=o.int("leafWeight", lo=0, hi=UINT16_MAX),
        weight_device=_list(o, "weightDevice", _weight_device),
        throttle_read_bps_device=_list(o, "throttleReadBpsDevice", _throttle_device),
        throttle_write_bps_device=_list(o, "throttleWriteBpsDevice", _throttle_device),
        throttle_read_iops_device=_list(o, "throttleReadIOPSDevice", _throttle_device),
        throttle_write_iops_device=_list(o, "throttleWriteIOPSDevice", _throttle_device),
    )


_PAGE_UNITS = ("KB", "MB", "GB", "TB", "PB")


def _hugepage_limit(o: Obj) -> HugepageLimit:
    """The page size is checked because it becomes part of a file name (hugetlb.<size>.limit_in_bytes)."""
    size = o.str("pageSize", required=True)
    if not (len(size) > 2 and size[:-2].isdigit() and size[-2:] in _PAGE_UNITS):
        raise SpecError(f"{o.name('pageSize')}: must look like 64KB, 2MB or 1GB, got {shown(size)}")
    return HugepageLimit(page_size=size, limit=o.int("limit", required=True, lo=0, hi=UINT64_MAX))


def _device(o: Obj) -> DeviceRule:
    given = o.str("access") or "rwm"
    # "a" is ignored, as runc ignores it (its own tests write "rwa"); other letters are likely typos
    access = given.replace("a", "")
    if not access or not set(access) <= set("rwm") or len(set(access)) != len(access):
        raise SpecError(f"{o.name('access')}: must be a combination of r, w and m, got {shown(given)}")
    return DeviceRule(
        allow=o.get("allow", bool, required=True),
        type=o.choice("type", ("a", "b", "c"), "device type", "a"),
        major=o.int("major", lo=INT64_MIN, hi=INT64_MAX),
        minor=o.int("minor", lo=INT64_MIN, hi=INT64_MAX),
        access=access,
    )


def _unified(o: Obj) -> dict[str, str] | None:
    """Keys become file names inside the container's cgroup, so anything that could leave it is refused."""
    if o.raw.get("unified") is None:
        return None
    values = o.str_map("unified")
    for key in values:
        if not key or "/" in key or "\0" in key or key in (".", "..") or "." not in key.strip("."):
            raise SpecError(f"{o.name('unified')}[{shown(key)}]: must be a cgroup file name like 'memory.high'")
    return values
