"""The pure parts of `make conformance-k8s` (tests/conformance/k8s_suite.py): the ginkgo command, the reading of its
report against the dry run's selection, the table, and the e2e images chosen from `e2e.test --list-images`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conformance import k8s_suite
from tests.conformance.k8s_suite import NOT_RUN, Outcome, PairRun, Settings
from tests.kit import cluster_registry, e2e_images

NODE = "[sig-node] Pods"


def _spec(leaf: str, state: str, message: str = "", kind: str = "It", seconds: float = 0.0) -> dict:
    spec: dict = {"LeafNodeType": kind, "ContainerHierarchyTexts": [NODE], "LeafNodeText": leaf, "State": state,
                  "RunTime": int(seconds * 1e9)}
    if message:
        spec["Failure"] = {"Message": message}
    return spec


def _report(path: Path, specs: list[dict]) -> Path:
    path.write_text(json.dumps([{"SuiteDescription": "Kubernetes e2e suite", "SpecReports": specs}]))
    return path


def test_ginkgo_runs_e2e_test_with_the_selection_and_the_cluster(tmp_path: Path) -> None:
    argv = k8s_suite.ginkgo_argv(tmp_path, focus=k8s_suite.FOCUS, skip=k8s_suite.SKIP, procs=3, timeout="2h",
                                 kubeconfig=Path("/admin.kubeconfig"), kubectl="/bin/kubectl")
    assert argv[0] == str(k8s_suite.GINKGO)
    ginkgo, e2e = argv[:argv.index(str(k8s_suite.E2E_TEST))], argv[argv.index(str(k8s_suite.E2E_TEST)) + 1:]
    assert {r"--focus=\[NodeConformance\]", r"--skip=\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:", "--procs=3",
            "--timeout=2h", f"--output-dir={tmp_path}", "--json-report=report.json",
            "--junit-report=junit.xml"} <= set(ginkgo)
    # e2e.test's own flags after the `--`
    assert e2e[0] == "--" and {"--kubeconfig=/admin.kubeconfig", "--kubectl-path=/bin/kubectl",
                               "--dns-domain=cluster.local"} <= set(e2e)
    dry = k8s_suite.ginkgo_argv(tmp_path, focus="x", skip="y", dry_run=True)
    assert "--dry-run" in dry and dry[-1] == str(k8s_suite.E2E_TEST)
    assert not any(a.startswith(("--kubeconfig", "--procs", "--timeout")) for a in dry)


def test_the_dry_run_selects_the_specs_it_marks_passed(tmp_path: Path) -> None:
    report = _report(tmp_path / "report.json", [
        _spec("", "passed", kind="SynchronizedBeforeSuite"),
        _spec("b runs [NodeConformance]", "passed"), _spec("a runs [NodeConformance]", "passed"),
        _spec("left out [Serial]", "skipped")])
    assert k8s_suite.selected(report) == [f"{NODE} a runs [NodeConformance]", f"{NODE} b runs [NodeConformance]"]


def test_outcomes_tell_a_cut_spec_from_a_skipped_one(tmp_path: Path) -> None:
    names = ["passes", "fails", "panics", "times out", "skips itself", "was cut", "was interrupted", "is missing"]
    report = _report(tmp_path / "report.json", [
        _spec("passes", "passed", seconds=2.5),
        _spec("fails", "failed", "expected 1\nto equal 2"),
        _spec("panics", "panicked", "runtime error: invalid memory address"),
        _spec("times out", "timedout", "A spec timeout occurred"),
        _spec("skips itself", "skipped", "Only supported for providers [gce]"),
        _spec("was cut", "skipped"),
        _spec("was interrupted", "interrupted", "Interrupted by Timeout"),
        _spec("not chosen", "skipped")])
    got = k8s_suite.outcomes(report, [f"{NODE} {n}" for n in names])
    assert {n.removeprefix(f"{NODE} "): o.state for n, o in got.items()} == {
        "passes": "passed", "fails": "failed", "panics": "failed", "times out": "failed",
        "skips itself": "skipped", "was cut": NOT_RUN, "was interrupted": NOT_RUN, "is missing": NOT_RUN}
    assert got[f"{NODE} fails"].message == "expected 1"
    assert got[f"{NODE} passes"].seconds == 2.5
    assert got[f"{NODE} was interrupted"].message == "Interrupted by Timeout"
    # a run whose report was never written: every spec not run
    assert {o.state for o in k8s_suite.outcomes(tmp_path / "none.json", ["x"]).values()} == {NOT_RUN}


def _run(pair: str, states: dict[str, str], wall: float = 600) -> PairRun:
    return PairRun(pair, wall, {n: Outcome(s, f"why {n} {s}" if s != "passed" else "") for n, s in states.items()})


def test_table_counts_each_pair_and_lists_the_specs_that_differ() -> None:
    stock = _run("kubelet/containerd", {"a [Conformance]": "passed", "b": "passed", "c|d": "passed", "e": "skipped"})
    ours = _run("pykubelet/pyruntime-cri", {"a [Conformance]": "failed", "b": "passed", "c|d": NOT_RUN,
                                            "e": "skipped"}, wall=5400)
    text = k8s_suite.table([stock, ours, PairRun("pykubelet/containerd", 0, {}, "make cluster failed")], Settings())
    lines = text.splitlines()
    assert lines[0].startswith(r"4 specs selected (focus `\[NodeConformance\]`")
    assert "| kubelet/containerd | 3 | 0 | 1 | 0 | 1 of 1 | 10 min |" in lines
    assert "| pykubelet/pyruntime-cri | 1 | 1 | 1 | 1 | 0 of 1 | 90 min |" in lines
    assert "| pykubelet/containerd | - | - | - | - | - | make cluster failed |" in lines
    assert "2 specs differ between the pairs:" in lines
    assert "| spec | kubelet/containerd | pykubelet/pyruntime-cri | cause |" in lines
    assert ("| a [Conformance] | passed | failed | pykubelet/pyruntime-cri: why a [Conformance] failed |" in lines)
    assert r"| c\|d | passed | not run | pykubelet/pyruntime-cri: why c\|d not run |" in lines
    assert not any(line.startswith("| b |") for line in lines)
    assert lines[0].endswith("suite timeout 2h, 1 node.")


def test_the_conformance_set_takes_every_sigs_conformance_specs_on_two_nodes(tmp_path: Path, monkeypatch) -> None:
    """`make conformance-k8s SET=conformance`: [Serial] ones too (ginkgo runs them alone); its own table."""
    chosen = k8s_suite.SETS["conformance"]
    assert (chosen.focus, chosen.nodes) == (r"\[Conformance\]", 2) and "Serial" not in chosen.skip
    readme = tmp_path / "README.md"
    readme.write_text("<!-- conformance-k8s:begin -->\nnode's\n<!-- conformance-k8s:end -->\n")
    monkeypatch.setattr(k8s_suite, "README", readme)
    run = _run("pykubelet/pyruntime-cri", {"a [Conformance]": "passed"})
    assert k8s_suite._report([run], Settings(chosen.focus, chosen.skip, spec_set="conformance"), tmp_path, True) == 0
    text = readme.read_text()
    assert "node's" in text and "<!-- conformance-k8s-all:begin -->\n1 specs selected" in text
    assert ", 2 nodes.\n" in text


def test_regressions_are_what_the_stock_pair_passes_and_another_does_not() -> None:
    stock = _run("kubelet/containerd", {"a": "passed", "b": "failed", "c": "passed"})
    ours = _run("pykubelet/pyruntime-cri", {"a": "failed", "b": "passed", "c": "passed"})
    assert k8s_suite.regressions([stock, ours]) == {"pykubelet/pyruntime-cri": ["a"]}
    assert k8s_suite.regressions([ours]) == {}


def test_a_pair_run_survives_its_file(tmp_path: Path) -> None:
    run = _run("kubelet/containerd", {"a": "passed", "b": "failed"}, wall=12.5)
    k8s_suite.save(run, tmp_path)
    assert k8s_suite.load(tmp_path) == run


@pytest.mark.parametrize(("duration", "seconds"), [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45)])
def test_suite_timeout_in_seconds(duration: str, seconds: float) -> None:
    assert k8s_suite._seconds(duration) == seconds


@pytest.mark.parametrize("duration", ["", "2", "h", "2d", "-1h"])
def test_suite_timeout_refuses_what_ginkgo_would(duration: str) -> None:
    with pytest.raises(ValueError, match="a duration such as"):
        k8s_suite._seconds(duration)


# Part of `e2e.test --list-images` of v1.37.2.
LISTED = """gcr.io/k8s-authenticated-test/agnhost:2.6
invalid.registry.k8s.io/invalid/alpine:3.1
registry.k8s.io/e2e-test-images/agnhost:2.55
registry.k8s.io/e2e-test-images/agnhost:2.66.1
registry.k8s.io/e2e-test-images/busybox:1.37.0-2
registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1
registry.k8s.io/e2e-test-images/kitten:1.8
registry.k8s.io/e2e-test-images/nautilus:1.8
registry.k8s.io/e2e-test-images/nginx:1.27.0-2
registry.k8s.io/e2e-test-images/nginx:1.28.0-2
registry.k8s.io/e2e-test-images/nonewprivs:1.4
registry.k8s.io/e2e-test-images/nonroot:1.5
registry.k8s.io/e2e-test-images/perl:5.26
registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2
registry.k8s.io/etcd:3.7.0-0
registry.k8s.io/pause:3.10.2
registry.k8s.io/sig-storage/csi-attacher@sha256:0123
""".splitlines()
NODE_WANTED = {
    "registry.k8s.io/e2e-test-images/agnhost": ["2.55", "2.66.1"],
    "registry.k8s.io/e2e-test-images/busybox": ["1.37.0-2"],
    "registry.k8s.io/e2e-test-images/glibc-dns-testing": ["2.1.1"],
    "registry.k8s.io/e2e-test-images/nginx": ["1.27.0-2", "1.28.0-2"],
    "registry.k8s.io/e2e-test-images/nonewprivs": ["1.4"],
    "registry.k8s.io/e2e-test-images/nonroot": ["1.5"],
    "registry.k8s.io/pause": ["3.10.2"]}


def test_the_images_are_those_e2e_test_lists_for_the_set_s_specs() -> None:
    assert e2e_images.wanted(LISTED, k8s_suite.SETS["node"].images) == NODE_WANTED
    assert e2e_images.wanted(LISTED, k8s_suite.SETS["conformance"].images) == {
        **NODE_WANTED,
        "registry.k8s.io/e2e-test-images/kitten": ["1.8"],
        "registry.k8s.io/e2e-test-images/nautilus": ["1.8"],
        "registry.k8s.io/e2e-test-images/sample-apiserver": ["1.29.2"],
        "registry.k8s.io/etcd": ["3.7.0-0"]}
    with pytest.raises(ValueError, match=r"names none of registry\.k8s\.io/e2e-test-images/nonroot"):
        e2e_images.wanted([line for line in LISTED if "nonroot" not in line], k8s_suite.SETS["node"].images)


def test_an_image_only_another_set_runs_is_not_needed() -> None:
    listed = [line for line in LISTED if "sample-apiserver" not in line and "etcd" not in line]
    assert e2e_images.wanted(listed, k8s_suite.SETS["node"].images) == NODE_WANTED
    with pytest.raises(ValueError, match=r"names none of .*sample-apiserver"):
        e2e_images.wanted(listed, k8s_suite.SETS["conformance"].images)
    with pytest.raises(ValueError, match=r"no builder makes registry\.k8s\.io/e2e-test-images/perl"):
        e2e_images.wanted(LISTED, ["registry.k8s.io/e2e-test-images/perl"])


def _module(root: Path) -> Path:
    """The files of the k8s.io/kubernetes module the images take."""
    images = root / "test" / "images"
    porter = images / "agnhost" / "porter"
    porter.mkdir(parents=True)
    (porter / "localhost.crt").write_text("CERT")
    (porter / "localhost.key").write_text("KEY")
    (images / "agnhost" / "BASEIMAGE").write_text("linux/amd64=alpine:3.21\nlinux/arm64=arm64v8/alpine:3.21\n")
    (images / "busybox").mkdir()
    (images / "busybox" / "BASEIMAGE").write_text("linux/amd64=busybox:1.37.0\nlinux/arm64=arm64v8/busybox:1.37.0\n")
    for name in ("kitten", "nautilus"):
        (images / name / "html").mkdir(parents=True)
        (images / name / "html" / f"{name}.jpg").write_bytes(b"\xff\xd8" + name.encode())
        (images / name / "html" / "data.json").write_text(f'{{\n  "image": "{name}.jpg"\n}}\n')
    return root


def _e2e_bin(root: Path) -> Path:
    root.mkdir()
    (root / "agnhost").write_bytes(b"\x7fELF agnhost")
    (root / "sample-apiserver").write_bytes(b"\x7fELF sample-apiserver")
    return root


def _busybox(root: Path) -> Path:
    """scripts/peers/busybox.sh's output for the BASEIMAGE of _module: a stand-in that lists two applets."""
    (root / "1.37.0").mkdir(parents=True)
    (root / "1.37.0" / "busybox").write_text("#!/bin/sh\nprintf 'sh\\nsysctl\\nbusybox\\n'\n")
    (root / "1.37.0" / "busybox").chmod(0o755)
    return root


