"""A private containerd 1.6 (Debian's) whose runc v2 shim can be pointed at pyruntime.

It runs with its own root, state and sockets under a temporary directory and with the CRI plugin off, so
it never meets a system containerd or a kubelet. Teardown stops it by pid and removes what it leaves
outside that directory: /run/containerd (where the 1.6 shims put their sockets and the runtime its state,
whatever the config says) when it did not exist before.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
NAMESPACE = "pynode-interop"
SHIM_SOCKETS = Path("/run/containerd")

CONFIG = """\
version = 2
root = "{dir}/root"
state = "{dir}/state"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{dir}/containerd.sock"

[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""
"""


@dataclass
class Containerd:
    dir: Path
    socket: Path
    proc: subprocess.Popen

    def ctr(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([CTR, "--address", str(self.socket), "--namespace", NAMESPACE, *args],
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} exited {result.returncode}: {result.stderr}"
                                 f"\ncontainerd log:\n{self.log()}")
        return result

    def run(self, image: str, cid: str, *argv: str, runtime: Path) -> subprocess.CompletedProcess:
        """`ctr run --rm` in a top-level cgroup of its own: the default /NAMESPACE/ID would leave the
        NAMESPACE parent behind, which no runtime removes (runc neither)."""
        return self.ctr("run", "--rm", "--runtime", "io.containerd.runc.v2", "--runc-binary", str(runtime),
                        "--cgroup", f"/{NAMESPACE}-{cid}", image, cid, *argv, check=False)

    def log(self) -> str:
        return (self.dir / "containerd.log").read_text(errors="replace")[-4000:]


def _wait_serving(c: Containerd, deadline: float) -> None:
    while time.monotonic() < deadline:
        if c.proc.poll() is not None:
            raise RuntimeError(f"containerd exited {c.proc.returncode}:\n{c.log()}")
        if c.socket.exists() and c.ctr("version", check=False).returncode == 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"containerd did not serve within the deadline:\n{c.log()}")


@pytest.fixture(scope="module")
def containerd(tmp_path_factory):
    if not os.access(CONTAINERD, os.X_OK):
        pytest.skip("containerd is not installed")
    workdir = tmp_path_factory.mktemp("containerd")
    config = workdir / "config.toml"
    config.write_text(CONFIG.format(dir=workdir))
    created_sockets_dir = not SHIM_SOCKETS.exists()
    with open(workdir / "containerd.log", "wb") as log:
        proc = subprocess.Popen([CONTAINERD, "--config", str(config), "--log-level", "debug"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    c = Containerd(workdir, workdir / "containerd.sock", proc)
    try:
        _wait_serving(c, time.monotonic() + 30)
        yield c
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if created_sockets_dir:
            shutil.rmtree(SHIM_SOCKETS, ignore_errors=True)
        # snapshots are plain directories once unmounted; the rest is sockets and metadata
        shutil.rmtree(workdir, ignore_errors=True)
