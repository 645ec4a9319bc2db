"""Pod admission: the node's last word on whether it can run a pod, before anything of the pod is made.

The scheduler checks the same things, but it works from a picture of the node that may be stale, is
bypassed by a pod created with spec.nodeName set (or a static pod), and knows nothing of what runs here
outside the API server. So the kubelet checks again, as the stock kubelet's admit handlers do (its
GeneralPredicates: pod count against max-pods, cpu and memory requests against allocatable minus what the
admitted pods request, the node selector and required node affinity against the node's labels, host ports
already taken; plus the OS field, an unknown runtime class, and the pod's sysctls against the safe set and
allowedUnsafeSysctls, pykubelet/pods/sysctls.py), and a pod that fails is rejected: phase Failed with the
kubelet's reason (OutOfpods, OutOfcpu, OutOfmemory, NodeAffinity, NodePorts, SysctlForbidden, ...) and
message, and a Warning event, and nothing of it is ever started.

A decision is final and stable across kubelet restarts: a pod that already has a sandbox on the node was
admitted by an earlier run and is admitted again without a check (a running pod is never rejected later),
and those pods count against the node before any new one is weighed, whatever order the pods arrive in. A
rejected pod's Failed phase is in its status, so a restarted kubelet does not weigh it again.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pykubelet.api import quantity
from pykubelet.api.podmodel import Pod
from pykubelet.node import features
from pykubelet.pods.podresources import pod_requests
from pykubelet.pods.podspec import parse_quantity, qos_class
from pykubelet.pods.sysctls import FORBIDDEN_REASON, Allowlist

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
AFFINITY_DESC = "node(s) didn't match Pod's node affinity/selector"
PORTS_DESC = "node(s) didn't have free ports for the requested pod ports"


@dataclass(frozen=True)
class Verdict:
    admit: bool
    reason: str = ""
    message: str = ""


ADMIT = Verdict(True)


def _insufficient(resource: str, requested: int, used: int, capacity: int) -> Verdict:
    return Verdict(False, f"OutOf{resource}", f"Node didn't have enough resource: {resource}, requested: "
                   f"{requested}, used: {used}, capacity: {capacity}")


def units(resource: str, value: Decimal) -> int:
    """The scheduler's integers: millicores for cpu, bytes for memory (MilliValue, Value: rounded up)."""
    return quantity.milli_value(value) if resource == "cpu" else quantity.value(value)


def fits(pod: Pod, others: list[Pod], allocatable: dict[str, str]) -> Verdict:
    """Pod count and cpu/memory requests against allocatable minus the `others` (the admitted pods)."""
    pods_cap = int(allocatable.get("pods", "110"))
    if len(others) + 1 > pods_cap:
        return _insufficient("pods", 1, len(others), pods_cap)
    want = pod_requests(pod)
    for resource in ("cpu", "memory"):
        if not want.get(resource) or resource not in allocatable:
            continue
        capacity = units(resource, parse_quantity(allocatable[resource]))
        used = sum(units(resource, pod_requests(o).get(resource, Decimal(0))) for o in others)
        requested = units(resource, want[resource])
        if requested > capacity - used:
            return _insufficient(resource, requested, used, capacity)
    return ADMIT


def _expression_matches(expr: dict, value: str | None) -> bool:
    op, values = expr.get("operator"), expr.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term_matches(term: dict, labels: dict[str, str], node_name: str) -> bool:
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no node
    return (all(_expression_matches(e, labels.get(e.get("key", ""))) for e in exprs)
            and all(e.get("key") == "metadata.name" and _expression_matches(e, node_name) for e in fields))


