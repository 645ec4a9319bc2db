"""One libc handle for the ctypes callers, loaded by soname so that no ldconfig is spawned."""
from __future__ import annotations

import ctypes
import os

libc = ctypes.CDLL("libc.so.6", use_errno=True)


def check(ret: int, call: str, path: str | None = None) -> int:
    """Turns a -1 from a libc call into an OSError that says which call failed."""
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}", path)
    return ret
