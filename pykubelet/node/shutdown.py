"""Graceful node shutdown, as the stock kubelet's nodeshutdown manager: when the host shuts down, the pods stop
with a grace period and a status that says why, the least important first, before the machine goes.

With shutdownGracePeriod (or shutdownGracePeriodByPodPriority) set, the manager holds a logind "delay"
inhibitor lock (pynode_os/logind.py): logind then announces a shutdown with PrepareForShutdown(true) and waits
for the lock, up to its InhibitDelayMaxSec, which the manager raises to the grace period when it is shorter (a
drop-in and a reload, checked again). On the announcement the node turns NotReady ("node is shutting down"),
admission turns new pods away (NodeShutdown), and the running pods are killed group by group in priority
order: with shutdownGracePeriod, the pods below system-critical priority (2000000000) with
shutdownGracePeriod - shutdownGracePeriodCriticalPods, then the others with shutdownGracePeriodCriticalPods;
each pod with its own terminationGracePeriodSeconds when that is shorter, and each group waited for up to its
period. A killed pod is Failed, reason Terminated, with a DisruptionTarget condition (TerminationByKubelet),
and never starts again; the kill is the eviction manager's path (the pod's own worker kills it). Then the lock
is released and the shutdown goes on. PrepareForShutdown(false), a cancelled shutdown, takes the lock again and
the node is Ready again.

The groups follow the pods' spec.priority, as the stock kubelet's: a static pod without a priority is in the
first group (kubeadm's control plane manifests set system-node-critical). A pod being deleted is on its way
out with its own grace and is not killed again.

Without logind on the system bus (no systemd, a container) the manager says why once and stays off, as the
stock kubelet does; the kubelet runs on. A connection lost later is made again every second.

`periods`, `group` and `pod_grace` decide; ShutdownManager acts, over a Logind it is handed (a fake in
the unit tests) and the pod workers' kill.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pykubelet.api.podmodel import Pod
from pykubelet.config import Settings
from pykubelet.events import NORMAL, EventRecorder, node_ref
from pykubelet.pods.admission import Verdict
from pykubelet.pods.podspec import SYSTEM_CRITICAL_PRIORITY
from pynode_os import logind as logind_os
from pynode_os.systemd import SystemdError

log = logging.getLogger(__name__)

SHUTTING_DOWN = "node is shutting down"  # the Ready condition's message meanwhile (the stock ShutdownStatus)
NOT_ADMITTED = Verdict(False, "NodeShutdown", "Pod was rejected as the node is shutting down.")
REASON = "Terminated"  # a killed pod's status
MESSAGE = "Pod was terminated in response to imminent node shutdown."
INHIBIT = ("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay")  # the stock Inhibit's
DEFAULT_PRIORITY = 0  # scheduling.DefaultPriorityWhenNoDefaultClassExists
RECONNECT_PERIOD = 1.0
DELAY_CHECKS = (0.1, 0.2, 0.4, 0.8)  # the waits between the checks of InhibitDelayMaxSec after a reload
POLL = 1.0  # how often the watch looks at the kubelet's stop
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Period:
    """Pods of `priority` and above (up to the next period's) get `seconds`."""
    priority: int
    seconds: int


@dataclass
class Group:
    period: Period
    pods: list[Pod] = field(default_factory=list)


def periods(settings: Settings) -> list[Period]:
    """The grace periods by priority, lowest first; empty: graceful shutdown is off. shutdownGracePeriod
    becomes two, as the stock kubelet's migrateConfig: everyone's, then system-critical pods'."""
    by_priority = [Period(p.get("priority", 0), p.get("shutdownGracePeriodSeconds", 0))
                   for p in settings.shutdown_grace_period_by_pod_priority]
    if not by_priority:
        total = settings.shutdown_grace_period
        if total <= 0:
            return []
        critical = settings.shutdown_grace_period_critical_pods
        by_priority = [Period(DEFAULT_PRIORITY, int(total - critical)), Period(SYSTEM_CRITICAL_PRIORITY, int(critical))]
    return sorted(by_priority, key=lambda p: p.priority)


def requested(of: list[Period]) -> int:
    """The seconds the whole shutdown may take: what logind's InhibitDelayMaxSec must allow."""
    return sum(p.seconds for p in of)


def group(of: list[Period], pods: list[Pod]) -> list[Group]:
    """The pods by period, in the order they are killed: each in the highest period at or below its priority
    (the lowest for a pod below them all), as the stock kubelet's groupByPriority."""
    groups = [Group(p) for p in of]
    for pod in pods:
        at_or_below = [g for g in groups if g.period.priority <= pod.spec.priority]
        (at_or_below[-1] if at_or_below else groups[0]).pods.append(pod)
    return groups


def pod_grace(pod: Pod, seconds: int) -> int:
    """The group's period, or the pod's own terminationGracePeriodSeconds when that is shorter."""
    return min(seconds, pod.spec.termination_grace_period_seconds)


class ShutdownManager:
    """`bind(pods, kill)` before run(): `pods()` the kubelet's pods with the phase they last reported,
    `kill(uid, reason, message, grace)` has the pod's worker kill it with that status, and returns an Event set
    once done. `on_change()`: the node's Ready condition changed (the status loop reports it now).
    `connect()` makes the Logind; `conf_dir` is where logind's drop-ins go."""

    def __init__(self, settings: Settings, *, events: EventRecorder | None = None,
                 on_change: Callable[[], None] = lambda: None,
                 connect: Callable[[], logind_os.Logind] = logind_os.DBusLogind,
                 conf_dir: str = logind_os.CONF_DIR, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.events, self.on_change, self.clock = settings, events, on_change, clock
        self.periods = periods(settings)
        self._connect, self._conf_dir = connect, conf_dir
        self._pods: Callable[[], list[Pod]] = list
        self._kill: Callable[[str, str, str, int], threading.Event] = lambda *_: _done()
        self._lock = threading.Lock()
        self._shutting_down = False
        self._inhibitor: int | None = None  # the lock's file descriptor while held
        self._last_error = ""

    @property
    def enabled(self) -> bool:
        return bool(self.periods)

    def bind(self, pods: Callable[[], list[Pod]], kill: Callable[[str, str, str, int], threading.Event]) -> None:
        self._pods, self._kill = pods, kill

    def shutting_down(self) -> bool:
        with self._lock:
            return self._shutting_down

    def problem(self) -> str | None:
        """Why the node is not Ready, from here: None unless it is shutting down."""
        return SHUTTING_DOWN if self.shutting_down() else None

    def admit(self, _pod: Pod) -> Verdict | None:
        """The admit handler: every new pod is turned away while the node shuts down."""
        return NOT_ADMITTED if self.shutting_down() else None

    # --- acting ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Watches for shutdowns until `stop`. A first start that fails turns graceful shutdown off (logged
        once), as the stock kubelet's; a connection lost later is made again every RECONNECT_PERIOD."""
        first = True
        try:
            while not stop.is_set():
                try:
                    logind = self._start(stop)
                except (SystemdError, OSError) as e:
                    if first:
                        log.warning("graceful node shutdown is off: %s", e)
                        return
                    self._warn(f"watching for node shutdown events again: {e}")
                else:
                    try:
                        self._watch(logind, stop)
                    except SystemdError as e:
                        self._warn(f"stopped watching for node shutdown events: {e}")
                    finally:
                        logind.close()
                first = False
                stop.wait(RECONNECT_PERIOD)
        finally:
            self._release()

    def _warn(self, message: str) -> None:
        if message != self._last_error:
            log.warning("graceful node shutdown: %s", message)
            self._last_error = message

    def _start(self, stop: threading.Event) -> logind_os.Logind:
        """A Logind that allows the whole grace period, with the lock taken and the signal subscribed to."""
        logind = self._connect()
        try:
            want = requested(self.periods)
            current = logind.inhibit_delay()
            if want > current:
                path = logind_os.override_inhibit_delay(want, self._conf_dir)
                log.info("logind's InhibitDelayMaxSec is %gs, less than the %ds shutdown grace period: "
                         "wrote %s and reloaded logind", current, want, path)
                logind.reload()
                self._wait_delay(logind, want, stop)
            self._take(logind)
            logind.watch_shutdown()
        except BaseException:
            logind.close()
            raise
        log.info("graceful node shutdown: holding logind's delay lock; grace periods by priority %s",
                 ", ".join(f"{p.priority}: {p.seconds}s" for p in self.periods))
        return logind

    def _wait_delay(self, logind: logind_os.Logind, want: int, stop: threading.Event) -> None:
        """logind reloads its configuration after the SIGHUP returns: InhibitDelayMaxSec is read until it
        allows `want`, a few times over three seconds, as the stock kubelet's backoff."""
        current = logind.inhibit_delay()
        attempts = 1
        for pause in DELAY_CHECKS:
            if want <= current or stop.wait(pause):
                return
            current = logind.inhibit_delay()
            attempts += 1
        if want > current:
            raise SystemdError(f"timed out after {attempts} attempts waiting for logind InhibitDelayMaxSec to "
                               f"update to {want}s (shutdownGracePeriod), current value is {current:g}s")

    def _take(self, logind: logind_os.Logind) -> None:
        fd = logind.inhibit(*INHIBIT)
        with self._lock:
            old, self._inhibitor = self._inhibitor, fd
        if old is not None:
            logind_os.release(old)

    def _release(self) -> None:
        with self._lock:
            fd, self._inhibitor = self._inhibitor, None
        if fd is not None:
            logind_os.release(fd)

    def _watch(self, logind: logind_os.Logind, stop: threading.Event) -> None:
        while not stop.is_set():
            event = logind.next_shutdown(POLL)
            if event is not None:
                self.handle(logind, event)

    def handle(self, logind: logind_os.Logind, shutting_down: bool) -> None:
        """One PrepareForShutdown: a shutdown is handled to its end (the lock released) before the next event
        is read, as the stock kubelet's."""
        log.info("node shutdown manager: %s", "shutdown event" if shutting_down else "shutdown cancelled")
        if self.events is not None:
            self.events.event(node_ref(self.settings.node_name), NORMAL, "Shutdown",
                              "Shutdown manager detected shutdown " + ("event" if shutting_down else "cancellation"))
        with self._lock:
            self._shutting_down = shutting_down
        self.on_change()
        if not shutting_down:
            try:
                self._take(logind)
            except SystemdError as e:
                log.warning("graceful node shutdown: taking logind's lock again: %s", e)
            return
        try:
            self.kill_pods()
        except Exception as e:  # the lock goes all the same: a kubelet that failed must not hold the shutdown
            log.warning("node shutdown manager: stopping the pods: %s", e, exc_info=True)
        finally:
            self._release()
            log.info("node shutdown manager: lock released, the node shuts down")

    def kill_pods(self) -> None:
        """Each group's pods killed at once, the group waited for up to its period before the next starts."""
        pods = [p for p in self._pods() if p.status.phase not in TERMINAL and not p.metadata.deletion_timestamp]
        for g in group(self.periods, pods):
            if not g.pods:
                continue
            deadline = self.clock() + g.period.seconds
            done = []
            for pod in g.pods:
                grace = pod_grace(pod, g.period.seconds)
                log.info("node shutdown: killing pod %s (grace %d s)", pod.key, grace)
                done.append(self._kill(pod.uid, REASON, MESSAGE, grace))
            for d in done:
                d.wait(max(0.0, deadline - self.clock()))
            if not all(d.is_set() for d in done):
                log.info("node shutdown: priority %d's pods not all gone after %d s: the next group",
                         g.period.priority, g.period.seconds)


def _done() -> threading.Event:
    event = threading.Event()
    event.set()
    return event
