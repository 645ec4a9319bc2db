"""The lines pyruntime writes to --log (or stderr), in runc's two formats, because shims and scripts parse
them: text `level=error msg="..."` or json `{"level":"error","msg":"...","time":"..."}`.

A failed command writes its error here first (a shim reads the reason in --log, and may have given the
runtime stdio it cannot write to); with --debug, the runtime also reports each stage of a container's
set-up as runc does (`nsexec container setup`, `child process in init()`, ...).
"""
from __future__ import annotations

import json
import os
import sys
import time


def format_line(level: str, msg: str, log_format: str) -> str:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if log_format == "json":
        return json.dumps({"level": level, "msg": msg, "time": now}, separators=(",", ":"))
    return f"time=\"{now}\" level={level} msg={json.dumps(msg)}"


def write(log: str | None, log_format: str, level: str, msg: str) -> None:
    """Appends one line to `log`, or to stderr without one. Raises OSError when `log` can't be written."""
    line = format_line(level, msg, log_format) + "\n"
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    else:
        sys.stderr.write(line)
        sys.stderr.flush()


def tracer(log: str | None, log_format: str):  # -> Callable[[str], None]
    """--debug's reporter of set-up stages; a failure to write one is never the container's failure."""
    def trace(msg: str) -> None:
        try:
            write(log, log_format, "debug", msg)
        except (OSError, ValueError):
            pass
    return trace
