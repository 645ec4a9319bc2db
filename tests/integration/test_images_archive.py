"""import/export of OCI layouts and docker-archives, checked against skopeo, and the `pyruntime image` CLI."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pyruntime.cli.image import main
from pyruntime.images.store import ImageStore
from tests.integration.registry_server import Registry
from tests.kit.busybox import build_busybox_image, static_busybox
from tests.kit.images import build_layered_image


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("archive")
    image = build_busybox_image(tmp / "layout", tmp / "work")
    r = Registry(tmp / "reg").start()
    try:
        r.push(image.layout, "library/busybox:latest")
        yield r, image
    finally:
        r.stop()


def test_export_then_import_round_trip_and_skopeo_reads_it(reg, tmp_path: Path) -> None:
    registry, image = reg
    ref = f"{registry.host}/library/busybox:latest"
    src = ImageStore(tmp_path / "a")
    src.pull(ref)
    archive = src.export([ref], tmp_path / "busybox.tar")
    for transport in ("oci-archive", "docker-archive"):
        out = subprocess.run(["skopeo", "inspect", "--raw", f"{transport}:{archive}"], check=True,
                             capture_output=True, text=True).stdout
        assert json.loads(out)["config"]["digest"] == image.config_digest
    dst = ImageStore(tmp_path / "b")
    [imported] = dst.import_archive(archive)
    assert imported.id == image.config_digest and imported.repo_tags == [ref]
    root = dst.prepare_rootfs(ref, "imported")
    try:
        assert (root / "bin/busybox").stat().st_size == static_busybox().stat().st_size
    finally:
        dst.release_rootfs("imported")


def test_import_docker_archive_written_by_skopeo(reg, tmp_path: Path) -> None:
    registry, image = reg
    archive = tmp_path / "docker.tar"
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{registry.host}/library/busybox:latest", f"docker-archive:{archive}:busybox:1.0"],
                   check=True, capture_output=True)
    store = ImageStore(tmp_path / "store")
    [imported] = store.import_archive(archive)
    assert imported.id == image.config_digest
    assert imported.repo_tags == ["docker.io/library/busybox:1.0"]
    assert imported.diff_ids == image.diff_ids


def test_import_oci_layout_directory_with_name(tmp_path: Path) -> None:
    image = build_layered_image(tmp_path / "layout", tmp_path / "work", tag="v2")
    store = ImageStore(tmp_path / "store")
    [imported] = store.import_archive(tmp_path / "layout", name="example.com/layered")
    assert imported.id == image.config_digest and imported.repo_tags == ["example.com/layered:v2"]
    corrupt = tmp_path / "layout/blobs/sha256" / image.layer_digests[1].split(":")[1]
    corrupt.write_bytes(corrupt.read_bytes()[:-10] + b"0123456789")
    other = ImageStore(tmp_path / "other")
    with pytest.raises(Exception, match=image.layer_digests[1]):
        other.import_archive(tmp_path / "layout", name="example.com/layered")
    assert other.list() == []


def test_cli_pull_list_inspect_remove(reg, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    registry, image = reg
    root = ["--root", str(tmp_path / "store")]
    ref = f"{registry.host}/library/busybox:latest"
    assert main(root + ["pull", ref]) == 0
    assert capsys.readouterr().out.strip() == image.config_digest
    assert main(root + ["list"]) == 0
    listing = capsys.readouterr().out
    assert ref in listing and image.config_digest[7:19] in listing
    assert main(root + ["inspect", ref]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["cmd"] == ["sh"] and info["repo_tags"] == [ref]
    assert main(root + ["mount", ref, "cli-c1"]) == 0
    rootfs = Path(capsys.readouterr().out.strip())
    assert (rootfs / "bin/busybox").exists()
    assert main(root + ["unmount", "cli-c1"]) == 0
    assert main(root + ["export", ref, "-o", str(tmp_path / "x.tar")]) == 0
    assert main(root + ["remove", ref]) == 0
    assert "Deleted: " + image.config_digest in capsys.readouterr().out
    assert main(root + ["import", str(tmp_path / "x.tar")]) == 0
    assert capsys.readouterr().out.split() == [image.config_digest, ref]
    assert main(root + ["prune"]) == 0
    pruned = capsys.readouterr().out
    assert f"Deleted: {image.config_digest}" in pruned and "Reclaimed" in pruned
    assert main(root + ["list", "-q"]) == 0
    assert capsys.readouterr().out == ""
    assert main(root + ["inspect", "NOT A REF"]) == 1
    assert "'NOT A REF'" in capsys.readouterr().err
    assert main(root + ["pull", "127.0.0.1:1/x:latest"]) == 1
    assert "127.0.0.1:1" in capsys.readouterr().err
