"""The checks a parsed spec must pass before `create` claims an id, makes a cgroup or forks.

spec.py checks each field's shape; what only makes sense across fields or against this host is checked
here, once, as runc's libcontainer/configs/validate does: a sysctl against the namespace that makes it
private, namespace paths against the files they name, id mappings against each other, mounts,
devices, and the resources against the cgroup driver the host uses. The threat is a config that
would change the host (a sysctl written into the runtime's own network namespace) or fail halfway
through stage 2, after the cgroup and processes exist; a failure here leaves nothing to undo. Every
error is a SpecError that starts with the field's full path (`linux.sysctl["net.ipv4.ip_forward"]`).
Stage 2 (container/init.py) then only applies.
"""
from __future__ import annotations

import os

from pynode_os import sysctl
from pyruntime.fieldreader import SpecError, shown
from pyruntime.linux import syscalls as sc
from pyruntime.linux.syscalls import SyscallError, Syscalls
from pyruntime.oci.spec import IDMapping, Linux, Mount, Namespace, Spec

# the files under /proc/self/ns, by spec namespace type
PROC_NS_NAMES = {"pid": "pid", "network": "net", "mount": "mnt", "ipc": "ipc", "uts": "uts", "user": "user",
                 "cgroup": "cgroup", "time": "time"}
NS_FLAGS = {"pid": sc.CLONE_NEWPID, "network": sc.CLONE_NEWNET, "mount": sc.CLONE_NEWNS, "ipc": sc.CLONE_NEWIPC,
            "uts": sc.CLONE_NEWUTS, "user": sc.CLONE_NEWUSER, "cgroup": sc.CLONE_NEWCGROUP, "time": sc.CLONE_NEWTIME}
# the spec's namespace type of each namespace pynode_os.sysctl names
SYSCTL_NAMESPACES = {sysctl.IPC: "ipc", sysctl.NET: "network", sysctl.UTS: "uts"}
SYSTEMD_PROPERTY = "org.systemd.property."  # runc's annotations that become unit properties
MAX_ID_MAP_LINES = 340  # the kernel's limit on lines in uid_map/gid_map (since 4.15)
ID_MAX = 1 << 32


def validate(spec: Spec, cgroup_driver: str, kernel: Syscalls) -> None:
    """Raises SpecError for the first rule `spec` breaks; `cgroup_driver` is cgroups.detect()'s "v1" or "v2", or
    "systemd" for the systemd driver (on a v2 host, which the caller checked), and `kernel` answers what the
    namespace files given by path are."""
    linux = spec.linux
    _namespaces(linux, kernel)
    _id_mappings(linux)
    for field, value in (("hostname", spec.hostname), ("domainname", spec.domainname)):
        if value and linux.namespace("uts") is None:
            raise SpecError(f"{field}: setting a {field} needs the container's own uts namespace in "
                            "linux.namespaces")
    _sysctls(linux)
    _mounts(spec.mounts, spec.linux, spec.root.path)
    _devices(linux)
    _cgroups(linux, cgroup_driver, spec.annotations)


def _ns_index(linux: Linux, kind: str) -> int:
    return next(i for i, ns in enumerate(linux.namespaces) if ns.type == kind)


def _ns_type_of(kernel: Syscalls, path: str, where: str) -> str | None:
    """The spec type of the namespace file at `path`; None when it is not a namespace file."""
    try:
        flag = kernel.ns_type(path)
    except SyscallError as e:
        raise SpecError(f"{where}: {e.strerror}") from e
    if flag is None:
        return None
    return next((kind for kind, f in NS_FLAGS.items() if f == flag), f"unknown ({flag:#x})")


def _namespaces(linux: Linux, kernel: Syscalls) -> None:
    if linux.namespace("mount") is None:
        raise SpecError("linux.namespaces: a mount namespace (new or by path) is required; without one the "
                        "container's mounts would land in the host's")
    for i, ns in enumerate(linux.namespaces):
        proc_name = PROC_NS_NAMES[ns.type]
        if ns.path is None:
            if not os.path.exists(f"/proc/self/ns/{proc_name}"):
                raise SpecError(f"linux.namespaces[{i}]: this kernel has no {ns.type} namespaces")
            continue
        where = f"linux.namespaces[{i}].path"
        found = _ns_type_of(kernel, ns.path, where)
        if found is None:
            raise SpecError(f"{where}: {ns.path} is not a namespace file")
        if found != ns.type:
            article = "an" if ns.type[0] in "aeiou" else "a"
            raise SpecError(f"{where}: {ns.path} is not {article} {ns.type} namespace (its type is {found})")


