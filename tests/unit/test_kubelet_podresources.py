"""A pod's requests, counted alike by the admission, the cgroups, the status and eviction's ranking
(pykubelet/pods/podresources.py), with the options each of them takes as upstream's callers do."""
from __future__ import annotations

import re
from decimal import Decimal

import pytest

from pykubelet.api.podmodel import parse_pod
from pykubelet.eviction.policy import pod_request
from pykubelet.pods.podresources import pod_limits, pod_requests
from pykubelet.pods.podspec import parse_quantity


def _pod(pod_level: dict | None = None, overhead: dict | None = None):
    spec: dict = {"containers": [{"name": "c", "image": "i", "resources": {
        "requests": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "1Gi"}, "limits": {"memory": "128Mi"}}}]}
    if pod_level is not None:
        spec["resources"] = pod_level
    if overhead is not None:
        spec["overhead"] = overhead
    return parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec})


def test_pod_level_resources_stand_for_the_containers_cpu_and_memory_only():
    p = _pod({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2"}}, overhead={"cpu": "10m"})
    assert pod_requests(p) == {"cpu": Decimal("1.01"), "memory": 1 << 30, "ephemeral-storage": 1 << 30}
    assert pod_requests(p, containers=False, overhead=False) == {"cpu": 1, "memory": 1 << 30}
    assert pod_limits(p) == {"cpu": Decimal("2.01"), "memory": 128 << 20}  # the overhead on the limits set


def test_eviction_ranks_by_the_pod_level_request_and_adds_a_non_zero_overhead():
    """GetResourceRequestQuantity: the pod-level request skips the containers' (ephemeral-storage has no
    pod-level one, so such a pod asks none), and the overhead counts only where something is asked."""
    plain = _pod(overhead={"memory": "10Mi", "ephemeral-storage": "1Mi"})
    assert pod_request(plain, "memory") == 74 << 20 and pod_request(plain, "ephemeral-storage") == (1 << 30) + (1 << 20)
    plr = _pod({"requests": {"memory": "1Gi"}}, overhead={"memory": "10Mi", "ephemeral-storage": "1Mi"})
    assert pod_request(plr, "memory") == (1 << 30) + (10 << 20)
    assert pod_request(plr, "ephemeral-storage") == 0


def test_a_quantity_is_read_with_spaces_and_exponents():
    assert parse_quantity(" 1.5Gi ") == Decimal("1.5") * (1 << 30) and parse_quantity("1e3") == 1000


@pytest.mark.parametrize("bad", ["abc", "1.5.2Mi", "NaN", ""])
def test_a_quantity_that_is_none_is_named(bad):
    with pytest.raises(ValueError, match=re.escape(f"not a quantity: {bad!r}")):
        parse_quantity(bad)