def node_affinity_matches(pod: Pod, labels: dict[str, str], node_name: str) -> bool:
    """spec.nodeSelector (every label equal) and the required node affinity (any term matches)."""
    spec = pod.spec
    if any(labels.get(k) != v for k, v in spec.node_selector.items()):
        return False
    required = (spec.affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return any(_term_matches(t, labels, node_name) for t in required.get("nodeSelectorTerms") or [])


def host_ports(pod: Pod) -> list[tuple[str, str, int]]:
    """(protocol, host IP, port) of every container port with a hostPort."""
    return [(p.protocol, p.host_ip or "0.0.0.0", p.host_port)
            for c in pod.spec.all_containers for p in c.ports if p.host_port]


def ports_conflict(pod: Pod, others: list[Pod]) -> bool:
    taken = [hp for o in others for hp in host_ports(o)]
    for proto, ip, port in host_ports(pod):
        for t_proto, t_ip, t_port in taken:
            if proto == t_proto and port == t_port and (ip == t_ip or "0.0.0.0" in (ip, t_ip)):
                return True
    return False


def check(pod: Pod, others: list[Pod], *, allocatable: dict[str, str], labels: dict[str, str], node_name: str,
          runtime_class_known: Callable[[str], bool] = lambda _name: False,
          sysctls: Allowlist | None = None, declared: tuple[str, ...] = ()) -> Verdict:
    """The kubelet's admission of `pod` next to the admitted `others`, first failure only (as the kubelet
    reports one reason), its handlers in the kubelet's order (declared features, then sysctls, before the
    predicates). `sysctls`: the node's allowlist (the safe set by default); `declared`: the features the
    node declares (pykubelet/node/features.py)."""
    lacking = features.missing(pod, declared)
    if lacking is not None:
        return Verdict(False, features.FEATURE_UNSUPPORTED, lacking)
    forbidden = (sysctls or Allowlist.for_node([])).admit(pod)
    if forbidden is not None:
        return Verdict(False, FORBIDDEN_REASON, forbidden)
    if pod.spec.os_name not in (None, "linux"):
        return Verdict(False, "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
    verdict = fits(pod, others, allocatable)
    if not verdict.admit:
        return verdict
    if not node_affinity_matches(pod, labels, node_name):
        return Verdict(False, "NodeAffinity", f"Predicate NodeAffinity failed: {AFFINITY_DESC}")
    if pod.spec.node_name not in ("", node_name):
        return Verdict(False, "NodeName", "Predicate NodeName failed: node(s) didn't match the requested node name")
    if ports_conflict(pod, others):
        return Verdict(False, "NodePorts", f"Predicate NodePorts failed: {PORTS_DESC}")
    rc = pod.spec.runtime_class_name
    if rc and not runtime_class_known(rc):
        return Verdict(False, "UnknownRuntimeClass", f"RuntimeClass \"{rc}\" not found")
    return ADMIT


class Admission:
    """Admission with memory: which pods were admitted (they count against the node), which rejected.

    `pods()`: the desired pods; `on_node()`: the UIDs that have a sandbox on the node;
    `allocatable()` and `labels()`: the node's; `runtime_class_known(name)`: whether a RuntimeClass exists;
    `sysctls`: the sysctls pods may set (the safe set by default); `declared`: the node's declared features.
    One decision at a time, so two new pods never both take the same room."""

    def __init__(self, node_name: str, *, pods: Callable[[], list[Pod]], on_node: Callable[[], set[str]],
                 allocatable: Callable[[], dict[str, str]], labels: Callable[[], dict[str, str]],
                 runtime_class_known: Callable[[str], bool] = lambda _name: False,
                 sysctls: Allowlist | None = None, declared: tuple[str, ...] = ()) -> None:
        self.node_name, self.declared = node_name, declared
        self._pods, self._on_node, self._allocatable, self._labels = pods, on_node, allocatable, labels
        self._runtime_class_known = runtime_class_known
        # the eviction manager's admit handler (pykubelet/eviction): a rejection message under node pressure
        self.pressure: Callable[[Pod], str | None] = lambda _pod: None
        # the shutdown manager's (pykubelet/node/shutdown.py), the kubelet's last: a rejection while it shuts down
        self.shutdown: Callable[[Pod], Verdict | None] = lambda _pod: None
        self._sysctls = sysctls or Allowlist.for_node([])
        self._admitted: set[str] = set()
        self._rejected: dict[str, Verdict] = {}
        self._lock = threading.Lock()

    def admit(self, pod: Pod, has_runtime_state: bool) -> Verdict:
        uid = pod.uid
        with self._lock:
            if uid in self._admitted:
                return ADMIT
            if uid in self._rejected:
                return self._rejected[uid]
            if has_runtime_state:  # admitted by an earlier run of the kubelet
                self._admitted.add(uid)
                return ADMIT
            others = self._others(uid)
            verdict = check(pod, others, allocatable=self._allocatable(), labels=self._labels(),
                            node_name=self.node_name, runtime_class_known=self._runtime_class_known,
                            sysctls=self._sysctls, declared=self.declared)
            pressure = self.pressure(pod)
            if pressure is not None:  # the kubelet's first admit handler: its verdict stands before the others'
                verdict = Verdict(False, "Evicted", pressure)
            if verdict.admit:
                verdict = self.shutdown(pod) or verdict
            if verdict.admit:
                self._admitted.add(uid)
            else:
                self._rejected[uid] = verdict
                log.warning("pod %s rejected: %s: %s", pod.key, verdict.reason, verdict.message)
            return verdict

    def _others(self, uid: str) -> list[Pod]:
        on_node = self._on_node()
        return [p for p in self._pods() if p.uid != uid and (p.uid in self._admitted or p.uid in on_node)
                and p.status.phase not in TERMINAL]

    def others(self, uid: str) -> list[Pod]:
        """The admitted pods but `uid`, still running: what a resize of `uid` is weighed against."""
        with self._lock:
            return self._others(uid)

    def allocatable(self) -> dict[str, str]:
        return self._allocatable()

    def forget(self, uid: str) -> None:
        with self._lock:
            self._admitted.discard(uid)
            self._rejected.pop(uid, None)


def rejected_status(pod: Pod, verdict: Verdict) -> dict[str, Any]:
    """The status of a rejected pod, as the kubelet's rejectPod sets it."""
    return {"phase": "Failed", "reason": verdict.reason, "message": f"Pod was rejected: {verdict.message}",
            "qosClass": qos_class(pod)}


class Cached:
    """A value read at most every `ttl` seconds (the Node's labels, the machine's allocatable)."""

    def __init__(self, read: Callable[[], Any], ttl: float = 10.0) -> None:
        self.read, self.ttl = read, ttl
        self._value: Any = None
        self._at = -ttl

    def __call__(self) -> Any:
        now = time.monotonic()
        if self._value is None or now - self._at >= self.ttl:
            try:
                self._value, self._at = self.read(), now
            except Exception as e:
                if self._value is None:
                    raise
                log.info("keeping the last known value: %s", e)
        return self._value
