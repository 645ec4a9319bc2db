"""Container lifecycle hooks (postStart, preStop) and the one way the kubelet stops a container.

A hook is the workload's code run at the kubelet's request (exec in the container, an HTTP GET to it, or
a sleep), so it is bounded like a probe: preStop gets at most the grace period, and whatever it used is
taken from the grace the runtime then gives the container before SIGKILL (at least MIN_GRACE seconds, as
the kubelet's minimum), so a hung preStop cannot keep a pod on the node past its grace. postStart runs
right after the container starts, bounded by the pod's grace period too (the kubelet has no bound; a
worker thread stuck forever on a broken hook would be worse); a failed postStart kills the container,
whose restart policy then decides, as the kubelet's.

Every stop of a running container by the kubelet (a deletion, a liveness failure, a failed postStart, a
changed spec, a finished pod's sidecars) goes through `stop_container` so that preStop always runs first.

A pod deleted again with a shorter grace period (`kubectl delete --grace-period` while it terminates) ends
by the new deadline, as the kubelet's pod workers cancel the termination under way and run it again with
the shorter grace: its `Deadline` moves earlier, a sleep hook waiting on it wakes, and the stop that follows
gets only what is left. An exec or HTTP hook already running, and a StopContainer already sent, keep the
bound they started with (the runtime has no way to shorten one).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from pykubelet import runtime as cri
from pykubelet.api.podmodel import Container, HookAction, Pod, SleepAction, TCPSocketAction
from pykubelet.pods.podspec import termination_grace
from pykubelet.prober.handlers import Outcome, Result, run_action

log = logging.getLogger(__name__)

MIN_GRACE = 2
# event(pod, container_name, type, reason, message): PodSyncer.event's signature
EventFn = Callable[[Pod, str, str, str, str], None]


class Deadline:
    """When a termination's grace ends; it only moves earlier (upstream's calculateEffectiveGracePeriod lets a
    grace period only decrease)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._at = clock() + seconds
        self._cond = threading.Condition()

    def shorten(self, seconds: float) -> bool:
        """The grace ends `seconds` from now if that is sooner; True if it moved."""
        with self._cond:
            at = self._clock() + seconds
            if at >= self._at:
                return False
            self._at = at
            self._cond.notify_all()
            return True

    def left(self) -> float:
        with self._cond:
            return max(0.0, self._at - self._clock())

    def sleep(self, seconds: float) -> None:
        """Sleeps `seconds`, or until the grace ends if that is sooner (a shortened grace wakes it)."""
        until = self._clock() + seconds
        with self._cond:
            while (wait := min(until, self._at) - self._clock()) > 0:
                self._cond.wait(wait)


def hook_action(container: Container, hook: str) -> HookAction | None:
    return container.post_start if hook == "postStart" else container.pre_stop


def run_hook(runtime: cri.CRIRuntime, container: Container, container_id: str, hook: str, pod_ip: str,
             timeout: float, field_path: str, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Runs the container's `hook` ("postStart" or "preStop"); SUCCESS if it has none. A sleep action sleeps
    with `sleep` (a Deadline's, for a preStop)."""
    action = hook_action(container, hook)
    if action is None:
        return Outcome(Result.SUCCESS)
    path = f"{field_path}.lifecycle.{hook}"
    if isinstance(action, SleepAction):
        sleep(max(0.0, min(action.seconds, timeout)))
        return Outcome(Result.SUCCESS)
    if isinstance(action, TCPSocketAction):  # deprecated for hooks and never run by the kubelet
        return Outcome(Result.SUCCESS, f"{path}.tcpSocket is not supported")
    outcome = run_action(runtime, action, container, container_id, pod_ip, timeout, path)
    if outcome.result is Result.UNKNOWN:  # the exec could not run: the hook failed
        return Outcome(Result.FAILURE, outcome.message)
    return outcome


def stop_container(runtime: cri.CRIRuntime, pod: Pod | None, name: str, container_id: str, grace: int,
                   pod_ip: str = "", event: EventFn | None = None, why: str | None = None,
                   deadline: Deadline | None = None) -> None:
    """Runs the container's preStop hook (if the pod's spec has one) within `grace` seconds (or by
    `deadline`, the pod's, which may move earlier meanwhile), then stops it with what is left of the grace
    (SIGTERM, then SIGKILL). The Killing event says `why` ("Stopping container NAME" by default), as the
    kubelet's killContainer."""
    if pod is not None and event is not None:
        event(pod, name, "Normal", "Killing", why or f"Stopping container {name}")
    container = None if pod is None else next((c for c in pod.spec.all_containers if c.name == name), None)
    if pod is not None and container is not None and container.pre_stop is not None and grace > 0:
        bound = deadline or Deadline(grace)
        outcome = run_hook(runtime, container, container_id, "preStop", pod_ip, math.ceil(bound.left()),
                           pod.field_path(name), bound.sleep)
        if not outcome.ok:
            message = f"PreStopHook failed: {outcome.message}"
            log.warning("pod %s: container %s: %s", pod.key, name, message)
            if event is not None:
                event(pod, name, "Warning", "FailedPreStopHook", message)
        grace = max(MIN_GRACE, math.ceil(bound.left()))  # the kubelet takes whole seconds used
    elif deadline is not None and grace > 0:
        grace = max(MIN_GRACE, math.ceil(deadline.left()))
    try:
        runtime.stop_container(container_id, grace)
    except cri.NotFound:
        pass


def post_start(runtime: cri.CRIRuntime, pod: Pod, container: Container, container_id: str, pod_ip: str,
               event: EventFn | None = None) -> str | None:
    """Runs the container's postStart hook; on failure kills the container and returns why."""
    if container.post_start is None:
        return None
    grace = termination_grace(pod)
    outcome = run_hook(runtime, container, container_id, "postStart", pod_ip, grace,
                       pod.field_path(container.name))
    if outcome.ok:
        return None
    message = f"PostStartHook failed: {outcome.message}".strip()
    if event is not None:
        event(pod, container.name, "Warning", "FailedPostStartHook", message)
    stop_container(runtime, pod, container.name, container_id, grace, pod_ip, event)
    return message
