"""Pid pressure as the eviction manager meets it on the host's own cgroups (issue 22, item 10): a pod that
forks is the one evicted, and its count is what its pod cgroup says.

The manager reads a pod's processes from `pids.current` of the pod's cgroup, the cgroup the kubelet names by
QoS class and the runtime makes: under the v1 pids controller on this project's machine, in the unified
hierarchy on the hosts users have (this file runs in the lab's cgroup v2 VM too, tests/lab/test_lab_v2.py).
Misread there, every pod counts None and pid pressure evicts by priority alone, a quiet pod first. The pods
are real, started by pyruntime-cri with the kubelet's labels and cgroup parents; the manager is the
kubelet's, driven one cycle with a threshold that is always met, and what it would evict is recorded.
"""
from __future__ import annotations

from pathlib import Path

from pykubelet import config
from pykubelet import runtime as criapi
from pykubelet.api.podmodel import parse_pod
from pykubelet.eviction.manager import EvictionManager
from pykubelet.pods.criconfig import cgroup_parent
from pykubelet.pods.labels import CONTAINER_NAME, POD_UID
from tests.kit import cri_server as kit
from tests.kit.kubelet_node import kubepods_dirs, remove_new_cgroups, wait_for

cri_server = kit.cri_server  # the module's daemon

FORKS = 60


def _pod(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "eviction", "uid": f"eviction-pids-{name}"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}, "status": {"phase": "Running"}}


def test_a_forking_pod_is_the_one_evicted_for_pid_pressure(cri_server, tmp_path: Path) -> None:
    c = cri_server
    conf = tmp_path / "kubelet.yaml"
    conf.write_text(f"apiVersion: {config.API_VERSION}\nkind: {config.KIND}\n"
                    "evictionHard: {pid.available: \"100%\"}\n")
    settings = config.build({"root_dir": str(tmp_path / "kubelet")}, conf)
    forker, quiet = _pod("forker"), _pod("quiet")
    commands = {"forker": f"for i in $(seq {FORKS}); do sleep 3600 & done; exec sleep 3600",
                "quiet": "exec sleep 3600"}
    evicted: list[tuple[str, str, int]] = []
    before = kubepods_dirs()
    client = criapi.CRIRuntime(c.node.url, timeout=30)
    try:
        parents = {name: cgroup_parent(parse_pod(p), settings) for name, p in (("forker", forker), ("quiet", quiet))}
        with c.pod("forker", metadata=forker["metadata"], linux={"cgroup_parent": parents["forker"]}) \
                as forker_sandbox, \
                c.pod("quiet", metadata=quiet["metadata"], linux={"cgroup_parent": parents["quiet"]}) \
                as quiet_sandbox:
            for pod, sandbox in ((forker, forker_sandbox), (quiet, quiet_sandbox)):
                name = pod["metadata"]["name"]
                c.start_container(sandbox, "main", command=["sh", "-c", commands[name]],
                                  labels={POD_UID: pod["metadata"]["uid"], CONTAINER_NAME: "main"})
            manager = EvictionManager(client, settings)

            def evict(uid: str, message: str, grace: int) -> bool:
                evicted.append((uid, message, grace))
                return True
            typed = [parse_pod(forker), parse_pod(quiet)]
            manager.bind(lambda: typed, evict)
            usage: dict = {}

            def counted() -> bool:
                usage.update(manager.usage(typed))
                found = usage.get(forker["metadata"]["uid"])
                return found is not None and (found.pids or 0) > FORKS
            wait_for("the forker's processes in its pod cgroup", counted)
            pids = {p["metadata"]["name"]: usage[p["metadata"]["uid"]].pids for p in (forker, quiet)}
            assert pids["quiet"] is not None and 1 <= pids["quiet"] <= 3, pids  # its sleep (and the pause)
            assert manager.synchronize() is typed[0]  # the forker
            assert manager.conditions() == ["PIDPressure"]
            [(uid, message, _grace)] = evicted
            assert uid == forker["metadata"]["uid"] and message.startswith("The node was low on resource: pids."), \
                message
    finally:
        client.close()
        remove_new_cgroups(before)
