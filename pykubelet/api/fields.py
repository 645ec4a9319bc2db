"""The kubelet's reader of API objects' JSON fields: types checked, every error named by its full path.

The same reader, and the same wording, as the runtime's pyruntime/fieldreader.py
(`spec.containers[0].ports[1].containerPort: must be an integer, got "80"`), which the layer contracts keep
the kubelet from importing. An absent key and a JSON null both mean "not given", as in the API's Go types.
"""
from __future__ import annotations

import builtins
import json
from typing import Any, Literal, overload

from pykubelet.errors import InvalidArgumentError

_JSON_NAMES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array",
               float: "a number"}


class FieldError(InvalidArgumentError):
    """An API object the kubelet cannot act on; the message starts with the field's path."""


def shown(value: Any) -> str:
    """A value as written in JSON, cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_type(value: Any, name: str, kind: type | tuple) -> Any:
    """`value` if it is of `kind` (a JSON boolean is never an integer), else a FieldError naming `name`."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (type(value) is bool and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
        raise FieldError(f"{name}: must be {names}, got {shown(value)}")
    return value


class Obj:
    """One JSON object at `path` ("" for the document itself)."""

    __slots__ = ("path", "raw")

    def __init__(self, raw: Any, path: str) -> None:
        check_type(raw, path or "object", dict)
        self.raw: dict = raw
        self.path = path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, message: str) -> FieldError:
        """An error about this object as a whole."""
        return FieldError(f"{self.path or 'object'}: {message}")

    def get(self, key: str, kind: type | tuple, default: Any = None, required: bool = False) -> Any:
        value = self.raw.get(key)
        if value is None:
            if required:
                raise FieldError(f"{self.name(key)}: required")
            return default
        return check_type(value, self.name(key), kind)

    # The overloads tell a type checker that a required field, or one with a default, is never None.
    @overload
    def str(self, key: builtins.str, default: builtins.str) -> builtins.str: ...
    @overload
    def str(self, key: builtins.str, *, required: Literal[True]) -> builtins.str: ...
    @overload
    def str(self, key: builtins.str) -> builtins.str | None: ...

    def str(self, key: builtins.str, default: builtins.str | None = None,
            required: builtins.bool = False) -> builtins.str | None:
        return self.get(key, builtins.str, default, required)

    @overload
    def int(self, key: builtins.str, default: builtins.int, *, lo: builtins.int | None = ...,
            hi: builtins.int | None = ...) -> builtins.int: ...
    @overload
    def int(self, key: builtins.str, *, lo: builtins.int | None = ..., hi: builtins.int | None = ...,
            required: Literal[True]) -> builtins.int: ...
    @overload
    def int(self, key: builtins.str, *, lo: builtins.int | None = ...,
            hi: builtins.int | None = ...) -> builtins.int | None: ...

    def int(self, key: builtins.str, default: builtins.int | None = None, *, lo: builtins.int | None = None,
            hi: builtins.int | None = None, required: builtins.bool = False) -> builtins.int | None:
        value = self.get(key, builtins.int, default, required)
        if value is None or ((lo is None or value >= lo) and (hi is None or value <= hi)):
            return value
        if hi is None:
            raise FieldError(f"{self.name(key)}: {value} is below the minimum {lo}")
        if lo is None:
            raise FieldError(f"{self.name(key)}: {value} is above the maximum {hi}")
        raise FieldError(f"{self.name(key)}: {value} is out of range [{lo}, {hi}]")

    @overload
    def bool(self, key: builtins.str, default: builtins.bool = ...) -> builtins.bool: ...
    @overload
    def bool(self, key: builtins.str, default: None) -> builtins.bool | None: ...

    def bool(self, key: builtins.str, default: builtins.bool | None = False) -> builtins.bool | None:
        return self.get(key, builtins.bool, default)

    @overload
    def choice(self, key: builtins.str, known: tuple[builtins.str, ...], what: builtins.str,
               default: builtins.str) -> builtins.str: ...
    @overload
    def choice(self, key: builtins.str, known: tuple[builtins.str, ...],
               what: builtins.str) -> builtins.str | None: ...

    def choice(self, key: builtins.str, known: tuple[builtins.str, ...], what: builtins.str,
               default: builtins.str | None = None) -> builtins.str | None:
        """A string that must be one of `known`; `what` names the kind of value in the error."""
        value = self.get(key, builtins.str, default)
        if value is not None and value not in known:
            raise FieldError(f"{self.name(key)}: unknown {what} {shown(value)}")
        return value

    def strings(self, key: builtins.str) -> tuple[builtins.str, ...]:
        values = self.get(key, list, [])
        for i, v in enumerate(values):
            check_type(v, f"{self.name(key)}[{i}]", builtins.str)
        return tuple(values)

    def ints(self, key: builtins.str) -> tuple[builtins.int, ...]:
        values = self.get(key, list, [])
        for i, v in enumerate(values):
            check_type(v, f"{self.name(key)}[{i}]", builtins.int)
        return tuple(values)

    def obj(self, key: builtins.str) -> Obj | None:
        """The object at `key`, if given."""
        value = self.get(key, dict)
        return None if value is None else Obj(value, self.name(key))

    def child(self, key: builtins.str) -> Obj:
        """The object at `key`, which must be given."""
        return Obj(self.get(key, dict, required=True), self.name(key))

    def objs(self, key: builtins.str) -> list[Obj]:
        return [Obj(v, f"{self.name(key)}[{i}]") for i, v in enumerate(self.get(key, list, []))]

    def str_map(self, key: builtins.str) -> dict[builtins.str, builtins.str]:
        value = self.get(key, dict, {})
        for k, v in value.items():
            check_type(v, f"{self.name(key)}[{json.dumps(k)}]", builtins.str)
        return dict(value)

    def quantities(self, key: builtins.str) -> dict[builtins.str, builtins.str]:
        """A resource list ({"cpu": "100m", "memory": 64Mi}): the quantities as strings, as the API writes
        them (a manifest may give a bare number)."""
        value = self.get(key, dict, {})
        for k, v in value.items():
            check_type(v, f"{self.name(key)}[{json.dumps(k)}]", (builtins.str, builtins.int, float))
        return {k: v if isinstance(v, builtins.str) else str(v) for k, v in value.items()}
