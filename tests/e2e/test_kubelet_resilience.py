"""pykubelet where a node meets trouble: a container over its memory limit is OOM-killed and the pod says so
(OOMKilled, exit code 137); requests and limits reach the kernel, in the container's cgroup under the pod's
cgroup under its QoS class's (kubepods, kubepods/burstable, kubepods/besteffort, as the kubelet names them);
and an API server that is away for a minute changes nothing on the node: running pods keep running with the
same containers and keep answering, the kubelet stays up and goes on restarting what exits, and once the API
server is back the statuses it could not write meanwhile arrive there.

On each CRI runtime of tests/e2e/conftest.py (containerd 1.6 and pyruntime-cri)."""
from __future__ import annotations

import json
import time
from datetime import datetime

import requests

from proto import api_pb2
from tests.kit.cri_server import cgroup_file
from tests.kit.kubelet_node import BUSYBOX, HTTPD, apply, condition, delete, get_pod, on_node, wait_for, wait_pod
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-resilience"
NODE_IP = "10.201.0.34"
OUTAGE = 60  # seconds without an API server
MIB = 1 << 20
CPU_PERIOD = 100_000  # µs, the kubelet's CFS period
SLEEPER = ["sh", "-c", "trap 'exit 2' TERM; echo up; while true; do sleep 0.2; done"]


def pod_spec(name: str, container: dict, **spec) -> dict:
    return kit_pod_spec(NODE, name, container, **spec)


def _get(url: str) -> str | None:
    try:
        return requests.get(url, timeout=2).text
    except requests.RequestException:
        return None


def _running(runtime, uid: str) -> list[api_pb2.Container]:
    return [c for c in on_node(runtime, uid)[1] if c.state == api_pb2.CONTAINER_RUNNING]


def test_requests_and_limits_land_in_the_qos_cgroups(control_plane, kubelet, runtime, kubepods, tmp_path):
    pods = {
        "guaranteed": ({"limits": {"cpu": "100m", "memory": "64Mi"}}, "Guaranteed", "/kubepods",
                       64 * MIB, 10_000, 102),
        "burstable": ({"requests": {"cpu": "50m", "memory": "16Mi"}, "limits": {"cpu": "200m", "memory": "96Mi"}},
                      "Burstable", "/kubepods/burstable", 96 * MIB, 20_000, 51),
        "besteffort": ({}, "BestEffort", "/kubepods/besteffort", None, -1, 2),
    }
    for name, (resources, *_) in pods.items():
        apply(control_plane, tmp_path, pod_spec(name, {"name": "main", "image": BUSYBOX, "command": SLEEPER,
                                                       "resources": resources}))
    try:
        for name, (_, qos, qos_parent, memory, quota, shares) in pods.items():
            pod = wait_pod(control_plane, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running")
            assert pod["status"]["qosClass"] == qos
            (container,) = _running(runtime, pod["metadata"]["uid"])
            parent = f"{qos_parent}/pod{pod['metadata']['uid']}"
            limit = int(cgroup_file(parent, container.id, "memory/memory.limit_in_bytes", "memory.max")
                        .read_text().replace("max", "-1"))
            if memory is None:
                assert limit == -1 or limit >= 1 << 62, f"{name}: memory limit {limit}"
            else:
                assert limit == memory, f"{name}: memory limit {limit}"
            cpu = cgroup_file(parent, container.id, "cpu/cpu.cfs_quota_us", "cpu.max").read_text().split()
            assert int(cpu[0].replace("max", "-1")) == quota, f"{name}: cpu quota {cpu}"
            if len(cpu) == 1:  # v1: the period beside it, and the shares from the request
                period = cgroup_file(parent, container.id, "cpu/cpu.cfs_period_us", "cpu.max").read_text()
                assert quota == -1 or int(period) == CPU_PERIOD
                assert int(cgroup_file(parent, container.id, "cpu/cpu.shares", "cpu.weight").read_text()) == shares
    finally:
        for name in pods:
            delete(control_plane, name)


def test_oom_killed_container_reports_oomkilled(control_plane, kubelet, runtime, kubepods, tmp_path):
    # dd holds a 256 MiB block in memory: far past the 32 MiB limit
    hog = {"name": "hog", "image": BUSYBOX, "command": ["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"],
           "resources": {"limits": {"memory": "32Mi"}}}
    apply(control_plane, tmp_path, pod_spec("hog", hog, restartPolicy="Never"))
    try:
        pod = wait_pod(control_plane, "hog", "terminated", lambda p: p.get("status", {}).get("phase") == "Failed",
                       timeout=60)
        (cs,) = pod["status"]["containerStatuses"]
        terminated = cs["state"]["terminated"]
        assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137), cs
        assert cs["restartCount"] == 0
    finally:
        delete(control_plane, "hog")


