"""pykubelet's work queue: bursts collapse (level-triggered), a key is never with two workers at once, and
failures back off per key."""
from __future__ import annotations

import threading

import pytest

from pykubelet.api.workqueue import ShutDown, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_adds_is_processed_once():
    q = WorkQueue()
    for _ in range(50):
        q.add("ns/a")
    q.add("ns/b")
    assert len(q) == 2
    assert q.get(timeout=0) == "ns/a"
    assert q.get(timeout=0) == "ns/b"
    assert q.get(timeout=0) is None


def test_a_key_added_while_processing_comes_back_once_after_done():
    q = WorkQueue()
    q.add("k")
    key = q.get(timeout=0)
    q.add("k")
    q.add("k")
    assert q.get(timeout=0) is None  # not to a second worker while the first has it
    q.done(key)
    assert q.get(timeout=0) == "k"
    q.done("k")
    assert q.get(timeout=0) is None


def test_rate_limited_requeue_doubles_per_key_and_forget_resets():
    clock = Clock()
    q = WorkQueue(base_delay=1.0, max_delay=5.0, clock=clock)
    assert [q.add_rate_limited("k") for _ in range(4)] == [1.0, 2.0, 4.0, 5.0]
    assert q.add_rate_limited("other") == 1.0
    assert q.failures("k") == 4
    assert q.get(timeout=0) is None
    clock.now += 1.0
    assert q.get(timeout=0) in ("k", "other")
    q.forget("k")
    assert q.failures("k") == 0
    assert q.add_rate_limited("k") == 1.0


def test_delayed_key_already_queued_is_not_duplicated():
    clock = Clock()
    q = WorkQueue(clock=clock)
    q.add_after("k", 2.0)
    q.add("k")
    clock.now += 3
    assert q.get(timeout=0) == "k"
    q.done("k")
    assert q.get(timeout=0) is None


def test_a_key_waits_for_one_delayed_add_the_earliest():
    """A pod whose every sync asks to be synced again in 2 s, and that other triggers (a resync, the PLEG, its
    informer) also sync: one sync per 2 s, not one more chain of them per extra trigger."""
    clock = Clock()
    q = WorkQueue(clock=clock)
    syncs = 0
    for second in range(60):
        if second % 3 == 0:
            q.add("pod")  # an extra trigger every 3 s
        while (key := q.get(timeout=0)) is not None:
            syncs += 1
            q.add_after(key, 2.0)  # the sync: "again in 2 s"
            q.done(key)
        clock.now += 1
    assert syncs <= 60 // 2 + 60 // 3 + 1, syncs  # one chain, plus the extra triggers themselves
    q = WorkQueue(clock=clock)
    q.add_after("k", 5.0)
    q.add_after("k", 1.0)  # earlier: replaces the 5 s one
    q.add_after("k", 3.0)  # later than the one waiting: nothing
    clock.now += 1
    assert q.get(timeout=0) == "k"
    q.done("k")
    clock.now += 10
    assert q.get(timeout=0) is None


def test_get_blocks_until_add_and_shut_down_drains():
    q = WorkQueue()
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=5)))
    t.start()
    q.add("k")
    t.join(5)
    assert got == ["k"]
    q.add("last")
    q.shut_down()
    q.add("refused")
    assert q.get() == "last"
    with pytest.raises(ShutDown):
        q.get()
