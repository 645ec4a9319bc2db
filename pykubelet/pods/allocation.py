"""The allocation manager: what the kubelet has granted each pod, on disk, and whether a resize fits.

In-place resize (PATCH pods/NAME/resize) changes spec.containers[].resources of a running pod, which the
informer brings as a changed pod. The spec is then what is asked, not what the node gave: the kubelet
keeps two records per pod, as the stock kubelet's allocation manager and its runtime manager do:
- allocated: the resources the kubelet accepted (at admission, then at each resize that fits). The pod
  the sync acts on is the informer's pod with these resources (allocated_pod), so a resize that does not
  fit changes nothing on the node;
- actuated: the resources each container was last given (when it started, at each UpdateContainerResources
  that succeeded). Where it differs from the allocation the sync resizes the container in place, or
  restarts it when its resizePolicy says RestartContainer (pods/actions.py).
Both are checkpoints under the kubelet's root dir (the stock kubelet's file names), written atomically
(0600) at each change and read back at start: a restarted kubelet neither forgets an accepted resize nor
resizes a container again. A pod that was running before this kubelet kept records (an upgrade) gets its
spec as both: its containers were made from it.

A resize is weighed against the node's allocatable and the allocations of the other pods on the node:
more than the node has at all is Infeasible (it will never fit; a stock 1.37 API server refuses such a
patch already, through its PodResizeValidator admission, when that plugin is on), more than is free now
is Deferred and weighed again at each sync of the pod, and whenever a pod leaves the node. Either is the
PodResizePending condition; PodResizeInProgress is there while an accepted resize is not actuated yet,
with reason Error and the runtime's or the kubelet's message when actuating it failed (a memory limit
below the container's usage: pods/sync.py).
"""
from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from pykubelet.api.podmodel import Container, Pod, Resources
from pykubelet.pods.admission import Verdict, fits, units
from pykubelet.pods.podresources import pod_requests
from pykubelet.pods.podspec import parse_quantity
from pynode_os.files import atomic_write

log = logging.getLogger(__name__)

ALLOCATED_FILE = "allocated_pods_state"
ACTUATED_FILE = "actuated_pods_state"
RESIZABLE = ("cpu", "memory")
PENDING, IN_PROGRESS = "PodResizePending", "PodResizeInProgress"
RESIZE_CONDITIONS = (PENDING, IN_PROGRESS)
INFEASIBLE, DEFERRED, ERROR = "Infeasible", "Deferred", "Error"


@dataclass(frozen=True)
class PodResources:
    """A pod's resources by container name, and its pod-level resources (spec.resources)."""
    containers: dict[str, Resources] = field(default_factory=dict)
    pod: Resources | None = None


def resizable(pod: Pod) -> tuple[Container, ...]:
    """The containers a resize may change: every init and regular container, as the stock kubelet's
    IsResizableContainer with InPlacePodVerticalScalingInitContainers (GA, locked on in 1.37). Only a running
    one is resized (pods/actions.py), an init container that runs once while it runs."""
    return pod.spec.init_containers + pod.spec.containers


def resources_of(pod: Pod) -> PodResources:
    return PodResources({c.name: c.resources for c in pod.spec.all_containers}, pod.spec.resources)


def _amounts(r: Resources | None) -> dict[str, Decimal]:
    """Requests and limits of cpu and memory as numbers, so that "1" and "1000m" are the same allocation."""
    if r is None:
        return {}
    out = {}
    for kind, values in (("requests", r.requests), ("limits", r.limits)):
        for name in RESIZABLE:
            if name in values:
                out[f"{kind}.{name}"] = parse_quantity(values[name])
    return out


def same(a: Resources | None, b: Resources | None) -> bool:
    """Whether two cpu/memory requests and limits are the same amounts."""
    return _amounts(a) == _amounts(b)


def allocated_pod(pod: Pod, allocated: PodResources | None) -> Pod:
    """`pod` with the resources the kubelet granted it: what the sync acts on and the status reports."""
    if allocated is None:
        return pod

    def granted(c: Container) -> Container:
        r = allocated.containers.get(c.name)
        return c if r is None or r == c.resources else replace(c, resources=r)

    spec = pod.spec
    return replace(pod, spec=replace(spec, containers=tuple(granted(c) for c in spec.containers),
                                     init_containers=tuple(granted(c) for c in spec.init_containers),
                                     resources=allocated.pod if allocated.pod is not None else spec.resources))


def resize_verdict(pod: Pod, others: list[Pod], allocatable: dict[str, str]) -> Verdict:
    """Whether `pod`, with the resources its spec now asks, fits next to the `others` (their allocations):
    admitted, or the PodResizePending reason (Infeasible, Deferred) and message."""
    want = pod_requests(pod)
    for resource in RESIZABLE:
        if resource not in allocatable:
            continue
        capacity = parse_quantity(allocatable[resource])
        asked = want.get(resource, Decimal(0))
        if asked > capacity:
            return Verdict(False, INFEASIBLE, f"Node didn't have enough capacity: {resource}, requested: "
                                              f"{units(resource, asked)}, capacity: {units(resource, capacity)}")
    verdict = fits(pod, others, allocatable)
    return verdict if verdict.admit else Verdict(False, DEFERRED, verdict.message)


