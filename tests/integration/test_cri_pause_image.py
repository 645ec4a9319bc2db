"""pyruntime-cri with `--sandbox-image` and configured registry credentials, driven by crictl.

The test registry wants a password (htpasswd) and is reached only through the certs.d mirror config, as
registry.k8s.io; the daemon has the password in its config (`--registry-auth`), crictl sends none. A pod
with a shared pid namespace runs the static pause image (tests/kit/cri_images.py) as its infra container
and a busybox container in it; the container must be in the pause's namespaces, reached through the same
pinned paths; the pod survives a kill -9 of the daemon; and stop + remove leave nothing (the leak check
sees every mount, cgroup, process and link).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cni_plugins import helper
from pyruntime.cri.images import ImageService
from pyruntime.errors import FailedPreconditionError
from pyruntime.images.request import Credentials
from pyruntime.images.store import ImageStore
from tests.conformance.critest import CRICTL, PyruntimeCri
from tests.integration.cni_helpers import helper_listening
from tests.integration.registry_server import Registry
from tests.kit.busybox import build_busybox_image
from tests.kit.cri_images import BUSYBOX, PAUSE_C, compile_static, write_hosts_dir
from tests.kit.images import add_image, f, tar_entries, write_index

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
              pytest.mark.usefixtures("restore_forwarding")]

PAUSE = "registry.k8s.io/pause:3.10"
BRIDGE = "pyt-pauseimg0"
CNI_HELPER = "pycni-helper"  # the name the daemon's plugins use (it passes them no PYCNI_* variable)
USER, PASSWORD = "alice", "s3cret"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Path]]:
    """The password-protected registry with busybox and the pause image, and a hosts dir naming it the
    mirror (and server) of registry.k8s.io."""
    tmp = tmp_path_factory.mktemp("pause-image")
    busybox = build_busybox_image(tmp / "busybox", tmp / "work")
    pause_layout = tmp / "pause"
    desc, _ = add_image(pause_layout, [(tar_entries([f("pause", compile_static(PAUSE_C, tmp / "pause-bin"), 0o755)]),
                                        "gzip")], config_extra={"Entrypoint": ["/pause"], "Cmd": [], "Env": []})
    write_index(pause_layout, [desc])
    registry = Registry(tmp / "registry", auth="htpasswd", users={USER: PASSWORD}).start()
    try:
        registry.push(busybox.layout, BUSYBOX.split("/", 1)[1], creds=f"{USER}:{PASSWORD}")
        registry.push(pause_layout, PAUSE.split("/", 1)[1], creds=f"{USER}:{PASSWORD}")
        yield registry, write_hosts_dir(tmp / "certs.d", registry.host, ("registry.k8s.io",))
    finally:
        registry.stop()


class PauseImageCri(PyruntimeCri):
    """Our plugins with a bare bridge network (no masquerade, no host ports), the pause image, the password."""
    sandbox_image = PAUSE

    def cni_setup(self) -> None:
        from cni_plugins.install import install
        install(self.work / "cni-bin")
        self.cni_conf.mkdir(parents=True, exist_ok=True)
        (self.cni_conf / "10-pause.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "pynode-pauseimg", "plugins": [
                {"type": "pybridge", "bridge": BRIDGE, "ipam": {
                    "type": "pyhost-local", "ranges": [[{"subnet": "10.236.0.0/24"}]],
                    "dataDir": str(self.work / "ipam")}}]}))

    def argv(self) -> list[str]:
        daemon = str(Path(sys.executable).with_name("pyruntime-cri"))  # this venv's, whatever PATH says
        return [daemon, *super().argv()[1:], "--sandbox-image", self.sandbox_image,
                "--registry-auth", f"registry.k8s.io={USER}:{PASSWORD}"]


@pytest.fixture
def daemon(request: pytest.FixtureRequest, tmp_path: Path, mirror: tuple[Registry, Path]) -> Iterator[PauseImageCri]:
    endpoint = PauseImageCri(tmp_path, mirror[1])
    endpoint.sandbox_image = getattr(request, "param", PAUSE)
    helper_before = helper_listening(CNI_HELPER)
    try:
        endpoint.start()
        yield endpoint
    finally:
        if endpoint.proc is not None:  # what a failed test left running goes through the daemon
            subprocess.run([str(CRICTL), "--runtime-endpoint", endpoint.url, "rmp", "-af"], capture_output=True)
        endpoint.stop()
        if not helper_before:  # the plugins' resident helper (cni_plugins/README.md), started by this pod
            helper.stop(CNI_HELPER)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def crictl(daemon: PauseImageCri, *args: str) -> str:
    result = subprocess.run([str(CRICTL), "--runtime-endpoint", daemon.url, "--image-endpoint", daemon.url,
                             "--timeout", "60s", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"crictl {' '.join(args)}: {result.stderr}\n{daemon.log_tail()}"
    return result.stdout.strip()


def ns_inode(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def pause_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["/pause"]]


def test_pod_runs_on_the_pause_image_and_leaves_nothing(daemon: PauseImageCri, tmp_path: Path) -> None:
    crictl(daemon, "pull", BUSYBOX)  # the configured password, through the mirror: crictl sends none
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps({
        "metadata": {"name": "pause-image", "namespace": "default", "uid": "pause-image-1"},
        "hostname": "pauseimg", "log_directory": str(tmp_path / "logs"),
        "linux": {"security_context": {"namespace_options": {"pid": 0}}}}))  # 0: POD, a shared pid namespace
    box = tmp_path / "box.json"
    box.write_text(json.dumps({"metadata": {"name": "box"}, "image": {"image": BUSYBOX},
                               "command": ["sleep", "3600"], "log_path": "box.log"}))

    pod_id = crictl(daemon, "runp", str(pod))  # pulls the pause image itself
    info = json.loads(crictl(daemon, "inspectp", pod_id))["info"]
    pause_pid = info["pid"]
    assert psutil.Process(pause_pid).cmdline() == ["/pause"]
    ns_dir = Path(daemon.work) / "state" / "sandboxes" / pod_id / "ns"
    for kind in ("net", "ipc", "uts"):
        assert info["namespaces"][kind] == str(ns_dir / kind)
        assert os.stat(ns_dir / kind).st_ino == ns_inode(pause_pid, kind) != ns_inode(os.getpid(), kind)
    assert ns_inode(pause_pid, "pid") != ns_inode(os.getpid(), "pid")
    pinned = [i for i in json.loads(crictl(daemon, "images", "-o", "json"))["images"] if PAUSE in i["repoTags"]]
    assert pinned and pinned[0]["pinned"]

    container_id = crictl(daemon, "create", pod_id, str(box), str(pod))
    crictl(daemon, "start", container_id)
    init = json.loads(crictl(daemon, "inspect", container_id))["info"]["pid"]
    for kind in ("net", "ipc", "uts", "pid"):
        assert ns_inode(init, kind) == ns_inode(pause_pid, kind), kind
    assert crictl(daemon, "exec", "-s", container_id, "hostname") == "pauseimg"
    assert int(crictl(daemon, "exec", "-s", container_id, "cat", "/sys/class/net/lo/flags"), 16) & 1, "lo is up"
    assert crictl(daemon, "exec", "-s", container_id, "cat", "/proc/1/cmdline").rstrip("\0") == "/pause"
    ip = json.loads(crictl(daemon, "inspectp", pod_id))["status"]["network"]["ip"]
    assert ip.startswith("10.236.0.")

    # kill -9 of the daemon: the pause container and the pod come back with it
    assert daemon.proc is not None
    daemon.proc.kill()
    daemon.proc.wait()
    daemon.proc = None
    daemon.start()
    assert json.loads(crictl(daemon, "inspectp", pod_id))["status"]["state"] == "SANDBOX_READY"
    assert json.loads(crictl(daemon, "inspectp", pod_id))["info"]["pid"] == pause_pid

    crictl(daemon, "stop", container_id)
    crictl(daemon, "rm", container_id)
    crictl(daemon, "stopp", pod_id)
    assert not psutil.pid_exists(pause_pid) or psutil.Process(pause_pid).status() == psutil.STATUS_ZOMBIE
    crictl(daemon, "rmp", pod_id)
    assert crictl(daemon, "pods", "-q") == ""
    assert pause_processes() == []
    assert not ns_dir.parent.exists()
    assert not (Path(daemon.work) / "root" / "sandboxes" / pod_id).exists()
    assert not (Path(daemon.work) / "state" / "runtime" / pod_id).exists()
    assert [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if str(daemon.work) in m] == []


def test_a_pod_with_a_user_namespace_of_its_own_on_the_pause_image(daemon: PauseImageCri, tmp_path: Path) -> None:
    """hostUsers: false with a pause image: the runtime makes the pod's user namespace for the pause container,
    which owns the pod's other namespaces; the pod's container joins it, root inside, host id 300000 outside."""
    crictl(daemon, "pull", BUSYBOX)
    ids = [{"container_id": 0, "host_id": 300000, "length": 65536}]
    userns = {"security_context": {"namespace_options": {"pid": 0, "userns_options": {"uids": ids, "gids": ids}}}}
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps({"metadata": {"name": "userns", "namespace": "default", "uid": "userns-1"},
                               "log_directory": str(tmp_path / "logs"), "linux": userns}))
    box = tmp_path / "box.json"
    box.write_text(json.dumps({"metadata": {"name": "box"}, "image": {"image": BUSYBOX},
                               "command": ["sleep", "3600"], "log_path": "box.log", "linux": userns}))
    pod_id = crictl(daemon, "runp", str(pod))
    pause_pid = json.loads(crictl(daemon, "inspectp", pod_id))["info"]["pid"]
    assert Path(f"/proc/{pause_pid}/uid_map").read_text().split() == ["0", "300000", "65536"]
    container_id = crictl(daemon, "create", pod_id, str(box), str(pod))
    crictl(daemon, "start", container_id)
    init = json.loads(crictl(daemon, "inspect", container_id))["info"]["pid"]
    for kind in ("user", "net", "ipc", "uts", "pid"):
        assert ns_inode(init, kind) == ns_inode(pause_pid, kind), kind
    assert crictl(daemon, "exec", "-s", container_id, "sh", "-c", "id -u; echo x > /made") == "0"
    assert int(crictl(daemon, "exec", "-s", container_id, "cat", "/sys/class/net/lo/flags"), 16) & 1, \
        "lo is up in a network namespace the pod's user namespace owns"
    assert os.stat(f"/proc/{init}/root/made").st_uid == 300000
    crictl(daemon, "rmp", "-f", pod_id)
    assert crictl(daemon, "pods", "-q") == "" and pause_processes() == []
    assert [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if str(daemon.work) in m] == []


@pytest.mark.parametrize("daemon", ["registry.k8s.io/pause:missing"], indirect=True)
def test_a_missing_sandbox_image_fails_the_pod_and_leaves_nothing(daemon: PauseImageCri, tmp_path: Path) -> None:
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps({"metadata": {"name": "no-pause", "namespace": "default", "uid": "no-pause-1"}}))
    result = subprocess.run([str(CRICTL), "--runtime-endpoint", daemon.url, "runp", str(pod)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "pause:missing" in result.stderr
    assert crictl(daemon, "pods", "-q") == ""
    for where in ("root/sandboxes", "state/sandboxes", "state/runtime"):
        assert not list((tmp_path / where).glob("*")), where
    retry = subprocess.run([str(CRICTL), "--runtime-endpoint", daemon.url, "runp", str(pod)],
                           capture_output=True, text=True, timeout=120)
    assert "already" not in retry.stderr and "pause:missing" in retry.stderr


def test_configured_credentials_go_to_their_registry_only(tmp_path: Path, mirror: tuple[Registry, Path]) -> None:
    _, hosts = mirror
    store = ImageStore(tmp_path / "store", hosts_dir=hosts)
    others = ImageService(store, registry_auths={"quay.io": Credentials(USER, PASSWORD)})
    with pytest.raises(FailedPreconditionError, match="requires credentials"):
        others.pull_image(api_spec(BUSYBOX))
    own = ImageService(store, registry_auths={"registry.k8s.io": Credentials(USER, PASSWORD)})
    assert own.pull_image(api_spec(BUSYBOX)).startswith("sha256:")
    store.remove(BUSYBOX)


def api_spec(ref: str):
    from proto import api_pb2
    return api_pb2.ImageSpec(image=ref)
