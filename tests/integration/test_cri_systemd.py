"""pyruntime-cri with cgroup_driver systemd, and containerd 1.6 with runc's systemd driver (SystemdCgroup, as on
kubeadm's hosts) beside it, driven by crictl as a kubelet with the systemd driver drives them: the pod's cgroup
parent is its slice (the expanded path the kubelet sends), each container and the pod's pause (pyruntime-cri's
shared-pid one, containerd's sandbox) a transient scope in it with the container's limits, and nothing left once
the pod is removed. Then a standalone pykubelet with cgroupDriver systemd on each, as a kubeadm host runs the
kubelet: its kubepods, QoS and pod slices, made through systemd, hold the runtime's scopes, the pod's limits on
both, and the pod's slice is stopped once the pod is gone. Needs a host booted with systemd on cgroup v2: the
lab's node VM; the containerd cases need containerd too (the VM installs it from the lab's packages)."""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import api_pb2
from pykubelet import runtime as cri
from pynode_cluster.hosts import wait_for
from pynode_os.systemd import booted
from tests.kit import containerd_cri
from tests.kit import cri_server as kit
from tests.kit.cri_server import BUSYBOX, TEST_SLICE, Crictl, running_cri, stop_slice
from tests.kit.kubelet_node import Kubelet

ROOT = Path("/sys/fs/cgroup")
pytestmark = pytest.mark.skipif(
    not (booted() and (ROOT / "cgroup.controllers").exists()),
    reason="needs a host booted with systemd on cgroup v2 (here PID 1 is not systemd, or the host is hybrid): "
           "the lab's node VM runs it (make test-lab-v2)")

SLEEPER = ["sh", "-c", "exec sleep 3600"]
SCOPE_PREFIX = {"pyruntime-cri": "pyruntime-cri", "containerd": "cri-containerd"}  # containerd's: runc's "slice:
# cri-containerd:ID" cgroups path for a parent that is a slice


@pytest.fixture(scope="module", params=list(SCOPE_PREFIX))
def systemd_cri(request, tmp_path_factory) -> Iterator[Crictl]:
    if not kit.CRICTL.exists():
        pytest.skip(f"{kit.CRICTL} is missing: run `make peers`")
    if request.param == "containerd" and (missing := containerd_cri.missing()) is not None:
        pytest.skip(missing)
    with running_cri(tmp_path_factory.mktemp("cri-systemd"), cgroup_driver="systemd",
                     runtime=request.param) as server:
        yield server


def scope(server: Crictl, id: str) -> str:
    """The transient scope of the container or pod `id`."""
    return f"{SCOPE_PREFIX['containerd' if server.node.name == 'containerd-cri' else 'pyruntime-cri']}-{id}.scope"


