"""config.json as typed objects, each field's shape checked once at the edge.

`load_bundle` is the only way the runtime reads a configuration: it parses, checks the type and range
of every field it uses and raises `SpecError` naming the field (`process.user.uid: must be an
integer`), so the life-cycle code below trusts these objects and never re-checks a dict. Every section
is read through pyruntime.fieldreader; those that belong to a kernel subsystem (capabilities, seccomp,
cgroup resources) are parsed beside that subsystem and called from here. What depends on several
fields or on the host (namespaces a sysctl needs, paths that must exist, the cgroup driver) is checked
by oci/validate.py, which `create` runs before it claims anything.
"""
from __future__ import annotations

import os

from pyruntime import fastjson
from pyruntime.fieldreader import Obj, SpecError, check_range, check_type, cpu_set
from pyruntime.record import Factory, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAMESPACE_TYPES = ("pid", "network", "mount", "ipc", "uts", "user", "cgroup", "time")
RLIMIT_NAMES = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_LOCKS",
                "RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
                "RLIMIT_RSS", "RLIMIT_RTPRIO", "RLIMIT_RTTIME", "RLIMIT_SIGPENDING", "RLIMIT_STACK")
SCHED_POLICIES = ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH", "SCHED_ISO", "SCHED_IDLE",
                  "SCHED_DEADLINE")
SCHED_FLAGS = ("SCHED_FLAG_RESET_ON_FORK", "SCHED_FLAG_RECLAIM", "SCHED_FLAG_DL_OVERRUN", "SCHED_FLAG_KEEP_POLICY",
               "SCHED_FLAG_KEEP_PARAMS", "SCHED_FLAG_UTIL_CLAMP_MIN", "SCHED_FLAG_UTIL_CLAMP_MAX")
IOPRIO_CLASSES = ("IOPRIO_CLASS_RT", "IOPRIO_CLASS_BE", "IOPRIO_CLASS_IDLE")
PERSONALITY_DOMAINS = ("LINUX", "LINUX32")
HOOK_KINDS = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
PROPAGATIONS = ("", "private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable")
UINT32_MAX = 2**32 - 1


def warn(message: str) -> None:
    """The spec's warnings (e.g. a capability this kernel lacks): reported, and the operation goes on."""
    import sys
    sys.stderr.write(f"pyruntime: warning: {message}\n")


@record
class User:
    uid: int = 0
    gid: int = 0
    umask: int | None = None
    additional_gids: tuple[int, ...] = ()


@record
class Rlimit:
    type: str
    soft: int
    hard: int


@record
class ExecCPUAffinity:
    """process.execCPUAffinity, for a process that `exec` starts (never the init): `initial` while it joins the
    container (before its cgroup), `final` from then on. None: not given."""
    initial: frozenset[int] | None = None
    final: frozenset[int] | None = None


@record
class Scheduler:
    """process.scheduler: sched_setattr(2)'s attributes, checked as runc checks them."""
    policy: str
    nice: int = 0
    priority: int = 0
    flags: tuple[str, ...] = ()
    runtime: int = 0
    deadline: int = 0
    period: int = 0


@record
class IOPriority:
    klass: str  # IOPRIO_CLASS_RT, _BE or _IDLE
    priority: int = 0


@record
class Process:
    args: tuple[str, ...]
    cwd: str
    env: tuple[str, ...] = ()
    terminal: bool = False
    console_size: tuple[int, int] | None = None
    user: User = User()
    rlimits: tuple[Rlimit, ...] = ()
    capabilities: Any = None
    no_new_privileges: bool = False
    oom_score_adj: int | None = None
    apparmor_profile: str | None = None
    selinux_label: str | None = None
    scheduler: Scheduler | None = None
    io_priority: IOPriority | None = None
    exec_cpu_affinity: ExecCPUAffinity | None = None


@record
class Root:
    path: str
    readonly: bool = False


@record
class Mount:
    destination: str
    type: str | None = None
    source: str | None = None
    options: tuple[str, ...] = ()
    uid_mappings: tuple[IDMapping, ...] = ()
    gid_mappings: tuple[IDMapping, ...] = ()


