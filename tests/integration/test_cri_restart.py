"""pyruntime-cri survives its own death: kill -9 of the daemon, of a supervisor, of a pause process, and of the
daemon in the middle of a RunPodSandbox, each followed by what a kubelet does next (list, status, stop,
remove). What must hold: running pods keep running and keep their ids, states and addresses; an exit that
happened meanwhile is reported; nothing is half made, hung or leaked (the leak check sees every process,
mount, link, cgroup and iptables rule; the IPAM store shows every address)."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import grpc
import psutil
import pytest

from proto import api_pb2
from tests.conformance.critest import critest_registry
from tests.kit.cri_server import BUSYBOX, CriNode
from tests.kit.kubelet_node import wait_for
from tests.leakcheck import reap_orphans

pytestmark = pytest.mark.usefixtures("restore_forwarding")

PODS = 10


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    with critest_registry(tmp_path_factory.mktemp("registry")) as m:
        yield m


@pytest.fixture
def node(mirror):
    n = CriNode(mirror.hosts_dir, bridge="pyt-crirst0", subnet="10.236.0.0/24")
    try:
        n.start()
        n.pull(BUSYBOX)
        yield n
    finally:
        n.cleanup()


def _info(response) -> dict:
    return json.loads(response.info["info"])


def _gone(pid: int) -> bool:
    reap_orphans()  # a process whose parent died is ours (the test is a subreaper): reap it to see it gone
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _snapshot(node: CriNode) -> tuple[dict, dict, dict]:
    pods = {p.id: p.state for p in node.pods()}
    containers = {c.id: (c.pod_sandbox_id, c.state) for c in node.containers()}
    ips = {pid: node.pod_status(pid).network.ip for pid in pods}
    return pods, containers, ips


def test_kill9_daemon_keeps_pods_and_reports_exits_meanwhile(node):
    running = {}
    for i in range(PODS):
        pod = node.run_pod(f"pod{i}", share_pid=i % 2 == 0)  # with a pause process, and held by pins alone
        running[pod] = node.run_container(pod, f"pod{i}")
    quitter_pod = node.run_pod("quitter")
    quitter = node.run_container(quitter_pod, "quitter", command=("sh", "-c", "sleep 2; exit 7"))
    pods, containers, ips = _snapshot(node)
    assert len(set(ips.values())) == PODS + 1 and all(ips.values())
    quitter_init = _info(node.rt.ContainerStatus(api_pb2.ContainerStatusRequest(
        container_id=quitter, verbose=True)))["pid"]
    supervisors = [_info(node.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=c, verbose=True)))
                   ["supervisorPid"] for c in running.values()]

    killed_at = time.time_ns()
    node.kill()
    wait_for("the quitter's exit while the daemon is down", lambda: _gone(quitter_init), timeout=15, interval=0.1)
    assert not any(_gone(pid) for pid in supervisors), "a supervisor died with the daemon"
    node.start()

    pods_after, containers_after, ips_after = _snapshot(node)
    assert pods_after == pods
    assert ips_after == ips
    assert node.allocated_ips() == set(ips.values())
    expected = dict(containers, **{quitter: (quitter_pod, api_pb2.CONTAINER_EXITED)})
    assert containers_after == expected
    assert all(state == api_pb2.CONTAINER_RUNNING for cid, (_, state) in containers_after.items() if cid != quitter)
    status = node.container_status(quitter)
    assert status.exit_code == 7
    assert killed_at < status.finished_at < time.time_ns()
    for cid in running.values():  # still alive: exec works in every one
        out = node.rt.ExecSync(api_pb2.ExecSyncRequest(container_id=cid, cmd=["hostname"], timeout=10), timeout=20)
        assert out.exit_code == 0 and out.stdout.decode().strip().startswith("pod")

    # GetContainerEvents after the restart: a stop is seen
    events: list = []
    stream = node.rt.GetContainerEvents(api_pb2.GetEventsRequest())

    def read() -> None:
        try:
            for event in stream:
                events.append(event)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.CANCELLED

    reader = threading.Thread(target=read)
    reader.start()
    try:
        victim = next(iter(running.values()))
        time.sleep(0.5)  # the subscription is registered
        node.rt.StopContainer(api_pb2.StopContainerRequest(container_id=victim, timeout=1), timeout=30)
        wait_for("the STOPPED event",
                 lambda: any(e.container_id == victim and e.container_event_type == api_pb2.CONTAINER_STOPPED_EVENT
                             for e in list(events)), timeout=10, interval=0.1)
    finally:
        stream.cancel()
        reader.join()
    for pod in list(pods):
        node.remove_pod(pod)
    assert node.pods() == [] and node.containers() == []
    assert node.allocated_ips() == set()


def _log_lines(path: Path) -> list[str]:
    """The messages of a CRI log file's whole lines (TIMESTAMP STREAM TAG MESSAGE), in order: the file is being
    written while the test reads it."""
    return [line.split(" ", 3)[3] for line in path.read_text().split("\n")[:-1]] if path.exists() else []


def test_kill9_daemon_loses_no_container_log_line(node):
    """The supervisors write the CRI logs, not the daemon: a container's lines written while the daemon is dead
    are in its log, in order, none lost or twice; a container that ends meanwhile has its last words logged;
    after the restart the logs go on and can still be reopened (the kubelet's rotation)."""
    pod = node.run_pod("chatty")
    counter = node.run_container(pod, "chatty", "counter", command=(
        "sh", "-c", "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.05; done"))
    quitter = node.run_container(pod, "chatty", "quitter", command=(
        "sh", "-c", "trap 'echo last words; exit 3' TERM; echo ready; while true; do sleep 0.05; done"))
    logs = node.work / "logs" / "chatty"
    counter_log = logs / "counter.log"
    wait_for("the counter's first lines", lambda: len(_log_lines(counter_log)) >= 5, timeout=15, interval=0.1)
    wait_for("the quitter's trap", lambda: _log_lines(logs / "quitter.log") == ["ready"], timeout=15, interval=0.1)
    quitter_init = _info(node.rt.ContainerStatus(api_pb2.ContainerStatusRequest(
        container_id=quitter, verbose=True)))["pid"]

    node.kill()
    at_kill = len(_log_lines(counter_log))
    psutil.Process(quitter_init).terminate()  # it ends while the daemon is dead
    wait_for("lines logged while the daemon is dead", lambda: len(_log_lines(counter_log)) >= at_kill + 20,
             timeout=15, interval=0.1)
    wait_for("the quitter's exit while the daemon is dead", lambda: _gone(quitter_init), timeout=15, interval=0.1)
    node.start()
    at_start = len(_log_lines(counter_log))
    wait_for("lines logged after the restart", lambda: len(_log_lines(counter_log)) >= at_start + 5,
             timeout=15, interval=0.1)
    counter_log.rename(logs / "counter.log.1")
    node.rt.ReopenContainerLog(api_pb2.ReopenContainerLogRequest(container_id=counter), timeout=10)
    wait_for("lines in the reopened log", lambda: len(_log_lines(counter_log)) >= 5, timeout=15, interval=0.1)

    lines = _log_lines(logs / "counter.log.1") + _log_lines(counter_log)
    assert lines == [f"line {i}" for i in range(len(lines))], lines
    assert _log_lines(logs / "quitter.log") == ["ready", "last words"]
    assert node.container_status(quitter).exit_code == 3
    node.remove_pod(pod)


def test_kill9_supervisor_reports_the_container_exited(node):
    pod = node.run_pod("orphaned")
    cid = node.run_container(pod, "orphaned")
    info = _info(node.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=cid, verbose=True)))
    init = psutil.Process(info["pid"])
    processes = [init, *init.children(recursive=True)]
    psutil.Process(info["supervisorPid"]).kill()
    status = wait_for("the container reported exited",
                      lambda: (s := node.container_status(cid)).state == api_pb2.CONTAINER_EXITED and s,
                      timeout=15, interval=0.1)
    assert status.exit_code == 255 and status.reason == "Error" and "supervisor died" in status.message
    wait_for("the container's processes gone", lambda: all(_gone(p.pid) for p in processes), timeout=10, interval=0.1)
    node.rt.StopContainer(api_pb2.StopContainerRequest(container_id=cid, timeout=1), timeout=10)  # not hung
    node.remove_pod(pod)
    assert node.allocated_ips() == set()


