"""The reader of JSON objects' fields: types checked, every error named by the field's full path.

The runtime reads config.json through it (pyruntime/fieldreader.py) and the kubelet the API's objects
(pykubelet/api/fields.py), so a user reads one wording whichever made the mistake
(`spec.containers[0].ports[1].containerPort: must be an integer, got "80"`); the two had a copy each, which
the layer contracts kept from importing each other. Each package subclasses `Obj` to raise its own
invalid-argument error, which its callers catch and map (the runtime CLI's exit message, a CRI status, the
kubelet's rejection of a pod), and to add the readers only it needs. The runtime's start path imports it:
it imports nothing, and JSON is written by the subclass's `dumps` (pyruntime's fastjson, the stdlib's json).
An absent key and a JSON null both mean "not given", as in the Go types of the OCI spec and the API.
"""
from __future__ import annotations

import builtins

TYPE_CHECKING = False
if TYPE_CHECKING:  # the annotations and overloads below are the type checker's only
    from collections.abc import Iterable
    from typing import Any, ClassVar, Literal, Self, overload

_JSON_NAMES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array",
               float: "a number"}


class Obj:
    """One JSON object at `path` ("" for the document itself, named `root` in errors)."""

    __slots__ = ("path", "raw")
    error_type: ClassVar[type[Exception]]  # the package's invalid-argument error
    root: ClassVar[builtins.str]  # what errors call the document itself
    if TYPE_CHECKING:
        @staticmethod
        def dumps(value: Any, /) -> builtins.str: ...  # the package's JSON writer, for the values errors show

    def __init__(self, raw: Any, path: builtins.str) -> None:
        self.check_type(raw, path or self.root, dict)
        self.raw: dict = raw
        self.path = path

    @classmethod
    def shown(cls, value: Any) -> builtins.str:
        """A value as written in JSON, cut short."""
        try:
            text = cls.dumps(value)
        except (TypeError, ValueError):
            text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."

    @classmethod
    def check_type(cls, value: Any, name: builtins.str, kind: type | tuple) -> Any:
        """`value` if it is of `kind` (a JSON boolean is never an integer), else the error naming `name`."""
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (type(value) is builtins.bool and builtins.bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
            raise cls.error_type(f"{name}: must be {names}, got {cls.shown(value)}")
        return value

    @classmethod
    def check_range(cls, value: builtins.int, name: builtins.str, lo: builtins.int | None,
                    hi: builtins.int | None) -> builtins.int:
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            if hi is None:
                raise cls.error_type(f"{name}: {value} is below the minimum {lo}")
            if lo is None:
                raise cls.error_type(f"{name}: {value} is above the maximum {hi}")
            raise cls.error_type(f"{name}: {value} is out of range [{lo}, {hi}]")
        return value

    def name(self, key: builtins.str) -> builtins.str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, message: builtins.str) -> Exception:
        """An error about this object as a whole."""
        return self.error_type(f"{self.path or self.root}: {message}")

    def get(self, key: builtins.str, kind: type | tuple, default: Any = None, required: builtins.bool = False) -> Any:
        value = self.raw.get(key)
        if value is None:
            if required:
                raise self.error_type(f"{self.name(key)}: required")
            return default
        return self.check_type(value, self.name(key), kind)

    # The overloads tell a type checker that a required field, or one with a default, is never None.
    if TYPE_CHECKING:
        @overload
        def int(self, key: builtins.str, default: builtins.int, *, lo: builtins.int | None = ...,
                hi: builtins.int | None = ..., required: builtins.bool = ...) -> builtins.int: ...
        @overload
        def int(self, key: builtins.str, default: None = ..., *, lo: builtins.int | None = ...,
                hi: builtins.int | None = ..., required: Literal[True]) -> builtins.int: ...
        @overload
        def int(self, key: builtins.str, default: builtins.int | None = ..., *, lo: builtins.int | None = ...,
                hi: builtins.int | None = ..., required: builtins.bool = ...) -> builtins.int | None: ...

    def int(self, key: builtins.str, default: builtins.int | None = None, *, lo: builtins.int | None = None,
            hi: builtins.int | None = None, required: builtins.bool = False) -> builtins.int | None:
        value = self.get(key, builtins.int, default, required)
        return value if value is None else self.check_range(value, self.name(key), lo, hi)

    if TYPE_CHECKING:
        @overload
        def str(self, key: builtins.str, default: builtins.str, required: builtins.bool = ...) -> builtins.str: ...
        @overload
        def str(self, key: builtins.str, default: None = ..., *, required: Literal[True]) -> builtins.str: ...
        @overload
        def str(self, key: builtins.str, default: None, required: Literal[True]) -> builtins.str: ...
        @overload
        def str(self, key: builtins.str, default: builtins.str | None = ...,
                required: builtins.bool = ...) -> builtins.str | None: ...

    def str(self, key: builtins.str, default: builtins.str | None = None,
            required: builtins.bool = False) -> builtins.str | None:
        return self.get(key, builtins.str, default, required)

    if TYPE_CHECKING:
        @overload
        def bool(self, key: builtins.str, default: builtins.bool = ...) -> builtins.bool: ...
        @overload
        def bool(self, key: builtins.str, default: None) -> builtins.bool | None: ...

    def bool(self, key: builtins.str, default: builtins.bool | None = False) -> builtins.bool | None:
        return self.get(key, builtins.bool, default)

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
            raise self.error_type(f"{self.name(key)}: unknown {what} {self.shown(value)}")
        return value

    def list(self, key: builtins.str, required: builtins.bool = False) -> builtins.list:
        return self.get(key, builtins.list, [], required)

    def strings(self, key: builtins.str, required: builtins.bool = False) -> tuple[builtins.str, ...]:
        values = self.list(key, required)
        for i, v in enumerate(values):
            self.check_type(v, f"{self.name(key)}[{i}]", builtins.str)
        return tuple(values)

    def ints(self, key: builtins.str) -> tuple[builtins.int, ...]:
        values = self.list(key)
        for i, v in enumerate(values):
            self.check_type(v, f"{self.name(key)}[{i}]", builtins.int)
        return tuple(values)

    if TYPE_CHECKING:
        @overload
        def obj(self, key: builtins.str, required: Literal[True]) -> Self: ...
        @overload
        def obj(self, key: builtins.str, required: builtins.bool = ...) -> Self | None: ...

    def obj(self, key: builtins.str, required: builtins.bool = False) -> Self | None:
        value = self.get(key, dict, None, required)
        return None if value is None else type(self)(value, self.name(key))

    def objs(self, key: builtins.str) -> builtins.list[Self]:
        return [type(self)(v, f"{self.name(key)}[{i}]") for i, v in enumerate(self.list(key))]

    def str_map(self, key: builtins.str) -> dict[builtins.str, builtins.str]:
        value = self.get(key, dict, {})
        for k, v in value.items():
            self.check_type(v, f"{self.name(key)}[{type(self).dumps(k)}]", builtins.str)
        return dict(value)
