"""pykubelet's graceful node shutdown against a real systemd-logind (the lab's systemd VM; on a host whose system
bus has no logind, as this project's machine, it skips), driven as Kubernetes' e2e_node drives the stock kubelet's
(test/e2e_node/node_shutdown_linux_test.go): a standalone pykubelet on pyruntime-cri, and on containerd 1.6
(Debian's, with runc: skipped with its reason where it is missing), with shutdownGracePeriod and
shutdownGracePeriodCriticalPods, holds logind's delay lock (raising InhibitDelayMaxSec with its drop-in when
logind's is shorter); a PrepareForShutdown(true) sent with dbus-send stops the pod below system-critical
priority first, with its group's grace, then the critical static pod (priority 2000001000, as kubeadm's
control plane manifests have it), and releases the lock; PrepareForShutdown(false) takes it again, and the
killed pods stay down.

Both pods' containers ignore SIGTERM (a pid 1 without a handler), so each stops at its grace period's SIGKILL:
the times they stop are the grace periods. logind is left as found: the drop-in removed (or its earlier content
put back), logind reloaded, and a PrepareForShutdown(false) sent, as the e2e's AfterEach does.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import api_pb2
from pykubelet import runtime as cri
from pynode_cluster.hosts import wait_for
from pynode_os import logind
from pynode_os.systemd import SystemdError, open_bus, reply
from tests.conformance.critest import critest_registry
from tests.integration.cni_helpers import hostport_state, remove_hostport_state
from tests.kit import containerd_cri
from tests.kit.cri_server import BUSYBOX, CriNode
from tests.kit.kubelet_node import Kubelet, kubepods_dirs, remove_new_cgroups

NODE, NODE_IP = "pynode-shutdown", "10.201.0.44"
GRACE, CRITICAL_GRACE = 8, 4  # the pods below system-critical get 8 - 4 s, then the critical ones 4 s
SLACK = 3.0  # a kill's start and the runtime's stop, over the grace period
SLEEPER = ["sh", "-c", "echo started; exec sleep 3600"]  # pid 1 ignores SIGTERM: killed at its grace's end
CONF_DIR = Path(logind.CONF_DIR)
DROP_IN = CONF_DIR / logind.KUBELET_CONF
LOCK = ("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay")


def _logind_problem() -> str | None:
    """Why this host cannot run the test, None if it can."""
    if shutil.which("dbus-send") is None:
        return "no dbus-send"
    try:
        client = logind.DBusLogind()
    except SystemdError as e:
        return str(e)
    try:
        client.inhibit_delay()
    except SystemdError as e:
        return f"logind does not answer on the system bus: {e}"
    finally:
        client.close()
    return None


PROBLEM = _logind_problem()
pytestmark = [pytest.mark.skipif(PROBLEM is not None, reason=f"needs systemd-logind on the system bus ({PROBLEM}): "
                                                             "the lab's systemd VM has it (make test-lab-v2)"),
              pytest.mark.usefixtures("restore_forwarding")]


def emit(shutting_down: bool) -> None:
    """PrepareForShutdown as Kubernetes' e2e sends it: from the test, not from logind."""
    subprocess.run(["dbus-send", "--system", "--type=signal", logind.LOGIND_PATH,
                    f"{logind.LOGIND_INTERFACE}.PrepareForShutdown", f"boolean:{str(shutting_down).lower()}"],
                   check=True, timeout=10)


def locks_of(pid: int) -> list[tuple]:
    """logind's inhibitors held by process `pid` (ListInhibitors: what, who, why, mode, uid, pid)."""
    from jeepney import DBusAddress, new_method_call
    conn = open_bus()
    try:
        (inhibitors,) = reply(conn, new_method_call(
            DBusAddress(logind.LOGIND_PATH, logind.LOGIND_BUS_NAME, logind.LOGIND_INTERFACE), "ListInhibitors"))
    finally:
        conn.close()
    return [tuple(i[:4]) for i in inhibitors if i[5] == pid]


def inhibit_delay() -> float:
    client = logind.DBusLogind()
    try:
        return client.inhibit_delay()
    finally:
        client.close()


@pytest.fixture
def logind_as_found() -> Iterator[float]:
    """logind's InhibitDelayMaxSec now; afterwards, the kubelet's drop-in gone (or as it was) and logind
    reloaded with it, and no shutdown left announced."""
    before = DROP_IN.read_bytes() if DROP_IN.exists() else None
    made_dir = not CONF_DIR.exists()
    delay = inhibit_delay()
    yield delay
    emit(False)
    if before is None:
        DROP_IN.unlink(missing_ok=True)
        if made_dir:
            shutil.rmtree(CONF_DIR, ignore_errors=True)
    else:
        DROP_IN.write_bytes(before)
    subprocess.run(["systemctl", "kill", "--signal=HUP", logind.LOGIND_UNIT], check=True, timeout=30)
    wait_for("logind's InhibitDelayMaxSec as it was", lambda: inhibit_delay() == delay, timeout=10)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    with critest_registry(tmp_path_factory.mktemp("registry")) as m:
        yield m


