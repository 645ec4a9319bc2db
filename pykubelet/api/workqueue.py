"""A queue of object keys ("namespace/name") between informers and the workers that sync them: client-go's
workqueue, reduced to what the kubelet needs.

Level-triggered by construction: the queue holds keys, not events, so a pod updated fifty times while
its key waits is synced once, against the cache's latest state. A key being processed is never handed to
a second worker; if it is added meanwhile it is marked dirty and queued again when done(), so no change
is lost and no two workers race on one object. Failures requeue through add_rate_limited(): per-key
exponential back-off (base doubling to a cap), forgotten on success. A key waits for at most one delayed add,
the earliest asked for, as client-go's delaying queue: every sync that asks to be run again in N seconds must
not start a chain of its own beside the ones earlier syncs started, or a pod that a resync, the PLEG or its
informer also syncs is soon synced many times a second.
"""
from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

from pykubelet.errors import FailedPreconditionError


class ShutDown(FailedPreconditionError):
    """get() on a queue that has been shut down and drained."""


class WorkQueue:
    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_delay, self.max_delay = base_delay, max_delay
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[Hashable] = deque()
        self._dirty: set[Hashable] = set()  # queued or to be queued again
        self._processing: set[Hashable] = set()
        self._waiting: list[tuple[float, int, Hashable]] = []  # (ready at, seq, key) heap of delayed adds
        self._ready_at: dict[Hashable, tuple[float, int]] = {}  # key -> its one live entry of _waiting
        self._seq = 0
        self._failures: dict[Hashable, int] = {}
        self._shutting_down = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def add(self, key: Hashable) -> None:
        with self._cond:
            if self._shutting_down or key in self._dirty:
                return
            self._dirty.add(key)
            if key not in self._processing:
                self._queue.append(key)
                self._cond.notify()

    def add_after(self, key: Hashable, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutting_down:
                return
            ready = self._clock() + delay
            if key in self._ready_at and self._ready_at[key][0] <= ready:
                return  # already due as early: the later add would only repeat it
            self._seq += 1
            self._ready_at[key] = (ready, self._seq)  # an entry of the key's still in the heap is stale now
            heapq.heappush(self._waiting, (ready, self._seq, key))
            self._cond.notify()

    def add_rate_limited(self, key: Hashable) -> float:
        """Requeues `key` after its back-off (base * 2^failures, capped); returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(self.base_delay * (2 ** failures), self.max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        """The key synced: its next failure starts from the base delay again."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def _promote_due(self) -> float | None:
        """Moves due delayed keys into the queue; returns seconds until the next one, or None."""
        now = self._clock()
        while self._waiting and self._waiting[0][0] <= now:
            ready, seq, key = heapq.heappop(self._waiting)
            if self._ready_at.get(key) != (ready, seq):
                continue  # replaced by an earlier add
            del self._ready_at[key]
            if key not in self._dirty:
                self._dirty.add(key)
                if key not in self._processing:
                    self._queue.append(key)
        return self._waiting[0][0] - now if self._waiting else None

    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next key to process (mark it done() after); None on timeout; ShutDown once shut down."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                wait = self._promote_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                if self._shutting_down:
                    raise ShutDown
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shut_down(self) -> None:
        """Stops accepting keys; get() drains what is queued, then raises ShutDown."""
        with self._cond:
            self._shutting_down = True
            self._waiting.clear()
            self._ready_at.clear()
            self._cond.notify_all()
