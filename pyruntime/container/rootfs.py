"""The container's filesystem view, built inside its new mount namespace before pivot_root.

Order matters and follows runc: stop propagation to the host first, make the rootfs a mount point,
then the configured mounts, devices, masked and read-only paths (all resolved inside the root, see
paths.py), then pivot_root and drop the old root. Masking happens before pivot_root so that the source
of each mask is the host's /dev/null, checked to be the real null device, not one the image controls.

Every kernel call goes through the `kernel` (a Syscalls) that the caller passes in, so this logic runs
without root against FakeSyscalls in tests/unit/test_rootfs_logic.py.
"""
from __future__ import annotations

import errno
import os
import stat

from pynode_os import mountinfo
from pynode_os.cgroups import CGROUP_ROOT, Hierarchy, parse_mountinfo, parse_proc_cgroup
from pyruntime.container import paths
from pyruntime.errors import FailedPreconditionError, InvalidArgumentError
from pyruntime.linux import syscalls as sc
from pyruntime.linux.cgroups.base import read_file
from pyruntime.linux.cgroups.paths import base_dir
from pyruntime.linux.mount_options import FLAG_OPTIONS, IGNORED_OPTIONS, PROPAGATION_OPTIONS, RECURSIVE_OPTIONS
from pyruntime.linux.syscalls import SyscallError, Syscalls
from pyruntime.oci.spec import Device, Mount, Spec
from pyruntime.record import Factory, record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from pynode_os.cgroups import HostMounts

# statvfs flags a bind remount must keep: in a user namespace they are locked and dropping one is EPERM
_LOCKED = ((os.ST_RDONLY, sc.MS_RDONLY), (os.ST_NOSUID, sc.MS_NOSUID), (os.ST_NODEV, sc.MS_NODEV),
           (os.ST_NOEXEC, sc.MS_NOEXEC), (os.ST_NOATIME, sc.MS_NOATIME), (os.ST_NODIRATIME, sc.MS_NODIRATIME),
           (os.ST_RELATIME, sc.MS_RELATIME))

DEFAULT_DEVICES = (
    Device("c", "/dev/null", 1, 3, 0o666, 0, 0), Device("c", "/dev/zero", 1, 5, 0o666, 0, 0),
    Device("c", "/dev/full", 1, 7, 0o666, 0, 0), Device("c", "/dev/random", 1, 8, 0o666, 0, 0),
    Device("c", "/dev/urandom", 1, 9, 0o666, 0, 0), Device("c", "/dev/tty", 5, 0, 0o666, 0, 0),
)
DEV_SYMLINKS = (("/proc/self/fd", "/dev/fd"), ("/proc/self/fd/0", "/dev/stdin"), ("/proc/self/fd/1", "/dev/stdout"),
                ("/proc/self/fd/2", "/dev/stderr"), ("pts/ptmx", "/dev/ptmx"))


class MountRefused(OSError, FailedPreconditionError):
    """A mount refused for what the image or the host holds where it goes (a symlink where proc, sysfs or a
    masked path must be, a /dev/null that is no null device): the rootfs must change, not the runtime, so the
    CRI caller gets FAILED_PRECONDITION. An OSError with its errno, as the SyscallError it replaces."""


class MountSourceError(OSError, InvalidArgumentError):
    """A bind mount whose source does not resolve (missing, a dangling symlink, not a directory on the way):
    the spec names what is not there, so the CRI caller gets INVALID_ARGUMENT."""


@record
class MountOptions:
    flags: int
    propagation: tuple[int, ...]
    data: str
    recursive: tuple[int, int] = (0, 0)  # mount_setattr's (set, clear) for this mount and every one below it


def parse_options(options: tuple[str, ...]) -> MountOptions:
    flags, propagation, data = 0, [], []
    attr_set = attr_clr = 0
    for opt in options:
        if opt in FLAG_OPTIONS:
            on, off = FLAG_OPTIONS[opt]
            flags = (flags | on) & ~off
        elif opt in PROPAGATION_OPTIONS:
            propagation.append(PROPAGATION_OPTIONS[opt])
        elif opt in RECURSIVE_OPTIONS:
            on, off = RECURSIVE_OPTIONS[opt]
            attr_set, attr_clr = (attr_set & ~off) | on, attr_clr | off
        elif opt not in IGNORED_OPTIONS:
            data.append(opt)
    return MountOptions(flags, tuple(propagation), ",".join(data), (attr_set, attr_clr))


