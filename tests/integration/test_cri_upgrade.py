"""Daemons safe to upgrade under (issue 23): a node keeps working once the code it was started from is gone, and
the previous release's node is taken over by the new code with its pods running.

An operator upgrades with `pip install -U` or a `git pull` of the editable install, or removes an old checkout,
under running daemons. pyruntime-cri, its launcher, supervisors and puller, and pykubelet imported at start
whatever they run later (their PRELOAD, tests/unit/test_preload.py), so with the code gone they still stop,
exec into, pull for and remove pods; before, every StopContainer failed on "No module named
'pyruntime.linux.cgroups.v1'". An upgrade restarts the daemons but not the pods: the new pyruntime-cri reads the
records, state.json files, exit records, CNI cache, IPAM store, pinned namespaces and images the previous
release's made, and drives its supervisors and pauses.

The daemons here run on the venv's interpreter without the venv (whose editable install's path hook would find
this checkout's modules whatever is removed), with the code they run and the venv's dependencies on
PYTHONPATH: a copy of this checkout's packages, which the test then renames away, or the previous release's
packages, extracted from git.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from proto import api_pb2
from pykubelet import runtime as cri
from pynode_cluster.hosts import wait_for
from tests.conformance.critest import critest_registry
from tests.integration.cni_helpers import chains_for, hostport_state, remove_hostport_state
from tests.kit.cri_server import BUSYBOX, HTTPD, Crictl, CriNode, Pod, remove_cgroup
from tests.kit.kubelet_node import Kubelet, kubepods_dirs, remove_new_cgroups

pytestmark = pytest.mark.usefixtures("restore_forwarding")

REPO = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = "7966453"  # the last commit before issue 23's redesign
SITE = sysconfig.get_paths()["purelib"]  # the venv's dependencies
PYTHON = os.path.realpath(sys.executable)  # the venv's interpreter, not the venv: no .pth of its site runs
PACKAGES = ("cni_plugins", "proto", "pykubelet", "pynode_os", "pyruntime")  # what the node's daemons import
SLEEPER = ["sh", "-c", "echo started; exec sleep 3600"]
MISSING = "No module named"


def python(code: Path, entry: str) -> list[str]:
    """The command line of `entry` (a module whose main() is a command) run from the packages in `code`."""
    return ["env", f"PYTHONPATH={code}{os.pathsep}{SITE}", PYTHON, "-P", "-c",
            f"import sys; sys.argv[0] = {entry!r}; from {entry} import main; main()"]


def copy_code(to: Path) -> Path:
    for package in PACKAGES:
        if (REPO / package).is_dir():
            shutil.copytree(REPO / package, to / package, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def previous_release(to: Path) -> Path:
    """The previous release's packages, from this checkout's git history."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the previous release's code comes from its history")
    git = ["git", "-C", str(REPO)]
    missing = subprocess.run([*git, "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True).returncode
    shallow = subprocess.run([*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True,
                             check=True).stdout.strip() == "true"
    if missing and shallow:  # a full clone without it fails below: the history was rewritten
        pytest.skip(f"a shallow clone: the previous release ({PREVIOUS_RELEASE}) is not in it (git fetch --unshallow)")
    to.mkdir(parents=True)
    archive = subprocess.run([*git, "archive", PREVIOUS_RELEASE, "pyruntime", "proto", "cni_plugins"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(to)], input=archive, check=True)
    return to


class CodeNode(CriNode):
    """A CriNode whose daemon runs the packages in `code` and whose CNI plugins are those in `plugins`, installed
    as that code installs them (None: this checkout's, as installed)."""
    code: Path | None = None
    plugins: Path | None = None
    cgroup_parents: list[str]  # of the pods a test made, which the kubelet would remove

    def argv(self) -> list[str]:
        if self.code is None:
            return super().argv()
        return [*python(self.code, "pyruntime.cri.main"), *super().argv()[1:]]

    def cni_setup(self) -> None:
        super().cni_setup()
        if self.plugins is not None:  # the venv's interpreter, which the launchers name, runs them with -IS
            subprocess.run(["env", f"PYTHONPATH={self.plugins}", sys.executable, "-P", "-c",
                            "import sys; from pathlib import Path; from cni_plugins.install import install; "
                            "install(Path(sys.argv[1]))", str(self.work / "cni-real")], check=True)

    def daemon_log(self) -> str:
        return (self.work / "daemon.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    with critest_registry(tmp_path_factory.mktemp("registry")) as m:
        yield m


@pytest.fixture
def node(mirror) -> Iterator[CodeNode]:
    n = CodeNode(mirror.hosts_dir, bridge="pyt-upgr0", subnet="10.240.0.0/24")
    n.cgroup_parents = []
    shared_chains = hostport_state()
    try:
        yield n
    finally:
        n.code = n.plugins = None  # whatever the test left of its code: this checkout's removes what is left
        try:
            n.cleanup()
        finally:
            for parent in n.cgroup_parents:
                remove_cgroup(parent)
            remove_hostport_state(shared_chains)  # the portmap plugin's, which it leaves as the reference's does


@contextlib.contextmanager
def removed(code: Path) -> Iterator[None]:
    """`code` renamed away for the block, as a removed checkout: a module not yet loaded can't be found."""
    gone = code.with_name(code.name + ".gone")
    code.rename(gone)
    try:
        yield
    finally:
        gone.rename(code)


def pod(c: Crictl, name: str, **extra) -> Pod:
    """A pod made with crictl runp; stopped and removed by remove_pod, not at the end of a block, since it
    outlives the daemon that made it."""
    config = c.pod_config(name, **extra)
    path = c.write(f"pod-{name}", config)
    assert isinstance(c.node, CodeNode)
    c.node.cgroup_parents.append(config["linux"]["cgroup_parent"])
    return Pod(c, c.crictl("runp", str(path)).stdout.strip(), config, path)


def container(c: Crictl, pod: Pod, name: str, **kw) -> str:
    cid = c.crictl("create", pod.id, str(c.write(f"ctr-{name}", c.container_config(name, **kw))),
                   str(pod.config_path)).stdout.strip()
    c.crictl("start", cid)
    return cid


def remove_pod(c: Crictl, pod: Pod) -> None:
    c.crictl("stopp", pod.id)
    c.crictl("rmp", pod.id)


def exec_out(c: Crictl, cid: str, *argv: str) -> str:
    return c.crictl("exec", "-s", cid, *argv).stdout.strip()


def test_pyruntime_cri_serves_on_once_its_code_is_removed(node: CodeNode, tmp_path: Path) -> None:
    """Everything a kubelet asks of a node after its checkout is gone: stop and remove a running pod (the
    daemon's), exec into its container (the launcher's exec helper), pull an image (the puller) and run a new
    pod with a shared pid namespace (the launcher's pause and supervisor, the container's create)."""
    c = Crictl(node)
    node.code = copy_code(tmp_path / "code")
    node.start()
    c.crictl("pull", BUSYBOX)
    before = pod(c, "before")
    cid = container(c, before, "main", command=SLEEPER)
    wait_for("the container's first line", lambda: "started" in c.crictl("logs", cid).stdout, timeout=20)
    with removed(node.code):
        assert exec_out(c, cid, "echo", "hi") == "hi"
        c.crictl("stats", "--id", cid)
        c.crictl("pull", HTTPD)
        after = pod(c, "after")
        web = container(c, after, "web", image=HTTPD)
        assert exec_out(c, web, "echo", "new") == "new"
        for p, ctr in ((before, cid), (after, web)):
            c.crictl("stop", "--timeout", "1", ctr)
            c.crictl("rm", ctr)
            remove_pod(c, p)
        assert c.json("pods", "-o", "json")["items"] == [] and c.json("ps", "-a", "-o", "json")["containers"] == []
        assert node.allocated_ips() == set()
        node.stop()
    assert MISSING not in node.daemon_log(), node.daemon_log()[-3000:]


def static_pod(name: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": SLEEPER}]}})


def test_pykubelet_runs_and_removes_pods_once_its_code_is_removed(node: CodeNode, tmp_path: Path) -> None:
    """A standalone pykubelet and its pyruntime-cri, both from a copy of the code, run a static pod; with the
    copy gone, a new manifest still starts a pod, removing the manifests still stops and removes both, and the
    kubelet exits cleanly."""
    before = kubepods_dirs()  # kubepods and its QoS levels, which the kubelet keeps, are the test's to remove
    code = node.code = copy_code(tmp_path / "code")
    node.start()
    Crictl(node).crictl("pull", BUSYBOX)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    kubelet = Kubelet.for_node(tmp_path / "kubelet", "pynode-upgrade", "10.201.0.37", node.url, None,
                               {"fileCheckFrequency": "1s"}, "--pod-manifest-path", str(manifests))
    kubelet.argv = [*python(code, "pykubelet.main"), *kubelet.argv[1:]]
    runtime = cri.CRIRuntime(node.url, timeout=30)
    exited = lambda: not kubelet.running() and "the kubelet exited"  # noqa: E731

    def running(name: str) -> bool:
        containers = runtime.list_containers(api_pb2.ContainerFilter(state=api_pb2.ContainerStateValue(
            state=api_pb2.CONTAINER_RUNNING)))
        return any(x.metadata.name == name for x in containers)
    try:
        (manifests / "early.json").write_text(static_pod("early"))
        kubelet.start()
        wait_for("the first static pod running", lambda: running("early"), timeout=90, failed=exited)
        with removed(code):
            (manifests / "late.json").write_text(static_pod("late"))
            wait_for("the second static pod running", lambda: running("late"), timeout=90, failed=exited)
            for manifest in manifests.iterdir():
                manifest.unlink()
            wait_for("the static pods gone", lambda: not runtime.list_pod_sandbox() and not runtime.list_containers(),
                     timeout=60, failed=exited)
            kubelet.stop()
            assert kubelet.proc is not None and kubelet.proc.returncode == 0, kubelet.log_tail()
            node.stop()
        assert MISSING not in kubelet.log_tail(1 << 20), kubelet.log_tail()
        assert MISSING not in node.daemon_log(), node.daemon_log()[-3000:]
        assert node.allocated_ips() == set()
    finally:
        kubelet.stop()
        runtime.close()
        remove_new_cgroups(before)


def _info(c: Crictl, cid: str) -> dict:
    return c.json("inspect", cid)["info"]


def _puller(node: CodeNode) -> bool:
    """Whether the daemon has a puller, which the previous release's launcher did not fork: which code runs."""
    assert node.proc is not None
    return any(p.cmdline()[:1] == ["pyruntime-puller"] for p in psutil.Process(node.proc.pid).children(recursive=True))


def test_the_previous_release_node_is_taken_over_with_its_pods_running(node: CodeNode, tmp_path: Path) -> None:
    """The previous release's pyruntime-cri and CNI plugins make pods (one with a pause process and an exited
    container, one without a pause and with a host port), then stop; this checkout's take over the same root
    and state. Nothing is restarted: the same pods, containers, processes and addresses, the exit code kept;
    exec, logs and a new container from the image the old code pulled work; stopping and removing release all."""
    c = Crictl(node)
    node.code = node.plugins = previous_release(tmp_path / "previous")
    node.start()
    c.crictl("pull", BUSYBOX)
    assert not _puller(node)
    shared = pod(c, "shared")  # pid POD: a pause process
    own = {"security_context": {"namespace_options": {"pid": 1}}}
    ported = pod(c, "ported", linux=own, port_mappings=[{"container_port": 80, "host_port": 18097}])
    main = container(c, shared, "main", command=SLEEPER)
    done = container(c, shared, "done", command=["sh", "-c", "echo finished; exit 3"])
    other = container(c, ported, "other", command=SLEEPER)
    wait_for("the container's exit", lambda: c.json("inspect", done)["status"]["state"] == "CONTAINER_EXITED",
             timeout=20)
    before = {cid: _info(c, cid) for cid in (main, other)}
    pause = c.json("inspectp", shared.id)["info"]["pid"]
    ips = {p.id: p.ip() for p in (shared, ported)}
    assert pause and all(ips.values())
    old_log = node.daemon_log()
    node.stop()  # SIGTERM: the daemon goes, its pods stay

    node.code = node.plugins = None
    node.start()
    wait_for("this checkout's launcher and its puller", lambda: _puller(node), timeout=20)
    assert {p["id"]: p["state"] for p in c.json("pods", "-o", "json")["items"]} == {
        shared.id: "SANDBOX_READY", ported.id: "SANDBOX_READY"}
    states = {x["id"]: x["state"] for x in c.json("ps", "-a", "-o", "json")["containers"]}
    assert states == {main: "CONTAINER_RUNNING", other: "CONTAINER_RUNNING", done: "CONTAINER_EXITED"}
    assert c.json("inspect", done)["status"]["exitCode"] == 3
    assert "finished" in c.crictl("logs", done).stdout
    for cid, info in before.items():
        now = _info(c, cid)
        assert (now["pid"], now["supervisorPid"]) == (info["pid"], info["supervisorPid"])
        assert psutil.pid_exists(now["supervisorPid"])
    assert c.json("inspectp", shared.id)["info"]["pid"] == pause
    assert {p.id: p.ip() for p in (shared, ported)} == ips
    assert exec_out(c, main, "echo", "hi") == "hi"
    assert exec_out(c, other, "cat", "/proc/1/comm") == "sleep"
    added = container(c, shared, "added", command=SLEEPER)  # the image the old code pulled
    assert exec_out(c, added, "echo", "new") == "new"

    for cid in (main, done, other, added):
        c.crictl("stop", "--timeout", "1", cid)
        c.crictl("rm", cid)
    remove_pod(c, shared)
    remove_pod(c, ported)
    assert not psutil.pid_exists(pause) or psutil.Process(pause).status() == psutil.STATUS_ZOMBIE
    assert node.allocated_ips() == set()
    assert chains_for(node.network) == []  # the host port's and the masquerade's rules, from the old CNI cache
    assert c.json("pods", "-o", "json")["items"] == []
    assert MISSING not in old_log + node.daemon_log()
