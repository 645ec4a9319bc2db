"""What metrics-server and Prometheus read of pykubelet, as they read it of the stock kubelet (issue 24
item 5): /metrics/resource, /metrics/probes and /configz with a ServiceAccount token granted nodes/metrics and
nodes/proxy, and with the token of an account granted what metrics-server's ClusterRole grants (nodes/metrics),
which reaches the metrics and not /configz (nodes/configz, or nodes/proxy). Straight from the kubelet, as metrics-server
scrapes it: this node's address is loopback, which the API server's node proxy refuses.

The scrape is read back with tests/kit/kubelet_metrics.py: every family's name, type, HELP and labels are
the stock collectors', and the numbers are what metrics-server keeps (it drops a container whose cpu or
memory reads 0, and a node without both)."""
from __future__ import annotations

import calendar
import json
import time

import requests

from tests.kit.controlplane import ControlPlane
from tests.kit.kubelet_metrics import STOCK_PROBES, STOCK_RESOURCE, check_stock, parse, samples
from tests.kit.kubelet_node import BUSYBOX, apply, delete, pod_spec, secured_config, wait_for, wait_pod

NODE = "kmetrics-node"
NODE_IP = "127.0.0.1"
PORT = 10351
SPIN = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 3600"  # some cpu time, then quiet


def KUBELET_CONFIG(cp: ControlPlane) -> dict:
    return secured_config(cp, NODE, NODE_IP, PORT)


def token_for(cp: ControlPlane, account: str, resource: str) -> str:
    """A token of ServiceAccount `account`, granted get on `resource` (nodes/proxy, nodes/metrics)."""
    cp.kubectl("create", "serviceaccount", account)
    cp.kubectl("create", "clusterrole", account, "--verb=get", f"--resource={resource}")
    cp.kubectl("create", "clusterrolebinding", account, f"--clusterrole={account}",
               f"--serviceaccount=default:{account}")
    return cp.kubectl("create", "token", account).stdout.strip()


def direct(cp: ControlPlane, token: str, path: str) -> requests.Response:
    assert cp.ca is not None
    return requests.get(f"https://{NODE_IP}:{PORT}{path}", headers={"Authorization": f"Bearer {token}"},
                        verify=str(cp.ca.pair.cert), timeout=10)


def test_resource_and_probe_metrics_and_configz(control_plane, kubelet, kubepods, tmp_path):
    container = {"name": "c", "image": BUSYBOX, "command": ["sh", "-c", SPIN],
                 "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}}
    apply(control_plane, tmp_path, pod_spec(NODE, "top", container))
    try:
        _check_scrapes(control_plane)
    finally:
        delete(control_plane, "top")


def _check_scrapes(control_plane) -> None:
    pod = wait_pod(control_plane, "top", "Ready", lambda p: any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in p.get("status", {}).get("conditions", [])))
    uid = pod["metadata"]["uid"]
    started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    token = token_for(control_plane, "scraper", "nodes/metrics,nodes/proxy")
    key = ("c", "default", "top")

    def scraped() -> dict | None:
        r = direct(control_plane, token, "/metrics/resource")
        assert r.status_code == 200, r.text
        families = parse(r.text)
        found = samples(families, "container_cpu_usage_seconds_total") if (
            "container_cpu_usage_seconds_total" in families) else {}
        return families if key in found and found[key][0] > 0 else None

    families = wait_for("the pod's cpu in /metrics/resource", scraped, timeout=30)
    check_stock(families, STOCK_RESOURCE)
    now_ms = time.time() * 1000
    for name in ("node_cpu_usage_seconds_total", "node_memory_working_set_bytes"):
        [(value, ms)] = samples(families, name).values()
        assert value > 0 and ms is not None and abs(now_ms - ms) < 60_000, (name, value, ms)
    assert samples(families, "container_memory_working_set_bytes")[key][0] > 0
    assert samples(families, "pod_memory_working_set_bytes")[("default", "top")][0] > 0
    start = samples(families, "container_start_time_seconds")[key][0]
    # created, then started; startedAt is cut to the second
    assert -1 < calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")) - start < 60
    assert samples(families, "resource_scrape_error") == {(): (0, None)}

    def probed() -> dict | None:
        families = parse(direct(control_plane, token, "/metrics/probes").text)
        total = samples(families, "prober_probe_total") if "prober_probe_total" in families else {}
        return families if ("c", "default", "top", uid, "Readiness", "successful") in total else None

    families = wait_for("a counted readiness probe in /metrics/probes", probed, timeout=30)
    check_stock(families, STOCK_PROBES)
    assert "prober_probe_duration_seconds" in families and "process_start_time_seconds" in families

    r = direct(control_plane, token, "/configz")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    config = r.json()["kubeletconfig"]
    assert (config["kind"], config["apiVersion"]) == ("KubeletConfiguration", "kubelet.config.k8s.io/v1beta1")
    assert config["port"] == PORT and config["authorization"]["webhook"]["cacheUnauthorizedTTL"] == "1s"
    assert config["authentication"]["x509"]["clientCAFile"] == str(control_plane.ca.pair.cert)

    delete(control_plane, "top")
    gone = parse(direct(control_plane, token, "/metrics/probes").text)
    assert uid not in json.dumps(gone), "a pod gone from the node leaves no probe series"


def test_metrics_servers_rights_reach_the_metrics_not_configz(control_plane, kubelet, kubepods):
    """metrics-server's ClusterRole (system:metrics-server) grants nodes/metrics: with it, its token is let
    in to /metrics/resource and refused /configz, naming the check, as the stock kubelet does."""
    token = token_for(control_plane, "metrics-reader", "nodes/metrics")
    r = wait_for("the metrics reader let in", lambda: (lambda r: r if r.status_code == 200 else None)(
        direct(control_plane, token, "/metrics/resource")), timeout=20)
    check_stock(parse(r.text), STOCK_RESOURCE)
    assert direct(control_plane, token, "/metrics/probes").status_code == 200
    r = direct(control_plane, token, "/configz")
    assert r.status_code == 403
    assert ("Forbidden (user=system:serviceaccount:default:metrics-reader, verb=get, resource=nodes, "
            "subresource=configz)") in r.text
