"""/proc/PID/mountinfo, parsed in one place.

The kernel writes paths with space, tab, newline and backslash octal-escaped (\\040 \\011 \\012 \\134),
so that a line is always one mount and a field never holds a space. A reader that forgets this (or
undoes only \\040) misses a mount point such as `/run/my dir` or takes `/a\\134b` for a different path:
the cgroup driver would pick the wrong hierarchy, pivot_root would keep a shared parent, a snapshot
would be deleted while still mounted, the kubelet would leave a volume's tmpfs behind and remove the
directory under it. Every caller, in every package, uses `parse`/`read` here, and `escape` is the exact
inverse of `unescape`, so a path round-trips.

Only the stdlib's str is used: cgroups read this on every container start.
"""
from __future__ import annotations

_ESCAPED = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}


class MountInfo:
    """One line of mountinfo (proc(5)); paths unescaped, options split. A plain class, not a @record:
    that would import typing, which the cgroup driver's callers (every kill, delete, pause) never pay."""

    __slots__ = ("device", "fstype", "mount_id", "mount_point", "optional", "options", "parent_id", "root",
                 "source", "super_options")

    def __init__(self, mount_id: int, parent_id: int, device: str, root: str, mount_point: str,
                 options: tuple[str, ...], optional: tuple[str, ...], fstype: str, source: str,
                 super_options: tuple[str, ...]) -> None:
        self.mount_id = mount_id
        self.parent_id = parent_id
        self.device = device  # major:minor
        self.root = root  # the path inside the filesystem that is mounted (a bind mount's source)
        self.mount_point = mount_point
        self.options = options  # per-mount options (ro, nosuid, ...)
        self.optional = optional  # propagation tags: shared:N, master:N, propagate_from:N, unbindable
        self.fstype = fstype
        self.source = source
        self.super_options = super_options

    def __repr__(self) -> str:
        return f"MountInfo({self.mount_id} {self.mount_point!r} {self.fstype} {self.source!r})"


def escape(path: str) -> str:
    """The kernel's escaping of a path in mountinfo."""
    return "".join(_ESCAPED.get(c, c) for c in path)


def unescape(field: str) -> str:
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        octal = field[i + 1:i + 4]
        if field[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse(text: str) -> list[MountInfo]:
    """Every well-formed line of `text`, in the kernel's order (parents before children); others are skipped."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        try:
            mount_id, parent_id = int(fields[0]), int(fields[1])
        except ValueError:
            continue
        mounts.append(MountInfo(mount_id, parent_id, fields[2], unescape(fields[3]), unescape(fields[4]),
                                tuple(fields[5].split(",")), tuple(fields[6:]), tail[0], unescape(tail[1]),
                                tuple(tail[2].split(","))))
    return mounts


def read(pid: int | str = "self") -> list[MountInfo]:
    with open(f"/proc/{pid}/mountinfo") as f:
        return parse(f.read())


def is_mount_point(path: str, mounts: list[MountInfo]) -> bool:
    return any(m.mount_point == path for m in mounts)


def mount_of(path: str, mounts: list[MountInfo]) -> MountInfo | None:
    """The mount that `path` (absolute, symlinks resolved) lies on: the last, longest prefix, as the kernel
    stacks mounts on one point in the order they were made."""
    best: MountInfo | None = None
    for m in mounts:
        point = m.mount_point
        if (path == point or path.startswith(point.rstrip("/") + "/")) and \
                (best is None or len(point) >= len(best.mount_point)):
            best = m
    return best
