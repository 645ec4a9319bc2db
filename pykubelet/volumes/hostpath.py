"""hostPath volumes: a path of the node handed to the container as it is, after the check its `type` asks.

The check is the only protection a hostPath has (the API server lets any pod that may use hostPath name
any path): a pod that expects a socket must not get a directory someone put there, and the *OrCreate
types make what is missing (a directory 0755, an empty file 0644) as the kubelet does. Errors name the
volume's field path, the path and what it is instead.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from pykubelet.volumes.errors import VolumeError

CHECKS = {"Directory": stat.S_ISDIR, "File": stat.S_ISREG, "Socket": stat.S_ISSOCK, "CharDevice": stat.S_ISCHR,
          "BlockDevice": stat.S_ISBLK}
KIND = {"Directory": "directory", "File": "file", "Socket": "socket", "CharDevice": "character device",
        "BlockDevice": "block device"}


class HostPathError(VolumeError):
    pass


def _what(mode: int) -> str:
    for name, check in CHECKS.items():
        if check(mode):
            return KIND[name]
    return "special file"


def check(field: str, path: str, type_: str | None) -> Path:
    """The host path of a hostPath volume (`field` is its field path in the pod, for errors), made or
    checked as `type_` says."""
    p = Path(path)
    type_ = type_ or ""
    if type_ == "":
        return p
    if type_ == "DirectoryOrCreate":
        if not p.exists():
            p.mkdir(mode=0o755, parents=True, exist_ok=True)
        type_ = "Directory"
    elif type_ == "FileOrCreate":
        if not p.exists():
            p.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
        type_ = "File"
    if type_ not in CHECKS:
        raise HostPathError(f"{field}.type: {type_!r} is an invalid hostPath type")
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        raise HostPathError(f"{field}: hostPath type check failed: {path} is not a {KIND[type_]}: "
                            f"{e.strerror}") from e
    if not CHECKS[type_](mode):
        raise HostPathError(f"{field}: hostPath type check failed: {path} is not a {KIND[type_]}, "
                            f"it's a {_what(mode)}")
    return p
