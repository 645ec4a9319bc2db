"""The cgroup v2 (unified hierarchy) driver, mapping OCI resources to files the way runc's fs2 does.

memory.swappiness and memory.disableOOMKiller have no v2 file and are ignored, as runc ignores them;
realtime CPU settings have none either and are refused.

Device rules are enforced by an eBPF program attached to the cgroup (devicefilter.py builds it), as
runc's fs2 does: v2 has no devices controller, and without the program a root container with CAP_MKNOD
can make a node for the host's disk and read it. An update attaches its program before it detaches the
one before, so the container is never without one; for that moment both apply, and a device passes only
if both allow it. A kernel that refuses the program fails the call: the container never runs without it.
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
    number,
    os_error,
    procs_in_tree,
    read,
    read_optional,
    rmdir_if_empty,
    rmdir_tree,
    write,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: commands that never set resources should not import them
    from pyruntime.linux.cgroups.resources import BlockIO, Cpu, DeviceRule, HugepageLimit, Memory, Resources
    from pyruntime.linux.syscalls import Syscalls


def shares_to_weight(shares: int) -> int:
    """cpu.shares (2..262144, default 1024) to cpu.weight (1..10000, default 100), runc's linear formula."""
    if shares == 0:
        return 0
    shares = min(max(shares, 2), 262144)
    return 1 + ((shares - 2) * 9999) // 262142


def blkio_to_io_weight(weight: int) -> int:
    """blkio.weight (10..1000) to io.weight (1..10000), as runc converts it."""
    if weight == 0:
        return 0
    return 1 + (max(weight, 10) - 10) * 9999 // 990


def swap_to_v2(swap: int, limit: int | None) -> int | None:
    """OCI swap is memory+swap (the v1 meaning); memory.swap.max is swap alone, so subtract the limit.

    Returns -1 for "max", and None for 0, which runc (and so every caller) uses to mean "unset".
    """
    if swap == -1:
        return -1
    if swap == 0:
        return None
    if limit is None or limit == -1:
        raise CgroupError(errno.EINVAL, "linux.resources.memory.swap: cannot limit swap without a memory limit")
    if limit < 0:
        raise CgroupError(errno.EINVAL, f"linux.resources.memory.limit: invalid value {limit}")
    if swap < limit:
        raise CgroupError(errno.EINVAL, f"linux.resources.memory.swap: {swap} is below memory limit {limit}; "
                                        "OCI swap is memory+swap")
    return swap - limit


def _limit(value: int) -> str:
    return "max" if value < 0 else str(value)


