"""The user's journey of issue 11 on `make cluster`: `kubectl create deployment` on a stock control plane ends in
reachable pods and a working Service on our node, for each pair of kubelet and runtime of the interop matrix;
and a pod finds the Service by its name through the cluster DNS (CoreDNS on our nodes, issue 24).

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
import threading
import time
from pathlib import Path

import pytest
import requests

from proto import api_pb2
from pykubelet.runtime import CRIRuntime
from pynode_cluster import cluster, components, coredns
from pynode_cluster.node import KUBELETS, RUNTIMES
from tests.kit.busybox import CACHE
from tests.kit.cluster_admin import get, http, kubectl, provision
from tests.kit.cri_images import HTTPD_PREVIOUS
from tests.kit.kubelet_node import BUSYBOX, HTTPD, wait_for

RESULTS = CACHE / "cluster-journey.md"
README = Path(__file__).resolve().parents[2] / "README.md"
README_BEGIN, README_END = "<!-- cluster-journey:begin -->", "<!-- cluster-journey:end -->"
REPLICAS = 3
NAMESPACE_LABEL = "io.kubernetes.pod.namespace"  # the kubelet's label on a container: its pod's namespace
# pairs that cannot walk the journey yet, and why (xfail, not hidden)
KNOWN: dict[tuple[str, str], str] = {}





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


def test_up_refuses_a_host_route_into_its_pod_cidrs():
    """A host that already routes part of the cluster's pod CIDRs (the Vagrant lab's host side routes
    10.244.i.0/24 to its node VMs) gets `make cluster` refused at once, naming the route, with nothing made;
    not a cluster half up that fails on `ip route add` ("File exists")."""
    subprocess.run(["ip", "link", "add", "pynctest0", "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "link", "set", "pynctest0", "up"], check=True)
        subprocess.run(["ip", "route", "add", "10.244.1.0/24", "dev", "pynctest0"], check=True)
        up = provision("up")
        assert up.returncode == 1, up.stdout + up.stderr
        assert "10.244.1.0/24 dev pynctest0 overlaps 10.244.0.0/16, the pods' CIDRs" in up.stdout, up.stdout
        assert not cluster.STATE.exists() and not Path(f"/sys/class/net/{cluster.BRIDGE}").exists()
    finally:
        subprocess.run(["ip", "link", "del", "pynctest0"], check=True)


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
                if any(part in name for part in ("kubelet", "cri", "containerd", "proxy")):
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


FETCH = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {} 80 | grep -q 'It works'"


def client_log(name: str, script: str) -> str:
    """The log of a busybox pod NAME on node-1 running `script` (dnsPolicy ClusterFirst, the default) until it
    says `done`, read with `kubectl logs` (through the API server and the node's kubelet server); the pod is
    deleted again. nc, not wget: the static busybox's wget crashes on name lookups."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"nodeName": "node-1", "terminationGracePeriodSeconds": 1, "containers": [
               {"name": "client", "image": BUSYBOX, "command": ["sh", "-c", f"{script}; echo done; sleep 3600"]}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    text = wait_for(f"the answers of {name}", lambda: (lambda out: "done" in out and out)(
        kubectl("logs", name, check=False).stdout), 90)
    kubectl("delete", "pod", name, "--wait=true", timeout=90)
    return text


def run_client(targets: list[str]) -> str:
    """Asks each target for / and says `ok TARGET` for each answer."""
    return client_log("client", "; ".join(f"if {FETCH.format(t)}; then echo ok {t}; else echo failed {t}; fi"
                                          for t in targets))


def dns_client(names: list[str]) -> str:
    """Shows its resolv.conf, asks the cluster DNS for the first name with nslookup, then for each name asks the
    DNS for its address (busybox's own resolver) and fetches / from that address, saying `ok NAME` for each
    answer. busybox's nslookup applies the search path to a name without a dot only, so a name is either
    whole or one word."""
    fetch = FETCH.format('"$ip"')
    return client_log("dns-client", f"cat /etc/resolv.conf; echo ---; nslookup {names[0]}; echo ---; " + "; ".join(
        f"ip=$(nslookup {n} | awk '/^Address/ {{a = $2}} END {{print a}}'); "
        f"if {fetch}; then echo ok {n}; else echo failed {n} at $ip; fi" for n in names))


def cluster_pods() -> list[dict]:
    """The cluster's own pods (CoreDNS; with kubeadm the control plane's static pods and kube-proxy too), which
    stay on the nodes whatever the journey does."""
    return get("pods", "-n", coredns.NAMESPACE)


def sandbox_uid(pod: dict) -> str:
    """The uid of the pod's sandbox: a static pod's is the kubelet's own pod's, which its mirror pod names."""
    return pod["metadata"].get("annotations", {}).get("kubernetes.io/config.mirror") or pod["metadata"]["uid"]


def web_pods() -> list[dict]:
    return [p for p in get("pods", "-l", "app=web") if not p["metadata"].get("deletionTimestamp")]


def nodes_hold_only(pods: list[dict]) -> bool:
    """Whether the nodes hold exactly `pods` and the cluster's own: a ready sandbox for each (no other) and
    host-local IPs for their IPs (no other)."""
    state = cluster.Record.load()
    assert state is not None
    pods = pods + cluster_pods()
    want_uids = {sandbox_uid(p) for p in pods}
    want_ips = {p["status"].get("podIP") for p in pods if not p["spec"].get("hostNetwork")}
    uids, ips = set(), set()
    for record in state.nodes:
        node = record.node()
        client = CRIRuntime(node.endpoint, timeout=30)
        try:
            uids |= {s.metadata.uid for s in client.list_pod_sandbox() if s.state == api_pb2.SANDBOX_READY}
        finally:
            client.close()
        ips |= {p.name for p in (node.dir / "ipam").rglob("*") if p.is_file() and p.name[0].isdigit()}
    return uids == want_uids and ips == want_ips


def kubelet_events(pods: list[dict]) -> dict[str, set[str]]:
    """The reasons of the events the kubelet reported about each of `pods` (by name)."""
    names = {p["metadata"]["name"] for p in pods}
    reasons: dict[str, set[str]] = {n: set() for n in names}
    for e in get("events"):
        source = e.get("reportingComponent") or e.get("source", {}).get("component")
        if e["involvedObject"].get("kind") == "Pod" and e["involvedObject"]["name"] in names and source == "kubelet":
            reasons[e["involvedObject"]["name"]].add(e["reason"])
    return reasons


class ServiceClient(threading.Thread):
    """Asks the Service for / over a new connection, again and again, until stopped; keeps every failure."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stopped, self.answers = url, threading.Event(), 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stopped.is_set():
            started = time.time()
            try:
                r = requests.get(self.url, timeout=3)
                ok = r.ok and "It works!" in r.text
                why = f"HTTP {r.status_code}"
            except requests.RequestException as e:
                ok, why = False, str(e)
            if ok:
                self.answers += 1
            else:
                self.failures.append(f"asked at {time.strftime('%H:%M:%S', time.localtime(started))}"
                                     f".{int(started * 1000) % 1000:03d}: {why}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


def journey(nodes: int = 1, replicas: int = REPLICAS, workers: set[str] | None = None, scale: int = 10) -> None:
    """`workers`: the nodes the deployment spreads over (default: every node; a kubeadm control plane's taint
    keeps it off its node); `scale`: how many replicas it scales up to."""
    every = {f"node-{i}" for i in range(1, nodes + 1)}
    names = workers or every
    kubectl("create", "deployment", "web", f"--image={HTTPD_PREVIOUS}", f"--replicas={replicas}")
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
    # kubectl logs and exec: the API server asks the pod's kubelet (its :10250 server on the node's address)
    for pod in pods:
        name = pod["metadata"]["name"]
        assert "httpd stand-in" in kubectl("logs", name).stdout
        assert "httpd-foreground" in kubectl("exec", name, "--", "cat", "/proc/1/cmdline").stdout
    assert "usr\n" in kubectl("exec", "deploy/web", "--", "ls", "/").stdout
    # the API server's own calls into the pod network (its pod proxy here; webhooks and aggregated API servers
    # alike): the control plane routes to every node's pod CIDR
    for pod in pods:
        assert "It works!" in kubectl("get", "--raw", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}"
                                      ":80/proxy/").stdout
    # the kubelet's events for each pod, the same set from both kubelets
    started = {"Pulled", "Created", "Started"}
    wait_for(f"the kubelet's events {sorted(started)} for every pod", lambda: all(
        started <= r for r in kubelet_events(pods).values()), 30)
    # a ClusterIP Service in front of the deployment answers from the host (kube-proxy's DNAT on the node)
    kubectl("expose", "deployment", "web", "--port=80")
    cluster_ip = json.loads(kubectl("get", "service", "web", "-o", "json").stdout)["spec"]["clusterIP"]
    assert "It works!" in wait_for(f"the Service at {cluster_ip}", lambda: http(f"http://{cluster_ip}/"), 60)
    # and from a pod on node-1: every web pod by IP (on other nodes too) and the Service
    targets = [p["status"]["podIP"] for p in pods] + [cluster_ip]
    client_log = run_client(targets)
    for target in targets:
        assert f"ok {target}\n" in client_log, client_log
    # and by its name: CoreDNS runs on our node(s) behind the kube-dns Service at the kubelets' clusterDNS
    dns = get("pods", "-n", coredns.NAMESPACE, "-l", "k8s-app=kube-dns")
    assert len(dns) == coredns.REPLICAS and all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] in every
                                                for p in dns), [p["status"] for p in dns]
    names_log = dns_client(["web.default.svc.cluster.local", "web"])
    resolv, looked_up, fetched = names_log.split("---\n")
    assert f"nameserver {components.DNS_IP}\n" in resolv and "options ndots:5" in resolv, resolv
    assert "search default.svc.cluster.local svc.cluster.local cluster.local" in resolv, resolv
    assert f"Address: {cluster_ip}\n" in looked_up, looked_up
    for name in ("web.default.svc.cluster.local", "web"):
        assert f"ok {name}\n" in fetched, names_log

    # scale up: `scale` pods running on the node(s); back to 1: the others terminated (Killing), their sandboxes
    # and IPs gone
    kubectl("scale", "deployment/web", f"--replicas={scale}")
    kubectl("rollout", "status", "deployment/web", "--timeout=180s", timeout=210)
    many = web_pods()
    assert len(many) == scale and all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] in names
                                      for p in many)
    wait_for(f"a ready sandbox and an IP on the nodes for each of the {scale} pods", lambda: nodes_hold_only(many),
             30)
    kubectl("scale", "deployment/web", "--replicas=1")
    one = wait_for(f"{scale - 1} pods gone", lambda: (lambda p: p if len(get("pods", "-l", "app=web")) == 1
                                                       else None)(web_pods()), 120)
    gone = [p for p in many if p["metadata"]["uid"] != one[0]["metadata"]["uid"]]
    assert len(gone) == scale - 1
    wait_for("only the remaining pod's sandbox and IP on the nodes", lambda: nodes_hold_only(one), 60)
    wait_for(f"the kubelet's Killing event for each of the {scale - 1}", lambda: all(
        "Killing" in r for r in kubelet_events(gone).values()), 30)

    # hairpin: the one web pod reaches the Service whose only endpoint is itself (the bridge sends the packet
    # back out of the port it came in on: hairpinMode on the pod's bridge port)
    assert "It works!" in wait_for("the pod answering itself through the Service", lambda: kubectl(
        "exec", "deploy/web", "--", "sh", "-c", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {cluster_ip} 80",
        check=False).stdout, 30)

    # a rolling update to a new image tag with no request to the Service failing, made safe as users do:
    patch = {"spec": {
        # never fewer ready pods than wanted: the new pod comes up (and gets ready) before an old one goes
        "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {"spec": {"terminationGracePeriodSeconds": 15, "containers": [{
            "name": "httpd",
            # the new pod is an endpoint only once httpd answers, not as soon as its process started
            "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1},
            # a terminating pod leaves the endpoints at once, but kube-proxy rewrites the node's rules a moment
            # later (seconds on this 2-core machine with two nodes; once, under CI's load, a connection made as a
            # 5 s wait ran out timed out): httpd keeps serving meanwhile, and gets SIGTERM only after this
            "lifecycle": {"preStop": {"sleep": {"seconds": 10}}}}]}}}}
    kubectl("patch", "deployment/web", "--type=strategic", "-p", json.dumps(patch))
    kubectl("rollout", "status", "deployment/web", "--timeout=120s", timeout=150)
    web = wait_for("one web pod, with its readiness probe", lambda: (lambda p: p if len(p) == 1 and "readinessProbe"
                   in p[0]["spec"]["containers"][0] else None)(get("pods", "-l", "app=web")), 60)
    # the pod this patch replaced had no preStop, so it went at once while kube-proxy still sent it requests:
    # the zero-failure check starts once the Service leads only to the new pod (20 answers in a row)
    ip = web[0]["status"]["podIP"]
    wait_for(f"the Service's endpoints down to {ip}", lambda: [a for s in get(
        "endpointslices", "-l", "kubernetes.io/service-name=web") for e in s.get("endpoints") or []
        for a in e["addresses"]] == [ip], 30)
    streak = [0]

    def answers_in_a_row() -> bool:
        streak[0] = streak[0] + 1 if "It works!" in http(f"http://{cluster_ip}/", timeout=1) else 0
        return streak[0] >= 20
    wait_for("20 answers in a row from the Service", answers_in_a_row, 60, interval=0.05)
    client = ServiceClient(f"http://{cluster_ip}/")
    client.start()
    try:
        time.sleep(1)
        kubectl("set", "image", "deployment/web", f"httpd={HTTPD}")
        kubectl("rollout", "status", "deployment/web", "--timeout=120s", timeout=150)
        updated = wait_for("the old pod gone", lambda: (lambda p: p if len(p) == 1 else None)(
            get("pods", "-l", "app=web")), 60)
        assert updated[0]["spec"]["containers"][0]["image"] == HTTPD
        time.sleep(1)
    finally:
        client.stop()
    assert client.answers > 20 and not client.failures, (client.answers, client.failures)

    # deleting the deployment leaves nothing on the node: no pod, no running container, no ready sandbox, no IP
    kubectl("delete", "service", "web")
    kubectl("delete", "deployment", "web", "--wait=true", timeout=90)
    wait_for("the pods gone", lambda: not get("pods", "-l", "app=web"), 90)
    wait_for("no ready sandbox and no IP on the nodes", lambda: nodes_hold_only([]), 60)
    state = cluster.Record.load()
    assert state is not None
    for record in state.nodes:
        cri = CRIRuntime(record.node().endpoint, timeout=30)
        try:
            wait_for("no running container on the node but the cluster's", lambda cri=cri: not any(
                c.state == api_pb2.CONTAINER_RUNNING and c.labels.get(NAMESPACE_LABEL) != coredns.NAMESPACE
                for c in cri.list_containers()), 60)
        finally:
            cri.close()
