"""Probes: whether a container has started, is alive, and is ready for traffic, as its spec asks.

One probe worker per (pod, container, probe kind) holds the kubelet's per-probe state machine: the result
it published for the current container, the run of equal results that must reach successThreshold or
failureThreshold before that result changes, and the hold after a liveness or startup failure (the
container is being killed: probing it again would only repeat the verdict). A worker never sees more of
the runtime than the pod worker's last sync told it (`sync_pod`): it probes the container that was running
then and drops a result that arrives for a container since replaced, so a slow probe cannot kill a
container's successor.

Workers are not threads: one scheduler thread keeps them in a heap by due time and starts each due probe
on a thread of its own that ends with the probe, so 110 pods with three probes each cost a handful of
threads at a time, and a probe that hangs up to its timeoutSeconds, which the pod sets, delays no other
(a pool would be held whole by a few pods whose probes hang). A worker runs every periodSeconds after its
previous run started, from initialDelaySeconds after its container started; a container's first probe
runs as soon as it is seen running, not a period later, so a pod turns Ready within the sync that sees it
up. The startup probe gates the other two: until it succeeds the container is not `started`, not ready,
and its liveness is not checked. Any change of a published result queues the pod on its pod worker (`on_change`), which
recomputes the status (ready, started, the Ready condition) and, for a liveness or startup failure, kills
the container so that the restart policy decides its fate.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.api.podmodel import Container, Pod, Probe
from pykubelet.events import WARNING, EventRecorder, pod_ref
from pykubelet.pods.runtimepod import RuntimePod
from pykubelet.prober.handlers import REDIRECT_WARNING, Outcome, Result, run_action

log = logging.getLogger(__name__)

STARTUP, LIVENESS, READINESS = "startup", "liveness", "readiness"
FIELDS = {STARTUP: "startupProbe", LIVENESS: "livenessProbe", READINESS: "readinessProbe"}
ATTRIBUTES = {STARTUP: "startup_probe", LIVENESS: "liveness_probe", READINESS: "readiness_probe"}
TITLES = {STARTUP: "Startup", LIVENESS: "Liveness", READINESS: "Readiness"}
# what a probe reports for a container it has not yet decided on (the kubelet's initial values)
INITIAL = {STARTUP: Result.UNKNOWN, LIVENESS: Result.SUCCESS, READINESS: Result.FAILURE}
DURATION_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0)  # prometheus' DefBuckets, as upstream's


@dataclass(frozen=True)
class ProbeTally:
    """One probe's counts since its worker started, for /metrics/probes (upstream's prober_probe_total
    and prober_probe_duration_seconds): they go with the worker, as upstream deletes a worker's series
    when it stops, so a pod gone from the node leaves no series behind."""
    kind: str  # "Liveness", "Readiness", "Startup" (upstream's probe_type label)
    container: str
    pod: str
    namespace: str
    uid: str
    successful: int
    failed: int
    buckets: tuple[int, ...]  # successful probes' durations, per DURATION_BUCKETS (not cumulative) and over
    duration_sum: float


def probed_containers(pod: Pod) -> list[Container]:
    """The containers that may have probes: the regular ones and the sidecars."""
    return [c for c in pod.spec.init_containers if c.is_sidecar] + list(pod.spec.containers)


@dataclass
class Worker:
    """The state of one probe of one container."""
    uid: str
    name: str
    kind: str
    probe: Probe
    pod: Pod
    container: Container
    pod_ip: str = ""
    container_id: str = ""  # the container the state below is about ("" while none runs)
    started_at: float = 0.0  # when it started (unix seconds)
    result: Result = Result.UNKNOWN
    last: Result | None = None
    run: int = 0
    on_hold: bool = False
    message: str = ""
    due: float = 0.0
    busy: bool = False
    stopped: bool = False
    successful: int = 0
    failed: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    duration_sum: float = 0.0

    def result_for(self, container_id: str) -> Result:
        return self.result if container_id and container_id == self.container_id else INITIAL[self.kind]

    def count(self, result: Result, seconds: float) -> None:
        """Counts a probe that ran to a verdict (one that errored is not counted, as upstream's)."""
        if result is Result.FAILURE:
            self.failed += 1
            return
        self.successful += 1
        self.buckets[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.duration_sum += seconds

    def tally(self) -> ProbeTally:
        meta = self.pod.metadata
        return ProbeTally(TITLES[self.kind], self.name, meta.name, meta.namespace, self.uid, self.successful,
                          self.failed, tuple(self.buckets), self.duration_sum)

    def reset(self, container_id: str, started_at: float) -> None:
        self.container_id, self.started_at = container_id, started_at
        self.result, self.last, self.run, self.on_hold, self.message = INITIAL[self.kind], None, 0, False, ""

    def record(self, outcome: Outcome) -> bool:
        """Counts one probe result; True if the published result changed (the kubelet's thresholds)."""
        if outcome.result is self.last:
            self.run += 1
        else:
            self.last, self.run = outcome.result, 1
        threshold = (self.probe.failure_threshold if outcome.result is Result.FAILURE
                     else self.probe.success_threshold)
        if self.run < threshold:
            return False
        changed = self.result is not outcome.result
        self.result, self.message = outcome.result, outcome.message
        if self.kind in (LIVENESS, STARTUP) and outcome.result is Result.FAILURE:
            self.on_hold, self.run = True, 0  # the container is killed: no more verdicts on it
        return changed


def reported(pod: Pod, name: str, container_id: str, kind: str) -> bool:
    """Whether the pod's status in the API server says container `container_id` is ready (readiness) or
    started (startup): after a kubelet restart, its probes start from there, not from "not ready", so that
    a restart does not flap every pod's Ready condition."""
    for s in pod.status.container_statuses:
        if s.name == name and s.container_id.endswith("://" + container_id):
            return s.ready if kind == READINESS else s.started
    return False


def running_container(state: RuntimePod, name: str) -> api_pb2.ContainerStatus | None:
    """The running container `name` of the pod's current sandbox."""
    sandbox = state.sandbox
    history = state.history(name)
    if not history or sandbox is None or history[0].state != api_pb2.CONTAINER_RUNNING:
        return None
    if not any(c.id == history[0].id and c.pod_sandbox_id == sandbox.id for c in state.containers):
        return None
    return history[0]


class ProbeManager:
    def __init__(self, runtime: cri.CRIRuntime, on_change: Callable[[str], None], *,
                 events: EventRecorder | None = None, host_ip: str | None = None) -> None:
        self.runtime, self.on_change, self.events, self.host_ip = runtime, on_change, events, host_ip or ""
        self._workers: dict[tuple[str, str, str], Worker] = {}
        self._heap: list[tuple[float, int, Worker]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()

    # --- what the pod workers tell and ask ------------------------------------------------------------

    def sync_pod(self, pod: Pod, state: RuntimePod) -> None:
        """Brings the pod's probe workers in line with its spec and with what runs (after each pod sync)."""
        uid = pod.uid
        net = state.sandbox_status.network if state.sandbox_status is not None else None
        pod_ip = net.ip if net is not None and net.ip else (self.host_ip if pod.spec.host_network else "")
        wanted = set()
        now = time.time()
        with self._cond:
            for container in probed_containers(pod):
                current = running_container(state, container.name)
                for kind, attribute in ATTRIBUTES.items():
                    probe = getattr(container, attribute)
                    if probe is None:
                        continue
                    key = (uid, container.name, kind)
                    wanted.add(key)
                    w = self._workers.get(key)
                    fresh = w is None
                    if w is None:
                        w = self._workers[key] = Worker(uid, container.name, kind, probe, pod, container)
                        w.reset("", 0.0)
                    w.pod, w.container, w.probe, w.pod_ip = pod, container, probe, pod_ip
                    cid = current.id if current is not None else ""
                    if cid != w.container_id:
                        w.reset(cid, current.started_at / 1e9 if current is not None else 0.0)
                        if fresh and cid and kind != LIVENESS and reported(pod, container.name, cid, kind):
                            w.result = Result.SUCCESS  # a restarted kubelet keeps what it reported
                        if cid:  # a new container: its first probe is due once its initial delay is over
                            self._schedule(w, max(now, w.started_at + probe.initial_delay_seconds))
            for key in [k for k in self._workers if k[0] == uid and k not in wanted]:
                self._workers.pop(key).stopped = True

    def stop_liveness_and_startup(self, uid: str) -> None:
        """A pod being deleted: its containers get their stop signal and may fail these probes on their way
        out, which must kill nothing and say nothing, as the kubelet's (its probe workers report success for
        a deleted pod's liveness and startup and stop). Readiness goes on probing: a terminating container
        that stops serving turns its pod not Ready while it ends."""
        with self._cond:
            for key in [k for k in self._workers if k[0] == uid and k[2] in (LIVENESS, STARTUP)]:
                self._workers.pop(key).stopped = True

    def remove_pod(self, uid: str) -> None:
        """Stops the probes of a pod leaving the node."""
        with self._cond:
            for key in [k for k in self._workers if k[0] == uid]:
                self._workers.pop(key).stopped = True

    def started(self, uid: str, name: str, container_id: str) -> bool:
        """Whether the running container `container_id` has started: its startup probe succeeded, or it has
        none."""
        with self._cond:
            w = self._workers.get((uid, name, STARTUP))
            return w is None or w.result_for(container_id) is Result.SUCCESS

    def ready(self, uid: str, name: str, container_id: str) -> bool:
        """Whether the running container `container_id` is ready: started, and its readiness probe (if any)
        succeeded."""
        if not self.started(uid, name, container_id):
            return False
        with self._cond:
            w = self._workers.get((uid, name, READINESS))
            return w is None or w.result_for(container_id) is Result.SUCCESS

    def kill_reason(self, uid: str, name: str, container_id: str) -> tuple[str, int | None] | None:
        """(why, grace) if the container failed its liveness or startup probe and must be killed; grace is
        the probe's terminationGracePeriodSeconds (None: the pod's)."""
        with self._cond:
            for kind in (STARTUP, LIVENESS):
                w = self._workers.get((uid, name, kind))
                if w is not None and w.result_for(container_id) is Result.FAILURE:
                    return (f"Container {name} failed {kind} probe, will be restarted",
                            w.probe.termination_grace_period_seconds)
        return None

    def tallies(self) -> list[ProbeTally]:
        """The counts of every probe that has run a probe to a verdict, for /metrics/probes."""
        with self._cond:
            return [w.tally() for w in self._workers.values() if w.successful or w.failed]

    # --- running the probes ---------------------------------------------------------------------------

    def _schedule(self, w: Worker, due: float) -> None:
        w.due = due
        heapq.heappush(self._heap, (due, next(self._seq), w))
        self._cond.notify()

    def run(self, stop: threading.Event) -> None:
        """Starts due probes, each on a thread of its own, until `stop`."""
        waker = threading.Thread(target=self._wake_on, args=(stop,), name="probe-stop", daemon=True)
        waker.start()
        while not stop.is_set():
            with self._cond:
                now = time.time()
                due: list[Worker] = []
                while self._heap and self._heap[0][0] <= now:
                    when, _, w = heapq.heappop(self._heap)
                    if not w.stopped and not w.busy and when == w.due:
                        w.busy = True
                        due.append(w)
                if not due:
                    self._cond.wait(min(self._heap[0][0] - now, 5.0) if self._heap else 5.0)
                    continue
            for w in due:
                threading.Thread(target=self._run_one, args=(w,), name=f"probe-{w.kind}", daemon=True).start()

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        with self._cond:
            self._cond.notify_all()

    def _run_one(self, w: Worker) -> None:
        began = time.time()
        try:
            self.probe_once(w)
        except Exception:
            log.exception("probe %s of %s/%s", w.kind, w.pod.metadata.name, w.name)
        finally:
            with self._cond:
                w.busy = False
                if not w.stopped and w.container_id:  # a new container meanwhile: its own due time
                    self._schedule(w, w.due if w.due > began else began + w.probe.period_seconds)

    def probe_once(self, w: Worker) -> Outcome | None:
        """One run of the worker's probe, if it is due to run (None if skipped); publishes the result."""
        with self._cond:
            cid, started_at, on_hold = w.container_id, w.started_at, w.on_hold
            if w.kind == STARTUP and w.result_for(cid) is Result.SUCCESS:
                return None  # started: a startup probe is done for this container
        if not cid or on_hold or w.stopped:
            return None
        if w.kind != STARTUP and not self.started(w.uid, w.name, cid):
            return None
        if time.time() < started_at + w.probe.initial_delay_seconds:
            return None
        field_path = f"spec.containers{{{w.name}}}.{FIELDS[w.kind]}"
        began = time.monotonic()
        outcome = run_action(self.runtime, w.probe.action, w.container, cid, w.pod_ip, w.probe.timeout_seconds,
                             field_path)
        if outcome.result is Result.UNKNOWN:  # not run: no verdict, but said, as the kubelet's
            log.debug("%s probe of %s/%s: %s", w.kind, w.pod.metadata.name, w.name, outcome.message)
            self._event(w, WARNING, "Unhealthy", f"{TITLES[w.kind]} probe errored: {outcome.message}")
            return outcome
        with self._cond:
            w.count(outcome.result, time.monotonic() - began)
            if w.container_id != cid or w.stopped:
                return outcome  # the container was replaced meanwhile: not its verdict
            changed = w.record(outcome)
            became_started = changed and w.kind == STARTUP and w.result is Result.SUCCESS
            if became_started:  # liveness and readiness start now, not a period later
                for kind in (LIVENESS, READINESS):
                    sibling = self._workers.get((w.uid, w.name, kind))
                    if sibling is not None and sibling.container_id == cid:
                        self._schedule(sibling, time.time())
        title = TITLES[w.kind]
        if outcome.result is Result.FAILURE:
            self._event(w, WARNING, "Unhealthy", f"{title} probe failed: {outcome.message}")
        elif outcome.message.startswith(REDIRECT_WARNING):
            self._event(w, WARNING, "ProbeWarning", f"{title} probe warning: {outcome.message}")
        if changed:
            log.info("pod %s: %s probe of %s: %s", w.pod.key, w.kind, w.name, w.result.value)
            self.on_change(w.uid)
        return outcome

    def _event(self, w: Worker, type_: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.event(pod_ref(w.pod, w.name), type_, reason, message)

