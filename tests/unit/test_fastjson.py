"""fastjson answers as `json` does, value for value and error for error (it is `json` without its import)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pyruntime import fastjson

DOCUMENTS = [
    '{"a": [1, 2.5e3, -0, "x\\u00e9\\ud83d\\ude00", null, true, false, {}]}',
    ' \n[1]\t', '"s"', "1", "-1.0e-5", "NaN", "[Infinity,-Infinity]", '{"a":1,"a":2}', '{"k": 1}\n\n',
    '"\\ud800"', b'{"b": "\xc3\xa9"}', b'"\xed\xa0\x80"',
    # malformed: json's own message, line and column
    "", "   ", "[1,]", '{"a" 1}', '"\x01"', '{"a":1} x', "123abc", "\ufeff{}",
    # bytes json decodes by detection: a UTF-8 BOM, UTF-16, not UTF-8 at all
    b"\xef\xbb\xbf{}", '{"u": 16}'.encode("utf-16"), '["le"]'.encode("utf-16-le"), b"\xff\xfe1\x00", b'"\xff"',
    bytearray(b'[1, {"b": 2}]'),
]


def _outcome(call, arg):
    try:
        return "value", call(arg)
    except Exception as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("document", DOCUMENTS, ids=repr)
def test_loads_is_json_loads(document):
    assert repr(_outcome(fastjson.loads, document)) == repr(_outcome(json.loads, document))


def test_deep_nesting_is_a_recursion_error_as_with_json():
    with pytest.raises(RecursionError):
        fastjson.loads("[" * 100_000)


VALUES = [{"a": [1, 2.5, "é\n\x00", None, True, {"b": float("nan")}]}, "str", 1, [], {1: 2, 2.5: "x", None: 1},
          float("inf"), object(), {"k": {1, 2}}, [[]] * 3]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_dumps_is_json_dumps(value):
    assert _outcome(fastjson.dumps, value) == _outcome(json.dumps, value)


def test_a_cycle_is_refused_as_json_refuses_it():
    cycle: list = []
    cycle.append(cycle)
    refused = ("ValueError", "Circular reference detected")
    assert _outcome(fastjson.dumps, cycle) == _outcome(json.dumps, cycle) == refused


def _clean_interpreter(code: str) -> str:
    """Runs `code` where nothing has imported json, as in a runtime command (this test process has)."""
    return subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("document", ["{not json", '{"a": "\x01"}', '{"a": 1} x', ""], ids=repr)
def test_a_malformed_document_gets_jsons_error_before_json_was_imported(document):
    """The C scanner looks up JSONDecodeError in sys.modules to raise it: without `json` loaded it once
    failed with a SystemError ("returned NULL without setting an exception") instead of naming the error."""
    out = _clean_interpreter(f"from pyruntime import fastjson\ntry: fastjson.loads({document!r})\n"
                             "except ValueError as e: print(type(e).__name__, e)")
    assert out.strip() == " ".join(_outcome(json.loads, document))


def test_a_well_formed_document_does_not_import_json():
    """The point of the module: reading and writing a document loads neither json nor re."""
    probe = ("import sys; from pyruntime import fastjson; fastjson.dumps(fastjson.loads('{\"a\": [1]}')); "
             "print(sorted({'json', 're', 'enum'} & set(sys.modules)))")
    assert _clean_interpreter(probe).strip() == "[]"