def test_image_set_lays_each_image_out_as_its_dockerfile(tmp_path: Path) -> None:
    etcd = tmp_path / "etcd"
    shutil.copy("/bin/true", etcd)  # a dynamically linked program, as the peers' etcd is
    wanted = e2e_images.wanted(LISTED, k8s_suite.SETS["conformance"].images)
    images = {i.repo: i for i in e2e_images.image_set(tmp_path / "work", wanted, _e2e_bin(tmp_path / "bin"),
                                                      _module(tmp_path / "module"), etcd,
                                                      _busybox(tmp_path / "busybox"))}
    # under their repository paths, which the mirror serves for every registry
    assert sorted(images) == ["e2e-test-images/agnhost", "e2e-test-images/busybox", "e2e-test-images/glibc-dns-testing",
                              "e2e-test-images/kitten", "e2e-test-images/nautilus", "e2e-test-images/nginx",
                              "e2e-test-images/nonewprivs", "e2e-test-images/nonroot",
                              "e2e-test-images/sample-apiserver", "etcd", "pause"]
    agn = images["e2e-test-images/agnhost"]
    assert agn.tags == ["2.55", "2.66.1"] and agn.base
    entries = {e.name: e for e in agn.entries}
    assert entries["agnhost"].data == b"\x7fELF agnhost" and entries["agnhost"].mode == 0o755
    assert entries["agnhost-2"].target == "agnhost" and entries["localhost.key"].data == b"KEY"
    assert "group-defined-in-image:x:50000:user-defined-in-image" in entries["etc/group"].data.decode()
    assert "user-defined-in-image:x:1000:1000:" in entries["etc/passwd"].data.decode()
    # the Alpine release of its BASEIMAGE, which the ImageVolume spec reads in kitten
    os_release = entries["etc/os-release"].data.decode()
    assert 'NAME="Alpine Linux"' in os_release and "VERSION_ID=3.21\n" in os_release
    assert (agn.config["Entrypoint"], agn.config["Cmd"]) == (["/agnhost"], ["pause"])
    # what the specs run of its Alpine packages: bash, curl, netcat-openbsd's nc (ahead of busybox's), dig and
    # getent, with the libraries the base lacks, each once
    assert {"bin/bash", "usr/bin/curl", "usr/bin/nc", "usr/bin/dig", "usr/bin/getent"} <= set(entries)
    assert entries["usr/bin/nc"].data == Path("/bin/nc.openbsd").read_bytes()
    assert any(name.startswith(("lib/", "usr/lib/")) and "libcurl" in name for name in entries)
    assert len([e.name for e in agn.entries]) == len(entries)
    # kitten and nautilus: agnhost's image, their picture and data.json at /, CMD test-webserver
    for name in ("kitten", "nautilus"):
        image = images[f"e2e-test-images/{name}"]
        files = {e.name: e for e in image.entries}
        assert image.tags == ["1.8"] and image.base
        assert files["agnhost"].data == b"\x7fELF agnhost" and files["etc/os-release"].data.decode() == os_release
        assert files[f"{name}.jpg"].data == b"\xff\xd8" + name.encode()
        assert f'"image": "{name}.jpg"' in files["data.json"].data.decode()
        assert (image.config["Entrypoint"], image.config["Cmd"]) == (["/agnhost"], ["test-webserver"])
        assert "80/tcp" in image.config["ExposedPorts"]
    sample = images["e2e-test-images/sample-apiserver"]
    assert sample.base and sample.config == {"Entrypoint": ["/sample-apiserver"]}
    assert [(e.name, e.data, e.mode) for e in sample.entries] == [
        ("sample-apiserver", b"\x7fELF sample-apiserver", 0o755)]
    etcd_image = images["etcd"]
    files = {e.name: e for e in etcd_image.entries}
    assert etcd_image.tags == ["3.7.0-0"] and etcd_image.base
    assert files["usr/local/bin/etcd"].data == etcd.read_bytes() and files["usr/local/bin/etcd"].mode == 0o755
    assert files["usr/local/bin"].kind == "dir"
    assert sorted(etcd_image.config["ExposedPorts"]) == ["2379/tcp", "2380/tcp", "4001/tcp", "7001/tcp"]
    # busybox: busybox:1.37.0 as its BASEIMAGE says, upstream's build with each applet a hard link in /bin, no base
    busybox = images["e2e-test-images/busybox"]
    files = {e.name: e for e in busybox.entries}
    assert files["bin/busybox"].data == (tmp_path / "busybox" / "1.37.0" / "busybox").read_bytes()
    assert [(e.name, e.target) for e in busybox.entries if e.kind == "hardlink"] == [
        ("bin/sh", "bin/busybox"), ("bin/sysctl", "bin/busybox")]
    assert (files["tmp"].mode, files["root"].mode) == (0o1777, 0o700)
    assert "root:x:0:0:" in files["etc/passwd"].data.decode()
    assert not busybox.base and busybox.config == {"Cmd": ["sh"]}
    assert images["e2e-test-images/nonroot"].config == {"User": "1234"}
    # glibc-dns-testing: the glibc base with the DNS queriers' dig and getent, and dig's libraries
    dns = images["e2e-test-images/glibc-dns-testing"]
    files = {e.name: e for e in dns.entries}
    assert dns.base and files["usr/bin/dig"].data == Path("/usr/bin/dig").read_bytes() and "usr/bin/getent" in files
    assert any("libdns" in name for name in files)
    nnp = {e.name: e for e in images["e2e-test-images/nonewprivs"].entries}["usr/local/bin/nnp"]
    assert nnp.mode == 0o4755 and nnp.data.startswith(b"\x7fELF")
    pause = images["pause"]
    assert not pause.base and pause.config["Entrypoint"] == ["/pause"] and pause.config["User"] == "65535:65535"


