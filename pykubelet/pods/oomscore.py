"""The oom_score_adj each container is created with, as the stock kubelet's qos.GetContainerOOMScoreAdjust:
the order in which the kernel's OOM killer takes processes when the node runs out of memory before eviction
has acted.

The node's own daemons go last (the kubelet -999, the runtime's sandboxes -998), then node-critical pods
(kubeadm's control plane) and Guaranteed pods (-997), then Burstable containers by the share of the node's
memory they asked for, and BestEffort first (1000). A Burstable score stays within [3, 999], so that it is
always above a Guaranteed pod's and below a BestEffort one's whatever it asked for.

Threat model: a pod chooses its requests, its limits and its priority class within what the API server
admits; it cannot choose to be critical (a static or mirror pod, or system-critical priority). Asking for
more memory lowers a Burstable container's score only as far as 3, and the runtime never gives a container a
score below its own (containerd's restrict_oom_score_adj, and pyruntime-cri's), so no pod makes itself
harder to kill than the node's daemons.
"""
from __future__ import annotations

from pykubelet.api import quantity
from pykubelet.api.podmodel import Container, Pod
from pykubelet.pods.podresources import container_requests
from pykubelet.pods.podspec import is_node_critical, parse_quantity, qos_class

GUARANTEED = -997
BEST_EFFORT = 1000
BURSTABLE_FLOOR = 1000 + GUARANTEED  # a Guaranteed pod using all of the node's memory scores this much


def container_oom_score_adj(pod: Pod, container: Container, memory_capacity: int) -> int:
    """`memory_capacity`: the node's memory in bytes (its status's capacity)."""
    if is_node_critical(pod):
        return GUARANTEED
    qos = qos_class(pod)
    if qos == "Guaranteed":
        return GUARANTEED
    if qos == "BestEffort":
        return BEST_EFFORT
    unclaimed = _unclaimed_pod_memory_per_container(pod)
    score = _by_request(_memory_request(container) + unclaimed, memory_capacity)
    if container.is_sidecar and container in pod.spec.init_containers:
        # a sidecar is killed no later than the regular container that asked for least
        least = min(_memory_request(c) for c in pod.spec.containers) + unclaimed
        score = min(score, _by_request(least, memory_capacity))
    if score < BURSTABLE_FLOOR:
        return BURSTABLE_FLOOR
    return BEST_EFFORT - 1 if score == BEST_EFFORT else score


def _by_request(request: int, memory_capacity: int) -> int:
    return 1000 - 1000 * request // memory_capacity


def _memory_request(container: Container) -> int:
    asked = container.resources.requests.get("memory")
    return quantity.value(parse_quantity(asked)) if asked else 0


def _unclaimed_pod_memory_per_container(pod: Pod) -> int:
    """With a pod-level memory request, what it asks beyond its containers' requests, shared among every
    container of the pod (the KEP 2837 formula); 0 without one."""
    pod_level = pod.spec.resources
    asked = parse_quantity(pod_level.requests.get("memory", "0")) if pod_level is not None else 0
    if not asked:
        return 0
    claimed = container_requests(pod).get("memory", 0)
    spare = max(quantity.value(asked) - quantity.value(claimed), 0)
    return spare // (len(pod.spec.containers) + len(pod.spec.init_containers))
