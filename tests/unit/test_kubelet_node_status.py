"""pykubelet's node status logic with a fake runtime and client: Ready follows the CRI Status conditions and
names the runtime when it is down, lastTransitionTime holds until a condition flips, and the status is sent
only when it changed or the report period is over."""
from __future__ import annotations

from types import SimpleNamespace

import grpc

from pykubelet import runtime as cri
from pykubelet.config import Settings
from pykubelet.node import status as node_status
from tests.kit.fake_cri import FakeCRI


def down(runtime: FakeCRI) -> None:
    runtime.errors["Status"] = cri.Unavailable("Status", grpc.StatusCode.UNAVAILABLE, "connection refused")


class FakeClient:
    def __init__(self) -> None:
        self.patches: list = []

    def patch(self, res, name, body, patch_type=None):
        self.patches.append((name, body))


def reporter(tmp_path, clock):
    settings = Settings(node_name="node-a", node_ip="10.201.0.20", root_dir=tmp_path, max_pods=42)
    client, runtime = FakeClient(), FakeCRI()
    runtime.runtime_name, runtime.runtime_version = "containerd", "1.6.20"
    return node_status.NodeStatus(client, runtime, settings, clock=clock), client, runtime


def ready(status: dict) -> dict:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_status_content(tmp_path):
    ns, _, _ = reporter(tmp_path, lambda: 0.0)
    s = ns.build()
    assert s["capacity"]["pods"] == "42" and s["allocatable"]["pods"] == "42"
    assert s["addresses"] == [{"type": "InternalIP", "address": "10.201.0.20"},
                              {"type": "Hostname", "address": "node-a"}]
    assert s["nodeInfo"]["containerRuntimeVersion"] == "containerd://1.6.20"
    assert ready(s)["status"] == "True" and ready(s)["reason"] == "KubeletReady"
    assert {c["type"] for c in s["conditions"]} == {"Ready", "MemoryPressure", "DiskPressure", "PIDPressure"}
    assert s["declaredFeatures"] == ["InPlacePodLevelResourcesVerticalScaling",  # pykubelet/node/features.py
                                     "InPlacePodVerticalScalingInitContainers",
                                     "RestartAllContainersOnContainerExits"]


def test_allocatable_is_capacity_less_eviction_thresholds():
    a = node_status.allocatable({"cpu": "2", "memory": "1048576Ki", "ephemeral-storage": "1000Ki", "pods": "9"})
    # written as the API's canonical BinarySI quantities: 946176Ki is 924Mi, 921600 900Ki
    assert a == {"cpu": "2", "memory": "924Mi", "ephemeral-storage": "900Ki", "pods": "9"}


def test_not_ready_names_what_failed(tmp_path):
    ns, _, runtime = reporter(tmp_path, lambda: 0.0)
    runtime.set_condition("NetworkReady", False, "NetworkPluginNotReady", "cni config uninitialized")
    r = ready(ns.build())
    assert r["status"] == "False" and r["reason"] == "KubeletNotReady"
    assert "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady" in r["message"]
    down(runtime)
    r = ready(ns.build())
    assert r["message"].startswith("container runtime is down: unix:///run/containerd/containerd.sock: CRI Status")


def test_transition_time_holds_until_the_status_flips(tmp_path, monkeypatch):
    times = iter(["T1", "T2", "T3", "T4"])
    monkeypatch.setattr(node_status, "now_rfc3339", lambda: next(times))
    ns, _, runtime = reporter(tmp_path, lambda: 0.0)
    assert ready(ns.build())["lastTransitionTime"] == "T1"
    assert ready(ns.build())["lastTransitionTime"] == "T1"
    down(runtime)
    assert ready(ns.build())["lastTransitionTime"] == "T3"
    assert ready(ns.build())["lastHeartbeatTime"] == "T4"


