"""pynode_os.mounts: each failure names the call and the path, in the caller's words when it gives them, and
the runtime's syscall layer passes the same message on as its SyscallError. Only calls that fail or read
are made here: nothing is mounted."""
from __future__ import annotations

import errno

import pytest

from pykubelet.volumes import mount
from pynode_os import mounts
from pyruntime.linux.syscalls import LinuxSyscalls, SyscallError

PROC_SUPER_MAGIC = 0x9FA0


def test_statfs_names_the_path(tmp_path):
    assert mounts.statfs_type("/proc") == PROC_SUPER_MAGIC
    with pytest.raises(mounts.MountError, match=f"^\\[Errno 2\\] statfs {tmp_path}/missing: No such file") as e:
        mounts.statfs_type(tmp_path / "missing")
    assert e.value.errno == errno.ENOENT


def test_umount_of_what_is_no_mount_point_names_it_in_the_callers_words(tmp_path):
    with pytest.raises(mounts.MountError, match=f"umount2 {tmp_path}: Invalid argument"):
        mounts.umount(tmp_path, mounts.MNT_DETACH)
    with pytest.raises(mount.MountError, match=f"^\\[Errno 22\\] umount {tmp_path}: Invalid argument$"):
        mount.unmount(tmp_path)  # the kubelet's volume mounts


def test_mount_errors_name_every_argument(tmp_path):
    with pytest.raises(mounts.MountError) as e:
        mounts.mount(tmp_path / "missing", tmp_path, None, mounts.MS_BIND | mounts.MS_REC, None)
    assert e.value.strerror == (f"mount({tmp_path}/missing, type=none, flags=0x5000, data=) on {tmp_path}: "
                                "No such file or directory")


def test_the_runtime_gets_its_syscall_error_with_the_same_message(tmp_path):
    with pytest.raises(SyscallError, match=f"^\\[Errno 22\\] umount2 {tmp_path}: Invalid argument$") as e:
        LinuxSyscalls().umount(str(tmp_path), mounts.MNT_DETACH)
    assert e.value.errno == errno.EINVAL and e.value.__cause__ is None