def show(unit: str, *props: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, *(f"--property={p}" for p in props)], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_the_runtime_says_it_runs_the_systemd_driver(systemd_cri) -> None:
    """As each says it: pyruntime-cri's info config, containerd's the runc options of its config."""
    config = systemd_cri.json("info")["config"]
    if systemd_cri.node.name == "containerd-cri":
        assert config["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    else:
        assert config["cgroupDriver"] == "systemd"


def test_a_pods_containers_are_scopes_in_its_slice_with_their_limits(systemd_cri) -> None:
    c = systemd_cri
    with c.pod("limits") as pod:
        pod_slice = os.path.basename(pod.config["linux"]["cgroup_parent"])
        slice_dir = ROOT / f"{TEST_SLICE}.slice" / pod_slice
        assert show(scope(c, pod.id), "ActiveState", "Slice") == {
            "ActiveState": "active", "Slice": pod_slice}  # the pause that stays (the pod shares its pid namespace)
        cid = c.start_container(pod, "main", command=SLEEPER, linux={"resources": {
            "memory_limit_in_bytes": 64 << 20, "cpu_quota": 50000, "cpu_period": 100000, "cpu_shares": 512}})
        unit = scope(c, cid)
        assert show(unit, "ActiveState", "Slice", "Delegate", "MemoryMax", "CPUQuotaPerSecUSec") == {
            "ActiveState": "active", "Slice": pod_slice, "Delegate": "yes", "MemoryMax": str(64 << 20),
            "CPUQuotaPerSecUSec": "500ms"}
        unit_dir = slice_dir / unit
        assert (unit_dir / "memory.max").read_text().strip() == str(64 << 20)
        assert (unit_dir / "cpu.max").read_text().split() == ["50000", "100000"]
        inside = c.crictl("exec", cid, "cat", "/sys/fs/cgroup/memory.max").stdout.strip()
        assert inside == str(64 << 20)
        c.crictl("update", "--memory", str(96 << 20), cid)
        assert show(unit, "MemoryMax")["MemoryMax"] == str(96 << 20)
        assert (unit_dir / "memory.max").read_text().strip() == str(96 << 20)
        c.crictl("stop", cid)
        c.crictl("rm", cid)
        # containerd's runc deletes the container on its exit event, which may come after crictl's answer
        wait_for("the container's scope removed", lambda: not unit_dir.exists(), timeout=10)
    assert not slice_dir.exists()  # the pod's slice stopped as the kubelet stops it (kit.remove_cgroup)


KUBELET_ROOT = "pynodekubelet"  # the kubelet's cgroupRoot: its slices are below pynodekubelet.slice, the test's
LIMITED = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "limited", "namespace": "default"}, "spec": {
    "hostNetwork": True, "terminationGracePeriodSeconds": 5, "containers": [{
        "name": "limited", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": SLEEPER,
        "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                      "limits": {"cpu": "500m", "memory": "64Mi"}}}]}}  # Burstable, every limit given


def test_pykubelets_slices_hold_the_runtimes_scopes_with_the_pods_limits(systemd_cri, tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "limited.json").write_text(json.dumps(LIMITED))
    config = {"cgroupDriver": "systemd", "cgroupRoot": f"/{KUBELET_ROOT}", "fileCheckFrequency": "1s"}
    kubelet = Kubelet.for_node(tmp_path / "kubelet", "pynode-systemd", "10.201.0.45", systemd_cri.node.url, None,
                               config, "--pod-manifest-path", str(manifests))
    runtime = cri.CRIRuntime(systemd_cri.node.url, timeout=30)
    exited = lambda: not kubelet.running() and f"the kubelet exited: {kubelet.log_tail()}"  # noqa: E731

    def limited() -> api_pb2.Container | None:
        return next((c for c in runtime.list_containers(api_pb2.ContainerFilter(state=api_pb2.ContainerStateValue(
            state=api_pb2.CONTAINER_RUNNING))) if c.metadata.name == "limited"), None)
    try:
        kubelet.start()
        container = wait_for("the static pod's container running", limited, timeout=120, failed=exited)
        kubepods = f"{KUBELET_ROOT}-kubepods"
        burstable = f"{kubepods}-burstable.slice"
        pod_slice = f"{kubepods}-burstable-pod{container.labels['io.kubernetes.pod.uid'].replace('-', '_')}.slice"
        pod_dir = ROOT / f"{KUBELET_ROOT}.slice" / f"{kubepods}.slice" / burstable / pod_slice
        assert show(f"{kubepods}.slice", "ActiveState")["ActiveState"] == "active"
        assert show(pod_slice, "ActiveState", "Slice", "MemoryMax", "CPUQuotaPerSecUSec") == {
            "ActiveState": "active", "Slice": burstable, "MemoryMax": str(64 << 20), "CPUQuotaPerSecUSec": "500ms"}
        unit = scope(systemd_cri, container.id)
        assert show(unit, "ActiveState", "Slice", "Delegate", "MemoryMax", "CPUQuotaPerSecUSec") == {
            "ActiveState": "active", "Slice": pod_slice, "Delegate": "yes", "MemoryMax": str(64 << 20),
            "CPUQuotaPerSecUSec": "500ms"}, kubelet.log_tail()
        assert (pod_dir / unit / "memory.max").read_text().strip() == str(64 << 20)
        assert (pod_dir / unit / "cpu.max").read_text().split() == ["50000", "100000"]
        assert (pod_dir / unit / "cgroup.procs").read_text().split(), "no process in the container's scope"

        (manifests / "limited.json").unlink()
        wait_for("the pod gone and its slice stopped", lambda: not runtime.list_pod_sandbox() and not pod_dir.exists(),
                 timeout=90, failed=exited)
    finally:
        kubelet.stop()
        runtime.close()
        stop_slice(f"{KUBELET_ROOT}.slice")  # kubepods and the QoS slices, which the kubelet keeps as upstream's
