"""pykubelet's graceful node shutdown without logind: the grace periods by priority and the groups they make,
as the stock kubelet's nodeshutdown manager; the manager's start (InhibitDelayMaxSec raised through the
drop-in, the lock taken), a shutdown (NotReady, admission closed, the groups killed in order with their grace,
the lock released) and its cancellation (the lock taken again) against a fake Logind; and a killed pod's status.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import deque

from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.config import Settings
from pykubelet.eviction import policy
from pykubelet.node import shutdown
from pykubelet.node.shutdown import Period
from pykubelet.pods import admission
from pynode_os import logind
from pynode_os.systemd import SystemdError

CRITICAL = 2_000_000_000


def pod(name: str, priority: int | None = None, grace: int | None = None, phase: str = "Running") -> Pod:
    spec: dict = {"containers": [{"name": "c", "image": "i"}]}
    if priority is not None:
        spec["priority"] = priority
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return parse_pod({"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": spec,
                      "status": {"phase": phase}})


def test_shutdown_grace_period_is_two_periods_and_zero_is_off():
    assert shutdown.periods(Settings()) == []
    assert shutdown.periods(Settings(shutdown_grace_period=30, shutdown_grace_period_critical_pods=10)) == [
        Period(0, 20), Period(CRITICAL, 10)]
    assert shutdown.periods(Settings(shutdown_grace_period=30)) == [Period(0, 30), Period(CRITICAL, 0)]
    by_priority = Settings(shutdown_grace_period_by_pod_priority=[
        {"priority": 100000, "shutdownGracePeriodSeconds": 10}, {"shutdownGracePeriodSeconds": 5}])
    assert shutdown.periods(by_priority) == [Period(0, 5), Period(100000, 10)]
    assert shutdown.requested(shutdown.periods(by_priority)) == 15


def test_pods_are_grouped_by_priority_as_the_stock_kubelets():
    """Each pod goes to the highest period at or below its priority; below them all, to the lowest. A static
    pod without a priority is no critical pod here, as in the stock kubelet's grouping."""
    periods = [Period(-100, 1), Period(0, 2), Period(1000, 3), Period(CRITICAL, 4)]
    pods = [pod("low", -1000), pod("neg", -100), pod("zero"), pod("mid", 999), pod("user", 1000),
            pod("node-critical", CRITICAL + 1000), pod("cluster-critical", CRITICAL)]
    groups = shutdown.group(periods, pods)
    assert [[p.metadata.name for p in g.pods] for g in groups] == [
        ["low", "neg"], ["zero", "mid"], ["user"], ["node-critical", "cluster-critical"]]
    two = shutdown.group(shutdown.periods(Settings(shutdown_grace_period=20, shutdown_grace_period_critical_pods=10)),
                         [pod("static"), pod("apiserver", CRITICAL + 1000)])
    assert [[p.metadata.name for p in g.pods] for g in two] == [["static"], ["apiserver"]]


def test_a_pods_own_grace_wins_when_shorter():
    assert shutdown.pod_grace(pod("a", grace=5), 20) == 5
    assert shutdown.pod_grace(pod("b", grace=120), 20) == 20
    assert shutdown.pod_grace(pod("c"), 20) == 20  # the default 30


def test_a_killed_pods_status_is_the_stock_kubelets():
    last = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"},
                                               {"type": "ContainersReady", "status": "True"}]}
    s = policy.evicted_status(last, shutdown.MESSAGE, "T1", shutdown.REASON)
    assert (s["phase"], s["reason"], s["message"]) == (
        "Failed", "Terminated", "Pod was terminated in response to imminent node shutdown.")
    assert {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
            "message": shutdown.MESSAGE} in s["conditions"]
    assert {"type": "ContainersReady", "status": "False", "reason": "PodFailed"} in s["conditions"]


