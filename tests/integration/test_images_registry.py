"""Pulls from a real registry (Debian's docker-registry) of images pushed by skopeo, checked file by file."""
from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyruntime.errors import NotFoundError, UnavailableError
from pyruntime.images.content import DigestError
from pyruntime.images.metadata import ImageInUse, ImageNotFound
from pyruntime.images.pull import ProgressEvent
from pyruntime.images.registry import AuthError, RegistryError
from pyruntime.images.request import Credentials, Platform
from pyruntime.images.snapshots import overlay_supported
from pyruntime.images.store import ImageStore
from pyruntime.images.unpack import UnsafeLayerError
from tests.integration.registry_server import Registry, free_port
from tests.integration.registry_token import TokenServer
from tests.kit.busybox import ARCH, OCIImage, build_busybox_image, static_busybox
from tests.kit.images import (
    add_image,
    build_layered_image,
    build_multiarch_image,
    build_single_layer_image,
    busybox_layer,
    d,
    f,
    hardlink,
    symlink,
    tar_entries,
    write_index,
)


@dataclass
class Images:
    reg: Registry
    busybox: OCIImage
    layered: OCIImage
    multiarch: dict[str, OCIImage]
    app_a: OCIImage
    app_b: OCIImage

    def ref(self, name: str) -> str:
        return f"{self.reg.host}/{name}"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    tmp = tmp_path_factory.mktemp("registry")
    work = tmp / "work"
    busybox = build_busybox_image(tmp / "busybox", work / "bb")
    layered = build_layered_image(tmp / "layered", work / "layered")
    multiarch = build_multiarch_image(tmp / "multiarch", work / "multi")
    bb = busybox_layer(work / "shared")
    shared = []
    for name in ("a", "b"):
        desc, image = add_image(tmp / f"app-{name}", [(bb, "gzip"), (tar_entries([f(f"app-{name}", name)]), "gzip")])
        write_index(tmp / f"app-{name}", [desc])
        shared.append(image)
    reg = Registry(tmp / "reg").start()
    try:
        reg.push(busybox.layout, "library/busybox:latest")
        reg.push(layered.layout, "test/layered:v1")
        reg.push(tmp / "multiarch", "test/multiarch:latest", multi_arch=True)
        reg.push(shared[0].layout, "test/app-a:latest")
        reg.push(shared[1].layout, "test/app-b:latest")
        yield Images(reg, busybox, layered, multiarch, shared[0], shared[1])
    finally:
        reg.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ImageStore]:
    s = ImageStore(tmp_path / "store")
    yield s
    for m in s.rootfs_mounts():
        s.release_rootfs(m.container_id)


def _store_files(store: ImageStore) -> dict[str, list[str]]:
    root = store.root
    return {"blobs": sorted(os.listdir(root / "blobs/sha256")), "snapshots": sorted(os.listdir(root / "snapshots")),
            "ingest": sorted(os.listdir(root / "ingest")), "containers": sorted(os.listdir(root / "containers"))}


def _assert_empty(store: ImageStore) -> None:
    assert store.list() == []
    assert _store_files(store) == {"blobs": [], "snapshots": [], "ingest": [], "containers": []}
    locks = [p.name for p in (store.root / "locks").iterdir()]
    assert [name for name in locks if name.startswith(("blob-", "snapshot-", "container-"))] == []


def test_pull_busybox_inspect_mount_remove(images: Images, store: ImageStore) -> None:
    ref = images.ref("library/busybox:latest")
    events: list[ProgressEvent] = []
    image = store.pull(ref, progress=events.append)
    assert image.id == images.busybox.config_digest
    assert image.manifest_digest == images.busybox.manifest_digest
    assert image.repo_tags == [ref]
    assert image.repo_digests == [f"{images.reg.host}/library/busybox@{images.busybox.manifest_digest}"]
    assert image.config.cmd == ["sh"] and image.config.working_dir == "/"
    assert image.disk_usage > 1_000_000 and image.size > 500_000
    assert {e.status for e in events} >= {"resolving", "downloading", "done", "unpacked", "complete"}
    assert [i.id for i in store.list()] == [image.id]
    assert store.get(image.id).id == store.get(image.id[7:19]).id == store.get(ref).id == image.id
    assert store.get(f"{images.reg.host}/library/busybox@{images.busybox.manifest_digest}").id == image.id

    rootfs = store.prepare_rootfs(ref, "c1")
    assert (rootfs / "bin/busybox").read_bytes() == static_busybox().read_bytes()
    assert os.readlink(rootfs / "bin/sh") == "/bin/busybox"
    (rootfs / "tmp/written").write_text("upper")  # a container's writes stay in its own upper
    with pytest.raises(ImageInUse, match="c1"):
        store.remove(ref)
    assert store.get(ref).repo_tags == [ref]  # a refused removal changes nothing
    assert store.release_rootfs("c1")
    assert store.remove(image.id) == [image.id]
    _assert_empty(store)
    with pytest.raises(ImageNotFound, match="busybox"):
        store.get(ref)


