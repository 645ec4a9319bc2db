"""The cgroup v1 driver: one directory per mounted hierarchy, files mapped the way runc's fs driver does.

A hybrid host also has a cgroup2 mount; when it carries controllers that no v1 hierarchy has (this
runtime's CI host puts hugetlb there), the container gets a cgroup in it too, run by the v2 driver, so
that those limits are applied instead of silently lost. crun refuses that layout; runc and we do not.
"""
from __future__ import annotations

import errno
import os
import time
from _signal import SIGKILL  # not `signal`, which builds enums at import

from pyruntime.linux.cgroups.base import (
    FREEZE_TIMEOUT,
    FROZEN,
    THAWED,
    CgroupError,
    CgroupManager,
    keyed,
    makedirs,
    number,
    os_error,
    procs_in_tree,
    read,
    read_optional,
    rmdir_if_empty,
    rmdir_tree,
    write,
)
from pyruntime.linux.cgroups.v2 import V2Manager

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: commands that never set resources should not import them
    from pyruntime.linux.cgroups.resources import BlockIO, Cpu, DeviceRule, HugepageLimit, Memory, Resources

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class V1Manager(CgroupManager):
    """A container cgroup at `parts` below each hierarchy's base directory.

    `bases` maps a hierarchy key as /proc/<pid>/cgroup spells it ("cpu,cpuacct", "name=systemd") to the
    directory the path is relative to. `unified` is the hybrid host's cgroup2 part, if it is needed.
    """

    def __init__(self, bases: dict[str, str], parts: tuple[str, ...],
                 removable: tuple[tuple[str, ...], ...] = (), unified: V2Manager | None = None) -> None:
        self._parts = parts
        self._bases = dict(bases)
        self.dirs = {key: os.path.join(base, *parts) for key, base in bases.items()}
        self._by_controller = {c: key for key in bases for c in key.split(",")}
        self._removable = removable
        self.unified = unified

    def _dir(self, controller: str) -> str | None:
        key = self._by_controller.get(controller)
        return None if key is None else self.dirs[key]

    def _need(self, controller: str) -> str:
        path = self._dir(controller)
        if path is None:
            raise CgroupError(errno.ENOENT, f"cgroup: the {controller} controller is not mounted on this host")
        return path

    def create(self) -> bool:
        """Every cpuset on the way whose cpus or mems are empty takes its parent's, as runc's: an empty
        cpuset refuses tasks (ENOSPC), whoever made it (a pod's parent made with a bare mkdir)."""
        made = bool(self._parts)  # no parts: the hierarchy's root, never new
        for key, base in self._bases.items():
            current = base
            for part in self._parts:
                parent, current = current, os.path.join(current, part)
                try:
                    os.mkdir(current)
                except FileExistsError:
                    made = made and current != self.dirs[key]
                except FileNotFoundError:
                    makedirs(current)  # a concurrent destroy() removed an empty shared parent
                except OSError as exc:
                    raise os_error("mkdir", current, exc) from exc
                if "cpuset" in key.split(","):
                    _inherit_cpuset(parent, current)
        if self.unified is not None:
            made = self.unified.create() and made
        return made

    def add(self, pid: int) -> None:
        for path in self.dirs.values():
            write(os.path.join(path, "cgroup.procs"), str(pid))
        if self.unified is not None:
            self.unified.add(pid)

    def cgroup2_dir(self) -> str | None:
        return self.unified.path if self.unified is not None else None

    def enter_v1(self) -> None:
        for path in self.dirs.values():
            write(os.path.join(path, "tasks"), "0")

    def set(self, resources: Resources) -> None:
        if resources.unified:
            raise CgroupError(errno.EINVAL, "linux.resources.unified: invalid configuration: needs cgroup v2, "
                                            "this host uses cgroup v1")
        if resources.memory is not None:
            self._set_memory(resources.memory)
        if resources.cpu is not None:
            self._set_cpu(resources.cpu)
        if resources.pids is not None and resources.pids.limit is not None:
            limit = resources.pids.limit
            write(os.path.join(self._need("pids"), "pids.max"), "max" if limit < 0 else str(limit))
        if resources.block_io is not None:
            self._set_blkio(resources.block_io)
        if resources.hugepage_limits:
            self._set_hugetlb(resources.hugepage_limits)
        if resources.devices:
            self._set_devices(resources.devices)

    def _set_memory(self, m: Memory) -> None:
        """Orders the limit and memory+swap writes so that memsw >= limit holds after each one, which the
        kernel enforces; as in runc, an unlimited memory with unset swap makes swap unlimited too."""
        path = self._need("memory")
        limit_file = os.path.join(path, "memory.limit_in_bytes")
        swap_file = os.path.join(path, "memory.memsw.limit_in_bytes")
        has_swap = os.path.exists(swap_file)
        swap = m.swap if m.swap != 0 else None
        if m.limit == -1 and swap is None and has_swap:
            swap = -1
        if swap is not None and not has_swap:
            if swap != -1 and swap != m.limit:
                raise CgroupError(errno.EOPNOTSUPP, f"write {swap_file}: swap accounting is off in this kernel, "
                                                    "cannot apply linux.resources.memory.swap")
            swap = None
        if m.limit is not None and swap is not None:
            current = int(read(limit_file))
            if swap == -1 or current < swap:
                write(swap_file, str(swap))
                write(limit_file, str(m.limit))
            else:
                write(limit_file, str(m.limit))
                write(swap_file, str(swap))
        elif m.limit is not None:
            write(limit_file, str(m.limit))
        elif swap is not None:
            write(swap_file, str(swap))
        if m.reservation is not None:
            write(os.path.join(path, "memory.soft_limit_in_bytes"), str(m.reservation))
        if m.kernel_tcp is not None:
            write(os.path.join(path, "memory.kmem.tcp.limit_in_bytes"), str(m.kernel_tcp))
        if m.swappiness is not None:
            write(os.path.join(path, "memory.swappiness"), str(m.swappiness))
        if m.disable_oom_killer is not None:
            write(os.path.join(path, "memory.oom_control"), "1" if m.disable_oom_killer else "0")

    def _set_cpu(self, c: Cpu) -> None:
        if any(v is not None for v in (c.shares, c.quota, c.period, c.burst, c.realtime_period,
                                       c.realtime_runtime, c.idle)):
            path = self._need("cpu")
            if c.shares:
                write(os.path.join(path, "cpu.shares"), str(c.shares))
            self._set_cfs(path, c)
            if c.burst is not None:
                write(os.path.join(path, "cpu.cfs_burst_us"), str(c.burst))
            self._set_rt(path, c)
            if c.idle is not None:
                write(os.path.join(path, "cpu.idle"), str(c.idle))
        if c.cpus or c.mems:
            path = self._need("cpuset")
            if c.cpus:
                write(os.path.join(path, "cpuset.cpus"), c.cpus)
            if c.mems:
                write(os.path.join(path, "cpuset.mems"), c.mems)

    @staticmethod
    def _set_rt(path: str, c: Cpu) -> None:
        """A period below the current runtime is refused until the runtime is lowered, so then the
        runtime goes first, as runc does."""
        period, runtime = os.path.join(path, "cpu.rt_period_us"), os.path.join(path, "cpu.rt_runtime_us")
        if c.realtime_period is not None:
            try:
                write(period, str(c.realtime_period))
            except CgroupError:
                if c.realtime_runtime is None:
                    raise
                write(runtime, str(c.realtime_runtime))
                write(period, str(c.realtime_period))
                return
        if c.realtime_runtime is not None:
            write(runtime, str(c.realtime_runtime))

    @staticmethod
    def _set_cfs(path: str, c: Cpu) -> None:
        """A smaller period can be refused (EINVAL) until the new quota is in, so then it is written again
        after the quota, as runc does. A quota of 0 means "unset" there, and so here."""
        period_file = os.path.join(path, "cpu.cfs_period_us")
        retry_period = False
        if c.period:
            try:
                write(period_file, str(c.period))
            except CgroupError as exc:
                if exc.errno != errno.EINVAL or not c.quota:
                    raise
                retry_period = True
        if c.quota:
            write(os.path.join(path, "cpu.cfs_quota_us"), str(c.quota if c.quota > 0 else -1))
            if retry_period:
                write(period_file, str(c.period))

    def _set_blkio(self, b: BlockIO) -> None:
        path = self._need("blkio")

        def pick(*names: str) -> str:
            """Kernels without CFQ expose only the BFQ files."""
            for name in names:
                if os.path.exists(os.path.join(path, name)):
                    return os.path.join(path, name)
            return os.path.join(path, names[0])

        if b.weight:
            write(pick("blkio.weight", "blkio.bfq.weight"), str(b.weight))
        if b.leaf_weight:
            write(pick("blkio.leaf_weight"), str(b.leaf_weight))
        for dev in b.weight_device or ():
            if dev.weight is not None:
                write(pick("blkio.weight_device", "blkio.bfq.weight_device"), f"{dev.major}:{dev.minor} {dev.weight}")
            if dev.leaf_weight is not None:
                write(pick("blkio.leaf_weight_device"), f"{dev.major}:{dev.minor} {dev.leaf_weight}")
        for name, devices in (("read_bps_device", b.throttle_read_bps_device),
                              ("write_bps_device", b.throttle_write_bps_device),
                              ("read_iops_device", b.throttle_read_iops_device),
                              ("write_iops_device", b.throttle_write_iops_device)):
            for t in devices or ():
                write(os.path.join(path, f"blkio.throttle.{name}"), f"{t.major}:{t.minor} {t.rate}")

    def _set_hugetlb(self, limits: tuple[HugepageLimit, ...]) -> None:
        """Goes to the v1 hugetlb hierarchy, else to the hybrid cgroup2 part; skipped when the host has
        neither, as runc skips unmounted controllers (kubelet sends a 0 limit for every page size)."""
        path = self._dir("hugetlb")
        if path is None:
            if self.unified is not None:
                self.unified.set_hugetlb(limits)
            return
        for h in limits:
            write(os.path.join(path, f"hugetlb.{h.page_size}.limit_in_bytes"), str(h.limit))
            rsvd = os.path.join(path, f"hugetlb.{h.page_size}.rsvd.limit_in_bytes")
            if os.path.exists(rsvd):
                write(rsvd, str(h.limit))

    def _set_devices(self, rules: tuple[DeviceRule, ...]) -> None:
        """Starts from deny-all so that the list alone decides, then applies the rules in spec order.

        An `update` passes the container's whole device list again; rewriting it would deny every
        device to the running container for a moment, so a list the cgroup already has is left alone.
        """
        path = self._need("devices")
        if _devices_in_place(read(os.path.join(path, "devices.list")), rules):
            return
        write(os.path.join(path, "devices.deny"), "a")
        for rule in rules:
            write(os.path.join(path, "devices.allow" if rule.allow else "devices.deny"), rule.v1_entry())

    def freeze(self) -> None:
        """FREEZING can stick when a task is mid-fork or in D state; thawing and retrying gets past the
        first, and a timeout reports the second instead of hanging the CLI."""
        state_file = os.path.join(self._need("freezer"), "freezer.state")
        deadline = time.monotonic() + FREEZE_TIMEOUT
        attempt = 0
        while True:
            write(state_file, "FROZEN")
            if read(state_file).strip() == "FROZEN":
                return
            attempt += 1
            if time.monotonic() > deadline:
                write(state_file, "THAWED")
                raise CgroupError(errno.ETIMEDOUT, f"freeze {state_file}: tasks did not stop "
                                                   f"within {FREEZE_TIMEOUT:g}s")
            if attempt % 25 == 0:
                write(state_file, "THAWED")
            time.sleep(0.001)

    def thaw(self) -> None:
        write(os.path.join(self._need("freezer"), "freezer.state"), "THAWED")

    def state(self) -> str:
        path = self._dir("freezer")
        if path is None:
            return THAWED
        value = read_optional(os.path.join(path, "freezer.state"))
        return FROZEN if value is not None and value.strip() == "FROZEN" else THAWED

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            found.update(procs_in_tree(path))
        if self.unified is not None:
            found.update(self.unified.pids())
        return sorted(found)

    def kill_all(self, sig: int = SIGKILL) -> None:
        """A v1-frozen task acts on SIGKILL only once thawed, so SIGKILL thaws even a cgroup that was
        frozen before."""
        if not self.exists():
            return
        freezer = self._dir("freezer")
        self._signal_frozen(sig, freezer is not None and os.path.isdir(freezer), sig == SIGKILL)

    def stats(self) -> dict:
        data: dict = {}
        cpuacct, cpu = self._dir("cpuacct"), self._dir("cpu")
        if cpuacct is not None or cpu is not None:
            data["cpu"] = _cpu_stats(cpuacct, cpu)
        memory = self._dir("memory")
        if memory is not None:
            data["memory"] = _memory_stats(memory)
        pids = self._dir("pids")
        if pids is not None:
            data["pids"] = {"current": number(read_optional(os.path.join(pids, "pids.current"))),
                            "limit": number(read_optional(os.path.join(pids, "pids.max")))}
        return data

    def oom_kill_count(self) -> int:
        memory = self._dir("memory")
        if memory is None:
            return 0
        return keyed(read_optional(os.path.join(memory, "memory.oom_control"))).get("oom_kill", 0)

    def destroy(self) -> None:
        """Tries every hierarchy even after a failure, so one busy controller does not strand the rest."""
        first_error: CgroupError | None = None
        for key, path in self.dirs.items():
            try:
                rmdir_tree(path)
                for parent in self._removable:
                    if not rmdir_if_empty(os.path.join(self._bases[key], *parent)):
                        break
            except CgroupError as exc:
                first_error = first_error or exc
        if self.unified is not None:
            try:
                self.unified.destroy()
            except CgroupError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def exists(self) -> bool:
        return any(os.path.isdir(p) for p in self.dirs.values()) or (
            self.unified is not None and self.unified.exists())

    def read(self, controller: str, name: str) -> str:
        """One control file in a controller's directory, for values stats() omits."""
        return read(os.path.join(self._need(controller), name))


