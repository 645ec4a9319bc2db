"""The rootfs logic against FakeSyscalls: where each mount would go, decided without root.

Lookups are real (openat2 in a temp dir), mounts only recorded; each mount target is checked through
the /proc/self/fd path the runtime would have mounted on, before its fd is closed.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyruntime import errors
from pyruntime.container import rootfs
from pyruntime.linux import syscalls
from pyruntime.linux.syscalls import FakeSyscalls, SyscallError
from pyruntime.oci.spec import Device, Mount


class TargetRecorder(FakeSyscalls):
    """Also keeps each mount's target as a path."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        # resolve the magic link now: the fd behind it is closed once mount_one returns
        self.targets.append(os.path.realpath(target) if target.startswith("/proc/self/fd/") else target)
        super().mount(source, target, fstype, flags, data)


@pytest.fixture
def fake() -> TargetRecorder:
    return TargetRecorder()


@pytest.fixture
def root(tmp_path) -> Iterator[tuple[Path, int]]:
    r = tmp_path / "rootfs"
    (r / "etc").mkdir(parents=True)
    fd = os.open(r, os.O_RDONLY | os.O_DIRECTORY)
    yield r, fd
    os.close(fd)


def test_tmpfs_mount_creates_its_target_inside_the_root(fake, root):
    r, fd = root
    rootfs.mount_one(fake, fd, Mount("/run/app", "tmpfs", "tmpfs", ("nosuid", "mode=755")), "/bundle", False)
    assert (r / "run" / "app").is_dir()
    assert fake.targets == [str(r / "run" / "app")]
    (_, source, _target, fstype, flags, data), = fake.named("mount")
    assert (source, fstype, flags, data) == ("tmpfs", "tmpfs", syscalls.MS_NOSUID, "mode=755")


@pytest.mark.parametrize("link", ["/", "../../..", "/etc/../.."])
def test_a_symlink_in_the_image_cannot_send_a_mount_outside(fake, root, tmp_path, link):
    r, fd = root
    (r / "escape").symlink_to(link)
    rootfs.mount_one(fake, fd, Mount("/escape/target", "tmpfs", "tmpfs"), "/bundle", False)
    assert (r / "target").is_dir()
    assert not (tmp_path / "target").exists()
    assert fake.targets == [str(r / "target")]


def test_read_only_bind_is_a_bind_then_a_remount(fake, root, tmp_path):
    r, fd = root
    src = tmp_path / "hosts"
    src.write_text("127.0.0.1 localhost\n")
    rootfs.mount_one(fake, fd, Mount("/etc/hosts", "bind", str(src), ("rbind", "ro")), "/bundle", False)
    assert (r / "etc" / "hosts").is_file()
    bind, remount = fake.named("mount")
    assert bind[1] == str(src) and bind[4] == syscalls.MS_BIND | syscalls.MS_REC
    assert remount[4] & (syscalls.MS_REMOUNT | syscalls.MS_BIND | syscalls.MS_RDONLY) == \
        syscalls.MS_REMOUNT | syscalls.MS_BIND | syscalls.MS_RDONLY


def test_rro_bind_sets_read_only_on_every_submount(fake, root, tmp_path):
    # "rro" (the CRI's recursive_read_only): after the bind and its remount, mount_setattr(AT_RECURSIVE)
    _r, fd = root
    (tmp_path / "vol").mkdir()
    rootfs.mount_one(fake, fd, Mount("/vol", "bind", str(tmp_path / "vol"), ("rbind", "ro", "rprivate", "rro")),
                     "/bundle", False)
    calls = [c[0] for c in fake.calls if c[0] in ("mount", "mount_setattr_recursive")]
    assert calls[-1] == "mount_setattr_recursive"
    (_, _fd, attr_set, attr_clr, path), = fake.named("mount_setattr_recursive")
    assert (attr_set, attr_clr, path) == (syscalls.MOUNT_ATTR_RDONLY, 0, "/vol")
    assert rootfs.parse_options(("rro",)).data == ""  # not handed to mount(2) as data


def test_relative_bind_source_is_relative_to_the_bundle(fake, root, tmp_path):
    _r, fd = root
    (tmp_path / "data").mkdir()
    rootfs.mount_one(fake, fd, Mount("/data", "bind", "data", ("bind",)), str(tmp_path), False)
    assert fake.named("mount")[0][1] == str(tmp_path / "data")


def test_missing_bind_source_names_the_mount(fake, root):
    _r, fd = root
    with pytest.raises(rootfs.MountSourceError, match="mount /data: bind source /nonexistent") as raised:
        rootfs.mount_one(fake, fd, Mount("/data", "bind", "/nonexistent", ("bind",)), "/bundle", False)
    assert raised.value.errno == errno.ENOENT and errors.kind_of(raised.value) is errors.InvalidArgumentError


def test_masked_paths_refuse_symlinks_and_mask_files_with_null(fake, root):
    r, fd = root
    (r / "secret").write_text("x")
    (r / "link").symlink_to("/secret")
    rootfs.mask_paths(fake, fd, ("/secret", "/missing"))
    assert fake.targets == [str(r / "secret")]
    (_, source, _target, _fstype, flags, _data), = fake.named("mount")
    assert source.startswith("/proc/self/fd/") and flags == syscalls.MS_BIND  # the host's verified null device
    with pytest.raises(rootfs.MountRefused, match="masked path /link is a symlink") as raised:
        rootfs.mask_paths(fake, fd, ("/link",))
    assert raised.value.errno == errno.ELOOP and errors.kind_of(raised.value) is errors.FailedPreconditionError


