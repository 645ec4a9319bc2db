"""Each container's oom_score_adj (pykubelet/pods/oomscore.py), against the stock kubelet's own cases
(pkg/kubelet/qos/policy_test.go, TestGetContainerOOMScoreAdjust): the same pods and node memory give the same
scores, and the CRI config carries them."""
from __future__ import annotations

from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.config import Settings
from pykubelet.pods.criconfig import container_config, sandbox_config
from pykubelet.pods.oomscore import container_oom_score_adj

STANDARD = 8_000_000_000  # the upstream cases' standardMemoryAmount
REQUEST, LIMIT = str(STANDARD // 8), str(1000 + STANDARD // 8)


def container(name: str, requests: dict | None = None, limits: dict | None = None, **more) -> dict:
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"name": name, "image": "x", "resources": res, **more}


def pod(*containers: dict, init: tuple[dict, ...] = (), **spec) -> Pod:
    return parse_pod({"metadata": {"name": "p", "namespace": "default", "uid": "u"},
                      "spec": {"containers": list(containers), "initContainers": list(init), **spec}})


def scores(p: Pod, capacity: int) -> dict[str, int]:
    return {c.name: container_oom_score_adj(p, c, capacity) for c in p.spec.all_containers}


def test_by_qos_class():
    assert scores(pod(container("c", limits={"cpu": "10"})), 4_000_000_000) == {"c": 999}  # Burstable, no memory
    assert scores(pod(container("c")), 4_000_000_000) == {"c": 1000}  # BestEffort
    assert scores(pod(container("c", limits={"memory": "0"})), 7_230_457_451) == {"c": 1000}
    both = {"cpu": "5m", "memory": "10240"}
    assert scores(pod(container("c", requests=both, limits=both)), 123_456_789) == {"c": -997}  # Guaranteed
    # a request as a limit written another way is the same quantity: still Guaranteed
    assert scores(pod(container("c", requests={"cpu": "1", "memory": "1Gi"},
                                limits={"cpu": "1000m", "memory": "1073741824"})), STANDARD) == {"c": -997}


def test_burstable_by_its_share_of_the_node_memory_within_3_and_999():
    half = {"memory": str(STANDARD // 2)}
    assert scores(pod(container("c", requests=half, limits={"memory": str(STANDARD)})), STANDARD) == {"c": 500}
    assert scores(pod(container("c", requests={"memory": str(STANDARD - 1)})), STANDARD) == {"c": 3}
    assert scores(pod(container("c", requests={"memory": "1"})), STANDARD) == {"c": 999}  # never a BestEffort's
    assert scores(pod(container("burstable-unique-container", requests={"memory": REQUEST},
                                limits={"memory": LIMIT})), STANDARD) == {"burstable-unique-container": 875}


def test_node_critical_pods_go_last_whatever_their_class():
    assert scores(pod(container("c"), priorityClassName="system-node-critical", priority=2_000_001_000),
                  4_000_000_000) == {"c": -997}
    assert scores(pod(container("c"), priorityClassName="system-cluster-critical", priority=2_000_000_000),
                  4_000_000_000) == {"c": 1000}  # critical, not node-critical: by its class


def test_sidecars_go_no_later_than_the_least_asking_regular_container():
    main, init = container("main-1", {"memory": REQUEST}, {"memory": LIMIT}), \
        container("init-container", {"memory": REQUEST}, {"memory": LIMIT})

    def sidecar(name: str, request: int) -> dict:
        return container(name, {"memory": str(request)}, {"memory": LIMIT}, restartPolicy="Always")

    assert scores(pod(main, init=(init, sidecar("sidecar-small-container", STANDARD // 20))), STANDARD) == {
        "init-container": 875, "sidecar-small-container": 875, "main-1": 875}
    assert scores(pod(main, init=(init, sidecar("sidecar-big-container", STANDARD // 2))), STANDARD) == {
        "init-container": 875, "sidecar-big-container": 500, "main-1": 875}


def test_pod_level_requests_share_what_the_containers_leave_among_them():
    capacity = 4_000_000_000
    pod_level = {"requests": {"cpu": "5m", "memory": str(STANDARD // 4)},
                 "limits": {"cpu": "5m", "memory": str(1000 + STANDARD // 4)}}
    assert scores(pod(container("no-request-limit-1"), container("no-request-limit-2"), resources=pod_level),
                  capacity) == {"no-request-limit-1": 750, "no-request-limit-2": 750}
    limit = {"cpu": "5m", "memory": str(1000 + STANDARD // 4)}
    two = {"requests": {"cpu": "5m", "memory": "2000000000"}, "limits": limit}
    assert scores(pod(container("burstable-container-1", {"cpu": "5m", "memory": "1000000000"}, limit),
                      container("burstable-container-2", {"cpu": "5m", "memory": "500000000"}, limit),
                      init=(container("burstable-sidecar", {"cpu": "5m", "memory": "200000000"}, limit,
                                      restartPolicy="Always"),),
                      resources=two), capacity) == {
        "burstable-container-1": 725, "burstable-container-2": 850, "burstable-sidecar": 850}
    guaranteed = {"requests": {"cpu": "5m", "memory": str(STANDARD // 4)},
                  "limits": {"cpu": "5m", "memory": str(STANDARD // 4)}}
    assert scores(pod(container("a", {"memory": REQUEST}, {"memory": LIMIT}), container("b"), resources=guaranteed),
                  capacity) == {"a": -997, "b": -997}  # the pod's class, not its containers'


def test_the_container_config_carries_the_score():
    p = pod(container("c", requests={"memory": str(STANDARD // 2)}))
    config = container_config(p, p.spec.containers[0], "sha256:abc", 0, sandbox_config(p, Settings()),
                              memory_capacity=STANDARD)
    assert config.linux.resources.oom_score_adj == 500
