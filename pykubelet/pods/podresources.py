"""The requests and limits of a whole pod, as component-helpers' resource package computes them (PodRequests,
PodLimits) for the scheduler, the kubelet's admission, its pod cgroups, its eviction ranking and the pod's
status, so that each of those counts a pod as the others do: the regular containers and the sidecars summed,
or a one-at-a-time init container with the sidecars started before it if that is more; the pod-level
resources (spec.resources) over the containers' for the resources they may name; the overhead added.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from pykubelet.api.podmodel import Container, Pod
from pykubelet.pods.podspec import parse_quantity

POD_LEVEL = ("cpu", "memory")  # the pod-level resources this node takes (the API's also has hugepages)


def _of(resources: Mapping[str, str], names: Iterable[str] | None = None) -> dict[str, Decimal]:
    """The amounts of `resources` (of `names` only, if given)."""
    return {name: parse_quantity(v) for name, v in resources.items() if names is None or name in names}


def _add(into: dict[str, Decimal], more: Mapping[str, Decimal]) -> None:
    for name, v in more.items():
        into[name] = into.get(name, Decimal(0)) + v


def _aggregate(containers: tuple[Container, ...], init: tuple[Container, ...], limits: bool) -> dict[str, Decimal]:
    """component-helpers' aggregateContainerResourcesByFn: the regular containers and sidecars summed, or an
    init container's with the sidecars started before it if more."""
    def of(c: Container) -> dict[str, Decimal]:
        return _of(c.resources.limits if limits else c.resources.requests)

    total: dict[str, Decimal] = {}
    for c in containers:
        _add(total, of(c))
    sidecars: dict[str, Decimal] = {}
    peak: dict[str, Decimal] = {}
    for c in init:
        if c.is_sidecar:
            _add(total, of(c))
            _add(sidecars, of(c))
            running = dict(sidecars)
        else:
            running = dict(of(c))
            _add(running, sidecars)
        for name, v in running.items():
            peak[name] = max(peak.get(name, Decimal(0)), v)
    for name, v in peak.items():
        total[name] = max(total.get(name, Decimal(0)), v)
    return total


def pod_requests(pod: Pod, *, containers: bool = True, overhead: bool = True) -> dict[str, Decimal]:
    """PodRequests (cpu in cores, the rest in bytes or units): the containers' (unless `containers` is False:
    SkipContainerLevelResources), the pod-level ones over them, and the overhead added (unless `overhead` is
    False: ExcludeOverhead)."""
    spec = pod.spec
    reqs = container_requests(pod) if containers else {}
    if spec.resources is not None:
        reqs.update(_of(spec.resources.requests, POD_LEVEL))
    if overhead:
        _add(reqs, _of(spec.overhead))
    return reqs


def container_requests(pod: Pod) -> dict[str, Decimal]:
    """AggregateContainerRequests: the containers' alone, without the pod-level requests or the overhead."""
    return _aggregate(pod.spec.containers, pod.spec.init_containers, limits=False)


def pod_limits(pod: Pod) -> dict[str, Decimal]:
    """PodLimits: the containers', the pod-level ones over them, the overhead added to a limit that is set."""
    spec = pod.spec
    limits = _aggregate(spec.containers, spec.init_containers, limits=True)
    if spec.resources is not None:
        limits.update(_of(spec.resources.limits, POD_LEVEL))
    for name, v in _of(spec.overhead).items():
        if limits.get(name):
            limits[name] += v
    return limits
