"""pyruntime.record stands in for frozen dataclasses on the start path; it must behave like them where used."""
from __future__ import annotations

import pytest

from pyruntime.record import Factory, fields, record, replace


@record
class Point:
    x: int
    y: int = 0
    tags: dict = Factory(dict)
    raw: dict = Factory(dict, compare=False)


def test_defaults_factories_and_keywords() -> None:
    a, b = Point(1), Point(x=1)
    assert (a.x, a.y, a.tags, a.raw) == (1, 0, {}, {})
    assert a.tags is not b.tags
    assert Point(1, 2).y == 2
    assert fields(a) == ("x", "y", "tags", "raw")


def test_equality_hash_and_repr_skip_uncompared_fields() -> None:
    assert Point(1, raw={"a": 1}) == Point(1)
    assert Point(1) != Point(2)
    assert Point(1).__eq__((1, 0)) is NotImplemented
    assert hash(Point(1, 2, tags=None)) == hash(Point(1, 2, tags=None, raw={"b": 2}))  # type: ignore[arg-type]  # a dict would not hash
    assert repr(Point(1)) == "Point(x=1, y=0, tags={})"


def test_replace_keeps_other_fields() -> None:
    p = replace(Point(1, 2, raw={"r": 1}), y=3)
    assert (p.x, p.y, p.raw) == (1, 3, {"r": 1})


def test_bad_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point()  # type: ignore[call-arg]  # the mistake under test
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=2)  # type: ignore[call-arg]  # the mistake under test
    with pytest.raises(TypeError, match="multiple values"):
        Point(1, x=2)  # type: ignore[misc]  # the mistake under test
    with pytest.raises(TypeError, match="takes 4 positional arguments"):
        Point(1, 2, {}, {}, 5)  # type: ignore[call-arg]  # the mistake under test
