"""A running pyruntime-cri for root tests, driven as its clients do: over gRPC (a kubelet, the resilience
tests), with crictl (`Crictl`, the crictl tests), or by pykubelet (the e2e `cri` fixture).

`CriNode` is one daemon with its own root, state, socket, CNI conf dir and IPAM store (`work / "ipam"`) in a
work dir, its pods on a bridge and subnet the test names (so two suites' pods never share a bridge), images
from the test registry through a certs.d mirror dir (tests/conformance/critest.py's `critest_registry`), so
a pull never leaves the machine. It may run inside a network namespace (a node made of a namespace), and a
test may kill it with SIGKILL at any moment and start it again.

Its CNI plugins are reached through a wrapper per plugin, so a test can make one CNI command of one plugin
slow (to kill the daemon while it waits) or fail (a DEL that errors), and so the resident CNI helper gets a
socket name of the node's own, which cleanup() stops: nothing of the test outlives it.

`running_cri` is the crictl suite's module daemon with the host left as found: a warm-up pod makes the
bridge before the first test's leak check looks, and at the end critest's clean-up removes whatever was
left (processes, mounts, cgroups, links, chains) and fails the module if something could not be removed.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
import pytest

from cni_plugins.install import EXECUTABLES, install
from proto import api_pb2, api_pb2_grpc
from pynode_cluster import hosts
from tests.conformance.critest import CRICTL, HostState, PyruntimeCri, cleanup, conflist, critest_registry
from tests.integration.cni_helpers import remove_chains
from tests.kit.containerd_cri import ContainerdCri, containerd_cri
from tests.kit.cri_images import BUSYBOX, HTTPD

HTTPD_INDEX = "It works!"  # HTTPD: busybox httpd on port 80
CGROUP_PREFIX = "pynode-crie2e"
TEST_SLICE = "pynodecrie2e"  # with the systemd driver, the pods' slices are below pynodecrie2e.slice

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
    """One pyruntime-cri (`.url`, `.work`, `.start()`, `.stop()`, `.kill()`, `.cleanup()`) and the gRPC calls
    a test makes on it. `network`: the CNI network name (default pyt-BRIDGE); `netns`: the name of a network
    namespace (under /run/netns) to run the daemon in, or None; `work`: its work dir (default a new one
    under /var/tmp, removed by cleanup()); `log_level`: the daemon's --log-level (default its own);
    `cgroup_driver`: its --cgroup-driver (default its own, cgroupfs)."""

    def __init__(self, hosts_dir: Path, *, bridge: str, subnet: str, network: str | None = None,
                 netns: str | None = None, work: Path | None = None, log_level: str | None = None,
                 cgroup_driver: str | None = None) -> None:
        if work is None:
            work = Path(tempfile.mkdtemp(prefix="pynode-crinode-", dir="/var/tmp"))
        work.mkdir(parents=True, exist_ok=True)
        super().__init__(work, hosts_dir)
        self.bridge, self.subnet, self.netns, self.log_level = bridge, subnet, netns, log_level
        self.cgroup_driver = cgroup_driver
        self.network = network or f"pyt-{bridge}"
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
        (self.cni_conf / "10-node.conflist").write_text(json.dumps(conflist(
            "pybridge", "pyhost-local", "pyportmap", self.work / "ipam", name=self.network, bridge=self.bridge,
            subnet=self.subnet)))

    def argv(self) -> list[str]:
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []
        daemon = Path(sys.executable).with_name("pyruntime-cri")  # this checkout's, whatever PATH says
        level = ["--log-level", self.log_level] if self.log_level else []
        driver = ["--cgroup-driver", self.cgroup_driver] if self.cgroup_driver else []
        return [*prefix, str(daemon), *super().argv()[1:], *level, *driver]

    def inject(self, plugin: str, command: str, *, sleep: float | None = None, fail: bool = False) -> None:
        """Makes `plugin`'s next `command` calls sleep first, or fail; inject(..) with neither undoes it."""
        for kind, on, text in (("sleep", sleep is not None, str(sleep)), ("fail", fail, "")):
            path = self.inject_dir / f"{plugin}-{command}.{kind}"
            if on:
                path.write_text(text)
            else:
                path.unlink(missing_ok=True)

    def kill(self) -> int:
        """SIGKILL to the daemon, as a crashed runtime; waits until it and its launcher are gone (the
        supervisors live on). Returns the daemon's old pid."""
        assert self.proc is not None
        pid = self.proc.pid
        launchers = psutil.Process(pid).children()
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        psutil.wait_procs(launchers, timeout=10)  # the launcher exits on EOF of its socket
        self.close_channel()
        return pid

    def stop(self) -> None:
        self.close_channel()
        super().stop()

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

    def pod_config(self, name: str, share_pid: bool = True) -> api_pb2.PodSandboxConfig:
        """`share_pid`: the pod's containers share a pid namespace (POD, the CRI's default: the pod has a pause
        process) or each has its own (CONTAINER, as the kubelet asks for most pods: no pause process)."""
        config = api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name=name, namespace="resilience", uid=f"uid-{name}"),
            hostname=name, log_directory=str(self.work / "logs" / name))
        config.linux.security_context.namespace_options.pid = api_pb2.POD if share_pid else api_pb2.CONTAINER
        return config

    def run_pod(self, name: str, timeout: float = 60, share_pid: bool = True) -> str:
        return self.rt.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=self.pod_config(name, share_pid)),
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
            self.stop()
            stop = f"from cni_plugins import helper; helper.stop({self.helper!r})"
            self.in_node(sys.executable, "-c", stop)
            self.in_node("ip", "link", "del", self.bridge)
            if not self.netns:
                remove_chains(self.network)
            shutil.rmtree(self.work, ignore_errors=True)


