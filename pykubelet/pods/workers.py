"""Pod workers: the only place a pod is acted on, one sync at a time per pod UID.

Every source of change (the pod informer, the PLEG, a back-off ending, the periodic resync) only puts a
pod UID into one WorkQueue; a dispatcher takes UIDs from it and syncs each in a thread of its own, and
the queue never hands a UID out again while it is being synced (a UID added meanwhile is synced again
after). So each pod has its own worker, as each has its own goroutine in the kubelet, bursts collapse
into one sync, and every sync reads the latest desired state (the informer's cache) and the latest
actual state (the runtime): level-triggered, never a replay of events.

Why not a pool: a sync may wait as long as its pod makes it: a postStart or preStop hook runs up to the
pod's grace period, which the pod sets (and may set to years), a pull as long as the registry keeps
bytes moving. A few such pods would hold every thread of a pool, and every other pod would wait with
them. Each such wait has a deadline (lifecycle.py, the runtime's pull progress timeout), and runs on its
own pod's thread.

UIDs, not names: a pod deleted and created again under the same name is another pod, whose predecessor's
containers must go. A UID whose pod the API server no longer has (deleted while the kubelet was away,
force-deleted) is killed with the grace its containers were started with. Nothing is killed before every
source has listed its pods: until then an unknown UID means "not listed yet", not "deleted" (the kubelet's
sourcesReady). Pods are synced from the start all the same, each as its source lists it, so that a static
pod runs while the API server is away, or is itself one of the static pods (kubeadm's control plane).
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.api.client import Unreachable
from pykubelet.api.fields import FieldError
from pykubelet.api.informer import key_of
from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.api.workqueue import ShutDown, WorkQueue
from pykubelet.config import Settings
from pykubelet.events import NORMAL, WARNING, EventRecorder, pod_ref
from pykubelet.eviction.policy import REASON as EVICTED
from pykubelet.eviction.policy import evicted_status
from pykubelet.health import Heartbeats
from pykubelet.node.shutdown import REASON as SHUT_DOWN
from pykubelet.pods import termination
from pykubelet.pods.actions import restarting_all
from pykubelet.pods.admission import Admission, rejected_status
from pykubelet.pods.allocation import RESIZE_CONDITIONS, AllocationManager, PodResources, resizable
from pykubelet.pods.backoff import Backoff
from pykubelet.pods.env import EnvSource
from pykubelet.pods.labels import POD_UID
from pykubelet.pods.lifecycle import Deadline
from pykubelet.pods.nodecgroups import NodeCgroups
from pykubelet.pods.pleg import PLEG
from pykubelet.pods.podspec import DEADLINE_EXCEEDED, DEADLINE_MESSAGE, deadline_left, is_finished
from pykubelet.pods.runtimepod import observe
from pykubelet.pods.slices import PodSlices
from pykubelet.pods.status import StatusManager, carried_restarts, now, pod_status
from pykubelet.pods.sync import PodSyncer, SyncResult
from pykubelet.prober.manager import ProbeManager
from pykubelet.volumes.manager import VolumeManager, remove_pod
from pynode_os.systemd import SystemdError

log = logging.getLogger(__name__)
TERMINAL = ("Succeeded", "Failed")


class PodWorkers:
    def __init__(self, client, runtime: cri.CRIRuntime, settings: Settings, informer, *,
                 runtime_name: str = "", events: EventRecorder | None = None,
                 admission: Admission | None = None, services=None,
                 on_started: Callable[[float], None] | None = None, cgroups: bool = False,
                 heartbeats: Heartbeats | None = None) -> None:
        # informer: the desired pods (pykubelet/pods/sources.PodSources: API pods and static pods);
        # services: the Service informer (None in standalone mode); on_started(seconds): a pod reached
        # Running that long after the kubelet first saw it (kubelet_pod_start_duration_seconds); cgroups: the
        # kubelet makes and limits the pods' cgroups (the kubelet's run; tests leave the host's alone), as it
        # always does their slices under the systemd driver, where the runtime makes no parent;
        # heartbeats: /healthz's, which the PLEG and the resync beat once they run
        self.heartbeats = heartbeats or Heartbeats()
        self.on_started = on_started
        self._first_seen: dict[str, float] = {}  # pod uid -> when first seen, until it runs
        self.client, self.runtime, self.settings, self.informer = client, runtime, settings, informer
        self.runtime_name = runtime_name
        self._syncing: set[threading.Thread] = set()  # the pods' sync threads, for the shut-down's join
        self.events, self.admission = events, admission
        self.queue = WorkQueue(base_delay=0.5, max_delay=30.0)
        self.backoff = Backoff()
        # uid -> set on a probe's change while the pod is being deleted (its sync is busy killing it)
        self._terminating: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.probes = ProbeManager(runtime, self._probe_changed, events=events, host_ip=settings.node_ip)
        self.services = services
        self.volumes = VolumeManager(client, settings)
        self.env = EnvSource(client, settings, self.volumes.allocatable,
                             services=None if services is None else self._services)
        self.slices = PodSlices(settings) if settings.cgroup_driver == "systemd" else None
        self.cgroups = NodeCgroups(settings, self.slices, self._active_pods) \
            if cgroups or self.slices is not None else None
        self.allocations = AllocationManager(settings.root_dir)
        self.syncer = PodSyncer(runtime, settings, self.backoff, events=events, probes=self.probes,
                                volumes=self.volumes, env=self.env, allocations=self.allocations,
                                cgroups=self.cgroups)
        self.statuses = StatusManager(client)
        self.pleg = PLEG(runtime, self.queue.add, beat=lambda: self.heartbeats.beat("pleg"))
        self._keys: dict[str, str] = {}  # pod uid -> "namespace/name"
        # pod uid -> (the informer's object, its parse): a change is a new object, parsed once
        self._parsed: dict[str, tuple[Any, Pod]] = {}
        # uid -> (reason, message, grace, done): a kill the eviction or the shutdown manager asked for
        self._kills: dict[str, tuple[str, str, int, threading.Event]] = {}
        # uid -> when the grace of its termination under way ends: a deletion with a shorter grace moves it
        self._deadlines: dict[str, Deadline] = {}
        informer.add_handler(self._on_pod)

    def _services(self) -> list[dict] | None:
        """Every Service, as dicts; None until the informer has listed them once."""
        if not self.services.has_synced():
            return None
        return [s.to_dict() for s in self.services.objects()]

    def _on_pod(self, _kind: str, _old: Any, pod: Any) -> None:
        uid = pod.metadata.uid
        grace = getattr(pod.metadata, "deletionGracePeriodSeconds", None)
        with self._lock:
            if uid not in self._keys:
                self._first_seen[uid] = time.monotonic()
            self._keys[uid] = key_of(pod)
            deadline = self._deadlines.get(uid)
        if deadline is not None and isinstance(grace, int) and deadline.shorten(grace):
            log.info("pod %s: grace period shortened to %d s", key_of(pod), grace)
        self.queue.add(uid)

    def _active_pods(self) -> list[Pod]:
        """The pods parsed and not finished, whose requests the burstable QoS cgroup's shares sum: the parses
        kept, not the informer's objects parsed again for each pod made."""
        with self._lock:
            pods = [pod for _obj, pod in self._parsed.values()]
        return [p for p in pods if not is_finished(p)]

    def pod(self, uid: str) -> Pod | None:
        """The desired pod of `uid` from the informer's cache, parsed once per change of it (FieldError names
        a field the kubelet cannot act on); None if the API server has none."""
        with self._lock:
            key = self._keys.get(uid)
            parsed = self._parsed.get(uid)
        obj = self.informer.get(key) if key else None
        if obj is None or obj.metadata.uid != uid:
            return None
        if parsed is not None and parsed[0] is obj:
            return parsed[1]
        pod = parse_pod(obj.to_dict())
        with self._lock:
            if uid in self._keys:  # not forgotten meanwhile
                self._parsed[uid] = (obj, pod)
        return pod

    # --- one sync ---------------------------------------------------------------------------------

    def sync(self, uid: str) -> float | None:
        """Syncs pod `uid`; returns when to sync it again (None: when something changes)."""
        listed = self.informer.has_synced()  # before the read: a pod listed after it is not taken for gone
        try:
            pod = self.pod(uid)
        except FieldError as e:  # the pod's next change brings it back
            log.warning("pod %s: not run: %s", self._keys.get(uid, uid), e)
            return None
        if pod is None and not listed:
            return None  # not listed yet: _when_listed brings it back
        state = observe(self.runtime, uid)
        if pod is None or pod.metadata.deletion_timestamp:
            self._terminate(uid, pod, state)
            return None
        sent = self.statuses.last(uid)
        with self._lock:
            kill = self._kills.get(uid)
        if kill is not None:
            self._kill_now(uid, pod, state, *kill)
            return None
        # nothing of a pod the kubelet killed starts again
        if sent.get("reason") in (EVICTED, SHUT_DOWN, DEADLINE_EXCEEDED):
            return None
        if sent.get("phase") in TERMINAL:  # the informer's copy may not show it yet: never start it again
            pod = replace(pod, status=replace(pod.status, phase=sent["phase"]))
        left = deadline_left(pod, sent.get("startTime") or (pod.raw.get("status") or {}).get("startTime"),
                             datetime.datetime.now(datetime.UTC))
        if left is not None and left <= 0 and not is_finished(pod):
            self._deadline_exceeded(uid, pod, state)
            return None
        if self.admission is not None and not self._admit(uid, pod, state):
            return None
        pod = self._allocate(pod)
        last = self._last(pod)
        if restarting_all(pod, state):
            # as the kubelet's: the status says AllContainersRestarting before the pass resets the pod
            self.statuses.set_pod_status(pod.metadata, self._status(pod, state, SyncResult(), last),
                                         current=pod.raw.get("status"))
            last = self.statuses.last(uid) or last
        result = self.syncer.sync(pod, state, carried_restarts(pod, state, last))
        state = observe(self.runtime, uid)
        self.probes.sync_pod(pod, state)
        self._actuated(pod, state, result.resize_error)
        status = self._status(pod, state, result, last)
        if status["phase"] in TERMINAL:  # as the kubelet's: a finished pod has no resize to report
            status["conditions"] = [c for c in status["conditions"] if c["type"] not in RESIZE_CONDITIONS]
        if status["phase"] in TERMINAL and state.sandbox is not None:
            # a finished pod keeps its containers (for logs) but not its sandbox and IP, as the kubelet's
            termination.kill_pod_sandbox(self.runtime, state)
        meta = pod.metadata
        before = sent.get("phase") or pod.status.phase
        if self.statuses.set_pod_status(meta, status, current=pod.raw.get("status")) and status["phase"] == "Running" \
                and before == "Pending":
            with self._lock:
                seen = self._first_seen.pop(uid, None)
            if seen is not None and self.on_started is not None:
                self.on_started(time.monotonic() - seen)
        if left is not None and status["phase"] not in TERMINAL:  # the deadline is kept without a resync
            result.again_in(left)
        return result.requeue_after

    def _status(self, pod: Pod, state, result: SyncResult, last: dict | None = None) -> dict:
        """`last`: the status last written (what the runtime no longer has is carried from it)."""
        actuated = self.allocations.actuated.get(pod.uid) or PodResources()
        return pod_status(pod, state, result, host_ip=self.settings.node_ip, runtime_name=self.runtime_name,
                          probes=self.probes, actuated=actuated.containers, actuated_pod=actuated.pod,
                          resize_conditions=self.allocations.conditions(pod.uid),
                          last=self._last(pod) if last is None else last)

    def _last(self, pod: Pod) -> dict:
        """The pod's status as last written: this kubelet's, else (after a restart) the API server's."""
        return self.statuses.last(pod.uid) or pod.raw.get("status") or {}

    def _probe_changed(self, uid: str) -> None:
        """A probe's result changed: the pod's sync recomputes its status, or, while the pod is being deleted,
        the termination that holds its sync writes it (pods/termination.py's kill waits out the grace)."""
        with self._lock:
            terminating = self._terminating.get(uid)
        if terminating is not None:
            terminating.set()
        else:
            self.queue.add(uid)

    def _allocate(self, pod: Pod) -> Pod:
        """The admitted `pod` with the resources the kubelet granted it, a resize in its spec weighed first
        against the node's allocatable and the other pods' allocations (pods/allocation.py)."""
        uid = pod.uid
        self.allocations.admitted(pod)
        self.allocations.restore(uid, (pod.raw.get("status") or {}).get("conditions") or [])
        admission = self.admission
        if admission is not None:
            event = self.allocations.handle_resize(
                pod, lambda: [self.allocations.allocated_pod(p) for p in admission.others(uid)], admission.allocatable)
        else:  # no admission (tests): the node's room is not weighed
            event = self.allocations.handle_resize(pod, list, dict)
        self._resize_event(pod, event)
        return self.allocations.allocated_pod(pod)

    def _actuated(self, pod: Pod, state, error: str | None) -> None:
        """After a sync: whether the allocated `pod`'s resize is done (PodResizeInProgress while not)."""
        running = {c.name for c in resizable(pod)
                   if (h := state.history(c.name)) and h[0].state == api_pb2.CONTAINER_RUNNING}
        self._resize_event(pod, self.allocations.actuation_done(pod, running, error))

    def _resize_event(self, pod: Pod, event) -> None:
        if event is not None and self.events is not None:
            self.events.event(pod_ref(pod), event.type, event.reason, event.message)

    def pods(self) -> list[dict]:
        """The pods this kubelet runs (API and static pods), each with the status it last reported, as the
        API's JSON: the kubelet server's /pods."""
        out = []
        for obj in self.informer.objects():
            pod = obj.to_dict()
            sent = self.statuses.last(pod["metadata"].get("uid", ""))
            if sent:
                pod["status"] = {**(pod.get("status") or {}), **sent}
            out.append(pod)
        return out

    def reported_pods(self) -> list[Pod]:
        """pods(), parsed: what eviction weighs (the phase each last reported, not the informer's)."""
        return runnable(self.pods())

    def _admit(self, uid: str, pod: Pod, state) -> bool:
        """False for a pod the node does not run: rejected now (its status and a Warning event say why), or
        finished before the kubelet started with nothing of it left on the node."""
        assert self.admission is not None
        on_node = bool(state.sandboxes or state.containers)
        if not on_node and pod.status.phase in TERMINAL:
            return False
        verdict = self.admission.admit(pod, on_node)
        if verdict.admit:
            return True
        if self.statuses.set_pod_status(pod.metadata, rejected_status(pod, verdict), current=pod.raw.get("status")) \
                and self.events:
            self.events.event(pod_ref(pod), WARNING, verdict.reason, verdict.message)
        return False

    def kill(self, uid: str, reason: str, message: str, grace: int) -> threading.Event:
        """Kills pod `uid` (`grace` seconds) and marks it Failed with `reason` and `message` (and a
        DisruptionTarget condition): the eviction manager's decision (pykubelet/eviction) or the shutdown
        manager's (pykubelet/node/shutdown.py), carried out by the pod's own sync so that it never races one.
        The event is set once done."""
        done = threading.Event()
        with self._lock:
            self._kills[uid] = (reason, message, grace, done)
        self.queue.add(uid)
        return done

    def evict(self, uid: str, message: str, grace: int, timeout: float = 30.0) -> bool:
        """kill() as Evicted, waited for: True once done; False if not done within `timeout` (the kubelet's
        podCleanupTimeout), and then it is not done at all."""
        done = self.kill(uid, EVICTED, message, grace)
        finished = done.wait(timeout)
        with self._lock:
            if not finished and self._kills.get(uid, ("", "", 0, None))[3] is done:
                self._kills.pop(uid)
        return finished

    def _deadline_exceeded(self, uid: str, pod: Pod, state) -> None:
        """The kubelet's activeDeadlineHandler: a pod active longer than its activeDeadlineSeconds is killed
        with its grace period and Failed, reason DeadlineExceeded, a Normal event saying so."""
        log.info("pod %s: %s", pod.key, DEADLINE_MESSAGE)
        if self.events is not None:
            self.events.event(pod_ref(pod), NORMAL, DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
        self._kill_now(uid, pod, state, DEADLINE_EXCEEDED, DEADLINE_MESSAGE, pod.spec.termination_grace_period_seconds,
                       threading.Event(), disruption=False)

    def _kill_now(self, uid: str, pod: Pod, state, reason: str, message: str, grace: int,
                  done: threading.Event, disruption: bool = True) -> None:
        self.probes.remove_pod(uid)
        if state.sandboxes or state.containers:
            termination.kill_pod(self.runtime, state, grace, pod, self.syncer.event)
        remove_pod(self.settings.root_dir, uid)  # its volumes: an emptyDir's space is the node's again
        current = pod.raw.get("status")
        status = evicted_status(self.statuses.last(uid) or current or {}, message, now(), reason, disruption)
        self.statuses.set_pod_status(pod.metadata, status, current=current)
        if self.events is not None and reason == EVICTED:  # the stock shutdown manager records no pod event
            self.events.event(pod_ref(pod), WARNING, EVICTED, message)
        with self._lock:
            self._kills.pop(uid, None)
        done.set()

    def resend_status(self, uid: str) -> None:
        """Sends the pod's status again at its next sync (a static pod's mirror pod was made anew)."""
        self.statuses.forget(uid)
        self.queue.add(uid)

    def _last_seen(self, uid: str) -> Pod | None:
        """A skeleton of pod `uid` from the name it was last seen under. The API server deletes a Failed or
        Succeeded pod at once, and an evicted pod has nothing left in the runtime to be named by, yet its
        cgroup and log directory are still on the node."""
        with self._lock:
            key = self._keys.get(uid)
        if key is None:
            return None
        namespace, _, name = key.rpartition("/")
        return parse_pod({"metadata": {"name": name, "namespace": namespace, "uid": uid}, "spec": {}})

    def _terminate(self, uid: str, pod: Pod | None, state) -> None:
        skeleton = pod or termination.identity(state, uid) or self._last_seen(uid)
        if state.sandboxes or state.containers:
            grace = termination.grace_period(pod, state)
            log.info("pod %s: stopping (grace %d s)", skeleton.key if skeleton else uid, grace)
            deadline = Deadline(grace)
            with self._lock:
                self._deadlines[uid] = deadline
            try:
                if pod is None:
                    termination.stop_containers(self.runtime, state, grace, pod, self.syncer.event, deadline)
                else:
                    self._stop_reporting(pod, state, grace, deadline)
            finally:
                with self._lock:
                    self._deadlines.pop(uid, None)
            if pod is not None:
                self._final_status(pod)
            termination.remove_from_runtime(self.runtime, state)
        self.probes.remove_pod(uid)
        if skeleton is not None:
            termination.clean_node(skeleton, self.settings, self.slices)
        self.volumes.tokens.forget(uid)
        self.volumes.certificates.forget(uid)
        if pod is not None:
            termination.delete_from_api(self.client, pod)
        else:
            with self._lock:
                self._keys.pop(uid, None)
                self._parsed.pop(uid, None)
                self._first_seen.pop(uid, None)
            self.statuses.forget(uid)
            self.allocations.forget(uid)
            for waiting in self.allocations.deferred():  # its room may be what their resize waits for
                self.queue.add(waiting)
            self.backoff.forget_prefix(uid + "/")
            self.syncer.forget(uid)
            if self.admission is not None:
                self.admission.forget(uid)

    def _stop_reporting(self, pod: Pod, state, grace: int, deadline: Deadline) -> None:
        """Stops the deleted `pod`'s containers as the kubelet's SyncTerminatingPod: its liveness and startup probes
        stopped first, its status written as the kill starts and, while its containers take their grace to
        end, again whenever a readiness probe changes (checked each second too: a container that ended is not
        ready), so that endpoints stop sending traffic to a pod on its way out."""
        uid = pod.uid
        changed = threading.Event()
        errors: list[Exception] = []

        def kill() -> None:
            try:
                termination.stop_containers(self.runtime, state, grace, pod, self.syncer.event, deadline)
            except Exception as e:  # raised again in the pod's sync, which reports it
                errors.append(e)

        self.probes.stop_liveness_and_startup(uid)
        with self._lock:
            self._terminating[uid] = changed
        killer = threading.Thread(target=kill, name=f"kill-{uid[:8]}", daemon=True)
        killer.start()  # first: a status the API server refuses must not keep the pod running
        try:
            self._report_terminating(pod)
            while killer.is_alive():
                changed.wait(1.0)
                changed.clear()
                if killer.is_alive():
                    self._report_terminating(pod)
        finally:
            killer.join()
            with self._lock:
                self._terminating.pop(uid, None)
        if errors:
            raise errors[0]

    def _report_terminating(self, pod: Pod) -> None:
        state = observe(self.runtime, pod.uid)
        self.statuses.set_pod_status(pod.metadata, self._status(pod, state, SyncResult()),
                                     current=pod.raw.get("status"))

    def _final_status(self, pod: Pod) -> None:
        """The status of a deleted pod whose containers have all stopped, sent before they leave the runtime,
        as the kubelet's syncTerminatingPod: each container terminated with its exit code and finish time,
        and a terminal phase. A pod kept by a finalizer shows it for as long as it stays."""
        state = observe(self.runtime, pod.uid)
        status = pod_status(pod, state, SyncResult(), host_ip=self.settings.node_ip, runtime_name=self.runtime_name,
                            terminal=True, last=self._last(pod))
        if status["phase"] in TERMINAL:
            status["conditions"] = [c for c in status["conditions"] if c["type"] not in RESIZE_CONDITIONS]
        self.statuses.set_pod_status(pod.metadata, status, current=pod.raw.get("status"))

    # --- running ----------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Each UID the queue hands out is synced in a thread of its own (see the module's docstring)."""
        while True:
            try:
                uid = str(self.queue.get())
            except ShutDown:
                return
            worker = threading.Thread(target=self._work, args=(uid,), name=f"pod-worker-{uid[:8]}", daemon=True)
            with self._lock:
                self._syncing.add(worker)
            worker.start()

    def _work(self, uid: str) -> None:
        try:
            again = self.sync(uid)
        except Exception as e:
            delay = self.queue.add_rate_limited(uid)
            log.warning("pod %s: sync failed: %s; again in %.1f s", self._keys.get(uid, uid), e, delay,
                        exc_info=not isinstance(e, cri.CRIError | Unreachable))
        else:
            self.queue.forget(uid)
            if again is not None:
                self.queue.add_after(uid, again)
        finally:
            self.queue.done(uid)
            with self._lock:
                self._syncing.discard(threading.current_thread())

    def _resync(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.sync_frequency):
            self.heartbeats.beat("resync")
            with self._lock:
                uids = list(self._keys)
            for uid in uids:
                self.queue.add(uid)
            if self.cgroups is not None:  # as the stock kubelet's periodic QoS update: pods gone leave the sum
                try:
                    self.cgroups.update_qos()
                except (OSError, SystemdError) as e:
                    log.warning("the burstable QoS cgroup's cpu shares: %s", e)

    def _when_listed(self, stop: threading.Event) -> None:
        """Once every source has listed its pods: the resources allocated to pods no source has are dropped,
        and each pod the runtime has is synced, so that one no source names (deleted while the kubelet was
        away) is stopped and removed."""
        while not self.informer.wait_synced(0.5):
            if stop.is_set():
                return
        self.allocations.retain({obj.metadata.uid for obj in self.informer.objects()})
        while True:
            try:
                uids = {s.labels.get(POD_UID, "") for s in self.runtime.list_pod_sandbox()}
                uids |= {c.labels.get(POD_UID, "") for c in self.runtime.list_containers()}
                break
            except cri.CRIError as e:
                log.warning("listing the runtime's pods: %s", e)
                if stop.wait(1.0):
                    return
        uids.discard("")
        log.info("every pod source has listed its pods: %d pods in the runtime to sync", len(uids))
        for uid in uids:
            self.queue.add(uid)

    def run(self, stop: threading.Event) -> None:
        """Syncs pods until `stop`."""
        self.heartbeats.watch("pleg", max(self.pleg.relist_period, self.settings.runtime_request_timeout))
        self.heartbeats.watch("resync", self.settings.sync_frequency)
        threads = [threading.Thread(target=self._dispatch, name="pod-dispatch", daemon=True),
                   threading.Thread(target=self._when_listed, args=(stop,), name="pod-sources", daemon=True),
                   threading.Thread(target=self.pleg.run, args=(stop,), name="pleg", daemon=True),
                   threading.Thread(target=self._resync, args=(stop,), name="pod-resync", daemon=True),
                   threading.Thread(target=self.probes.run, args=(stop,), name="probes", daemon=True)]
        for t in threads:
            t.start()
        stop.wait()
        self.queue.shut_down()
        with self._lock:
            threads += self._syncing
        deadline = time.monotonic() + 10
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))


def runnable(raws: Iterable[dict]) -> list[Pod]:
    """The pods of `raws` that the kubelet can read; one it cannot is run nowhere (its sync says why), so it
    takes no room on the node either."""
    out = []
    for raw in raws:
        try:
            out.append(parse_pod(raw))
        except FieldError:
            continue
    return out
