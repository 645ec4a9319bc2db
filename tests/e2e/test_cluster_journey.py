"""The user's journey of issue 11 on `make cluster`: `kubectl create deployment` on a stock control plane ends in
reachable pods and a working Service on our node, for each pair of kubelet and runtime of the interop matrix.

Each test brings the cluster up with the provisioning entry point `make cluster` runs
(vagrant/provision/cluster.py), walks the journey with the real kubectl as the seed documents tell it, and takes
the cluster down again; the leak check then finds nothing left. The outcome of each pair goes to
~/.cache/pynode/cluster-journey.md, and with PYNODE_JOURNEY_README=1 into README.md's table too (between its
cluster-journey markers).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from proto import api_pb2
from pykubelet.runtime import CRIRuntime
from pynode_cluster import cluster
from pynode_cluster.node import KUBELETS, RUNTIMES
from tests.kit.busybox import CACHE
from tests.kit.kubelet_node import BUSYBOX, HTTPD, wait_for

ENTRY = Path(__file__).resolve().parents[2] / "vagrant" / "provision" / "cluster.py"
RESULTS = CACHE / "cluster-journey.md"
README = Path(__file__).resolve().parents[2] / "README.md"
README_BEGIN, README_END = "<!-- cluster-journey:begin -->", "<!-- cluster-journey:end -->"
REPLICAS = 3
# pairs that cannot walk the journey yet, and why (xfail, not hidden)
KNOWN: dict[tuple[str, str], str] = {}


def provision(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ENTRY), *args], capture_output=True, text=True, timeout=timeout)


def kubectl(*args: str, timeout: float = 60, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess:
    return cluster.kubectl(*args, kubeconfig=cluster.admin_kubeconfig(), timeout=timeout, check=check, input=input)


def get(kind: str, *args: str) -> list[dict]:
    return json.loads(kubectl("get", kind, *args, "-o", "json").stdout).get("items", [])


def http(url: str) -> str:
    try:
        r = requests.get(url, timeout=3)
        return r.text if r.ok else ""
    except requests.RequestException:
        return ""


def record(kubelet: str, runtime: str, outcome: str, times: dict[str, float]) -> None:
    rows = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines()[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0], cells[1])] = line
    spent = ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
    rows[(kubelet, runtime)] = f"| {kubelet} | {runtime} | {outcome} | {spent} |"
    table = "| kubelet | runtime | journey | times |\n|---|---|---|---|\n" + "\n".join(rows[k] for k in sorted(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(table + "\n")
    if os.environ.get("PYNODE_JOURNEY_README") == "1":
        text = README.read_text()
        begin, end = text.index(README_BEGIN) + len(README_BEGIN), text.index(README_END)
        README.write_text(f"{text[:begin]}\n{table}\n{text[end:]}")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("kubelet", KUBELETS)
def test_deployment_journey(kubelet, runtime, request):
    if (kubelet, runtime) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[kubelet, runtime], strict=True))
    times: dict[str, float] = {}
    started = time.monotonic()
    up = provision("up", "--kubelet", kubelet, "--runtime", runtime)
    times["make cluster"] = time.monotonic() - started
    outcome = "failed"
    try:
        assert up.returncode == 0, f"cluster up:\n{up.stdout}\n{up.stderr}"
        assert "kubeconfig: " in up.stdout and "node-1-kube-proxy: " in up.stdout
        again = provision("up")
        assert again.returncode == 0 and "already running" in again.stdout, again.stdout + again.stderr
        started = time.monotonic()
        try:
            journey()
        except BaseException:
            for name, path in cluster.logs().items():
                if "kubelet" in name or "cri" in name or "containerd" in name:
                    print(f"--- {name}\n{Path(path).read_text(errors='replace')[-3000:]}")
            raise
        times["journey"] = time.monotonic() - started
        outcome = "passed"
    finally:
        started = time.monotonic()
        down = provision("down")
        times["make cluster-down"] = time.monotonic() - started
        record(kubelet, runtime, outcome, times)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not cluster.STATE.exists() and not cluster.RUN.exists()
    assert not Path(f"/sys/class/net/{cluster.BRIDGE}").exists()


@pytest.mark.timeout(600)
def test_two_nodes():
    """`make cluster NODES=2`: the deployment spreads over both nodes; pods on node-1 reach pods on node-2
    and the Service, and the host reaches all of them."""
    up = provision("up", "--nodes", "2")
    try:
        assert up.returncode == 0, f"cluster up:\n{up.stdout}\n{up.stderr}"
        journey(nodes=2, replicas=4)
    finally:
        down = provision("down")
    assert down.returncode == 0, down.stdout + down.stderr


def run_client(targets: list[str]) -> str:
    """A busybox pod on node-1 that asks each target for / with nc (the static busybox's wget crashes on name
    lookups) and says `ok TARGET` for each answer; its log read from the node's pod log dir (kubectl logs
    needs the kubelet's server, which pykubelet is getting)."""
    script = "; ".join(f"if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {t} 80 | grep -q 'It works'; "
                       f"then echo ok {t}; else echo failed {t}; fi" for t in targets) + "; echo done; sleep 3600"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
           "spec": {"nodeName": "node-1", "terminationGracePeriodSeconds": 1, "containers": [
               {"name": "client", "image": BUSYBOX, "command": ["sh", "-c", script]}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    uid = json.loads(kubectl("get", "pod", "client", "-o", "json").stdout)["metadata"]["uid"]
    state = cluster.Record.load()
    assert state is not None
    log = state.nodes[0].node().pod_logs / f"default_client_{uid}" / "client" / "0.log"
    text = wait_for("the client pod's answers", lambda: log.exists() and "done" in log.read_text() and
                    log.read_text(), 90)
    kubectl("delete", "pod", "client", "--wait=true", timeout=90)
    return text


def journey(nodes: int = 1, replicas: int = REPLICAS) -> None:
    names = {f"node-{i}" for i in range(1, nodes + 1)}
    kubectl("create", "deployment", "web", f"--image={HTTPD}", f"--replicas={replicas}")
    # the Deployment is recorded, its controller makes a ReplicaSet, which makes the pods
    deployment = json.loads(kubectl("get", "deployment", "web", "-o", "json").stdout)
    rs = wait_for("the ReplicaSet", lambda: [r for r in get("replicasets", "-l", "app=web")
                                             if r["metadata"]["ownerReferences"][0]["uid"] ==
                                             deployment["metadata"]["uid"]], 30)
    assert len(rs) == 1
    pods = wait_for(f"{replicas} pods of the ReplicaSet bound to {names}", lambda: (lambda p: p if len(p) == replicas
                    and all(x["spec"].get("nodeName") in names for x in p) else None)(
        [p for p in get("pods", "-l", "app=web") if p["metadata"]["ownerReferences"][0]["uid"] ==
         rs[0]["metadata"]["uid"]]), 60)
    kubectl("rollout", "status", "deployment/web", "--timeout=120s", timeout=150)
    pods = get("pods", "-l", "app=web")
    assert len(pods) == replicas and all(p["status"]["phase"] == "Running" for p in pods)
    assert {p["spec"]["nodeName"] for p in pods} == names  # the scheduler spreads them
    for pod in pods:  # sandboxes on our bridge's pod CIDR, containers serving
        ip = pod["status"]["podIP"]
        assert ip.startswith("10.244."), ip
        assert "It works!" in wait_for(f"{pod['metadata']['name']} at {ip} answering HTTP",
                                       lambda ip=ip: http(f"http://{ip}/"), 30)
    # a ClusterIP Service in front of the deployment answers from the host (kube-proxy's DNAT on the node)
    kubectl("expose", "deployment", "web", "--port=80")
    cluster_ip = json.loads(kubectl("get", "service", "web", "-o", "json").stdout)["spec"]["clusterIP"]
    assert "It works!" in wait_for(f"the Service at {cluster_ip}", lambda: http(f"http://{cluster_ip}/"), 60)
    # and from a pod on node-1: every web pod by IP (on other nodes too) and the Service
    targets = [p["status"]["podIP"] for p in pods] + [cluster_ip]
    client_log = run_client(targets)
    for target in targets:
        assert f"ok {target}\n" in client_log, client_log
    # deleting the deployment leaves nothing on the node: no pod, no running container, no ready sandbox, no IP
    kubectl("delete", "service", "web")
    kubectl("delete", "deployment", "web", "--wait=true", timeout=90)
    wait_for("the pods gone", lambda: not get("pods", "-l", "app=web"), 90)
    state = cluster.Record.load()
    assert state is not None
    node = state.nodes[0].node()
    client = CRIRuntime(node.endpoint, timeout=30)
    try:
        wait_for("no ready sandbox and no running container on the node", lambda: not any(
            s.state == api_pb2.SANDBOX_READY for s in client.list_pod_sandbox()) and not any(
            c.state == api_pb2.CONTAINER_RUNNING for c in client.list_containers()), 60)
    finally:
        client.close()
    wait_for("no IP allocated by host-local", lambda: not [
        p for p in (node.dir / "ipam").rglob("*") if p.is_file() and p.name[0].isdigit()], 60)
