"""The review cache the kubelet's authenticator and authorizer share: answers of the API server kept for a
time-to-live, so a scraper polling /metrics costs one TokenReview or SubjectAccessReview per TTL, not one
per request.

Bounded, least recently used first out: the keys come from clients (every distinct bearer token, every
distinct user and extra an authenticated caller presents), so without a bound a client sending endless
distinct tokens grows the kubelet's memory without end. A live entry pushed out costs one more review.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")
MAX_ENTRIES = 4096


class TTLCache(Generic[V]):
    def __init__(self, max_entries: int = MAX_ENTRIES, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries, self._clock = max_entries, clock
        self._entries: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: Hashable) -> tuple[bool, V | None]:
        """(True, value) for a live entry, (False, None) otherwise: a cached None (an unknown token) is a hit."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return False, None
            if hit[0] <= self._clock():
                del self._entries[key]
                return False, None
            self._entries.move_to_end(key)
            return True, hit[1]

    def put(self, key: Hashable, value: V, ttl: float) -> None:
        with self._lock:
            self._entries[key] = (self._clock() + ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
