"""What the eviction manager decides, as pure functions of what it measured: which thresholds are met,
which node conditions hold, which pod goes first, and what its status says (the kubelet's
pkg/kubelet/eviction helpers, in its words: a user reading `kubectl describe pod` or a tool matching the
stock kubelet's messages sees the same text).

Threat model: a pod chooses how much memory, disk, inodes and processes it uses, its requests and limits,
its emptyDir sizeLimit and its priority class (within what the API server admits). It can't choose to be
critical (a static pod, a mirror pod or system-critical priority), and it can't escape the order: a pod
using more than it requested goes before one that does not, whatever its priority, so a BestEffort pod that
fills the node is the first to go. A pod's local-storage limits are checked against its own usage, so it
is evicted for passing them whether or not the node is short.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pykubelet.api import quantity as api_quantity
from pykubelet.api.podmodel import EmptyDirSource, Pod
from pykubelet.pods.podresources import pod_requests
from pykubelet.pods.podspec import is_critical, parse_quantity

REASON = "Evicted"
MEMORY, DISK, PIDS = "MemoryPressure", "DiskPressure", "PIDPressure"
# signal -> (the node condition it raises, the resource a pod is evicted for)
SIGNALS = {"memory.available": (MEMORY, "memory"),
           "nodefs.available": (DISK, "ephemeral-storage"), "nodefs.inodesFree": (DISK, "inodes"),
           "imagefs.available": (DISK, "ephemeral-storage"), "imagefs.inodesFree": (DISK, "inodes"),
           "pid.available": (PIDS, "pids")}
CONDITIONS = (MEMORY, DISK, PIDS)
MEMORY_PRESSURE_TAINT = "node.kubernetes.io/memory-pressure"


@dataclass(frozen=True)
class Value:
    """A threshold's value: an absolute quantity (bytes, inodes, pids) or a fraction of the capacity."""
    quantity: int | None = None
    percentage: float | None = None

    def of(self, capacity: int) -> int:
        return self.quantity if self.quantity is not None else int(capacity * (self.percentage or 0.0))


@dataclass(frozen=True)
class Threshold:
    signal: str
    value: Value
    grace_period: float = 0.0  # seconds the signal must stay past the value before a pod goes; 0: hard
    min_reclaim: Value | None = None
    hard: bool = True

    @property
    def condition(self) -> str:
        return SIGNALS[self.signal][0]

    @property
    def resource(self) -> str:
        return SIGNALS[self.signal][1]


@dataclass(frozen=True)
class Observation:
    available: int
    capacity: int


DEFAULT_HARD = {"memory.available": Value(quantity=100 << 20), "nodefs.available": Value(percentage=0.10),
                "imagefs.available": Value(percentage=0.15), "nodefs.inodesFree": Value(percentage=0.05)}

# --- parsing (KubeletConfiguration's evictionHard, evictionSoft, evictionSoftGracePeriod, ...) ------------

