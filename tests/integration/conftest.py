"""Fixtures for the root tier: a busybox rootfs shared read-only by the session, a runtime per test, a CNI
world per test for the plugin tests."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cni_helpers import FORWARDING, make_cni_env
from tests.kit.busybox import build_rootfs, static_busybox
from tests.kit.runtime import Runtime, bundle_config, write_bundle


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory) -> Path:
    return build_rootfs(tmp_path_factory.mktemp("busybox") / "rootfs")


@pytest.fixture
def runtime(tmp_path):
    rt = Runtime(tmp_path / "state")
    yield rt
    rt.cleanup()


@pytest.fixture
def make_bundle(tmp_path, rootfs):
    """make_bundle(args, **top_level_edits) -> (bundle path, config dict); edit the dict, then call again."""
    counter = iter(range(1000))

    def make(args: list[str], config: dict | None = None, **edits) -> Path:
        cfg = config if config is not None else bundle_config(rootfs, args, **edits)
        return write_bundle(tmp_path / f"bundle{next(counter)}", cfg)
    return make


@pytest.fixture
def cni(tmp_path: Path):
    env = make_cni_env(tmp_path)
    try:
        yield env
    finally:
        env.cleanup()


@pytest.fixture(scope="module")
def restore_forwarding():
    """The bridge enables host forwarding for gateways as the reference does; put the host back afterwards.
    The CNI test modules use it (pytestmark), once per module."""
    saved = {p: Path(p).read_text() for p in FORWARDING if Path(p).exists()}
    yield
    for path, value in saved.items():
        Path(path).write_text(value)


@pytest.fixture(scope="session")
def busybox() -> Iterator[str]:
    """The static busybox where any user can run it, for tests that exec it on the host under another uid
    (the kit's cache lives under root's 0700 home; the host's /bin/busybox may be absent or dynamic)."""
    where = tempfile.mkdtemp(prefix="pynode-busybox-")
    try:
        os.chmod(where, 0o755)
        path = os.path.join(where, "busybox")
        shutil.copyfile(static_busybox(), path)
        os.chmod(path, 0o755)
        yield path
    finally:
        shutil.rmtree(where)