def test_a_missing_binary_names_the_command_that_builds_it(tmp_path: Path) -> None:
    e2e_bin = _e2e_bin(tmp_path / "bin")
    (e2e_bin / "sample-apiserver").unlink()
    wanted = {"registry.k8s.io/e2e-test-images/sample-apiserver": ["1.29.2"]}
    with pytest.raises(FileNotFoundError, match=r"sample-apiserver is missing: run `scripts/build-peers\.sh e2e`"):
        e2e_images.image_set(tmp_path / "work", wanted, e2e_bin, tmp_path / "module", tmp_path / "etcd")
    with pytest.raises(FileNotFoundError, match=r"etcd is missing: run `scripts/build-peers\.sh kubernetes`"):
        e2e_images.image_set(tmp_path / "work", {"registry.k8s.io/etcd": ["3.7.0-0"]}, e2e_bin, tmp_path / "module",
                             tmp_path / "etcd")
    with pytest.raises(FileNotFoundError, match=r"1\.37\.0/busybox is missing: run `scripts/build-peers\.sh busybox`"):
        e2e_images.image_set(tmp_path / "work", {"registry.k8s.io/e2e-test-images/busybox": ["1.37.0-2"]}, e2e_bin,
                             _module(tmp_path / "module"), tmp_path / "etcd", tmp_path / "busybox")


def test_the_cluster_registry_is_pushed_to_where_it_serves(tmp_path: Path) -> None:
    assert cluster_registry.at("10.203.0.10:5000", tmp_path).host == "10.203.0.10:5000"
