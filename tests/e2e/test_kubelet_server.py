"""pykubelet's HTTPS server as a cluster uses it: the stock kube-apiserver reaches it at the node's
InternalIP and daemonEndpoints port with its kubelet client certificate, so the real `kubectl logs`,
`exec`, `attach` and `port-forward` go API server -> pykubelet -> the runtime's streaming server; and the
server's own door: anonymous callers get 401, identities without RBAC rights on nodes/* get 403 naming
them, and the same identity passes once a ClusterRoleBinding grants nodes/proxy.

The kubelet's serving certificate is issued by the cluster CA, as the API server checks it
(--kubelet-certificate-authority); the API server's client certificate is in group
kubeadm:cluster-admins, which kubeadm binds to cluster-admin (tests/kit/controlplane.py makes the same
binding)."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time

import pytest
import requests

from tests.kit.controlplane import ControlPlane, peer
from tests.kit.kubelet_node import BUSYBOX, HTTPD, apply, delete, get_pod, pod_spec, secured_config, wait_for, wait_pod

NODE = "kserver-node"
NODE_IP = "127.0.0.1"
PORT = 10350
BASE = f"https://{NODE_IP}:{PORT}"


def KUBELET_CONFIG(cp: ControlPlane) -> dict:
    return secured_config(cp, NODE, NODE_IP, PORT)


# ends with output and no newline: served as it came (e2e's Projected combined spec cats files with none)
LOGGER = ("echo start; i=0; while [ $i -lt 3 ]; do echo line $i; i=$((i+1)); sleep 1; done; printf end; exit 1")


@pytest.fixture(autouse=True)
def no_pod_left(control_plane, kubelet, kubepods):
    """A failed test's pods go too, before the leak check looks."""
    yield
    control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)


def pki(cp: ControlPlane, name: str) -> tuple[str, str]:
    return str(cp.dir / "pki" / f"{name}.crt"), str(cp.dir / "pki" / f"{name}.key")


def get(cp: ControlPlane, path: str, **kwargs) -> requests.Response:
    assert cp.ca is not None
    return requests.get(f"{BASE}{path}", verify=str(cp.ca.pair.cert), timeout=10, **kwargs)


def kubectl_argv(cp: ControlPlane, *args: str) -> list[str]:
    return [peer("kubectl"), "--kubeconfig", str(cp.admin), *args]