def _is_private(ns: Namespace | None) -> bool:
    """A namespace of the container's own: a new one, or one by path that is not the runtime's."""
    if ns is None:
        return False
    if ns.path is None:
        return True
    mine, theirs = os.stat(f"/proc/self/ns/{PROC_NS_NAMES[ns.type]}"), os.stat(ns.path)
    return (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino)


def _sysctls(linux: Linux) -> None:
    """Only sysctls a namespace makes private, and only in a namespace that is not the runtime's:
    anything else would change the host for every process on it."""
    for key in linux.sysctl:
        where = f"linux.sysctl[{shown(key)}]"
        need = SYSCTL_NAMESPACES.get(sysctl.namespace_of(key))
        if need is None:
            raise SpecError(f"{where}: not a namespaced sysctl: refusing to change the host")
        ns = linux.namespace(need)
        if ns is None:
            raise SpecError(f"{where}: needs the container's own {need} namespace in linux.namespaces")
        if not _is_private(ns):
            raise SpecError(f"{where}: linux.namespaces[{_ns_index(linux, need)}].path {ns.path} is the runtime's "
                            f"own {need} namespace: refusing to change the host")


def _check_maps(maps: tuple[IDMapping, ...], where: str) -> None:
    if len(maps) > MAX_ID_MAP_LINES:
        raise SpecError(f"{where}: {len(maps)} mappings, the kernel takes at most {MAX_ID_MAP_LINES}")
    for i, m in enumerate(maps):
        for side, start in (("containerID", m.container_id), ("hostID", m.host_id)):
            if start + m.size > ID_MAX:
                raise SpecError(f"{where}[{i}]: {side} {start} + size {m.size} goes past the last id {ID_MAX - 1}")
        for j, other in enumerate(maps[:i]):
            for side, a, b in (("containerID", m.container_id, other.container_id),
                               ("hostID", m.host_id, other.host_id)):
                if a < b + other.size and b < a + m.size:
                    raise SpecError(f"{where}[{i}]: {side} range overlaps {where}[{j}]")


def _id_mappings(linux: Linux) -> None:
    userns = linux.namespace("user")
    for key, maps in (("uidMappings", linux.uid_mappings), ("gidMappings", linux.gid_mappings)):
        where = f"linux.{key}"
        if maps and userns is None:
            raise SpecError(f"{where}: mappings need a user namespace in linux.namespaces")
        if userns is not None and userns.path is None and not maps:
            index = _ns_index(linux, "user")
            raise SpecError(f"{where}: required for a new user namespace (linux.namespaces[{index}])")
        _check_maps(maps, where)


def _is_bind(m: Mount) -> bool:
    return m.type == "bind" or "bind" in m.options or "rbind" in m.options


def _mounts(mounts: tuple[Mount, ...], linux: Linux, root: str) -> None:
    for i, m in enumerate(mounts):
        where = f"mounts[{i}]"
        if m.type is not None and (not m.type or any(c in m.type for c in "/ \t\n\0")):
            raise SpecError(f"{where}.type: {shown(m.type)} is not a filesystem type")
        if _is_bind(m) and not m.source:
            raise SpecError(f"{where}.source: required for a bind mount")
        if m.uid_mappings or m.gid_mappings or {"idmap", "ridmap"} & set(m.options):
            _idmapped_mount(m, where, linux, root)


