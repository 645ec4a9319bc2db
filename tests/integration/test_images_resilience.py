"""Pulls that break: connections cut mid-blob, and pull processes killed at random points and restarted."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pyruntime.images.store import ImageStore
from tests.integration.registry_server import Registry
from tests.kit.images import build_random_image
from tests.kit.tcpproxy import CuttingProxy


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("resilience")
    image = build_random_image(tmp / "layout", [6 << 20, 6 << 20, 4 << 20, 1 << 20])
    r = Registry(tmp / "reg").start()
    try:
        r.push(image.layout, "test/random:latest")
        yield r, image
    finally:
        r.stop()


def _garbage(store: ImageStore) -> list[str]:
    root = store.root
    leftovers = [p.name for p in (root / "snapshots").iterdir() if "." in p.name]
    leftovers += [p.name for p in (root / "ingest").iterdir()]
    leftovers += [p.name for p in root.rglob(".*.tmp")]
    return leftovers


def test_broken_connections_resume_with_range(reg, tmp_path: Path) -> None:
    registry, image = reg
    proxy = CuttingProxy(registry.port, limit=1_500_000, cuts=3)
    try:
        store = ImageStore(tmp_path / "store")
        pulled = store.pull(f"127.0.0.1:{proxy.port}/test/random:latest")
        assert pulled.id == image.config_digest
        assert any(b"Range: bytes=" in r for r in proxy.requests), "no ranged request after the cut"
        assert _garbage(store) == []
    finally:
        proxy.stop()


def _stalled_pull(pull) -> BaseException | None:
    """Runs `pull` (a progress timeout of 1 s, against a proxy that stalls) in a thread; fails unless it ends
    well within 10 times that, and returns what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pull()
        except BaseException as e:
            errors.append(e)

    puller = threading.Thread(target=run, daemon=True)
    puller.start()
    puller.join(10 * 1.0 + 20)
    assert not puller.is_alive(), "the pull outlived its progress timeout"
    return errors[0] if errors else None


def test_a_registry_that_stalls_mid_blob_fails_the_pull_within_its_progress_timeout(reg, tmp_path: Path) -> None:
    """Issue 22: a pull had no progress deadline: a registry (or a path to it) that went silent mid-blob
    held the pull, and the pod worker waiting on it, through a minute per read and retries it could stretch.
    Now a blob whose bytes stand still for the progress timeout (containerd's image_pull_progress_timeout)
    fails the pull with an error that says so, and leaves nothing half-made."""
    from pyruntime.images.registry import RegistryError

    registry, _ = reg
    proxy = CuttingProxy(registry.port, limit=1_500_000, cuts=1000, stall=True)
    store = ImageStore(tmp_path / "store")
    try:
        error = _stalled_pull(lambda: store.pull(f"127.0.0.1:{proxy.port}/test/random:latest", progress_timeout=1.0))
        assert isinstance(error, RegistryError) and "no progress for 1s" in str(error), error
        assert [p for p in (store.root / "snapshots").iterdir() if "." in p.name] == []
    finally:
        proxy.stop()


def test_a_stalled_pull_through_the_cri_launcher_fails_within_its_progress_timeout(reg, tmp_path: Path) -> None:
    """pyruntime-cri's PullImage path: the pull runs in a child of its launcher with the daemon's
    image_pull_progress_timeout, and the stall comes back as an Unavailable error that says so."""
    from pyruntime.cri.launcher import Launcher
    from pyruntime.cri.model import Layout
    from pyruntime.errors import UnavailableError
    from pyruntime.settings import Settings

    registry, _ = reg
    proxy = CuttingProxy(registry.port, limit=1_500_000, cuts=1000, stall=True)
    settings = Settings(root=str(tmp_path / "runtime"), image_root=str(tmp_path / "store"),
                        hosts_dir=str(tmp_path / "certs.d"))
    launcher = Launcher.spawn(settings, Layout(str(tmp_path / "root"), str(tmp_path / "state")))
    try:
        error = _stalled_pull(lambda: launcher.pull_image(f"127.0.0.1:{proxy.port}/test/random:latest", None,
                                                          progress_timeout=1.0))
        assert isinstance(error, UnavailableError) and "no progress for 1s" in str(error), error
    finally:
        proxy.stop()
        launcher.close()


PULL = ("import sys; from pyruntime.images.store import ImageStore; "
        "ImageStore(sys.argv[1]).pull(sys.argv[2])")


def test_pull_killed_at_random_points_then_restarted(reg, tmp_path: Path) -> None:
    registry, image = reg
    proxy = CuttingProxy(registry.port, pause=0.01)  # about 6 MB/s: a whole pull takes some seconds
    ref = f"127.0.0.1:{proxy.port}/test/random:latest"
    root = tmp_path / "store"
    rng = random.Random(4)
    interrupted = 0
    try:
        for _ in range(6):
            proc = subprocess.Popen([sys.executable, "-c", PULL, str(root), ref], cwd=Path(__file__).parents[2])
            time.sleep(rng.uniform(0.3, 1.0))
            proc.send_signal(signal.SIGKILL)
            interrupted += proc.wait() == -signal.SIGKILL
        store = ImageStore(root)
        assert interrupted >= 3, "the pulls finished before they could be killed"
        assert [i.id for i in store.list()] in ([], [image.config_digest])
        pulled = store.pull(ref)
    finally:
        proxy.stop()
    assert pulled.id == image.config_digest
    assert _garbage(store) == []
    assert sorted(s.chain_id for s in store.snapshots.list()) == sorted(pulled.chain_ids)
    expected_blobs = {image.manifest_digest, image.config_digest, *image.layer_digests}
    assert set(store.content.list()) == expected_blobs
    rootfs = store.prepare_rootfs(ref, "after-kill")
    try:
        assert sorted(p.name for p in rootfs.iterdir()) == ["layer0", "layer1", "layer2", "layer3"]
        assert sum(f.stat().st_size for f in rootfs.rglob("blob*")) == (6 << 20) * 2 + (4 << 20) + (1 << 20)
    finally:
        store.release_rootfs("after-kill")
    store.remove(ref)
    assert store.content.list() == [] and store.snapshots.list() == []


def test_processes_pulling_the_same_image_at_once(reg, tmp_path: Path) -> None:
    registry, image = reg
    ref = f"{registry.host}/test/random:latest"
    root = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", PULL, str(root), ref], cwd=Path(__file__).parents[2],
                              stderr=subprocess.PIPE) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    store = ImageStore(root)
    assert [i.id for i in store.list()] == [image.config_digest]
    assert len(store.snapshots.list()) == len(image.layer_digests) and _garbage(store) == []
