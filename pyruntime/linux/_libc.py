"""One libc handle for the ctypes callers, loaded by soname so that no ldconfig is spawned."""
from __future__ import annotations

import ctypes

libc = ctypes.CDLL("libc.so.6", use_errno=True)

