"""A tiny runc-compatible argument parser.

runc's parser (urfave/cli) takes `-flag`, `--flag`, `--flag=value` and `--flag value` alike, and
callers such as containerd's go-runc rely on that. click would cost more than the whole container
start budget in imports, so this is hand-written; an unknown flag is an error, never ignored.
"""
from __future__ import annotations

from pyruntime.errors import InvalidArgumentError


class UsageError(InvalidArgumentError):
    """A command line that can't be parsed: an unknown flag, a missing value or argument."""


class Flag:
    """One flag and its aliases. A plain class, not a dataclass: importing dataclasses and generating the
    methods would be paid by this process, which runs for every container operation."""

    __slots__ = ("default", "names", "repeat", "unsupported", "value")

    def __init__(self, names: tuple[str, ...], value: bool = False, repeat: bool = False,
                 default: object = None, unsupported: str | None = None) -> None:
        self.names = names
        self.value = value      # takes a value
        self.repeat = repeat    # may be given more than once (collects a list)
        self.default = default
        self.unsupported = unsupported  # runc has it, we don't: giving it is an error saying why


class Parsed:
    __slots__ = ("options", "positional")

    def __init__(self, options: dict[str, object] | None = None, positional: list[str] | None = None) -> None:
        self.options: dict[str, object] = {} if options is None else options
        self.positional: list[str] = [] if positional is None else positional


def parse(argv: list[str], flags: list[Flag], *, stop_at_positional: bool = False) -> Parsed:
    """Parses flags anywhere before `--` (or, with stop_at_positional, before the first positional)."""
    by_name = {n: f for f in flags for n in f.names}
    out = Parsed({f.names[0]: ([] if f.repeat else f.default) for f in flags})
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.positional.extend(argv[i + 1:])
            break
        if arg.startswith("-") and arg != "-":
            name, eq, inline = arg.lstrip("-").partition("=")
            flag = by_name.get(name)
            if flag is None:
                raise UsageError(f"flag provided but not defined: {arg}")
            if flag.unsupported:
                raise UsageError(f"{arg}: not supported: {flag.unsupported}")
            value: str | bool
            if flag.value:
                if eq:
                    value = inline
                elif i + 1 < len(argv):
                    i += 1
                    value = argv[i]
                else:
                    raise UsageError(f"flag needs an argument: {arg}")
            else:
                value = inline.lower() not in ("false", "0") if eq else True
            key = flag.names[0]
            if flag.repeat:
                out.options[key].append(value)  # type: ignore[attr-defined]  # a repeat flag starts as []
            else:
                out.options[key] = value
        else:
            out.positional.append(arg)
            if stop_at_positional:
                out.positional.extend(argv[i + 1:])
                break
        i += 1
    return out
