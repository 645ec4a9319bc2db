"""A CRI CreateContainer request, its pod and its image, turned into the config.json pyruntime runs.

What a container gets is decided here and only here, following containerd's CRI plugin (the behaviour
kubelets, critest and workloads were written against): Kubernetes' command/args over the image's
Entrypoint/Cmd, the image's env under the request's, the user the request or the image names (names
looked up in the image's own /etc/passwd and /etc/group), the pod's namespaces joined by path, the
pod's resolv.conf/hosts/hostname, and containerd's defaults for capabilities, masked paths and seccomp.

Threat model: the request comes from the kubelet (trusted to ask, not to be well formed: every field
is checked and an error names its CRI field path, `config.linux.security_context.run_as_username: ...`),
and the image is untrusted: its /etc/passwd is read through openat2(RESOLVE_IN_ROOT) so a symlink
planted in the image cannot make us read a host file, and its size is bounded. The resulting dict is
still validated by pyruntime itself (oci/spec.py, oci/validate.py) at create time.
"""
from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Iterable

from proto import api_pb2
from pyruntime.cri.jobs import CGROUP_PREFIX
from pyruntime.cri.model import Layout, SandboxRecord
from pyruntime.cri.seccomp_default import DEFAULT_CAPS
from pyruntime.errors import InternalError, InvalidArgumentError

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MASKED_PATHS = ("/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                "/sys/devices/virtual/powercap", "/proc/scsi")
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
MAX_ID_FILE = 4 << 20  # /etc/passwd and /etc/group of an image larger than this are refused

# annotations containerd's CRI sets on a container's spec (pkg/cri/annotations)
ANN_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
ANN_CONTAINER_NAME = "io.kubernetes.cri.container-name"
ANN_SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
ANN_SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
ANN_SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
ANN_SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
ANN_IMAGE_NAME = "io.kubernetes.cri.image-name"

NS = api_pb2.NamespaceMode
SC = "config.linux.security_context"
PROPAGATION = {api_pb2.PROPAGATION_PRIVATE: "rprivate", api_pb2.PROPAGATION_HOST_TO_CONTAINER: "rslave",
               api_pb2.PROPAGATION_BIDIRECTIONAL: "rshared"}
HOST_DEV_SKIP = ("/dev/pts", "/dev/shm", "/dev/fd", "/dev/mqueue", "/dev/console")

TargetResolver = Callable[[str], str]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyruntime.linux.syscalls import Syscalls


def container_spec(config: api_pb2.ContainerConfig, sandbox: SandboxRecord, sandbox_config: api_pb2.PodSandboxConfig,
                   image: dict, rootfs: str, *, layout: Layout, cgroup_driver: str, container_id: str,
                   kernel: Syscalls, target_pid_ns: TargetResolver | None = None) -> dict:
    """The config.json of a container (root.path is `rootfs`). `image`: the OCI image config blob
    ({"config": {...}}). `cgroup_driver`: "cgroupfs" or "systemd". `kernel`: the syscall layer the image's
    /etc/passwd and /etc/group are opened through. `target_pid_ns(container_id)`: the pid namespace path
    of another container, for a NamespaceOption pid mode of TARGET."""
    img = image.get("config") or {}
    sc = config.linux.security_context
    privileged = sc.privileged
    if privileged and not sandbox_config.linux.security_context.privileged:
        raise InvalidArgumentError(f"{SC}.privileged: the pod sandbox is not privileged")
    env = _env(config, img, sandbox_config)
    process: dict = {
        "terminal": config.tty,
        "args": _args(config, img),
        "cwd": config.working_dir or img.get("WorkingDir") or "/",
        "noNewPrivileges": sc.no_new_privs,
        "oomScoreAdj": restricted_oom_score_adj(config.linux.resources.oom_score_adj),
    }
    if not process["cwd"].startswith("/"):
        raise InvalidArgumentError(f"config.working_dir: {process['cwd']!r} must be an absolute path")
    user, home = resolve_user(sc, img.get("User") or "", rootfs, kernel)
    process["user"] = user
    if not any(e.startswith("HOME=") for e in env):
        env.append(f"HOME={home}")
    process["env"] = env
    caps = _capabilities(sc, privileged)
    process["capabilities"] = caps
    _apparmor(sc)
    ipc_host = "ipc" not in sandbox.namespaces
    linux: dict = {
        "namespaces": _namespaces(sc, sandbox, privileged, target_pid_ns),
        "resources": linux_resources(config.linux.resources),
        "cgroupsPath": cgroups_path(sandbox.cgroup_parent, container_id, cgroup_driver),
        "maskedPaths": [] if privileged else list(sc.masked_paths or MASKED_PATHS),
        "readonlyPaths": [] if privileged else list(sc.readonly_paths or READONLY_PATHS),
    }
    _user_namespace(sandbox, sandbox_config, linux)
    seccomp = _seccomp(sc, privileged, caps["bounding"])
    if seccomp is not None:
        linux["seccomp"] = seccomp
    mounts = _default_mounts(privileged)
    cri_mounts, propagation = _cri_mounts(config, layout.sandbox_dir(sandbox.id), ipc_host, sc.readonly_rootfs,
                                          lambda i: image_volume_dir(layout, container_id, i))
    overridden = {m["destination"] for m in cri_mounts}
    mounts = [m for m in mounts if m["destination"] not in overridden
              and not ("/dev" in overridden and m["destination"].startswith("/dev/"))]
    linux["devices"] = _devices(config, linux["resources"], privileged)
    if propagation:
        linux["rootfsPropagation"] = propagation
    return {
        "ociVersion": "1.2.1",
        "process": process,
        "root": {"path": rootfs, "readonly": sc.readonly_rootfs},
        "mounts": mounts + cri_mounts,
        "annotations": _annotations(config, sandbox, sandbox_config),
        "linux": linux,
    }


# ---- process --------------------------------------------------------------------------------------------------

def _args(config: api_pb2.ContainerConfig, img: dict) -> list[str]:
    """Kubernetes' rule: command replaces the Entrypoint (and drops Cmd); args alone replace Cmd."""
    entrypoint, cmd = list(img.get("Entrypoint") or []), list(img.get("Cmd") or [])
    if config.command:
        args = list(config.command) + list(config.args)
    elif config.args:
        args = entrypoint + list(config.args)
    else:
        args = entrypoint + cmd
    if not args:
        raise InvalidArgumentError("config.command: no command given and the image has no Entrypoint or Cmd")
    return args


def _merge_env(env: list[str], entries: Iterable[str]) -> None:
    """Appends each KEY=VALUE, replacing an earlier entry of the same key in place."""
    index = {e.partition("=")[0]: i for i, e in enumerate(env)}
    for entry in entries:
        key = entry.partition("=")[0]
        if key in index:
            env[index[key]] = entry
        else:
            index[key] = len(env)
            env.append(entry)


def _env(config: api_pb2.ContainerConfig, img: dict, sandbox_config: api_pb2.PodSandboxConfig) -> list[str]:
    env = [DEFAULT_PATH]
    _merge_env(env, [f"HOSTNAME={sandbox_config.hostname or socket.gethostname()}"])
    _merge_env(env, [e for e in img.get("Env") or [] if "=" in e])
    entries = []
    for i, kv in enumerate(config.envs):
        if not kv.key or "=" in kv.key or "\0" in kv.key:
            raise InvalidArgumentError(f"config.envs[{i}].key: {kv.key!r} is not an environment variable name")
        try:
            value = kv.value.decode()
        except UnicodeDecodeError as e:
            raise InvalidArgumentError(f"config.envs[{i}].value: not UTF-8: {e}") from e
        if "\0" in value:
            raise InvalidArgumentError(f"config.envs[{i}].value: contains a NUL byte")
        entries.append(f"{kv.key}={value}")
    _merge_env(env, entries)
    return env


def restricted_oom_score_adj(requested: int) -> int:
    """containerd's restrict_oom_score_adj: a container (or sandbox) never gets a lower score than the server
    itself, so it cannot make itself less likely to be OOM-killed than the node's own daemons."""
    if not -1000 <= requested <= 1000:
        raise InvalidArgumentError(f"config.linux.resources.oom_score_adj: {requested} is outside -1000..1000")
    try:
        with open("/proc/self/oom_score_adj") as f:
            own = int(f.read())
    except (OSError, ValueError):
        own = -1000
    return max(requested, own)


# ---- user ---------------------------------------------------------------------------------------------------

def _read_in_root(rootfs: str, path: str, kernel: Syscalls) -> list[list[str]]:
    """The colon-separated entries of `path` inside the image; a missing file has none."""
    from pyruntime.linux.resolve import open_in_root
    from pyruntime.linux.syscalls import SyscallError
    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = open_in_root(kernel, root_fd, path, os.O_RDONLY | os.O_CLOEXEC)
    except SyscallError:
        return []
    finally:
        os.close(root_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return []
        data = f.read(MAX_ID_FILE + 1)
    if len(data) > MAX_ID_FILE:
        raise InvalidArgumentError(f"image {path}: larger than {MAX_ID_FILE} bytes")
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines()
            if line and not line.startswith("#")]


def _id(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) < 2**32 else None


def resolve_user(sc: api_pb2.LinuxContainerSecurityContext, image_user: str, rootfs: str,
                 kernel: Syscalls) -> tuple[dict, str]:
    """process.user and HOME for a container: the request's run_as_username / run_as_user / run_as_group, else
    the image's USER, names looked up in the image; the supplemental groups per the policy (Merge: the user's
    groups in the image's /etc/group too)."""
    if sc.HasField("run_as_user") and not 0 <= sc.run_as_user.value < 2**32:
        raise InvalidArgumentError(f"{SC}.run_as_user: {sc.run_as_user.value} is not a uid")
    if sc.HasField("run_as_group") and not 0 <= sc.run_as_group.value < 2**32:
        raise InvalidArgumentError(f"{SC}.run_as_group: {sc.run_as_group.value} is not a gid")
    if sc.run_as_username:
        name, where = sc.run_as_username, f"{SC}.run_as_username"
    elif sc.HasField("run_as_user"):
        name, where = str(sc.run_as_user.value), f"{SC}.run_as_user"
    else:
        name, where = "", ""
    group, group_where = "", ""
    if sc.HasField("run_as_group"):
        if not name:
            raise InvalidArgumentError(f"{SC}.run_as_group: a group needs run_as_user or run_as_username")
        group, group_where = str(sc.run_as_group.value), f"{SC}.run_as_group"
    if not name and image_user:
        name, _, group = image_user.partition(":")
        where = group_where = "image config User"
    passwd = _read_in_root(rootfs, "/etc/passwd", kernel)
    uid = _id(name) if name else 0
    entry = None
    if uid is None:
        entry = next((p for p in passwd if len(p) >= 7 and p[0] == name), None)
        if entry is None or _id(entry[2]) is None or _id(entry[3]) is None:
            raise InvalidArgumentError(f"{where}: no user {name!r} in the image's /etc/passwd")
        uid = _id(entry[2])
    else:
        entry = next((p for p in passwd if len(p) >= 7 and _id(p[2]) == uid and _id(p[3]) is not None), None)
    assert uid is not None
    gid = _id(entry[3]) if entry else 0
    groups = None
    if group:
        gid = _id(group)
        if gid is None:
            groups = _read_in_root(rootfs, "/etc/group", kernel)
            found = next((g for g in groups if len(g) >= 3 and g[0] == group and _id(g[2]) is not None), None)
            if found is None:
                raise InvalidArgumentError(f"{group_where}: no group {group!r} in the image's /etc/group")
            gid = _id(found[2])
    assert gid is not None
    additional = [gid]
    if sc.supplemental_groups_policy != api_pb2.Strict and entry is not None:
        username = entry[0]
        for g in groups if groups is not None else _read_in_root(rootfs, "/etc/group", kernel):
            member_gid = _id(g[2]) if len(g) >= 4 and g[0] != username and username in g[3].split(",") else None
            if member_gid is not None:
                additional.append(member_gid)
    for i, g in enumerate(sc.supplemental_groups):
        if not 0 <= g < 2**32:
            raise InvalidArgumentError(f"{SC}.supplemental_groups[{i}]: {g} is not a gid")
        additional.append(g)
    unique = list(dict.fromkeys(additional))
    home = entry[5] if entry and entry[5] else "/"
    return {"uid": uid, "gid": gid, "additionalGids": unique}, home


# ---- capabilities, seccomp, apparmor -----------------------------------------------------------------------

def _all_caps() -> list[str]:
    """"ALL" (and privileged) means what this daemon holds, as containerd's cap.Current(): a capability the
    host withholds from us (CAP_SYS_RESOURCE on some VMs) cannot be granted, and asking for it would put the
    runtime's warning on the container's stderr."""
    from pyruntime.linux.capabilities import CAPABILITIES, last_cap
    last = last_cap()
    held = _bounding_mask()
    return [n for n, v in CAPABILITIES.items() if v <= last and held >> v & 1]


def _bounding_mask() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                return int(line.split()[1], 16)
    raise InternalError("/proc/self/status: no CapBnd line")


def _cap_name(name: str, where: str) -> str:
    from pyruntime.linux.capabilities import CAPABILITIES
    full = name.upper() if name.upper().startswith("CAP_") else "CAP_" + name.upper()
    if full not in CAPABILITIES:
        raise InvalidArgumentError(f"{where}: unknown capability {name!r}")
    return full


def _capabilities(sc: api_pb2.LinuxContainerSecurityContext, privileged: bool) -> dict:
    """containerd's order: "ALL" added/dropped first, so ALL plus a drop of one, or a drop of ALL plus an
    add of one, do what they say."""
    caps = _all_caps() if privileged else list(DEFAULT_CAPS)
    ambient: list[str] = []
    if sc.HasField("capabilities"):
        c = sc.capabilities
        where = f"{SC}.capabilities"
        if any(x.upper() == "ALL" for x in c.add_capabilities):
            caps = _all_caps()
        if any(x.upper() == "ALL" for x in c.drop_capabilities):
            caps = []
        for i, x in enumerate(c.add_capabilities):
            if x.upper() != "ALL" and (name := _cap_name(x, f"{where}.add_capabilities[{i}]")) not in caps:
                caps.append(name)
        for i, x in enumerate(c.drop_capabilities):
            if x.upper() != "ALL":
                name = _cap_name(x, f"{where}.drop_capabilities[{i}]")
                caps = [k for k in caps if k != name]
        for i, x in enumerate(c.add_ambient_capabilities):
            name = _cap_name(x, f"{where}.add_ambient_capabilities[{i}]")
            ambient.append(name)
            if name not in caps:
                caps.append(name)
    out = {k: list(caps) for k in ("bounding", "effective", "permitted")}
    if ambient:
        out["ambient"] = ambient
        out["inheritable"] = list(ambient)
    return out


def _profile(sc: api_pb2.LinuxContainerSecurityContext, field: str, legacy: str) -> tuple[str, str, str]:
    """(kind, localhost path, field path) of the seccomp or apparmor profile; kind "" when none is asked."""
    if sc.HasField(field):
        p = getattr(sc, field)
        kind = api_pb2.SecurityProfile.ProfileType.Name(p.profile_type)
        return kind, p.localhost_ref, f"{SC}.{field}"
    old = getattr(sc, legacy)
    where = f"{SC}.{legacy}"
    if not old:
        return "", "", where
    if old in ("runtime/default", "docker/default"):
        return "RuntimeDefault", "", where
    if old == "unconfined":
        return "Unconfined", "", where
    if old.startswith("localhost/"):
        return "Localhost", old.removeprefix("localhost/"), where
    raise InvalidArgumentError(f"{where}: unknown profile {old!r}")


def _seccomp(sc: api_pb2.LinuxContainerSecurityContext, privileged: bool, bounding: list[str]) -> dict | None:
    """None (unconfined) for a privileged container or when no profile is asked for, as containerd."""
    kind, path, where = _profile(sc, "seccomp", "seccomp_profile_path")
    if privileged or kind in ("", "Unconfined"):
        return None
    if kind == "RuntimeDefault":
        from pyruntime.cri.seccomp_default import default_profile
        return default_profile(bounding)
    if not path.startswith("/"):
        raise InvalidArgumentError(f"{where}: localhost profile {path!r} must be an absolute path")
    import json
    try:
        with open(path, "rb") as f:
            profile = json.load(f)
    except OSError as e:
        raise InvalidArgumentError(f"{where}: cannot read seccomp profile {path}: {e.strerror}") from e
    except ValueError as e:
        raise InvalidArgumentError(f"{where}: seccomp profile {path} is not JSON: {e}") from e
    if not isinstance(profile, dict):
        raise InvalidArgumentError(f"{where}: seccomp profile {path} is not a JSON object")
    from pyruntime.fieldreader import SpecError
    from pyruntime.linux.seccomp.profile import Seccomp
    try:
        Seccomp.from_spec(profile, where=f"{where} ({path})")
    except SpecError as e:
        raise InvalidArgumentError(str(e)) from e
    return profile


def _apparmor(sc: api_pb2.LinuxContainerSecurityContext) -> None:
    """pyruntime has no AppArmor: a RuntimeDefault request is met as containerd meets it on a host without
    AppArmor (nothing to apply); a named profile can't be honoured and is refused."""
    kind, path, where = _profile(sc, "apparmor", "apparmor_profile")
    if kind == "Localhost":
        raise InvalidArgumentError(f"{where}: AppArmor profile {path!r} requested, but pyruntime-cri does not "
                                   "support AppArmor")


# ---- namespaces -----------------------------------------------------------------------------------------------

def _namespaces(sc: api_pb2.LinuxContainerSecurityContext, sandbox: SandboxRecord, privileged: bool,
                target_pid_ns: TargetResolver | None) -> list[dict]:
    """The pod's net/ipc/uts by path (absent in the record: the host's), pid as the request says, a new mount
    namespace, and a cgroup namespace on cgroup v2 for unprivileged containers (containerd's rule)."""
    out = [{"type": "mount"}]
    for kind, spec_type in (("net", "network"), ("ipc", "ipc"), ("uts", "uts")):
        if kind in sandbox.namespaces:
            out.append({"type": spec_type, "path": sandbox.namespaces[kind]})
    opts = sc.namespace_options
    mode = opts.pid
    where = f"{SC}.namespace_options"
    if mode == NS.POD:
        pod_pid = sandbox.namespaces.get("pid")
        out.append({"type": "pid", "path": pod_pid} if pod_pid else {"type": "pid"})
    elif mode == NS.CONTAINER:
        out.append({"type": "pid"})
    elif mode == NS.TARGET:
        if not opts.target_id:
            raise InvalidArgumentError(f"{where}.target_id: required for pid mode TARGET")
        if target_pid_ns is None:
            raise InvalidArgumentError(f"{where}.pid: TARGET is not supported here")
        out.append({"type": "pid", "path": target_pid_ns(opts.target_id)})
    elif mode != NS.NODE:
        raise InvalidArgumentError(f"{where}.pid: unknown mode {mode}")
    if not privileged and _unified_host():
        out.append({"type": "cgroup"})
    return out


def _user_namespace(sandbox: SandboxRecord, sandbox_config: api_pb2.PodSandboxConfig, linux: dict) -> None:
    """Joins the pod's user namespace with its id maps when the pod asks for one (mode POD)."""
    ns_options = sandbox_config.linux.security_context.namespace_options
    opts = ns_options.userns_options
    where = "sandbox_config.linux.security_context.namespace_options.userns_options"
    if not ns_options.HasField("userns_options") or opts.mode == NS.NODE:
        return
    if opts.mode != NS.POD:
        raise InvalidArgumentError(f"{where}.mode: only NODE and POD user namespaces exist for a pod")
    if not opts.uids or not opts.gids:
        raise InvalidArgumentError(f"{where}: a POD user namespace needs uids and gids mappings")
    path = sandbox.namespaces.get("user")
    if not path:
        raise InvalidArgumentError(f"{where}.mode: the pod sandbox has no user namespace to join")
    linux["namespaces"].append({"type": "user", "path": path})
    for key, maps in (("uidMappings", opts.uids), ("gidMappings", opts.gids)):
        linux[key] = [{"containerID": m.container_id, "hostID": m.host_id, "size": m.length} for m in maps]


# ---- mounts and devices -------------------------------------------------------------------------------------

def _default_mounts(privileged: bool) -> list[dict]:
    rw = "rw" if privileged else "ro"
    return [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", rw]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", rw]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    ]


