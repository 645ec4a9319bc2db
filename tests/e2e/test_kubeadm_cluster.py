"""A kubeadm cluster on one machine (`make cluster KUBEADM=1`, issue 25): `kubeadm init` on node-1, of pykubelet on
pyruntime-cri, whose control plane are its static pods; `kubeadm join` of node-2, of the same pair, and of node-3,
of the stock kubelet on containerd (a mixed cluster). What a kubeadm user checks on it: the nodes and their roles,
the control plane as mirror pods, kubeadm's add-ons (kube-proxy's DaemonSet, CoreDNS) running, the deployment
journey of `make cluster` across both kinds of worker with a scale to 30 and a rolling update, a kill -9 of the
API server's container, a reboot of a node (its kubelet and runtime killed and started again by its init), and
`make cluster-down` (kubeadm reset on each node first) leaving nothing.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from proto import api_pb2
from pykubelet.runtime import CRIRuntime
from pynode_cluster import cluster, hosts, kubeadm_node
from tests.e2e.test_cluster_journey import journey
from tests.kit.cluster_admin import get, http, kubectl, provision
from tests.kit.cri_images import BUSYBOX, HTTPD
from tests.kit.kubelet_node import wait_for

PAIRS = [("pykubelet", "pyruntime-cri"), ("pykubelet", "pyruntime-cri"), ("kubelet", "containerd")]
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


@pytest.fixture(scope="module")
def kubeadm_cluster():
    existed = {path for path in (*kubeadm_node.PRIVATE_DIRS, *kubeadm_node.HOST_PATHS) if Path(path).exists()}
    up = provision("up", "--kubeadm", "--nodes", str(len(PAIRS)), "--kubelet", ",".join(k for k, _ in PAIRS),
                   "--runtime", ",".join(r for _, r in PAIRS), timeout=600)
    try:
        assert up.returncode == 0, f"cluster up:\n{up.stdout}\n{up.stderr}"
        record = cluster.Record.load()
        assert record is not None and record.kubeadm
        warm_up([n.name for n in record.nodes])
        yield record
    finally:
        down = provision("down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert not cluster.STATE.exists() and not cluster.RUN.exists()
        # kubeadm's paths and kube-proxy's host mounts: none the host lacked before is left on it
        left = {path for path in (*kubeadm_node.PRIVATE_DIRS, *kubeadm_node.HOST_PATHS) if Path(path).exists()}
        assert left <= existed, left - existed


def warm_up(nodes: list[str]) -> None:
    """A pod on each node's pod network, gone again: what a node makes once for its first such pod (the CNI
    plugins' helper in its netns, the QoS cgroups) belongs to the node, not to the first test that runs one."""
    for name in nodes:
        kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"warm-up-{name}"},
            "spec": {"nodeName": name, "terminationGracePeriodSeconds": 1, "containers": [
                {"name": "sh", "image": BUSYBOX, "command": ["sleep", "3600"]}]}}))
    for name in nodes:
        kubectl("wait", "--for=condition=Ready", f"pod/warm-up-{name}", "--timeout=90s", timeout=120)
    kubectl("delete", "pods", *(f"warm-up-{name}" for name in nodes), "--wait=true", timeout=90)


def node(name: str) -> dict:
    return json.loads(kubectl("get", "node", name, "-o", "json").stdout)


