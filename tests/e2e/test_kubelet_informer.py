"""pykubelet's informers and API client against the stock kube-apiserver, as `system:node:NAME`: the pod
informer lists and watches only the pods bound to its node (the server applies `spec.nodeName=NAME`, which
the Node authorizer demands), its cache follows creation, update and deletion in order, and the events
feed a work queue as keys."""
from __future__ import annotations

import json
import time

import pytest

from pykubelet.api.client import make_client
from pykubelet.api.informer import node_informer, pod_informer
from pykubelet.api.workqueue import WorkQueue
from tests.kit.controlplane import ControlPlane

NODE = "pynode-informer-1"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    # no controller-manager here: the ServiceAccount admission plugin needs `default` to admit pods
    cp.kubectl("create", "serviceaccount", "default")
    yield cp
    cp.stop()


@pytest.fixture(scope="module")
def client(control_plane):
    c = make_client(control_plane.node_kubeconfig(NODE))
    yield c
    c.close()


def pod(cp: ControlPlane, tmp_path, name: str, node: str) -> None:
    manifest = tmp_path / f"{name}.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/e2e-test-images/busybox:1.29-2"}]}}))
    cp.kubectl("create", "-f", str(manifest))


def labels(inf, key: str) -> dict[str, str]:
    obj = inf.get(key)
    return (obj.metadata.labels or {}) if obj is not None else {}


def eventually(check, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_pod_informer_sees_only_its_nodes_pods(control_plane, client, tmp_path):
    pod(control_plane, tmp_path, "before", NODE)
    pod(control_plane, tmp_path, "elsewhere", "another-node")
    queue = WorkQueue()
    inf = pod_informer(client, NODE)
    inf.enqueue_into(queue)
    inf.start()
    try:
        assert inf.wait_synced(20)
        assert inf.keys() == ["default/before"]
        assert queue.get(timeout=5) == "default/before"
        queue.done("default/before")

        pod(control_plane, tmp_path, "after", NODE)
        eventually(lambda: inf.get("default/after") is not None)
        control_plane.kubectl("label", "pod", "after", "step=1")
        control_plane.kubectl("label", "pod", "after", "step=2", "--overwrite")
        eventually(lambda: (labels(inf, "default/after")).get("step") == "2")
        assert queue.get(timeout=5) == "default/after"  # three events, one key
        queue.done("default/after")
        assert queue.get(timeout=0.2) is None

        control_plane.kubectl("delete", "pod", "before", "--grace-period=0", "--force")
        eventually(lambda: inf.get("default/before") is None)
        assert sorted(inf.keys()) == ["default/after"]
        assert int(inf.resource_version) > 0
    finally:
        inf.stop()
        assert inf.join(10)


def test_node_informer_follows_its_node(control_plane, client):
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node
    client.create(Node(metadata=ObjectMeta(name=NODE)))
    inf = node_informer(client, NODE).start()
    try:
        assert inf.wait_synced(20)
        assert inf.keys() == [NODE]
        control_plane.kubectl("label", "node", NODE, "zone=a")
        eventually(lambda: labels(inf, NODE).get("zone") == "a")
    finally:
        inf.stop()
        assert inf.join(10)