def _locked_flags(kernel: Syscalls, path: str) -> int:
    f = kernel.statvfs_flags(path)
    return sum(ms for st, ms in _LOCKED if f & st)


def _is_bind(m: Mount, opts: MountOptions) -> bool:
    return m.type == "bind" or bool(opts.flags & sc.MS_BIND)


def _source(m: Mount, bundle: str) -> str | None:
    if m.source and _is_bind(m, parse_options(m.options)) and not m.source.startswith("/"):
        return os.path.join(bundle, m.source)
    return m.source


def below_root(m: Mount, rootfs: str) -> Mount:
    """A destination spelled as the host's path of the rootfs (`<rootfs>/mnt`) means the path below it, as
    runc reads it (pathrs.LexicallyStripRoot): configs written for runc, its own tests among them, rely on it."""
    root = rootfs.rstrip("/")
    if m.destination == root or m.destination.startswith(root + "/"):
        return replace(m, destination=m.destination[len(root):] or "/")
    return m


def mount_one(kernel: Syscalls, root_fd: int, m: Mount, bundle: str, cgroup_ns: bool,
              userns_fd: int | None = None, source_tree: int | None = None,
              host_cgroups: HostMounts | None = None) -> None:
    """`userns_fd`: for an idmapped bind (mounts[].uidMappings), a user namespace holding its mappings.
    `source_tree`: for a bind, its source already copied (MountFds.sources), to attach as it is.
    `host_cgroups`: MountFds.cgroups."""
    opts = parse_options(m.options)
    source = _source(m, bundle)
    if m.type == "cgroup":
        return _mount_cgroup(kernel, root_fd, m, opts, cgroup_ns, host_cgroups)
    if m.type in ("proc", "sysfs"):
        _require_plain_dir(kernel, root_fd, m)
    copy_up, readonly = -1, 0
    if m.type == "tmpfs":
        opts = _tmpfs_options(kernel, root_fd, m, opts)
        if "tmpcopyup" in m.options:
            copy_up, readonly = _copy_up_source(kernel, root_fd, m), opts.flags & sc.MS_RDONLY
            opts = MountOptions(opts.flags & ~sc.MS_RDONLY, opts.propagation, opts.data, opts.recursive)
    if _is_bind(m, opts):
        try:
            src_is_dir = stat.S_ISDIR((os.fstat(source_tree) if source_tree is not None
                                       else os.stat(source or "")).st_mode)
        except OSError as e:
            error = MountSourceError if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP) else SyscallError
            raise error(e.errno, f"mount {m.destination}: bind source {source}: {e.strerror}") from e
        target = paths.make_target(kernel, root_fd, m.destination, src_is_dir)
    else:
        target = paths.make_target(kernel, root_fd, m.destination, True)
    try:
        where = paths.fd_path(target)
        if _is_bind(m, opts):
            extra = opts.flags & ~(sc.MS_BIND | sc.MS_REC | sc.MS_REMOUNT)
            if source_tree is not None:
                kernel.attach_mount(source_tree, where)
            elif userns_fd is not None:
                kernel.mount_idmapped(source or "", userns_fd, where, rbind=bool(opts.flags & sc.MS_REC),
                                      ridmap="ridmap" in m.options)
            else:
                kernel.mount(source, where, None, sc.MS_BIND | (opts.flags & sc.MS_REC), None)
            if extra:  # the remount must name the new mount, so the target is opened again
                _remount(kernel, root_fd, m.destination, extra)
        else:
            kernel.mount(source or m.type, where, m.type, opts.flags, opts.data or None)
        if copy_up >= 0:
            _copy_up(kernel, copy_up, root_fd, m, opts.flags | readonly, opts.data)
        if opts.propagation or opts.recursive != (0, 0):
            fresh = paths.open_in_root(kernel, root_fd, m.destination)
            try:
                for p in opts.propagation:
                    kernel.mount(None, paths.fd_path(fresh), None, p, None)
                if opts.recursive != (0, 0):
                    kernel.mount_setattr_recursive(fresh, *opts.recursive, m.destination)
            finally:
                os.close(fresh)
    finally:
        os.close(target)
        if copy_up >= 0:
            os.close(copy_up)


