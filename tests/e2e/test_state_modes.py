"""A host user reads nothing of a pod's private state (issue 22, item 2): the node's state is made as a real pod
makes it, through the API server, pykubelet and pyruntime-cri, and then walked as nobody (uid and gid 65534,
no supplementary groups), as any local user of the node could.

The pod has a secret volume, the projected service-account token the admission plugin adds, an emptyDir with a
file in it, a file written into its container's writable layer, and an image with a setuid-root program
(nonewprivs' /usr/local/bin/nnp). The walker starts at each state root (the kubelet's root dir, the CRI root
and state with pyruntime's own root below it, the IPAM store), through a descriptor of the root itself: the
directories above are this test's temporary ones, where a node has /var/lib and /run open to everybody. It
lists what it can and reads every file it lists, then tries the paths an attacker learns from
/proc/self/mountinfo and the container ids (the files themselves, the setuid program in the container's rootfs,
in its image layer and in the writable layer)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.kubelet_node import apply, delete, on_node, pod_spec, wait_pod

NODE = "pynode-e2e-state-modes"
NODE_IP = "10.201.0.36"
NONEWPRIVS = "registry.k8s.io/e2e-test-images/nonewprivs:1.3"
SETUID = "usr/local/bin/nnp"
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
SECRET = "secret-of-the-pod-9f1c"
EMPTYDIR = "emptydir-data-77ab"
UPPER = "upper-layer-data-31de"

pytestmark = pytest.mark.parametrize("cri", ["pyruntime-cri"], indirect=True)  # the node is ours

# Run as nobody: walks every root it is handed (by descriptor) and tries the known paths; prints what it read.
WALKER = r"""
import json, os, stat, sys
roots, known = json.loads(sys.argv[1]), json.loads(sys.argv[2])
read, reached = {}, []
def walk(name, fd):
    try:
        for top, _dirs, files, dfd in os.fwalk(".", dir_fd=fd):
            for f in files:
                try:
                    with open(os.open(f, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=dfd), "rb") as h:
                        read[f"{name}/{top}/{f}"] = h.read(1 << 16).decode(errors="replace")
                except OSError:
                    pass
    except OSError:  # the root itself is closed
        pass
for name, fd in roots.items():
    walk(name, fd)
for name, fd, path in known:
    try:
        os.stat(path, dir_fd=fd)
    except OSError:
        continue
    reached.append(f"{name}/{path}")
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK, dir_fd=fd), "rb") as h:
            read[f"{name}/{path}"] = h.read(1 << 16).decode(errors="replace")
    except OSError:
        pass
print(json.dumps({"read": read, "reached": reached, "uid": os.getresuid(), "groups": os.getgroups()}))
"""


def walk_as_nobody(roots: dict[str, Path], known: list[tuple[str, Path]]) -> dict:
    fds = {name: os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for name, path in roots.items()}
    try:
        rel = [(name, fds[name], str(path.relative_to(roots[name]))) for name, path in known]
        out = subprocess.run([sys.executable, "-c", WALKER, json.dumps(fds), json.dumps(rel)], capture_output=True,
                             text=True, timeout=120, pass_fds=list(fds.values()), user=65534, group=65534,
                             extra_groups=[], cwd="/")
    finally:
        for fd in fds.values():
            os.close(fd)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["uid"] == [65534] * 3 and result["groups"] == [], result
    return result


def test_a_host_user_reads_no_secret_token_emptydir_or_image_file(control_plane, kubelet, cri, runtime, kubepods,
                                                                   tmp_path):
    ca = control_plane.ca.pair.cert.read_text()
    apply(control_plane, tmp_path, {"metadata": {"name": "kube-root-ca.crt", "namespace": "default"},
                                    "data": {"ca.crt": ca}}, kind="ConfigMap")  # no controller-manager here
    apply(control_plane, tmp_path, {"metadata": {"name": "private", "namespace": "default"}, "type": "Opaque",
                                    "data": {"key": base64.b64encode(SECRET.encode()).decode()}}, kind="Secret")
    container = {"name": "app", "image": NONEWPRIVS, "command": SLEEP,
                 "volumeMounts": [{"name": "sec", "mountPath": "/sec"}, {"name": "scratch", "mountPath": "/scratch"}]}
    apply(control_plane, tmp_path, pod_spec(NODE, "victim", container, automountServiceAccountToken=True, volumes=[
        {"name": "sec", "secret": {"secretName": "private"}}, {"name": "scratch", "emptyDir": {}}]))
    try:
        pod = wait_pod(control_plane, "victim", "Running", lambda p: p.get("status", {}).get("phase") == "Running")
        uid = pod["metadata"]["uid"]
        (cid,) = [c.id for c in on_node(runtime, uid)[1] if c.metadata.name == "app"]
        script = (f"echo {EMPTYDIR} > /scratch/f && echo {UPPER} > /upper-mark && test -u /{SETUID}"
                  " && cat /var/run/secrets/kubernetes.io/serviceaccount/token")
        out, err, code = runtime.exec_sync(cid, ["sh", "-c", script], timeout=10)
        assert code == 0, (out, err)
        token = out.decode()
        assert token.count(".") == 2, token

        volumes = kubelet.work / "root" / "pods" / uid / "volumes"
        (api_access,) = (volumes / "kubernetes.io~projected").glob("kube-api-access-*")
        cri_root, cri_state = cri.work / "root", cri.work / "state"
        images = cri_root / "images"
        layers = sorted(p.relative_to(images) for p in images.glob(f"snapshots/*/fs/{SETUID}"))
        assert layers, "the image's setuid program is in one of its layers"
        upper = images / "containers" / cid / "upper" / "upper-mark"
        assert upper.read_text().strip() == UPPER  # overlay: the container's writable layer
        roots = {"kubelet": kubelet.work / "root", "cri-root": cri_root, "cri-state": cri_state,
                 "ipam": cri.work / "ipam"}
        known = [("kubelet", volumes / "kubernetes.io~secret" / "sec" / "key"),
                 ("kubelet", volumes / "kubernetes.io~secret" / "sec" / "..data" / "key"),
                 ("kubelet", api_access / "..data" / "token"),
                 ("kubelet", volumes / "kubernetes.io~empty-dir" / "scratch" / "f"),
                 ("cri-root", cri_root / "containers" / cid / "bundle" / "rootfs" / SETUID),
                 ("cri-root", cri_root / "containers" / cid / "bundle" / "rootfs" / "upper-mark"),
                 ("cri-root", cri_root / "containers" / cid / "bundle" / "config.json"),
                 ("cri-root", upper)] + [("cri-root", images / layer) for layer in layers]
        for _, path in known:
            assert path.exists(), path  # the attacker's paths are the real ones
        seen = walk_as_nobody(roots, known)
        leaked = {path: text for path, text in seen["read"].items()
                  if any(mark in text for mark in (SECRET, EMPTYDIR, UPPER, token))}
        assert leaked == {}, "a host user read a pod's private data"
        assert seen["reached"] == [], "a host user reached these (the setuid program among them)"
    finally:
        delete(control_plane, "victim")
        control_plane.kubectl("delete", "secret", "private", "--ignore-not-found", check=False)
        control_plane.kubectl("delete", "configmap", "kube-root-ca.crt", "--ignore-not-found", check=False)
