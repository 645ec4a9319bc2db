"""The one reader of JSON fields, as the runtime's config.json and the kubelet's API objects use it: the same
wording in both, each raising its own package's invalid-argument error."""
from __future__ import annotations

import pytest

from pykubelet import errors as kubelet_errors
from pykubelet.api import fields
from pyruntime import errors as runtime_errors
from pyruntime import fieldreader

READERS = [(fieldreader.Obj, fieldreader.SpecError, runtime_errors.InvalidArgumentError, "config"),
           (fields.Obj, fields.FieldError, kubelet_errors.InvalidArgumentError, "object")]


@pytest.mark.parametrize(("obj", "error", "kind", "root"), READERS)
def test_each_package_s_reader_raises_its_own_error_with_one_wording(obj, error, kind, root) -> None:
    assert issubclass(error, kind)
    doc = obj({"spec": {"n": True, "ports": [{"p": "80"}], "names": ["a", 1], "mode": "x", "m": {"k": 2}}}, "")
    spec = doc.obj("spec", required=True)
    assert type(spec) is obj and spec.path == "spec"
    for read, message in [
        (lambda: spec.int("n"), 'spec.n: must be an integer, got true'),
        (lambda: spec.objs("ports")[0].int("p"), 'spec.ports[0].p: must be an integer, got "80"'),
        (lambda: spec.strings("names"), "spec.names[1]: must be a string, got 1"),
        (lambda: spec.choice("mode", ("a", "b"), "mode"), 'spec.mode: unknown mode "x"'),
        (lambda: spec.str_map("m"), 'spec.m["k"]: must be a string, got 2'),
        (lambda: spec.str("absent", required=True), "spec.absent: required"),
        (lambda: doc.obj("gone", required=True), "gone: required"),
        (lambda: obj([], ""), f"{root}: must be an object, got []"),
    ]:
        with pytest.raises(error) as e:
            read()
        assert str(e.value) == message
    assert str(doc.error("broken")) == f"{root}: broken" and isinstance(doc.error("x"), error)


@pytest.mark.parametrize(("obj", "error", "kind", "root"), READERS)
def test_values_defaults_and_ranges(obj, error, kind, root) -> None:
    o = obj({"i": 5, "s": None, "l": ["a", "b"], "is": [1, 2]}, "x")
    assert (o.int("i", lo=0, hi=9), o.int("s", 7), o.str("s"), o.bool("s")) == (5, 7, None, False)
    assert (o.strings("l"), o.ints("is"), o.strings("none"), o.obj("none"), o.objs("none")) == (
        ("a", "b"), (1, 2), (), None, [])
    for lo, hi, message in [(6, None, "x.i: 5 is below the minimum 6"), (None, 4, "x.i: 5 is above the maximum 4"),
                            (6, 9, "x.i: 5 is out of range [6, 9]")]:
        with pytest.raises(error) as e:
            o.int("i", lo=lo, hi=hi)
        assert str(e.value) == message
    assert obj.shown("y" * 100) == '"' + "y" * 56 + "..."
