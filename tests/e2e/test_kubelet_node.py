"""pykubelet as a node of a stock control plane: it registers as `system:node:NAME` through NodeRestriction,
turns Ready with the machine's capacity, its addresses and the runtime's version, heartbeats through its
Lease, hands the Node's pod CIDR to the runtime, reports a dead runtime as NotReady naming it (and Ready again
when it is back), and stops cleanly on SIGTERM. On each CRI runtime of tests/e2e/conftest.py (containerd 1.6
and pyruntime-cri)."""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
from importlib.metadata import version
from pathlib import Path

from pykubelet.api import quantity
from tests.kit.kubelet_node import wait_for

NODE = "pynode-e2e-1"
NODE_IP = "10.201.0.20"  # nothing connects to it yet (see test-cluster.md for the namespaced hosts)
MAX_PODS = 37
# fast cadences so the test sees changes in seconds; the defaults (10 s, 5 min, 40 s) are unit-tested
KUBELET_CONFIG = {"nodeStatusUpdateFrequency": "1s", "nodeLeaseDurationSeconds": 8, "maxPods": MAX_PODS,
                  "authentication": {"anonymous": {"enabled": False}}}


def runtime_version(cri) -> str:
    """What the node should say of its runtime, from the runtime itself rather than its CRI answer."""
    if cri.name == "pyruntime-cri":
        return f"pyruntime://{version('pynode')}"
    out = subprocess.run(["/usr/bin/containerd", "--version"], capture_output=True, text=True).stdout.split()[2]
    return f"containerd://{out.removeprefix('v')}"


def node(cp) -> dict:
    out = cp.kubectl("get", "node", NODE, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def condition(n: dict, kind: str) -> dict:
    return next((c for c in n.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def test_node_registers_and_turns_ready(control_plane, cri, kubelet):
    n = wait_for("node Ready", lambda: (lambda n: n if condition(n, "Ready").get("status") == "True" else None)(
        node(control_plane)))
    status = n["status"]
    assert status["capacity"]["pods"] == str(MAX_PODS)
    assert status["capacity"]["cpu"] == str(len(os.sched_getaffinity(0)))
    mem_kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal:")))
    assert status["capacity"]["memory"] == quantity.binary_si(mem_kib << 10)  # as NewQuantity(_, BinarySI)
    assert "ephemeral-storage" in status["capacity"] and status["allocatable"]["pods"] == str(MAX_PODS)
    assert {"type": "InternalIP", "address": NODE_IP} in status["addresses"]
    assert {"type": "Hostname", "address": NODE} in status["addresses"]
    info = status["nodeInfo"]
    assert info["containerRuntimeVersion"] == runtime_version(cri)
    assert info["kernelVersion"] == platform.release() and info["operatingSystem"] == "linux"
    assert info["kubeletVersion"].startswith("v1.37")
    labels = n["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == NODE and labels["kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/arch"] == info["architecture"]
    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure"):
        assert condition(n, kind)["status"] == "False", condition(n, kind)
    wide = control_plane.kubectl("get", "node", NODE, "-o", "wide").stdout
    assert "Ready" in wide and NODE_IP in wide


def test_the_nodes_pod_cidr_reaches_the_runtime(control_plane, cri, kubelet, runtime):
    """Set by another (the controller manager in a cluster, the admin here), spec.podCIDRs go to the runtime
    through CRI UpdateRuntimeConfig, as the stock kubelet's updatePodCIDR: pyruntime-cri's verbose Status
    shows them; containerd (no CNI config template here) can only accept the call, which the kubelet logs."""
    cidr = "10.99.0.0/24"
    control_plane.kubectl("patch", "node", NODE, "-p", json.dumps({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}))
    if cri.name == "pyruntime-cri":
        wait_for("the pod CIDR in pyruntime-cri's status", lambda: json.loads(
            runtime.status(verbose=True).info["config"]).get("podCIDR") == cidr)
    wait_for("the kubelet's word of it", lambda: f"pod CIDR {cidr} handed to the runtime" in kubelet.log_tail(100_000))


def test_lease_renews(control_plane, kubelet):
    def renew_time():
        out = control_plane.kubectl("get", "lease", "-n", "kube-node-lease", NODE, "-o", "json", check=False)
        return json.loads(out.stdout)["spec"] if out.returncode == 0 else None

    first = wait_for("the lease", renew_time)
    assert first["holderIdentity"] == NODE and first["leaseDurationSeconds"] == 8
    second = wait_for("a renewal", lambda: (lambda s: s if s and s["renewTime"] != first["renewTime"] else None)(
        renew_time()), timeout=15)
    assert second["renewTime"] > first["renewTime"]


def test_dead_runtime_turns_node_not_ready_naming_it(control_plane, cri, kubelet):
    cri.kill()
    try:
        ready = wait_for("Ready False", lambda: (lambda c: c if c.get("status") == "False" else None)(
            condition(node(control_plane), "Ready")), timeout=30)
        assert ready["reason"] == "KubeletNotReady"
        assert "container runtime is down" in ready["message"] and cri.url in ready["message"]
    finally:
        cri.start()
    try:
        wait_for("Ready again", lambda: condition(node(control_plane), "Ready").get("status") == "True", timeout=30)
    finally:
        cri.stop()  # the restarted runtime is this test's: the leak check wants it gone


def test_sigterm_stops_cleanly(kubelet):
    assert kubelet.running(), kubelet.log_tail()
    assert kubelet.proc is not None
    kubelet.proc.send_signal(signal.SIGTERM)
    assert kubelet.proc.wait(timeout=15) == 0
    assert "stopped" in kubelet.log_path.read_text()
