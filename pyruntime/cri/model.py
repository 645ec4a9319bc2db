"""What pyruntime-cri keeps on disk about its pods and containers, and where: the one place that
names those paths and record fields, so the daemon, the launcher, the supervisors and recovery agree.

The daemon is level-triggered: after a crash or a restart it rebuilds everything it knows from these
records (cri/store.py's recover()), the supervisors' exit records and the runtime's own state. So every
record is written atomically (pynode_os.files.atomic_write) before the step it describes is taken, and a record
alone never claims more than is true: a container record without an exit record is "maybe running",
settled by asking the runtime and checking the supervisor's pid and start time.

Persistent things (records, bundles, rootfs mount points, logs' metadata, the CNI cache, images) live
under `root` (/var/lib/pyruntime-cri); things that die with the machine (the runtime's state, pinned
namespaces, supervisor sockets) under `state` (/run/pyruntime-cri). The CRI request each object was
made from is kept as the protobuf's own serialization (base64), so status calls answer with exactly
what was asked and nothing is lost in a translation to JSON.
"""
from __future__ import annotations

import base64
import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from pynode_os.files import FULL, atomic_write
from pynode_os.proc import process_alive
from pyruntime.errors import InternalError

T = TypeVar("T", bound="Record")


class Layout:
    """The directory tree of one pyruntime-cri instance (two instances with other roots never meet)."""

    def __init__(self, root: str, state: str) -> None:
        self.root = os.path.abspath(root)
        self.state = os.path.abspath(state)

    # persistent (--root)
    @property
    def images(self) -> str:
        return os.path.join(self.root, "images")

    @property
    def cni_cache(self) -> str:
        """libcni's cache (results of ADD, kept for DEL and CHECK)."""
        return os.path.join(self.root, "cni-cache")

    def sandbox_dir(self, sandbox_id: str) -> str:
        """sandbox.json, and resolv.conf, hostname, hosts that the pod's containers mount."""
        return os.path.join(self.root, "sandboxes", sandbox_id)

    def container_dir(self, container_id: str) -> str:
        """container.json, exit.json (written by the supervisor) and bundle/ (config.json, rootfs/)."""
        return os.path.join(self.root, "containers", container_id)

    def bundle(self, container_id: str) -> str:
        return os.path.join(self.container_dir(container_id), "bundle")

    def exit_record(self, container_id: str) -> str:
        return os.path.join(self.container_dir(container_id), "exit.json")

    # volatile (--state)
    @property
    def runtime_root(self) -> str:
        """pyruntime's Settings.root: the OCI runtime's container state."""
        return os.path.join(self.state, "runtime")

    def ns_dir(self, sandbox_id: str) -> str:
        """Bind mounts pinning the pod's namespaces (net, ipc, uts): they outlive its pause process, so
        CNI DEL and a restarted daemon always have the network namespace to work on."""
        return os.path.join(self.state, "sandboxes", sandbox_id, "ns")

    def supervisor_dir(self, container_id: str) -> str:
        """supervisor.sock (attach, log reopen, resize) of the container's supervisor."""
        return os.path.join(self.state, "containers", container_id)


@dataclass
class Record:
    """A JSON record with a fixed set of fields; unknown fields from a newer version are ignored and
    missing ones take their defaults, so a downgrade or upgrade reads the other's records."""

    def dump(self, path: str, sync: str = FULL) -> None:
        """`sync`: pynode_os.files' level; DATA for an update that adds only what describes live processes (pids,
        start times), which a power cut ends anyway."""
        atomic_write(path, json.dumps(asdict(self), sort_keys=True).encode(), mode=0o600, sync=sync)

    @classmethod
    def load(cls: type[T], path: str) -> T:
        """Raises FileNotFoundError when there is no record, InternalError when it is unreadable."""
        with open(path, "rb") as f:
            data = f.read()
        try:
            raw = json.loads(data)
            names = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in raw.items() if k in names})
        except (ValueError, TypeError) as e:
            raise InternalError(f"{path}: unreadable record: {e}") from e


def encode_pb(message: Any) -> str:
    return base64.b64encode(message.SerializeToString(deterministic=True)).decode()


def decode_pb(cls: Any, data: str) -> Any:
    message = cls()
    message.ParseFromString(base64.b64decode(data))
    return message


@dataclass
class SandboxRecord(Record):
    """sandbox_dir/sandbox.json. `config`: the PodSandboxConfig (encode_pb). `namespaces`: kind (net, ipc,
    uts, pid) -> the path containers join; an absent kind is the host's (hostNetwork, hostIPC, hostPID).
    `pinned`: the pause step finished (namespaces pinned; pause_pid is 0 for a pod without a pause process).
    `ready` turns False at StopPodSandbox and never back."""

    id: str
    config: str
    created_at: int  # ns since the epoch
    runtime_handler: str = ""
    ready: bool = True
    namespaces: dict[str, str] = field(default_factory=dict)
    pinned: bool = False
    pause_pid: int = 0
    pause_start_time: int = 0  # /proc/PID/stat field 22: with the pid, names the process for good
    ips: list[str] = field(default_factory=list)  # the pod's IPs, the primary first
    cgroup_parent: str = ""
    network_torn_down: bool = False  # CNI DEL done (the addresses are released)

    def namespaces_made(self) -> bool:
        """The pause step was reached (a record written before `pinned` existed has only the pause's pid)."""
        return self.pinned or self.pause_pid > 0

    def namespaces_held(self) -> bool:
        """The pod's namespaces are still held: by its pause when it has one, else by their pins alone."""
        if self.pause_pid > 0:
            return process_alive(self.pause_pid, self.pause_start_time)
        return self.pinned


@dataclass
class ContainerRecord(Record):
    """container_dir/container.json. `config`: the ContainerConfig (encode_pb). The state the CRI reports
    is derived: exit.json present -> EXITED; else started_at -> RUNNING (checked against the runtime);
    else CREATED."""

    id: str
    sandbox_id: str
    config: str
    created_at: int
    image_ref: str  # the image as the request named it
    image_id: str  # sha256:... of the image config
    log_path: str = ""  # absolute: the sandbox's log_directory joined with the container's log_path
    started_at: int = 0
    supervisor_pid: int = 0
    supervisor_start_time: int = 0
    init_pid: int = 0


@dataclass
class ExitRecord(Record):
    """container_dir/exit.json, written by the container's supervisor once the init was reaped and its
    output flushed to the log; the daemon writes it instead when a supervisor died without one
    (reason "Error", message saying so, exit_code 255)."""

    exit_code: int
    finished_at: int  # ns since the epoch
    reason: str = ""  # "Completed", "Error", "OOMKilled" (the CRI's reasons)
    message: str = ""