def _exceptions(entries: list[str]) -> dict[str, set[str]]:
    """devices.list lines by device, with access merged as the kernel merges repeated rules."""
    out: dict[str, set[str]] = {}
    for entry in entries:
        parts = entry.split()
        if len(parts) == 3:
            out.setdefault(f"{parts[0]} {parts[1]}", set()).update(parts[2])
    return out


def _devices_in_place(current: str, rules: tuple[DeviceRule, ...]) -> bool:
    """True when the cgroup's allow-list is already what `rules` (deny-all first) would leave: the rules
    replayed as the kernel applies them to a default-deny list, where an allow adds its access to the device's
    entry and a deny takes its access away from an entry of exactly that device (denying a device that no
    entry allows, such as runc's usual `c 1:11` for /dev/kmsg, changes nothing). A list with an allow-all
    after the first rule can't be replayed this way and is rewritten."""
    if not rules or rules[0].allow or rules[0].v1_entry() != "a *:* rwm":
        return False
    allowed: dict[str, set[str]] = {}
    for rule in rules[1:]:
        if rule.type == "a":
            if rule.allow:
                return False
            allowed = {}
            continue
        key = " ".join(rule.v1_entry().split()[:2])
        if rule.allow:
            allowed.setdefault(key, set()).update(rule.access)
        elif key in allowed:
            allowed[key] -= set(rule.access)
            if not allowed[key]:
                del allowed[key]
    return _exceptions(current.splitlines()) == allowed