@pytest.mark.parametrize("driver", ["overlay", "copy"])
def test_layered_image_rootfs_file_by_file(images: Images, store: ImageStore, driver: str) -> None:
    if driver == "overlay" and not overlay_supported():
        pytest.skip("overlayfs not available")
    store = ImageStore(store.root, snapshotter=driver)  # the fixture still releases what this one prepares
    ref = images.ref("test/layered:v1")
    image = store.pull(ref)
    assert len(image.chain_ids) == 4 and image.layers[3]["mediaType"].endswith("+zstd")
    c = image.config
    assert (c.entrypoint, c.cmd, c.user, c.working_dir) == (["/app/hello"], ["--flag"], "1000:1000", "/app")
    assert c.env == ["PATH=/bin:/usr/bin", "GREETING=hi"] and c.exposed_ports == ["8080/tcp"]
    assert c.volumes == ["/data"] and c.labels == {"org.example.kit": "layered"}

    root = store.prepare_rootfs(ref, "layered")
    assert store.rootfs_mounts()[0].driver == driver
    assert sorted(os.listdir(root / "data")) == ["added", "keep"]  # .wh.remove-me and .wh.subdir applied
    assert sorted(os.listdir(root / "opq")) == ["new"]  # opaque: old1, old2 hidden
    assert stat.S_IMODE(os.stat(root / "opq").st_mode) == 0o750
    assert (root / "etc/motd").read_text() == "third motd\n"  # from the zstd layer
    assert (root / "etc/passwd").read_text().startswith("root:x:0:0")  # implicit parent kept the lower's files
    hello = os.stat(root / "app/hello")
    assert (hello.st_uid, hello.st_gid, stat.S_IMODE(hello.st_mode)) == (1000, 1000, 0o755)
    assert os.stat(root / "app/hello-link").st_ino == hello.st_ino
    assert os.stat(root / "app/motd-link").st_ino == os.stat(root / "etc/motd").st_ino
    assert os.readlink(root / "app/motd") == "/etc/motd"
    assert not os.path.lexists(root / "app/setuid")
    assert os.getxattr(root / "app/xattr", "user.pynode") == b"yes"
    assert stat.S_ISFIFO(os.lstat(root / "app/fifo").st_mode)
    assert os.lstat(root / "app/null").st_rdev == os.makedev(1, 3)
    assert not any(n.startswith(".wh.") for _, dirs, files in os.walk(root) for n in dirs + files)
    (root / "data/keep").write_text("changed")
    store.release_rootfs("layered")
    fresh = store.prepare_rootfs(ref, "layered2")
    assert (fresh / "data/keep").read_text() == "keep"  # the snapshot itself was never written
    store.release_rootfs("layered2")


def test_multiarch_index_selects_platform(images: Images, store: ImageStore) -> None:
    ref = images.ref("test/multiarch:latest")
    host = store.pull(ref)
    assert host.id == images.multiarch[ARCH if ARCH != "arm64" else "arm64/v8"].config_digest
    assert host.index_digest and host.repo_digests == [f"{images.reg.host}/test/multiarch@{host.index_digest}"]
    for platform, marker in (("linux/arm64", "arm64/v8\n"), ("linux/arm/v7", "arm/v7\n")):
        other = store.pull(ref, platform=Platform.parse(platform))
        assert other.architecture == platform.split("/")[1]
        root = store.prepare_rootfs(other.id, f"c-{other.architecture}")
        assert (root / "arch").read_text() == marker
        store.release_rootfs(f"c-{other.architecture}")
    with pytest.raises(NotFoundError, match="linux/s390x"):
        store.pull(ref, platform=Platform.parse("linux/s390x"))


