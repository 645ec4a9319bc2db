"""CrashLoopBackOff: how long a container that keeps exiting waits before its next restart.

A container that crashes at once would otherwise be restarted in a tight loop, burning the node's CPU on
image set-up and flooding the runtime and the API server with status changes. As the kubelet: the first
restart is immediate, then the wait doubles from 10 s up to 5 min, measured from when the container
exited; a container that has run without a restart for twice the cap starts from 10 s again.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable


class Backoff:
    def __init__(self, initial: float = 10.0, cap: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        self.initial, self.cap, self._clock = initial, cap, clock
        self._entries: dict[Hashable, tuple[float, float]] = {}  # key -> (current delay, last restart)
        self._lock = threading.Lock()

    def remaining(self, key: Hashable, finished_at: float) -> float:
        """Seconds until the container `key`, which exited at `finished_at` (unix time), may restart."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return 0.0
        delay, last = entry
        now = self._clock()
        if now - last > 2 * self.cap:
            return 0.0
        return max(0.0, finished_at + delay - now)

    def current(self, key: Hashable) -> float:
        """The wait `key` serves now (0 before its first restart)."""
        with self._lock:
            entry = self._entries.get(key)
        return entry[0] if entry is not None else 0.0

    def restarted(self, key: Hashable) -> float:
        """Records a restart of `key`; returns the wait that the next crash will have to serve."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            delay = self.initial if entry is None or now - entry[1] > 2 * self.cap else min(entry[0] * 2, self.cap)
            self._entries[key] = (delay, now)
        return delay

    def forget_prefix(self, prefix: str) -> None:
        """Drops the entries of a pod gone from the node (keys are "UID/...")."""
        with self._lock:
            for key in [k for k in self._entries if isinstance(k, str) and k.startswith(prefix)]:
                del self._entries[key]