def _inherit_cpuset(parent: str, child: str) -> None:
    """A new v1 cpuset starts with empty cpus and mems and refuses tasks until they are filled, so an
    empty one takes its parent's, as runc does."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        child_file = os.path.join(child, name)
        if (read_optional(child_file) or "").strip():
            continue
        value = (read_optional(os.path.join(parent, name)) or "").strip()
        if value:
            write(child_file, value)


def _cpu_stats(cpuacct: str | None, cpu: str | None) -> dict:
    usage: dict = {}
    if cpuacct is not None:
        usage["total"] = number(read_optional(os.path.join(cpuacct, "cpuacct.usage")))
        percpu = read_optional(os.path.join(cpuacct, "cpuacct.usage_percpu"))
        usage["percpu"] = [int(v) for v in (percpu or "").split()]
        user = read_optional(os.path.join(cpuacct, "cpuacct.usage_user"))
        if user is not None:
            usage["kernel"] = number(read_optional(os.path.join(cpuacct, "cpuacct.usage_sys")))
            usage["user"] = number(user)
        else:
            ticks = keyed(read_optional(os.path.join(cpuacct, "cpuacct.stat")))
            usage["kernel"] = ticks.get("system", 0) * 1_000_000_000 // _CLK_TCK
            usage["user"] = ticks.get("user", 0) * 1_000_000_000 // _CLK_TCK
    out: dict = {"usage": usage}
    if cpu is not None:
        stat = keyed(read_optional(os.path.join(cpu, "cpu.stat")))
        out["throttling"] = {"periods": stat.get("nr_periods", 0), "throttledPeriods": stat.get("nr_throttled", 0),
                             "throttledTime": stat.get("throttled_time", 0)}
    return out


def _memory_entry(path: str, prefix: str) -> dict:
    def get(name: str) -> int:
        return number(read_optional(os.path.join(path, f"{prefix}.{name}")))

    return {"usage": get("usage_in_bytes"), "limit": get("limit_in_bytes"), "max": get("max_usage_in_bytes"),
            "failcnt": get("failcnt")}


def _memory_stats(path: str) -> dict:
    raw = keyed(read_optional(os.path.join(path, "memory.stat")))
    out = {"cache": raw.get("cache", 0), "usage": _memory_entry(path, "memory"), "raw": raw}
    if os.path.exists(os.path.join(path, "memory.memsw.usage_in_bytes")):
        out["swap"] = _memory_entry(path, "memory.memsw")
    if os.path.exists(os.path.join(path, "memory.kmem.usage_in_bytes")):
        out["kernel"] = _memory_entry(path, "memory.kmem")
    return out
