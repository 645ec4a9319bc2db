"""`kubectl debug` against pykubelet (containerd 1.6 and pyruntime-cri): the real kubectl patches the pod's
ephemeralcontainers subresource, pykubelet sees the change through its pod informer and starts the
ephemeral container in the running pod; with `--target` it is in the target container's pid namespace
(its `ps` shows the target's sleep as pid 1), its state is in status.ephemeralContainerStatuses, `kubectl
logs -c` and attach (`kubectl debug -it`: API server -> pykubelet's :10250 -> the runtime's streaming
server) reach it by name, it is never restarted once it ended, and the pod's own container is left as it
was: same container, no restart.

The API server reaches the kubelet at the node's InternalIP (loopback here) with its kubelet client
certificate, checking the kubelet's serving certificate against the cluster CA, as in
test_kubelet_server.py."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import time

import pytest

from tests.e2e.test_kubelet_server import kubectl_argv, read_until
from tests.kit.controlplane import ControlPlane
from tests.kit.kubelet_node import BUSYBOX, apply, delete, get_pod, on_node, pod_spec, wait_pod

NODE = "kdebug-node"
NODE_IP = "127.0.0.1"
SLEEP = ["sleep", "3600"]


def kubelet_config(cp: ControlPlane) -> dict:
    assert cp.ca is not None
    serving = cp.ca.issue(f"kubelet-serving-{NODE}", f"system:node:{NODE}", groups=("system:nodes",), client=False,
                          server=True, hosts=(NODE_IP, NODE))
    return {"tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
            "authentication": {"x509": {"clientCAFile": str(cp.ca.pair.cert)}, "anonymous": {"enabled": False},
                               "webhook": {"enabled": True}},
            "authorization": {"mode": "Webhook"}}


KUBELET_CONFIG = kubelet_config


@pytest.fixture(autouse=True)
def no_pod_left(control_plane, kubelet, kubepods):
    """A failed test's pods go too, before the leak check looks."""
    yield
    control_plane.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=60s", check=False, timeout=90)


def running(cp: ControlPlane, tmp_path, name: str) -> dict:
    """A pod whose container `c` sleeps, once Running; `kubectl debug --target=c` looks at it."""
    apply(cp, tmp_path, pod_spec(NODE, name, {"name": "c", "image": BUSYBOX, "command": SLEEP}))
    return wait_pod(cp, name, "Running", lambda p: p.get("status", {}).get("phase") == "Running")


def ephemeral_status(pod: dict, name: str) -> dict:
    return next((s for s in pod.get("status", {}).get("ephemeralContainerStatuses", []) if s["name"] == name), {})


def target_untouched(cp: ControlPlane, runtime, before: dict) -> None:
    """The pod's container `c` is the one it was before the debugging: same id, running, no restart."""
    after = get_pod(cp, before["metadata"]["name"])
    (cs,) = after["status"]["containerStatuses"]
    (was,) = before["status"]["containerStatuses"]
    assert (cs["containerID"], cs["restartCount"], "running" in cs["state"]) == (was["containerID"], 0, True)
    assert cs["ready"] and after["status"]["phase"] == "Running"
    _, containers = on_node(runtime, before["metadata"]["uid"])
    assert [c.id for c in containers if c.labels["io.kubernetes.container.name"] == "c"] == [
        was["containerID"].split("://", 1)[1]]


