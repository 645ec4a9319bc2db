"""The OCI `linux.resources` object as typed values, validated once where the spec enters the runtime.

Every field is optional and `None` means "not given": `set()` writes only what was given, so the same
types carry a full config at create time and a partial one for `update`. Validation happens here so
that a bad config fails with the name of the offending field before any cgroup is touched; the drivers
trust these objects. `network` and `rdma` are not parsed: neither controller is managed by this runtime.
memory.kernel, useHierarchy and checkBeforeUpdate are parsed but not applied, as in runc: kernel memory
limits are deprecated and inert on current kernels, hierarchy is always on, and v1 checks by itself.
"""
from __future__ import annotations

from typing import Any

from pyruntime.record import fields, record, replace

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
    def from_spec(cls, obj: Any, where: str = "linux.resources") -> "Resources":
        """Parses the OCI object; a `ValueError` names the exact field that is wrong."""
        if obj is None:
            return cls()
        _expect_object(obj, where)
        return cls(
            memory=_field(obj, "memory", where, _memory),
            cpu=_field(obj, "cpu", where, _cpu),
            pids=_field(obj, "pids", where, _pids),
            block_io=_field(obj, "blockIO", where, _block_io),
            hugepage_limits=_field(obj, "hugepageLimits", where, _hugepage_limits),
            devices=_field(obj, "devices", where, _devices),
            unified=_field(obj, "unified", where, _unified),
        )

    def merge(self, update: "Resources") -> "Resources":
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


def _fail(where: str, what: str, value: Any) -> ValueError:
    return ValueError(f"{where}: {what}, got {value!r}")


def _expect_object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, "must be an object", value)
    return value


def _int(value: Any, where: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise _fail(where, "must be an integer", value)
    if not lo <= value <= hi:
        raise _fail(where, f"must be between {lo} and {hi}", value)
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "must be a boolean", value)
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, "must be a string", value)
    return value


def _field(obj: dict, key: str, where: str, parse: Any, *args: Any) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    return parse(value, f"{where}.{key}", *args)


def _required(obj: dict, key: str, where: str, parse: Any, *args: Any) -> Any:
    if obj.get(key) is None:
        raise ValueError(f"{where}.{key}: is required")
    return parse(obj[key], f"{where}.{key}", *args)


def _memory(obj: Any, where: str) -> Memory:
    _expect_object(obj, where)
    return Memory(
        limit=_field(obj, "limit", where, _int),
        reservation=_field(obj, "reservation", where, _int),
        swap=_field(obj, "swap", where, _int),
        kernel=_field(obj, "kernel", where, _int),
        kernel_tcp=_field(obj, "kernelTCP", where, _int),
        swappiness=_field(obj, "swappiness", where, _int, 0, 100),
        disable_oom_killer=_field(obj, "disableOOMKiller", where, _bool),
        use_hierarchy=_field(obj, "useHierarchy", where, _bool),
        check_before_update=_field(obj, "checkBeforeUpdate", where, _bool),
    )


def _cpu_list(value: Any, where: str) -> str:
    """A cpuset list such as `0-3,7`; checked here because the kernel's EINVAL would not say which field."""
    text = _str(value, where).strip()
    if text == "":
        return text
    for part in text.split(","):
        bounds = part.split("-")
        if len(bounds) > 2 or not all(b.strip().isdigit() for b in bounds):
            raise _fail(where, "must be a list like '0-3,7'", value)
        if len(bounds) == 2 and int(bounds[0]) > int(bounds[1]):
            raise _fail(where, "has a range whose start is above its end", value)
    return text


def _cpu(obj: Any, where: str) -> Cpu:
    _expect_object(obj, where)
    cpu = Cpu(
        shares=_field(obj, "shares", where, _int, 0, UINT64_MAX),
        quota=_field(obj, "quota", where, _int),
        burst=_field(obj, "burst", where, _int, 0, UINT64_MAX),
        period=_field(obj, "period", where, _int, 0, UINT64_MAX),
        realtime_runtime=_field(obj, "realtimeRuntime", where, _int),
        realtime_period=_field(obj, "realtimePeriod", where, _int, 0, UINT64_MAX),
        cpus=_field(obj, "cpus", where, _cpu_list),
        mems=_field(obj, "mems", where, _cpu_list),
        idle=_field(obj, "idle", where, _int, 0, 1),
    )
    if cpu.burst is not None and cpu.quota is not None and cpu.quota > 0 and cpu.burst > cpu.quota:
        raise _fail(f"{where}.burst", f"must not be larger than quota {cpu.quota}", cpu.burst)
    return cpu