@record
class Hook:
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@record
class Namespace:
    type: str
    path: str | None = None


@record
class IDMapping:
    container_id: int
    host_id: int
    size: int


@record
class Device:
    type: str
    path: str
    major: int = 0
    minor: int = 0
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@record
class Linux:
    namespaces: tuple[Namespace, ...] = ()
    uid_mappings: tuple[IDMapping, ...] = ()
    gid_mappings: tuple[IDMapping, ...] = ()
    devices: tuple[Device, ...] = ()
    cgroups_path: str = ""
    resources: Any = None
    sysctl: dict[str, str] = Factory(dict)
    seccomp: Any = None
    rootfs_propagation: str = ""
    masked_paths: tuple[str, ...] = ()
    readonly_paths: tuple[str, ...] = ()
    mount_label: str | None = None
    personality: str | None = None  # linux.personality.domain: LINUX or LINUX32

    def namespace(self, kind: str) -> Namespace | None:
        for ns in self.namespaces:
            if ns.type == kind:
                return ns
        return None


@record
class Spec:
    oci_version: str
    root: Root
    process: Process | None
    hostname: str | None
    domainname: str | None
    mounts: tuple[Mount, ...]
    hooks: dict[str, tuple[Hook, ...]]
    annotations: dict[str, str]
    linux: Linux
    raw: dict = Factory(dict, compare=False)


def _abs(path: str, name: str) -> str:
    if not path.startswith("/"):
        raise SpecError(f"{name}: must be an absolute path, got {path!r}")
    return path


def _id_mappings(o: Obj, key: str) -> tuple[IDMapping, ...]:
    return tuple(IDMapping(m.int("containerID", required=True, lo=0, hi=UINT32_MAX),
                           m.int("hostID", required=True, lo=0, hi=UINT32_MAX),
                           m.int("size", required=True, lo=1, hi=UINT32_MAX)) for m in o.objs(key))


def parse_user(u: Obj | None) -> User:
    if u is None:
        return User()
    gids = u.list("additionalGids")
    for i, g in enumerate(gids):
        check_range(check_type(g, f"{u.path}.additionalGids[{i}]", int), f"{u.path}.additionalGids[{i}]", 0,
                    UINT32_MAX)
    return User(u.int("uid", 0, lo=0, hi=UINT32_MAX), u.int("gid", 0, lo=0, hi=UINT32_MAX),
                u.int("umask", None, lo=0, hi=0o7777), tuple(gids))


def parse_process(p: Obj) -> Process:
    args = p.strings("args")
    if not args:
        raise SpecError(f"{p.path}.args: must name the program to run")
    cwd = _abs(p.str("cwd", required=True), f"{p.path}.cwd")
    for i, e in enumerate(p.strings("env")):
        if "=" not in e:
            raise SpecError(f"{p.path}.env[{i}]: {e!r} is not KEY=VALUE")
    rlimits, seen = [], set()
    for r in p.objs("rlimits"):
        kind = r.choice("type", RLIMIT_NAMES, "rlimit", required=True)
        if kind in seen:
            raise SpecError(f"{r.path}.type: duplicate rlimit {kind}")
        seen.add(kind)
        rlimits.append(Rlimit(kind, r.int("soft", required=True, lo=0, hi=2**64 - 1),
                              r.int("hard", required=True, lo=0, hi=2**64 - 1)))
    caps = None
    c = p.obj("capabilities")
    if c is not None:
        from pyruntime.linux.capabilities import Capabilities
        caps = Capabilities.from_spec(c.raw, where=c.path, warn=warn)
    size = p.obj("consoleSize")
    io = p.obj("ioPriority")
    return Process(
        args=args, cwd=cwd, env=p.strings("env"), terminal=p.bool("terminal"),
        console_size=(size.int("height", 0, lo=0), size.int("width", 0, lo=0)) if size else None,
        user=parse_user(p.obj("user")), rlimits=tuple(rlimits), capabilities=caps,
        no_new_privileges=p.bool("noNewPrivileges"), oom_score_adj=p.int("oomScoreAdj", None, lo=-1000, hi=1000),
        apparmor_profile=p.str("apparmorProfile"), selinux_label=p.str("selinuxLabel"),
        scheduler=_scheduler(p.obj("scheduler")),
        io_priority=IOPriority(io.choice("class", IOPRIO_CLASSES, "I/O priority class", required=True),
                               io.int("priority", 0, lo=0, hi=7)) if io is not None else None,
        exec_cpu_affinity=_exec_cpu_affinity(p.obj("execCPUAffinity")))