def test_shared_layer_survives_removal_of_one_image(images: Images, store: ImageStore) -> None:
    a = store.pull(images.ref("test/app-a:latest"))
    b = store.pull(images.ref("test/app-b:latest"))
    base = a.chain_ids[0]
    assert b.chain_ids[0] == base and store.refcounts()[base] == 2
    a = store.get(a.id)
    assert a.unique_size < a.disk_usage
    store.remove(images.ref("test/app-a:latest"))
    assert store.refcounts() == {base: 1, b.chain_ids[1]: 1}
    root = store.prepare_rootfs(b.id, "b")
    assert (root / "app-b").read_text() == "b" and (root / "bin/busybox").exists()
    assert not (root / "app-a").exists()
    store.release_rootfs("b")
    store.remove(images.ref("test/app-b:latest"))
    _assert_empty(store)


def test_concurrent_pulls_share_the_work(images: Images, store: ImageStore) -> None:
    ref = images.ref("test/layered:v1")
    results, errors = [], []

    def pull() -> None:
        try:
            results.append(store.pull(ref).id)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=pull) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert len(_store_files(store)["snapshots"]) == 4
    assert _store_files(store)["ingest"] == []


def test_prune_keeps_what_containers_use(images: Images, store: ImageStore) -> None:
    bb = store.pull(images.ref("library/busybox:latest"))
    store.pull(images.ref("test/app-a:latest"))
    store.prepare_rootfs(bb.id, "keeper")
    report = store.prune()
    assert [i.id for i in store.list()] == [bb.id] and len(report.images) == 1 and report.reclaimed > 0
    store.release_rootfs("keeper")
    store.prune()
    _assert_empty(store)


def test_dangling_prune(images: Images, store: ImageStore) -> None:
    store.pull(images.ref("library/busybox:latest"))
    store.tag(images.ref("library/busybox:latest"), "example.com/other:1")
    store.remove(images.ref("library/busybox:latest"))
    assert store.prune(dangling_only=True).images == []
    assert store.list()[0].repo_tags == ["example.com/other:1"]


def test_blob_whose_digest_lies_is_refused(images: Images, tmp_path: Path) -> None:
    work = tmp_path / "lying"
    image = build_busybox_image(work / "layout", work / "w")
    reg = Registry(tmp_path / "reg2").start()
    try:
        reg.push(image.layout, "test/lying:latest")
        layer = image.layer_digests[0].split(":")[1]
        data = reg.root / "data/docker/registry/v2/blobs/sha256" / layer[:2] / layer / "data"
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
        store = ImageStore(tmp_path / "store")
        with pytest.raises(DigestError, match=image.layer_digests[0]):
            store.pull(f"{reg.host}/test/lying:latest")
        assert store.list() == []
        assert not store.content.has(image.layer_digests[0])
        assert _store_files(store)["ingest"] == [] and _store_files(store)["snapshots"] == []
    finally:
        reg.stop()


@pytest.mark.parametrize("name,entries", [
    ("slip", [d("x"), f("../../../../tmp/pynode-slip", "pwned")]),
    ("absolute", [f("/tmp/pynode-slip", "pwned")]),
    ("symlink-out", [symlink("out", "../../../../tmp"), f("out/pynode-slip", "pwned")]),
    ("hardlink-out", [f("a", "a"), hardlink("b", "../../../etc/passwd")]),
])
def test_malicious_layer_from_registry_is_refused(tmp_path: Path, name: str, entries: list) -> None:
    image = build_single_layer_image(tmp_path / "layout", entries)
    reg = Registry(tmp_path / "reg").start()
    try:
        reg.push(image.layout, f"evil/{name}:latest")
        store = ImageStore(tmp_path / "store")
        with pytest.raises(UnsafeLayerError):
            store.pull(f"{reg.host}/evil/{name}:latest")
        assert not os.path.lexists("/tmp/pynode-slip")
        assert store.list() == [] and _store_files(store)["snapshots"] == []
        assert not any(tmp_path.rglob("pynode-slip"))
    finally:
        reg.stop()


def test_missing_image_names_the_reference(images: Images, store: ImageStore) -> None:
    with pytest.raises(NotFoundError, match="test/nothing"):
        store.pull(images.ref("test/nothing:latest"))
    with pytest.raises(RegistryError, match=r"127\.0\.0\.1") as unreachable:
        store.pull(f"127.0.0.1:{free_port()}/test/nothing:latest")
    assert isinstance(unreachable.value, UnavailableError)  # a retry may succeed; the kubelet retries it