class V2Manager(CgroupManager):
    """A container cgroup at `base/parts...` in the cgroup2 hierarchy mounted at `mountpoint`.

    `removable` are the ancestors destroy() may remove once empty (the runtime's own shared parents);
    the process that created them is gone by the time `delete` runs, so this is derived from the path.
    `kernel` attaches the device program; without one (a hybrid host's cgroup2 part, which the v1
    devices controller covers) device rules are refused rather than left unenforced.
    """

    def __init__(self, mountpoint: str, base: str, parts: tuple[str, ...],
                 removable: tuple[tuple[str, ...], ...] = (), kernel: Syscalls | None = None) -> None:
        self.mountpoint = mountpoint
        self.path = os.path.join(base, *parts)
        self._removable = [os.path.join(base, *p) for p in removable]
        self._kernel = kernel

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _write(self, name: str, value: str) -> None:
        """Writes a control file; a missing one is explained as a controller that is not enabled."""
        try:
            write(self._file(name), value)
        except CgroupError as exc:
            if exc.errno != errno.ENOENT or not os.path.isdir(self.path):
                raise
            controller = name.split(".", 1)[0]
            enabled = (read_optional(self._file("cgroup.controllers")) or "").split()
            if controller != "cgroup" and controller not in enabled:
                raise CgroupError(errno.ENOENT, f"write {self._file(name)}: the {controller} controller is not "
                                                f"enabled for this cgroup (available: {' '.join(enabled) or 'none'})"
                                  ) from exc
            raise

    def create(self) -> bool:
        rel = os.path.relpath(self.path, self.mountpoint)
        for _ in range(5):
            current = self.mountpoint
            made = False
            try:
                for part in rel.split("/"):
                    self._enable_controllers(current)
                    current = os.path.join(current, part)
                    try:
                        os.mkdir(current)
                        made = True
                    except FileExistsError:
                        made = False
                return made
            except FileNotFoundError:
                continue  # a concurrent destroy() removed an empty shared parent; walk down again
            except OSError as exc:
                raise os_error("mkdir", current, exc) from exc
        raise CgroupError(errno.ENOENT, f"mkdir {self.path}: parent kept disappearing")

    def _enable_controllers(self, directory: str) -> None:
        """Delegates every available controller to children, as runc does; best effort, one at a time
        on failure, because a parent with processes of its own (no-internal-process rule) or a controller
        that is threaded-only refuses some and the rest are still worth having."""
        available = set((read_optional(os.path.join(directory, "cgroup.controllers")) or "").split())
        enabled = set((read_optional(os.path.join(directory, "cgroup.subtree_control")) or "").split())
        missing = sorted(available - enabled)
        if not missing:
            return
        control = os.path.join(directory, "cgroup.subtree_control")
        try:
            write(control, " ".join("+" + c for c in missing))
        except CgroupError as exc:
            if exc.errno == errno.ENOENT:
                raise FileNotFoundError(exc.errno, str(exc)) from exc
            for controller in missing:
                try:
                    write(control, "+" + controller)
                except CgroupError:
                    pass

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    def cgroup2_dir(self) -> str | None:
        return self.path

    def enter_v1(self) -> None:
        pass

    def set(self, resources: Resources) -> None:
        if resources.devices:
            self._set_devices(resources.devices)
        if resources.memory is not None:
            self._set_memory(resources.memory)
        if resources.cpu is not None:
            self._set_cpu(resources.cpu)
        if resources.pids is not None and resources.pids.limit is not None:
            self._write("pids.max", _limit(resources.pids.limit))
        if resources.block_io is not None:
            self._set_io(resources.block_io)
        if resources.hugepage_limits:
            self.set_hugetlb(resources.hugepage_limits)
        for key, value in (resources.unified or {}).items():
            self._write(key, value)

    def _set_devices(self, rules: tuple[DeviceRule, ...]) -> None:
        """Attaches the program for `rules`, then detaches whatever device programs the cgroup had
        (the ones an earlier create or update attached)."""
        from pyruntime.linux.cgroups.devicefilter import LICENSE, compile_rules
        from pyruntime.linux.syscalls import BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI, BPF_PROG_TYPE_CGROUP_DEVICE
        program = compile_rules(rules)
        kernel = self._kernel
        if kernel is None:
            raise CgroupError(errno.EOPNOTSUPP, f"linux.resources.devices: {self.path}: this cgroup's manager "
                                                "has no kernel interface to attach a device program through")
        try:
            cgroup = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise os_error("open", self.path, exc) from exc
        try:
            before = kernel.bpf_prog_query(cgroup, BPF_CGROUP_DEVICE)
            prog = kernel.bpf_prog_load(BPF_PROG_TYPE_CGROUP_DEVICE, program, LICENSE, "pyruntime_dev")
            try:
                kernel.bpf_prog_attach(cgroup, prog, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)
            finally:
                os.close(prog)
            for prog_id in before:
                old = kernel.bpf_prog_get_fd_by_id(prog_id)
                try:
                    kernel.bpf_prog_detach(cgroup, old, BPF_CGROUP_DEVICE)
                finally:
                    os.close(old)
        except OSError as exc:
            raise CgroupError(exc.errno or errno.EIO, f"linux.resources.devices: {exc.strerror or exc}") from exc
        finally:
            os.close(cgroup)

    def _set_memory(self, m: Memory) -> None:
        swap = None
        if m.limit == -1 and not m.swap:
            swap = -1  # as runc: unlimited memory with swap unset (absent or 0) means both unlimited
        elif m.swap is not None:
            limit = m.limit
            if limit is None:
                current = (read_optional(self._file("memory.max")) or "max").strip()
                limit = -1 if current == "max" else int(current)
            swap = swap_to_v2(m.swap, limit)
        if swap is not None:
            try:
                self._write("memory.swap.max", _limit(swap))
            except CgroupError as exc:
                # Without swap accounting the file is absent; "unlimited" and "none" then hold anyway.
                if exc.errno != errno.ENOENT or swap not in (-1, 0):
                    raise
        if m.limit is not None:
            self._write("memory.max", _limit(m.limit))
        if m.reservation is not None:
            self._write("memory.low", _limit(m.reservation))

    def _set_cpu(self, c: Cpu) -> None:
        for name, value in (("realtimeRuntime", c.realtime_runtime), ("realtimePeriod", c.realtime_period)):
            if value:
                raise CgroupError(errno.EOPNOTSUPP, f"linux.resources.cpu.{name}: cgroup v2 has no realtime "
                                                    "scheduler controls")
        if c.idle is not None:
            self._write("cpu.idle", str(c.idle))
        if c.shares:
            self._write("cpu.weight", str(shares_to_weight(c.shares)))
        if c.quota or c.period:
            if not c.quota:  # 0 means "unset" in runc, so the current quota stays
                quota = (read_optional(self._file("cpu.max")) or "max").split()[0]
            else:
                quota = str(c.quota) if c.quota > 0 else "max"
            self._write("cpu.max", quota if c.period is None else f"{quota} {c.period}")
        if c.burst is not None:
            self._write("cpu.max.burst", str(c.burst))
        if c.cpus:
            self._write("cpuset.cpus", c.cpus)
        if c.mems:
            self._write("cpuset.mems", c.mems)

    def _set_io(self, b: BlockIO) -> None:
        bfq = os.path.exists(self._file("io.bfq.weight"))
        if b.weight:
            if bfq:
                self._write("io.bfq.weight", str(b.weight))
            else:
                self._write("io.weight", str(blkio_to_io_weight(b.weight)))
        for dev in b.weight_device or ():
            if dev.weight is None:
                continue
            if bfq:
                self._write("io.bfq.weight", f"{dev.major}:{dev.minor} {dev.weight}")
            else:
                self._write("io.weight", f"{dev.major}:{dev.minor} {blkio_to_io_weight(dev.weight)}")
        for key, devices in (("rbps", b.throttle_read_bps_device), ("wbps", b.throttle_write_bps_device),
                             ("riops", b.throttle_read_iops_device), ("wiops", b.throttle_write_iops_device)):
            for t in devices or ():
                self._write("io.max", f"{t.major}:{t.minor} {key}={t.rate if t.rate else 'max'}")

    def set_hugetlb(self, limits: tuple[HugepageLimit, ...]) -> None:
        """Also sets the reservation limit where the kernel has one, as the OCI spec prefers it."""
        for h in limits:
            self._write(f"hugetlb.{h.page_size}.max", str(h.limit))
            rsvd = f"hugetlb.{h.page_size}.rsvd.max"
            if os.path.exists(self._file(rsvd)):
                self._write(rsvd, str(h.limit))

    def freeze(self) -> None:
        self._write("cgroup.freeze", "1")
        deadline = time.monotonic() + FREEZE_TIMEOUT
        while keyed(read_optional(self._file("cgroup.events"))).get("frozen", 1) != 1:
            if time.monotonic() > deadline:
                self._write("cgroup.freeze", "0")
                raise CgroupError(errno.ETIMEDOUT, f"freeze {self.path}: tasks did not stop "
                                                   f"within {FREEZE_TIMEOUT:g}s")
            time.sleep(0.001)

    def thaw(self) -> None:
        self._write("cgroup.freeze", "0")

    def state(self) -> str:
        value = read_optional(self._file("cgroup.freeze"))
        return FROZEN if value is not None and value.strip() == "1" else THAWED

    def pids(self) -> list[int]:
        return procs_in_tree(self.path)

    def kill_all(self, sig: int = SIGKILL) -> None:
        """SIGKILL goes through cgroup.kill where the kernel has it, which cannot miss a forking process;
        otherwise the cgroup is frozen while it is signalled, for the same reason. A freeze that times
        out does not stop the signal, which then goes out unfrozen."""
        if not os.path.isdir(self.path):
            return
        if sig == SIGKILL and os.path.exists(self._file("cgroup.kill")):
            self._write("cgroup.kill", "1")
            return
        self._signal_frozen(sig, os.path.exists(self._file("cgroup.freeze")), False)

    def stats(self) -> dict:
        from pyruntime.linux.cgroups.resources import UINT64_MAX
        cpu = keyed(read_optional(self._file("cpu.stat")))
        memory_stat = keyed(read_optional(self._file("memory.stat")))
        memory_max = (read_optional(self._file("memory.max")) or "max").strip()
        swap_max = (read_optional(self._file("memory.swap.max")) or "max").strip()
        return {
            "cpu": {
                "usage": {"total": cpu.get("usage_usec", 0) * 1000, "kernel": cpu.get("system_usec", 0) * 1000,
                          "user": cpu.get("user_usec", 0) * 1000},
                "throttling": {"periods": cpu.get("nr_periods", 0), "throttledPeriods": cpu.get("nr_throttled", 0),
                               "throttledTime": cpu.get("throttled_usec", 0) * 1000},
            },
            "memory": {
                "cache": memory_stat.get("file", 0),
                "usage": {"usage": number(read_optional(self._file("memory.current"))),
                          "limit": UINT64_MAX if memory_max == "max" else int(memory_max),
                          "max": number(read_optional(self._file("memory.peak"))),
                          "failcnt": keyed(read_optional(self._file("memory.events"))).get("max", 0)},
                "swap": {"usage": number(read_optional(self._file("memory.swap.current"))),
                         "limit": UINT64_MAX if swap_max == "max" else int(swap_max)},
                "raw": memory_stat,
            },
            "pids": {"current": number(read_optional(self._file("pids.current"))),
                     "limit": number(read_optional(self._file("pids.max")))},
        }

    def oom_kill_count(self) -> int:
        return keyed(read_optional(self._file("memory.events"))).get("oom_kill", 0)

    def destroy(self) -> None:
        rmdir_tree(self.path)
        for parent in self._removable:
            if not rmdir_if_empty(parent):
                break

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def read(self, name: str) -> str:
        """One control file of this cgroup, for callers (and tests) that need a value stats() omits."""
        return read(self._file(name))
