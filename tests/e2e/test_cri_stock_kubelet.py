"""The stock kubelet (v1.37.2) runs a static pod on pyruntime-cri: the interop test of what a kubelet asks of a
CRI server (Version, Status, ImageFsInfo, the list/status calls, stats, logs) and relies on.

The kubelet runs standalone (no API server): a static pod manifest, its own root dir, pod log dir, volume
plugin dir and cgroup root under a temporary directory, free ports. What it changes on the host besides is
put back afterwards: the kernel knobs it sets, the `kubepods` cgroups under its cgroup root, its iptables
canary and hint chains, host forwarding (the bridge plugin's), and the /var/log/containers symlinks of its
containers.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from proto import api_pb2
from pynode_cluster import hosts
from pynode_os import mountinfo
from tests.conformance.critest import CRICTL, critest_registry
from tests.integration.cni_helpers import FORWARDING
from tests.kit.controlplane import free_port, peer
from tests.kit.cri_server import HTTPD, CriNode
from tests.kit.kubelet_node import wait_for

CGROUPS = Path("/sys/fs/cgroup")
CONTAINER_LOGS = Path("/var/log/containers")  # the kubelet's symlinks: a path it hard-codes
KERNEL_KNOBS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                "kernel/keys/root_maxbytes")  # what the kubelet sets while protectKernelDefaults is off
NODE = "pynode-kubelet-node"
POD = "web"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    with critest_registry(tmp_path_factory.mktemp("registry")) as m:
        yield m


@pytest.fixture
def host_state():
    with kubelet_host_state():
        yield


@contextlib.contextmanager
def kubelet_host_state():
    """Puts back the kernel knobs the kubelet and the bridge plugin change, and removes the iptables chains
    (KUBE-FIREWALL, the canaries, with the rules jumping to them), the nftables tables iptables-nft made for
    them, and the /var/log/containers links that appear meanwhile."""
    knobs = {p: p.read_text() for p in [*(Path("/proc/sys") / k for k in KERNEL_KNOBS), *map(Path, FORWARDING)]
             if p.exists()}
    chains, tables = _kube_chains(), _nft_tables()
    links = set(os.listdir(CONTAINER_LOGS)) if CONTAINER_LOGS.is_dir() else None
    try:
        yield
    finally:
        for path, value in knobs.items():
            path.write_text(value)
        new = _kube_chains() - chains
        for tool, table, _ in new:
            for rule in _rules(tool, table):
                parts = shlex.split(rule)
                if parts[:1] == ["-A"] and "-j" in parts and (tool, table, parts[parts.index("-j") + 1]) in new:
                    subprocess.run([tool, "-w", "-t", table, "-D", *parts[1:]], capture_output=True, check=False)
        for tool, table, chain in new:
            subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True, check=False)
            subprocess.run([tool, "-w", "-t", table, "-X", chain], capture_output=True, check=False)
        for family, table in _nft_tables() - tables:
            subprocess.run(["nft", "delete", "table", family, table], capture_output=True, check=False)
        if CONTAINER_LOGS.is_dir():
            for name in set(os.listdir(CONTAINER_LOGS)) - (links or set()):
                (CONTAINER_LOGS / name).unlink()
            if links is None:
                CONTAINER_LOGS.rmdir()


def _rules(tool: str, table: str) -> list[str]:
    out = subprocess.run([tool, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()


def _kube_chains() -> set[tuple[str, str, str]]:
    return {(tool, table, line.split()[1]) for tool in ("iptables", "ip6tables")
            for table in ("mangle", "nat", "filter") for line in _rules(tool, table) if line.startswith("-N KUBE-")}


def _nft_tables() -> set[tuple[str, str]]:
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout
    return {(line.split()[1], line.split()[2]) for line in out.splitlines() if line.startswith("table ")}


class Kubelet:
    """The stock kubelet, standalone (or, with `args` such as --kubeconfig, a node of an API server), with
    everything it writes under `root` and its cgroups under /CGROUP_ROOT in every hierarchy; `config`:
    KubeletConfiguration fields over this one's."""

    def __init__(self, root: Path, cri: CriNode, node: str = NODE, config: dict | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.root, self.cri, self.node = root, cri, node
        self.extra_config, self.extra_args = config or {}, args
        self.cgroup_root = f"pynode-kubelet-{secrets.token_hex(4)}"
        self.manifests = root / "manifests"
        self.pod_logs = root / "pod-logs"
        self.read_port, self.healthz_port, self.port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        for d in (self.manifests, self.pod_logs, self.root / "state", self.root / "volume-plugins"):
            d.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        for hierarchy in self.hierarchies():
            (hierarchy / self.cgroup_root).mkdir(exist_ok=True)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "failSwapOn": False, "cgroupDriver": "cgroupfs",
            "cgroupRoot": "/" + self.cgroup_root, "staticPodPath": str(self.manifests),
            "containerRuntimeEndpoint": self.cri.url, "imageServiceEndpoint": self.cri.url,
            "address": "127.0.0.1", "port": self.port, "readOnlyPort": self.read_port,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "podLogsDir": str(self.pod_logs), "volumePluginDir": str(self.root / "volume-plugins"),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "fileCheckFrequency": "1s", "syncFrequency": "5s", "resolvConf": "", **self.extra_config,
        }
        (self.root / "kubelet.json").write_text(json.dumps(config))
        argv = [peer("kubelet"), "--config", str(self.root / "kubelet.json"), "--root-dir", str(self.root / "state"),
                "--hostname-override", self.node, "--v", "2", *self.extra_args]
        with open(self.root / "kubelet.log", "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for("the kubelet healthy",
                 lambda: self._get(self.healthz_port, "/healthz") == b"ok" or self._dead(), timeout=60, interval=0.1)
        assert not self._dead(), self.log_tail()

    def _dead(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    @staticmethod
    def _get(port: int, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.read()
        except OSError:
            return None

    def pods(self) -> list[dict]:
        body = self._get(self.read_port, "/pods")
        return (json.loads(body).get("items") or []) if body else []

    def stop(self) -> None:
        if self.proc is not None:
            hosts.terminate(psutil.Process(self.proc.pid), 30)
            self.proc.wait()  # its status, for Popen (terminate reaped it already)
            self.proc = None
        state = str(self.root / "state")
        while any(m.mount_point == state for m in mountinfo.read()):  # the kubelet bind-mounts it onto itself
            subprocess.run(["umount", state], check=True)

    def hierarchies(self) -> list[Path]:
        return [h for h in CGROUPS.iterdir() if h.is_dir() and not h.is_symlink()]

    def remove_cgroups(self) -> None:
        """Its kubepods tree, deepest first (empty by now: the pods were removed through the CRI)."""
        for hierarchy in self.hierarchies():
            hosts.remove_cgroup_tree(hierarchy / self.cgroup_root)

    def log_tail(self) -> str:
        return (self.root / "kubelet.log").read_text(errors="replace")[-4000:]


@pytest.fixture
def node(mirror, host_state):
    n = CriNode(mirror.hosts_dir, bridge="pyt-crikub0", subnet="10.237.0.0/24")
    try:
        n.start()
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def kubelet(node, tmp_path):
    k = Kubelet(tmp_path / "kubelet", node)
    try:
        yield k
    finally:
        k.stop()
        for pod in node.pods():  # what a drained node does: every pod goes through the CRI
            node.remove_pod(pod.id)
        k.remove_cgroups()


def test_stock_kubelet_runs_a_static_pod(node, kubelet):
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": "default"},
                "spec": {"containers": [{"name": "httpd", "image": HTTPD, "imagePullPolicy": "IfNotPresent",
                                         "ports": [{"containerPort": 80}]}]}}
    (kubelet.manifests / "web.json").write_text(json.dumps(manifest))
    kubelet.start()

    def running() -> dict | None:
        for pod in kubelet.pods():
            if pod["metadata"]["name"].startswith(POD) and pod.get("status", {}).get("phase") == "Running":
                return pod
        return None

    try:
        pod = wait_for("the static pod Running in the kubelet's /pods", running, timeout=120, interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{kubelet.log_tail()}") from e
    statuses = pod["status"]["containerStatuses"]
    assert statuses[0]["ready"] is True and "running" in statuses[0]["state"]
    ip = pod["status"]["podIP"]
    assert ip.startswith("10.237.0.")
    with urllib.request.urlopen(f"http://{ip}/", timeout=5) as r:
        assert b"It works!" in r.read()

    logs = wait_for("the container log under the kubelet's pod log dir",
                    lambda: [p for p in kubelet.pod_logs.rglob("*.log") if p.stat().st_size], timeout=30, interval=0.1)
    assert "httpd stand-in" in logs[0].read_text()
    cri_pods = node.pods()
    assert [p.metadata.name for p in cri_pods] == [pod["metadata"]["name"]]
    assert cri_pods[0].state == api_pb2.SANDBOX_READY

    cid = node.containers()[0].id
    runtime = node.rt.Version(api_pb2.VersionRequest(), timeout=10).runtime_name
    assert statuses[0]["containerID"] == f"{runtime}://{cid}"
    init = json.loads(node.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=cid, verbose=True))
                      .info["info"])["pid"]
    memory = [line for line in Path(f"/proc/{init}/cgroup").read_text().splitlines() if ":memory:" in line]
    assert memory[0].split(":", 2)[2].startswith(f"/{kubelet.cgroup_root}/kubepods/besteffort/pod")

    kubelet.stop()
    crictl = [str(CRICTL), "--runtime-endpoint", node.url, "--timeout", "60s"]
    subprocess.run([*crictl, "rmp", "--all", "--force"], check=True, capture_output=True)
    assert node.pods() == [] and node.containers() == []
    assert node.allocated_ips() == set()


