"""One handle on the C library for every ctypes caller, loaded by soname so that no ldconfig is spawned
(ctypes.util.find_library runs one). A function's restype and argtypes, once set by a caller, hold for all."""
from __future__ import annotations

import ctypes

libc = ctypes.CDLL("libc.so.6", use_errno=True)