def _idmapped_mount(m: Mount, where: str, linux: Linux, root: str) -> None:
    """runc's rules (checkIDMapMounts): `idmap`/`ridmap` without mappings take the container's (those of a
    joined user namespace are the namespace's own). Less what
    pyruntime does not do: into a container with a user namespace of its own, a mount is idmapped from
    outside that namespace (as only the host's root may) before the container's mounts are made, so its
    source can't be inside the rootfs, where those mounts would be out of its sight."""
    if not _is_bind(m):
        raise SpecError(f"{where}.type: idmapped mounts are only supported for bind mounts, not {shown(m.type)}")
    user_ns = linux.namespace("user")
    in_userns = user_ns is not None
    joined = user_ns is not None and user_ns.path is not None  # the namespace itself holds the mappings
    uids = m.uid_mappings or (linux.uid_mappings if in_userns else ())
    gids = m.gid_mappings or (linux.gid_mappings if in_userns else ())
    if not (joined and not m.uid_mappings and not m.gid_mappings) and (not uids or not gids):
        field = "gidMappings" if uids else "uidMappings"
        raise SpecError(f"{where}.{field}: an idmapped mount needs both uidMappings and gidMappings")
    if in_userns and m.source and (m.source.rstrip("/") + "/").startswith(root.rstrip("/") + "/"):
        raise SpecError(f"{where}.source: {m.source} is inside the rootfs; pyruntime idmaps a mount into a "
                        "container with a user namespace of its own only from a source outside it")
    _check_maps(m.uid_mappings, f"{where}.uidMappings")
    _check_maps(m.gid_mappings, f"{where}.gidMappings")


def _devices(linux: Linux) -> None:
    seen: dict[str, int] = {}
    for i, d in enumerate(linux.devices):
        where = f"linux.devices[{i}].path"
        if ".." in d.path.split("/"):
            raise SpecError(f"{where}: {d.path} must not contain '..'")
        path = os.path.normpath(d.path)
        if path == "/":
            raise SpecError(f"{where}: names the root directory, not a device")
        if path in seen:
            raise SpecError(f"{where}: {d.path} is already linux.devices[{seen[path]}]")
        seen[path] = i


def _cgroups(linux: Linux, driver: str, annotations: dict[str, str]) -> None:
    try:
        if driver == "systemd":
            from pyruntime.linux.cgroups.systemd import parse_path
            parse_path(linux.cgroups_path, "id")
        else:
            from pyruntime.linux.cgroups.paths import split_path
            split_path(linux.cgroups_path, "id")
    except ValueError as e:
        raise SpecError(str(e)) from e
    if driver == "systemd":
        for key in sorted(annotations):
            if key.startswith(SYSTEMD_PROPERTY):
                raise SpecError(f"annotations.{key}: unit properties from annotations are not supported by "
                                "pyruntime's systemd driver")
    res = linux.resources
    if res is None:
        return
    where = "linux.resources"
    m = res.memory
    if m is not None and m.limit is not None and m.swap is not None and 0 < m.swap < m.limit:
        raise SpecError(f"{where}.memory.swap: {m.swap} is below memory limit {m.limit}; OCI swap is memory+swap")
    if driver == "v1":
        if res.unified:
            raise SpecError(f"{where}.unified: invalid configuration: needs cgroup v2, this host uses cgroup v1")
        return
    _cgroup_v2(linux, where)


def _cgroup_v2(linux: Linux, where: str) -> None:
    """What the v2 driver cannot apply, refused before it is asked to (it refuses the same at `update`)."""
    from pyruntime.linux.cgroups.base import CgroupError
    from pyruntime.linux.cgroups.devicefilter import emulate
    from pyruntime.linux.cgroups.v2 import swap_to_v2
    res = linux.resources
    assert res is not None
    if res.cpu is not None:
        for key, value in (("realtimeRuntime", res.cpu.realtime_runtime), ("realtimePeriod", res.cpu.realtime_period)):
            if value:
                raise SpecError(f"{where}.cpu.{key}: cgroup v2 has no realtime CPU scheduling")
    if res.memory is not None:
        if res.memory.kernel_tcp:
            raise SpecError(f"{where}.memory.kernelTCP: cgroup v2 has no kernel TCP memory limit")
        if res.memory.swap is not None:
            try:
                swap_to_v2(res.memory.swap, res.memory.limit)
            except CgroupError as e:
                raise SpecError(str(e)) from e
    if res.devices:  # a rule the device program can't express (SpecError); without the spec's, all are allows
        emulate(res.with_device_policy().devices or ())
