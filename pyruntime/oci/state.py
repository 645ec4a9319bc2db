"""The runtime's record of one container, and how its status is derived from the kernel.

Status is never stored as truth: it is read off the live system (is the pid alive and the same
process, is the exec fifo still there, is the cgroup frozen), so a runtime that crashed between two
steps still reports what really is.

The record keeps, besides the ids, exactly what later commands need from the config that `create`
validated, and no more: the namespaces (exec joins them), the process (exec's defaults), the
poststart and poststop hooks (start and delete run them), the seccomp profile (every exec'd process
gets it) and the resources as last applied (update merges into them). Each is a section of
config.json already checked at create; the typed accessors below decode only the one a command
asks for, so `state`, `kill` and `list` never import the spec parser and `exec` never re-reads the
whole config or the bundle.
"""
from __future__ import annotations

OCI_VERSION = "1.2.1"
# bumped whenever the record's fields change meaning; a record of another version is refused by name
RECORD_VERSION = 2

CREATING, CREATED, RUNNING, PAUSED, STOPPED = "creating", "created", "running", "paused", "stopped"
# the hooks that run after create, from the stored state alone (the others run during create)
LATER_HOOKS = ("poststart", "poststop")

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.linux.cgroups.resources import Resources
    from pyruntime.linux.seccomp.profile import Seccomp
    from pyruntime.oci.spec import Hook, Process, Spec


class ContainerState:
    """What the runtime records in state.json. A plain class rather than a dataclass, because every
    command loads it and `dataclasses` (with the inspect module it pulls in) is a large import."""

    FIELDS = ("id", "bundle", "rootfs", "pid", "pid_start", "created", "owner", "cgroups_path", "annotations",
              "creator_pid", "creator_start", "namespaces", "process", "hooks", "seccomp", "resources", "personality",
              "systemd_cgroup")
    __slots__ = FIELDS

    def __init__(self, id: str, bundle: str, rootfs: str, pid: int = 0, pid_start: int = 0, created: str = "",
                 owner: str = "", cgroups_path: str = "", annotations: dict[str, str] | None = None,
                 creator_pid: int = 0, creator_start: int = 0, namespaces: dict[str, str | None] | None = None,
                 process: dict | None = None, hooks: dict[str, list] | None = None, seccomp: dict | None = None,
                 resources: dict | None = None, personality: str | None = None, systemd_cgroup: bool = False) -> None:
        self.id = id
        self.bundle = bundle
        self.rootfs = rootfs
        self.pid = pid
        self.pid_start = pid_start
        self.created = created
        self.owner = owner
        self.cgroups_path = cgroups_path
        self.annotations: dict[str, str] = {} if annotations is None else annotations
        # the `create` process, while the container has no init yet: alive means "creating", dead means a
        # create that crashed, whose leftovers `delete` removes
        self.creator_pid = creator_pid
        self.creator_start = creator_start
        # namespace type -> the path it was joined from, or None for one the container made
        self.namespaces: dict[str, str | None] = {} if namespaces is None else namespaces
        self.process: dict = {} if process is None else process
        self.hooks: dict[str, list] = {} if hooks is None else hooks
        self.seccomp = seccomp
        self.resources: dict = {} if resources is None else resources
        self.personality = personality  # linux.personality.domain, which exec'd processes get too
        self.systemd_cgroup = systemd_cgroup  # the cgroup is a systemd scope (linux/cgroups/systemd.py)

    @classmethod
    def of_spec(cls, id: str, spec: Spec, *, bundle: str, created: str, owner: str, creator_pid: int,
                creator_start: int, systemd_cgroup: bool = False) -> ContainerState:
        """The record of a container made from `spec`, with the sections later commands need."""
        raw = spec.raw
        linux = raw.get("linux") or {}
        hooks = raw.get("hooks") or {}
        return cls(id=id, bundle=bundle, rootfs=spec.root.path, created=created, owner=owner,
                   creator_pid=creator_pid, creator_start=creator_start, cgroups_path=spec.linux.cgroups_path,
                   annotations=spec.annotations, namespaces={ns.type: ns.path for ns in spec.linux.namespaces},
                   process=raw.get("process") or {}, hooks={k: hooks[k] for k in LATER_HOOKS if hooks.get(k)},
                   seccomp=linux.get("seccomp"), resources=linux.get("resources") or {},
                   personality=spec.linux.personality, systemd_cgroup=systemd_cgroup)

    @property
    def userns(self) -> bool:
        return "user" in self.namespaces

    def hooks_of(self, kind: str) -> tuple[Hook, ...]:
        """The typed hooks of one of LATER_HOOKS; the spec parser is imported only when there are some."""
        if not self.hooks.get(kind):
            return ()
        from pyruntime.oci.spec import hooks_of
        return hooks_of({"hooks": {kind: self.hooks[kind]}}).get(kind, ())

    def process_spec(self) -> Process:
        from pyruntime.oci.spec import process_from_json
        return process_from_json(self.process)

    def seccomp_spec(self) -> Seccomp | None:
        if not self.seccomp:
            return None
        from pyruntime.linux.seccomp.profile import Seccomp
        return Seccomp.from_spec(self.seccomp)

    def resources_spec(self) -> Resources:
        from pyruntime.linux.cgroups.resources import Resources
        return Resources.from_spec(self.resources)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"ContainerState({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"

    def to_json(self) -> dict:
        return {"version": RECORD_VERSION, **{k: getattr(self, k) for k in self.FIELDS}}

    @classmethod
    def from_json(cls, raw: object) -> ContainerState:
        """Raises ValueError naming what is wrong: a record of another version, or a malformed one."""
        if not isinstance(raw, dict):
            raise ValueError(f"must be a JSON object, got {type(raw).__name__}")
        version = raw.get("version")
        if version != RECORD_VERSION:
            raise ValueError(f"record version {version!r}, this pyruntime reads version {RECORD_VERSION} "
                             "(written by another pyruntime?)")
        missing = [k for k in ("id", "bundle", "rootfs") if k not in raw]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        try:
            return cls(**{k: raw[k] for k in cls.FIELDS if k in raw})
        except TypeError as e:
            raise ValueError(str(e)) from e


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