def parse_value(text: Any) -> Value | None:
    """"10%" or a quantity ("100Mi", "1000"); None for one that can never be met ("0%", "0"), which the
    kubelet drops."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"a quantity or a percentage, got {text!r}")
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise ValueError(f"a percentage such as \"10%\", got {text!r}") from None
        if not 0 <= pct <= 100 or math.isnan(pct):
            raise ValueError(f"a percentage between 0% and 100%, got {text!r}")
        return Value(percentage=pct / 100) if pct else None
    number = api_quantity.parse(text)
    if number < 0:
        raise ValueError(f"a non-negative quantity, got {text!r}")
    return Value(quantity=api_quantity.value(number)) if number else None


def _signal_map(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"a map of eviction signals to {what}, got {value!r}")
    for signal in value:
        if signal not in SIGNALS:
            raise ValueError(f"an eviction signal ({', '.join(SIGNALS)}), got {signal!r}")
    return value


def value_map(value: Any) -> dict[str, Value]:
    """evictionHard, evictionSoft, evictionMinimumReclaim: signal -> "100Mi" or "10%"."""
    out = {}
    for signal, text in _signal_map(value, "quantities or percentages").items():
        try:
            parsed = parse_value(text)
        except ValueError as e:
            raise ValueError(f"{e} for {signal}") from None
        if parsed is not None:
            out[signal] = parsed
    return out


def duration_map(value: Any) -> dict[str, float]:
    """evictionSoftGracePeriod: signal -> a duration ("1m30s")."""
    from pykubelet.durations import duration

    out = {}
    for signal, text in _signal_map(value, "durations").items():
        try:
            out[signal] = duration(text)
        except ValueError as e:
            raise ValueError(f"{e} for {signal}") from None
    return out


def thresholds(hard: Mapping[str, Value], soft: Mapping[str, Value], soft_grace: Mapping[str, float],
               min_reclaim: Mapping[str, Value]) -> list[Threshold]:
    """The node's thresholds; ValueError naming the field if a soft threshold has no grace period or a
    grace period no soft threshold, as the kubelet refuses to start on either."""
    for signal in soft:
        if signal not in soft_grace:
            raise ValueError(f"evictionSoftGracePeriod: no grace period for the soft threshold {signal}")
    for signal in soft_grace:
        if signal not in soft:
            raise ValueError(f"evictionSoftGracePeriod: {signal} has no soft threshold in evictionSoft")
    return ([Threshold(s, v, 0.0, min_reclaim.get(s), True) for s, v in hard.items()]
            + [Threshold(s, v, soft_grace[s], min_reclaim.get(s), False) for s, v in soft.items()])


# --- thresholds met, node conditions -----------------------------------------------------------------

def is_met(threshold: Threshold, observations: Mapping[str, Observation], enforce_min_reclaim: bool) -> bool:
    obs = observations.get(threshold.signal)
    if obs is None:
        return False
    bound = threshold.value.of(obs.capacity)
    if enforce_min_reclaim and threshold.min_reclaim is not None:
        bound += threshold.min_reclaim.of(obs.capacity)
    return obs.available < bound


def thresholds_met(items: Iterable[Threshold], observations: Mapping[str, Observation],
                   enforce_min_reclaim: bool = False) -> list[Threshold]:
    return [t for t in items if is_met(t, observations, enforce_min_reclaim)]


@dataclass
class Decision:
    act_on: list[Threshold]  # met for at least their grace period, memory first: the first is reclaimed
    conditions: list[str]  # the node's pressure conditions, in CONDITIONS order


@dataclass
class PressureState:
    """What one cycle remembers for the next, as the kubelet's manager does: when each threshold was first
    seen met (soft thresholds wait their grace period from then), when each condition was last seen (it
    holds for evictionPressureTransitionPeriod after, so a node near a threshold does not flap), and the
    thresholds acted on (they hold until the signal is past them by evictionMinimumReclaim)."""
    first_observed: dict[Threshold, float] = field(default_factory=dict)
    condition_last_observed: dict[str, float] = field(default_factory=dict)
    last_met: list[Threshold] = field(default_factory=list)

    def step(self, configured: list[Threshold], observations: Mapping[str, Observation], now: float,
             transition_period: float) -> Decision:
        met = thresholds_met(configured, observations)
        met += [t for t in thresholds_met(self.last_met, observations, enforce_min_reclaim=True) if t not in met]
        self.first_observed = {t: self.first_observed.get(t, now) for t in met}
        for t in met:
            self.condition_last_observed[t.condition] = now
        self.condition_last_observed = {c: at for c, at in self.condition_last_observed.items()
                                        if now - at < transition_period or at == now}
        act_on = [t for t in met if now - self.first_observed[t] >= t.grace_period]
        act_on.sort(key=lambda t: t.signal != "memory.available")
        self.last_met = act_on
        return Decision(act_on, [c for c in CONDITIONS if c in self.condition_last_observed])


# --- pods: usage, ranking, who may go ---------------------------------------------------------------

@dataclass
class ContainerUsage:
    memory: int | None = None  # working set bytes
    disk: int | None = None  # writable layer + logs, bytes


@dataclass
class PodUsage:
    memory: int | None = None
    disk: int | None = None  # containers' disk + local ephemeral volumes
    pids: int | None = None
    containers: dict[str, ContainerUsage] = field(default_factory=dict)
    volumes: dict[str, int] = field(default_factory=dict)  # disk-backed emptyDir name -> bytes


def pod_request(pod: Pod, resource: str) -> Decimal:
    """The pod's request of `resource` as the kubelet's eviction ranks by it (GetResourceRequestQuantity): its
    pod-level request where it has pod-level resources, else its containers', and the overhead when that is
    not zero."""
    asked = pod_requests(pod, containers=pod.spec.resources is None, overhead=False).get(resource, Decimal(0))
    return asked + parse_quantity(pod.spec.overhead[resource]) if asked and resource in pod.spec.overhead else asked


def _usage_of(usage: PodUsage | None, resource: str) -> int | None:
    if usage is None:
        return None
    return usage.memory if resource == "memory" else usage.disk


def rank(pods: list[Pod], usage: Mapping[str, PodUsage], resource: str) -> list[Pod]:
    """The pods in the order they go. memory and disk: those using more than they requested first, then
    lower priority, then more usage above the request; pids: lower priority, then more processes. A pod
    with no stats goes first, as the kubelet's orderings put it."""
    if resource == "pids":
        def pid_key(p: Pod) -> tuple:
            n = (usage.get(p.uid) or PodUsage()).pids
            return (p.spec.priority, n is not None, -(n or 0))
        return sorted(pods, key=pid_key)
    request_of = "ephemeral-storage" if resource in ("ephemeral-storage", "inodes") else resource

    def key(p: Pod) -> tuple:
        used = _usage_of(usage.get(p.uid), resource if resource != "inodes" else "ephemeral-storage")
        if used is None:
            return (False, False, p.spec.priority, 0)
        above = Decimal(used) - pod_request(p, request_of)
        return (True, not above > 0, p.spec.priority, -above)
    return sorted(pods, key=key)


