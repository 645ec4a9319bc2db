"""Container cgroups behind one interface, with the v1 or v2 driver chosen by what the host mounts.

`manager(cgroups_path, container_id, kernel)` is all the runtime calls; `kernel` is the caller's
syscall layer, through which the filesystem type of the cgroup root is probed (the host's layout is read as
every package reads it: pynode_os.cgroups). Only the stdlib is imported and no process is spawned, because
this sits on the container start path whose latency is compared with runc.
"""
from __future__ import annotations

import errno

from pynode_os.cgroups import CGROUP_ROOT, Hierarchy, parse_mountinfo, parse_proc_cgroup, version
from pyruntime.linux.cgroups.base import FROZEN, THAWED, CgroupError, CgroupManager, read
from pyruntime.linux.cgroups.paths import base_dir, parent_of_own, removable_parents, split_path

__all__ = [
    "DEFAULT_ALLOWED_DEVICES",
    "FROZEN",
    "THAWED",
    "CgroupError",
    "CgroupManager",
    "Resources",
    "V1Manager",
    "V2Manager",
    "detect",
    "manager",
    "mounts",
]

TYPE_CHECKING = False
if TYPE_CHECKING:  # what __getattr__ below loads, as a type checker should see it
    from pynode_os.cgroups import HostMounts
    from pyruntime.linux.cgroups.resources import DEFAULT_ALLOWED_DEVICES, Resources
    from pyruntime.linux.cgroups.v1 import V1Manager
    from pyruntime.linux.cgroups.v2 import V2Manager
    from pyruntime.linux.syscalls import Syscalls


def __getattr__(name: str) -> object:
    """Load on first use: `delete`, `state` and `start` never need the resource types, and `start` (or
    `state` of a created container) not even a manager; the base module's names (FROZEN, CgroupError)
    come without them."""
    if name in ("Resources", "DEFAULT_ALLOWED_DEVICES"):
        from pyruntime.linux.cgroups import resources
        return getattr(resources, name)
    if name == "V1Manager":
        from pyruntime.linux.cgroups.v1 import V1Manager
        return V1Manager
    if name == "V2Manager":
        from pyruntime.linux.cgroups.v2 import V2Manager
        return V2Manager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def detect(kernel: Syscalls, root: str = CGROUP_ROOT) -> str:
    """"v2" when the cgroup root itself is a cgroup2 mount (unified host), else "v1" (legacy or hybrid)."""
    try:
        return version(kernel.statfs_type, root)
    except OSError as e:
        raise CgroupError(e.errno or 0, str(e)) from e


def _own_cgroups(absolute: bool) -> dict[str, str]:
    return {} if absolute else parse_proc_cgroup(read("/proc/self/cgroup"))


def mounts() -> HostMounts:
    """The cgroup hierarchies mounted in this process's mount namespace (v1 ones, then the first cgroup2)."""
    return parse_mountinfo(read("/proc/self/mountinfo"))


def manager(cgroups_path: str, container_id: str, kernel: Syscalls,
            host_mounts: HostMounts | None = None, systemd: bool = False) -> CgroupManager:
    """The manager for a container's cgroupsPath; a path this runtime refuses raises ValueError.

    An absolute path is relative to each hierarchy's root, a relative one to the runtime's own cgroup (on a
    pure v2 host to its parent, as runc's fs2 driver: paths.parent_of_own), and an empty one means
    /pyruntime/<id>. `host_mounts`: mounts() as the caller read it (read if None). `systemd`: the systemd
    driver's scope for a "slice:prefix:name" path (systemd.py), whose D-Bus client is loaded only then.
    """
    if systemd:
        from pyruntime.linux.cgroups.systemd import SystemdManager
        return SystemdManager(cgroups_path, container_id, kernel)
    from pyruntime.linux.cgroups.v1 import V1Manager
    from pyruntime.linux.cgroups.v2 import V2Manager
    absolute, parts = split_path(cgroups_path, container_id)
    removable = tuple(removable_parents(parts))
    v1, v2 = host_mounts if host_mounts is not None else mounts()
    if detect(kernel) == "v2":
        if v2 is None or v2.mountpoint != CGROUP_ROOT:
            v2 = Hierarchy("", frozenset(), CGROUP_ROOT, "/")
        own = parent_of_own(_own_cgroups(absolute))
        return V2Manager(v2.mountpoint, base_dir(v2, absolute, own), parts, removable, kernel)
    if not v1:
        raise CgroupError(errno.ENOENT, f"cgroup: no cgroup v1 hierarchy is mounted and {CGROUP_ROOT} is not cgroup2")
    own = _own_cgroups(absolute)
    unified = None
    if v2 is not None:
        v1_controllers = set().union(*(h.controllers for h in v1))
        extra = set(read(f"{v2.mountpoint}/cgroup.controllers").split()) - v1_controllers
        if extra:
            unified = V2Manager(v2.mountpoint, base_dir(v2, absolute, own), parts, removable)
    bases = {h.key: base_dir(h, absolute, own) for h in v1}
    return V1Manager(bases, parts, removable, unified)
