"""pykubelet runs the pods bound to its node through CRI (containerd 1.6 here): a web server pod reaches
Running and Ready with its IP and answers there; a crash-looping container restarts with a growing back-off
and its restartCount grows; `kubectl delete pod` stops the container with SIGTERM and leaves nothing on the
node (no sandbox, no container, no IP reservation, no pod cgroup) before the pod object goes.

Images come from the test registry through containerd's certs.d mirrors (tests/conformance/critest.py's
registry pieces), so nothing leaves the machine."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.pods.termination import cgroup_hierarchies
from tests.conformance.critest import critest_registry
from tests.kit.containerd_cri import containerd_cri
from tests.kit.controlplane import ControlPlane

NODE = "pynode-e2e-pods"
NODE_IP = "10.201.0.21"
PYKUBELET = Path(sys.executable).parent / "pykubelet"
HTTPD = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4"
BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.29-2"


def wait_for(what: str, check, timeout: float = 60, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    # no controller-manager here to make it; pods opt out of its token volume (volumes are not this test's)
    cp.kubectl("create", "serviceaccount", "default", "-n", "default")
    yield cp
    cp.stop()


def kubepods_dirs() -> set[Path]:
    return {p for h in cgroup_hierarchies() for top in h.glob("kubepods*") for p in [top, *top.rglob("*")]
            if p.is_dir()}


def remove_new_cgroups(before: set[Path]) -> None:
    """The kubepods cgroups made since `before` (empty by now), deepest first: the kubelet keeps kubepods
    and its QoS levels, as upstream's, so the test removes them."""
    for cgroup in sorted(kubepods_dirs() - before, key=lambda p: -len(p.parts)):
        try:
            cgroup.rmdir()
        except OSError:
            pass


@pytest.fixture(scope="module")
def containerd(tmp_path_factory):
    """containerd with the pod network already made (a sandbox run and removed): the bridge is the node's,
    not a test's. The CNI helper is off: its process outlives a pod by its idle time."""
    work = tmp_path_factory.mktemp("containerd-cri")
    cgroups_before = kubepods_dirs()
    with critest_registry(work / "mirror") as mirror, pytest.MonkeyPatch.context() as env:
        env.setenv("PYCNI_HELPER", "off")
        with containerd_cri(work / "cri", mirror.hosts_dir) as endpoint:
            client = cri.CRIRuntime(endpoint.url, timeout=60)
            warm_up = client.run_pod_sandbox(api_pb2.PodSandboxConfig(
                metadata=api_pb2.PodSandboxMetadata(name="warm-up", namespace="test", uid="warm-up"),
                linux=api_pb2.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/podwarm-up")))
            client.stop_pod_sandbox(warm_up)
            client.remove_pod_sandbox(warm_up)
            client.close()
            yield endpoint
    remove_new_cgroups(cgroups_before)


@pytest.fixture(scope="module")
def runtime(containerd):
    client = cri.CRIRuntime(containerd.url, timeout=30)
    yield client
    client.close()


class Kubelet:
    """The pykubelet process, which a test may kill -9 and start again."""

    def __init__(self, argv: list[str], work: Path) -> None:
        self.argv, self.log_path, self.pods_dir = argv, work / "pykubelet.log", work / "pods"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def kubelet(control_plane, containerd, tmp_path_factory):
    work = tmp_path_factory.mktemp("pykubelet")
    config = work / "kubelet.yaml"
    config.write_text(json.dumps({"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                                  "podLogsDir": str(work / "pods"), "syncFrequency": "10s"}))
    k = Kubelet([str(PYKUBELET), "--kubeconfig", str(control_plane.node_kubeconfig(NODE)), "--config", str(config),
                 "--container-runtime-endpoint", containerd.url, "--hostname-override", NODE, "--node-ip", NODE_IP,
                 "--root-dir", str(work / "root"), "-v", "1"], work)
    k.start()
    assert k.proc is not None
    wait_for("the node to register", lambda: k.proc.poll() is not None or control_plane.kubectl(
        "get", "node", NODE, check=False).returncode == 0)
    assert k.proc.poll() is None, k.log_path.read_text()[-3000:]
    yield k
    # pods are the kubelet's to remove: whatever a failed test left goes before the kubelet and the runtime
    control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)
    k.stop()


@pytest.fixture
def kubepods():
    before = kubepods_dirs()
    yield
    remove_new_cgroups(before)


def apply(cp: ControlPlane, tmp: Path, pod: dict) -> None:
    manifest = tmp / f"{pod['metadata']['name']}.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod", **pod}))
    cp.kubectl("apply", "-f", str(manifest))


def get_pod(cp: ControlPlane, name: str) -> dict:
    out = cp.kubectl("get", "pod", name, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def condition(pod: dict, kind: str) -> str:
    return next((c["status"] for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), "")


def pod_spec(name: str, container: dict, **spec) -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [container], "terminationGracePeriodSeconds": 10,
                     "automountServiceAccountToken": False, **spec}}


