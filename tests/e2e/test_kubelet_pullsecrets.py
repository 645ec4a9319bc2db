"""pykubelet pulls a private image with the pod's own imagePullSecrets, as the kubelet: a pod in a namespace with a
pull secret for the registry runs; a pod in another namespace without one cannot pull the image (the node has no
credentials of its own for it), and gets ErrImagePull / ImagePullBackOff. The secret's password appears in
neither the kubelet's log nor the runtime's, both at debug level. Both CRI runtimes (containerd 1.6,
pyruntime-cri)."""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.registry_server import Registry
from tests.kit.images import push_busybox
from tests.kit.kubelet_node import apply, get_pod, on_node, wait_for
from tests.kit.kubelet_node import pod_spec as kit_pod_spec

NODE = "pynode-e2e-pullsecrets"
NODE_IP = "10.201.0.27"
USER, PASSWORD = "robot", "pull-s3cret-only-for-x"
CRI_LOG_LEVEL = "debug"  # pyruntime-cri's; the kubelet's -v 1 is debug


@pytest.fixture(scope="module")
def private_registry(cri, tmp_path_factory) -> Iterator[Registry]:
    """A registry that wants a password, holding busybox as private/busybox:1; the runtime reaches it over
    plain HTTP through its hosts dir (certs.d: `server`), as a node admin would configure it."""
    tmp = tmp_path_factory.mktemp("private-registry")
    reg = Registry(tmp / "reg", auth="htpasswd", users={USER: PASSWORD}).start()
    hosts = Path(cri.hosts_dir) / reg.host
    try:
        push_busybox(reg, tmp, "private/busybox:1", creds=f"{USER}:{PASSWORD}")
        hosts.mkdir(parents=True)
        (hosts / "hosts.toml").write_text(f'server = "http://{reg.host}"\n')
        yield reg
    finally:
        (hosts / "hosts.toml").unlink(missing_ok=True)
        if hosts.exists():
            hosts.rmdir()
        reg.stop()


def _namespace(cp, name: str) -> None:
    cp.kubectl("create", "namespace", name)
    cp.kubectl("create", "serviceaccount", "default", "-n", name)


def _pod(name: str, namespace: str, image: str, **spec) -> dict:
    pod = kit_pod_spec(NODE, name, {"name": "main", "image": image, "command": ["sleep", "3600"],
                                    "imagePullPolicy": "Always"}, **spec)
    pod["metadata"]["namespace"] = namespace
    return pod


def _waiting(pod: dict) -> str:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return (statuses[0].get("state", {}).get("waiting") or {}).get("reason", "")


def test_pull_secret_of_the_pod_only(control_plane, kubelet, runtime, cri, kubepods, private_registry, tmp_path):
    image = f"{private_registry.host}/private/busybox:1"
    for ns in ("pull-x", "pull-y"):
        _namespace(control_plane, ns)
    config = {"auths": {private_registry.host: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}
    apply(control_plane, tmp_path, {"metadata": {"name": "regcred", "namespace": "pull-x"},
                                    "type": "kubernetes.io/dockerconfigjson",
                                    "data": {".dockerconfigjson": base64.b64encode(
                                        json.dumps(config).encode()).decode()}}, kind="Secret")
    try:
        apply(control_plane, tmp_path, _pod("with-secret", "pull-x", image, imagePullSecrets=[{"name": "regcred"}]))
        apply(control_plane, tmp_path, _pod("without", "pull-y", image))
        # a secret name that does not exist in pull-y: a warning, then the pull goes without credentials
        apply(control_plane, tmp_path, _pod("other-ns-secret", "pull-y", image,
                                            imagePullSecrets=[{"name": "regcred"}]))
        wait_for("with-secret Running", lambda: get_pod(control_plane, "with-secret", "pull-x").get(
            "status", {}).get("phase") == "Running", timeout=120)
        for name in ("without", "other-ns-secret"):
            pod = wait_for(f"{name} refused its image", lambda name=name: (lambda p: p if _waiting(p) in (
                "ErrImagePull", "ImagePullBackOff") else None)(get_pod(control_plane, name, "pull-y")), timeout=90)
            assert get_pod(control_plane, name, "pull-y")["status"].get("phase") == "Pending", pod
        events = control_plane.kubectl("get", "events", "-n", "pull-y", "-o", "json").stdout
        assert "FailedToRetrieveImagePullSecret" in events and "regcred" in events
        logs = kubelet.log_path.read_text(errors="replace")
        assert " DEBUG " in logs, "the kubelet does not log at debug level"
        if cri.name == "pyruntime-cri":
            runtime_log = (Path(cri.work) / "daemon.log").read_text(errors="replace")
            assert [line for line in runtime_log.splitlines() if " DEBUG " in line and "PullImage" in line], \
                "pyruntime-cri does not log its pulls at debug level"
            logs += runtime_log
        assert PASSWORD not in logs
        assert base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode() not in logs
    finally:
        uids = [get_pod(control_plane, name, ns).get("metadata", {}).get("uid") for name, ns in (
            ("with-secret", "pull-x"), ("without", "pull-y"), ("other-ns-secret", "pull-y"))]
        for ns in ("pull-x", "pull-y"):
            control_plane.kubectl("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False,
                                  timeout=90)
        for uid in filter(None, uids):  # the kubelet deletes the object only once nothing of the pod is left
            assert on_node(runtime, uid) == ([], []), (uid, kubelet.log_tail())
        if runtime.image_status(image).image.ByteSize():
            runtime.remove_image(image)