def _to_json(r: Resources) -> dict[str, Any]:
    return {"requests": dict(r.requests), "limits": dict(r.limits)}


def _from_json(d: dict[str, Any]) -> Resources:
    return Resources(requests={str(k): str(v) for k, v in (d.get("requests") or {}).items()},
                     limits={str(k): str(v) for k, v in (d.get("limits") or {}).items()})


class Checkpoint:
    """Pod UID -> PodResources, in a file rewritten atomically (0600) at each change, read back at start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pods: dict[str, PodResources] = {}
        self._lock = threading.Lock()
        try:
            raw = json.loads(path.read_bytes())
            self._pods = {uid: PodResources({n: _from_json(r) for n, r in (p.get("containers") or {}).items()},
                                            None if p.get("pod") is None else _from_json(p["pod"]))
                          for uid, p in raw["pods"].items()}
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # as the stock kubelet: a checkpoint it cannot read is started afresh (each running pod's spec)
            log.warning("%s: unreadable (%s): starting without it", path, e)

    def get(self, uid: str) -> PodResources | None:
        with self._lock:
            return self._pods.get(uid)

    def set(self, uid: str, resources: PodResources) -> None:
        with self._lock:
            if self._pods.get(uid) == resources:
                return
            self._pods[uid] = resources
            self._save()

    def set_container(self, uid: str, name: str, resources: Resources) -> None:
        with self._lock:
            current = self._pods.get(uid, PodResources())
            if current.containers.get(name) == resources:
                return
            self._pods[uid] = replace(current, containers={**current.containers, name: resources})
            self._save()

    def set_pod(self, uid: str, resources: Resources | None) -> None:
        with self._lock:
            current = self._pods.get(uid, PodResources())
            if current.pod == resources:
                return
            self._pods[uid] = replace(current, pod=resources)
            self._save()

    def remove(self, uid: str) -> None:
        with self._lock:
            if self._pods.pop(uid, None) is not None:
                self._save()

    def retain(self, uids: Collection[str]) -> None:
        """Drops the pods not in `uids`."""
        with self._lock:
            gone = [uid for uid in self._pods if uid not in uids]
            for uid in gone:
                del self._pods[uid]
            if gone:
                self._save()

    def _save(self) -> None:
        doc = {"pods": {uid: {"containers": {n: _to_json(r) for n, r in p.containers.items()},
                              "pod": None if p.pod is None else _to_json(p.pod)}
                        for uid, p in sorted(self._pods.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(doc, sort_keys=True).encode(), mode=0o600)


@dataclass(frozen=True)
class Condition:
    reason: str
    message: str
    generation: int


@dataclass(frozen=True)
class Event:
    """An event about the pod the caller records: (type, reason, message) as the stock kubelet's."""
    type: str
    reason: str
    message: str


def _summary(pod: Pod, error: str = "") -> str:
    """The stock kubelet's resize events' summary: the containers' resources and the pod's generation."""
    out: dict[str, Any] = {"containers": [{"name": c.name, "resources": _to_json(c.resources)}
                                          for c in resizable(pod)], "generation": pod.metadata.generation}
    if error:
        out["error"] = error
    return json.dumps(out, separators=(",", ":"))


