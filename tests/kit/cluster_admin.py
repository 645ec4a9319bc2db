"""What the `make cluster` tests and bench.cluster do as the cluster's user: the provisioning entry point
`make cluster` runs, kubectl with admin.kubeconfig, lists of objects, and whether an address answers HTTP
(an empty string while it does not: the tests wait on it)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import requests

from pynode_cluster import cluster

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