@dataclass
class Crictl:
    """crictl against a CriNode or containerd, with the pod and container configs the crictl tests write."""
    node: CriNode | ContainerdCri
    _serial: int = field(default=0)

    @property
    def work(self) -> Path:
        return self.node.work

    def argv(self, *args: str) -> list[str]:
        url = self.node.url
        return [str(CRICTL), "--runtime-endpoint", url, "--image-endpoint", url, "--timeout", "60s", *args]

    def crictl(self, *args: str, check: bool = True, input: str | None = None,
               timeout: float = 90) -> subprocess.CompletedProcess:
        """crictl against this daemon; check=True raises with its output and the daemon's log tail."""
        result = subprocess.run(self.argv(*args), capture_output=True, text=True, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"crictl {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n"
                                 f"{result.stderr}\ndaemon log:\n{self.node.log_tail()}")
        return result

    def json(self, *args: str) -> dict:
        return json.loads(self.crictl(*args).stdout)

    def write(self, name: str, config: dict) -> Path:
        self._serial += 1
        path = self.work / "configs" / f"{self._serial}-{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config))
        return path

    def pod_config(self, name: str, **extra) -> dict:
        """A pod config whose containers log under the scratch dir and whose cgroups sit below a parent of
        its own (removed by `pod()` as the kubelet removes a pod's cgroup): with the systemd driver a slice
        below TEST_SLICE, given as the kubelet gives it (the expanded path)."""
        uid = f"uid-{name}-{time.monotonic_ns()}"
        parent = f"/{CGROUP_PREFIX}-{name}"
        if self.node.cgroup_driver == "systemd":
            pod_slice = f"{TEST_SLICE}-{name.replace('-', '_')}.slice"
            parent = f"/{TEST_SLICE}.slice/{pod_slice}"
        config: dict = {"metadata": {"name": name, "namespace": "crie2e", "uid": uid, "attempt": 0},
                        "log_directory": str(self.work / "logs" / uid),
                        "linux": {"cgroup_parent": parent}}
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        return config

    def container_config(self, name: str, image: str = BUSYBOX, command: list[str] | None = None,
                         **extra) -> dict:
        config = {"metadata": {"name": name}, "image": {"image": image}, "log_path": f"{name}.log", **extra}
        if command is not None:
            config["command"] = command
        return config

    @contextlib.contextmanager
    def pod(self, name: str, **extra) -> Iterator[Pod]:
        """runp; on exit stopp + rmp (which must succeed) and the pod's cgroup parent removed."""
        config = self.pod_config(name, **extra)
        path = self.write(f"pod-{name}", config)
        pod_id = self.crictl("runp", str(path)).stdout.strip()
        try:
            yield Pod(self, pod_id, config, path)
        finally:
            self.crictl("stopp", pod_id)
            self.crictl("rmp", pod_id)
            remove_cgroup(config["linux"].get("cgroup_parent", ""))

    def start_container(self, pod: Pod, name: str, **kw) -> str:
        path = self.write(f"ctr-{name}", self.container_config(name, **kw))
        cid = self.crictl("create", pod.id, str(path), str(pod.config_path)).stdout.strip()
        self.crictl("start", cid)
        return cid

    def remove_all_pods(self) -> None:
        for pod in self.json("pods", "-o", "json").get("items") or []:
            self.crictl("stopp", pod["id"], check=False)
            self.crictl("rmp", pod["id"], check=False)


