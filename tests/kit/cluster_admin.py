"""What the `make cluster` tests and bench.cluster do as the cluster's user: the provisioning entry point
`make cluster` runs, kubectl with admin.kubeconfig, lists of objects, whether an address answers HTTP
(an empty string while it does not: the tests wait on it), and what a pod on a given node reaches."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import requests

from pynode_cluster import cluster, hosts
from tests.kit.cri_images import BUSYBOX

ENTRY = Path(__file__).resolve().parents[2] / "vagrant" / "provision" / "cluster.py"


def provision(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`vagrant/provision/cluster.py ARGS` (up, down, status) as `make cluster` runs it."""
    return subprocess.run([sys.executable, str(ENTRY), *args], capture_output=True, text=True, timeout=timeout)


def kubectl(*args: str, timeout: float = 60, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess:
    return cluster.kubectl(*args, kubeconfig=cluster.admin_kubeconfig(), timeout=timeout, check=check, input=input)


def get(kind: str, *args: str) -> list[dict]:
    return json.loads(kubectl("get", kind, *args, "-o", "json").stdout).get("items", [])


def http(url: str, timeout: float = 3) -> str:
    try:
        r = requests.get(url, timeout=timeout)
        return r.text if r.ok else ""
    except requests.RequestException:
        return ""


def answers_from(kubectl: Callable[..., subprocess.CompletedProcess], node: str, targets: list[str],
                 timeout: float = 90) -> str:
    """The log of a busybox pod on `node` that asked each target for / with nc: `ok TARGET` for each answer
    that came (the issue's pod-to-pod and pod-to-Service checks across nodes). `kubectl` is the cluster's."""
    script = "; ".join(f"if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {t} 80 | grep -q 'It works'; "
                       f"then echo ok {t}; else echo failed {t}; fi" for t in targets) + "; echo done; sleep 3600"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [
               {"name": "client", "image": BUSYBOX, "command": ["sh", "-c", script]}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    return hosts.wait_for("the client pod's answers", lambda: (lambda out: "done" in out and out)(
        kubectl("logs", "client", check=False).stdout), timeout)
