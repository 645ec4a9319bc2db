"""A pyruntime-cri under test for the resilience and interop tests: critest.py's PyruntimeCri endpoint with
its own CNI bridge and subnet, optionally inside a network namespace (a node made of a namespace), driven
over gRPC, and killable with SIGKILL at any moment.

The CNI plugins are reached through a wrapper per plugin, so a test can make one CNI command of one plugin
slow (to kill the daemon while it waits) or fail (a DEL that errors), and so the resident CNI helper gets a
socket name of the test's own, which cleanup() stops: nothing of the test outlives it.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

from cni_plugins.install import EXECUTABLES, install
from proto import api_pb2, api_pb2_grpc
from tests.conformance.critest import PyruntimeCri
from tests.integration.cni_helpers import remove_chains

BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
HTTPD = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4"

WRAPPER = """#!/bin/sh
export PYCNI_HELPER_SOCKET={helper} PYCNI_HELPER_LOG={work}/helper.log
if [ -e {work}/inject/{plugin}-$CNI_COMMAND.sleep ]; then
  touch {work}/inject/{plugin}-$CNI_COMMAND.entered
  sleep "$(cat {work}/inject/{plugin}-$CNI_COMMAND.sleep)"
fi
if [ -e {work}/inject/{plugin}-$CNI_COMMAND.fail ]; then
  echo '{{"cniVersion": "1.0.0", "code": 999, "msg": "injected failure"}}'; exit 1
fi
exec {real} "$@"
"""


class CriNode(PyruntimeCri):
    """`netns`: the name of a network namespace (under /run/netns) to run the daemon in, or None."""

    def __init__(self, hosts_dir: Path, *, bridge: str, subnet: str, netns: str | None = None) -> None:
        work = Path(tempfile.mkdtemp(prefix="pynode-crinode-", dir="/var/tmp"))
        super().__init__(work, hosts_dir)
        self.bridge, self.subnet, self.netns = bridge, subnet, netns
        self.network = f"pyt-{bridge}"
        self.helper = f"pyt-crinode-{secrets.token_hex(4)}"
        self.inject_dir = work / "inject"
        self._channel: grpc.Channel | None = None

    # ---- the daemon -------------------------------------------------------------------------------------

    def cni_setup(self) -> None:
        real, wrapped = self.work / "cni-real", self.work / "cni-bin"
        install(real)
        wrapped.mkdir(exist_ok=True)
        self.inject_dir.mkdir(exist_ok=True)
        for plugin in EXECUTABLES:
            path = wrapped / plugin
            path.write_text(WRAPPER.format(helper=self.helper, work=self.work, plugin=plugin, real=real / plugin))
            path.chmod(0o755)
        (wrapped / "loopback").unlink(missing_ok=True)
        os.symlink(wrapped / "pyloopback", wrapped / "loopback")
        self.cni_conf.mkdir(parents=True, exist_ok=True)
        (self.cni_conf / "10-node.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": self.network, "plugins": [
                {"type": "pybridge", "bridge": self.bridge, "isGateway": True, "ipMasq": True,
                 "ipam": {"type": "pyhost-local", "ranges": [[{"subnet": self.subnet}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.work / "ipam")}},
                {"type": "pyportmap", "capabilities": {"portMappings": True}}]}))

    def argv(self) -> list[str]:
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []
        daemon = Path(sys.executable).with_name("pyruntime-cri")  # this checkout's, whatever PATH says
        return [*prefix, str(daemon), *super().argv()[1:]]

    def inject(self, plugin: str, command: str, *, sleep: float | None = None, fail: bool = False) -> None:
        """Makes `plugin`'s next `command` calls sleep first, or fail; inject(..) with neither undoes it."""
        for kind, on, text in (("sleep", sleep is not None, str(sleep)), ("fail", fail, "")):
            path = self.inject_dir / f"{plugin}-{command}.{kind}"
            if on:
                path.write_text(text)
            else:
                path.unlink(missing_ok=True)

    def kill9(self) -> int:
        """SIGKILL to the daemon; waits until it and its launcher are gone. Returns the daemon's old pid."""
        assert self.proc is not None
        pid = self.proc.pid
        launchers = psutil.Process(pid).children()
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        psutil.wait_procs(launchers, timeout=10)  # the launcher exits on EOF of its socket
        self.close_channel()
        return pid

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.url)
        return self._channel

    @property
    def rt(self) -> api_pb2_grpc.RuntimeServiceStub:
        return api_pb2_grpc.RuntimeServiceStub(self.channel)

    @property
    def images(self) -> api_pb2_grpc.ImageServiceStub:
        return api_pb2_grpc.ImageServiceStub(self.channel)

    # ---- pods -------------------------------------------------------------------------------------------

    def pull(self, image: str) -> None:
        self.images.PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=image)), timeout=120)

    def pod_config(self, name: str) -> api_pb2.PodSandboxConfig:
        return api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name=name, namespace="resilience", uid=f"uid-{name}"),
            hostname=name, log_directory=str(self.work / "logs" / name))

    def run_pod(self, name: str, timeout: float = 60) -> str:
        return self.rt.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=self.pod_config(name)),
                                     timeout=timeout).pod_sandbox_id

    def run_container(self, pod_id: str, pod_name: str, name: str = "main", *, image: str = BUSYBOX,
                      command: tuple[str, ...] = ("sleep", "3600"), start: bool = True) -> str:
        config = api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name=name), image=api_pb2.ImageSpec(image=image),
            command=list(command), log_path=f"{name}.log")
        cid = self.rt.CreateContainer(api_pb2.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=config, sandbox_config=self.pod_config(pod_name)), timeout=60).container_id
        if start:
            self.rt.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=30)
        return cid

    def pod_status(self, pod_id: str) -> api_pb2.PodSandboxStatus:
        return self.rt.PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10).status

    def container_status(self, cid: str) -> api_pb2.ContainerStatus:
        return self.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=cid), timeout=10).status

    def pods(self) -> list[api_pb2.PodSandbox]:
        return list(self.rt.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=10).items)

    def containers(self) -> list[api_pb2.Container]:
        return list(self.rt.ListContainers(api_pb2.ListContainersRequest(), timeout=10).containers)

    def remove_pod(self, pod_id: str) -> None:
        self.rt.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        self.rt.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)

    def allocated_ips(self) -> set[str]:
        """The addresses pyhost-local holds for this node's network (a file per IP)."""
        store = self.work / "ipam" / self.network
        return {p.name for p in store.iterdir() if p.name[0].isdigit()} if store.is_dir() else set()

    def in_node(self, *argv: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=timeout, check=False)

    # ---- teardown ---------------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Removes every pod through the daemon (starting it again if a test left it dead), stops it, the
        CNI helper, the bridge and masquerade chains, and the work dir."""
        try:
            for path in self.inject_dir.glob("*"):
                path.unlink()
            if self.proc is None:
                self.start()
            for pod in self.pods():
                self.remove_pod(pod.id)
        finally:
            self.close_channel()
            self.stop()
            stop = f"from cni_plugins import helper; helper.stop({self.helper!r})"
            self.in_node(sys.executable, "-c", stop)
            self.in_node("ip", "link", "del", self.bridge)
            if not self.netns:
                remove_chains(self.network)
            shutil.rmtree(self.work, ignore_errors=True)


def wait_for(predicate, timeout: float = 20, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
