"""cri/pause_image.py's pure parts: the pause container's config.json from a PauseJob and the image config,
and the choice between the built-in pause and the image (with fakes; the real one runs in
tests/integration/test_cri_pause_image.py)."""
from __future__ import annotations

import pytest

from pyruntime.cri.jobs import PauseInfo, PauseJob
from pyruntime.cri.model import Layout
from pyruntime.cri.pause_image import Pauses
from pyruntime.errors import InvalidArgumentError

IMAGE = {"Entrypoint": ["/pause"], "Cmd": [], "Env": ["PATH=/"]}


class FakeLauncher:
    def __init__(self) -> None:
        self.jobs: list[PauseJob] = []

    def run_pause(self, job: PauseJob) -> PauseInfo:
        self.jobs.append(job)
        return PauseInfo(pid=7, start_time=1, namespaces={})


def pauses(image: str = "registry.k8s.io/pause:3.10", launcher: object = None) -> Pauses:
    return Pauses(image, launcher=launcher, runtime=None, images=None, layout=Layout("/r", "/s"), kernel=None)


def namespaces(spec: dict) -> list[str]:
    return [n["type"] for n in spec["linux"]["namespaces"]]


def test_a_pod_gets_new_namespaces_a_hostname_and_nothing_of_the_host():
    job = PauseJob(sandbox_id="abc", ns_dir="/s/sandboxes/abc/ns", hostname="web-0", share_pid=True,
                   sysctls={"net.ipv4.ip_forward": "1"}, cgroup_parent="/kubepods/pod1")
    spec = pauses().spec(job, IMAGE, "/rootfs")
    assert namespaces(spec) == ["mount", "pid", "network", "ipc", "uts"]
    assert spec["hostname"] == "web-0" and spec["linux"]["sysctl"] == {"net.ipv4.ip_forward": "1"}
    assert spec["linux"]["cgroupsPath"] == "/kubepods/pod1/abc"
    assert spec["process"]["args"] == ["/pause"] and spec["process"]["user"] == {"uid": 0, "gid": 0}
    assert spec["process"]["noNewPrivileges"] and spec["process"]["capabilities"]["bounding"] == []
    assert spec["root"] == {"path": "/rootfs", "readonly": True}
    with open("/proc/self/oom_score_adj") as f:  # containerd's -998, but never below the server's own
        assert spec["process"]["oomScoreAdj"] == max(-998, int(f.read()))


def test_a_host_network_pod_shares_the_hosts_net_and_uts():
    job = PauseJob(sandbox_id="abc", ns_dir="/ns", hostname="ignored", new_net=False, new_uts=False)
    spec = pauses().spec(job, {**IMAGE, "User": "65535:65534"}, "/rootfs")
    assert namespaces(spec) == ["mount", "pid", "ipc"] and "hostname" not in spec
    assert spec["process"]["user"] == {"uid": 65535, "gid": 65534}
    assert spec["linux"]["cgroupsPath"] == "/pyruntime/abc"


@pytest.mark.parametrize(("config", "message"), [
    ({"Entrypoint": [], "Cmd": []}, "neither Entrypoint nor Cmd"),
    ({**IMAGE, "User": "nobody"}, "User 'nobody' must be numeric"),
])
def test_an_unusable_image_is_named(config, message):
    with pytest.raises(InvalidArgumentError, match=f"^sandbox_image: .*{message}"):
        pauses().spec(PauseJob(sandbox_id="abc", ns_dir="/ns"), config, "/rootfs")


def test_without_an_image_the_launcher_makes_the_built_in_pause():
    launcher = FakeLauncher()
    job = PauseJob(sandbox_id="abc", ns_dir="/ns")
    assert pauses("", launcher).run_pause(job).pid == 7 and launcher.jobs == [job]


def test_sysctls_are_checked_before_anything_is_made(tmp_path):
    p = Pauses("pause:3.10", launcher=None, runtime=None, images=None, layout=Layout(str(tmp_path), str(tmp_path)),
               kernel=None)
    with pytest.raises(InvalidArgumentError, match=r"sysctls\.kernel\.hostname"):
        p.run_pause(PauseJob(sandbox_id="abc", ns_dir=str(tmp_path / "ns"), sysctls={"kernel.hostname": "x"}))
    assert list(tmp_path.iterdir()) == []
