"""Node-pressure eviction on a real node: the kubelet's root directory is a 64 MiB tmpfs this module
mounts, with evictionHard nodefs.available<24Mi. A BestEffort pod fills it past the threshold through an
emptyDir (real writes, to a filesystem the test made, never the host's disk); the node reports DiskPressure,
the BestEffort pod (using more than it requested) is evicted with the kubelet's message while a Burstable
pod within its ephemeral-storage request keeps running, and once the space is back DiskPressure clears
after evictionPressureTransitionPeriod."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.kit.kubelet_node import BUSYBOX, Kubelet, apply, delete, get_pod, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-eviction-pressure"
NODE_IP = "10.201.0.42"
STOPPABLE = "trap 'exit 0' TERM; "
KUBELET_CONFIG = {"evictionHard": {"nodefs.available": "24Mi"}, "evictionPressureTransitionPeriod": "10s"}


@pytest.fixture(scope="module")
def kubelet(control_plane, cri, tmp_path_factory):
    """The module's kubelet, its --root-dir on a tmpfs of 64 MiB."""
    work = tmp_path_factory.mktemp("pykubelet")
    root = work / "root"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0750", "tmpfs", str(root)], check=True)
    try:
        k = Kubelet.for_node(work, NODE, NODE_IP, cri.url, control_plane.node_kubeconfig(NODE), KUBELET_CONFIG)
        k.start()
        try:
            wait_for("the node to register", lambda: not k.running() or control_plane.kubectl(
                "get", "node", NODE, check=False).returncode == 0)
            assert k.running(), k.log_tail()
            yield k
            control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)
        finally:
            k.stop()
    finally:
        subprocess.run(["umount", str(root)], check=True)


def container(command: str, **extra) -> dict:
    return {"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", STOPPABLE + command],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}], **extra}


def disk_pressure(cp) -> str:
    node = json.loads(cp.kubectl("get", "node", NODE, "-o", "json").stdout)
    return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "DiskPressure")


def running(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") == "Running"


def test_disk_pressure_evicts_the_best_effort_filler_first(control_plane, kubelet, kubepods, tmp_path):
    assert disk_pressure(control_plane) == "False"
    scratch = [{"name": "scratch", "emptyDir": {}}]
    apply(control_plane, tmp_path, kit_pod_spec(NODE, "asked", container(
        "dd if=/dev/zero of=/scratch/f bs=1M count=4; sleep 3600 & wait",
        resources={"requests": {"ephemeral-storage": "30Mi"}}), volumes=scratch))
    try:
        wait_pod(control_plane, "asked", "Running", running)
        apply(control_plane, tmp_path, kit_pod_spec(NODE, "filler", container(
            "dd if=/dev/zero of=/scratch/f bs=1M count=40; sleep 3600 & wait"), volumes=scratch))
        wait_for("DiskPressure", lambda: disk_pressure(control_plane) == "True", timeout=60)
        pod = wait_pod(control_plane, "filler", "Evicted", lambda p: p["status"].get("reason") == "Evicted", timeout=60)
        message = pod["status"]["message"]
        assert pod["status"]["phase"] == "Failed"
        assert message.startswith("The node was low on resource: ephemeral-storage. Threshold quantity: 24Mi, "
                                  "available: "), message
        assert running(get_pod(control_plane, "asked")), "the pod within its request was evicted"
        wait_for("DiskPressure to clear", lambda: disk_pressure(control_plane) == "False", timeout=60)
        assert running(get_pod(control_plane, "asked"))
    finally:
        delete(control_plane, "filler")
        delete(control_plane, "asked")
