"""Where the hierarchies are mounted and where in them a container's cgroupsPath lands.

Mount points are read from mountinfo rather than assumed, because hosts differ: controllers may be
co-mounted ("cpu,cpuacct") or split, a hybrid host adds a cgroup2 mount beside the v1 ones, and inside a
container a hierarchy's mount root is not the hierarchy root.
"""
from __future__ import annotations

from pynode_os import mountinfo

TYPE_CHECKING = False
if TYPE_CHECKING:
    # the host's hierarchies as parse_mountinfo gives them: the v1 ones, and the first cgroup2 mount
    HostMounts = tuple[list["Hierarchy"], "Hierarchy | None"]

DEFAULT_PARENT = "pyruntime"


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


def split_path(cgroups_path: str, container_id: str) -> tuple[bool, tuple[str, ...]]:
    """Checks a cgroupsPath and splits it into (is_absolute, components).

    An empty path means /pyruntime/<id>. Any other string is a directory path, as runc's cgroupfs
    driver takes it: containerd's CRI hands the systemd driver's "slice:prefix:name" form
    (`test.slice:cri-containerd:ID`) to a cgroupfs runtime too, and runc makes a directory of that
    name relative to its own cgroup. ".." is refused, because it would leave the hierarchy (runc
    clamps it lexically; refusing is the stricter reading of the same rule).
    """
    if not cgroups_path:
        return True, (DEFAULT_PARENT, container_id)
    parts = tuple(p for p in cgroups_path.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ValueError(f"linux.cgroupsPath: {cgroups_path!r} must not contain '..'")
    if not parts:
        raise ValueError(f"linux.cgroupsPath: {cgroups_path!r} names the hierarchy root, not a container cgroup")
    return cgroups_path.startswith("/"), parts


def base_dir(h: Hierarchy, absolute: bool, own: dict[str, str]) -> str:
    """The directory a cgroupsPath is relative to: the mount for an absolute path, else our own cgroup.

    Our own cgroup is reported relative to the hierarchy root, so the mount's root is stripped off.
    """
    if absolute:
        return h.mountpoint
    mine = own.get(h.key, "/")
    if h.root != "/" and (mine == h.root or mine.startswith(h.root + "/")):
        mine = mine[len(h.root):]
    return h.mountpoint.rstrip("/") + "/" + mine.strip("/") if mine.strip("/") else h.mountpoint


def parent_of_own(own: dict[str, str]) -> dict[str, str]:
    """`own` (parse_proc_cgroup's) with the cgroup2 path replaced by its parent: where a pure v2 host puts a
    relative cgroupsPath, as runc's fs2 driver does. Our own cgroup holds our process, and the kernel gives no
    child of a cgroup with processes a domain controller (the no-internal-process rule); under a systemd
    service, whose cgroup turns into a thread root once a threaded controller is enabled in it, it refuses the
    container's processes outright (EOPNOTSUPP)."""
    if "" not in own:
        return own
    mine = own[""].rstrip("/")
    return {**own, "": mine[:mine.rfind("/")] or "/"}


def removable_parents(parts: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The ancestors destroy() may remove when empty: only ones inside the runtime's own /pyruntime."""
    if len(parts) < 2 or parts[0] != DEFAULT_PARENT:
        return []
    return [parts[:n] for n in range(len(parts) - 1, 0, -1)]
