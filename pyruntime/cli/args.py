"""A tiny runc-compatible argument parser.

runc's parser (urfave/cli) takes `-flag`, `--flag`, `--flag=value` and `--flag value` alike, and
callers such as containerd's go-runc rely on that. click would cost more than the whole container
start budget in imports, so this is hand-written; an unknown flag is an error, never ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    value: bool = False        # takes a value
    repeat: bool = False       # may be given more than once (collects a list)
    default: object = None


@dataclass
class Parsed:
    options: dict[str, object] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)


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
                out.options[key].append(value)  # type: ignore[union-attr]
            else:
                out.options[key] = value
        else:
            out.positional.append(arg)
            if stop_at_positional:
                out.positional.extend(argv[i + 1:])
                break
        i += 1
    return out
