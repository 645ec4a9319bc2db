"""Reliability of `make cluster` with our pair (pykubelet on pyruntime-cri), issue 11: garbage in at every edge
of the journey, the kubelet's default max-pods on the one node, and kill -9 of every daemon a pod depends on
during a scale-up, each checked with the real kubectl and then on the node itself: what the runtime holds
(sandboxes, containers), what host-local allocated, the veths, cgroups and mounts, so a bug that leaks or
doubles something shows as such and not only as a slow pod.

One cluster for the module (tests scale, they don't recreate); the last test takes it down itself, so the
daemons it restarted are not left to the leak check.
"""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import threading
import time
import warnings
from collections import Counter
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from proto import api_pb2
from pykubelet.pods.termination import cgroup_hierarchies
from pykubelet.runtime import CRIRuntime, Unavailable
from pynode_cluster import cluster, components, coredns, hosts
from pynode_cluster.node import Node
from pynode_os import mountinfo
from tests.kit import cluster_registry
from tests.kit.cluster_admin import get, http, kubectl
from tests.kit.kubelet_node import BUSYBOX, HTTPD, wait_for

NODE = "node-1"
MISSING_IMAGE = "registry.k8s.io/e2e-test-images/no-such-image:1.0"
ID = re.compile(r"[0-9a-f]{64}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

pytestmark = pytest.mark.timeout(900)



def apply(obj: dict) -> None:
    kubectl("apply", "-f", "-", input=json.dumps(obj))



def pod(name: str) -> dict:
    return json.loads(kubectl("get", "pod", name, "-o", "json").stdout)


def events(uid: str) -> list[dict]:
    return get("events", "--field-selector", f"involvedObject.uid={uid}")



def bare_pod(name: str, container: dict, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", **container}], **spec}}


def deployment(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"terminationGracePeriodSeconds": 1,
                                           "containers": [{"name": "web", "image": HTTPD}]}}}}


def delete(kind: str, name: str) -> None:
    kubectl("delete", kind, name, "--wait=true", "--ignore-not-found", timeout=180)


def waiting(status: dict) -> dict:
    cs = status.get("containerStatuses") or [{}]
    return cs[0].get("state", {}).get("waiting") or {}


# ---- the node as it is ---------------------------------------------------------------------------------------

class NodeView:
    """What the node holds right now, seen from below the kubelet: the CRI runtime's sandboxes and containers,
    host-local's allocations, the host-side veths, the pods' cgroups and the mounts under the node's dirs."""

    def __init__(self, node: Node, netns: str) -> None:
        self.node, self.netns = node, netns
        client = CRIRuntime(node.endpoint, timeout=30)
        try:
            self.sandboxes = list(client.list_pod_sandbox())
            self.containers = list(client.list_containers())
            self.ready = {s.id: s for s in self.sandboxes if s.state == api_pb2.SANDBOX_READY}
            self.ips = {}
            for sid in self.ready:
                with_ip = client.pod_sandbox_status(sid).status.network.ip
                self.ips[sid] = with_ip
        finally:
            client.close()
        self.allocated = sorted(p.name for p in (node.dir / "ipam").rglob("*")
                                if p.is_file() and p.name[0].isdigit())
        out = hosts.ip("-o", "link", "show", "type", "veth", netns=netns).stdout
        self.veths = sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
                            if line.split(":")[1].strip().split("@")[0] != "eth0")
        self.pod_cgroups: dict[str, set[str]] = {}  # pod uid -> the cgroups in it
        for hierarchy in cgroup_hierarchies():
            top = hierarchy / node.cgroup_root.lstrip("/")
            for pod_dir in top.rglob("pod*") if top.is_dir() else ():
                if pod_dir.is_dir():
                    self.pod_cgroups.setdefault(pod_dir.name[3:], set()).update(
                        p.name for p in pod_dir.iterdir() if p.is_dir())
        roots = (f"{node.dir}/", f"{node.run}/")
        self.mounts = [m.mount_point for m in mountinfo.read() if m.mount_point.startswith(roots)]

    def volume_uids(self) -> set[str]:
        """The pods the kubelet has volumes mounted for."""
        return {m.split("/kubelet/pods/")[1].split("/")[0] for m in self.mounts if "/kubelet/pods/" in m}

    def ready_uids(self) -> Counter:
        return Counter(s.metadata.uid for s in self.ready.values())

    def of(self, uids: set[str]) -> list[str]:
        """Anything of the pods `uids` still on the node."""
        left = [f"sandbox {s.id[:12]} ({s.metadata.name}, state {s.state})" for s in self.sandboxes
                if s.metadata.uid in uids]
        left += [f"container {c.id[:12]} ({c.metadata.name})" for c in self.containers
                 if c.labels.get("io.kubernetes.pod.uid") in uids]
        left += [f"cgroup pod{uid}" for uid in uids if uid in self.pod_cgroups]
        left += [f"mount {m}" for m in self.mounts if any(uid in m for uid in uids)]
        return left

    def problems(self) -> list[str]:
        """What is wrong whatever the pods: two ready sandboxes of a pod, an IP that no ready sandbox holds
        (or one held twice), a veth, cgroup or mount of nothing the runtime knows."""
        out = [f"pod {uid} has {n} ready sandboxes" for uid, n in self.ready_uids().items() if n > 1]
        held = sorted(self.ips.values())
        if held != self.allocated:
            out.append(f"host-local allocated {self.allocated}, the ready sandboxes hold {held}")
        if len(self.veths) != len(self.ready):
            out.append(f"{len(self.veths)} veths for {len(self.ready)} ready sandboxes: {self.veths}")
        ids = {s.id for s in self.sandboxes} | {c.id for c in self.containers}
        uids = {s.metadata.uid for s in self.sandboxes}
        for uid, children in self.pod_cgroups.items():
            if uid not in uids:
                out.append(f"cgroup pod{uid} of no sandbox")
            out += [f"cgroup pod{uid}/{c} of no sandbox or container" for c in children
                    if c not in ids and c != "pause"]
        for m in self.mounts:  # the kubelet's volumes of a pod are there before its sandbox (see volume_uids)
            out += [f"mount {m} of nothing the runtime knows" for found in ID.findall(m)
                    if found not in ids and found not in uids and "/kubelet/pods/" not in m]
        return out


