"""cri/images.py against a real registry (Debian's docker-registry with basic auth): pulls with the CRI's
AuthConfig forms, listing, status (unknown images are an empty answer), pinning, removal, fs info."""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import api_pb2
from pyruntime.cri.images import ImageService
from pyruntime.cri.launcher import Launcher
from pyruntime.cri.model import Layout
from pyruntime.errors import FailedPreconditionError, NotFoundError, PyRuntimeError
from pyruntime.images.store import ImageStore
from pyruntime.settings import Settings
from tests.integration.registry_server import Registry
from tests.kit.busybox import OCIImage, build_busybox_image


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, OCIImage]]:
    tmp = tmp_path_factory.mktemp("cri-images")
    image = build_busybox_image(tmp / "layout", tmp / "work")
    reg = Registry(tmp / "reg", auth="htpasswd", users={"alice": "s3cret"}).start()
    try:
        for name in ("private/busybox:latest", "private/pause:3.10"):
            reg.push(image.layout, name, creds="alice:s3cret")
        yield reg, image
    finally:
        reg.stop()


@pytest.fixture
def service(tmp_path: Path, registry: tuple[Registry, OCIImage]) -> ImageService:
    reg, _ = registry
    return ImageService(ImageStore(tmp_path / "store"), pinned=[f"{reg.host}/private/pause:3.10"])


def spec(ref: str) -> api_pb2.ImageSpec:
    return api_pb2.ImageSpec(image=ref)


def test_a_pull_through_the_launcher_lands_in_the_store_the_daemon_reads(tmp_path: Path,
                                                                         registry: tuple[Registry, OCIImage]) -> None:
    """As pyruntime-cri wires it: the pull runs in a child of its launcher (the daemon never loads the
    registry client), into the same store; credentials reach the child and failures keep their kind."""
    reg, image = registry
    settings = Settings(root=str(tmp_path / "runtime"), image_root=str(tmp_path / "store"),
                        hosts_dir=str(tmp_path / "certs.d"))
    launcher = Launcher.spawn(settings, Layout(str(tmp_path / "root"), str(tmp_path / "state")))
    try:
        service = ImageService(ImageStore(settings.image_root), pull=launcher.pull_image)
        ref = f"{reg.host}/private/busybox:latest"
        with pytest.raises(FailedPreconditionError, match="credentials"):
            service.pull_image(spec(ref), api_pb2.AuthConfig(username="alice", password="wrong"))
        with pytest.raises(NotFoundError):
            service.pull_image(spec(f"{reg.host}/private/nothing:1"), api_pb2.AuthConfig(username="alice",
                                                                                         password="s3cret"))
        assert service.pull_image(spec(ref), api_pb2.AuthConfig(username="alice", password="s3cret")) == \
            image.config_digest
        assert [i.id for i in service.list_images()] == [image.config_digest]
    finally:
        launcher.close()


def test_pull_list_status_remove(service: ImageService, registry: tuple[Registry, OCIImage]) -> None:
    reg, image = registry
    ref, pause = f"{reg.host}/private/busybox:latest", f"{reg.host}/private/pause:3.10"
    with pytest.raises(PyRuntimeError, match="credentials"):
        service.pull_image(spec(ref))
    assert service.image_status(spec(ref)) == api_pb2.ImageStatusResponse()  # unknown: empty, no error

    image_id = service.pull_image(spec(ref), api_pb2.AuthConfig(username="alice", password="s3cret"))
    assert image_id == image.config_digest
    [listed] = service.list_images()
    assert (listed.id, list(listed.repo_tags)) == (image_id, [ref])
    assert list(listed.repo_digests) == [f"{reg.host}/private/busybox@{image.manifest_digest}"]
    assert listed.size > 500_000 and not listed.pinned and not listed.HasField("uid")

    basic = base64.b64encode(b"alice:s3cret").decode()
    assert service.pull_image(spec(pause), api_pb2.AuthConfig(auth=basic, server_address=reg.host)) == image_id
    status = service.image_status(spec(ref), verbose=True)
    assert status.image.pinned and sorted(status.image.repo_tags) == sorted([ref, pause])
    info = json.loads(status.info["info"])
    assert info["imageSpec"]["config"]["Cmd"] == ["sh"] and info["manifestDigest"] == image.manifest_digest
    assert [i.id for i in service.list_images(api_pb2.ImageFilter(image=spec(image_id[7:19])))] == [image_id]
    assert service.list_images(api_pb2.ImageFilter(image=spec(f"{reg.host}/private/none:1"))) == []

    fs = service.fs_info()
    [usage] = fs.image_filesystems
    assert usage.used_bytes.value > 1_000_000 and usage.inodes_used.value > 10
    assert usage.fs_id.mountpoint == str(service.store.root)

    service.remove_image(spec(ref))  # removes the image under all its names, as containerd
    assert service.list_images() == []
    service.remove_image(spec(ref))  # idempotent
    service.remove_image(spec(image_id))
