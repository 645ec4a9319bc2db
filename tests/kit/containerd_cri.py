"""A CRI-enabled containerd 1.6 (Debian's) for the kubelet tests: runc, our CNI plugins (pybridge,
pyhost-local, pyloopback) and the certs.d mirrors that send registry.k8s.io, docker.io ... to the test
registry, each run with its own root, state, socket and CNI conf dir under a directory of its own.

It is critest's containerd endpoint (tests/conformance/critest.py) with our plugins instead of the
reference ones and a bridge and pod subnet of its own, so a kubelet test never meets a critest run or a
system containerd. stop() ends containerd by pid; what containerd 1.6 keeps outside its directory
(/run/containerd, where its shims put their sockets whatever the config says) goes when it did not
exist before. Pods are the kubelet's to remove: a test stops its pods before the runtime; what a failed test
left is removed through CRI before containerd stops.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.conformance.critest import CONTAINERD_RUN, Containerd, conflist, install_our_plugins

BRIDGE = "pyt-kubelet0"
POD_SUBNET = "10.235.0.0/16"
NETWORK = "pynode-kubelet"


def missing() -> str | None:
    """Why containerd cannot run on this host (a test's reason to skip), None if it can."""
    absent = [tool for tool in ("containerd", "containerd-shim-runc-v2", "runc") if shutil.which(tool) is None]
    return (f"{', '.join(absent)} not installed (Debian's containerd package, which pulls runc; the lab's v2 VM "
            "installs it from prepare --with-tests)") if absent else None


class ContainerdCri(Containerd):
    name = "containerd-cri"

    def __init__(self, work: Path, hosts_dir: Path, cgroup_driver: str | None = None) -> None:
        super().__init__(work, hosts_dir)
        self.cgroup_driver = cgroup_driver

    def cni_setup(self) -> None:
        self.cni_bin = self.work / "cni-bin"
        install_our_plugins(self.cni_bin)
        self.cni_conf.mkdir(parents=True, exist_ok=True)
        (self.cni_conf / "10-pynode.conflist").write_text(json.dumps(conflist(
            "pybridge", "pyhost-local", "pyportmap", self.work / "ipam", name=NETWORK, bridge=BRIDGE,
            subnet=POD_SUBNET)))

    def kill(self) -> None:
        """SIGKILL, as a crashed runtime: the socket stays, nobody answers on it."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None


def _remove_pods(endpoint: ContainerdCri) -> None:
    """The pods a failed test left (`crictl rmp -fa`): containerd keeps each one's network namespace and veth
    until its sandbox is removed, and they would outlive containerd."""
    if endpoint.proc is None:
        return
    from pykubelet.runtime import CRIError, CRIRuntime
    client = CRIRuntime(endpoint.url, timeout=30)
    try:
        for sandbox in client.list_pod_sandbox():
            with contextlib.suppress(CRIError):
                client.stop_pod_sandbox(sandbox.id)
                client.remove_pod_sandbox(sandbox.id)
    except CRIError:
        pass  # containerd is not answering: nothing more to ask of it
    finally:
        client.close()


@contextlib.contextmanager
def containerd_cri(work: Path, hosts_dir: Path | None = None, cgroup_driver: str | None = None
                   ) -> Iterator[ContainerdCri]:
    """containerd with CRI on, serving at `.url` (unix://WORK/cri.sock) until the block ends. `hosts_dir`:
    a certs.d mirror config (tests/kit/cri_images.write_hosts_dir); none: pulls go nowhere. `cgroup_driver`
    "systemd": runc's systemd driver (SystemdCgroup), as on kubeadm's hosts."""
    if hosts_dir is None:
        hosts_dir = work / "certs.d"
        hosts_dir.mkdir(parents=True, exist_ok=True)
    run_dir_existed = CONTAINERD_RUN.exists()
    bridge_existed = os.path.exists(f"/sys/class/net/{BRIDGE}")  # the CNI bridge plugin never removes it
    endpoint = ContainerdCri(work, hosts_dir, cgroup_driver)
    try:
        endpoint.start()
        yield endpoint
    finally:
        _remove_pods(endpoint)
        endpoint.stop()
        if not run_dir_existed:
            shutil.rmtree(CONTAINERD_RUN, ignore_errors=True)
        if not bridge_existed:
            subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
