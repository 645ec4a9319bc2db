"""critest through the whole harness: its fast image- and network-heavy specs against containerd 1.6, and all
but its slowest specs against pyruntime-cri.

Against containerd (the reference) it proves the harness and the test images: every image critest pulls
comes from the test registry through the certs.d mirrors, the nginx/httpd stand-ins serve on the pod IP, a
hostPort and a port-forward, nonewprivs' setuid program reports its effective uid, the host-IPC specs see
their shm segment, and the harness removes what critest leaves (shm segments, CNI-HOSTPORT chains), which
this test's leak check confirms. Against pyruntime-cri it is the conformance of our own server: every spec
critest runs (with --parallel 8, as cri-tools' CI) but the digest-pinned one, the benchmarks, and the few
slowest that wait on timers (OOM kill, log reopening), which `make conformance` still runs.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conformance import critest

CONTAINERD_FOCUS = r"Image Manager|Multiple Containers|Networking|NoNewPrivs|NamespaceOption|port forward"
PYRUNTIME_SLOW = ["should terminate with exitCode 137 and reason OOMKilled", "should support reopening container log"]

NEEDED = (critest.CRITEST, critest.PEERS_BIN / "ginkgo", critest.CRICTL)


def needs(available: bool, reason: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not available or not all(p.exists() for p in NEEDED), reason=reason)


@pytest.mark.parametrize("endpoint,parallel,focus,slow,min_ran", [
    pytest.param(critest.Containerd, 4, CONTAINERD_FOCUS, [], 25, id="containerd", marks=needs(
        bool(shutil.which("containerd")) and (critest.REFERENCE_CNI / "portmap").exists(),
        "needs containerd, critest, ginkgo and the reference portmap (make peers)")),
    pytest.param(critest.PyruntimeCri, 8, "", PYRUNTIME_SLOW, 100, id="pyruntime-cri", marks=needs(
        critest.pyruntime_cri_bin() is not None, "needs pyruntime-cri (make setup), critest and ginkgo (make peers)")),
])
def test_critest_specs_pass(tmp_path: Path, endpoint: type[critest.Endpoint], parallel: int, focus: str,
                            slow: list[str], min_ran: int) -> None:
    with critest.critest_registry(tmp_path / "mirror") as mirror:
        # the test session holds the integration lock already (flock around pytest)
        result = critest.run_endpoint(endpoint, mirror, tmp_path / "results", parallel=parallel,
                                      skip=critest.skip_pattern(slow), focus=focus, lock=False)
    assert not (tmp_path / "results" / "leaks.txt").exists(), (tmp_path / "results" / "leaks.txt").read_text()
    ran = {name: s for name, s in result.items() if s["state"] in ("passed", "failed")}
    assert len(ran) >= min_ran, (tmp_path / "results" / "critest.log").read_text()[-3000:]
    failed = {name: s["message"] for name, s in ran.items() if s["state"] == "failed"}
    assert failed == {}, failed
