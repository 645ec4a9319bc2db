"""`make conformance-k8s` through its whole harness (tests/conformance/k8s_suite.py), with a few fast specs that
between them run agnhost and every stand-in the images of their kind need: the image list from e2e.test, the dry
run's selection, `make cluster` for the pair, the images pushed to its registry, ginkgo's reports read back, the
table, and the cluster gone again.

On the stock pair every one of them passes: that is the proof of the harness and of the images (as
test_critest_containerd is critest's). On ours each is run and has an outcome; which one is what
`make conformance-k8s` measures, not this test.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pynode_cluster import cluster
from tests.conformance import k8s_suite

SPECS = [
    # agnhost (mounttest)
    "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs) [LinuxOnly] [Conformance] [NodeConformance]",
    # busybox
    "[sig-node] Downward API should provide host IP as an env var [Conformance] [NodeConformance]",
    # nonroot
    "[sig-node] Security Context When creating a container with runAsNonRoot should run with an image specified user "
    "ID [NodeConformance]",
    # nonewprivs
    "[sig-node] Security Context when creating containers with AllowPrivilegeEscalation should not allow privilege "
    "escalation when false [LinuxOnly] [Conformance] [NodeConformance]",
    # pause
    "[sig-node] Pods should get a host IP [Conformance] [NodeConformance]",
]

pytestmark = pytest.mark.skipif(
    not all(p.exists() for p in (k8s_suite.E2E_TEST, k8s_suite.GINKGO, k8s_suite.AGNHOST, k8s_suite.STAMP)),
    reason="needs e2e.test, ginkgo and agnhost (scripts/build-peers.sh e2e)")


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("pair", ["kubelet/containerd", "pykubelet/pyruntime-cri"])
def test_harness_runs_the_specs_on_a_cluster(tmp_path: Path, pair: str) -> None:
    focus = "|".join(re.escape(spec) for spec in SPECS)
    code = k8s_suite.main([pair, "--focus", focus, "--procs", "2", "--timeout", "15m", "--results", str(tmp_path),
                           "--no-record"])
    out = k8s_suite.pair_dir(tmp_path, pair)
    assert sorted(k8s_suite.selected(tmp_path / "dry-run" / "report.json")) == sorted(SPECS)
    assert (out / "outcomes.json").exists(), (out / "cluster-up.log").read_text()[-3000:]
    run = k8s_suite.load(out)
    states = {name: o.state for name, o in run.outcomes.items()}
    assert sorted(states) == sorted(SPECS)
    assert (out / "junit.xml").exists() and (tmp_path / "summary.md").exists()
    assert any(p.name.endswith("kubelet.log") for p in (out / "logs").iterdir())
    assert k8s_suite.NOT_RUN not in states.values(), (out / "ginkgo.log").read_text()[-5000:]
    if pair == k8s_suite.BASE:
        assert set(states.values()) == {"passed"}, (out / "ginkgo.log").read_text()[-5000:]
        assert code == 0
    assert not cluster.STATE.exists() and not Path(f"/sys/class/net/{cluster.BRIDGE}").exists()
