"""The image store without root: snapshots return mounts that a fake syscall layer records, listing reads one
file however many images there are, and no module of the store reads the environment."""
from __future__ import annotations

import ast
import io
import json
import os
import pathlib
from pathlib import Path

import pytest

from pyruntime.cli.image import _ProgressBar
from pyruntime.images.mount import MS_BIND, MS_REC, OVERLAY_OPTIONS_MAX, Mount, mount_all
from pyruntime.images.pull import ProgressEvent
from pyruntime.images.request import Platform
from pyruntime.images.snapshots import SnapshotError
from pyruntime.images.store import ImageStore
from pyruntime.linux.syscalls import FakeSyscalls
from pyruntime.settings import Settings
from tests.kit.images import add_image, f, tar_entries, write_index

IMAGES = Path(__file__).resolve().parents[2] / "pyruntime" / "images"


def _layout(path: Path, n: int, *, tag: str = "latest", shared: bytes | None = None) -> None:
    layers = [(shared, "gzip")] if shared else []
    layers += [(tar_entries([f(f"{path.name}-{i}", f"{path.name} layer {i}\n")]), "gzip") for i in range(n)]
    desc, _ = add_image(path, layers)
    write_index(path, [desc], tag)


@pytest.fixture
def fake() -> FakeSyscalls:
    return FakeSyscalls()


def _store(tmp_path: Path, fake: FakeSyscalls, snapshotter: str = "overlay") -> ImageStore:
    return ImageStore(tmp_path / "store", snapshotter=snapshotter, kernel=fake)


