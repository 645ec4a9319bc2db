"""The kubelet's pod-security checks, played by an attacker pod against pykubelet with a stock kube-apiserver,
on each CRI runtime (pyruntime-cri and containerd):

- runAsNonRoot: a pod that asks for it but whose image runs as root (no USER), whose container asks for
  runAsUser 0, or whose image names a user by name, never runs: each container waits in
  CreateContainerConfigError with the kubelet's message and a Failed event, is checked again at the next
  sync (no crash loop), and nothing of it is ever created in the runtime; an image with USER 1000 runs
  as 1000.
- sysctls: a pod with an unsafe sysctl (kernel.msgmax) is rejected (Failed, SysctlForbidden, the kubelet's
  message) and has no sandbox, so its sysctl never reaches the runtime; a safe one
  (net.ipv4.ip_unprivileged_port_start) is set in the pod; with allowedUnsafeSysctls ["kernel.msg*"] the
  unsafe one runs and is set.
- privileged: in a pod with a privileged and an unprivileged container, only the privileged one may add a link
  to the pod's network, as the PrivilegedPod spec checks.
"""
from __future__ import annotations

import json

from tests.kit.kubelet_node import (
    BUSYBOX,
    apply,
    delete,
    get_pod,
    on_node,
    wait_for,
    wait_pod,
)
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-security"
NODE_IP = "10.201.0.36"
STAGING = "gcr.io/k8s-staging-cri-tools"
USER_1000 = f"{STAGING}/test-image-predefined-group:latest"  # USER 1000
USER_NAMED = f"{STAGING}/test-image-user-username:latest"  # USER www-data


def pod_spec(name: str, *containers: dict, **spec) -> dict:
    out = kit_pod_spec(NODE, name, containers[0], **spec)
    out["spec"]["containers"] = list(containers)
    return out


def events_of(control_plane, uid: str) -> list[dict]:
    out = control_plane.kubectl("get", "events", "--field-selector", f"involvedObject.uid={uid}", "-o", "json")
    return json.loads(out.stdout)["items"]


def waiting(pod: dict) -> dict[str, dict]:
    return {cs["name"]: cs["state"].get("waiting", {}) for cs in pod.get("status", {}).get("containerStatuses", [])}


def log_of(kubelet, pod: dict, container: str) -> str:
    meta = pod["metadata"]
    path = kubelet.pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container / "0.log"
    return path.read_text() if path.exists() else ""


def logged(kubelet, control_plane, name: str, container: str, text: str) -> dict:
    """The Running pod `name` once its container's log has a line `text`."""
    pod = wait_pod(control_plane, name, "Running", lambda p: p["status"].get("phase") == "Running")
    wait_for(f"{name}/{container} to log {text!r}",
             lambda: any(line.split(" ", 3)[-1] == text for line in log_of(kubelet, pod, container).splitlines()),
             timeout=30)
    return pod


def test_run_as_non_root_refuses_what_would_run_as_root(control_plane, kubelet, runtime, kubepods, tmp_path):
    sleep = ["sleep", "3600"]
    apply(control_plane, tmp_path, pod_spec(
        "nonroot-attacker",
        {"name": "root-image", "image": BUSYBOX, "command": sleep},
        {"name": "run-as-root", "image": USER_1000, "command": sleep, "securityContext": {"runAsUser": 0}},
        {"name": "named-user", "image": USER_NAMED, "command": sleep},
        securityContext={"runAsNonRoot": True}))
    try:
        pod = wait_pod(control_plane, "nonroot-attacker", "three containers refused",
                       lambda p: len(waiting(p)) == 3 and all(w.get("reason") == "CreateContainerConfigError"
                                                              for w in waiting(p).values()))
        uid = pod["metadata"]["uid"]
        desc = f'"nonroot-attacker_default({uid})"'
        messages = {name: w["message"] for name, w in waiting(pod).items()}
        assert messages == {
            "root-image": f"container has runAsNonRoot and image will run as root (pod: {desc}, container: root-image)",
            "run-as-root": f"container's runAsUser breaks non-root policy (pod: {desc}, container: run-as-root)",
            "named-user": "container has runAsNonRoot and image has non-numeric user (www-data), cannot verify user "
                          f"is non-root (pod: {desc}, container: named-user)",
        }
        # checked again at each sync, as the kubelet's (not a crash loop): the Failed event counts up
        failed = wait_for("the root-image's Failed event seen twice", lambda: [
            e for e in events_of(control_plane, uid) if e["reason"] == "Failed"
            and e["involvedObject"].get("fieldPath") == "spec.containers{root-image}"
            and e.get("count", 1) >= 2], timeout=30)[0]
        assert failed["type"] == "Warning" and failed["message"] == f"Error: {messages['root-image']}"
        sandboxes, containers = on_node(runtime, uid)
        assert len(sandboxes) == 1 and containers == []  # never created in the runtime
        assert all(w.get("reason") == "CreateContainerConfigError"
                   for w in waiting(get_pod(control_plane, "nonroot-attacker")).values())
    finally:
        delete(control_plane, "nonroot-attacker")


