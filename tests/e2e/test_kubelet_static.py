"""Static pods, mirror pods, admission and standalone mode, end to end (stock kube-apiserver, containerd 1.6):
a manifest in --pod-manifest-path runs and its mirror pod shows it Running in the API server; a deleted
mirror pod comes back while the pod keeps running; a changed manifest replaces the pod; a removed manifest
removes pod and mirror and leaves nothing on the node. Pods the node cannot run (over allocatable cpu, over
max-pods, a node selector that does not match) are rejected with the kubelet's reason and a Warning event.
Without a kubeconfig, pykubelet runs static pods alone, and with one it runs them before the API server
answers (kubeadm's control plane). `make run` is tested in test_make_run.py.

This module runs its own pykubelet (with a manifest directory and maxPods 2) instead of the shared
`kubelet` fixture: two kubelets on one runtime would each remove the other's pods."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from proto import api_pb2
from pykubelet import runtime as criapi
from tests.kit.controlplane import free_port
from tests.kit.kubelet_node import (
    BUSYBOX,
    HTTPD,
    Kubelet,
    apply,
    delete,
    get_pod,
    on_node,
    pod_spec,
    wait_for,
    wait_pod,
)
from tests.kit.tcpproxy import CuttingProxy

NODE = "pynode-e2e-static"
NODE_IP = "10.201.0.33"
MIRROR = "kubernetes.io/config.mirror"
MAX_PODS = 2


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("manifests")


@pytest.fixture(scope="module")
def static_kubelet(control_plane, cri, manifests, tmp_path_factory):
    k = Kubelet.for_node(tmp_path_factory.mktemp("pykubelet"), NODE, NODE_IP, cri.url,
                         control_plane.node_kubeconfig(NODE), {"maxPods": MAX_PODS},
                         "--pod-manifest-path", str(manifests))
    k.start()
    wait_for("the node to register", lambda: not k.running() or control_plane.kubectl(
        "get", "node", NODE, check=False).returncode == 0)
    assert k.running(), k.log_tail()
    yield k
    for m in manifests.iterdir():
        m.unlink()
    control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)
    k.stop()


def manifest(command: list[str] | None = None, **labels: str) -> str:
    container: dict = {"name": "httpd", "image": HTTPD, "ports": [{"containerPort": 80}]}
    if command:
        container["command"] = command
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "web", "labels": {"app": "web", **labels}},
                       "spec": {"containers": [container], "terminationGracePeriodSeconds": 5}})


def _get(url: str) -> str | None:
    try:
        return requests.get(url, timeout=2).text
    except requests.RequestException:
        return None


def nothing_on_node(runtime: criapi.CRIRuntime, uid: str) -> bool:
    sandboxes, containers = on_node(runtime, uid)
    return not sandboxes and not containers


def running_mirror(control_plane, name: str, not_uid: str = "", hash_: str = "") -> dict:
    return wait_pod(control_plane, name, "mirror pod Running", lambda p: p["status"].get("phase") == "Running"
                    and p["status"].get("podIP") and p["metadata"]["uid"] != not_uid
                    and (not hash_ or p["metadata"]["annotations"].get(MIRROR) == hash_)
                    and p["metadata"].get("deletionTimestamp") is None)


def test_static_pod_and_its_mirror_pod(control_plane, static_kubelet, runtime, manifests, kubepods):
    name = f"web-{NODE}"
    (manifests / "web.json").write_text(manifest())
    try:
        mirror = running_mirror(control_plane, name)
        meta = mirror["metadata"]
        uid = meta["annotations"][MIRROR]
        assert meta["annotations"]["kubernetes.io/config.source"] == "file" and uid != meta["uid"]
        node_uid = json.loads(control_plane.kubectl("get", "node", NODE, "-o", "json").stdout)["metadata"]["uid"]
        assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid,
                                            "controller": True}]
        assert mirror["spec"]["nodeName"] == NODE and mirror["status"]["hostIP"] == NODE_IP
        assert "It works!" in wait_for("an answer", lambda: _get(f"http://{mirror['status']['podIP']}/"), timeout=20)
        sandboxes, containers = on_node(runtime, uid)  # the static pod's own UID, not the mirror's
        assert len(sandboxes) == 1 and len(containers) == 1 and sandboxes[0].metadata.name == name

        # a deleted mirror pod comes back; the static pod is not touched
        control_plane.kubectl("delete", "pod", name, "--wait=false")
        again = running_mirror(control_plane, name, not_uid=meta["uid"])
        assert again["metadata"]["annotations"][MIRROR] == uid
        assert [c.id for c in on_node(runtime, uid)[1]] == [containers[0].id]
        assert containers[0].id in again["status"]["containerStatuses"][0]["containerID"]

        # a changed manifest is a new pod: the old one goes, the new one runs under the same name
        (manifests / "web.json").write_text(manifest(version="2"))
        changed = wait_pod(control_plane, name, "the new mirror pod", lambda p: p["metadata"]["annotations"].get(
            MIRROR) not in (None, uid) and p["status"].get("phase") == "Running")
        new_uid = changed["metadata"]["annotations"][MIRROR]
        assert changed["metadata"]["labels"]["version"] == "2"
        wait_for("the old pod gone from the node", lambda: nothing_on_node(runtime, uid))
        assert len(on_node(runtime, new_uid)[1]) == 1
    finally:
        (manifests / "web.json").unlink(missing_ok=True)
    # a removed manifest: pod and mirror go, and nothing is left
    wait_for("the mirror pod gone", lambda: not get_pod(control_plane, name))
    for u in (uid, locals().get("new_uid", uid)):
        wait_for(f"pod {u} gone from the node", lambda u=u: nothing_on_node(runtime, u))
        assert not list(static_kubelet.pods_dir.glob(f"default_{name}_{u}"))


def test_bad_manifest_is_skipped_and_named(static_kubelet, runtime, manifests, control_plane, kubepods):
    (manifests / "bad.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\n"
                                        "spec: {containers: [{name: c, image: x, command: sh}]}\n")
    try:
        wait_for("the bad manifest logged", lambda: f"{manifests / 'bad.yaml'}: spec.containers[0].command"
                 in static_kubelet.log_tail(20000), timeout=10)
        assert not get_pod(control_plane, f"bad-{NODE}") and static_kubelet.running()
    finally:
        (manifests / "bad.yaml").unlink()


def events_of(control_plane, name: str) -> list[dict]:
    out = control_plane.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return json.loads(out.stdout)["items"]


def rejected(control_plane, name: str, reason: str) -> dict:
    pod = wait_pod(control_plane, name, f"rejected with {reason}", lambda p: p["status"].get("phase") == "Failed")
    assert pod["status"]["reason"] == reason, pod["status"]
    assert pod["status"]["message"].startswith("Pod was rejected: ")
    event = wait_for(f"the {reason} event", lambda: [e for e in events_of(control_plane, name)
                                                     if e["reason"] == reason], timeout=20)[0]
    assert event["type"] == "Warning" and event["source"] == {"component": "kubelet", "host": NODE}
    assert event["message"] == pod["status"]["message"].removeprefix("Pod was rejected: ")
    return pod


def test_admission_rejects_what_the_node_cannot_run(control_plane, static_kubelet, runtime, kubepods, tmp_path):
    sleeper = {"name": "sleep", "image": BUSYBOX, "command": ["sleep", "3600"]}
    names: list[str] = []

    def create(name: str, container: dict, **spec) -> None:
        names.append(name)
        apply(control_plane, tmp_path, pod_spec(NODE, name, container, **spec))
    try:
        create("big", {**sleeper, "resources": {"requests": {"cpu": "1000"}}})
        pod = rejected(control_plane, "big", "OutOfcpu")
        assert "Node didn't have enough resource: cpu, requested: 1000000" in pod["status"]["message"]
        create("elsewhere", sleeper, nodeSelector={"disktype": "ssd"})
        pod = rejected(control_plane, "elsewhere", "NodeAffinity")
        assert nothing_on_node(runtime, pod["metadata"]["uid"])
        for n in ("a", "b"):
            create(n, sleeper)
        for n in ("a", "b"):
            wait_pod(control_plane, n, "Running", lambda p: p["status"].get("phase") == "Running")
        create("c", sleeper)
        pod = rejected(control_plane, "c", "OutOfpods")
        assert pod["status"]["message"].endswith(f"requested: 1, used: {MAX_PODS}, capacity: {MAX_PODS}")
        assert nothing_on_node(runtime, pod["metadata"]["uid"])
        time.sleep(2)  # stays rejected, and the admitted ones keep running
        assert get_pod(control_plane, "c")["status"]["phase"] == "Failed"
        assert all(get_pod(control_plane, n)["status"]["phase"] == "Running" for n in ("a", "b"))
    finally:
        for n in names:
            delete(control_plane, n)


def test_standalone_mode_runs_static_pods_without_api_server(static_kubelet, cri, runtime, kubepods,
                                                              tmp_path_factory):
    static_kubelet.stop()  # one kubelet per runtime (the module's is done with by now)
    node = "pynode-e2e-standalone"
    manifests = tmp_path_factory.mktemp("standalone-manifests")
    k = Kubelet.for_node(tmp_path_factory.mktemp("standalone"), node, "10.201.0.34", cri.url, None, None,
                         "--pod-manifest-path", str(manifests))
    k.start()
    uid = ""
    try:
        (manifests / "web.yaml").write_text(manifest())
        selector = {"io.kubernetes.pod.name": f"web-{node}"}

        def running_sandbox():
            for s in runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector=selector)):
                containers = runtime.list_containers(api_pb2.ContainerFilter(pod_sandbox_id=s.id))
                if any(c.state == api_pb2.CONTAINER_RUNNING for c in containers):
                    return s
            return None
        sandbox = wait_for("the static pod running", running_sandbox, timeout=90)
        uid = sandbox.metadata.uid
        ip = runtime.pod_sandbox_status(sandbox.id).status.network.ip
        assert "It works!" in wait_for("an answer", lambda: _get(f"http://{ip}/"), timeout=20)
        log = k.log_tail(50000)
        assert "standalone mode" in log and "Started container httpd" in log  # events are logged
        assert k.running()
    finally:
        (manifests / "web.yaml").unlink(missing_ok=True)
        if uid:
            wait_for("the standalone pod gone", lambda: nothing_on_node(runtime, uid))
        k.stop()


def test_static_pods_run_before_the_api_server_answers(static_kubelet, control_plane, cri, runtime, kubepods,
                                                       tmp_path_factory):
    """kubeadm's control plane is static pods on the node's own kubelet: they run while the API server does
    not answer yet (it is one of them), and once it does the node registers and the mirror pod shows the same
    pod Running, not a new one."""
    static_kubelet.stop()  # one kubelet per runtime
    node = "pynode-e2e-late-api"
    manifests = tmp_path_factory.mktemp("late-api-manifests")
    (manifests / "web.yaml").write_text(manifest())
    port = free_port()
    kubeconfig = control_plane.node_kubeconfig(node)
    kubeconfig.write_text(kubeconfig.read_text().replace(control_plane.server, f"https://127.0.0.1:{port}"))
    k = Kubelet.for_node(tmp_path_factory.mktemp("late-api"), node, "10.201.0.35", cri.url, kubeconfig, None,
                         "--pod-manifest-path", str(manifests))
    k.start()
    proxy, uid = None, ""
    try:
        selector = {"io.kubernetes.pod.name": f"web-{node}"}
        sandbox = wait_for("the static pod running with no API server", lambda: next(
            (s for s in runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector=selector))
             if any(c.state == api_pb2.CONTAINER_RUNNING
                    for c in runtime.list_containers(api_pb2.ContainerFilter(pod_sandbox_id=s.id)))), None),
            timeout=90)
        uid = sandbox.metadata.uid
        assert k.running(), k.log_tail()
        assert control_plane.kubectl("get", "node", node, check=False).returncode != 0
        proxy = CuttingProxy(control_plane.port, port=port)  # the API server comes up
        mirror = running_mirror(control_plane, f"web-{node}")
        assert mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"]
        assert mirror["status"]["podIP"] == runtime.pod_sandbox_status(sandbox.id).status.network.ip
        assert mirror["status"]["containerStatuses"][0]["restartCount"] == 0
        assert [s.id for s in runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector=selector))] == [
            sandbox.id]
        node_obj = json.loads(control_plane.kubectl("get", "node", node, "-o", "json").stdout)
        assert {c["type"]: c["status"] for c in node_obj["status"]["conditions"]}["Ready"] == "True"
    finally:
        (manifests / "web.yaml").unlink(missing_ok=True)
        if uid:
            wait_for("the static pod gone", lambda: nothing_on_node(runtime, uid))
        k.stop()
        if proxy is not None:
            proxy.stop()
        control_plane.kubectl("delete", "node", node, "--ignore-not-found", check=False)