def _copy_up_source(kernel: Syscalls, root_fd: int, m: Mount) -> int:
    """tmpcopyup (runc's): the directory the tmpfs will hide, opened before the mount so that its entries
    stay reachable (the tmpfs is then mounted writable until they are copied in); -1 when there is no
    directory there yet, so nothing to copy."""
    try:
        return paths.open_in_root(kernel, root_fd, m.destination, os.O_RDONLY | os.O_DIRECTORY)
    except SyscallError as e:
        if e.errno != errno.ENOENT:
            raise
        return -1


def _copy_up(kernel: Syscalls, source: int, root_fd: int, m: Mount, flags: int, data: str) -> None:
    """The hidden directory's entries into the new tmpfs, then the tmpfs read-only if `flags` say so."""
    mounted = paths.open_in_root(kernel, root_fd, m.destination, os.O_RDONLY | os.O_DIRECTORY)
    try:
        copy_tree(kernel, source, mounted)
    except OSError as e:
        raise SyscallError(e.errno or errno.EIO, f"mount {m.destination}: tmpcopyup: {e}") from e
    finally:
        os.close(mounted)
    if flags & sc.MS_RDONLY:
        fd = paths.open_in_root(kernel, root_fd, m.destination)
        try:
            kernel.mount(None, paths.fd_path(fd), None, sc.MS_REMOUNT | flags, data or None)
        finally:
            os.close(fd)


def copy_tree(kernel: Syscalls, src: int, dst: int) -> None:
    """Copies the entries of the directory `src` into `dst` (open directory fds): directories, files,
    symlinks and special files with their modes, owners and times. Nothing in `src` is followed: each entry
    is opened relative to its parent with O_NOFOLLOW and a symlink is copied as a link, so an image's symlink
    can't pull a host file into the container."""
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.scandir(src) as entries:
        listed = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
    for name, st in listed:
        kind = stat.S_IFMT(st.st_mode)
        if kind == stat.S_IFDIR:
            os.mkdir(name, 0o700, dir_fd=dst)
            inner_src = os.open(name, nofollow | os.O_DIRECTORY, dir_fd=src)
            inner_dst = os.open(name, nofollow | os.O_DIRECTORY, dir_fd=dst)
            try:
                copy_tree(kernel, inner_src, inner_dst)
            finally:
                os.close(inner_src)
                os.close(inner_dst)
        elif kind == stat.S_IFLNK:
            kernel.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
        elif kind == stat.S_IFREG:
            fin = os.open(name, nofollow, dir_fd=src)
            try:
                fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                               dir_fd=dst)
                try:
                    while os.sendfile(fout, fin, None, 1 << 20):
                        pass
                finally:
                    os.close(fout)
            finally:
                os.close(fin)
        else:
            kernel.mknod(name, st.st_mode, st.st_rdev, dir_fd=dst)
        kernel.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
        if kind != stat.S_IFLNK:  # after chown, which clears setuid and setgid
            kernel.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=dst)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)


def _tmpfs_options(kernel: Syscalls, root_fd: int, m: Mount, opts: MountOptions) -> MountOptions:
    """As runc's: a tmpfs over an existing directory takes that directory's mode unless mode= is given (a
    0710 directory stays 0710 once mounted over), and /dev is mounted writable, to be filled with devices,
    then made read-only (finish_dev)."""
    flags, data = opts.flags, opts.data
    if not any(o.startswith("mode=") for o in data.split(",")):
        try:
            fd = paths.open_in_root(kernel, root_fd, m.destination)
        except SyscallError as e:
            if e.errno != errno.ENOENT:
                raise
        else:
            try:
                data = ",".join(filter(None, (f"mode={stat.S_IMODE(os.fstat(fd).st_mode):o}", data)))
            finally:
                os.close(fd)
    if paths.clean(m.destination) == "/dev":
        flags &= ~sc.MS_RDONLY
    return MountOptions(flags, opts.propagation, data, opts.recursive)