def test_kubectl_debug_with_a_target_sees_its_processes(control_plane, kubelet, runtime, tmp_path):
    """Without -i: kubectl only adds the container; its output is read with `kubectl logs -c`."""
    pod = running(control_plane, tmp_path, "debugged")
    control_plane.kubectl("debug", "debugged", f"--image={BUSYBOX}", "--target=c", "--container=peek", "--",
                          "sh", "-c", "echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); ps")
    done = wait_pod(control_plane, "debugged", "peek terminated", lambda p: "terminated" in ephemeral_status(
        p, "peek").get("state", {}))
    es = ephemeral_status(done, "peek")
    assert es["state"]["terminated"]["exitCode"] == 0 and es["state"]["terminated"]["reason"] == "Completed"
    assert es["image"] == BUSYBOX and es["containerID"].startswith(f"{runtime.version().runtime_name}://")
    assert es["restartCount"] == 0 and not es["ready"]
    out = control_plane.kubectl("logs", "debugged", "-c", "peek").stdout
    assert "pid1=sleep 3600" in out, out  # the target's pid namespace: its sleep is pid 1
    assert any(line.split()[:1] == ["1"] and line.endswith("sleep 3600") for line in out.splitlines()), out
    events = json.loads(control_plane.kubectl("get", "events", "--field-selector",
                                              f"involvedObject.uid={pod['metadata']['uid']}", "-o", "json").stdout)
    started = {e["involvedObject"].get("fieldPath") for e in events["items"] if e["reason"] == "Started"}
    assert "spec.ephemeralContainers{peek}" in started, started
    time.sleep(5)  # a few of the kubelet's passes: an ephemeral container is never started again
    again = get_pod(control_plane, "debugged")
    assert ephemeral_status(again, "peek")["containerID"] == es["containerID"]
    _, containers = on_node(runtime, pod["metadata"]["uid"])
    assert len([c for c in containers if c.labels["io.kubernetes.container.name"] == "peek"]) == 1
    target_untouched(control_plane, runtime, pod)
    delete(control_plane, "debugged")


def test_kubectl_debug_it_attaches_to_the_ephemeral_container(control_plane, kubelet, runtime, tmp_path):
    """`kubectl debug -it --target=c -- sh`: kubectl waits for the container to run and attaches to it (its
    stdin and terminal through pykubelet's attach); the shell sees the target's processes, its status says
    running, then terminated once the shell exits."""
    pod = running(control_plane, tmp_path, "attached")
    master, slave = pty.openpty()
    proc = subprocess.Popen(kubectl_argv(control_plane, "debug", "-it", "attached", f"--image={BUSYBOX}",
                                         "--target=c", "--container=shell", "--", "sh"),
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    try:
        wait_pod(control_plane, "attached", "shell running", lambda p: "running" in ephemeral_status(
            p, "shell").get("state", {}))
        time.sleep(2)  # the attach session is up before the line goes
        # what the shell prints, not the terminal's echo of the line: $((...)) is expanded by the shell only
        os.write(master, b"ps | grep -c '[s]leep 3600'; echo debug-$((40+2))\n")
        with open(master, "rb", buffering=0, closefd=False) as terminal:
            seen = read_until(terminal, b"debug-42", 60)
        lines = [line.strip() for line in seen.decode(errors="replace").splitlines()]
        assert "debug-42" in lines, (seen, proc.poll())
        assert lines[lines.index("debug-42") - 1] == "1", seen  # the target's sleep, seen from the debugger
        os.write(master, b"exit\n")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    done = wait_pod(control_plane, "attached", "shell terminated", lambda p: "terminated" in ephemeral_status(
        p, "shell").get("state", {}))
    assert ephemeral_status(done, "shell")["state"]["terminated"]["exitCode"] == 0
    target_untouched(control_plane, runtime, pod)
    delete(control_plane, "attached")


def test_a_debug_container_of_a_deleted_pod_goes_with_it(control_plane, kubelet, runtime, tmp_path):
    """A running ephemeral container is stopped and removed with its pod; nothing of it stays on the node."""
    pod = running(control_plane, tmp_path, "gone")
    control_plane.kubectl("debug", "gone", f"--image={BUSYBOX}", "--target=c", "--container=stay", "--",
                          "sleep", "3600")
    wait_pod(control_plane, "gone", "stay running", lambda p: "running" in ephemeral_status(p, "stay").get(
        "state", {}))
    delete(control_plane, "gone")
    assert on_node(runtime, pod["metadata"]["uid"]) == ([], [])
