"""A failure deep in a container's start reaches a CRI client with the status code of its kind: container init
refuses a mount after four forks (daemon -> launcher -> supervisor -> the runtime's create child -> init), and
the kubelet must see INVALID_ARGUMENT (its user's spec is wrong) or FAILED_PRECONDITION (the image is), not
INTERNAL (a runtime bug to retry)."""
from __future__ import annotations

import grpc
import pytest

from proto import api_pb2
from tests.integration.registry_server import Registry
from tests.kit.busybox import build_rootfs, tar_directory
from tests.kit.cri_images import BUSYBOX, write_hosts_dir
from tests.kit.cri_server import CriNode
from tests.kit.images import add_image, push_busybox, write_index

pytestmark = pytest.mark.usefixtures("restore_forwarding")

PROC_LINK = "registry.k8s.io/e2e-test-images/proc-symlink:1"  # busybox whose /proc is a symlink to /tmp


@pytest.fixture(scope="module")
def hosts_dir(tmp_path_factory):
    """A registry with busybox and an image whose /proc is a symlink; its hosts dir."""
    tmp = tmp_path_factory.mktemp("registry")
    registry = Registry(tmp / "registry").start()
    try:
        push_busybox(registry, tmp / "busybox", BUSYBOX.split("/", 1)[1])
        rootfs = build_rootfs(tmp / "proc-symlink" / "rootfs")
        (rootfs / "proc").rmdir()
        (rootfs / "proc").symlink_to("/tmp")
        layout = tmp / "proc-symlink" / "layout"
        desc, _ = add_image(layout, [(tar_directory(rootfs), "gzip")])
        write_index(layout, [desc], tag="1")
        registry.push(layout, PROC_LINK.split("/", 1)[1], tag="1")
        yield write_hosts_dir(tmp / "certs.d", registry.host)
    finally:
        registry.stop()


@pytest.fixture
def node(hosts_dir):
    """A daemon per test: what its pods make on the host (the bridge, the CNI helper) is the test's to leave
    nothing of."""
    n = CriNode(hosts_dir, bridge="pyt-crierr0", subnet="10.233.0.0/24")
    try:
        n.start()
        n.pull(BUSYBOX)
        n.pull(PROC_LINK)
        yield n
    finally:
        n.cleanup()


def _create(node: CriNode, name: str, image: str, mounts: list[api_pb2.Mount]) -> grpc.RpcError:
    pod = node.run_pod(name, share_pid=False)
    config = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="main"),
                                     image=api_pb2.ImageSpec(image=image), command=["true"], log_path="main.log",
                                     mounts=mounts)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            node.rt.CreateContainer(api_pb2.CreateContainerRequest(
                pod_sandbox_id=pod, config=config, sandbox_config=node.pod_config(name, share_pid=False)),
                timeout=60)
        assert node.containers() == []  # nothing of the refused container is left
        return refused.value
    finally:
        node.remove_pod(pod)


def test_a_bind_source_refused_in_container_init_is_invalid_argument(node, tmp_path):
    """A hostPath that exists as a dangling symlink: the daemon leaves it be (it makes only a missing path),
    and the container's init finds no source to bind."""
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    refused = _create(node, "bad-source", BUSYBOX,
                      [api_pb2.Mount(container_path="/data", host_path=str(tmp_path / "dangling"))])
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
    assert "mount /data: bind source" in refused.details()


def test_a_proc_mount_the_image_refuses_is_failed_precondition(node):
    """The image made /proc a symlink: init refuses to mount proc through it (CVE-2019-19921's class)."""
    refused = _create(node, "bad-image", PROC_LINK, [])
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.details()
    assert "must be mounted on ordinary directory" in refused.details()
