"""Which cgroup version the host runs, and where its hierarchies are mounted.

Three layouts are found on hosts: cgroup v2 alone (unified: /sys/fs/cgroup is itself a cgroup2 mount), v1
(one mount per controller set under a tmpfs at /sys/fs/cgroup, controllers co-mounted as "cpu,cpuacct" or
split, some linked by symlinks), and hybrid (v1, plus a cgroup2 mount beside the v1 ones, systemd's
/sys/fs/cgroup/unified). The version is the cgroup root's filesystem type (statfs(2), as runc's
IsCgroup2UnifiedMode): "v2" only when the root is cgroup2, so a hybrid host is "v1". Where each hierarchy is
mounted is read from mountinfo rather than assumed, because inside a container a hierarchy's mount root is
not the hierarchy root.

`version` and `hierarchy_roots` take the statfs call from their caller: the runtime hands its Syscalls
object's, other packages pynode_os.mounts'. Only the stdlib's str and os are used: the runtime reads the
hierarchies on every container start.
"""
from __future__ import annotations

import os

from pynode_os import mountinfo

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    # the host's hierarchies as parse_mountinfo gives them: the v1 ones, and the first cgroup2 mount
    HostMounts = tuple[list["Hierarchy"], "Hierarchy | None"]

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP2_SUPER_MAGIC = 0x63677270
V1, V2 = "v1", "v2"


def version(statfs_type: Callable[[str], int], root: str = CGROUP_ROOT) -> str:
    """V2 when the cgroup root itself is a cgroup2 mount (a unified host), else V1 (legacy or hybrid). Raises
    OSError when the root can't be statted."""
    return V2 if statfs_type(root) == CGROUP2_SUPER_MAGIC else V1


def hierarchy_roots(statfs_type: Callable[[str], int], root: str = CGROUP_ROOT) -> list[str]:
    """The cgroup v2 root, or each v1 hierarchy's directory (a hybrid host's cgroup2 mount among them), not the
    symlinks to co-mounted ones: where a cgroup the runtime makes in every hierarchy is found."""
    if version(statfs_type, root) == V2:
        return [root]
    with os.scandir(root) as entries:
        return [os.path.join(root, e.name) for e in entries if e.is_dir(follow_symlinks=False)]


class Hierarchy:
    """One mounted hierarchy. `key` names it as /proc/<pid>/cgroup does ("cpu,cpuacct", "name=systemd", "").

    A plain value class, not a dataclass: every command that touches a cgroup loads this module, and
    importing dataclasses costs more than the whole mountinfo parse.
    """

    __slots__ = ("controllers", "key", "mountpoint", "root")

    def __init__(self, key: str, controllers: frozenset[str], mountpoint: str, root: str) -> None:
        self.key = key
        self.controllers = controllers
        self.mountpoint = mountpoint
        self.root = root

    def _fields(self) -> tuple[str, frozenset[str], str, str]:
        return self.key, self.controllers, self.mountpoint, self.root

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "Hierarchy(key={!r}, controllers={!r}, mountpoint={!r}, root={!r})".format(*self._fields())


def parse_mountinfo(text: str) -> HostMounts:
    """The v1 hierarchies (one per distinct controller set) and the first cgroup2 mount, if any. Only the
    cgroup lines are parsed: mountinfo grows with every pod (its rootfs, /dev/shm, namespace pins), and a
    container's create reads it twice. " - " ends a line's optional fields; in a path it is escaped."""
    v1: dict[str, Hierarchy] = {}
    v2: Hierarchy | None = None
    for m in mountinfo.parse("\n".join(line for line in text.splitlines() if " - cgroup" in line)):
        fstype, opts, root, mountpoint = m.fstype, m.super_options, m.root, m.mount_point
        if fstype == "cgroup2":
            if v2 is None:
                v2 = Hierarchy("", frozenset(), mountpoint, root)
        elif fstype == "cgroup":
            names = [o for o in opts if o.startswith("name=")]
            controllers = [o for o in opts if o not in ("rw", "ro") and "=" not in o
                           and o not in ("noprefix", "clone_children", "xattr", "cpuset_v2_mode", "favordynmods")]
            key = ",".join(sorted(controllers) + names)
            if key and key not in v1:
                v1[key] = Hierarchy(key, frozenset(controllers + names), mountpoint, root)
    return list(v1.values()), v2


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Maps each hierarchy key ("" for cgroup2) to the process's path in it."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            key = ",".join(sorted(c for c in parts[1].split(",") if not c.startswith("name="))
                           + [c for c in parts[1].split(",") if c.startswith("name=")])
            out[key] = parts[2]
    return out