def _exec_cpu_affinity(o: Obj | None) -> ExecCPUAffinity | None:
    """Each an affinity the kernel can take: a CPU list that names at least one CPU."""
    if o is None:
        return None
    sets: dict[str, frozenset[int]] = {}
    for key in ("initial", "final"):
        text = o.cpu_list(key)
        if text is not None:
            sets[key] = cpu_set(text)
            if not sets[key]:
                raise SpecError(f"{o.name(key)}: names no CPU")
    return ExecCPUAffinity(sets.get("initial"), sets.get("final"))


def _scheduler(o: Obj | None) -> Scheduler | None:
    """runc's checks (libcontainer/configs/validate), each naming the field."""
    if o is None:
        return None
    policy = o.choice("policy", SCHED_POLICIES, "scheduling policy", required=True)
    flags = o.strings("flags")
    for i, flag in enumerate(flags):
        if flag not in SCHED_FLAGS:
            raise SpecError(f"{o.path}.flags[{i}]: unknown scheduler flag {flag!r}")
    s = Scheduler(policy, o.int("nice", 0), o.int("priority", 0, lo=0, hi=99), flags, o.int("runtime", 0, lo=0),
                  o.int("deadline", 0, lo=0), o.int("period", 0, lo=0))
    if policy in ("SCHED_OTHER", "SCHED_BATCH") and not -20 <= s.nice <= 19:
        raise SpecError(f"{o.path}.nice: {s.nice} is invalid when the policy is {policy} (-20..19)")
    if s.priority and policy not in ("SCHED_FIFO", "SCHED_RR"):
        raise SpecError(f"{o.path}.priority: can only be set for SCHED_FIFO or SCHED_RR, not {policy}")
    if policy != "SCHED_DEADLINE" and (s.runtime or s.deadline or s.period):
        raise SpecError(f"{o.path}: runtime/deadline/period can only be set for SCHED_DEADLINE, not {policy}")
    return s


def process_from_json(raw: Any) -> Process:
    """A process object on its own, as `exec --process FILE` gives it."""
    return parse_process(Obj(raw, "process"))


def _mounts(o: Obj) -> tuple[Mount, ...]:
    out = []
    for m in o.objs("mounts"):
        dest = m.str("destination", required=True)
        if not dest:
            raise SpecError(f"{m.path}.destination: must be a path inside the container, got ''")
        # relative: deprecated, but the runtime spec has it taken as relative to "/" (runc too)
        out.append(Mount(dest if dest.startswith("/") else "/" + dest, m.str("type"), m.str("source"),
                         m.strings("options"), _id_mappings(m, "uidMappings"), _id_mappings(m, "gidMappings")))
    return tuple(out)


def _hooks(o: Obj | None) -> dict[str, tuple[Hook, ...]]:
    hooks: dict[str, tuple[Hook, ...]] = {}
    if o is None:
        return hooks
    for kind in HOOK_KINDS:
        hooks[kind] = tuple(Hook(_abs(h.str("path", required=True), f"{h.path}.path"), h.strings("args"),
                                 h.strings("env"), h.int("timeout", None, lo=1)) for h in o.objs(kind))
    return hooks


def hooks_of(config: dict) -> dict[str, tuple[Hook, ...]]:
    """The hooks of a config.json kept in the container's state (it was validated at create)."""
    return _hooks(Obj(config["hooks"], "hooks")) if config.get("hooks") else {}