@dataclass
class Pod:
    server: Crictl
    id: str
    config: dict
    config_path: Path

    def ip(self) -> str:
        return self.server.json("inspectp", self.id)["status"]["network"]["ip"]


def remove_cgroup(parent: str) -> None:
    """The pod's cgroup parent in every hierarchy (v1) or the unified one; the runtime removes only the
    containers' and the pause's cgroups below it. A systemd slice (the systemd driver's) is stopped, as the
    kubelet stops a pod's slice."""
    if not parent:
        return
    if parent.endswith(".slice"):
        stop_slice(os.path.basename(parent.rstrip("/")))
        return
    root = Path("/sys/fs/cgroup")
    candidates = [root / parent.lstrip("/")] if (root / "cgroup.controllers").exists() else [
        h / parent.lstrip("/") for h in root.iterdir() if h.is_dir() and not h.is_symlink()]
    for path in candidates:
        hosts.remove_cgroup(path)


def stop_slice(name: str) -> None:
    """Stops a slice and what is left in it; one that is not there is stopped already."""
    subprocess.run(["systemctl", "stop", name], capture_output=True, timeout=60)


def cgroup_file(parent: str, cid: str, v1: str, v2: str) -> Path:
    """A container's cgroup file under its pod's parent: `v1` (e.g. memory/memory.limit_in_bytes) on a v1 host,
    `v2` (memory.max) on a unified one."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return root / parent.lstrip("/") / cid / v2
    controller, name = v1.split("/", 1)
    return root / controller / parent.lstrip("/") / cid / name


@contextlib.contextmanager
def running_cri(tmp: Path, cgroup_driver: str | None = None, runtime: str = "pyruntime-cri") -> Iterator[Crictl]:
    """A CriNode on its own bridge (`runtime` "containerd": containerd_cri's containerd, the CNI helper off as
    for the kubelet tests) with busybox and httpd pulled, driven by crictl, until the block ends; then every pod
    goes, and whatever is left on the host is removed and reported. `cgroup_driver`: the daemon's (its default
    if None); with systemd, TEST_SLICE is stopped at the end too."""
    with critest_registry(tmp / "mirror") as mirror:
        before = HostState.take()
        work = Path(tempfile.mkdtemp(prefix="pynode-crinode-", dir="/var/tmp"))  # CriNode's own default
        leaks = ""
        try:
            with _endpoint(runtime, mirror.hosts_dir, work, cgroup_driver) as node:
                server = Crictl(node)
                with server.pod("warm-up"):  # the bridge exists before any test looks
                    pass
                for image in (BUSYBOX, HTTPD):
                    server.crictl("pull", image)
                yield server
        finally:
            try:
                if cgroup_driver == "systemd":
                    stop_slice(f"{TEST_SLICE}.slice")
            finally:
                leaks = cleanup(before, work, {mirror.registry_pid})
    if leaks:
        raise AssertionError(f"{runtime} left behind: {leaks}")


@contextlib.contextmanager
def _endpoint(runtime: str, hosts_dir: Path, work: Path, cgroup_driver: str | None
              ) -> Iterator[CriNode | ContainerdCri]:
    if runtime == "containerd":
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PYCNI_HELPER", "off")  # containerd runs the plugins with its environment
            with containerd_cri(work, hosts_dir, cgroup_driver) as endpoint:
                yield endpoint
        return
    node = CriNode(hosts_dir, bridge="pyt-crie2e0", subnet="10.236.0.0/16", cgroup_driver=cgroup_driver,
                   work=work)
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


@pytest.fixture(scope="module")
def cri_server(tmp_path_factory) -> Iterator[Crictl]:
    if not CRICTL.exists():
        pytest.skip(f"{CRICTL} is missing: run `make peers`")
    with running_cri(tmp_path_factory.mktemp("cri-server")) as server:
        yield server
