"""containerd (Debian's 1.6, started by the test) runs a pod sandbox whose network comes from our conflist.

containerd gets its own root, state, socket, CNI conf dir and bin dir under tmp_path; the sandbox image is
the busybox test image (sleeping) imported under a local name, since this machine cannot pull one. The
bin dir holds only our launchers (pyloopback also under the name `loopback`, which the CRI plugin calls for
every pod), so the whole pod network is ours. Everything is torn down: pod, containerd, its shims, the
cgroup parent, the bridge, and the helper the plugins started.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from cni_plugins import helper
from cni_plugins.install import install
from pynode_cluster.node import containerd_config
from pynode_os import mountinfo
from tests.integration.cni_helpers import ping
from tests.kit.busybox import build_rootfs, tar_directory, write_oci_layout

CONTAINERD = shutil.which("containerd") or ""
CRICTL = Path(os.environ.get("PEERS_BIN", Path.home() / ".cache/pynode/bin")) / "crictl"
IMAGE = "pyt.local/pause:latest"
OCI_RUNTIME = shutil.which("runc") or "runc"
RUN_DIR = Path("/run/containerd")

pytestmark = [
    pytest.mark.skipif(not CONTAINERD or not CRICTL.exists(), reason="needs containerd and crictl (make peers)"),
    pytest.mark.usefixtures("restore_forwarding"),
]



def _cgroup_dirs(parent: str) -> list[Path]:
    root = Path("/sys/fs/cgroup")
    return sorted(root.glob(f"*/{parent.strip('/')}")) + sorted(root.glob(parent.strip("/")))


class Containerd:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sock = tmp / "ctrd.sock"
        self.proc: subprocess.Popen | None = None

    def start(self, config: Path, env: dict[str, str]) -> None:
        with open(self.tmp / "containerd.log", "wb") as log:  # containerd holds its own copy
            self.proc = subprocess.Popen([CONTAINERD, "--config", str(config)], stdout=log, stderr=log,
                                         env=env, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.sock.exists() or self.crictl("info", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("containerd did not come up: " + (self.tmp / "containerd.log").read_text()[-2000:])
            time.sleep(0.2)

    def crictl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(CRICTL), "--runtime-endpoint", f"unix://{self.sock}", "--timeout", "60s", *args],
                              capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"crictl {' '.join(args)}: {proc.stderr}\n" + (self.tmp / "containerd.log").read_text()[-3000:]
            )
        return proc

    def ctr(self, *args: str) -> None:
        subprocess.run(
            ["ctr", "--address", str(self.sock), "--namespace", "k8s.io", *args], check=True, capture_output=True
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _unmount_under(root: Path) -> None:
    points = [m.mount_point for m in mountinfo.read()]
    for point in sorted((p for p in points if p.startswith(str(root))), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


PYRUNTIME = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "pyruntime")


@pytest.mark.parametrize("oci_runtime", [OCI_RUNTIME, PYRUNTIME], ids=["runc", "pyruntime"])
def test_containerd_runs_pod_on_our_network(tmp_path: Path, oci_runtime: str) -> None:
    """The whole node below the kubelet: containerd's CRI, our CNI plugins and (second case) our runtime
    under the runc v2 shim run a pod with a container in it, reachable and exec-able, then tear it down."""
    suffix = secrets.token_hex(3)
    bridge, network, parent = f"pyt-br-{suffix}", f"pyt-ctrd-{suffix}", f"/pyt-ctrd-{suffix}"
    bin_dir, netd, data = tmp_path / "bin", tmp_path / "net.d", tmp_path / "ipam"
    install(bin_dir)
    os.symlink(bin_dir / "pyloopback", bin_dir / "loopback")
    netd.mkdir()
    (netd / "10-pyt.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": network,
                "plugins": [
                    {
                        "type": "pybridge",
                        "bridge": bridge,
                        "isGateway": True,
                        "ipam": {
                            "type": "pyhost-local",
                            "ranges": [[{"subnet": "10.222.60.0/24"}]],
                            "dataDir": str(data),
                        },
                    }
                ],
            }
        )
    )
    config = tmp_path / "config.toml"
    ctrd = Containerd(tmp_path)
    config.write_text(containerd_config(tmp_path, ctrd.sock, bin_dir, netd, sandbox_image=IMAGE,
                                        oci_runtime=oci_runtime))
    helper_name = f"pyt-helper-{suffix}"
    env = {**os.environ, "PYCNI_HELPER_SOCKET": helper_name, "PYCNI_HELPER_LOG": str(tmp_path / "helper.log")}
    layout = tmp_path / "image"
    write_oci_layout(
        layout, [tar_directory(build_rootfs(tmp_path / "rootfs"))], config_extra={"Cmd": ["sleep", "1000000"]}
    )
    archive = tmp_path / "image.tar"
    with tarfile.open(archive, "w") as tar:
        for item in layout.iterdir():
            tar.add(item, arcname=item.name)
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps({"metadata": {"name": "pyt-pod", "namespace": "default", "uid": suffix, "attempt": 0},
                               "log_directory": str(tmp_path / "logs"), "linux": {"cgroup_parent": parent}}))
    pod_id = ""
    run_dir_existed = RUN_DIR.exists()
    try:
        ctrd.start(config, env)
        ctrd.ctr("images", "import", "--base-name", IMAGE.rsplit(":", 1)[0], str(archive))
        pod_id = ctrd.crictl("runp", str(pod)).stdout.strip()
        status = json.loads(ctrd.crictl("inspectp", pod_id).stdout)["status"]
        assert status["state"] == "SANDBOX_READY"
        pod_ip = status["network"]["ip"]
        assert pod_ip == "10.222.60.2"
        assert sorted(p.name for p in (data / network).iterdir() if p.name[0].isdigit()) == [pod_ip]
        assert ping(None, pod_ip), "host cannot reach the pod"
        container = tmp_path / "container.json"
        container.write_text(json.dumps({"metadata": {"name": "app"}, "image": {"image": IMAGE},
                                         "command": ["sh", "-c", "echo started; exec sleep 1000"],
                                         "log_path": "app.log", "linux": {}}))
        cid = ctrd.crictl("create", pod_id, str(container), str(pod)).stdout.strip()
        ctrd.crictl("start", cid)
        assert json.loads(ctrd.crictl("inspect", cid).stdout)["status"]["state"] == "CONTAINER_RUNNING"
        state = json.loads(Path(f"/run/containerd/runc/k8s.io/{cid}/state.json").read_text())
        assert ("creator_pid" in state) == (oci_runtime == PYRUNTIME)  # the shim really ran the runtime asked for
        assert pod_ip in ctrd.crictl("exec", cid, "ip", "-o", "-4", "addr").stdout  # it joined the pod's netns
        assert "exit code 3" in ctrd.crictl("exec", cid, "sh", "-c", "exit 3", check=False).stderr
        deadline = time.monotonic() + 10
        while "started" not in ctrd.crictl("logs", cid).stdout and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "started" in ctrd.crictl("logs", cid).stdout
        ctrd.crictl("stop", "--timeout", "2", cid)
        assert json.loads(ctrd.crictl("inspect", cid).stdout)["status"]["state"] == "CONTAINER_EXITED"
        ctrd.crictl("rm", cid)
        ctrd.crictl("stopp", pod_id)
        ctrd.crictl("rmp", pod_id)
        pod_id = ""
        assert [p.name for p in (data / network).iterdir() if p.name[0].isdigit()] == []
    finally:
        if pod_id:
            ctrd.crictl("rmp", "--force", pod_id, check=False)
        ctrd.stop()
        if not run_dir_existed:
            shutil.rmtree(RUN_DIR, ignore_errors=True)  # the shims' fifo and runc dirs, empty by now
        helper.stop(helper_name)
        _unmount_under(tmp_path)
        subprocess.run(["ip", "link", "del", bridge], check=False, capture_output=True)
        for d in _cgroup_dirs(parent):
            for sub in sorted(d.rglob("*"), key=lambda p: len(str(p)), reverse=True):
                if sub.is_dir():
                    sub.rmdir()
            d.rmdir()
