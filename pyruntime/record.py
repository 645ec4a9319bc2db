"""`@record`: value classes with __init__, ==, hash and repr, for the types on the container start path.

dataclasses writes each class's methods as source text and exec()s it, and imports inspect (with ast, dis and
tokenize) to do so, which every `pyruntime create` would pay for its spec and resource types
(tests/unit/test_start_path_imports.py keeps them off the start path). Here the methods are shared functions
driven by the field list, so defining a class compiles nothing. Only what those types use is supported:
annotated fields, all positional-or-keyword, each with no default, a plain default or a `Factory`. Instances are
meant to be treated as immutable (they hash by value) but, unlike frozen dataclasses, do not enforce it.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:
    def dataclass_transform() -> Callable[[type], type]:
        """typing's, which at run time only marks the class for type checkers."""
        return lambda cls: cls

_MISSING = object()


class _Factory:
    __slots__ = ("compare", "make")

    def __init__(self, make: Callable[[], Any], compare: bool) -> None:
        self.make = make
        self.compare = compare


def Factory(make: Callable[[], T], compare: bool = True) -> T:
    """A default built anew for each instance (dataclasses' default_factory). A field with
    compare=False is left out of ==, hash and repr, like dataclasses' field(compare=False, repr=False).
    Typed as what `make` returns, like dataclasses.field, so `tags: dict = Factory(dict)` checks."""
    return _Factory(make, compare)  # type: ignore[return-value]  # a marker @record replaces per instance


def fields(obj: object) -> tuple[str, ...]:
    """The field names of a @record class or instance, in definition order."""
    names: tuple[str, ...] = getattr(obj, "__value_fields__")  # noqa: B009 -- set by @record, unknown to its type
    return names


def replace(obj: T, **changes: Any) -> T:
    """A copy of `obj` with some fields changed (dataclasses.replace)."""
    return type(obj)(**{**{name: getattr(obj, name) for name in fields(obj)}, **changes})


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    names: tuple[str, ...] = cls.__value_fields__
    if len(args) > len(names):
        raise TypeError(f"{cls.__name__}() takes {len(names)} positional arguments but {len(args)} were given")
    values = dict(zip(names, args, strict=False))  # fewer args than names: the rest by keyword
    for key, val in kwargs.items():
        if key not in names:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {key!r}")
        if key in values:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {key!r}")
        values[key] = val
    for name in names:
        if name not in values:
            default = cls.__value_defaults__.get(name, _MISSING)
            if default is _MISSING:
                raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
            values[name] = default.make() if isinstance(default, _Factory) else default
    self.__dict__.update(values)


def _key(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in type(self).__value_compared__)


def _eq(self: Any, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _key(self) == _key(other)


def _hash(self: Any) -> int:
    return hash(_key(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__value_compared__)
    return f"{type(self).__qualname__}({shown})"


@dataclass_transform()
def record(cls: type[T]) -> type[T]:
    """Makes `cls` a record class over its annotated fields (see the module docstring). Declared a
    dataclass_transform so that type checkers derive the same __init__ from the fields as this does."""
    names = tuple(cls.__dict__.get("__annotations__", {}))  # noqa: RUF063 -- inspect is what this avoids
    defaults = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
    for name, default in defaults.items():
        if isinstance(default, _Factory):
            delattr(cls, name)
    compared = tuple(n for n in names if not (isinstance(defaults.get(n), _Factory) and not defaults[n].compare))
    made: Any = cls  # the class gains attributes and methods its type does not declare
    made.__value_fields__ = names
    made.__value_defaults__ = defaults
    made.__value_compared__ = compared
    made.__init__ = _init
    made.__eq__ = _eq
    made.__hash__ = _hash
    made.__repr__ = _repr
    return cls
