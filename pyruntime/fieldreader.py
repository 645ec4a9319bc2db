"""The runtime's reader of JSON configuration fields: pynode_os.fieldreader's, raising SpecError.

config.json is read section by section by the module that owns the section (oci/spec.py for the
process, mounts and namespaces; linux/cgroups/resources.py, linux/seccomp/profile.py and
linux/capabilities.py for theirs, because only they know what their kernel subsystem accepts). All of
them read through `Obj`, so a user sees one wording wherever the mistake is
(`linux.resources.memory.limit: must be an integer, got "1G"`), and a caller catches one error type.
It sits at the package top because `pyruntime.linux` may not import `pyruntime.oci`.
"""
from __future__ import annotations

import builtins

from pynode_os import fieldreader
from pyruntime import fastjson
from pyruntime.errors import InvalidArgumentError


class SpecError(InvalidArgumentError):
    """A configuration that cannot be applied; the message starts with the field's path."""


class Obj(fieldreader.Obj):
    """One JSON object of a configuration at `path` ("" for the document itself)."""

    __slots__ = ()
    error_type = SpecError
    root = "config"
    dumps = staticmethod(fastjson.dumps)

    def cpu_list(self, key: builtins.str) -> builtins.str | None:
        """A cpuset list such as `0-3,7` (CPUs or memory nodes), stripped; checked here because the kernel's
        EINVAL would not say which field."""
        value = self.str(key)
        if value is None:
            return None
        text = value.strip()
        for part in text.split(",") if text else ():
            bounds = part.split("-")
            if len(bounds) > 2 or not all(b.strip().isdigit() for b in bounds):
                raise SpecError(f"{self.name(key)}: must be a list like '0-3,7', got {shown(value)}")
            if len(bounds) == 2 and int(bounds[0]) > int(bounds[1]):
                raise SpecError(f"{self.name(key)}: has a range whose start is above its end, got {shown(value)}")
        return text


shown, check_type, check_range = Obj.shown, Obj.check_type, Obj.check_range


def cpu_set(cpu_list: str) -> frozenset[int]:
    """The numbers of a list that Obj.cpu_list accepted: `0-2,7` is {0, 1, 2, 7}."""
    out: set[int] = set()
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)