@pytest.fixture(params=["pyruntime-cri", "containerd"])
def node(request, mirror, tmp_path: Path) -> Iterator[str]:
    """The CRI endpoint of the runtime, serving, with busybox pulled; its pods are the kubelet's to remove."""
    if request.param == "containerd" and (missing := containerd_cri.missing()) is not None:
        pytest.skip(missing)
    shared_chains = hostport_state()
    try:
        with _runtime(request.param, mirror.hosts_dir, tmp_path / "cri") as url:
            runtime = cri.CRIRuntime(url, timeout=120)
            try:
                runtime.pull_image(BUSYBOX)
            finally:
                runtime.close()
            yield url
    finally:
        remove_hostport_state(shared_chains)


@contextlib.contextmanager
def _runtime(name: str, hosts_dir: Path, work: Path) -> Iterator[str]:
    if name == "containerd":
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PYCNI_HELPER", "off")  # containerd runs our plugins with its environment: no helper left
            with containerd_cri.containerd_cri(work, hosts_dir) as endpoint:
                yield endpoint.url
        return
    n = CriNode(hosts_dir, bridge="pyt-shut0", subnet="10.241.0.0/24")
    try:
        n.start()
        yield n.url
    finally:
        n.cleanup()


def static_pod(name: str, priority: int | None = None) -> str:
    spec: dict = {"terminationGracePeriodSeconds": 120, "containers": [
        {"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": SLEEPER}]}
    if priority is not None:
        spec["priority"] = priority
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                       "spec": spec})


def test_a_shutdown_stops_the_pods_by_priority_within_their_grace_and_releases_loginds_lock(
        node: str, tmp_path: Path, logind_as_found: float) -> None:
    before = kubepods_dirs()  # kubepods and its QoS levels, which the kubelet keeps, are the test's to remove
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "web.json").write_text(static_pod("web"))
    (manifests / "critical.json").write_text(static_pod("critical", priority=2_000_001_000))
    kubelet = Kubelet.for_node(tmp_path / "kubelet", NODE, NODE_IP, node, None,
                               {"fileCheckFrequency": "1s", "shutdownGracePeriod": f"{GRACE}s",
                                "shutdownGracePeriodCriticalPods": f"{CRITICAL_GRACE}s"},
                               "--pod-manifest-path", str(manifests))
    runtime = cri.CRIRuntime(node, timeout=30)
    exited = lambda: not kubelet.running() and f"the kubelet exited: {kubelet.log_tail()}"  # noqa: E731

    def running() -> set[str]:
        return {c.metadata.name for c in runtime.list_containers(api_pb2.ContainerFilter(
            state=api_pb2.ContainerStateValue(state=api_pb2.CONTAINER_RUNNING)))}
    try:
        kubelet.start()
        wait_for("both static pods running", lambda: running() == {"web", "critical"}, timeout=90, failed=exited)
        assert kubelet.proc is not None
        pid = kubelet.proc.pid
        wait_for("the kubelet's delay lock", lambda: locks_of(pid) == [LOCK], timeout=20, failed=exited)
        if logind_as_found < GRACE:  # logind's shorter delay raised by the kubelet's drop-in
            assert DROP_IN.read_text() == f"# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={GRACE}\n"
            assert inhibit_delay() >= GRACE

        emit(True)
        start = time.monotonic()
        stopped: dict[str, float] = {}
        while len(stopped) < 2 and time.monotonic() - start < GRACE + 2 * SLACK:
            now, up = time.monotonic(), running()
            stopped.update(dict.fromkeys({"web", "critical"} - up - stopped.keys(), now - start))
            time.sleep(0.1)
        log = kubelet.log_tail(1 << 20)
        assert set(stopped) == {"web", "critical"}, log[-3000:]
        first = GRACE - CRITICAL_GRACE
        assert first - 1 <= stopped["web"] <= first + SLACK, (stopped, log[-3000:])  # its group's grace, not its own
        assert stopped["critical"] - stopped["web"] >= CRITICAL_GRACE - 1, stopped  # after the first group
        assert stopped["critical"] <= GRACE + SLACK, stopped
        wait_for("the lock released", lambda: locks_of(pid) == [], timeout=SLACK, failed=exited)
        assert "node shutdown manager: shutdown event" in log

        emit(False)
        wait_for("the lock taken again", lambda: locks_of(pid) == [LOCK], timeout=10, failed=exited)
        time.sleep(3)
        assert running() == set(), "a pod killed for the shutdown started again"

        for manifest in manifests.iterdir():
            manifest.unlink()
        wait_for("the static pods gone", lambda: not runtime.list_pod_sandbox() and not runtime.list_containers(),
                 timeout=60, failed=exited)
        kubelet.stop()
        assert kubelet.proc.returncode == 0, kubelet.log_tail()
        assert locks_of(pid) == []
    finally:
        kubelet.stop()
        runtime.close()
        remove_new_cgroups(before)
