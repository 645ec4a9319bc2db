"""The kubelet's liveness (pykubelet/health.py): a loop is stale once silent longer than twice its period, and
never sooner than the stock kubelet's five minutes."""
from pykubelet.health import MIN_WINDOW, Heartbeats


def test_a_loop_is_stale_after_its_window_and_fresh_after_a_beat():
    now = [100.0]
    heartbeats = Heartbeats(clock=lambda: now[0])
    heartbeats.beat("pleg")  # not watched yet: the kubelet before its first sync is healthy
    assert heartbeats.stale() == [] and heartbeats.answer() == (200, "ok")
    heartbeats.watch("pleg", 10.0)
    heartbeats.watch("resync", 600.0)
    now[0] += MIN_WINDOW
    assert heartbeats.stale() == []
    now[0] += 1
    assert heartbeats.stale() == ["pleg"]
    assert heartbeats.answer()[0] == 500
    heartbeats.beat("pleg")
    assert heartbeats.stale() == [] and heartbeats.answer() == (200, "ok")
    now[0] = 100.0 + 1200  # resync's window is two of its periods
    assert heartbeats.stale() == ["pleg"]
    now[0] += 1
    assert heartbeats.stale() == ["pleg", "resync"]