def _pod_mounts(config: api_pb2.ContainerConfig, sandbox_dir: str, ipc_host: bool,
                readonly: bool) -> list[api_pb2.Mount]:
    """The pod's files (those that exist) and /dev/shm: the host's for a host-IPC pod, the pod's tmpfs when the
    sandbox made one at sandbox_dir/shm, else the container's own (the default mount stays)."""
    out = []
    for name, dest in (("hostname", "/etc/hostname"), ("hosts", "/etc/hosts"), ("resolv.conf", "/etc/resolv.conf")):
        path = os.path.join(sandbox_dir, name)
        if os.path.exists(path):
            out.append(api_pb2.Mount(container_path=dest, host_path=path, readonly=readonly))
    shm = "/dev/shm" if ipc_host else os.path.join(sandbox_dir, "shm")
    if os.path.isdir(shm):
        out.append(api_pb2.Mount(container_path="/dev/shm", host_path=shm))
    requested = {os.path.normpath(m.container_path) for m in config.mounts}
    return [m for m in out if m.container_path not in requested]


def _check_propagation(source: str, want: str, where: str) -> None:
    """rshared needs a shared source mount and rslave a shared or slave one, or the container would not see
    (or make) the mounts it asks to."""
    from pynode_os import mountinfo
    m = mountinfo.mount_of(source, mountinfo.read())
    tags = m.optional if m else ()
    shared = any(t.startswith("shared:") for t in tags)
    slave = any(t.startswith("master:") for t in tags)
    if want == "rshared" and not shared:
        raise InvalidArgumentError(f"{where}: {source} is not on a shared mount, needed for BIDIRECTIONAL")
    if want == "rslave" and not (shared or slave):
        raise InvalidArgumentError(f"{where}: {source} is not on a shared or slave mount, needed for "
                                   "HOST_TO_CONTAINER")


