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
# options applied with mount_setattr(2) to the mount and every mount below it -> the MOUNT_ATTR_* to set
RECURSIVE_ATTR_OPTIONS = {"rro": sc.MOUNT_ATTR_RDONLY}
# options that are not flags and not data: runc accepts these and ignores or handles them elsewhere
IGNORED_OPTIONS = {"tmpcopyup", "idmap", "ridmap", "recursive"}
