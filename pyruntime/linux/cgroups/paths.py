"""Where in the hierarchies a container's cgroupsPath lands (where they are mounted: pynode_os.cgroups)."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pynode_os.cgroups import Hierarchy

DEFAULT_PARENT = "pyruntime"


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