def _linux(o: Obj | None) -> Linux:
    if o is None:
        return Linux()
    namespaces, seen = [], set()
    for n in o.objs("namespaces"):
        kind = n.choice("type", NAMESPACE_TYPES, "namespace type", required=True)
        if kind in seen:
            raise SpecError(f"{n.path}.type: duplicate namespace {kind!r}")
        seen.add(kind)
        path = n.str("path")
        namespaces.append(Namespace(kind, _abs(path, f"{n.path}.path") if path else None))
    uid_maps, gid_maps = _id_mappings(o, "uidMappings"), _id_mappings(o, "gidMappings")
    devices = []
    for d in o.objs("devices"):
        kind = d.choice("type", ("c", "b", "u", "p"), "device type", required=True)
        devices.append(Device(kind, _abs(d.str("path", required=True), f"{d.path}.path"),
                              d.int("major", 0, lo=0, required=kind != "p"),
                              d.int("minor", 0, lo=0, required=kind != "p"),
                              d.int("fileMode", None, lo=0, hi=0o7777), d.int("uid", None, lo=0, hi=UINT32_MAX),
                              d.int("gid", None, lo=0, hi=UINT32_MAX)))
    resources = None
    r = o.obj("resources")
    if r is not None:
        from pyruntime.linux.cgroups.resources import Resources
        resources = Resources.from_spec(r.raw, where=r.path)
    seccomp = None
    s = o.obj("seccomp")
    if s is not None:
        from pyruntime.linux.seccomp.profile import Seccomp
        seccomp = Seccomp.from_spec(s.raw, where=s.path)
    propagation = o.choice("rootfsPropagation", PROPAGATIONS, "propagation", "")
    personality = None
    per = o.obj("personality")
    if per is not None:
        personality = per.choice("domain", PERSONALITY_DOMAINS, "personality domain", required=True)
        if per.strings("flags"):
            raise SpecError(f"{per.path}.flags: personality flags are not supported (runc supports none either)")
    for unsupported in ("intelRdt", "netDevices", "memoryPolicy", "timeOffsets"):
        if o.raw.get(unsupported):
            raise SpecError(f"linux.{unsupported}: not supported by pyruntime")
    return Linux(tuple(namespaces), uid_maps, gid_maps, tuple(devices), o.str("cgroupsPath", ""), resources,
                 o.str_map("sysctl"), seccomp, propagation, o.strings("maskedPaths"),
                 o.strings("readonlyPaths"), o.str("mountLabel"), personality)


def parse(raw: Any, bundle: str) -> Spec:
    """A validated Spec from the decoded config.json of the bundle at `bundle` (used for relative paths)."""
    top = Obj(raw, "")
    version = top.str("ociVersion", required=True)
    if not version.startswith("1."):
        raise SpecError(f"ociVersion: unsupported version {version!r} (pyruntime implements 1.x)")
    root = top.obj("root", required=True)
    root_path = root.str("path", required=True)
    proc = top.obj("process")
    hostname = top.str("hostname")
    linux = _linux(top.obj("linux"))
    return Spec(
        oci_version=version,
        root=Root(os.path.normpath(os.path.join(bundle, root_path)), root.bool("readonly")),
        process=parse_process(proc) if proc is not None else None,
        hostname=hostname, domainname=top.str("domainname"), mounts=_mounts(top),
        hooks=_hooks(top.obj("hooks")), annotations=top.str_map("annotations"), linux=linux, raw=raw)


def load_bundle(bundle: str) -> Spec:
    """Reads and validates BUNDLE/config.json; every failure names the file or the field."""
    bundle = os.path.abspath(bundle)
    path = os.path.join(bundle, "config.json")
    try:
        with open(path, "rb") as f:
            raw = fastjson.load(f)
    except FileNotFoundError as e:
        raise SpecError(f"{path}: no such file (is {bundle} an OCI bundle?)") from e
    except OSError as e:
        raise SpecError(f"{path}: {e.strerror}") from e
    except ValueError as e:  # json.JSONDecodeError, or bytes that are not text
        raise SpecError(f"{path}: invalid JSON: {e}") from e
    spec = parse(raw, bundle)
    if not os.path.isdir(spec.root.path):
        raise SpecError(f"root.path: rootfs {spec.root.path} does not exist or is not a directory")
    return spec