def detached(start, *args, **kwargs):
    """`start` (cluster.up, Daemons.restart) here: the daemons it leaves running are detached on purpose, so
    their Popen objects' "still running" warnings are no news."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        return start(*args, **kwargs)


@pytest.fixture(scope="module")
def node():
    out = io.StringIO()
    assert detached(cluster.up, 1, "pykubelet", "pyruntime-cri", images=cluster_registry.start, out=out) == 0, \
        out.getvalue()
    record = cluster.Record.load()
    assert record is not None
    try:
        # what the node makes once for its first pod (the QoS cgroups, the runtime's launcher, the images)
        # belongs to the node, not to the first test
        apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "warm-up"},
               "spec": {"terminationGracePeriodSeconds": 1, "containers": [
                   {"name": "web", "image": HTTPD}, {"name": "sh", "image": BUSYBOX, "command": ["sleep", "3600"]}]}})
        wait_for("the warm-up pod Running", lambda: pod("warm-up")["status"]["phase"] == "Running", 90)
        delete("pod", "warm-up")
        yield record.nodes[0]
    finally:
        cluster.down(out=io.StringIO())


def view(node) -> NodeView:
    return NodeView(node.node(), node.netns)


def cluster_uids() -> set[str]:
    """The cluster's own pods (CoreDNS, kube-system), which stay on the node whatever a test does."""
    return {p["metadata"]["uid"] for p in get("pods", "-n", coredns.NAMESPACE)}


def only_the_clusters(v: NodeView) -> list[str]:
    """What the node holds besides the cluster's own pods: their sandboxes, containers, IPs and veths only."""
    own = cluster_uids()
    left = [f"sandbox {s.id[:12]} ({s.metadata.name})" for s in v.sandboxes if s.metadata.uid not in own]
    left += [f"container {c.id[:12]} ({c.metadata.name})" for c in v.containers
             if c.labels.get("io.kubernetes.pod.uid") not in own]
    ips = sorted(ip for sid, ip in v.ips.items() if v.ready[sid].metadata.uid in own)
    if v.allocated != ips:
        left.append(f"host-local allocated {v.allocated}, the cluster's pods hold {ips}")
    if len(v.veths) != len(ips):
        left.append(f"{len(v.veths)} veths for the cluster's {len(ips)} pods: {v.veths}")
    return left