def finish_dev(kernel: Syscalls, root_fd: int, mounts: tuple[Mount, ...]) -> None:
    """A read-only /dev tmpfs becomes read-only once its devices and links are made."""
    for m in mounts:
        if paths.clean(m.destination) == "/dev" and m.type == "tmpfs" and parse_options(m.options).flags & sc.MS_RDONLY:
            fd = paths.open_in_root(kernel, root_fd, "/dev")
            try:
                where = paths.fd_path(fd)
                kernel.mount(None, where, None, sc.MS_REMOUNT | sc.MS_BIND | sc.MS_RDONLY
                             | _locked_flags(kernel, where), None)
            finally:
                os.close(fd)


def _require_plain_dir(kernel: Syscalls, root_fd: int, m: Mount) -> None:
    """A proc or sysfs mount point the image made a symlink (or a file) is refused, as runc does: followed,
    it would put the kernel's view where the image chose (CVE-2019-19921, CVE-2023-27561)."""
    try:
        fd = paths.open_in_root(kernel, root_fd, m.destination, nofollow=True)
    except SyscallError as e:
        if e.errno == errno.ENOENT:
            return
        raise
    try:
        if not paths.is_dir_fd(fd):
            raise MountRefused(errno.ENOTDIR, f"mount {m.destination}: filesystem {m.type!r} must be mounted on "
                                              "ordinary directory")
    finally:
        os.close(fd)


def _cgroup_hierarchies(host_cgroups: HostMounts | None, cgroup_ns: bool) -> list[tuple[Hierarchy, str]]:
    """The cgroup hierarchies a container gets (a pure v2 host's cgroup2 root, else the v1 ones), with the
    directory of this process's cgroup in each: what a container without a cgroup namespace gets at
    /sys/fs/cgroup, as runc binds it. The init runs this from inside the container's cgroups, so that is
    the container's own cgroup and never the host's tree above it (the other pods' cgroups, names and
    limits). A hybrid host's cgroup2 mount is left out, as runc's GetCgroupMounts(false) does: a cgroup2
    mount in sight is how software in a container (Kubernetes' e2e framework, Java, Go's automaxprocs)
    decides its limits are v2 files, which on a hybrid host are not the ones that hold. With a cgroup
    namespace the directories are not needed (each hierarchy is mounted afresh) and not read."""
    v1, v2 = host_cgroups if host_cgroups is not None else parse_mountinfo(read_file("/proc/self/mountinfo"))
    own = parse_proc_cgroup(read_file("/proc/self/cgroup")) if not cgroup_ns else {}
    chosen = [v2] if v2 is not None and (v2.mountpoint == CGROUP_ROOT or not v1) else v1
    return [(h, base_dir(h, False, own) if not cgroup_ns else "") for h in chosen]


def _bind_remount(kernel: Syscalls, root_fd: int, source: str, target_fd: int, destination: str, flags: int,
                  recursive: bool = True) -> None:
    """A bind mount with flags: the remount must name the new mount, so the target is opened again."""
    kernel.mount(source, paths.fd_path(target_fd), None, sc.MS_BIND | (sc.MS_REC if recursive else 0), None)
    _remount(kernel, root_fd, destination, flags)


def _remount(kernel: Syscalls, root_fd: int, destination: str, flags: int) -> None:
    fresh = paths.open_in_root(kernel, root_fd, destination)
    try:
        where = paths.fd_path(fresh)
        kernel.mount(None, where, None, sc.MS_REMOUNT | sc.MS_BIND | flags | _locked_flags(kernel, where), None)
    finally:
        os.close(fresh)


def _mount_cgroup(kernel: Syscalls, root_fd: int, m: Mount, opts: MountOptions, cgroup_ns: bool,
                  host_cgroups: HostMounts | None) -> None:
    """cgroup2 mounts as is; on v1 a tmpfs with one directory per hierarchy, as runc lays it out."""
    hierarchies = _cgroup_hierarchies(host_cgroups, cgroup_ns)
    flags = opts.flags | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC
    target = paths.make_target(kernel, root_fd, m.destination, True)
    try:
        unified = next((own for h, own in hierarchies if not h.key and h.mountpoint == CGROUP_ROOT), None)
        if unified is not None:
            if not cgroup_ns:
                _bind_remount(kernel, root_fd, unified, target, m.destination, flags)
            else:
                kernel.mount("cgroup2", paths.fd_path(target), "cgroup2", flags, None)
            return
        kernel.mount("tmpfs", paths.fd_path(target), "tmpfs", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC,
                     "mode=755")
    finally:
        os.close(target)
    top = paths.open_in_root(kernel, root_fd, m.destination)  # the tmpfs just mounted: ours, and empty
    try:
        for h, own in hierarchies:
            name = os.path.basename(h.mountpoint)
            sub = _subdir(top, name, os.path.join(m.destination, name))
            try:
                if cgroup_ns:
                    if h.key:
                        kernel.mount("cgroup", paths.fd_path(sub), "cgroup", flags, ",".join(sorted(h.controllers)))
                    else:
                        kernel.mount("cgroup2", paths.fd_path(sub), "cgroup2", flags, None)
                else:
                    _bind_with_attributes(kernel, own, sub, os.path.join(m.destination, name), flags)
            finally:
                os.close(sub)
        if opts.flags & sc.MS_RDONLY:
            kernel.mount(None, paths.fd_path(top), None, sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV
                         | sc.MS_NOEXEC, "mode=755")
    finally:
        os.close(top)


