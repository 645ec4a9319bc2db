"""The one reader of JSON configuration fields: types checked, every error named by its full path.

config.json is read section by section by the module that owns the section (oci/spec.py for the
process, mounts and namespaces; linux/cgroups/resources.py, linux/seccomp/profile.py and
linux/capabilities.py for theirs, because only they know what their kernel subsystem accepts). All of
them read through `Obj`, so a user sees one wording wherever the mistake is
(`linux.resources.memory.limit: must be an integer, got "1G"`), and a caller catches one error type.
It sits at the package top because `pyruntime.linux` may not import `pyruntime.oci`.
"""
from __future__ import annotations

import builtins

from pyruntime import fastjson
from pyruntime.errors import InvalidArgumentError

TYPE_CHECKING = False
if TYPE_CHECKING:  # the overloads below are the type checker's only
    from collections.abc import Iterable
    from typing import Any, Literal, overload

_JSON_NAMES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array"}


class SpecError(InvalidArgumentError):
    """A configuration that cannot be applied; the message starts with the field's path."""


def shown(value: Any) -> str:
    """A value as the user wrote it in JSON, cut short."""
    try:
        text = fastjson.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_range(value: int, name: str, lo: int | None, hi: int | None) -> int:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi is None:
            raise SpecError(f"{name}: {value} is below the minimum {lo}")
        if lo is None:
            raise SpecError(f"{name}: {value} is above the maximum {hi}")
        raise SpecError(f"{name}: {value} is out of range [{lo}, {hi}]")
    return value


def check_type(value: Any, name: str, kind: type | tuple) -> Any:
    """`value` if it is of `kind` (a JSON boolean is never an integer), else a SpecError naming `name`."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (type(value) is bool and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
        raise SpecError(f"{name}: must be {names}, got {shown(value)}")
    return value


class Obj:
    """One JSON object at `path` ("" for the document itself). An absent key and a JSON null both
    mean "not given", as in the OCI spec's Go types."""

    __slots__ = ("path", "raw")

    def __init__(self, raw: Any, path: str) -> None:
        check_type(raw, path or "config", dict)
        self.raw, self.path = raw, path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type | tuple, default: Any = None, required: bool = False) -> Any:
        value = self.raw.get(key)
        if value is None:
            if required:
                raise SpecError(f"{self.name(key)}: required")
            return default
        return check_type(value, self.name(key), kind)

    # The overloads tell a type checker that a required field, or one with a default, is never None.
    if TYPE_CHECKING:
        @overload
        def int(self, key: str, default: int, *, lo: int | None = ..., hi: int | None = ...,
                required: bool = ...) -> int: ...
        @overload
        def int(self, key: str, default: None = ..., *, lo: int | None = ..., hi: int | None = ...,
                required: Literal[True]) -> int: ...
        @overload
        def int(self, key: str, default: int | None = ..., *, lo: int | None = ..., hi: int | None = ...,
                required: bool = ...) -> int | None: ...

    def int(self, key: str, default: int | None = None, *, lo: int | None = None, hi: int | None = None,
            required: bool = False) -> int | None:
        value = self.get(key, int, default, required)
        return value if value is None else check_range(value, self.name(key), lo, hi)

    if TYPE_CHECKING:
        @overload
        def str(self, key: str, default: str, required: bool = ...) -> str: ...
        @overload
        def str(self, key: str, default: None = ..., *, required: Literal[True]) -> str: ...
        @overload
        def str(self, key: str, default: None, required: Literal[True]) -> str: ...
        @overload
        def str(self, key: str, default: str | None = ..., required: bool = ...) -> str | None: ...

    def str(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        return self.get(key, str, default, required)

    if TYPE_CHECKING:
        @overload
        def bool(self, key: builtins.str, default: builtins.bool = ...) -> builtins.bool: ...
        @overload
        def bool(self, key: builtins.str, default: None) -> builtins.bool | None: ...

    def bool(self, key: builtins.str, default: builtins.bool | None = False) -> builtins.bool | None:
        return self.get(key, bool, default)

    if TYPE_CHECKING:
        @overload
        def choice(self, key: builtins.str, known: Iterable[builtins.str], what: builtins.str,
                   default: builtins.str, required: builtins.bool = ...) -> builtins.str: ...
        @overload
        def choice(self, key: builtins.str, known: Iterable[builtins.str], what: builtins.str,
                   default: None = ..., *, required: Literal[True]) -> builtins.str: ...
        @overload
        def choice(self, key: builtins.str, known: Iterable[builtins.str], what: builtins.str,
                   default: builtins.str | None = ..., required: builtins.bool = ...) -> builtins.str | None: ...

    def choice(self, key: builtins.str, known: Iterable[builtins.str], what: builtins.str,
               default: builtins.str | None = None, required: builtins.bool = False) -> builtins.str | None:
        """A string that must be one of `known`; `what` names the kind of value in the error."""
        value = self.str(key, default, required)
        if value is not None and value not in known:
            raise SpecError(f"{self.name(key)}: unknown {what} {shown(value)}")
        return value

    def list(self, key: builtins.str, required: builtins.bool = False) -> builtins.list:
        return self.get(key, list, [], required)

    def strings(self, key: builtins.str, required: builtins.bool = False) -> builtins.list[builtins.str]:
        values = self.list(key, required)
        for i, v in enumerate(values):
            check_type(v, f"{self.name(key)}[{i}]", str)
        return values

    if TYPE_CHECKING:
        @overload
        def obj(self, key: builtins.str, required: Literal[True]) -> Obj: ...
        @overload
        def obj(self, key: builtins.str, required: builtins.bool = ...) -> Obj | None: ...

    def obj(self, key: builtins.str, required: builtins.bool = False) -> Obj | None:
        value = self.get(key, dict, None, required)
        return None if value is None else Obj(value, self.name(key))

    def objs(self, key: builtins.str) -> builtins.list[Obj]:
        return [Obj(v, f"{self.name(key)}[{i}]") for i, v in enumerate(self.list(key))]

    def str_map(self, key: builtins.str) -> dict[builtins.str, builtins.str]:
        value = self.get(key, dict, {})
        for k, v in value.items():
            check_type(v, f"{self.name(key)}[{fastjson.dumps(k)}]", str)
        return dict(value)

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


def cpu_set(cpu_list: str) -> frozenset[int]:
    """The numbers of a list that Obj.cpu_list accepted: `0-2,7` is {0, 1, 2, 7}."""
    out: set[int] = set()
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)