def on_node(runtime: cri.CRIRuntime, uid: str) -> tuple[list, list]:
    selector = {"io.kubernetes.pod.uid": uid}
    return (runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector=selector)),
            runtime.list_containers(api_pb2.ContainerFilter(label_selector=selector)))


def delete(cp: ControlPlane, name: str) -> None:
    cp.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s", timeout=90)


def test_pod_runs_ready_with_ip_and_answers(control_plane, kubelet, runtime, containerd, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("web", {"name": "httpd", "image": HTTPD,
                                                   "ports": [{"containerPort": 80}]}))
    try:
        pod = wait_for("web Running and Ready", lambda: (lambda p: p if p.get("status", {}).get("phase") == "Running"
                                                          and condition(p, "Ready") == "True" else None)(
            get_pod(control_plane, "web")), timeout=90)
        status = pod["status"]
        assert status["podIP"].startswith("10.235.") and status["podIPs"] == [{"ip": status["podIP"]}]
        assert status["hostIP"] == NODE_IP
        for kind in ("Initialized", "ContainersReady", "PodScheduled", "PodReadyToStartContainers"):
            assert condition(pod, kind) == "True", kind
        (cs,) = status["containerStatuses"]
        assert cs["name"] == "httpd" and cs["ready"] and cs["started"] and cs["restartCount"] == 0
        assert "running" in cs["state"] and cs["containerID"].startswith("containerd://")
        assert cs["imageID"]
        answer = wait_for("an answer", lambda: _get(f"http://{status['podIP']}/"), timeout=20)
        assert "It works!" in answer
        sandboxes, containers = on_node(runtime, pod["metadata"]["uid"])
        assert len(sandboxes) == 1 and len(containers) == 1
        sandbox = sandboxes[0]
        assert sandbox.metadata.name == "web" and sandbox.labels["io.kubernetes.pod.namespace"] == "default"
        assert containers[0].annotations["io.kubernetes.container.restartCount"] == "0"
        log_dir = kubelet.pods_dir / f"default_web_{pod['metadata']['uid']}"
        assert (log_dir / "httpd" / "0.log").exists()
    finally:
        delete(control_plane, "web")


def _get(url: str) -> str | None:
    try:
        return requests.get(url, timeout=2).text
    except requests.RequestException:
        return None


