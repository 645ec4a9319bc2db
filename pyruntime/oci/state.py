"""The runtime's record of one container, and how its status is derived from the kernel.

Status is never stored as truth: it is read off the live system (is the pid alive and the same
process, is the exec fifo still there, is the cgroup frozen), so a runtime that crashed between two
steps still reports what really is.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

OCI_VERSION = "1.2.1"

CREATING, CREATED, RUNNING, PAUSED, STOPPED = "creating", "created", "running", "paused", "stopped"


@dataclass
class ContainerState:
    id: str
    bundle: str
    rootfs: str
    pid: int = 0
    pid_start: int = 0
    created: str = ""
    owner: str = ""
    cgroups_path: str = ""
    annotations: dict[str, str] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    exit_status: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> "ContainerState":
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


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
