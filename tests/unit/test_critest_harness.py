"""The critest harness's pure parts: its reading of ginkgo's report, the mirror config, the image set."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pyruntime.images.registry import endpoints_for
from tests.conformance import critest
from tests.conformance.critest import conflist, scores, skip_pattern
from tests.kit.cri_images import image_set, write_hosts_dir

# Every reference critest v1.37.0 pulls (pkg/framework, pkg/validate) but the digest-pinned one.
CRITEST_REFERENCES = [
    "registry.k8s.io/e2e-test-images/busybox:1.29-2", "registry.k8s.io/e2e-test-images/nginx:1.14-2",
    "registry.k8s.io/e2e-test-images/httpd:2.4.39-4", "registry.k8s.io/e2e-test-images/nonewprivs:1.3",
    "registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9",
    "gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest",
    "gcr.io/k8s-staging-cri-tools/test-image-user-uid:latest",
    "gcr.io/k8s-staging-cri-tools/test-image-user-username:latest",
    "gcr.io/k8s-staging-cri-tools/test-image-user-uid-group:latest",
    "gcr.io/k8s-staging-cri-tools/test-image-user-username-group:latest",
    "gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest",
    "gcr.io/k8s-staging-cri-tools/test-image-latest:latest", "gcr.io/k8s-staging-cri-tools/test-image-tag:test",
    "gcr.io/k8s-staging-cri-tools/test-image-tag:all",
    *(f"gcr.io/k8s-staging-cri-tools/test-image-{n}:latest" for n in (1, 2, 3)),
    *(f"gcr.io/k8s-staging-cri-tools/test-image-tags:{n}" for n in (1, 2, 3)),
]


def test_every_critest_reference_has_an_image(tmp_path: Path) -> None:
    images = image_set(tmp_path)
    pushed = {f"{i.repo}:{t}" for i in images for t in i.tags}
    for ref in CRITEST_REFERENCES:
        # the mirror serves every registry's repositories from one namespace
        assert ref.split("/", 1)[1] in pushed, ref
    by_ref = {f"{i.repo}:{t}": i for i in images for t in i.tags}
    assert by_ref["k8s-staging-cri-tools/test-image-user-username-group:latest"].config["User"] == "www-data:1004"
    # tags critest counts as one image are one build; test-image-1..3 are distinct
    assert by_ref["k8s-staging-cri-tools/test-image-tags:1"] is by_ref["k8s-staging-cri-tools/test-image-tags:3"]
    assert len({id(by_ref[f"k8s-staging-cri-tools/test-image-{n}:latest"]) for n in (1, 2, 3)}) == 3
    # the sandbox image is not one critest removes
    assert by_ref["pause:3.6"] is not by_ref["pause:3.9"]


def test_mirror_config_is_read_by_our_image_store(tmp_path: Path) -> None:
    hosts = write_hosts_dir(tmp_path / "certs.d", "127.0.0.1:5999")
    for domain in ("registry.k8s.io", "gcr.io", "docker.io", "quay.io", "example.org"):
        first = endpoints_for(domain, hosts)[0]
        assert (first.url, first.mirror, "pull" in first.capabilities) == ("http://127.0.0.1:5999", True, True)


def test_scores_from_a_ginkgo_report(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps([{"SpecReports": [
        {"LeafNodeType": "BeforeSuite", "State": "passed"},
        {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[k8s.io] Image Manager"],
         "LeafNodeText": "pulls", "State": "passed"},
        {"LeafNodeType": "It", "ContainerHierarchyTexts": ["[k8s.io] Idempotence", "StopContainer"],
         "LeafNodeText": "not found", "State": "failed", "Failure": {"Message": "rpc error: NotFound\nmore"}},
        {"LeafNodeType": "It", "ContainerHierarchyTexts": None, "LeafNodeText": "digest", "State": "skipped"},
    ]}]))
    assert scores(report) == {
        "[k8s.io] Image Manager pulls": {"state": "passed", "message": []},
        "[k8s.io] Idempotence StopContainer not found": {"state": "failed",
                                                         "message": ["rpc error: NotFound", "more"]},
        "digest": {"state": "skipped", "message": ["not selected (--ginkgo.skip/--ginkgo.focus, or a benchmark)"]},
    }


def test_skip_pattern_is_literal() -> None:
    pattern = re.compile(skip_pattern(["a|b (c)"]))
    assert pattern.search("[k8s.io] Image Manager public image with digest should be pulled and removed [Conformance]")
    assert pattern.search("x a|b (c) y")
    assert not pattern.search("a") and not pattern.search("b c")


def test_conflist_maps_host_ports() -> None:
    plugins = conflist("bridge", "host-local", "portmap", Path("/x"))["plugins"]
    assert [p["type"] for p in plugins] == ["bridge", "portmap"]
    assert plugins[1]["capabilities"] == {"portMappings": True}


def test_endpoints_default_and_refusal(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # `make conformance` passes no endpoint: the default list must parse (argparse's choices refused it);
    # as non-root, main stops right after parsing
    monkeypatch.setattr(critest.os, "geteuid", lambda: 1000)
    for argv, error in (([], "critest needs root"),
                        (["nope"], "endpoint 'nope': not one of containerd, pyruntime-cri")):
        with pytest.raises(SystemExit):
            critest.main(argv)
        assert error in capsys.readouterr().err
