"""The review cache the kubelet's authenticator and authorizer share: answers of the API server kept for a
time-to-live, so a scraper polling /metrics costs one TokenReview or SubjectAccessReview per TTL, not one
per request. Bounded: a client sending endless distinct tokens makes the expired entries go at 4096.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")
MAX_ENTRIES = 4096


class TTLCache(Generic[V]):
    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> tuple[bool, V | None]:
        """(True, value) for a live entry, (False, None) otherwise: a cached None (an unknown token) is a hit."""
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return True, hit[1]
        return False, None

    def put(self, key: Hashable, value: V, ttl: float) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._entries) > MAX_ENTRIES:
                self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
            self._entries[key] = (now + ttl, value)
