"""containerd's runc v2 shim driving pyruntime: the runc CLI contract as a real caller exercises it.

The shim passes its own flags (--root, --log, --log-format json, --systemd-cgroup only when asked), runs
`create` with a pid file and inherited fifos for stdio, reads the exit status from its own reaping and
finishes with `delete`; a runtime that only works from a shell fails here first.
"""
from __future__ import annotations

import tarfile
from pathlib import Path

from tests.integration import containerd_fixture
from tests.kit.busybox import build_busybox_image

containerd = containerd_fixture.containerd

PYRUNTIME = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "pyruntime"
IMAGE = "pynode.test/busybox:latest"


def _oci_archive(tmp_path: Path) -> Path:
    layout = tmp_path / "layout"
    build_busybox_image(layout, tmp_path / "work")
    archive = tmp_path / "busybox.tar"
    with tarfile.open(archive, "w") as tar:
        for entry in sorted(layout.iterdir()):
            tar.add(entry, arcname=entry.name)
    return archive


def _logging_runtime(tmp_path: Path) -> tuple[Path, Path]:
    """pyruntime behind a wrapper that records each invocation, to prove the shim called it and not runc."""
    log = tmp_path / "invocations.log"
    wrapper = tmp_path / "pyruntime-logged"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {PYRUNTIME} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def test_ctr_run_reports_output_and_exit_status(containerd, tmp_path):
    containerd.ctr("images", "import", "--base-name", IMAGE.rsplit(":", 1)[0], str(_oci_archive(tmp_path)))
    assert IMAGE in containerd.ctr("images", "ls", "-q").stdout.split()
    runtime, log = _logging_runtime(tmp_path)
    try:
        result = containerd.run(IMAGE, "interop-exit", "sh", "-c", "echo hi; echo oops >&2; exit 7", runtime=runtime)
        assert (result.returncode, result.stdout) == (7, "hi\n"), f"{result}\n{containerd.log()}"
        assert "oops" in result.stderr
        assert {"create", "start", "delete"} <= set(log.read_text().split()), log.read_text()
        assert containerd.ctr("containers", "ls", "-q").stdout.split() == []
    finally:
        containerd.ctr("images", "rm", "--sync", IMAGE, check=False)


def test_ctr_run_with_missing_binary_in_image_fails_cleanly(containerd, tmp_path):
    containerd.ctr("images", "import", "--base-name", IMAGE.rsplit(":", 1)[0], str(_oci_archive(tmp_path)))
    try:
        result = containerd.run(IMAGE, "interop-noexec", "/no/such/binary", runtime=PYRUNTIME)
        assert result.returncode != 0
        containerd.ctr("containers", "rm", "interop-noexec", check=False)
        assert containerd.ctr("containers", "ls", "-q").stdout.split() == []
        assert containerd.ctr("tasks", "ls", "-q").stdout.split() == []
    finally:
        containerd.ctr("images", "rm", "--sync", IMAGE, check=False)

