"""pyruntime-cri with cgroup_driver systemd, and containerd 1.6 with runc's systemd driver (SystemdCgroup, as on
kubeadm's hosts) beside it, driven by crictl as a kubelet with the systemd driver drives them: the pod's cgroup
parent is its slice (the expanded path the kubelet sends), each container and the pod's pause (pyruntime-cri's
shared-pid one, containerd's sandbox) a transient scope in it with the container's limits, and nothing left once
the pod is removed. Needs a host booted with systemd on cgroup v2: the lab's node VM; the containerd case needs
containerd too (the VM installs it from the lab's packages)."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynode_os.systemd import booted
from tests.kit import containerd_cri
from tests.kit import cri_server as kit
from tests.kit.cri_server import TEST_SLICE, Crictl, running_cri

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
        assert not unit_dir.exists()
    assert not slice_dir.exists()  # the pod's slice stopped as the kubelet stops it (kit.remove_cgroup)