def test_kill9_pause_makes_the_sandbox_not_ready_and_stop_still_releases(node):
    pod = node.run_pod("pauseless")
    cid = node.run_container(pod, "pauseless")
    ip = node.pod_status(pod).network.ip
    assert node.allocated_ips() == {ip}
    pause = _info(node.rt.PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod, verbose=True)))["pid"]
    psutil.Process(pause).kill()
    wait_for("the pause gone", lambda: _gone(pause), timeout=10, interval=0.1)
    wait_for("the sandbox not ready",
             lambda: node.pod_status(pod).state == api_pb2.SANDBOX_NOTREADY, timeout=10, interval=0.1)
    node.rt.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60)
    assert node.allocated_ips() == set()
    assert node.container_status(cid).state == api_pb2.CONTAINER_EXITED
    node.rt.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=60)
    assert node.pods() == []


def test_stop_releases_the_address_when_cni_del_fails(node):
    pod = node.run_pod("faildel")
    assert node.allocated_ips() == {node.pod_status(pod).network.ip}
    node.inject("pybridge", "DEL", fail=True)
    node.rt.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60)
    assert node.allocated_ips() == set()
    node.inject("pybridge", "DEL")
    node.rt.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=60)


def test_stop_releases_the_address_when_the_netns_is_gone(node):
    pod = node.run_pod("nonetns")
    ip = node.pod_status(pod).network.ip
    status = _info(node.rt.PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod, verbose=True)))
    psutil.Process(status["pid"]).kill()
    wait_for("the pause gone", lambda: _gone(status["pid"]), timeout=10, interval=0.1)
    netns = Path(status["namespaces"]["net"])
    subprocess.run(["umount", str(netns)], check=True)
    assert node.allocated_ips() == {ip}
    node.rt.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60)
    assert node.allocated_ips() == set()
    node.rt.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=60)


