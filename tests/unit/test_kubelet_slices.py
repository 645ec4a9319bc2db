"""pykubelet with cgroupDriver systemd: the pod's cgroup parent as the stock kubelet names it, the kubepods, QoS
and pod slices it starts through systemd (runc's Apply(-1) for a slice: the calls on a fake bus), and the pod
slice stopped at clean-up."""
from __future__ import annotations

from pathlib import Path

import pytest

from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.config import Settings
from pykubelet.pods import termination
from pykubelet.pods.criconfig import cgroup_parent
from pykubelet.pods.nodecgroups import NodeCgroups
from pykubelet.pods.slices import PodSlices
from pynode_os.systemd import SystemdError
from tests.kit.fake_cri import FakeCRI
from tests.kit.fake_systemd import FakeSystemd

UID = "0b5d2e3c-1111-2222-3333-444455556666"
UID_ = UID.replace("-", "_")


def pod(resources: dict | None = None) -> Pod:
    return parse_pod({"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                      "spec": {"containers": [{"name": "c", "image": "img:1", "resources": resources or {}}]}})


GUARANTEED = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
BURSTABLE = {"requests": {"cpu": "100m"}}


@pytest.mark.parametrize(("resources", "parent"), [
    (None, f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"),
    (BURSTABLE, f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
    (GUARANTEED, f"/kubepods.slice/kubepods-pod{UID_}.slice"),
])
def test_the_cgroup_parent_is_the_stock_kubelets_slice_path(resources, parent):
    assert cgroup_parent(pod(resources), Settings(cgroup_driver="systemd")) == parent


def test_the_cgroupfs_parent_stays():
    assert cgroup_parent(pod(), Settings()) == f"/kubepods/besteffort/pod{UID}"


def _slices(bus: FakeSystemd, **settings) -> PodSlices:
    return PodSlices(Settings(cgroup_driver="systemd", **settings), bus=lambda: bus)


def _cgroups(bus: FakeSystemd, **settings) -> NodeCgroups:
    return NodeCgroups(Settings(cgroup_driver="systemd", **settings), _slices(bus, **settings), list, version="v2")


def test_the_node_slices_each_wanted_by_its_parent_with_their_limits():
    bus = FakeSystemd()
    _cgroups(bus).ensure_node({"cpu": 2000, "memory": 4 << 30, "pid": 4096})
    started = [(c[1], dict(c[3])["Wants"]) for c in bus.calls if c[0] == "StartTransientUnit"]
    assert started == [("kubepods.slice", ("as", ["-.slice"])),
                       ("kubepods-burstable.slice", ("as", ["kubepods.slice"])),
                       ("kubepods-besteffort.slice", ("as", ["kubepods.slice"]))]
    updated = {c[1]: dict(c[3]) for c in bus.calls if c[0] == "SetUnitProperties"}
    assert updated["kubepods.slice"] == {"CPUWeight": ("t", 79), "MemoryMax": ("t", 4 << 30), "TasksMax": ("t", 4096)}
    assert updated["kubepods-besteffort.slice"] == {"CPUWeight": ("t", 1)}
    assert bus.closed


def test_a_pod_slice_is_made_once_with_its_limits_and_an_existing_one_left_alone():
    bus = FakeSystemd()
    cgroups = _cgroups(bus)
    cgroups.ensure_pod(pod(BURSTABLE))
    cgroups.ensure_pod(pod(BURSTABLE))
    pod_calls = [c for c in bus.calls if c[1] == f"kubepods-burstable-pod{UID_}.slice"]
    assert [c[0] for c in pod_calls] == ["StartTransientUnit", "StartTransientUnit"]
    props = dict(pod_calls[0][3])
    assert props["Wants"] == ("as", ["kubepods-burstable.slice"])
    assert props["CPUWeight"] == ("t", 4) and "MemoryMax" not in props  # 100m: 102 shares


def test_clean_up_stops_the_pod_slice_under_any_qos_class(tmp_path):
    bus = FakeSystemd()
    bus.units[f"kubepods-besteffort-pod{UID_}.slice"] = []
    settings = Settings(cgroup_driver="systemd", root_dir=tmp_path, pod_logs_dir=tmp_path / "logs")
    termination.clean_node(pod(), settings, PodSlices(settings, bus=lambda: bus))
    assert [c[1] for c in bus.calls if c[0] == "StopUnit"] == [
        f"kubepods-pod{UID_}.slice", f"kubepods-burstable-pod{UID_}.slice", f"kubepods-besteffort-pod{UID_}.slice"]
    assert not bus.units and bus.closed


def test_the_sync_makes_the_pod_slice_before_the_sandbox(tmp_path: Path):
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer

    rt, bus = FakeCRI(), FakeSystemd()
    rt.add_image("sha256:i", "img:1")
    settings = Settings(cgroup_driver="systemd", root_dir=tmp_path, pod_logs_dir=tmp_path / "logs")
    PodSyncer(rt, settings, cgroups=NodeCgroups(settings, PodSlices(settings, bus=lambda: bus), list,
                                                  version="v2")).sync(pod(), observe(rt, UID))
    (config,) = [c[1] for c in rt.calls if c[0] == "RunPodSandbox"]
    assert f"kubepods-besteffort-pod{UID_}.slice" in bus.units
    assert config.linux.cgroup_parent.endswith(f"/kubepods-besteffort-pod{UID_}.slice")


def test_a_pod_whose_slice_systemd_refuses_waits_with_the_reason(tmp_path: Path):
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer

    class Refusing(FakeSystemd):
        def start_transient_unit(self, name, properties):
            raise SystemdError("Access denied", "org.freedesktop.DBus.Error.AccessDenied")

    rt = FakeCRI()
    settings = Settings(cgroup_driver="systemd", root_dir=tmp_path, pod_logs_dir=tmp_path / "logs")
    cgroups = NodeCgroups(settings, PodSlices(settings, bus=Refusing), list, version="v2")
    result = PodSyncer(rt, settings, cgroups=cgroups).sync(pod(), observe(rt, UID))
    assert not rt.sandboxes
    reason, message = result.waiting["c"]
    assert reason == "ContainerCreating"
    assert "failed to create the pod's cgroup" in message and "Access denied" in message
