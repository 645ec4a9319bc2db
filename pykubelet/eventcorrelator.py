"""What becomes of each event the kubelet records: a new Event object, a patch of the count of one it made
before, or nothing. client-go's EventCorrelator, which every stock kubelet sends its events through, so that
a pod that fails the same way forever costs the API server and etcd a bounded number of writes.

Three steps, in client-go's order:
- aggregation: more than 10 events of one object, type and reason with different messages within ten minutes
  become one event, "(combined from similar events): " and the latest message;
- deduplication: an event like one already made (same object, field path, type, reason and message) patches
  that one's count and lastTimestamp;
- the spam filter: each object has a bucket of 25 writes, refilled one every 5 minutes; an event found the
  bucket empty is dropped. It counts every write, patches included, so a container that fails every 2 s is
  25 writes and then one per 5 minutes.

Pure logic on the caller's clock; events.py does the sending. The caches are bounded (least recently used
first out), as client-go's, so a node that sees many pods holds no more than MAX_ENTRIES of each.
"""
from __future__ import annotations

import datetime
from collections import OrderedDict
from dataclasses import dataclass

MAX_ENTRIES = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_SECONDS = 600
SPAM_BURST = 25
SPAM_SECONDS_PER_TOKEN = 300.0
COMBINED = "(combined from similar events): "


@dataclass(frozen=True)
class Decision:
    """An event to write: `message` (aggregation may have changed it), made anew, or, when `name` is set,
    the patch of that event to `count`. `key` names it for made()."""
    key: tuple
    message: str
    count: int
    name: str | None = None
    namespace: str | None = None


@dataclass
class _Aggregate:
    messages: set[str]
    last: datetime.datetime


@dataclass
class _Made:
    name: str
    namespace: str
    count: int


@dataclass
class _Bucket:
    tokens: float
    last: datetime.datetime


class _LRU(OrderedDict):
    def touch(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > MAX_ENTRIES:
            self.popitem(last=False)


def _object(ref: dict) -> tuple:
    return ref.get("kind"), ref.get("namespace"), ref.get("name"), ref.get("uid"), ref.get("apiVersion")


class EventCorrelator:
    """client-go's defaults; one per recorder (one source: this kubelet on this node)."""

    def __init__(self) -> None:
        self._aggregates: _LRU = _LRU()
        self._made: _LRU = _LRU()
        self._buckets: _LRU = _LRU()

    def correlate(self, ref: dict, type_: str, reason: str, message: str,
                  when: datetime.datetime) -> Decision | None:
        """What to write for this event, or None when the spam filter drops it."""
        obj = _object(ref)
        key: tuple = (*obj, ref.get("fieldPath"), type_, reason, message)
        similar = (*obj, type_, reason)
        aggregate = self._aggregates.get(similar)
        if aggregate is None or (when - aggregate.last).total_seconds() > AGGREGATE_SECONDS:
            aggregate = _Aggregate(set(), when)
        aggregate.messages.add(message)
        aggregate.last = when
        self._aggregates.touch(similar, aggregate)
        if len(aggregate.messages) > AGGREGATE_MAX_EVENTS:
            key, message = similar, COMBINED + message
        made = self._made.get(key)
        decision = (Decision(key, message, made.count + 1, made.name, made.namespace) if made is not None
                    else Decision(key, message, 1))
        if made is not None:  # as client-go's logger: the count moves on even when the filter drops the write
            made.count += 1
            self._made.move_to_end(key)
        return decision if self._take_token(obj, when) else None

    def made(self, decision: Decision, name: str, namespace: str) -> None:
        """The event `decision` asked for was created as `name`: the next like it patches that one."""
        self._made.touch(decision.key, _Made(name, namespace, decision.count))

    def _take_token(self, obj: tuple, when: datetime.datetime) -> bool:
        bucket = self._buckets.get(obj)
        if bucket is None:
            bucket = _Bucket(float(SPAM_BURST), when)
        else:
            refill = max(0.0, (when - bucket.last).total_seconds()) / SPAM_SECONDS_PER_TOKEN
            bucket.tokens, bucket.last = min(float(SPAM_BURST), bucket.tokens + refill), when
        self._buckets.touch(obj, bucket)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True
