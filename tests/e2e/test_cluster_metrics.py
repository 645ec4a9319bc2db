"""`kubectl top` on `make cluster` (issue 24): metrics-server runs beside the stock control plane, behind the API
server's aggregator, and scrapes our kubelets' /metrics/resource; `kubectl top nodes` and `kubectl top pods -A`
answer with every node and every pod, each with CPU and memory above zero, within a deadline of the cluster
being up. The cluster comes up with the provisioning entry point `make cluster` runs and goes down again; the
leak check then finds nothing left.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pynode_cluster import cluster, coredns
from tests.kit.cluster_admin import kubectl, provision
from tests.kit.kubelet_node import BUSYBOX, wait_for

NODES = 2
# two scrapes at metrics-server's 15 s resolution make the first CPU rate; the rest is slack for a busy machine
DEADLINE = 120
# a few MiB held in a shell variable and a little CPU each second: a sleeping shell may show 0m and 0Mi
LOAD = ("x=$(head -c 8000000 /dev/zero | tr '\\0' a); "
        "while true; do i=0; while [ $i -lt 10000 ]; do i=$((i+1)); done; sleep 1; done")
QUANTITY = re.compile(r"(\d+)(m|Ki|Mi|Gi)?")


def load_pod(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [
                {"name": "load", "image": BUSYBOX, "command": ["sh", "-c", LOAD]}]}}


def positive(quantity: str) -> bool:
    match = QUANTITY.fullmatch(quantity)
    return match is not None and int(match[1]) > 0


def top(*args: str) -> dict[str, tuple[str, str]]:
    """`kubectl top ARGS` as (CPU, memory) by a node's name or a pod's namespace/name (with -A). Empty while
    metrics-server has no figures yet (kubectl exits non-zero)."""
    result = kubectl("top", *args, "--no-headers", check=False)
    if result.returncode != 0:
        return {}
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    if "-A" in args:  # NAMESPACE NAME CPU(cores) MEMORY(bytes)
        return {f"{r[0]}/{r[1]}": (r[2], r[3]) for r in rows}
    return {r[0]: (r[1], r[3]) for r in rows}  # NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)


def all_positive(rows: dict[str, tuple[str, str]], want: set[str]) -> dict[str, tuple[str, str]] | None:
    """`rows` if they hold every name of `want`, each with CPU and memory above zero."""
    if want <= set(rows) and all(positive(rows[name][0]) and positive(rows[name][1]) for name in want):
        return rows
    return None


@pytest.mark.timeout(600)
def test_kubectl_top_lists_our_nodes_and_pods():
    up = provision("up", "--nodes", str(NODES))
    try:
        assert up.returncode == 0, f"cluster up:\n{up.stdout}\n{up.stderr}"
        assert "metrics-server: " in up.stdout, up.stdout
        nodes = {f"node-{i}" for i in range(1, NODES + 1)}
        pods = {f"load-{n}": n for n in sorted(nodes)}
        for name, node in pods.items():
            kubectl("apply", "-f", "-", input=json.dumps(load_pod(name, node)))
        kubectl("wait", "--for=condition=Ready", "pod", *pods, "--timeout=120s", timeout=150)
        try:
            node_rows = wait_for("kubectl top nodes with every node's CPU and memory",
                                 lambda: all_positive(top("nodes"), nodes), DEADLINE)
            pod_rows = wait_for("kubectl top pods -A with every pod's CPU and memory",
                                lambda: all_positive(top("pods", "-A"), {f"default/{p}" for p in pods}), DEADLINE)
        except BaseException:
            for name, path in cluster.logs().items():
                if "metrics-server" in name or "kubelet" in name:
                    print(f"--- {name}\n{Path(path).read_text(errors='replace')[-3000:]}")
            raise
        assert set(node_rows) == nodes, node_rows
        # ours, and the cluster's own: CoreDNS's
        assert set(pod_rows) == {f"default/{p}" for p in pods} | {
            f"{coredns.NAMESPACE}/{p['metadata']['name']}" for p in json.loads(kubectl(
                "get", "pods", "-n", coredns.NAMESPACE, "-o", "json").stdout)["items"]}, pod_rows
        # and the API kubectl reads: metrics.k8s.io through the aggregator, as any client asks it
        raw = json.loads(kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes").stdout)
        assert {item["metadata"]["name"] for item in raw["items"]} == nodes
        kubectl("delete", "pod", *pods, "--wait=true", timeout=90)
    finally:
        down = provision("down")
    assert down.returncode == 0, down.stdout + down.stderr
