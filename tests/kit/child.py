"""Runs kernel set-up code in a forked child and then execs a program, as a container's init does."""
from __future__ import annotations

import os
import traceback
from collections.abc import Callable


def run_in_child(setup: Callable[[], object], *argv: str) -> tuple[int, str]:
    """Runs setup() then execs argv in a fork; returns (exit status, stdout+stderr)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            setup()
            os.execv(argv[0], list(argv))
        except BaseException:
            os.write(w, traceback.format_exc().encode())
        finally:
            os._exit(127)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out