# --- messages ---------------------------------------------------------------------------------------

def format_quantity(n: Decimal | int) -> str:
    """An amount of bytes as the kubelet's messages print a BinarySI quantity ("100Mi", "51200Ki", "1536")."""
    return api_quantity.binary_si(n)


def eviction_message(pod: Pod, threshold: Threshold, observation: Observation | None,
                     usage: PodUsage | None) -> str:
    """The kubelet's evictionMessage: the resource, the threshold and what was available, then each
    container using more than it requested."""
    resource = threshold.resource
    message = f"The node was low on resource: {resource}. "
    if observation is not None:
        message += (f"Threshold quantity: {format_quantity(threshold.value.of(observation.capacity))}, "
                    f"available: {format_quantity(max(observation.available, 0))}. ")
    if usage is None or resource not in ("memory", "ephemeral-storage"):
        return message
    for c in pod.spec.containers:
        cu = usage.containers.get(c.name)
        used = None if cu is None else (cu.memory if resource == "memory" else cu.disk)
        if used is None:
            continue
        request = c.resources.requests.get(resource)
        if Decimal(used) > (parse_quantity(request) if request is not None else 0):
            message += (f"Container {c.name} was using {format_quantity(used)}, request is "
                        f"{request if request is not None else '0'}, has larger consumption of {resource}. ")
    return message