def test_sent_on_change_or_when_the_report_period_is_over(tmp_path):
    clock = SimpleNamespace(now=1000.0)
    ns, client, runtime = reporter(tmp_path, lambda: clock.now)
    assert ns.update() is True
    clock.now += 10
    assert ns.update() is False and len(client.patches) == 1
    down(runtime)
    assert ns.update() is True
    clock.now += 299
    assert ns.update() is False
    clock.now += 1
    assert ns.update() is True
    assert ns.update(force=True) is True
    assert [name for name, _ in client.patches] == ["node-a"] * 4


def test_condition_flips_are_node_events(tmp_path):
    """Each condition's first status and every flip is an event on the Node, as the kubelet's recordEventFunc."""
    recorded: list = []
    ns, _, runtime = reporter(tmp_path, lambda: 0.0)
    ns.events = SimpleNamespace(event=lambda *args: recorded.append(args))
    ns.build()
    assert len(recorded) == 4  # the three pressure conditions (whatever this machine's), then Ready
    assert recorded[-1] == ({"kind": "Node", "name": "node-a", "uid": "node-a"}, "Normal", "NodeReady",
                            "Node node-a status is now: NodeReady")
    recorded.clear()
    ns.build()
    assert recorded == []
    down(runtime)
    ns.build()
    assert [r for _, _, r, _ in recorded] == ["NodeNotReady"]


def test_allocatable_is_capacity_less_reservations_and_eviction_thresholds(tmp_path):
    """systemReserved and kubeReserved summed come off capacity, as in the stock kubelet's node allocatable."""
    capacity = {"cpu": "2", "memory": "1048576Ki", "ephemeral-storage": "1000Ki", "pods": "9"}
    a = node_status.allocatable(capacity, reserved={"cpu": 300, "memory": 100 << 20, "ephemeral-storage": 1 << 10})
    assert a == {"cpu": "1700m", "memory": "824Mi", "ephemeral-storage": "899Ki", "pods": "9"}
    settings = Settings(node_name="node-a", root_dir=tmp_path, system_reserved={"cpu": 500, "memory": 1 << 20},
                        kube_reserved={"cpu": 500, "pid": 100})
    assert node_status.reserved_for(settings) == {"cpu": 1000, "memory": 1 << 20, "pid": 100}
    ns, _, _ = reporter(tmp_path, lambda: 0.0)
    ns.settings = settings
    status = ns.build()
    assert int(status["allocatable"]["cpu"]) == int(status["capacity"]["cpu"]) - 1


def test_registration_carries_node_labels_and_taints(tmp_path):
    """--node-labels and --register-with-taints go on the Node this kubelet creates; an existing Node gets the
    labels back, its taints are left as they are (the stock kubelet's)."""
    import threading

    from lightkube.core.exceptions import ApiError
    from lightkube.models.meta_v1 import Status

    from pykubelet.node.registration import register

    class Client(FakeClient):
        def __init__(self, exists: bool) -> None:
            super().__init__()
            self.exists, self.created = exists, list[dict]()

        def create(self, node):
            if self.exists:
                raise ApiError(status=Status(code=409, message="exists"))
            self.created.append(node.to_dict())

    settings = Settings(node_name="node-a", root_dir=tmp_path, node_labels={"example.com/rack": "r1"},
                        register_with_taints=[{"key": "example.com/gpu", "value": "", "effect": "NoSchedule"}])
    ns, _, _ = reporter(tmp_path, lambda: 0.0)
    for exists in (False, True):
        client = Client(exists)
        ns.client, ns.settings = client, settings
        assert register(client, settings, ns, threading.Event())
        if exists:
            name, body = client.patches[0]
            assert name == "node-a" and body["metadata"]["labels"]["example.com/rack"] == "r1"
        else:
            (node,) = client.created
            assert node["metadata"]["labels"]["example.com/rack"] == "r1"
            assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "node-a"
            assert node["spec"]["taints"] == [{"key": "example.com/gpu", "value": "", "effect": "NoSchedule"}]