def test_stock_kubelet_runs_a_pod_with_host_users_false(node, kubelet):
    """hostUsers: false: the stock kubelet picks the pod's id range, asks for a POD user namespace and gives
    every mount the pod's mappings; the pod runs as root of its own range and owns its emptyDir."""
    script = "cat /proc/self/uid_map; id -u; stat -c %u /scratch; touch /scratch/made; exec sleep 3600"
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "userns", "namespace": "default"},
                "spec": {"hostUsers": False, "volumes": [{"name": "scratch", "emptyDir": {}}],
                         "containers": [{"name": "main", "image": HTTPD, "imagePullPolicy": "IfNotPresent",
                                         "command": ["sh", "-c", script],
                                         "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}}
    (kubelet.manifests / "userns.json").write_text(json.dumps(manifest))
    kubelet.start()
    try:
        logs = wait_for("the container's output under the kubelet's pod log dir", lambda: [
            p for p in kubelet.pod_logs.rglob("*.log") if len(p.read_text().splitlines()) >= 3], timeout=120,
            interval=0.2)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{kubelet.log_tail()}") from e
    lines = [line.split(" ", 3)[3] for line in logs[0].read_text().splitlines()]
    inside, outside, length = (int(x) for x in lines[0].split())
    assert (inside, length) == (0, 65536) and outside >= 65536, lines[0]
    assert lines[1:3] == ["0", "0"]  # root, and the emptyDir's owner
    made = list((kubelet.root / "state" / "pods").glob("*/volumes/kubernetes.io~empty-dir/scratch/made"))
    assert made and made[0].stat().st_uid == 0  # written through the idmapped mount: root's on disk