def test_overlay_rootfs_is_a_record_of_mounts_made_by_the_helper(tmp_path: Path, fake: FakeSyscalls,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pyruntime.images.snapshots.overlay_supported", lambda kind: kind == "overlay")
    store = _store(tmp_path, fake)
    _layout(tmp_path / "app", 3)
    events: list[ProgressEvent] = []
    [image] = store.import_archive(tmp_path / "app", name="example.com/app", progress=events.append)
    assert [(e.layer, e.layers) for e in events if e.status == "unpacked"] == [(0, 3), (1, 3), (2, 3)]
    fake.calls.clear()  # the unpacker's lookups and ownership changes, made through the same kernel

    record = store.prepare_mounts(image.id, "c1")
    lowers = [str(store.snapshots.fs(c)) for c in reversed(image.chain_ids)]
    cdir = store.root / "containers" / "c1"
    assert record.driver == "overlay" and record.rootfs == str(cdir / "rootfs")
    assert record.mounts == [Mount("overlay", "overlay", [f"lowerdir={':'.join(lowers)}",
                                                          f"upperdir={cdir / 'upper'}", f"workdir={cdir / 'work'}"])]
    assert store.snapshots.container("c1") == record  # the record round-trips through mount.json
    assert fake.calls == []  # preparing mounts nothing
    with pytest.raises(SnapshotError, match="already has a rootfs"):
        store.prepare_mounts(image.id, "c1")

    mount_all(record.mounts, tmp_path / "elsewhere", fake)  # a CRI server mounts where it wants
    assert fake.calls == [("mount", "overlay", str(tmp_path / "elsewhere"), "overlay", 0,
                           ",".join(record.mounts[0].options))]
    assert store.release_rootfs("c1") and not cdir.exists()
    assert store.prepare_rootfs(image.id, "c2") == store.root / "containers/c2/rootfs"
    assert fake.named("mount")[-1][2] == str(store.root / "containers/c2/rootfs")
    assert store.release_rootfs("c2")


def test_copy_rootfs_is_a_bind_of_its_own_directory(tmp_path: Path, fake: FakeSyscalls) -> None:
    store = _store(tmp_path, fake, snapshotter="copy")
    _layout(tmp_path / "app", 2)
    [image] = store.import_archive(tmp_path / "app", name="example.com/app")
    rootfs = store.prepare_rootfs(image.id, "c1")
    assert sorted(os.listdir(rootfs)) == ["app-0", "app-1"]
    # already where it belongs: nothing to mount (the copy's ownership and modes went through the kernel)
    assert [c for c in fake.calls if c[0] in ("mount", "mount_with_fsconfig", "umount")] == []
    fake.calls.clear()
    [record] = store.rootfs_mounts()
    assert record.driver == "copy" and record.mounts == [Mount("bind", str(rootfs), ["rbind", "rw"])]
    mount_all(record.mounts, tmp_path / "bundle-rootfs", fake)
    assert fake.calls == [("mount", str(rootfs), str(tmp_path / "bundle-rootfs"), None, MS_BIND | MS_REC, None)]
    assert store.release_rootfs("c1") and store.rootfs_mounts() == []


def test_archive_with_a_multiarch_index_imports_the_chosen_platform(tmp_path: Path, fake: FakeSyscalls) -> None:
    """An OCI layout whose index.json points at an image index: the store's platform picks the manifest."""
    descs, images = [], {}
    for arch in ("amd64", "arm64"):
        desc, images[arch] = add_image(tmp_path / "multi", [(tar_entries([f("arch", arch)]), "gzip")], arch=arch)
        descs.append(dict(desc, platform={"architecture": arch, "os": "linux"}))
    write_index(tmp_path / "multi", descs, nested=True)
    store = ImageStore(tmp_path / "store", snapshotter="copy", platform=Platform.parse("linux/arm64"), kernel=fake)
    [image] = store.import_archive(tmp_path / "multi", name="example.com/multi")
    assert image.id == images["arm64"].config_digest and image.architecture == "arm64"
    assert (store.prepare_rootfs(image.id, "c1") / "arch").read_text() == "arm64"
    assert store.release_rootfs("c1")


def test_long_overlay_options_go_through_fsconfig(fake: FakeSyscalls) -> None:
    lowers = [f"/var/lib/pyruntime/images/snapshots/{i:064x}/fs" for i in range(60)]
    m = Mount("overlay", "overlay", [f"lowerdir={':'.join(lowers)}", "upperdir=/u", "workdir=/w"])
    assert len(",".join(m.options)) > OVERLAY_OPTIONS_MAX
    mount_all([m], "/target", fake)
    [(_, fstype, settings, target)] = fake.calls
    assert (fstype, target) == ("overlay", "/target")
    assert settings == [("lowerdir+", p) for p in lowers] + [("upperdir", "/u"), ("workdir", "/w")]


def test_list_and_prepare_read_one_file_however_many_images(tmp_path: Path, fake: FakeSyscalls,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path, fake, snapshotter="copy")
    base = tar_entries([f("base", "shared\n")])
    reads: list[str] = []
    for method in ("read_text", "read_bytes"):
        real = getattr(pathlib.Path, method)
        def counted(self, *a, _real=real, **k):
            reads.append(self.name)
            return _real(self, *a, **k)
        monkeypatch.setattr(pathlib.Path, method, counted)

    def cost(call) -> int:
        reads.clear()
        call()
        return len(reads)

    first = None
    for i in range(40):
        _layout(tmp_path / f"img{i}", 2, shared=base)
        store.import_archive(tmp_path / f"img{i}", name=f"example.com/img{i}")
        if i == 0:
            first = (cost(store.list), cost(lambda: store.get("example.com/img0")))
    assert first == (1, 1)
    assert cost(store.list) == 1 and cost(lambda: store.get("example.com/img0")) == 1
    assert cost(lambda: store.prepare_mounts("example.com/img7", "c7")) == 1  # images.json; no snapshot records
    images = store.list()
    assert len(images) == 40 and all(i.disk_usage > i.unique_size > 0 for i in images)  # the base is shared
    assert store.release_rootfs("c7")


def test_records_without_the_index_are_completed_from_blobs_and_snapshots(tmp_path: Path, fake: FakeSyscalls) -> None:
    store = _store(tmp_path, fake, snapshotter="copy")
    _layout(tmp_path / "app", 2)
    store.import_archive(tmp_path / "app", name="example.com/app")
    before = store.list()
    db = json.loads((store.root / "images.json").read_text())
    for rec in db["images"].values():
        del rec["summary"], rec["snapshot_sizes"]
    (store.root / "images.json").write_text(json.dumps(db))
    assert store.list() == before and before[0].architecture and before[0].disk_usage > 0


def test_the_store_reads_no_environment_and_the_cli_reads_it_in_one_place() -> None:
    for path in IMAGES.parent.rglob("*.py"):  # the whole package: pyruntime.settings is the one place
        if path == IMAGES.parent / "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                raise AssertionError(f"{path.relative_to(IMAGES.parent)}:{node.lineno} reads the environment")
    env = {"PYRUNTIME_IMAGE_ROOT": "/r", "PYRUNTIME_REGISTRY_CONFIG": "/h", "PYRUNTIME_SNAPSHOTTER": "copy"}
    s = Settings.from_env(env)
    assert (s.image_root, s.hosts_dir, s.snapshotter, s.registry_creds) == ("/r", "/h", "copy", None)
    assert Settings.from_env({}).image_root == "/var/lib/pyruntime/images"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_row_per_layer_on_a_terminal() -> None:
    out = _Tty()
    bar = _ProgressBar(out)
    a, b = "sha256:" + "aa" * 32, "sha256:" + "bb" * 32
    bar(ProgressEvent("r", "", "resolving"))
    bar(ProgressEvent("r", a, "started", 0, 100, 0, 2))
    bar(ProgressEvent("r", b, "started", 0, 2000, 1, 2))
    bar(ProgressEvent("r", b, "done", 2000, 2000, 1, 2))
    bar(ProgressEvent("r", a, "unpacking", layer=0, layers=2))
    bar(ProgressEvent("r", "sha256:" + "cc" * 32, "complete"))
    last = out.getvalue().rsplit("\x1b[3F", 1)[1]  # the final redraw of the three rows
    assert last.split("\n")[:3] == [f"\x1b[2Kr: complete {'cc' * 6}", f"\x1b[2Klayer 1/2 {'aa' * 6}: unpacking",
                                    f"\x1b[2Klayer 2/2 {'bb' * 6}: done"]