def test_every_node_joined_through_kubeadm(kubeadm_cluster):
    """node-1 is kubeadm's control plane (its role label and taint); every node registered with the address and
    the kubelet and runtime of its pair; the joined nodes' kubelets bootstrapped their client certificates
    with the token kubeadm printed, and kubeadm removed the bootstrap kubeconfig after."""
    first = node("node-1")
    assert "node-role.kubernetes.io/control-plane" in first["metadata"]["labels"]
    assert {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"} in first["spec"]["taints"]
    for n, (kubelet, runtime) in zip(kubeadm_cluster.nodes, PAIRS, strict=True):
        info = node(n.name)["status"]
        assert {"type": "InternalIP", "address": n.address} in info["addresses"]
        assert info["nodeInfo"]["kubeletVersion"] == ("v1.37.0+pykubelet" if kubelet == "pykubelet" else "v1.37.2")
        assert info["nodeInfo"]["containerRuntimeVersion"].startswith(
            "pyruntime://" if runtime == "pyruntime-cri" else "containerd://")
        etc = n.kubeadm_node().private("/etc/kubernetes")
        assert (etc / "kubelet.conf").is_file() and not (etc / "bootstrap-kubelet.conf").exists()
    csrs = get("certificatesigningrequests")
    assert {c["spec"]["username"].split(":")[1] for c in csrs} == {"bootstrap"}, csrs
    assert len([c for c in csrs if any(cond["type"] == "Approved" for cond in c["status"].get("conditions", []))]) \
        == len(PAIRS) - 1


def test_the_control_plane_runs_as_static_pods_of_pykubelet(kubeadm_cluster):
    """kubeadm's four manifests run on node-1's pykubelet as static pods: mirror pods on the API server, on the
    host network, with kubeadm's probes, their containers in node-1's pyruntime-cri."""
    for component in CONTROL_PLANE:
        pod = json.loads(kubectl("get", "pod", "-n", "kube-system", f"{component}-node-1", "-o", "json").stdout)
        assert "kubernetes.io/config.mirror" in pod["metadata"]["annotations"]
        assert pod["spec"]["hostNetwork"] and pod["spec"]["priorityClassName"] == "system-node-critical"
        assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"] == "10.203.0.21"
        container = pod["spec"]["containers"][0]
        assert "livenessProbe" in container and "startupProbe" in container
    cri = CRIRuntime(kubeadm_cluster.nodes[0].node().endpoint, timeout=30)
    try:
        running = {c.metadata.name for c in cri.list_containers() if c.state == api_pb2.CONTAINER_RUNNING}
    finally:
        cri.close()
    assert set(CONTROL_PLANE) <= running, running


def test_kubeadms_addons_run_on_every_kind_of_node(kubeadm_cluster):
    """kube-proxy's DaemonSet (privileged, on the host network, iptables in its image) on each node, and
    CoreDNS's Deployment on the pod network, both as kubeadm deployed them."""
    proxies = get("pods", "-n", "kube-system", "-l", "k8s-app=kube-proxy")
    assert {p["spec"]["nodeName"] for p in proxies} == {n.name for n in kubeadm_cluster.nodes}
    assert all(p["status"]["phase"] == "Running" for p in proxies), [p["status"] for p in proxies]
    dns = get("pods", "-n", "kube-system", "-l", "k8s-app=kube-dns")
    assert len(dns) == 2 and all(p["status"]["phase"] == "Running" and p["status"]["podIP"].startswith("10.244.")
                                 for p in dns), [p["status"] for p in dns]


@pytest.mark.timeout(900)
def test_deployment_journey_over_both_kinds_of_worker(kubeadm_cluster):
    """`make cluster`'s journey (test_cluster_journey.py) on the kubeadm cluster: spread over node-2 (ours) and
    node-3 (stock), Services by name through kubeadm's CoreDNS, a scale to 30 and back, a rolling update with
    no failed request; the control plane's taint keeps the deployment off node-1."""
    journey(nodes=len(PAIRS), replicas=4, workers={"node-2", "node-3"}, scale=30)


def apiserver() -> psutil.Process | None:
    """The API server's process, as `pgrep kube-apiserver` finds it on the control plane's host."""
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [""])[0] == "kube-apiserver" and "--advertise-address=10.203.0.21" in p.info[
                "cmdline"]:
            return p
    return None