def running(cp: ControlPlane, tmp_path, name: str, container: dict, **spec) -> dict:
    apply(cp, tmp_path, pod_spec(NODE, name, container, **spec))
    return wait_pod(cp, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running")


def test_node_advertises_its_server(control_plane, kubelet):
    status = json.loads(control_plane.kubectl("get", "node", NODE, "-o", "json").stdout)["status"]
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == PORT
    assert {"type": "InternalIP", "address": NODE_IP} in status["addresses"]


def test_healthz_metrics_and_stats_for_the_apiserver_client(control_plane, kubelet, kubepods, tmp_path):
    as_apiserver = pki(control_plane, "apiserver-kubelet-client")
    assert get(control_plane, "/healthz").status_code == 401  # anonymous
    assert get(control_plane, "/healthz", headers={"Authorization": "Bearer nonsense"}).status_code == 401
    assert get(control_plane, "/healthz", cert=as_apiserver).text == "ok"
    pod = running(control_plane, tmp_path, "stats", {"name": "c", "image": BUSYBOX, "command": ["sleep", "3600"]})
    metrics = get(control_plane, "/metrics", cert=as_apiserver)
    assert metrics.status_code == 200 and metrics.headers["Content-Type"].startswith("text/plain")
    assert re.search(r"^kubelet_running_pods [1-9]", metrics.text, re.M), metrics.text
    assert re.search(r'^kubelet_running_containers\{container_state="running"\} [1-9]', metrics.text, re.M)
    assert re.search(r"^kubelet_pod_start_duration_seconds_count [1-9]", metrics.text, re.M), metrics.text
    assert re.search(r'^kubelet_pod_start_duration_seconds_bucket\{le="3600.0"\} [1-9]', metrics.text, re.M)
    pods = get(control_plane, "/pods", cert=as_apiserver)
    assert pods.headers["Content-Type"] == "application/json" and pods.json()["kind"] == "PodList"
    listed = [p for p in pods.json()["items"] if p["metadata"]["uid"] == pod["metadata"]["uid"]]
    assert listed and listed[0]["metadata"]["name"] == "stats" and listed[0]["status"]["phase"] == "Running"
    summary = get(control_plane, "/stats/summary", cert=as_apiserver).json()
    assert summary["node"]["nodeName"] == NODE and summary["node"]["memory"]["workingSetBytes"] > 0
    mine = [p for p in summary["pods"] if p["podRef"]["uid"] == pod["metadata"]["uid"]]
    assert mine and mine[0]["podRef"]["name"] == "stats" and [c["name"] for c in mine[0]["containers"]] == ["c"]
    assert mine[0]["containers"][0]["memory"]["workingSetBytes"] > 0
    delete(control_plane, "stats")


def test_kubectl_logs(control_plane, kubelet, kubepods, tmp_path):
    """-f goes on across the container's restart; --previous, --tail, --since-time and --limit-bytes
    read the attempt before."""
    running(control_plane, tmp_path, "logger", {"name": "c", "image": BUSYBOX, "command": ["sh", "-c", LOGGER]})
    with subprocess.Popen(kubectl_argv(control_plane, "logs", "-f", "logger"), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as follow:
        assert follow.stdout is not None
        try:
            seen = b""
            deadline = time.monotonic() + 60
            while seen.count(b"start\n") < 2 and time.monotonic() < deadline:
                if select.select([follow.stdout], [], [], 1)[0]:
                    chunk = os.read(follow.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    seen += chunk
            assert seen.startswith(b"start\nline 0\nline 1\nline 2\nendstart\n"), (seen, follow.poll())
        finally:
            follow.kill()
    wait_pod(control_plane, "logger", "a restart", lambda p: p["status"]["containerStatuses"][0]["restartCount"] >= 1)
    previous = control_plane.kubectl("logs", "logger", "--previous").stdout
    assert previous == "start\nline 0\nline 1\nline 2\nend"
    assert control_plane.kubectl("logs", "logger", "--previous", "--tail", "2").stdout == "line 2\nend"
    assert control_plane.kubectl("logs", "logger", "--previous", "--limit-bytes", "8").stdout == "start\nli"
    stamped = control_plane.kubectl("logs", "logger", "--previous", "--timestamps").stdout.splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["start", "line 0", "line 1", "line 2", "end"]
    assert control_plane.kubectl("logs", "logger", "--previous", "--since-time", stamped[2].split()[0]).stdout \
        == "line 1\nline 2\nend"
    assert control_plane.kubectl("logs", "logger", "--since", "1h").stdout.startswith("start\n")
    delete(control_plane, "logger")


def test_kubectl_exec_attach_and_port_forward(control_plane, kubelet, kubepods, tmp_path):
    running(control_plane, tmp_path, "web", {"name": "httpd", "image": HTTPD, "ports": [{"containerPort": 80}]})
    out = control_plane.kubectl("exec", "web", "--", "sh", "-c", "echo out; echo err >&2; exit 3", check=False)
    assert (out.returncode, out.stdout, out.stderr.splitlines()[0]) == (3, "out\n", "err")
    piped = subprocess.run(kubectl_argv(control_plane, "exec", "-i", "web", "--", "cat"), input="through stdin",
                           capture_output=True, text=True, timeout=60)
    assert piped.stdout == "through stdin", piped.stderr
    assert tty_session(kubectl_argv(control_plane, "exec", "-it", "web", "--", "sh", "-c", "tty; echo tty-ok"),
                       b"tty-ok")

    with subprocess.Popen(kubectl_argv(control_plane, "port-forward", "pod/web", ":80"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as forward:
        assert forward.stdout is not None and forward.stderr is not None
        try:
            line = forward.stdout.readline()
            m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) -> 80", line)
            assert m, (line, forward.stderr.read() if forward.poll() is not None else "")
            r = requests.get(f"http://127.0.0.1:{m.group(1)}/", timeout=10)
            assert r.status_code == 200 and "It works!" in r.text
        finally:
            forward.terminate()

    running(control_plane, tmp_path, "reader", {"name": "c", "image": BUSYBOX, "stdin": True, "command": [
        "sh", "-c", "while read l; do echo got:$l; done"]})
    with subprocess.Popen(kubectl_argv(control_plane, "attach", "-i", "reader"), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as attach:
        assert attach.stdin is not None and attach.stdout is not None
        try:
            time.sleep(2)  # the session is up before the line goes
            attach.stdin.write(b"hello\n")
            attach.stdin.flush()
            got = read_until(attach.stdout, b"got:hello", 30)
            assert b"got:hello" in got, (got, attach.poll())
        finally:
            attach.kill()
    for name in ("web", "reader"):
        delete(control_plane, name)


def read_until(stream, want: bytes, timeout: float) -> bytes:
    seen, deadline = b"", time.monotonic() + timeout
    while want not in seen and time.monotonic() < deadline:
        if select.select([stream], [], [], 1)[0]:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
    return seen


def tty_session(argv: list[str], want: bytes) -> bytes:
    """Runs kubectl on a pseudo-terminal (what -it needs) and returns what it printed once `want` came."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while want not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert want in seen and b"/dev/pts/" in seen, seen
        proc.wait(timeout=30)
        return seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_wrong_identities_are_refused_until_bound(control_plane, kubelet, kubepods, tmp_path):
    assert control_plane.ca is not None
    running(control_plane, tmp_path, "quiet", {"name": "c", "image": BUSYBOX, "command": ["sh", "-c",
                                                                                            "echo hi; sleep 3600"]})
    logs_path = "/containerLogs/default/quiet/c"
    alice = control_plane.ca.issue("alice", "alice")
    as_alice = (str(alice.cert), str(alice.key))
    r = get(control_plane, logs_path, cert=as_alice)
    assert r.status_code == 403
    assert "Forbidden (user=alice, verb=get, resource=nodes, subresource=proxy)" in r.text
    control_plane.kubectl("create", "serviceaccount", "viewer")
    token = control_plane.kubectl("create", "token", "viewer").stdout.strip()
    r = get(control_plane, "/stats/summary", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 403 and "user=system:serviceaccount:default:viewer" in r.text
    assert "subresource=stats" in r.text

    control_plane.kubectl("create", "clusterrole", "node-proxy", "--verb=get,create", "--resource=nodes/proxy")
    control_plane.kubectl("create", "clusterrolebinding", "alice-node-proxy", "--clusterrole=node-proxy",
                          "--user=alice")
    r = wait_for("alice allowed", lambda: (lambda r: r if r.status_code == 200 else None)(
        get(control_plane, logs_path, cert=as_alice)), timeout=20)
    assert r.text == "hi\n"
    assert get(control_plane, "/stats/summary", headers={"Authorization": f"Bearer {token}"}).status_code == 403
    assert get_pod(control_plane, "quiet")
    delete(control_plane, "quiet")
