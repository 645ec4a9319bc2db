"""One node for the pykubelet end-to-end tests: the pykubelet process (which a test may kill -9 and start
again), the kubepods cgroups it makes, and the kubectl steps every pod test takes (apply a pod bound to
the node, read it back, wait for a condition, see what the runtime holds of it).

The fixtures that put these together (a control plane, a CRI runtime, a kubelet) are in
tests/e2e/conftest.py; a test module names its node with a module-level NODE and NODE_IP and may add
KubeletConfiguration fields with KUBELET_CONFIG."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.pods.termination import cgroup_hierarchies
from pynode_cluster.hosts import wait_for
from tests.kit.controlplane import ControlPlane, free_port
from tests.kit.cri_images import BUSYBOX, HTTPD  # noqa: F401  (the images the pod tests run)

PYKUBELET = Path(sys.executable).parent / "pykubelet"


def kubepods_dirs() -> set[Path]:
    """os.walk, not rglob: the running kubelet removes a finished pod's cgroup while this walks, and rglob
    raises on a directory that went away between listing and entering it."""
    return {Path(dirpath) for h in cgroup_hierarchies() for top in h.glob("kubepods*")
            for dirpath, _dirs, _files in os.walk(top)}


NODE_LEVEL = (("kubepods",), ("kubepods", "burstable"), ("kubepods", "besteffort"))


def node_level(cgroup: str | Path) -> bool:
    """kubepods and its QoS levels (cgroupfs names), which the kubelet keeps while it runs, as upstream's:
    no leak of a test. A pod's own cgroup (pod<uid>) is none of them."""
    path = Path(cgroup)
    for hierarchy in cgroup_hierarchies():
        if path.is_relative_to(hierarchy):
            return path.relative_to(hierarchy).parts in NODE_LEVEL
    return False


def remove_new_cgroups(before: set[Path], only: Callable[[Path], bool] = lambda _: True) -> None:
    """The kubepods cgroups made since `before` (empty by now) for which `only` holds, deepest first: the
    kubelet keeps kubepods and its QoS levels, as upstream's, so the test removes them."""
    for cgroup in sorted((p for p in kubepods_dirs() - before if only(p)), key=lambda p: -len(p.parts)):
        try:
            cgroup.rmdir()
        except OSError:
            pass


class Kubelet:
    """The pykubelet process, which a test may kill -9 and start again."""

    def __init__(self, argv: list[str], work: Path) -> None:
        self.argv, self.work = argv, work
        self.log_path, self.pods_dir = work / "pykubelet.log", work / "pods"
        self.proc: subprocess.Popen | None = None

    @classmethod
    def for_node(cls, work: Path, node: str, node_ip: str, endpoint: str, kubeconfig: Path | None,
                 config: dict | None = None, *extra: str) -> Kubelet:
        """A kubelet for `node` on the CRI `endpoint`, its state and pod logs under `work`, with the
        KubeletConfiguration fields of `config` over fast test cadences."""
        work.mkdir(parents=True, exist_ok=True)
        path = work / "kubelet.yaml"
        path.write_text(json.dumps({"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                                    "podLogsDir": str(work / "pods"), "syncFrequency": "10s",
                                    # its HTTPS server on loopback, on a port no other kubelet holds
                                    "address": "127.0.0.1", "port": free_port(), **(config or {})}))
        argv = [str(PYKUBELET), "--config", str(path), "--container-runtime-endpoint", endpoint,
                "--hostname-override", node, "--node-ip", node_ip, "--root-dir", str(work / "root"), "-v", "1"]
        if kubeconfig is not None:
            argv += ["--kubeconfig", str(kubeconfig)]
        return cls(argv + list(extra), work)

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text()[-chars:] if self.log_path.exists() else ""

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


def secured_config(cp: ControlPlane, node: str, node_ip: str, port: int) -> dict:
    """A KubeletConfiguration serving :`port` as kubeadm's kubelets do: a serving certificate of the cluster CA,
    client certificates of that CA, bearer tokens by TokenReview, no anonymous access, authorization by
    SubjectAccessReview, a denial remembered for 1 s (30 s by default) so a test sees a new binding soon."""
    assert cp.ca is not None
    serving = cp.ca.issue(f"kubelet-serving-{node}", f"system:node:{node}", groups=("system:nodes",), client=False,
                          server=True, hosts=(node_ip, node))
    return {"port": port, "tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
            "authentication": {"x509": {"clientCAFile": str(cp.ca.pair.cert)}, "anonymous": {"enabled": False},
                               "webhook": {"enabled": True}},
            "authorization": {"mode": "Webhook", "webhook": {"cacheUnauthorizedTTL": "1s"}}}


def apply(cp: ControlPlane, tmp: Path, obj: dict, kind: str = "Pod") -> None:
    manifest = tmp / f"{kind.lower()}-{obj['metadata']['name']}.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": kind, **obj}))
    cp.kubectl("apply", "-f", str(manifest))


def get_pod(cp: ControlPlane, name: str, namespace: str = "default") -> dict:
    out = cp.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def condition(pod: dict, kind: str) -> str:
    return next((c["status"] for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), "")


def wait_pod(cp: ControlPlane, name: str, what: str, check, timeout: float = 90) -> dict:
    """The pod `name` once `check(pod)` holds."""
    return wait_for(f"{name}: {what}", lambda: (lambda p: p if p and check(p) else None)(get_pod(cp, name)),
                    timeout=timeout)


def pod_spec(node: str, name: str, container: dict, **spec) -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 10,
                     "automountServiceAccountToken": False, **spec}}


def on_node(runtime: cri.CRIRuntime, uid: str) -> tuple[list, list]:
    selector = {"io.kubernetes.pod.uid": uid}
    return (runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector=selector)),
            runtime.list_containers(api_pb2.ContainerFilter(label_selector=selector)))


def delete(cp: ControlPlane, name: str) -> None:
    cp.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true", "--timeout=60s", timeout=90)
