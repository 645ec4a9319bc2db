"""The mount options of the runtime spec as the kernel's mount flags, in the one place that both the
rootfs code (which applies them) and `pyruntime features` (which lists them) read, below both layers."""
from __future__ import annotations

from pyruntime.linux import syscalls as sc

# option -> (set flags, clear flags)
FLAG_OPTIONS: dict[str, tuple[int, int]] = {
    "defaults": (0, 0), "ro": (sc.MS_RDONLY, 0), "rw": (0, sc.MS_RDONLY),
    "suid": (0, sc.MS_NOSUID), "nosuid": (sc.MS_NOSUID, 0), "dev": (0, sc.MS_NODEV), "nodev": (sc.MS_NODEV, 0),
    "exec": (0, sc.MS_NOEXEC), "noexec": (sc.MS_NOEXEC, 0), "sync": (sc.MS_SYNCHRONOUS, 0),
    "async": (0, sc.MS_SYNCHRONOUS), "dirsync": (sc.MS_DIRSYNC, 0), "remount": (sc.MS_REMOUNT, 0),
    "mand": (sc.MS_MANDLOCK, 0), "nomand": (0, sc.MS_MANDLOCK), "atime": (0, sc.MS_NOATIME),
    "noatime": (sc.MS_NOATIME, 0), "diratime": (0, sc.MS_NODIRATIME), "nodiratime": (sc.MS_NODIRATIME, 0),
    "relatime": (sc.MS_RELATIME, 0), "norelatime": (0, sc.MS_RELATIME), "strictatime": (sc.MS_STRICTATIME, 0),
    "nostrictatime": (0, sc.MS_STRICTATIME), "lazytime": (sc.MS_LAZYTIME, 0), "nolazytime": (0, sc.MS_LAZYTIME),
    "bind": (sc.MS_BIND, 0), "rbind": (sc.MS_BIND | sc.MS_REC, 0), "nosymfollow": (sc.MS_NOSYMFOLLOW, 0),
    "symfollow": (0, sc.MS_NOSYMFOLLOW), "silent": (sc.MS_SILENT, 0), "loud": (0, sc.MS_SILENT),
}
PROPAGATION_OPTIONS = {
    "private": sc.MS_PRIVATE, "rprivate": sc.MS_PRIVATE | sc.MS_REC, "shared": sc.MS_SHARED,
    "rshared": sc.MS_SHARED | sc.MS_REC, "slave": sc.MS_SLAVE, "rslave": sc.MS_SLAVE | sc.MS_REC,
    "unbindable": sc.MS_UNBINDABLE, "runbindable": sc.MS_UNBINDABLE | sc.MS_REC,
}
# runc's recursive options (mount_setattr with AT_RECURSIVE, after the mount): option -> (set, clear).
# An access-time mode is a field, not a bit: setting one clears the whole field first (mount_setattr(2)).
RECURSIVE_OPTIONS: dict[str, tuple[int, int]] = {
    "rro": (sc.MOUNT_ATTR_RDONLY, 0), "rrw": (0, sc.MOUNT_ATTR_RDONLY),
    "rnosuid": (sc.MOUNT_ATTR_NOSUID, 0), "rsuid": (0, sc.MOUNT_ATTR_NOSUID),
    "rnodev": (sc.MOUNT_ATTR_NODEV, 0), "rdev": (0, sc.MOUNT_ATTR_NODEV),
    "rnoexec": (sc.MOUNT_ATTR_NOEXEC, 0), "rexec": (0, sc.MOUNT_ATTR_NOEXEC),
    "rnodiratime": (sc.MOUNT_ATTR_NODIRATIME, 0), "rdiratime": (0, sc.MOUNT_ATTR_NODIRATIME),
    "rrelatime": (sc.MOUNT_ATTR_RELATIME, sc.MOUNT_ATTR__ATIME), "rnorelatime": (0, sc.MOUNT_ATTR_RELATIME),
    "rnoatime": (sc.MOUNT_ATTR_NOATIME, sc.MOUNT_ATTR__ATIME), "ratime": (0, sc.MOUNT_ATTR_NOATIME),
    "rstrictatime": (sc.MOUNT_ATTR_STRICTATIME, sc.MOUNT_ATTR__ATIME),
    "rnostrictatime": (0, sc.MOUNT_ATTR_STRICTATIME),
    "rnosymfollow": (sc.MOUNT_ATTR_NOSYMFOLLOW, 0), "rsymfollow": (0, sc.MOUNT_ATTR_NOSYMFOLLOW),
}
# options that are not flags and not data: runc accepts these and ignores or handles them elsewhere
IGNORED_OPTIONS = {"tmpcopyup", "idmap", "ridmap", "recursive"}
