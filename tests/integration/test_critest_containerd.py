"""critest's fast, image- and network-heavy specs against containerd 1.6, through the whole harness.

Proves the harness and the test images on a reference CRI server: every image critest pulls comes from
the test registry through the certs.d mirrors, the nginx/httpd stand-ins serve on the pod IP, a hostPort
and a port-forward, nonewprivs' setuid program reports its effective uid, the host-IPC specs see their
shm segment, and the harness removes what critest leaves (shm segments, CNI-HOSTPORT chains), which this
test's leak check confirms. The full run is `make conformance`.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conformance import critest

FOCUS = r"Image Manager|Multiple Containers|Networking|NoNewPrivs|NamespaceOption|port forward"

NEEDED = (critest.CRITEST, critest.PEERS_BIN / "ginkgo", critest.REFERENCE_CNI / "portmap")
pytestmark = pytest.mark.skipif(not shutil.which("containerd") or not all(p.exists() for p in NEEDED),
                                reason="needs containerd, critest, ginkgo and the reference portmap (make peers)")


def test_critest_focused_specs_pass_against_containerd(tmp_path: Path) -> None:
    with critest.critest_registry(tmp_path / "mirror") as mirror:
        # the test session holds the integration lock already (flock around pytest)
        result = critest.run_endpoint(critest.Containerd, mirror, tmp_path / "results", parallel=4,
                                      skip=critest.skip_pattern([]), focus=FOCUS, lock=False)
    assert not (tmp_path / "results" / "leaks.txt").exists(), (tmp_path / "results" / "leaks.txt").read_text()
    ran = {name: s for name, s in result.items() if s["state"] in ("passed", "failed")}
    assert len(ran) >= 25, (tmp_path / "results" / "critest.log").read_text()[-3000:]
    failed = {name: s["message"] for name, s in ran.items() if s["state"] == "failed"}
    assert failed == {}, failed