def local_storage_violation(pod: Pod, usage: PodUsage) -> str | None:
    """Why the pod goes for its own local storage, whatever the node's: an emptyDir past its sizeLimit, the
    pod past the sum of its containers' ephemeral-storage limits, or a container past its own (the
    kubelet's localStorageEviction, in its order); None if it is within all of them."""
    for volume in pod.spec.volumes:
        limit = volume.source.size_limit if isinstance(volume.source, EmptyDirSource) else None
        if limit is None or parse_quantity(limit) <= 0:
            continue
        used = usage.volumes.get(volume.name)
        if used is not None and used > parse_quantity(limit):
            return f"Usage of EmptyDir volume {json.dumps(volume.name)} exceeds the limit {json.dumps(str(limit))}. "
    containers = pod.spec.containers
    limits = [c.resources.limits.get("ephemeral-storage") for c in containers]
    if usage.disk is not None and any(v is not None for v in limits):
        total = sum((parse_quantity(v) for v in limits if v is not None), Decimal(0))
        if usage.disk > total:
            return (f"Pod ephemeral local storage usage exceeds the total limit of containers "
                    f"{format_quantity(total)}. ")
    for c, limit in zip(containers, limits, strict=True):
        cu = usage.containers.get(c.name)
        if limit is not None and cu is not None and cu.disk is not None and cu.disk > parse_quantity(limit):
            return f"Container {c.name} exceeded its local ephemeral storage limit {json.dumps(str(limit))}. "
    return None


def grace_period(threshold: Threshold | None, pod: Pod, max_pod_grace_period: int) -> int:
    """0 for a hard threshold (and for a local-storage limit: `threshold` None); for a soft one,
    evictionMaxPodGracePeriod, or the pod's own grace if shorter."""
    if threshold is None or threshold.hard:
        return 0
    return min(max_pod_grace_period, pod.spec.termination_grace_period_seconds)


def _tolerates_memory_pressure(pod: Pod) -> bool:
    for t in pod.spec.tolerations:
        key, op = t.get("key", ""), t.get("operator", "Equal")
        if t.get("effect", "") not in ("", "NoSchedule"):
            continue
        if (key == MEMORY_PRESSURE_TAINT and (op == "Exists" or t.get("value", "") == "")) \
                or (key == "" and op == "Exists"):
            return True
    return False


def admit(pod: Pod, conditions: list[str]) -> str | None:
    """The kubelet's eviction admit handler: None to admit, else the rejection's message. Under memory
    pressure alone only BestEffort pods (unless they tolerate it) are turned away; under any other
    pressure every pod; a critical pod never."""
    from pykubelet.pods.podspec import qos_class

    if not conditions or is_critical(pod):
        return None
    if conditions == [MEMORY] and (qos_class(pod) != "BestEffort" or _tolerates_memory_pressure(pod)):
        return None
    return f"The node had condition: [{' '.join(conditions)}]. "


def evicted_status(last: dict, message: str, now: str, reason: str = REASON, disruption: bool = True) -> dict:
    """The status of an evicted pod, once its containers are killed, as the kubelet's: phase Failed, reason
    Evicted, a DisruptionTarget condition, not ready, and every container terminated (`last`: the status
    last sent, for the containers' ids and start times). A pod the shutdown manager killed has it too, with
    its own `reason` (pykubelet/node/shutdown.py); one past its activeDeadlineSeconds too, without the
    DisruptionTarget condition (`disruption` False): the pod's own spec ended it, not the node."""
    def terminated(s: dict) -> dict:
        running = (s.get("state") or {}).get("running")
        if running is not None:
            state = {"exitCode": 137, "reason": "Error", "startedAt": running.get("startedAt"), "finishedAt": now}
        elif "terminated" in (s.get("state") or {}):
            return s
        else:
            state = {"exitCode": 137, "reason": "ContainerStatusUnknown",
                     "message": "The container could not be located when the pod was terminated"}
        if s.get("containerID"):
            state["containerID"] = s["containerID"]
        return {**s, "ready": False, "started": False,
                "state": {"terminated": {k: v for k, v in state.items() if v is not None}}}

    conditions = [dict(c) for c in last.get("conditions") or [] if c["type"] != "DisruptionTarget"]
    for c in conditions:
        if c["type"] in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
            c.update(status="False", **({} if c["type"] == "PodReadyToStartContainers" else {"reason": "PodFailed"}))
            c.pop("message", None)  # what was not ready before says nothing of a failed pod
    if disruption:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                           "message": message})
    status = {**last, "phase": "Failed", "reason": reason, "message": message, "conditions": conditions}
    for kind in ("containerStatuses", "initContainerStatuses"):
        if kind in last:
            status[kind] = [terminated(s) for s in last[kind]]
    return status