def test_kill9_during_run_pod_sandbox_leaves_nothing_once_removed(node):
    node.inject("pybridge", "ADD", sleep=2)
    failed: list = []

    def run():
        try:
            node.run_pod("interrupted")
        except grpc.RpcError as e:
            failed.append(e.code())

    caller = threading.Thread(target=run)
    caller.start()
    wait_for("the CNI ADD under way",
             lambda: (node.inject_dir / "pybridge-ADD.entered").exists(), timeout=30, interval=0.1)
    node.kill()
    caller.join()
    assert failed == [grpc.StatusCode.UNAVAILABLE]
    node.inject("pybridge", "ADD")
    time.sleep(3)  # the orphaned plugin finishes its ADD, as a real one would
    node.start()
    pods = node.pods()
    assert [p.metadata.name for p in pods] == ["interrupted"]
    assert pods[0].state == api_pb2.SANDBOX_NOTREADY  # never finished: not ready, whatever its pause does
    node.remove_pod(pods[0].id)
    assert node.allocated_ips() == set()
    # the kubelet's retry: the same pod runs (its name is free again)
    pod = node.run_pod("interrupted")
    assert node.pod_status(pod).state == api_pb2.SANDBOX_READY and node.pod_status(pod).network.ip
    node.remove_pod(pod)
    assert node.allocated_ips() == set()


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.25, 0.35, 0.4, 0.43, 0.46, 0.5])
def test_kill9_during_create_leaves_nothing_once_removed(node, delay):
    """No hook to wait in: the daemon is killed `delay` seconds into a RunPodSandbox followed by a
    CreateContainer, wherever that lands; after the restart the client removes what is listed."""
    def run():
        try:
            pod = node.run_pod("cut")
            node.run_container(pod, "cut")
        except grpc.RpcError:
            pass

    caller = threading.Thread(target=run)
    caller.start()
    time.sleep(delay)  # here the first RunPodSandbox takes about 0.4 s (the CNI helper starts), a create 0.07 s
    node.kill()
    caller.join()
    node.start()
    for container in node.containers():
        assert container.state in (api_pb2.CONTAINER_CREATED, api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_EXITED)
    for pod in node.pods():
        node.remove_pod(pod.id)
    assert node.pods() == [] and node.containers() == []
    assert node.allocated_ips() == set()
