"""JSON for the runtime's start path, without importing the `json` package.

`import json` would be paid by every runtime command: json.decoder compiles regular expressions at
import, so it imports `re`, and `re` imports `enum`, `functools` and `collections`, more than runc's whole
`start` takes (bench.runtime). CPython's `json` does its real work in its C accelerator `_json` (the
scanner and the encoder); this module drives that accelerator with `json`'s default settings, so a value it returns is
the one `json.loads` or `json.dumps` would return. Whatever it is not sure of goes to `json` itself: a
document that does not parse (so the error a user reads is json's own, with line and column), bytes that
are not plain UTF-8 (json detects UTF-16 and UTF-32 and BOMs), an object the encoder refuses, or an
interpreter without `_json`.

Threat model: config.json and state.json are read by root and may be written by whoever owns the bundle.
The scanner is the one `json` uses on every CPython; nesting depth is bounded by the interpreter's
recursion limit (RecursionError), as with `json`.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

try:
    import _json
except ImportError:  # not CPython: `json` does everything
    _json = None  # type: ignore[assignment]  # the module or None, as json.decoder does

_WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE's characters: what may surround a document


class _Defaults:
    """The attributes `_json.make_scanner` reads, as json.JSONDecoder() sets them."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan = (_json.make_scanner(_Defaults())  # type: ignore[arg-type]  # typeshed: a scanner; C reads the attributes
         if _json is not None else None)


def loads(document: str | bytes | bytearray) -> Any:
    """json.loads(document)."""
    if _scan is None:
        return _json_module().loads(document)
    try:
        text = document.decode("utf-8", "surrogatepass") if isinstance(document, (bytes, bytearray)) else document
        start = len(text) - len(text.lstrip(_WHITESPACE))
        value, end = _scan(text, start)
    except (StopIteration, ValueError, SystemError):
        # no value, a malformed one, or bytes that are not UTF-8. SystemError: to report a malformed document
        # the C scanner takes JSONDecodeError from json.decoder in sys.modules, and fails thus while `json`
        # has not been imported
        return _json_module().loads(document)  # raises json's own error (or decodes what json detects)
    if text[end:].strip(_WHITESPACE):
        return _json_module().loads(document)  # "Extra data"
    return value


def load(f: IO) -> Any:
    return loads(f.read())


def dumps(value: Any) -> str:
    """json.dumps(value): ASCII only, separators ", " and ": ", NaN allowed, cycles refused."""
    if _json is None:
        return _json_module().dumps(value)
    encode = _json.make_encoder({}, _refuse, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True)
    try:
        return "".join(encode(value, 0))
    except (TypeError, ValueError):  # not serializable, or a cycle
        return _json_module().dumps(value)  # raises json's own error


def _refuse(value: object) -> object:
    raise TypeError(value)


def _json_module():
    import json
    return json
