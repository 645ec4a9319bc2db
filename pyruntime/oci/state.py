"""The runtime's record of one container, and how its status is derived from the kernel.

Status is never stored as truth: it is read off the live system (is the pid alive and the same
process, is the exec fifo still there, is the cgroup frozen), so a runtime that crashed between two
steps still reports what really is.
"""
from __future__ import annotations

OCI_VERSION = "1.2.1"

CREATING, CREATED, RUNNING, PAUSED, STOPPED = "creating", "created", "running", "paused", "stopped"


class ContainerState:
    """What the runtime records in state.json. A plain class rather than a dataclass, because every
    command loads it and `dataclasses` (with the inspect module it pulls in) costs milliseconds to import."""

    FIELDS = ("id", "bundle", "rootfs", "pid", "pid_start", "created", "owner", "cgroups_path", "annotations",
              "config", "creator_pid", "creator_start")
    __slots__ = FIELDS

    def __init__(self, id: str, bundle: str, rootfs: str, pid: int = 0, pid_start: int = 0, created: str = "",
                 owner: str = "", cgroups_path: str = "", annotations: dict[str, str] | None = None,
                 config: dict | None = None, creator_pid: int = 0, creator_start: int = 0) -> None:
        self.id = id
        self.bundle = bundle
        self.rootfs = rootfs
        self.pid = pid
        self.pid_start = pid_start
        self.created = created
        self.owner = owner
        self.cgroups_path = cgroups_path
        self.annotations: dict[str, str] = {} if annotations is None else annotations
        self.config: dict = {} if config is None else config
        # the `create` process, while the container has no init yet: alive means "creating", dead means a
        # create that crashed, whose leftovers `delete` removes
        self.creator_pid = creator_pid
        self.creator_start = creator_start

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.to_json() == other.to_json()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"ContainerState({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    @classmethod
    def from_json(cls, raw: dict) -> ContainerState:
        return cls(**{k: raw[k] for k in cls.FIELDS if k in raw})


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat; with the pid it names one process for good, since pids are reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    if rest[0] in (b"Z", b"X"):
        return None
    return int(rest[19])


def process_alive(pid: int, start: int) -> bool:
    return pid > 0 and process_start_time(pid) == start


def oci_state(state: ContainerState, status: str) -> dict:
    """The state JSON of the runtime spec, with runc's extra fields that tools built for runc read."""
    return {
        "ociVersion": OCI_VERSION,
        "id": state.id,
        "pid": state.pid if status not in (STOPPED,) else 0,
        "status": status,
        "bundle": state.bundle,
        "rootfs": state.rootfs,
        "created": state.created,
        "annotations": state.annotations,
        "owner": state.owner,
    }