def _subdir(parent: int, name: str, where: str) -> int:
    """A directory made in `parent` (a fresh tmpfs of ours, so no symlink can be in the way), opened O_PATH."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as e:
        raise SyscallError(e.errno, f"mkdir {where}: {e.strerror}") from e
    try:
        return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as e:
        raise SyscallError(e.errno, f"open {where}: {e.strerror}") from e


_ATTRIBUTES = ((sc.MS_RDONLY, sc.MOUNT_ATTR_RDONLY), (sc.MS_NOSUID, sc.MOUNT_ATTR_NOSUID),
               (sc.MS_NODEV, sc.MOUNT_ATTR_NODEV), (sc.MS_NOEXEC, sc.MOUNT_ATTR_NOEXEC))


def _bind_with_attributes(kernel: Syscalls, source: str, target_fd: int, destination: str, flags: int) -> None:
    """A recursive bind of `source` with the read-only, nosuid, nodev and noexec bits of `flags` (the others,
    atime modes, left as the source has them), in three calls (open_tree, mount_setattr, move_mount) where
    a bind and its remount take six: once per cgroup hierarchy, ten times on a v1 host. The attributes are
    only ever added, so a mount whose flags a user namespace locked takes them as well."""
    tree = kernel.clone_mount(source, recursive=True)
    try:
        kernel.mount_setattr_recursive(tree, sum(attr for flag, attr in _ATTRIBUTES if flags & flag), 0, destination)
        kernel.attach_mount(tree, paths.fd_path(target_fd))
    finally:
        os.close(tree)


def create_device(kernel: Syscalls, root_fd: int, dev: Device, bind: bool) -> None:
    """mknod, or in a user namespace (where mknod is refused) a bind mount of the host's node."""
    kinds = {"c": stat.S_IFCHR, "u": stat.S_IFCHR, "b": stat.S_IFBLK, "p": stat.S_IFIFO}
    if bind:
        target = paths.make_target(kernel, root_fd, dev.path, False)
        try:
            kernel.mount(dev.path, paths.fd_path(target), None, sc.MS_BIND, None)
        finally:
            os.close(target)
        return
    parent, name = os.path.split(paths.clean(dev.path))
    os.close(paths.mkdir_all(kernel, root_fd, parent))
    dfd = paths.open_in_root(kernel, root_fd, parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        mode = dev.file_mode if dev.file_mode is not None else 0o666
        kernel.mknod(name, kinds[dev.type] | mode, os.makedev(dev.major, dev.minor), dir_fd=dfd)
        kernel.chmod(name, mode, dir_fd=dfd, follow_symlinks=False)
        kernel.chown(name, dev.uid or 0, dev.gid or 0, dir_fd=dfd, follow_symlinks=False)
    finally:
        os.close(dfd)


def _dev_symlinks(kernel: Syscalls, root_fd: int) -> None:
    dfd = paths.open_in_root(kernel, root_fd, "/dev", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for src, dst in DEV_SYMLINKS:
            try:
                kernel.symlink(src, os.path.basename(dst), dir_fd=dfd)
            except SyscallError as e:
                if e.errno != errno.EEXIST:
                    raise
    finally:
        os.close(dfd)


def _null_device() -> int:
    """An O_PATH fd of the host's /dev/null, refused unless it is the real null character device."""
    fd = os.open("/dev/null", sc.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(1, 3):
        os.close(fd)
        raise MountRefused(errno.EPERM, "refusing to mask paths: /dev/null is not the null device")
    return fd


def mask_paths(kernel: Syscalls, root_fd: int, masked: tuple[str, ...]) -> None:
    """Hides each path: files under the null device, directories under an empty read-only tmpfs.

    A path that is a symlink is refused rather than followed (CVE-2025-31133's class): the mask must
    cover what the container would open, and a symlink could point the mount somewhere else.
    """
    null = _null_device()
    shared = -1  # the first directory mask's tmpfs, which the others bind, as runc's (one tmpfs, not N)
    try:
        for path in masked:
            try:
                fd = paths.open_in_root(kernel, root_fd, path, nofollow=True)
            except SyscallError as e:
                if e.errno == errno.ENOENT:
                    continue
                if e.errno == errno.ELOOP:
                    raise MountRefused(errno.ELOOP, f"masked path {path} is a symlink: refusing to follow it") from e
                raise
            try:
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    raise MountRefused(errno.ELOOP, f"masked path {path} is a symlink: refusing to follow it")
                if paths.is_dir_fd(fd) and shared >= 0:
                    kernel.mount(paths.fd_path(shared), paths.fd_path(fd), None, sc.MS_BIND, None)
                elif paths.is_dir_fd(fd):
                    kernel.mount("tmpfs", paths.fd_path(fd), "tmpfs", sc.MS_RDONLY, None)
                    shared = paths.open_in_root(kernel, root_fd, path, nofollow=True)
                else:
                    kernel.mount(paths.fd_path(null), paths.fd_path(fd), None, sc.MS_BIND, None)
            finally:
                os.close(fd)
    finally:
        os.close(null)
        if shared >= 0:
            os.close(shared)


def readonly_paths(kernel: Syscalls, root_fd: int, ro: tuple[str, ...]) -> None:
    for path in ro:
        try:
            fd = paths.open_in_root(kernel, root_fd, path)
        except SyscallError as e:
            if e.errno == errno.ENOENT:
                continue
            raise
        try:
            kernel.mount(paths.fd_path(fd), paths.fd_path(fd), None, sc.MS_BIND | sc.MS_REC, None)
        finally:
            os.close(fd)
        fd = paths.open_in_root(kernel, root_fd, path)
        try:
            where = paths.fd_path(fd)
            kernel.mount(None, where, None,
                         sc.MS_REMOUNT | sc.MS_BIND | sc.MS_RDONLY | sc.MS_REC | _locked_flags(kernel, where), None)
        finally:
            os.close(fd)


def pivot(kernel: Syscalls, rootfs: str) -> None:
    """pivot_root(".", ".") and a lazy unmount of the old root, runc's way: no put_old dir in the image."""
    old = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    new = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fchdir(new)
        kernel.pivot_root(".", ".")
        os.fchdir(old)
        kernel.mount(None, ".", None, sc.MS_SLAVE | sc.MS_REC, None)
        kernel.umount(".", sc.MNT_DETACH)
        os.chdir("/")
    finally:
        os.close(old)
        os.close(new)


def _parent_mount_private(kernel: Syscalls, path: str) -> None:
    """pivot_root refuses a new root whose parent mount is shared (rootfsPropagation shared/rshared
    makes it so); like runc, make that one parent private."""
    parent = mountinfo.mount_of(path, mountinfo.read())
    if parent is not None and any(tag.startswith("shared:") for tag in parent.optional):
        kernel.mount(None, parent.mount_point, None, sc.MS_PRIVATE, None)


@record
class MountFds:
    """What the mounts use that was opened before the container's namespaces were entered, by index in
    spec.mounts. `idmap`: a user namespace holding an idmapped mount's mappings (made by the runtime).
    `sources`: in a container with a user namespace, each bind source outside the rootfs as a detached
    copy (open_tree) made while still root on the host: the container's root may not reach it by path (a
    kubelet's pods directory is 0750), and a mount of the host's namespace can't be bound into another
    one, only a detached copy attached (runc's mount source fds); an idmapped one is idmapped then, as only
    the host's root may. Sources inside the rootfs are looked up when mounted, so that they see the
    container's earlier mounts (validation keeps idmapped mounts out of there). `cgroups`: the host's
    cgroup hierarchies, as the runtime read them for the container's cgroup (the init's mount namespace
    is a copy of its own, so a cgroup mount needs no second read and parse of mountinfo); None: read them."""
    idmap: dict[int, int] = Factory(dict)
    sources: dict[int, int] = Factory(dict)
    cgroups: HostMounts | None = None


def open_sources(kernel: Syscalls, spec: Spec, bundle: str, idmap: dict[int, int]) -> dict[int, int]:
    """MountFds.sources; a source that can't be copied is left to the mount, which names the error, unless
    it is idmapped: the container's root could not idmap it, so the host's error (a filesystem that can't
    be idmapped) is the one to give."""
    root = spec.root.path.rstrip("/") + "/"
    out: dict[int, int] = {}
    try:
        for i, m in enumerate(spec.mounts):
            source, opts = _source(m, bundle), parse_options(m.options)
            if source and _is_bind(m, opts) and not (source + "/").startswith(root):
                try:
                    out[i] = kernel.clone_mount(source, bool(opts.flags & sc.MS_REC), idmap.get(i),
                                                "ridmap" in m.options)
                except OSError as e:
                    if i in idmap:
                        raise SyscallError(e.errno, f"mount {m.destination}: idmapped source {source}: "
                                                    f"{e.strerror}") from e
    except BaseException:
        for fd in out.values():
            os.close(fd)
        raise
    return out


def enter_bundle(spec: Spec) -> None:
    """Makes the rootfs's parent the working directory, while still root on the host: from there the
    container's root (in a user namespace of its own) reaches the rootfs by a relative path even when the
    directories above are not open to it (a CRI server's state under a 0700 directory)."""
    os.chdir(os.path.dirname(spec.root.path.rstrip("/")))


def prepare(kernel: Syscalls, spec: Spec, bundle: str, in_userns: bool, before_pivot: Callable[[], None],
            fds: MountFds) -> None:
    """Builds the container's root and pivots into it; `before_pivot` runs the create-time hooks. In a user
    namespace the rootfs is named relative to the working directory enter_bundle() chose."""
    propagation = PROPAGATION_OPTIONS.get(spec.linux.rootfs_propagation, sc.MS_SLAVE | sc.MS_REC)
    kernel.mount(None, "/", None, propagation, None)
    rootfs = spec.root.path
    if not propagation & sc.MS_REC or not propagation & (sc.MS_SLAVE | sc.MS_PRIVATE | sc.MS_UNBINDABLE):
        # after a recursive slave, private or unbindable no mount is shared (mount_namespaces(7)): the
        # default rslave (every CRI container) spares the init a read of the whole mountinfo
        _parent_mount_private(kernel, rootfs)
    here = os.path.basename(rootfs.rstrip("/")) if in_userns else rootfs
    kernel.mount(here, here, None, sc.MS_BIND | sc.MS_REC, None)
    root_fd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        cgroup_ns = spec.linux.namespace("cgroup") is not None
        for i, m in enumerate(spec.mounts):
            mount_one(kernel, root_fd, below_root(m, rootfs), bundle, cgroup_ns, fds.idmap.get(i),
                      fds.sources.get(i), fds.cgroups)
        dev_mount = next((m for m in spec.mounts if paths.clean(m.destination) == "/dev"), None)
        if dev_mount is None or not _is_bind(dev_mount, parse_options(dev_mount.options)):
            for dev in DEFAULT_DEVICES + tuple(d for d in spec.linux.devices
                                                if d.path not in {x.path for x in DEFAULT_DEVICES}):
                create_device(kernel, root_fd, dev, in_userns)
            _dev_symlinks(kernel, root_fd)
        finish_dev(kernel, root_fd, spec.mounts)
        if spec.linux.masked_paths:
            mask_paths(kernel, root_fd, spec.linux.masked_paths)
        if spec.linux.readonly_paths:
            readonly_paths(kernel, root_fd, spec.linux.readonly_paths)
        before_pivot()
    finally:
        os.close(root_fd)
    pivot(kernel, here)
    if spec.linux.rootfs_propagation:
        kernel.mount(None, "/", None, propagation, None)
    if spec.root.readonly:
        kernel.mount(None, "/", None, sc.MS_REMOUNT | sc.MS_BIND | sc.MS_RDONLY | _locked_flags(kernel, "/"), None)
