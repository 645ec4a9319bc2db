"""`pynode run` and `pynode stop` (`make run`, `make stop`): a real node on this machine, with nothing but the
installed package, its Debian packages and Debian's busybox-static (no peer of the tests, no checkout).

`pynode run` (`up`) starts, in the background, pyruntime-cri (the CRI server) and pykubelet in standalone mode
(no API server) on it, with the static pod manifest static-web.yaml of this package: busybox httpd serving a
page. The image is the busybox image built from Debian's busybox-static (busybox.py) and imported into
pyruntime-cri's image store with `pyruntime image import` (the CRI has no import; the manifest says
imagePullPolicy Never, so no registry is ever asked). It waits until the pod runs, prints its IP and the page
it gets from it, and leaves it running. A second `pynode run` finds the node running, changes nothing and
prints the same.

`pynode stop` (`down`) undoes all of it, in the order a node is taken down: the manifest goes and the kubelet
removes the pod (containers, sandbox and IP, cgroup, logs), then the kubelet stops, then the CRI server, then
what the pod network left (the bridge) and the node's directories. It is idempotent too.

The node is wired as every node is (node.StandaloneNode), in directories of its own (VAR and RUN below: a
CNI conf and bin dir, host-local IPAM data), on a bridge and a cgroup root of its own, so a run neither
needs nor touches /etc/cni, /opt/cni or another kubelet's cgroups, and a stop can remove exactly what a run
made. A daemon is signalled only when its pid file names a live process whose command line is that daemon's.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import psutil

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.pods.termination import cgroup_hierarchies
from pynode_cluster import hosts
from pynode_cluster.busybox import build_busybox_image
from pynode_cluster.hosts import wait_for
from pynode_cluster.node import Node, StandaloneNode, launcher
from pynode_os.files import atomic_write
from pyruntime.cri.model import Layout

VAR = Path("/var/lib/pynode-run")
RUN = Path("/run/pynode-run")
NODE = StandaloneNode(Node("pynode", "127.0.0.1", VAR, RUN), bridge="pynode-run0", subnet="10.89.0.0/16",
                      cgroup_root="/pynode-run")
SOCKET, ENDPOINT = NODE.node.sock, NODE.node.endpoint
MANIFEST = "static-web.yaml"  # package data (setup.cfg)
POD = f"static-web-{NODE.node.name}"
IMAGE = "localhost/pynode/busybox:latest"
LOGS = VAR / "logs"
STOP_COMMAND = "pynode stop"


# --- progress -----------------------------------------------------------------------------------------------

@contextmanager
def step(what: str) -> Iterator[None]:
    """One step of the start: a spinner on a terminal, plain lines otherwise; its time when it ends."""
    start = time.monotonic()
    tty = sys.stdout.isatty()
    done = threading.Event()

    def spin() -> None:
        for frame in itertools.cycle("|/-\\"):
            sys.stdout.write(f"\r  {frame} {what} ({time.monotonic() - start:.0f} s)")
            sys.stdout.flush()
            if done.wait(0.1):
                return
    spinner = threading.Thread(target=spin, daemon=True) if tty else None
    if spinner is not None:
        spinner.start()
    else:
        print(f"  .. {what}", flush=True)
    ok = False
    try:
        yield
        ok = True
    finally:
        done.set()
        if spinner is not None:
            spinner.join()
            sys.stdout.write("\r\033[K")
        print(f"  {'ok' if ok else 'FAILED'} {what} ({time.monotonic() - start:.1f} s)", flush=True)


# --- the daemons --------------------------------------------------------------------------------------------

class Daemon:
    """A background process of the node, known by its pid file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid_file, self.log = RUN / f"{name}.pid", LOGS / f"{name}.log"

    def pid(self) -> int | None:
        """The daemon's pid if it runs (a live, non-zombie process whose command line is the daemon's)."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        if state == "Z" or not any(Path(os.fsdecode(a)).name == self.name for a in cmdline[:2]):
            return None
        return pid

    def start(self, argv: list[str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.pid_file.write_text(str(proc.pid))

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout: float = 30) -> None:
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                hosts.terminate(psutil.Process(pid), timeout)
        self.pid_file.unlink(missing_ok=True)


CRI_SERVER, KUBELET = Daemon("pyruntime-cri"), Daemon("pykubelet")


# --- up ------------------------------------------------------------------------------------------------------

def image_store() -> Path:
    """pyruntime-cri's image store under the node's CRI root."""
    return Path(Layout(str(NODE.node.cri_root), str(NODE.node.cri_state)).images)


def import_image() -> None:
    """The busybox image, built here and imported into pyruntime-cri's own store with the image CLI."""
    with tempfile.TemporaryDirectory(prefix="pynode-run-") as tmp:
        work = Path(tmp)
        image = build_busybox_image(work / "layout", work / "build")
        archive = work / "busybox.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(image.layout, arcname=".")
        subprocess.run([launcher("pyruntime"), "image", "import", "--name", IMAGE, str(archive)], check=True,
                       capture_output=True, env={**os.environ, "PYRUNTIME_IMAGE_ROOT": str(image_store())})


def the_pod(runtime: cri.CRIRuntime) -> tuple[str, str] | None:
    """(pod IP, container id) once the static pod's container runs."""
    for sandbox in runtime.list_pod_sandbox(api_pb2.PodSandboxFilter(label_selector={"io.kubernetes.pod.name": POD})):
        if sandbox.state != api_pb2.SANDBOX_READY:
            continue
        for c in runtime.list_containers(api_pb2.ContainerFilter(pod_sandbox_id=sandbox.id)):
            if c.state == api_pb2.CONTAINER_RUNNING:
                return runtime.pod_sandbox_status(sandbox.id).status.network.ip, c.id
    return None


def fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode(errors="replace").strip()
    except OSError:
        return None


def up() -> int:
    RUN.mkdir(parents=True, exist_ok=True)
    VAR.mkdir(parents=True, exist_ok=True)
    already = CRI_SERVER.pid() is not None and KUBELET.pid() is not None
    print("the node is already running" if already else "starting a node: pyruntime-cri + pykubelet (standalone)")
    if CRI_SERVER.pid() is None:
        with step(f"installing the pod network (CNI plugins, bridge {NODE.bridge}, {NODE.subnet})"):
            argv = NODE.runtime_argv()
        if not image_store().exists():
            with step(f"importing the busybox image as {IMAGE}"):
                import_image()
        with step("starting pyruntime-cri"):
            CRI_SERVER.start(argv)
            client = cri.CRIRuntime(ENDPOINT, timeout=10)
            try:
                wait_for("pyruntime-cri to answer", lambda: SOCKET.exists() and _answers(client), 60)
            except TimeoutError:
                print(CRI_SERVER.log_tail(), file=sys.stderr)
                raise
            finally:
                client.close()
    NODE.manifests.mkdir(exist_ok=True)
    manifest, text = NODE.manifests / MANIFEST, resources.files("pynode_cluster").joinpath(MANIFEST).read_text()
    if not manifest.exists() or manifest.read_text() != text:
        atomic_write(manifest, text.encode(), mode=0o644)  # the kubelet reads the directory while it runs
    if KUBELET.pid() is None:
        with step("starting pykubelet in standalone mode"):
            KUBELET.start(NODE.kubelet_argv())
    runtime = cri.CRIRuntime(ENDPOINT, timeout=30)
    try:
        with step(f"waiting for the static pod {POD}"):
            try:
                found = wait_for(f"pod {POD} to run", lambda: the_pod(runtime), 120)
            except TimeoutError:
                print(KUBELET.log_tail(), file=sys.stderr)
                raise
        ip, container = found
        with step(f"asking http://{ip}/"):
            answer = wait_for(f"an answer from {ip}", lambda: fetch(f"http://{ip}/"), 30)
    finally:
        runtime.close()
    print(f"\npod {POD} (static pod of {manifest}) runs, container {container[:12]}")
    print(f"pod IP: {ip}")
    print(f"GET http://{ip}/ -> {answer}")
    print(f"\nlogs: {LOGS}; the CRI endpoint (crictl --runtime-endpoint): {ENDPOINT}")
    print(f"stop it (pod, kubelet, CRI server, network, state) with: {STOP_COMMAND} (`make stop` in a checkout)")
    return 0


def _answers(client: cri.CRIRuntime) -> bool:
    try:
        client.version()
        return True
    except cri.CRIError:
        return False


# --- down ----------------------------------------------------------------------------------------------------

def _mounts_under(*roots: Path) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4]
        if any(target == str(r) or target.startswith(f"{r}/") for r in roots):
            found.append(target)
    return found


def remove_all_pods(runtime: cri.CRIRuntime) -> None:
    """What the kubelet did not remove (it was not running): every pod of this node's own CRI server."""
    for c in runtime.list_containers():
        try:
            runtime.stop_container(c.id, 5)
            runtime.remove_container(c.id)
        except cri.NotFound:
            pass
    for s in runtime.list_pod_sandbox():
        try:
            runtime.stop_pod_sandbox(s.id)
            runtime.remove_pod_sandbox(s.id)
        except cri.NotFound:
            pass


def remove_cgroups() -> None:
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / NODE.cgroup_root.strip("/")
        if not root.is_dir():
            continue
        for problem in hosts.remove_cgroup_tree(root):
            print(f"  {problem}", file=sys.stderr)


def down() -> int:
    if not VAR.exists() and not RUN.exists():
        print("no node is running: nothing to stop")
        return 0
    cri_running = CRI_SERVER.pid() is not None
    runtime = cri.CRIRuntime(ENDPOINT, timeout=30) if cri_running else None
    try:
        if runtime is not None and KUBELET.pid() is not None:
            live = runtime
            with step(f"removing the static pod {POD} (pykubelet stops and removes it)"):
                for manifest in NODE.manifests.glob("*"):
                    manifest.unlink()
                wait_for("the pod to go", lambda: not live.list_pod_sandbox(), 90)
        with step("stopping pykubelet"):
            KUBELET.stop()
        if runtime is not None:
            with step("stopping pyruntime-cri"):
                remove_all_pods(runtime)
                runtime.close()
                runtime = None
                CRI_SERVER.stop()
            # its plugins started the host's CNI helper (pyruntime-cri gives them no PYCNI_* settings), which
            # would stay for its idle time; asked to stop, it exits (the next plugin call starts another)
            with step("stopping the CNI helper"):
                from cni_plugins import helper, launch
                helper.stop(launch.DEFAULT_NAME)
    finally:
        if runtime is not None:
            runtime.close()
    with step("removing the network, cgroups and state"):
        if Path(f"/sys/class/net/{NODE.bridge}").exists():
            subprocess.run(["ip", "link", "del", NODE.bridge], check=True)
        remove_cgroups()
        left = _mounts_under(VAR, RUN)
        if left:
            raise RuntimeError(f"mounts left under the node's directories, not removing them: {', '.join(left)}")
        shutil.rmtree(VAR, ignore_errors=True)
        shutil.rmtree(RUN, ignore_errors=True)
    print("the node is stopped and removed")
    return 0