def test_api_server_away_for_a_minute(control_plane, kubelet, runtime, kubepods, tmp_path):
    """The last test of the module: the API server it starts again, and the kubelet, are this test's to stop
    (the leak check wants them gone; the kubelet fixture starts the API server again for its clean-up)."""
    apply(control_plane, tmp_path, pod_spec("steady", {"name": "httpd", "image": HTTPD}))
    apply(control_plane, tmp_path, pod_spec("quitter", {"name": "quitter", "image": BUSYBOX, "command": SLEEPER}))
    try:
        steady = wait_pod(control_plane, "steady", "Ready", lambda p: condition(p, "Ready") == "True")
        quitter = wait_pod(control_plane, "quitter", "Ready", lambda p: condition(p, "Ready") == "True")
        ip, steady_uid, quitter_uid = steady["status"]["podIP"], steady["metadata"]["uid"], quitter["metadata"]["uid"]
        steady_before = [c.id for c in _running(runtime, steady_uid)]
        (old,) = _running(runtime, quitter_uid)

        control_plane.stop_apiserver()
        away = time.monotonic()
        try:
            # the quitter exits (code 2) while nobody can be told; the kubelet restarts it on its own
            runtime.exec_sync(old.id, ["kill", "1"], timeout=10)
            (new,) = wait_for("the quitter restarted without an API server", lambda: [
                c for c in _running(runtime, quitter_uid) if c.id != old.id], timeout=30)
            while time.monotonic() - away < OUTAGE:
                assert "It works!" in (_get(f"http://{ip}/") or ""), "the steady pod stopped answering"
                assert kubelet.running(), kubelet.log_tail()
                time.sleep(5)
            assert [c.id for c in _running(runtime, steady_uid)] == steady_before
        finally:
            control_plane.start_apiserver()
        back = time.time()

        cs = wait_pod(control_plane, "quitter", "the restart while away", lambda p: any(
            s["restartCount"] == 1 and "running" in s["state"] for s in p["status"].get("containerStatuses", [])),
            timeout=60)["status"]["containerStatuses"][0]
        assert cs["containerID"].endswith(new.id)
        assert (cs["lastState"]["terminated"]["exitCode"], cs["lastState"]["terminated"]["reason"]) == (2, "Error")
        assert cs["lastState"]["terminated"]["containerID"].endswith(old.id)
        steady = get_pod(control_plane, "steady")
        assert condition(steady, "Ready") == "True" and steady["status"]["containerStatuses"][0]["restartCount"] == 0
        assert [c.id for c in _running(runtime, steady_uid)] == steady_before
        assert "It works!" in (_get(f"http://{ip}/") or "")

        def renewed_since_back():
            out = control_plane.kubectl("get", "lease", "-n", "kube-node-lease", NODE, "-o", "json", check=False)
            spec = json.loads(out.stdout)["spec"] if out.returncode == 0 else {}
            return _unix(spec.get("renewTime", "")) >= int(back)

        wait_for("the node's lease renewed after the outage", renewed_since_back, timeout=30)
        node = json.loads(control_plane.kubectl("get", "node", NODE, "-o", "json").stdout)
        assert condition(node, "Ready") == "True"
        assert kubelet.running(), kubelet.log_tail()
    finally:
        for name in ("steady", "quitter"):
            delete(control_plane, name)
        kubelet.stop()
        control_plane.stop_apiserver()


def _unix(stamp: str) -> float:
    """A MicroTime (2026-01-02T15:04:05.999999Z) as unix seconds; 0 for none."""
    if not stamp:
        return 0
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