def test_crash_loop_backs_off_and_restart_count_grows(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("crash", {"name": "crash", "image": BUSYBOX,
                                                     "command": ["sh", "-c", "echo crashing; exit 3"]}))
    try:
        seen_backoff: list[dict] = []
        ready_in_backoff: list[str] = []
        restarts: dict[int, float] = {}

        def restarted_twice():
            p = get_pod(control_plane, "crash")
            for cs in p.get("status", {}).get("containerStatuses", []):
                restarts.setdefault(cs["restartCount"], time.monotonic())
                if cs["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff":
                    seen_backoff.append(cs)
                    ready_in_backoff.append(condition(p, "Ready"))
                if cs["restartCount"] >= 2 and seen_backoff:
                    return p
            return None

        pod = wait_for("two restarts with back-off", restarted_twice, timeout=60, interval=0.3)
        cs = seen_backoff[-1]
        assert "back-off 10s restarting failed container=crash" in cs["state"]["waiting"]["message"]
        assert cs["lastState"]["terminated"]["exitCode"] == 3
        assert cs["lastState"]["terminated"]["reason"] == "Error"
        assert pod["status"]["phase"] == "Running"  # restartPolicy Always: it is being restarted
        assert set(ready_in_backoff) == {"False"}
        # the first restart is at once, the second waits out 10 s from the exit
        assert restarts[2] - restarts[1] >= 8, restarts
        # at most the newest container and the newest dead one are kept
        _, containers = on_node(runtime, pod["metadata"]["uid"])
        assert 1 <= len(containers) <= 2
    finally:
        delete(control_plane, "crash")


def test_finished_pod_succeeds_and_gives_back_its_ip(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("once", {"name": "once", "image": BUSYBOX,
                                                    "command": ["sh", "-c", "echo done"]}, restartPolicy="Never"))
    try:
        pod = wait_for("once Succeeded", lambda: (lambda p: p if p.get("status", {}).get("phase") == "Succeeded"
                                                  else None)(get_pod(control_plane, "once")), timeout=60)
        (cs,) = pod["status"]["containerStatuses"]
        assert cs["state"]["terminated"]["exitCode"] == 0 and cs["state"]["terminated"]["reason"] == "Completed"
        assert cs["restartCount"] == 0
        sandboxes, containers = wait_for("the sandbox stopped", lambda: (lambda o: o if all(
            s.state == api_pb2.SANDBOX_NOTREADY for s in o[0]) else None)(on_node(runtime, pod["metadata"]["uid"])))
        assert len(sandboxes) == 1 and len(containers) == 1  # the container stays, for its logs
    finally:
        delete(control_plane, "once")


def test_delete_sends_sigterm_and_leaves_nothing(control_plane, kubelet, runtime, containerd, kubepods, tmp_path):
    script = "trap 'echo got SIGTERM; exit 0' TERM; echo ready; while true; do sleep 0.2; done"
    apply(control_plane, tmp_path, pod_spec("term", {"name": "term", "image": BUSYBOX,
                                                    "command": ["sh", "-c", script]}))
    pod = wait_for("term Running", lambda: (lambda p: p if p.get("status", {}).get("phase") == "Running" else None)(
        get_pod(control_plane, "term")), timeout=60)
    uid, ip = pod["metadata"]["uid"], pod["status"]["podIP"]
    log_file = kubelet.pods_dir / f"default_term_{uid}" / "term" / "0.log"
    wait_for("the container's first line", lambda: "ready" in log_file.read_text())
    with open(log_file) as log:  # read after deletion: the open file outlives its directory
        started = time.monotonic()
        delete(control_plane, "term")
        took = time.monotonic() - started
        assert "got SIGTERM" in log.read(), "the container did not see SIGTERM"
    assert took < 8, f"deletion took {took:.1f} s: the container did not end on SIGTERM"
    assert on_node(runtime, uid) == ([], [])
    assert not (kubelet.pods_dir / f"default_term_{uid}").exists()
    reservations = containerd.work / "ipam"
    assert not any(ip in p.name for p in reservations.rglob("*")), list(reservations.rglob("*"))
    assert not [p for h in cgroup_hierarchies() for p in h.glob(f"kubepods/**/pod{uid}")]


def test_kubelet_killed_and_restarted_recreates_nothing(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec("steady", {"name": "httpd", "image": HTTPD}))
    try:
        pod = wait_for("steady Ready", lambda: (lambda p: p if condition(p, "Ready") == "True" else None)(
            get_pod(control_plane, "steady")), timeout=60)
        uid = pod["metadata"]["uid"]
        before = on_node(runtime, uid)
        kubelet.kill()
        kubelet.start()
        # the restarted kubelet syncs every pod at once (its first relist); give it a few passes
        wait_for("the kubelet's pod workers", lambda: kubelet.log_path.read_text().count("starting pykubelet") == 2)
        time.sleep(5)
        after = on_node(runtime, uid)
        assert [s.id for s in after[0]] == [s.id for s in before[0]]
        assert [(c.id, c.state) for c in after[1]] == [(c.id, api_pb2.CONTAINER_RUNNING) for c in before[1]]
        cs = get_pod(control_plane, "steady")["status"]["containerStatuses"][0]
        assert cs["restartCount"] == 0 and cs["ready"] and "running" in cs["state"]
    finally:
        delete(control_plane, "steady")
        kubelet.stop()  # the restarted process is this test's: the leak check wants it gone (so: the last test)
