"""Go's time.Duration as the kubelet reads and writes it: the configuration's durations ("1m30s", "100ms")
and the ones its event messages print ("1.5s").

It imports nothing of pykubelet: the settings and eviction's policy both read durations, and the settings
read eviction's policy (pykubelet/config.py), so a duration kept in either would tie the two in a circle.
"""
from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(value: Any) -> float:
    """A Go duration ("10s", "1m30s", "100ms") in seconds."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"a duration such as \"10s\" or \"5m\", got {value!r}")
    if value == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION.finditer(value):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(value):
        raise ValueError(f"a duration such as \"10s\" or \"5m\", got {value!r}")
    return total


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration prints it (the kubelet's event messages): "1.5s", "350.2ms"."""
    if seconds >= 60:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m{go_duration(rest) if rest else '0s'}"
    for unit, scale in (("s", 1), ("ms", 1e3), ("µs", 1e6)):
        if seconds * scale >= 1 or unit == "µs":
            return f"{seconds * scale:.6f}".rstrip("0").rstrip(".") + unit
    return ""


def duration_string(seconds: float) -> str:
    """A duration as Go's time.Duration.String writes it into a configuration: "4h0m0s", "1m0s", "20s",
    "100ms", "0s"."""
    ns = round(seconds * 1e9)
    if ns < 0:
        return "-" + duration_string(-seconds)
    if ns == 0:
        return "0s"
    if ns < 10**9:
        for unit, scale in (("ns", 1), ("µs", 10**3), ("ms", 10**6)):
            if ns < scale * 1000:
                return _fraction(ns, scale) + unit
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + _fraction(rest, 10**9) + "s"


def _fraction(n: int, scale: int) -> str:
    whole, part = divmod(n, scale)
    digits = len(str(scale)) - 1
    return f"{whole}.{part:0{digits}d}".rstrip("0") if part else str(whole)