class AllocationManager:
    """The two checkpoints and the resize conditions of the pods on this node (`root_dir`: --root-dir)."""

    def __init__(self, root_dir: Path) -> None:
        self.allocated = Checkpoint(root_dir / ALLOCATED_FILE)
        self.actuated = Checkpoint(root_dir / ACTUATED_FILE)
        self._pending: dict[str, Condition] = {}
        self._in_progress: dict[str, Condition] = {}
        self._restored: set[str] = set()
        self._lock = threading.Lock()

    def admitted(self, pod: Pod) -> None:
        """Records an admitted pod's spec as its allocation, unless it has one (a restart keeps a resize), and
        as what its containers have, unless recorded (a pod running before these records: made from it)."""
        if self.allocated.get(pod.uid) is None:
            self.allocated.set(pod.uid, resources_of(pod))
        if self.actuated.get(pod.uid) is None:
            self.actuated.set(pod.uid, self.allocated.get(pod.uid) or resources_of(pod))

    def allocated_pod(self, pod: Pod) -> Pod:
        return allocated_pod(pod, self.allocated.get(pod.uid))

    def handle_resize(self, pod: Pod, others: Callable[[], Iterable[Pod]],
                      allocatable: Callable[[], dict[str, str]]) -> Event | None:
        """Weighs the resize `pod`'s spec asks, if any, against the node (`others()`: the other pods, with their
        allocations; read only when there is a resize, as they are every pod on the node): accepted (the
        allocation is the spec's), or PodResizePending says why not. The event to record, if any."""
        uid, generation = pod.uid, pod.metadata.generation
        allocated = self.allocated.get(uid)
        wanted = resources_of(pod)
        if allocated is None or self._same(allocated, wanted, pod):
            with self._lock:
                self._pending.pop(uid, None)  # asked back to what it has: nothing pending
            return None
        verdict = resize_verdict(pod, list(others()), allocatable())
        if verdict.admit:
            self.allocated.set(uid, wanted)
            with self._lock:
                self._pending.pop(uid, None)
                self._in_progress[uid] = Condition("", "", generation)
            return Event("Normal", "ResizeStarted", f"Pod resize started: {_summary(pod)}")
        condition = Condition(verdict.reason, verdict.message, generation)
        with self._lock:
            before = self._pending.get(uid)
            self._pending[uid] = condition
        if before is not None and (before.reason, before.generation) == (condition.reason, condition.generation):
            return None
        return Event("Warning", "ResizeInfeasible" if verdict.reason == INFEASIBLE else "ResizeDeferred",
                     f"Pod resize {verdict.reason}: {_summary(pod, verdict.message)}")

    @staticmethod
    def _same(a: PodResources, b: PodResources, pod: Pod) -> bool:
        return same(a.pod, b.pod) and all(same(a.containers.get(c.name), b.containers.get(c.name))
                                          for c in resizable(pod))

    def actuation_done(self, pod: Pod, running: set[str], error: str | None) -> Event | None:
        """After a sync of the allocated `pod` (`running`: its running containers' names): PodResizeInProgress
        while what runs differs from the allocation, reason Error with `error` when actuating failed; the
        event to record (ResizeCompleted, ResizeError), if any."""
        uid, generation = pod.uid, pod.metadata.generation
        actuated = self.actuated.get(uid) or PodResources()
        behind = not same(actuated.pod, pod.spec.resources) or any(
            c.name in running and not same(actuated.containers.get(c.name), c.resources) for c in resizable(pod))
        with self._lock:
            before = self._in_progress.get(uid)
            if not behind:
                self._in_progress.pop(uid, None)
            elif error is not None:
                self._in_progress[uid] = Condition(ERROR, error, before.generation if before else generation)
            elif before is None:
                self._in_progress[uid] = Condition("", "", generation)
        if not behind:
            return Event("Normal", "ResizeCompleted", f"Pod resize completed: {_summary(pod)}") \
                if before is not None else None
        if error is not None and (before is None or before.message != error):
            return Event("Warning", "ResizeError", f"Pod resize error: {_summary(pod, error)}")
        return None

    def conditions(self, uid: str) -> list[dict[str, Any]]:
        """The pod's PodResizePending and PodResizeInProgress conditions, as its status carries them."""
        with self._lock:
            found = [(PENDING, self._pending.get(uid)), (IN_PROGRESS, self._in_progress.get(uid))]
        return [{"type": kind, "status": "True", "observedGeneration": c.generation,
                 **({"reason": c.reason} if c.reason else {}), **({"message": c.message} if c.message else {})}
                for kind, c in found if c is not None]

    def deferred(self) -> list[str]:
        """The pods whose resize waits for room on the node: weighed again when a pod leaves it."""
        with self._lock:
            return [uid for uid, c in self._pending.items() if c.reason == DEFERRED]

    def restore(self, uid: str, conditions: Iterable[dict[str, Any]]) -> None:
        """Takes the resize conditions a pod's status has, as the stock kubelet's BackfillPodResizeConditions:
        a restarted kubelet reports what it reported (its next sync of the pod decides again)."""
        with self._lock:
            if uid in self._restored:  # once: the informer's copy may lag behind what was cleared since
                return
            self._restored.add(uid)
            for c in conditions:
                condition = Condition(str(c.get("reason") or ""), str(c.get("message") or ""),
                                      int(c.get("observedGeneration") or 0))
                if c.get("type") == PENDING:
                    self._pending[uid] = condition
                elif c.get("type") == IN_PROGRESS:
                    self._in_progress[uid] = condition

    def retain(self, uids: Collection[str]) -> None:
        """Drops the records of every pod but `uids` (the desired pods, once listed): as the stock kubelet's
        RemoveOrphanedPods, for the pods deleted while the kubelet was away with nothing of them left in the
        runtime, which no sync of theirs ever forgets."""
        self.allocated.retain(uids)
        self.actuated.retain(uids)

    def forget(self, uid: str) -> None:
        """A pod gone from the node: its records and conditions go."""
        self.allocated.remove(uid)
        self.actuated.remove(uid)
        with self._lock:
            self._pending.pop(uid, None)
            self._in_progress.pop(uid, None)
            self._restored.discard(uid)
