"""The jobs the CRI daemon gives its fork server (pyruntime/cri/forkserver.py), and what it answers.

Each crosses the launcher's channel as the JSON object of its fields (dataclasses.asdict) and is rebuilt on
the other side with the same class, so the daemon, the fork server and the children it forks share one
vocabulary and none of them imports another's code for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CGROUP_PREFIX = "pyruntime-cri"  # the systemd driver's scope prefix, as containerd's "cri-containerd"


@dataclass
class PauseJob:
    """cgroup_parent: a pause that stays (share_pid) joins `<cgroup_parent>/pause` (made if missing, as runc
    makes a container's cgroup), or /pyruntime/<sandbox_id> without one (pause.pause_cgroup). A leaf of its own
    rather than the parent itself, because on cgroup v2 a cgroup with processes can't enable controllers for
    the pod's container cgroups. systemd_cgroup: the pause is the scope pyruntime-cri-<sandbox_id>.scope in the
    pod's slice instead (the systemd driver's)."""

    sandbox_id: str
    ns_dir: str
    hostname: str = ""
    new_net: bool = True
    new_ipc: bool = True
    new_uts: bool = True
    share_pid: bool = False
    sysctls: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    # a user namespace of the pod's own (mode POD): [container id, host id, length] ranges; none: the host's
    uid_map: list[list[int]] = field(default_factory=list)
    gid_map: list[list[int]] = field(default_factory=list)
    systemd_cgroup: bool = False


@dataclass
class PauseInfo:
    """namespaces: kind (user, net, ipc, uts) -> the pinned file; "pid" -> /proc/PID/ns/pid when the pod shares
    a pid namespace (a pid namespace without processes can't be entered, so pinning it gains nothing).
    pid and start_time: the pause that stays, 0 for a pod without one (no shared pid namespace).
    cgroup: the pause's cgroup path ("" for none)."""

    pid: int
    start_time: int
    namespaces: dict[str, str]
    cgroup: str = ""


@dataclass
class ContainerJob:
    container_id: str
    bundle: str
    log_path: str
    tty: bool
    stdin: bool
    stdin_once: bool
    exit_path: str
    supervisor_dir: str


@dataclass
class SupervisorInfo:
    pid: int
    start_time: int
    init_pid: int


@dataclass
class ExecJob:
    """env: NAME=VALUE entries over the container's own environment (runc exec --env); cwd: "" and
    user: None keep the container's (user: an OCI process.user object)."""

    container_id: str
    argv: list[str]
    tty: bool = False
    env: list[str] = field(default_factory=list)
    cwd: str = ""
    user: dict | None = None


@dataclass
class PullJob:
    """An image pull, run in a child of the launcher rather than in the daemon: what a registry sends
    (manifests, compressed layers, tar streams) is parsed and unpacked in a process that ends with the pull,
    so a hostile or broken image can't take the daemon down or leave its memory grown, and the daemon
    never loads the HTTP client and TLS (bench.cri's memory). Credentials as pyruntime.images.request's;
    progress_timeout: seconds a blob may stand still before the pull fails (0: never)."""

    ref: str
    username: str = ""
    password: str = ""
    token: str = ""
    progress_timeout: float = 300.0