@pytest.mark.timeout(300)
def test_kill_9_of_the_api_servers_container(kubeadm_cluster, leak_check):
    """pykubelet starts the static pod's container again (its restart count goes up) and the cluster answers."""
    mirror = json.loads(kubectl("get", "pod", "-n", "kube-system", "kube-apiserver-node-1", "-o", "json").stdout)
    before = mirror["status"]["containerStatuses"][0]["restartCount"]
    # the container that replaces the killed one is the cluster's, as that one was: it goes with the cluster
    pod_cgroup = f"/pod{mirror['metadata']['annotations']['kubernetes.io/config.mirror']}/"
    replacement: list[str] = []  # the new container's id, once it runs
    leak_check.allow("cgroups", lambda item: pod_cgroup in item)
    leak_check.allow("processes", lambda item: any(pod_cgroup in line for line in _cgroup_of(item)) or
                     item.split()[1:3] == ["pyruntime-supervisor", *replacement])
    victim = apiserver()
    assert victim is not None
    victim.kill()
    hosts.ended(victim, 10)
    wait_for("a new kube-apiserver", lambda: (p := apiserver()) is not None and p.pid != victim.pid, 60, interval=1)

    def restarted() -> bool:
        result = kubectl("get", "pod", "-n", "kube-system", "kube-apiserver-node-1", "-o", "json", check=False)
        if result.returncode != 0:
            return False
        status = json.loads(result.stdout)["status"]["containerStatuses"][0]
        replacement[:] = [status.get("containerID", "").split("://")[-1]]
        return status["restartCount"] > before and status.get("ready", False)
    wait_for("the API server's mirror pod restarted and ready", restarted, 180, interval=2)
    assert all(c["status"] == "True" for n in get("nodes") for c in n["status"]["conditions"] if c["type"] == "Ready")


def _cgroup_of(item: str) -> list[str]:
    """The cgroup lines of the leak check's process `item` (PID@START CMDLINE): the container's processes are in
    its cgroup; its supervisor is not, and is named by the container's id."""
    try:
        return Path(f"/proc/{item.split('@', 1)[0]}/cgroup").read_text().splitlines()
    except OSError:
        return []


@pytest.mark.timeout(300)
def test_a_rebooted_node_keeps_its_pods(kubeadm_cluster, leak_check):
    """node-2's pykubelet and pyruntime-cri killed with SIGKILL, as a crash of both would: its init starts them
    again, and the pods on it are the same pods, containers and IPs, still answering, never restarted."""
    n = kubeadm_cluster.nodes[1]
    kubectl("create", "deployment", "stay", f"--image={HTTPD}", "--replicas=2")
    kubectl("patch", "deployment/stay", "-p", json.dumps(
        {"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": n.name}}}}}))
    kubectl("rollout", "status", "deployment/stay", "--timeout=120s", timeout=150)
    try:
        def state() -> dict[str, tuple[str, str, int]]:
            return {p["metadata"]["uid"]: (p["status"]["podIP"], p["status"]["containerStatuses"][0]["containerID"],
                                           p["status"]["containerStatuses"][0]["restartCount"])
                    for p in get("pods", "-l", "app=stay") if not p["metadata"].get("deletionTimestamp")}
        before = state()
        assert len(before) == 2
        units = hosts.Daemons(n.kubeadm_node().init_dir / "units")
        init = cluster.daemons().process(f"{n.name}-init")
        assert init is not None
        # the kubelet and the runtime its init starts again are the node's, as the killed ones were
        leak_check.allow("processes", lambda item: int(item.split("@", 1)[0]) in {
            p.pid for p in init.children(recursive=True)})
        killed = {}
        for unit in ("kubelet", "runtime"):
            proc = units.process(unit)
            assert proc is not None, unit
            os.kill(proc.pid, signal.SIGKILL)
            killed[unit] = proc.pid
        wait_for("the node's init starting both again", lambda: all(
            (p := units.process(u)) is not None and p.pid != pid for u, pid in killed.items()), 60, interval=0.5)
        time.sleep(5)  # a kubelet that would restart or replace the pods does so in its first syncs
        wait_for(f"{n.name} Ready", lambda: any(c["type"] == "Ready" and c["status"] == "True"
                                                for c in node(n.name)["status"]["conditions"]), 90, interval=1)
        after = wait_for("the pods' status again", lambda: (lambda s: s if len(s) == 2 and all(
            v[1] for v in s.values()) else None)(state()), 60, interval=1)
        assert after == before
        for ip, _, _ in after.values():
            assert "It works!" in wait_for(f"the pod at {ip}", lambda ip=ip: http(f"http://{ip}/"), 30)
    finally:
        kubectl("delete", "deployment", "stay", "--wait=true", timeout=90)
