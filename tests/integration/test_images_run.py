"""A container runs from a pulled image's snapshot with `pyruntime run`, and its writes stay in its own upper."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyruntime.images.store import ImageStore
from tests.integration.registry_server import Registry
from tests.kit.images import build_layered_image
from tests.kit.runtime import bundle_config, write_bundle


@pytest.fixture
def pulled(tmp_path: Path):
    image = build_layered_image(tmp_path / "layout", tmp_path / "work")
    reg = Registry(tmp_path / "reg").start()
    try:
        reg.push(image.layout, "test/layered:v1")
        store = ImageStore(tmp_path / "store")
        yield store, store.pull(f"{reg.host}/test/layered:v1")
    finally:
        reg.stop()


def test_run_container_from_snapshot(pulled, runtime, tmp_path: Path) -> None:
    store, image = pulled
    rootfs = store.prepare_rootfs(image.id, "imgrun")
    try:
        c = image.config
        script = "/app/hello; cat /etc/motd /data/keep; echo; ls /opq; echo container > /data/written; id -u"
        config = bundle_config(rootfs, ["/bin/sh", "-c", script])
        config["process"]["env"] = c.env
        config["process"]["cwd"] = c.working_dir
        config["root"]["readonly"] = False
        bundle = write_bundle(tmp_path / "bundle", config)
        done = runtime("run", "--bundle", str(bundle), "imgrun", timeout=60)
        assert done.stdout.splitlines() == ["hello from layer two", "third motd", "keep", "new", "0"]
        assert (rootfs / "data/written").read_text() == "container\n"
    finally:
        runtime.cleanup()
        store.release_rootfs("imgrun")
    again = store.prepare_rootfs(image.id, "imgrun2")
    try:
        assert not (again / "data/written").exists()
    finally:
        store.release_rootfs("imgrun2")
