"""A running pyruntime-cri for root tests that drive it as a client does (crictl), with the host left as found.

One daemon per test module (`cri_server` fixture): its own root, state, socket and CNI conf dir under a scratch
directory, its pods on a bridge and subnet no other suite uses, and the test registry (tests/kit/cri_images.py)
as the mirror of every registry, so `crictl pull` of busybox or the httpd stand-in never leaves the machine.
The endpoint, the registry and the host clean-up are tests/conformance/critest.py's, shared rather than
written again.

Per-test leak checks (tests/conftest.py) see only what a test makes: the daemon, the launcher and the bridge
exist before the first test (a warm-up pod makes the bridge), and every test removes its pods (`pod()`).
Teardown removes whatever is still there (stopp/rmp of every pod), stops the daemon, then critest's clean-up
removes anything left that was not there before (processes, mounts, cgroups, links, chains) and fails the
module if something could not be removed.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conformance.critest import CRICTL, HostState, PyruntimeCri, cleanup, critest_registry

BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
HTTPD = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4"  # busybox httpd on port 80, index.html "It works!"
HTTPD_INDEX = "It works!"
BRIDGE = "pyt-crie2e0"
SUBNET = "10.236.0.0/16"
CGROUP_PREFIX = "pynode-crie2e"


class E2eCri(PyruntimeCri):
    name = "pyruntime-cri-e2e"
    bridge = BRIDGE
    subnet = SUBNET


@dataclass
class CriServer:
    endpoint: E2eCri
    work: Path
    _serial: int = field(default=0)

    def argv(self, *args: str) -> list[str]:
        url = self.endpoint.url
        return [str(CRICTL), "--runtime-endpoint", url, "--image-endpoint", url, "--timeout", "60s", *args]

    def crictl(self, *args: str, check: bool = True, input: str | None = None,
               timeout: float = 90) -> subprocess.CompletedProcess:
        """crictl against this daemon; check=True raises with its output and the daemon's log tail."""
        result = subprocess.run(self.argv(*args), capture_output=True, text=True, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"crictl {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n"
                                 f"{result.stderr}\ndaemon log:\n{self.endpoint.log_tail()}")
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
        its own (removed by `pod()` as the kubelet removes a pod's cgroup)."""
        uid = f"uid-{name}-{time.monotonic_ns()}"
        config: dict = {"metadata": {"name": name, "namespace": "crie2e", "uid": uid, "attempt": 0},
                  "log_directory": str(self.work / "logs" / uid),
                  "linux": {"cgroup_parent": f"/{CGROUP_PREFIX}-{name}"}}
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
    server: CriServer
    id: str
    config: dict
    config_path: Path

    def ip(self) -> str:
        return self.server.json("inspectp", self.id)["status"]["network"]["ip"]


def remove_cgroup(parent: str) -> None:
    """The pod's cgroup parent in every hierarchy (v1) or the unified one; the runtime removes only the
    containers' and the pause's cgroups below it."""
    if not parent:
        return
    root = Path("/sys/fs/cgroup")
    candidates = [root / parent.lstrip("/")] if (root / "cgroup.controllers").exists() else [
        h / parent.lstrip("/") for h in root.iterdir() if h.is_dir() and not h.is_symlink()]
    for path in candidates:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def cgroup_file(parent: str, cid: str, v1: str, v2: str) -> Path:
    """A container's cgroup file under its pod's parent: `v1` (e.g. memory/memory.limit_in_bytes) on a v1 host,
    `v2` (memory.max) on a unified one."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return root / parent.lstrip("/") / cid / v2
    controller, name = v1.split("/", 1)
    return root / controller / parent.lstrip("/") / cid / name


@contextlib.contextmanager
def running_cri(tmp: Path) -> Iterator[CriServer]:
    with critest_registry(tmp / "mirror") as mirror:
        before = HostState.take()
        work = Path(tempfile.mkdtemp(prefix="pynode-crie2e-", dir="/var/tmp"))
        endpoint = E2eCri(work, mirror.hosts_dir)
        server = CriServer(endpoint, work)
        leaks = ""
        try:
            endpoint.start()
            with server.pod("warm-up"):  # the bridge exists before any test looks
                pass
            for image in (BUSYBOX, HTTPD):
                server.crictl("pull", image)
            yield server
        finally:
            try:
                if endpoint.proc is not None and endpoint.proc.poll() is None:
                    server.remove_all_pods()
            finally:
                endpoint.stop()
                leaks = cleanup(before, work, {mirror.registry_pid})
    if leaks:
        raise AssertionError(f"pyruntime-cri left behind: {leaks}")


@pytest.fixture(scope="module")
def cri_server(tmp_path_factory) -> Iterator[CriServer]:
    if not CRICTL.exists():
        pytest.skip(f"{CRICTL} is missing: run `make peers`")
    with running_cri(tmp_path_factory.mktemp("cri-server")) as server:
        yield server