def test_devices_and_dev_symlinks_are_made_through_the_syscall_layer(fake, root):
    """With the fake, no node, mode, owner or link appears on disk: every one was a call on `kernel`."""
    r, fd = root
    rootfs.create_device(fake, fd, Device("c", "/dev/fuse", 10, 229, 0o620, 7, 8), bind=False)
    rootfs._dev_symlinks(fake, fd)
    assert os.listdir(r / "dev") == []  # only the directory was made, as the real runtime would
    (_, name, mode, device, _dirfd), = fake.named("mknod")
    assert (name, mode, device) == ("fuse", stat.S_IFCHR | 0o620, os.makedev(10, 229))
    assert [c[1:3] for c in fake.named("chmod")] == [("fuse", 0o620)]
    assert [c[1:4] for c in fake.named("chown")] == [("fuse", 7, 8)]
    assert [(c[1], c[2]) for c in fake.named("symlink")] == [(src, os.path.basename(dst))
                                                            for src, dst in rootfs.DEV_SYMLINKS]


def test_a_device_in_a_user_namespace_is_a_bind_of_the_hosts_node(fake, root):
    r, fd = root
    rootfs.create_device(fake, fd, Device("c", "/dev/null", 1, 3, 0o666, 0, 0), bind=True)
    assert fake.named("mknod") == []
    (_, source, _target, _fstype, flags, _data), = fake.named("mount")
    assert (source, flags) == ("/dev/null", syscalls.MS_BIND)
    assert fake.targets == [str(r / "dev" / "null")] and (r / "dev" / "null").stat().st_size == 0


def test_a_destination_spelled_with_the_rootfs_host_path_is_below_the_root():
    m = rootfs.below_root(Mount("/b/rootfs/mnt/x", "bind", "/src", ("rbind",)), "/b/rootfs/")
    assert m == Mount("/mnt/x", "bind", "/src", ("rbind",))
    assert rootfs.below_root(Mount("/b/rootfs", "tmpfs"), "/b/rootfs").destination == "/"
    assert rootfs.below_root(Mount("/b/rootfsx/y", "tmpfs"), "/b/rootfs").destination == "/b/rootfsx/y"


def test_a_bind_target_through_a_dangling_symlink_is_made_where_the_symlinks_lead(fake, root, tmp_path):
    # runc's "bind mount through a dangling symlink component": /etc/hosts -> /jump/baz/hosts, /jump -> /tmp/foo/bar
    r, fd = root
    (r / "jump").symlink_to("/tmp/foo/bar")
    (r / "etc" / "hosts").symlink_to("/jump/baz/hosts")
    src = tmp_path / "hosts"
    src.write_text("")
    rootfs.mount_one(fake, fd, Mount("/etc/hosts", "bind", str(src), ("bind",)), "/bundle", False)
    assert (r / "tmp" / "foo" / "bar" / "baz" / "hosts").is_file()
    assert fake.targets == [str(r / "tmp" / "foo" / "bar" / "baz" / "hosts")]


def test_a_symlink_loop_on_the_way_to_a_target_is_refused(fake, root):
    r, fd = root
    (r / "loop").symlink_to("/loop")
    with pytest.raises(SyscallError) as e:
        rootfs.mount_one(fake, fd, Mount("/loop/x", "tmpfs", "tmpfs"), "/bundle", False)
    assert e.value.errno == errno.ELOOP


def _spec_with_binds():
    from pyruntime.oci import spec as specmod
    from pyruntime.oci.default import default_spec
    config = default_spec()
    ids = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    first = len(config["mounts"])
    config["mounts"] += [
        {"destination": "/v", "type": "bind", "source": "/host/v", "options": ["rbind", "ridmap"],
         "uidMappings": ids, "gidMappings": ids},
        {"destination": "/in", "type": "bind", "source": "/b/rootfs/x", "options": ["bind"]},
        {"destination": "/z", "type": "bind", "source": "/host/z", "options": ["bind"]},
    ]
    return specmod.parse(config, "/b"), first


def test_bind_sources_outside_the_rootfs_are_copied_the_idmapped_ones_idmapped(fake):
    """In a container with a user namespace: what its root could not reach or idmap, the host's root does."""
    spec, first = _spec_with_binds()
    fds = rootfs.open_sources(fake, spec, "/b", {first: 7})
    assert sorted(fds) == [first, first + 2]  # not the source inside the rootfs
    assert fake.named("clone_mount") == [("clone_mount", "/host/v", True, 7, True),
                                         ("clone_mount", "/host/z", False, None, False)]


def test_an_idmapped_source_that_cannot_be_idmapped_fails_with_the_hosts_error():
    spec, first = _spec_with_binds()

    class NoIdmap(FakeSyscalls):
        def clone_mount(self, source, recursive, userns_fd=None, ridmap=False):
            if userns_fd is not None:
                raise SyscallError(errno.EINVAL, f"mount_setattr {source} (idmap): Invalid argument")
            return 0
    with pytest.raises(SyscallError, match=r"mount /v: idmapped source /host/v: mount_setattr /host/v \(idmap\)"):
        rootfs.open_sources(NoIdmap(), spec, "/b", {first: 7})
