"""The node the pykubelet pod tests share, one per test module: a stock control plane (etcd and
kube-apiserver, with the `default` ServiceAccount that no controller-manager makes here), a CRI runtime
with the pod network made, and a pykubelet registered as the module's NODE (tests/kit/kubelet_node.py).

Every module runs once per CRI runtime: containerd 1.6 with CRI on (tests/kit/containerd_cri.py) and
pyruntime-cri (tests/kit/cri_server.py), on the same pod network (our CNI plugins, one bridge and subnet).
Images come from the test registry through certs.d mirrors, so nothing leaves the machine. A module's
CRI_LOG_LEVEL is pyruntime-cri's --log-level (its log: `cri.work / "daemon.log"`)."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from proto import api_pb2
from pykubelet import runtime as criapi
from tests.conformance.critest import critest_registry
from tests.kit.containerd_cri import BRIDGE, NETWORK, POD_SUBNET, containerd_cri
from tests.kit.controlplane import ControlPlane
from tests.kit.cri_server import CriNode
from tests.kit.kubelet_node import Kubelet, delete, kubepods_dirs, node_level, remove_new_cgroups, wait_for
from tests.leakcheck import Check

WARM_UP = "warm-up"


@pytest.fixture(scope="module")
def control_plane(cri, tmp_path_factory):
    """One per module and runtime: what a test leaves in the API server (a binding, a configMap, a Node)
    never meets the other runtime's run of the module."""
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    cp.kubectl("create", "serviceaccount", "default", "-n", "default")
    yield cp
    cp.stop()


@pytest.fixture(scope="module", params=["containerd", "pyruntime-cri"])
def cri(request, tmp_path_factory, session_leak_check: Check):
    """The CRI runtime (`.url`, `.work` with the IPAM store in `.work / "ipam"`, `.kill()` for a kill -9,
    `.start()`, `.stop()`, `.name`) with the pod network already made (a sandbox run and removed): the bridge
    is the node's, not a test's. The CNI helper is off: its process outlives a pod by its idle time.

    At the end it removes the node's own cgroups (kubepods, its QoS levels, the warm-up pod's); a pod's
    cgroup that the module's kubelet left is the session check's to report, and goes after it has looked."""
    work = tmp_path_factory.mktemp(request.param)
    cgroups_before = kubepods_dirs()
    with critest_registry(work / "mirror") as mirror, pytest.MonkeyPatch.context() as env:
        env.setenv("PYCNI_HELPER", "off")
        log_level = getattr(request.module, "CRI_LOG_LEVEL", None)
        with _runtime(request.param, work / "cri", mirror.hosts_dir, log_level) as endpoint:
            client = criapi.CRIRuntime(endpoint.url, timeout=60)
            warm_up = client.run_pod_sandbox(api_pb2.PodSandboxConfig(
                metadata=api_pb2.PodSandboxMetadata(name=WARM_UP, namespace="test", uid=WARM_UP),
                linux=api_pb2.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/besteffort/pod{WARM_UP}")))
            client.stop_pod_sandbox(warm_up)
            client.remove_pod_sandbox(warm_up)
            client.close()
            yield endpoint
    remove_new_cgroups(cgroups_before, only=lambda cgroup: node_level(cgroup) or cgroup.name == f"pod{WARM_UP}")
    session_leak_check.after(lambda: remove_new_cgroups(cgroups_before))


@contextlib.contextmanager
def _runtime(name: str, work: Path, hosts_dir: Path, log_level: str | None):
    if name == "containerd":
        with containerd_cri(work, hosts_dir) as endpoint:
            yield endpoint
        return
    node = CriNode(hosts_dir, bridge=BRIDGE, subnet=POD_SUBNET, network=NETWORK, work=work, log_level=log_level)
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


@pytest.fixture(scope="module")
def runtime(cri):
    client = criapi.CRIRuntime(cri.url, timeout=30)
    yield client
    client.close()


@pytest.fixture(scope="module")
def kubelet(request, control_plane, cri, tmp_path_factory):
    """pykubelet as the module's NODE (with its KUBELET_CONFIG: a dict, or a function of the control plane
    giving one), registered; at the end every pod goes first (they are the kubelet's to remove), then the
    kubelet."""
    module = request.module
    config = getattr(module, "KUBELET_CONFIG", None)
    if callable(config):  # fields that name the control plane's files (its CA, certificates it issues)
        config = config(control_plane)
    k = Kubelet.for_node(tmp_path_factory.mktemp("pykubelet"), module.NODE, module.NODE_IP, cri.url,
                         control_plane.node_kubeconfig(module.NODE), config)
    k.start()
    wait_for("the node to register", lambda: not k.running() or control_plane.kubectl(
        "get", "node", module.NODE, check=False).returncode == 0)
    assert k.running(), k.log_tail()
    yield k
    if "kube-apiserver" not in control_plane.procs:  # a test of an API server outage left it stopped
        control_plane.start_apiserver()
    control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)
    k.stop()


@pytest.fixture
def kubepods(leak_check: Check) -> None:
    """A pod test's cgroups: kubepods and its QoS levels may stay (the running kubelet keeps them), a pod's
    own cgroup left behind is a leak the test's check reports; all that is new goes once it has looked."""
    before = kubepods_dirs()
    leak_check.allow("cgroups", node_level)
    leak_check.after(lambda: remove_new_cgroups(before))


@pytest.fixture
def pods(control_plane, kubelet, kubepods):
    """The names of the pods a test made on the kubelet's node: deleted, and their removal waited for, at its end."""
    names: list[str] = []
    yield names
    for name in names:
        delete(control_plane, name)