def image_volume_dir(layout: Layout, container_id: str, index: int) -> str:
    """Where CreateContainer mounts the image of config.mounts[index] (an image volume) for the bind."""
    return os.path.join(layout.bundle(container_id), f"image-volume-{index}")


def _image_volume_source(m: api_pb2.Mount, root: str, where: str) -> str:
    """The image's root or its image_sub_path, which must lie inside it: a symlink out of the image is refused,
    not followed to the host."""
    if not m.readonly:
        raise InvalidArgumentError(f"{where}.readonly: an image volume must be read-only")
    if not m.image_sub_path:
        return root
    source = os.path.realpath(os.path.join(root, m.image_sub_path.lstrip("/")))
    if source != root and not source.startswith(root + "/"):
        raise InvalidArgumentError(f"{where}.image_sub_path: {m.image_sub_path!r} leaves the image")
    if not os.path.exists(source):
        raise InvalidArgumentError(f"{where}.image_sub_path: {m.image_sub_path!r} does not exist in image "
                                   f"{m.image.image}")
    return source


def _cri_mounts(config: api_pb2.ContainerConfig, sandbox_dir: str, ipc_host: bool, readonly_rootfs: bool,
                image_volume: Callable[[int], str]) -> tuple[list[dict], str]:
    """The request's mounts and the pod's, shallow first so none hides another; and the rootfs propagation
    the mounts need ("" for the default). `image_volume(i)`: where config.mounts[i]'s image is mounted."""
    indexed = [(f"config.mounts[{i}]", m, i) for i, m in enumerate(config.mounts)]
    indexed += [("pod mount " + m.container_path, m, -1) for m in _pod_mounts(config, sandbox_dir, ipc_host,
                                                                               readonly_rootfs)]
    indexed.sort(key=lambda e: len([p for p in os.path.normpath(e[1].container_path).split("/") if p]))
    out, rootfs_propagation = [], ""
    for where, m, index in indexed:
        if not m.container_path.startswith("/"):
            raise InvalidArgumentError(f"{where}.container_path: {m.container_path!r} must be an absolute path")
        if m.HasField("image") and m.image.image and index >= 0:
            source = _image_volume_source(m, os.path.realpath(image_volume(index)), where)
            out.append({"destination": os.path.normpath(m.container_path), "type": "bind", "source": source,
                        "options": ["rbind", "rprivate", "ro", "nosuid", "nodev"]})
            continue
        if not m.host_path.startswith("/"):
            raise InvalidArgumentError(f"{where}.host_path: {m.host_path!r} must be an absolute path")
        if bool(m.uidMappings) != bool(m.gidMappings):
            field = "gidMappings" if m.uidMappings else "uidMappings"
            raise InvalidArgumentError(f"{where}.{field}: an idmapped mount needs both uidMappings and gidMappings")
        source = m.host_path
        if not os.path.lexists(source):
            try:  # containerd makes a missing host path a directory (hostPath DirectoryOrCreate relies on it)
                os.makedirs(source, 0o755, exist_ok=True)
            except OSError as e:
                raise InvalidArgumentError(f"{where}.host_path: cannot create {source}: {e.strerror}") from e
        source = os.path.realpath(source)
        if m.propagation not in PROPAGATION:
            raise InvalidArgumentError(f"{where}.propagation: unknown propagation {m.propagation}")
        propagation = PROPAGATION[m.propagation]
        if propagation != "rprivate":
            _check_propagation(source, propagation, f"{where}.propagation")
            if propagation == "rshared" or rootfs_propagation != "rshared":
                rootfs_propagation = propagation
        options = ["rbind", propagation, "ro" if m.readonly else "rw"]
        if m.recursive_read_only:
            if not m.readonly:
                raise InvalidArgumentError(f"{where}.recursive_read_only: needs readonly")
            if propagation != "rprivate":
                raise InvalidArgumentError(f"{where}.recursive_read_only: needs PROPAGATION_PRIVATE")
            options.append("rro")
        for j, opt in enumerate(m.mount_options):
            if not opt or any(c in opt for c in ", \t\n\0"):
                raise InvalidArgumentError(f"{where}.mount_options[{j}]: {opt!r} is not a mount option")
            options.append(opt)
        mount = {"destination": os.path.normpath(m.container_path), "type": "bind", "source": source,
                 "options": options}
        if m.uidMappings:  # the stock kubelet idmaps every mount of a pod with a user namespace
            for key, maps in (("uidMappings", m.uidMappings), ("gidMappings", m.gidMappings)):
                mount[key] = [{"containerID": x.container_id, "hostID": x.host_id, "size": x.length} for x in maps]
        out.append(mount)
    return out, rootfs_propagation