class FakeLogind(logind.Logind):
    """logind as the manager sees it: InhibitDelayMaxSec `delay` until a reload makes it `reloaded`, each lock
    a pipe's read end (its holder's fd), and the PrepareForShutdown signals a test queues."""

    def __init__(self, delay: float = 5.0, reloaded: float | None = None) -> None:
        self.delay, self.reloaded = delay, reloaded
        self.calls: list[str] = []
        self.locks: list[int] = []
        self.signals: deque[bool] = deque()
        self.closed = False

    def inhibit_delay(self) -> float:
        return self.delay

    def inhibit(self, what: str, who: str, why: str, mode: str) -> int:
        self.calls.append(f"Inhibit {what} {who} {mode}")
        r, w = os.pipe()
        os.close(w)
        self.locks.append(r)
        return r

    def reload(self) -> None:
        self.calls.append("reload")
        if self.reloaded is not None:
            self.delay = self.reloaded

    def watch_shutdown(self) -> None:
        self.calls.append("watch")

    def next_shutdown(self, timeout: float) -> bool | None:
        return self.signals.popleft() if self.signals else None

    def close(self) -> None:
        self.closed = True


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class Clock:
    """Each reading an hour on: every group's wait is over at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 3600
        return self.now


def manager(tmp_path, fake: FakeLogind, **settings) -> shutdown.ShutdownManager:
    s = Settings(node_name="n", **settings)
    return shutdown.ShutdownManager(s, connect=lambda: fake, conf_dir=str(tmp_path / "logind.conf.d"),
                                     clock=Clock())


def test_a_shorter_inhibit_delay_is_raised_by_the_drop_in_and_a_reload(tmp_path):
    fake = FakeLogind(delay=5, reloaded=30)
    m = manager(tmp_path, fake, shutdown_grace_period=30, shutdown_grace_period_critical_pods=10)
    m._start(threading.Event())
    assert (tmp_path / "logind.conf.d" / "99-kubelet.conf").read_text() == (
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n")
    assert fake.calls == ["reload", "Inhibit shutdown kubelet delay", "watch"]
    assert is_open(fake.locks[0])
    m._release()
    assert not is_open(fake.locks[0])


def test_a_long_enough_inhibit_delay_writes_nothing(tmp_path):
    fake = FakeLogind(delay=30)
    m = manager(tmp_path, fake, shutdown_grace_period=30)
    m._start(threading.Event())
    assert fake.calls == ["Inhibit shutdown kubelet delay", "watch"]
    assert not (tmp_path / "logind.conf.d").exists()
    m._release()


def test_graceful_shutdown_is_off_when_logind_does_not_answer(tmp_path, caplog, monkeypatch):
    def gone() -> logind.Logind:
        raise SystemdError("connect to the D-Bus system bus: [Errno 2] No such file or directory")
    m = shutdown.ShutdownManager(Settings(shutdown_grace_period=30), connect=gone)
    with caplog.at_level(logging.WARNING):
        m.run(threading.Event())  # returns at once: not retried
    assert caplog.messages == ["graceful node shutdown is off: connect to the D-Bus system bus: [Errno 2] No such "
                               "file or directory"]
    monkeypatch.setattr(shutdown, "DELAY_CHECKS", (0.0,) * 4)
    stuck = FakeLogind(delay=5)  # a logind that never takes the drop-in
    m = manager(tmp_path, stuck, shutdown_grace_period=30)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        m.run(threading.Event())
    assert caplog.messages == ["graceful node shutdown is off: timed out after 5 attempts waiting for logind "
                               "InhibitDelayMaxSec to update to 30s (shutdownGracePeriod), current value is 5s"]
    assert stuck.closed and stuck.locks == []


def test_a_shutdown_kills_the_groups_in_order_then_releases_the_lock_and_a_cancel_takes_it_again(tmp_path):
    fake = FakeLogind(delay=30)
    m = manager(tmp_path, fake, shutdown_grace_period=20, shutdown_grace_period_critical_pods=10)
    changes: list[str | None] = []
    m.on_change = lambda: changes.append(m.problem())
    pods = [pod("critical", CRITICAL + 1000, grace=120), pod("web", grace=5), pod("batch", grace=120),
            pod("done", phase="Succeeded")]
    killed: list[tuple[str, str, str, int]] = []

    def kill(uid: str, reason: str, message: str, grace: int) -> threading.Event:
        killed.append((uid, reason, message, grace))
        return threading.Event()  # never done: each group is waited out
    m.bind(lambda: pods, kill)
    m._start(threading.Event())
    first = fake.locks[0]
    assert m.problem() is None and m.admit(pods[0]) is None

    m.handle(fake, True)
    assert changes == ["node is shutting down"]
    assert m.admit(pods[0]) == admission.Verdict(False, "NodeShutdown", "Pod was rejected as the node is shutting "
                                                                        "down.")
    assert killed == [("uid-web", "Terminated", shutdown.MESSAGE, 5), ("uid-batch", "Terminated", shutdown.MESSAGE, 10),
                      ("uid-critical", "Terminated", shutdown.MESSAGE, 10)]
    assert not is_open(first)  # released: the shutdown goes on
    assert m.problem() == "node is shutting down"

    m.handle(fake, False)
    assert m.problem() is None and changes[-1] is None
    assert len(fake.locks) == 2 and is_open(fake.locks[1])
    m._release()


def test_the_watch_handles_each_signal_until_stopped(tmp_path):
    fake = FakeLogind(delay=30)
    m = manager(tmp_path, fake, shutdown_grace_period=10)
    stop = threading.Event()
    seen: list[bool] = []

    def on_change() -> None:
        seen.append(m.shutting_down())
        if len(seen) == 2:
            stop.set()
    m.on_change = on_change
    fake.signals.extend([True, False])
    m.run(stop)
    assert seen == [True, False] and fake.closed
    assert all(not is_open(fd) for fd in fake.locks)  # the kubelet's stop lets go of the lock


def test_admission_asks_the_shutdown_manager_last():
    raw: dict = {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"}, "spec": {"containers": [
        {"name": "c", "image": "i", "resources": {"requests": {"cpu": "3"}}}]}}
    adm = admission.Admission("n", pods=list, on_node=set, allocatable=lambda: {"cpu": "2", "memory": "1Gi"},
                              labels=dict)
    adm.shutdown = lambda _pod: shutdown.NOT_ADMITTED
    assert adm.admit(parse_pod(raw), has_runtime_state=False).reason == "OutOfcpu"
    v = adm.admit(parse_pod({**raw, "metadata": {**raw["metadata"], "uid": "uid-q"}, "spec": {"containers": [
        {"name": "c", "image": "i"}]}}), has_runtime_state=False)
    assert v.reason == "NodeShutdown"
    status = admission.rejected_status(parse_pod(raw), v)
    assert status["message"] == "Pod was rejected: Pod was rejected as the node is shutting down."


def test_ready_is_false_while_the_node_shuts_down(tmp_path):
    from pykubelet.node.status import NodeStatus
    from tests.kit.fake_cri import FakeCRI

    down = {"now": False}
    ns = NodeStatus(None, FakeCRI(), Settings(node_name="n", root_dir=tmp_path),
                    shutdown=lambda: shutdown.SHUTTING_DOWN if down["now"] else None)
    ready = lambda: next(c for c in ns.conditions() if c["type"] == "Ready")  # noqa: E731
    assert ready()["status"] == "True"
    down["now"] = True
    assert (ready()["status"], ready()["reason"], ready()["message"]) == (
        "False", "KubeletNotReady", "node is shutting down")


def test_a_pod_killed_for_the_shutdown_is_failed_and_never_starts_again(tmp_path):
    from pykubelet.pods.workers import PodWorkers
    from tests.kit.fake_cri import FakeCRI
    from tests.unit.test_kubelet_pods import UID, Cache

    cache, rt = Cache(), FakeCRI()
    rt.add_image("sha256:i", "img:1")
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache)
    workers._on_pod("ADDED", None, cache.put({"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                                              "spec": {"containers": [{"name": "c", "image": "img:1"}]}}))
    workers.sync(UID)
    assert rt.started == ["c-0"]
    done = workers.kill(UID, shutdown.REASON, shutdown.MESSAGE, 5)
    workers.sync(UID)
    assert done.is_set() and not rt.list_containers() and not rt.list_pod_sandbox()
    sent = workers.statuses.last(UID)
    assert (sent["phase"], sent["reason"], sent["message"]) == ("Failed", "Terminated", shutdown.MESSAGE)
    workers.sync(UID)
    assert rt.started == ["c-0"]


def test_a_failure_while_stopping_the_pods_still_releases_the_lock(tmp_path, caplog):
    fake = FakeLogind(delay=30)
    m = manager(tmp_path, fake, shutdown_grace_period=10)

    def pods() -> list[Pod]:
        raise OSError("no pods to read")
    m.bind(pods, lambda *_: threading.Event())
    m._start(threading.Event())
    with caplog.at_level(logging.WARNING):
        m.handle(fake, True)
    assert not is_open(fake.locks[0]) and "stopping the pods: no pods to read" in caplog.text