def test_run_as_non_root_runs_an_image_with_a_numeric_user(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, pod_spec(
        "nonroot", {"name": "app", "image": USER_1000, "command": ["sh", "-c", "id -u; sleep 3600"]},
        securityContext={"runAsNonRoot": True}))
    try:
        logged(kubelet, control_plane, "nonroot", "app", "1000")
    finally:
        delete(control_plane, "nonroot")


def test_privileged_container_manages_the_pod_network(control_plane, kubelet, runtime, kubepods, tmp_path):
    """[sig-node] PrivilegedPod "should enable privileged commands": in one pod, the privileged container may
    add a link to the pod's network namespace and the unprivileged one may not. The spec adds a dummy link,
    which this test kernel cannot make (CONFIG_DUMMY is not set: "Operation not supported" in any container,
    with the stock pair too), so a bridge stands in: the same RTM_NEWLINK under the same CAP_NET_ADMIN check.
    The privileged one also gets every capability and the host's devices (whether /sys is writable is the
    runtime's choice: containerd 1.6 keeps it read-only there)."""
    sleep = ["sleep", "3600"]
    apply(control_plane, tmp_path, pod_spec(
        "privileged-pod",
        {"name": "privileged-container", "image": BUSYBOX, "command": sleep, "securityContext": {"privileged": True}},
        {"name": "not-privileged-container", "image": BUSYBOX, "command": sleep,
         "securityContext": {"privileged": False}}))
    try:
        pod = wait_pod(control_plane, "privileged-pod", "Running", lambda p: p["status"].get("phase") == "Running")
        _, containers = on_node(runtime, pod["metadata"]["uid"])
        ids = {c.metadata.name: c.id for c in containers}
        add = ["ip", "link", "add", "priv0", "type", "bridge"]
        out, err, code = runtime.exec_sync(ids["privileged-container"], add, timeout=10)
        assert code == 0, (out, err)
        out, err, code = runtime.exec_sync(ids["privileged-container"], ["ip", "link", "del", "priv0"], timeout=10)
        assert code == 0, (out, err)
        out, err, code = runtime.exec_sync(ids["not-privileged-container"], add, timeout=10)
        assert code != 0 and b"Operation not permitted" in err, (out, err)
        script = "grep CapEff /proc/self/status; ls /dev"
        privileged, unprivileged = (runtime.exec_sync(ids[name], ["sh", "-c", script], timeout=10)[0].decode().split()
                                    for name in ("privileged-container", "not-privileged-container"))
        assert int(privileged[1], 16) >> 12 & 1 and not int(unprivileged[1], 16) >> 12 & 1  # CAP_NET_ADMIN
        assert "kmsg" in privileged[2:] and "kmsg" not in unprivileged[2:]  # the host's devices too
    finally:
        delete(control_plane, "privileged-pod")


def sysctl_pod(name: str, sysctl: str, value: str) -> dict:
    path = "/proc/sys/" + sysctl.replace(".", "/")
    return pod_spec(name, {"name": "app", "image": BUSYBOX, "command": ["sh", "-c", f"cat {path}; sleep 3600"]},
                    securityContext={"sysctls": [{"name": sysctl, "value": value}]})


def test_unsafe_sysctl_is_forbidden(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, sysctl_pod("msgmax", "kernel.msgmax", "65536"))
    try:
        pod = wait_pod(control_plane, "msgmax", "Failed", lambda p: p["status"].get("phase") == "Failed")
        message = 'forbidden sysctl: "kernel.msgmax" not allowlisted'
        assert (pod["status"]["reason"], pod["status"]["message"]) == ("SysctlForbidden",
                                                                       f"Pod was rejected: {message}")
        event = wait_for("the SysctlForbidden event", lambda: [
            e for e in events_of(control_plane, pod["metadata"]["uid"]) if e["reason"] == "SysctlForbidden"],
            timeout=20)[0]
        assert event["type"] == "Warning" and event["message"] == message
        assert on_node(runtime, pod["metadata"]["uid"]) == ([], [])  # no sandbox: the sysctl never got there
    finally:
        delete(control_plane, "msgmax")


def test_safe_sysctl_is_set(control_plane, kubelet, runtime, kubepods, tmp_path):
    apply(control_plane, tmp_path, sysctl_pod("unprivileged-ports", "net.ipv4.ip_unprivileged_port_start", "0"))
    try:
        logged(kubelet, control_plane, "unprivileged-ports", "app", "0")
    finally:
        delete(control_plane, "unprivileged-ports")


def test_allowed_unsafe_sysctl_runs(control_plane, kubelet, runtime, kubepods, tmp_path):
    """The module's kubelet restarted with allowedUnsafeSysctls (one kubelet per runtime). The restarted
    process is this test's, so it stops it at the end (the leak check wants it gone): the module's last test."""
    config = kubelet.work / "kubelet.yaml"
    config.write_text(json.dumps({**json.loads(config.read_text()), "allowedUnsafeSysctls": ["kernel.msg*"]}))
    kubelet.stop()
    kubelet.start()
    try:
        apply(control_plane, tmp_path, sysctl_pod("msgmax-allowed", "kernel.msgmax", "65536"))
        logged(kubelet, control_plane, "msgmax-allowed", "app", "65536")
    finally:
        delete(control_plane, "msgmax-allowed")
        kubelet.stop()