def test_basic_auth(tmp_path: Path) -> None:
    image = build_busybox_image(tmp_path / "layout", tmp_path / "w")
    reg = Registry(tmp_path / "reg", auth="htpasswd", users={"alice": "s3cret"}).start()
    try:
        reg.push(image.layout, "private/busybox:latest", creds="alice:s3cret")
        store = ImageStore(tmp_path / "store")
        ref = f"{reg.host}/private/busybox:latest"
        with pytest.raises(AuthError, match="credentials"):
            store.pull(ref)
        with pytest.raises(AuthError, match="refused"):
            store.pull(ref, auth=Credentials("alice", "wrong"))
        assert store.pull(ref, auth=Credentials("alice", "s3cret")).id == image.config_digest
    finally:
        reg.stop()


def test_token_auth(tmp_path: Path) -> None:
    image = build_busybox_image(tmp_path / "layout", tmp_path / "w")
    tokens = TokenServer(tmp_path / "token", {"bob": "pw"}, anonymous_repos=("library/public",)).start()
    reg = Registry(tmp_path / "reg", auth="token", token_realm=tokens.realm, token_cert=tokens.cert).start()
    try:
        reg.push(image.layout, "private/busybox:latest", creds="bob:pw")
        reg.push(image.layout, "library/public:latest", creds="bob:pw")
        store = ImageStore(tmp_path / "store")
        assert store.pull(f"{reg.host}/library/public:latest").id == image.config_digest  # anonymous token
        private = f"{reg.host}/private/busybox:latest"
        with pytest.raises(AuthError, match="no credentials"):
            store.pull(private)
        with pytest.raises(AuthError, match=r"token server .* 401"):
            store.pull(private, auth=Credentials("bob", "wrong"))
        assert private in store.pull(private, auth=Credentials("bob", "pw")).repo_tags
        assert {"user": "bob", "scope": ["repository:private/busybox:pull"]} in tokens.requests
    finally:
        reg.stop()
        tokens.stop()


def test_mirrors_in_order_with_fallback(images: Images, tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d"
    for upstream in ("docker.io", "registry.k8s.io"):
        (hosts / upstream).mkdir(parents=True)
        (hosts / upstream / "hosts.toml").write_text(
            f'server = "http://127.0.0.1:{free_port()}"\n'
            f'[host."http://127.0.0.1:{free_port()}"]\n  capabilities = ["pull", "resolve"]\n'
            f'[host."http://{images.reg.host}"]\n  capabilities = ["pull", "resolve"]\n')
    store = ImageStore(tmp_path / "store", hosts_dir=hosts)
    image = store.pull("busybox")  # docker.io/library/busybox:latest, served by the second mirror
    assert image.id == images.busybox.config_digest
    assert image.repo_tags == ["docker.io/library/busybox:latest"]
    assert store.pull("registry.k8s.io/test/app-a:latest").id == images.app_a.config_digest
    with pytest.raises(RegistryError, match="every endpoint failed"):
        store.pull("registry.k8s.io/test/absent:latest")


def test_https_registry_with_ca_bundle(tmp_path: Path) -> None:
    image = build_busybox_image(tmp_path / "layout", tmp_path / "w")
    reg = Registry(tmp_path / "reg", tls=True).start()
    try:
        reg.push(image.layout, "library/busybox:latest")
        ref = f"{reg.host}/library/busybox:latest"
        hosts = tmp_path / "certs.d"
        (hosts / reg.host).mkdir(parents=True)
        (hosts / reg.host / "hosts.toml").write_text(f'server = "https://{reg.host}"\nca = "{reg.cert}"\n')
        assert ImageStore(tmp_path / "s1", hosts_dir=hosts).pull(ref).id == image.config_digest
        (hosts / reg.host / "hosts.toml").write_text(f'server = "https://{reg.host}"\n')
        with pytest.raises(RegistryError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            ImageStore(tmp_path / "s2", hosts_dir=hosts).pull(ref)
    finally:
        reg.stop()


def test_image_with_many_layers_still_mounts_overlay(tmp_path: Path) -> None:
    if not overlay_supported():
        pytest.skip("overlayfs not available")
    layers = [(tar_entries([f(f"file{i}", str(i))] + ([f("common", str(i))])), "gzip") for i in range(60)]
    desc, _ = add_image(tmp_path / "layout", layers)
    write_index(tmp_path / "layout", [desc])
    store = ImageStore(tmp_path / "a-rather-long-store-root-directory-name-to-push-the-mount-options-past-a-page")
    [imported] = store.import_archive(tmp_path / "layout", name="example.com/many")
    root = store.prepare_rootfs(imported.id, "many")
    try:
        assert store.rootfs_mounts()[0].driver == "overlay"
        assert (root / "common").read_text() == "59" and (root / "file0").read_text() == "0"
        assert len(list(root.iterdir())) == 61
    finally:
        store.release_rootfs("many")
