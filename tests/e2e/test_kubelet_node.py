"""pykubelet as a node of a stock control plane: it registers as `system:node:NAME` through NodeRestriction,
turns Ready with the machine's capacity, its addresses and the runtime's version, heartbeats through its
Lease, reports a dead runtime as NotReady naming it (and Ready again when it is back), and stops cleanly
on SIGTERM. The CRI runtime is containerd 1.6 with CRI on (tests/kit/containerd_cri.py)."""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kit.containerd_cri import containerd_cri
from tests.kit.controlplane import ControlPlane

NODE = "pynode-e2e-1"
NODE_IP = "10.201.0.20"  # nothing connects to it yet (see test-cluster.md for the namespaced hosts)
MAX_PODS = 37
PYKUBELET = Path(sys.executable).parent / "pykubelet"
# fast cadences so the test sees changes in seconds; the defaults (10 s, 5 min, 40 s) are unit-tested
KUBELET_CONFIG = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                  "nodeStatusUpdateFrequency": "1s", "nodeLeaseDurationSeconds": 8,
                  "authentication": {"anonymous": {"enabled": False}}}


def wait_for(what: str, check, timeout: float = 60, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    yield cp
    cp.stop()


@pytest.fixture(scope="module")
def containerd(tmp_path_factory):
    with containerd_cri(tmp_path_factory.mktemp("containerd-cri")) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def kubelet(control_plane, containerd, tmp_path_factory):
    work = tmp_path_factory.mktemp("pykubelet")
    config = work / "kubelet.yaml"
    config.write_text(json.dumps(KUBELET_CONFIG))
    with open(work / "pykubelet.log", "wb") as log:
        proc = subprocess.Popen([str(PYKUBELET), "--kubeconfig", str(control_plane.node_kubeconfig(NODE)),
                                 "--config", str(config), "--container-runtime-endpoint", containerd.url,
                                 "--hostname-override", NODE, "--node-ip", NODE_IP, "--root-dir", str(work / "root"),
                                 "--max-pods", str(MAX_PODS), "-v", "1"], stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = work / "pykubelet.log"  # type: ignore[attr-defined]  # for failure messages
    # past start-up before any test's leak snapshot: a process's state is part of what it records
    wait_for("the node to register", lambda: proc.poll() is not None or node(control_plane))
    assert proc.poll() is None, proc.log_path.read_text()[-3000:]  # type: ignore[attr-defined]  # set above
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def node(cp) -> dict:
    out = cp.kubectl("get", "node", NODE, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def condition(n: dict, kind: str) -> dict:
    return next((c for c in n.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def test_node_registers_and_turns_ready(control_plane, kubelet):
    n = wait_for("node Ready", lambda: (lambda n: n if condition(n, "Ready").get("status") == "True" else None)(
        node(control_plane)))
    status = n["status"]
    assert status["capacity"]["pods"] == str(MAX_PODS)
    assert status["capacity"]["cpu"] == str(len(os.sched_getaffinity(0)))
    mem_kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal:")))
    assert status["capacity"]["memory"] == f"{mem_kib}Ki"
    assert "ephemeral-storage" in status["capacity"] and status["allocatable"]["pods"] == str(MAX_PODS)
    assert {"type": "InternalIP", "address": NODE_IP} in status["addresses"]
    assert {"type": "Hostname", "address": NODE} in status["addresses"]
    info = status["nodeInfo"]
    version = subprocess.run(["/usr/bin/containerd", "--version"], capture_output=True, text=True).stdout.split()[2]
    assert info["containerRuntimeVersion"] == f"containerd://{version.removeprefix('v')}"
    assert info["kernelVersion"] == platform.release() and info["operatingSystem"] == "linux"
    assert info["kubeletVersion"].startswith("v1.37")
    labels = n["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == NODE and labels["kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/arch"] == info["architecture"]
    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure"):
        assert condition(n, kind)["status"] == "False", condition(n, kind)
    wide = control_plane.kubectl("get", "node", NODE, "-o", "wide").stdout
    assert "Ready" in wide and NODE_IP in wide


def test_lease_renews(control_plane, kubelet):
    def renew_time():
        out = control_plane.kubectl("get", "lease", "-n", "kube-node-lease", NODE, "-o", "json", check=False)
        return json.loads(out.stdout)["spec"] if out.returncode == 0 else None

    first = wait_for("the lease", renew_time)
    assert first["holderIdentity"] == NODE and first["leaseDurationSeconds"] == 8
    second = wait_for("a renewal", lambda: (lambda s: s if s and s["renewTime"] != first["renewTime"] else None)(
        renew_time()), timeout=15)
    assert second["renewTime"] > first["renewTime"]


def test_dead_runtime_turns_node_not_ready_naming_it(control_plane, containerd, kubelet):
    containerd.kill()
    try:
        ready = wait_for("Ready False", lambda: (lambda c: c if c.get("status") == "False" else None)(
            condition(node(control_plane), "Ready")), timeout=30)
        assert ready["reason"] == "KubeletNotReady"
        assert "container runtime is down" in ready["message"] and containerd.url in ready["message"]
    finally:
        containerd.start()
    try:
        wait_for("Ready again", lambda: condition(node(control_plane), "Ready").get("status") == "True", timeout=30)
    finally:
        containerd.stop()  # the restarted containerd is this test's: the leak check wants it gone


def test_sigterm_stops_cleanly(kubelet):
    assert kubelet.poll() is None, kubelet.log_path.read_text()[-3000:]
    kubelet.send_signal(signal.SIGTERM)
    assert kubelet.wait(timeout=15) == 0
    assert "stopped" in kubelet.log_path.read_text()