def _pids(obj: Any, where: str) -> Pids:
    _expect_object(obj, where)
    return Pids(limit=_field(obj, "limit", where, _int))


def _list(value: Any, where: str, parse: Any) -> tuple:
    if not isinstance(value, list):
        raise _fail(where, "must be an array", value)
    return tuple(parse(item, f"{where}[{i}]") for i, item in enumerate(value))


def _weight_device(obj: Any, where: str) -> WeightDevice:
    _expect_object(obj, where)
    dev = WeightDevice(
        major=_required(obj, "major", where, _int),
        minor=_required(obj, "minor", where, _int),
        weight=_field(obj, "weight", where, _int, 0, UINT16_MAX),
        leaf_weight=_field(obj, "leafWeight", where, _int, 0, UINT16_MAX),
    )
    if dev.weight is None and dev.leaf_weight is None:
        raise ValueError(f"{where}: needs weight or leafWeight")
    return dev


def _throttle_device(obj: Any, where: str) -> ThrottleDevice:
    _expect_object(obj, where)
    return ThrottleDevice(
        major=_required(obj, "major", where, _int),
        minor=_required(obj, "minor", where, _int),
        rate=_required(obj, "rate", where, _int, 0, UINT64_MAX),
    )


def _block_io(obj: Any, where: str) -> BlockIO:
    _expect_object(obj, where)

    def throttle(value: Any, at: str) -> tuple[ThrottleDevice, ...]:
        return _list(value, at, _throttle_device)

    return BlockIO(
        weight=_field(obj, "weight", where, _int, 0, UINT16_MAX),
        leaf_weight=_field(obj, "leafWeight", where, _int, 0, UINT16_MAX),
        weight_device=_field(obj, "weightDevice", where, lambda v, at: _list(v, at, _weight_device)),
        throttle_read_bps_device=_field(obj, "throttleReadBpsDevice", where, throttle),
        throttle_write_bps_device=_field(obj, "throttleWriteBpsDevice", where, throttle),
        throttle_read_iops_device=_field(obj, "throttleReadIOPSDevice", where, throttle),
        throttle_write_iops_device=_field(obj, "throttleWriteIOPSDevice", where, throttle),
    )


_PAGE_UNITS = ("KB", "MB", "GB", "TB", "PB")


def _page_size(value: Any, where: str) -> str:
    """Checked because the size becomes part of a file name (hugetlb.<size>.limit_in_bytes)."""
    text = _str(value, where)
    if not (len(text) > 2 and text[:-2].isdigit() and text[-2:] in _PAGE_UNITS):
        raise _fail(where, "must look like 64KB, 2MB or 1GB", value)
    return text


def _hugepage_limit(obj: Any, where: str) -> HugepageLimit:
    _expect_object(obj, where)
    return HugepageLimit(
        page_size=_required(obj, "pageSize", where, _page_size),
        limit=_required(obj, "limit", where, _int, 0, UINT64_MAX),
    )


def _hugepage_limits(value: Any, where: str) -> tuple[HugepageLimit, ...]:
    return _list(value, where, _hugepage_limit)


def _device(obj: Any, where: str) -> DeviceRule:
    _expect_object(obj, where)
    type_ = _field(obj, "type", where, _str) or "a"
    if type_ not in ("a", "b", "c"):
        raise _fail(f"{where}.type", "must be one of a, b, c", type_)
    access = _field(obj, "access", where, _str)
    if access is None or access == "":
        access = "rwm"
    if not set(access) <= set("rwm") or len(set(access)) != len(access):
        raise _fail(f"{where}.access", "must be a combination of r, w and m", access)
    return DeviceRule(
        allow=_required(obj, "allow", where, _bool),
        type=type_,
        major=_field(obj, "major", where, _int),
        minor=_field(obj, "minor", where, _int),
        access=access,
    )


def _devices(value: Any, where: str) -> tuple[DeviceRule, ...]:
    return _list(value, where, _device)


def _unified(obj: Any, where: str) -> dict[str, str]:
    """Keys become file names inside the container's cgroup, so anything that could leave it is refused."""
    _expect_object(obj, where)
    out = {}
    for key, value in obj.items():
        at = f"{where}.{key}"
        if not isinstance(key, str) or not key or "/" in key or "\0" in key or key in (".", "..") \
                or "." not in key.strip("."):
            raise _fail(where, "keys must be cgroup file names like 'memory.high'", key)
        out[key] = _str(value, at)
    return out