def _device_of(path: str, container_path: str, where: str) -> dict | None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise InvalidArgumentError(f"{where}: {path}: {e.strerror}") from e
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return {"type": kind, "path": container_path, "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
            "fileMode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid}


def _walk_devices(host_dir: str, container_dir: str, where: str, skip: tuple[str, ...] = ()) -> list[dict]:
    out = []
    for dirpath, dirnames, filenames in os.walk(host_dir):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
        for name in sorted(filenames):
            host = os.path.join(dirpath, name)
            if host in skip or os.path.islink(host):
                continue
            try:
                dev = _device_of(host, container_dir + host[len(host_dir):], where)
            except InvalidArgumentError:
                continue  # a device node that vanished while walking
            if dev is not None:
                out.append(dev)
    return out


def _devices(config: api_pb2.ContainerConfig, resources: dict, privileged: bool) -> list[dict]:
    """Privileged: every host device and an allow-all cgroup rule; else the requested devices, each with a
    cgroup rule of the requested permissions."""
    devices: list[dict] = []
    rules: list[dict] = [{"allow": False, "access": "rwm"}]
    if privileged:
        devices = _walk_devices("/dev", "/dev", "privileged", HOST_DEV_SKIP)
        rules = [{"allow": True, "access": "rwm"}]
    for i, d in enumerate(config.devices):
        where = f"config.devices[{i}]"
        perms = d.permissions or "rwm"
        if not set(perms) <= set("rwm"):
            raise InvalidArgumentError(f"{where}.permissions: {perms!r} is not a subset of 'rwm'")
        if not d.container_path.startswith("/"):
            raise InvalidArgumentError(f"{where}.container_path: {d.container_path!r} must be an absolute path")
        host = os.path.realpath(d.host_path)
        if os.path.isdir(host):
            found = _walk_devices(host, os.path.normpath(d.container_path), f"{where}.host_path")
        else:
            dev = _device_of(host, os.path.normpath(d.container_path), f"{where}.host_path")
            if dev is None:
                raise InvalidArgumentError(f"{where}.host_path: {d.host_path} is not a device")
            found = [dev]
        for dev in found:
            devices = [x for x in devices if x["path"] != dev["path"]] + [dev]
            if not privileged:
                rules.append({"allow": True, "type": dev["type"], "major": dev["major"], "minor": dev["minor"],
                              "access": perms})
    resources["devices"] = rules
    return devices


# ---- resources, cgroups, annotations -------------------------------------------------------------------------

def _unified_host() -> bool:
    """The host runs cgroup v2 alone, where containers get a cgroup namespace and `unified` settings apply: its
    cgroup root is the cgroup2 mount (a hybrid host's root is a tmpfs)."""
    return os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def _swap_available() -> bool:
    """containerd sets a swap limit only where the kernel accounts swap."""
    if _unified_host():
        return any(os.path.exists(os.path.join("/sys/fs/cgroup", d, "memory.swap.max"))
                   for d in os.listdir("/sys/fs/cgroup"))
    return os.path.exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")


def linux_resources(r: api_pb2.LinuxContainerResources, where: str = "config.linux.resources") -> dict:
    """The OCI linux.resources of CRI resources (CreateContainer, and UpdateContainerResources with
    `where` = "linux"); containerd's rules: zero means unset, the swap limit follows the memory limit
    where swap is accounted, so a container does not swap by default."""
    out: dict = {}
    cpu: dict = {}
    for key, value, lo in (("period", r.cpu_period, 0), ("quota", r.cpu_quota, -1), ("shares", r.cpu_shares, 0)):
        if value < lo:
            raise InvalidArgumentError(f"{where}.cpu_{key}: {value} must not be negative")
        if value:
            cpu[key] = value
    if r.cpuset_cpus:
        cpu["cpus"] = r.cpuset_cpus
    if r.cpuset_mems:
        cpu["mems"] = r.cpuset_mems
    if cpu:
        out["cpu"] = cpu
    memory: dict = {}
    if r.memory_limit_in_bytes < 0:
        raise InvalidArgumentError(f"{where}.memory_limit_in_bytes: {r.memory_limit_in_bytes} must not be negative")
    if r.memory_limit_in_bytes:
        memory["limit"] = r.memory_limit_in_bytes
    swap = r.memory_swap_limit_in_bytes
    if swap and swap != -1 and swap < r.memory_limit_in_bytes:
        raise InvalidArgumentError(f"{where}.memory_swap_limit_in_bytes: {swap} is below memory_limit_in_bytes "
                                   f"{r.memory_limit_in_bytes} (it counts memory plus swap)")
    if (swap or r.memory_limit_in_bytes) and _swap_available():
        memory["swap"] = swap or r.memory_limit_in_bytes
    if memory:
        out["memory"] = memory
    if r.hugepage_limits:
        out["hugepageLimits"] = [{"pageSize": h.page_size, "limit": h.limit} for h in r.hugepage_limits]
        for i, h in enumerate(r.hugepage_limits):
            if not h.page_size:
                raise InvalidArgumentError(f"{where}.hugepage_limits[{i}].page_size: required")
    if r.unified:
        if not _unified_host():
            raise InvalidArgumentError(f"{where}.unified: invalid configuration: needs cgroup v2, this host uses "
                                       "cgroup v1")
        out["unified"] = dict(r.unified)
    return out


def cgroups_path(parent: str, container_id: str, driver: str) -> str:
    """linux.cgroupsPath: <parent>/<id> for cgroupfs (under /pyruntime when the pod has no parent), and
    systemd's slice:prefix:name form for the systemd driver, as containerd names them."""
    if driver == "systemd":
        from pyruntime.linux.cgroups.systemd import scope_path
        return scope_path(parent, CGROUP_PREFIX, container_id)
    if driver != "cgroupfs":
        raise InvalidArgumentError(f"cgroup_driver: {driver!r} is neither cgroupfs nor systemd")
    if not parent:
        return f"/pyruntime/{container_id}"
    return parent.rstrip("/") + "/" + container_id


def _annotations(config: api_pb2.ContainerConfig, sandbox: SandboxRecord,
                 sandbox_config: api_pb2.PodSandboxConfig) -> dict[str, str]:
    meta = sandbox_config.metadata
    return {ANN_CONTAINER_TYPE: "container", ANN_CONTAINER_NAME: config.metadata.name, ANN_SANDBOX_ID: sandbox.id,
            ANN_SANDBOX_NAME: meta.name, ANN_SANDBOX_NAMESPACE: meta.namespace, ANN_SANDBOX_UID: meta.uid,
            ANN_IMAGE_NAME: config.image.user_specified_image or config.image.image}