def settled(node, uids: Collection[str] = (), timeout: float = 60) -> NodeView:
    """The node once nothing of `uids` is left and nothing is wrong (the kubelet and runtime clean up
    asynchronously); the assertion names what is left."""
    last: list[str] = []

    def check():
        nonlocal last
        try:
            v = view(node)
        except Unavailable as e:  # a runtime restarted a moment ago
            last = [str(e)]
            return None
        last = v.of(set(uids)) + v.problems()
        return v if not last else None
    try:
        return wait_for("the node settled", check, timeout, interval=1)
    except TimeoutError:
        raise AssertionError(f"left on the node: {last}") from None


def dump_logs() -> None:
    for name, path in cluster.logs().items():
        if "kubelet" in name or "cri" in name:
            print(f"--- {name}\n{Path(path).read_text(errors='replace')[-4000:]}")


# ---- garbage in ----------------------------------------------------------------------------------------------

class Watch:
    """`kubectl get pod NAME -w`: every version of the pod's first container's waiting reason, in order (a
    state may last only until the kubelet's next pass, too short for polling to see)."""

    def __init__(self, name: str) -> None:
        self.proc = subprocess.Popen(
            [components.peer("kubectl"), "--kubeconfig", str(cluster.admin_kubeconfig()), "get", "pod", name, "-w",
             "-o", 'jsonpath={.status.containerStatuses[0].state.waiting.reason}{"\\n"}'],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout
        self.reasons: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.stdout:
            if line.strip():
                self.reasons.append(line.strip())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.thread.join(5)
        self.stdout.close()


def test_image_that_does_not_exist(node):
    apply(bare_pod("no-image", {"image": MISSING_IMAGE}))
    uid = pod("no-image")["metadata"]["uid"]
    watch = Watch("no-image")
    try:
        wait_for("ErrImagePull then ImagePullBackOff", lambda: "ErrImagePull" in watch.reasons and
                 "ImagePullBackOff" in watch.reasons[watch.reasons.index("ErrImagePull"):], 90)
    finally:
        watch.close()
    w = waiting(pod("no-image")["status"])
    assert MISSING_IMAGE in w.get("message", ""), w
    kinds = {(e["reason"], e["type"]) for e in events(uid)}
    assert ("Failed", "Warning") in kinds and "BackOff" in {reason for reason, _ in kinds}, kinds
    failed = [e["message"] for e in events(uid) if e["reason"] == "Failed"]
    assert any(MISSING_IMAGE in m for m in failed), failed
    delete("pod", "no-image")
    settled(node, {uid})


def test_command_that_does_not_exist(node):
    apply(bare_pod("no-command", {"image": BUSYBOX, "command": ["/no/such/binary"]}))
    uid = pod("no-command")["metadata"]["uid"]

    def said():
        status = (pod("no-command")["status"].get("containerStatuses") or [{}])[0]
        texts = [json.dumps(status.get("state", {})), json.dumps(status.get("lastState", {}))]
        return status if any("/no/such/binary" in t for t in texts) else None
    status = wait_for("a status naming the missing executable", said, 60, interval=0.5)
    last = status.get("lastState", {}).get("terminated") or status.get("state", {}).get("terminated") or {}
    w = status.get("state", {}).get("waiting") or {}
    assert last.get("reason") in ("StartError", "ContainerCannotRun") or w.get("reason") in (
        "RunContainerError", "CreateContainerError"), status
    assert not status.get("ready")
    failed = [e["message"] for e in events(uid) if e["type"] == "Warning"]
    assert any("/no/such/binary" in m for m in failed), failed
    delete("pod", "no-command")
    settled(node, {uid})


def test_volume_that_does_not_exist(node):
    apply(bare_pod("no-configmap", {"image": BUSYBOX, "command": ["sleep", "3600"],
                                    "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                   volumes=[{"name": "v", "configMap": {"name": "no-such-configmap"}}]))
    apply(bare_pod("no-hostpath", {"image": BUSYBOX, "command": ["sleep", "3600"],
                                   "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                   volumes=[{"name": "v", "hostPath": {"path": "/no/such/dir", "type": "Directory"}}]))
    uids = {name: pod(name)["metadata"]["uid"] for name in ("no-configmap", "no-hostpath")}
    for name, what in (("no-configmap", "no-such-configmap"), ("no-hostpath", "/no/such/dir")):
        mount_failed = wait_for(f"{name}: a FailedMount event naming {what}", lambda uid=uids[name], what=what: [
            e for e in events(uid) if e["reason"] == "FailedMount" and what in e["message"]], 60)
        assert mount_failed[0]["type"] == "Warning"
        p = pod(name)
        assert p["status"]["phase"] == "Pending", p["status"]
        assert waiting(p["status"]).get("reason") == "ContainerCreating", p["status"]
        assert not [s for s in view(node).sandboxes if s.metadata.uid == uids[name]], \
            "a sandbox for a pod whose volumes cannot be mounted"
    # the missing configMap made: the pod starts
    apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no-such-configmap"}, "data": {"k": "v"}})
    wait_for("no-configmap Running", lambda: pod("no-configmap")["status"]["phase"] == "Running", 90)
    for name in uids:
        delete("pod", name)
    kubectl("delete", "configmap", "no-such-configmap")
    settled(node, set(uids.values()))


def node_ready() -> dict:
    n = json.loads(kubectl("get", "node", NODE, "-o", "json").stdout)
    return next(c for c in n["status"]["conditions"] if c["type"] == "Ready")


def test_broken_cni_config(node):
    n = node.node()
    conf = n.cni_conf / "10-pynode.conflist"
    good = conf.read_text()
    apply(bare_pod("steady", {"image": HTTPD}))  # a pod running before the network breaks keeps running
    steady = wait_for("steady Running", lambda: (lambda p: p if p["status"]["phase"] == "Running" else None)(
        pod("steady")), 60)
    try:
        conf.write_text("{ this is not a network config")
        ready = wait_for("the node NotReady for its network", lambda: (lambda c: c if c["status"] == "False"
                                                                       else None)(node_ready()), 60)
        assert "NetworkReady=false" in ready["message"] and "NetworkPluginNotReady" in ready["message"], ready
        assert str(n.cni_conf) in ready["message"], ready
        # a pod bound to the node waits: no sandbox, nothing half made
        apply(bare_pod("no-network", {"image": HTTPD}, nodeName=NODE))
        uid = pod("no-network")["metadata"]["uid"]
        w = wait_for("no-network waiting for the network", lambda: (lambda w: w if "network is not ready" in
                                                                    w.get("message", "") else None)(
            waiting(pod("no-network")["status"])), 30)
        assert w["reason"] == "ContainerCreating" and "NetworkPluginNotReady" in w["message"], w
        for _ in range(10):  # not one sandbox made, not even for a moment
            v = view(node)
            made = [x for x in v.of({uid}) if not x.startswith("mount ")]  # its volumes are mounted already
            assert not made and not v.problems(), made + v.problems()
            time.sleep(0.3)
        p = pod("no-network")
        assert p["status"]["phase"] == "Pending" and not p["status"].get("podIP"), p["status"]
        warnings = {e["reason"]: e["message"] for e in events(uid) if e["type"] == "Warning"}
        assert "NetworkPluginNotReady" in warnings.get("NetworkNotReady", ""), warnings
    finally:
        conf.write_text(good)
    wait_for("the node Ready again", lambda: node_ready()["status"] == "True", 60)
    ip = wait_for("no-network Running with an IP", lambda: (lambda p: p["status"]["phase"] == "Running" and
                                                            p["status"].get("podIP"))(pod("no-network")), 90)
    assert "It works!" in wait_for(f"no-network at {ip} answering", lambda: http(f"http://{ip}/"), 30)
    after = pod("steady")
    assert after["status"]["containerStatuses"] == steady["status"]["containerStatuses"], after["status"]
    assert "It works!" in http(f"http://{after['status']['podIP']}/")
    delete("pod", "no-network")
    delete("pod", "steady")
    settled(node, {uid, steady["metadata"]["uid"]})


# ---- max pods ------------------------------------------------------------------------------------------------

def test_max_pods(node):
    capacity = json.loads(kubectl("get", "node", NODE, "-o", "json").stdout)["status"]["allocatable"]
    assert capacity["pods"] == "110", capacity
    assert node.pod_cidr.endswith("/24")  # 254 addresses for 110 pods
    many = 110 - len(cluster_uids())  # the node full, with the cluster's own pods
    started = time.monotonic()
    apply(deployment("many", many))
    try:
        kubectl("rollout", "status", "deployment/many", "--timeout=300s", timeout=330)
    except BaseException:
        dump_logs()
        raise
    ready_in = time.monotonic() - started
    pods = get("pods", "-l", "app=many")
    assert len(pods) == many and all(p["status"]["phase"] == "Running" for p in pods)
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == many
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda ip: http(f"http://{ip}/"), ips))
    silent = [ip for ip, a in zip(ips, answers, strict=True) if "It works!" not in a]
    assert not silent, silent
    v = view(node)
    assert len(v.ready) == 110 and not v.problems(), v.problems()
    uids = {p["metadata"]["uid"] for p in pods}
    checked = time.monotonic()
    delete("deployment", "many")
    wait_for("the pods gone", lambda: not get("pods", "-l", "app=many"), 180)
    gone = time.monotonic()
    left = settled(node, uids, 120)
    assert not only_the_clusters(left), only_the_clusters(left)
    print(f"{many} pods ready in {ready_in:.1f} s, checked in {checked - started - ready_in:.1f} s, gone in "
          f"{gone - checked:.1f} s, node clean in {time.monotonic() - gone:.1f} s")


# ---- kill -9 ---------------------------------------------------------------------------------------------------

def snapshot(name: str) -> dict[str, tuple[str, int]]:
    """Each Running pod of the deployment: uid -> (container id, restart count)."""
    out = {}
    for p in get("pods", "-l", f"app={name}"):
        for c in p["status"].get("containerStatuses", []):
            if p["status"]["phase"] == "Running" and "running" in c.get("state", {}) and c.get("containerID"):
                out[p["metadata"]["uid"]] = (c["containerID"], c["restartCount"])
    return out


def converged(name: str, replicas: int, timeout: float = 120) -> list[dict]:
    def check():
        pods = [p for p in get("pods", "-l", f"app={name}") if not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == replicas and all(
            p["status"]["phase"] == "Running" and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
            for p in pods) else None
    return wait_for(f"{replicas} pods of {name} Running and ready", check, timeout, interval=1)


def kill(name: str) -> None:
    proc = cluster.daemons().process(name)
    assert proc is not None, f"{name} is not running"
    os.kill(proc.pid, signal.SIGKILL)
    hosts.ended(proc, 10)


def supervisor_of(container_id: str) -> psutil.Process:
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] and p.info["cmdline"][:2] == ["pyruntime-supervisor", container_id]:
            return p
    raise AssertionError(f"no pyruntime-supervisor for {container_id}")


def apiserver_ready() -> bool:
    try:
        return kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def test_kill_during_scale_up(node):
    name = "chaos"
    runtime, kubelet = f"{NODE}-pyruntime-cri", f"{NODE}-pykubelet"
    apply(deployment(name, 6))
    converged(name, 6)
    rounds = [[kubelet], [runtime], ["supervisor"], ["kube-apiserver"], ["etcd"],
              [kubelet, runtime, "supervisor", "kube-apiserver", "etcd"]]
    replicas = 6
    seen: set[str] = set()
    try:
        for victims in rounds:
            replicas = 30 if len(victims) > 1 else replicas + 4
            before = snapshot(name)
            spared, running = set(before), len(before)
            kubectl("scale", f"deployment/{name}", f"--replicas={replicas}")
            # the scale-up under way: the new pods bound, their sandboxes and containers being made
            wait_for("the new pods bound", lambda running=running: sum(
                1 for p in get("pods", "-l", f"app={name}") if p["spec"].get("nodeName")) > running, 10, interval=0.1)
            for victim in victims:
                if victim == "supervisor":
                    uid = sorted(before)[0]
                    spared.discard(uid)
                    supervisor_of(before[uid][0].split("://")[-1]).kill()
                else:
                    kill(victim)
            time.sleep(1)
            for victim in victims:
                if victim != "supervisor":
                    detached(cluster.daemons().restart, victim)
            if {"kube-apiserver", "etcd"} & set(victims):
                wait_for("kube-apiserver ready", apiserver_ready, 90, interval=1)
            pods = converged(name, replicas)
            v = settled(node, timeout=60)
            by_uid = {p["metadata"]["uid"]: p for p in pods}
            seen |= set(by_uid)
            own = cluster_uids()
            assert set(v.ready_uids()) - own == set(by_uid), (set(v.ready_uids()), set(by_uid))
            assert v.volume_uids() <= set(by_uid) | own, v.mounts
            after = snapshot(name)
            restarted = {uid: (before[uid], after.get(uid)) for uid in spared if after.get(uid) != before[uid]}
            assert not restarted, f"after killing {victims}: containers of unchanged pods restarted: {restarted}"
    except BaseException:
        dump_logs()
        raise
    delete("deployment", name)
    wait_for("the pods gone", lambda: not get("pods", "-l", f"app={name}"), 120)
    left = settled(node, seen, timeout=90)
    assert not only_the_clusters(left), only_the_clusters(left)
    # the cluster goes with this test: the daemons restarted here are its own
    assert cluster.down(out=io.StringIO()) == 0
