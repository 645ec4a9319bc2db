"""Kubernetes' own node conformance: e2e.test v1.37.2's [NodeConformance] specs against `make cluster`, for each
pair of kubelet and runtime, side by side (issue 27).

`make conformance-k8s` runs it (not part of `make test`: one pair takes more than an hour). scripts/peers/e2e.sh
builds e2e.test, the ginkgo CLI, agnhost and sample-apiserver from the modules of the control plane. The run:
- asks e2e.test for its images (--list-images) and makes those of them the set's specs run (tests/kit/e2e_images.py);
- lists the selected specs with a ginkgo dry run. The set `node` (the default): the focus [NodeConformance], the
  skip [Serial], [Disruptive], [Flaky] and [Feature:...], on one node; the set `conformance`: every SIG's
  [Conformance] specs, [Serial] ones included, on two nodes (SETS). A spec left out and a spec the suite timeout
  cut look alike in ginkgo's report (both skipped, with no reason), so the dry run's list is what tells them
  apart;
- for each pair (KUBELET/RUNTIME): brings up a `make cluster` of the set's nodes (vagrant/provision/cluster.py, with its
  test registry and CoreDNS), pushes the images to that registry under their own names (its mirror config
  sends every registry there), runs ginkgo with 3 processes and a suite timeout against it, keeps the node's
  logs, takes the cluster down;
- writes the table (per pair: passed, failed, skipped, not run, wall time; each spec whose outcome differs
  between the pairs, with the first line of its failure) into DATE/summary.md and bench/README.md between the
  set's markers.

The JSON and JUnit reports and ginkgo's log are under ~/.cache/pynode/conformance-k8s/DATE/KUBELET+RUNTIME/.
The cluster is the machine's one, so each pair holds the integration lock. `--list` does the first two steps
alone, without a cluster or root. Exits 1 when a spec the stock pair (kubelet/containerd) passes fails on
another pair that ran with it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

from bench import README, record_section
from bench.cri import integration_lock
from pynode_cluster import cluster, components
from pynode_cluster.node import KUBELETS, RUNTIMES
from tests.kit import cluster_registry, e2e_images
from tests.kit.busybox import CACHE
from tests.kit.cluster_admin import provision
from tests.kit.cri_images import CriImage, push_layouts

E2E_TEST = e2e_images.E2E_BIN / "e2e.test"
GINKGO = e2e_images.E2E_BIN / "ginkgo"
AGNHOST = e2e_images.E2E_BIN / "agnhost"
STAMP = e2e_images.E2E_BIN / ".version"  # the release e2e.sh built them from
RESULTS = CACHE / "conformance-k8s"


@dataclass(frozen=True)
class SpecSet:
    """A set of specs: what selects them, the cluster they need, the images they run (e2e_images.BUILDERS'
    repositories) and the markers of its table in bench/README."""
    focus: str
    skip: str
    nodes: int
    images: tuple[str, ...]
    marker: str


SETS = {
    # issue 27's target: one node, as SIG Node runs it
    "node": SpecSet(r"\[NodeConformance\]", r"\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:", 1,
                    e2e_images.NODE_IMAGES, "conformance-k8s"),
    # every SIG's [Conformance] specs, [Serial] ones included (ginkgo runs them alone, after the rest), on two
    # nodes: the specs that spread pods (DaemonSets, services across nodes) skip themselves on one
    "conformance": SpecSet(r"\[Conformance\]", r"\[Disruptive\]|\[Flaky\]|\[Feature:", 2,
                           e2e_images.CONFORMANCE_IMAGES, "conformance-k8s-all"),
}
FOCUS, SKIP = SETS["node"].focus, SETS["node"].skip
PAIRS = tuple(f"{k}/{r}" for k in reversed(KUBELETS) for r in reversed(RUNTIMES))  # the stock pair first
BASE = "kubelet/containerd"
PROCS = 3
TIMEOUT = "2h"
MARGIN = 900  # s past the suite timeout before the run is killed: ginkgo's own clean-up and reports
NODE_LOGS = ("kubelet", "pyruntime-cri", "containerd", "kube-proxy")  # the node's daemons, by name part
# ginkgo's states, as the table counts them; a selected spec skipped with no reason was not run (cut)
FAILED = frozenset({"failed", "panicked", "timedout", "aborted"})
NOT_RUN = "not run"


def log(message: str) -> None:
    print(f"conformance-k8s: {message}", file=sys.stderr, flush=True)


# --- ginkgo ---------------------------------------------------------------------------------------------------

def ginkgo_argv(out: Path, *, focus: str, skip: str, procs: int = PROCS, timeout: str = TIMEOUT,
                kubeconfig: Path | None = None, kubectl: str = "", dry_run: bool = False) -> list[str]:
    """The ginkgo CLI running e2e.test as hack/ginkgo-e2e.sh does, its JSON and JUnit reports into `out`; the dry
    run needs no cluster."""
    argv = [str(GINKGO), "--no-color", "--silence-skips", f"--focus={focus}", f"--skip={skip}", f"--output-dir={out}",
            "--json-report=report.json"]
    if dry_run:
        return [*argv, "--dry-run", str(E2E_TEST)]
    argv += [f"--procs={procs}", f"--timeout={timeout}", "--junit-report=junit.xml", str(E2E_TEST), "--",
             f"--kubeconfig={kubeconfig}", f"--kubectl-path={kubectl}", "--provider=skeleton",
             f"--dns-domain={components.CLUSTER_DOMAIN}", f"--e2e-output-dir={out}"]
    return argv


def spec_name(spec: dict) -> str:
    """A spec's full text, as --focus and --skip match it."""
    return " ".join([*(spec.get("ContainerHierarchyTexts") or []), spec.get("LeafNodeText", "")])


def its(report: Path) -> list[dict]:
    """The It nodes of a ginkgo JSON report (the suite's setup and report nodes are not specs)."""
    return [spec for suite in json.loads(report.read_text()) for spec in suite.get("SpecReports") or []
            if spec.get("LeafNodeType") == "It"]


def selected(dry_run_report: Path) -> list[str]:
    """The specs a dry run would run: it marks them passed, and the rest skipped."""
    return sorted(spec_name(s) for s in its(dry_run_report) if s.get("State") == "passed")


@dataclass
class Outcome:
    state: str  # passed, failed, skipped (by the spec: e2eskipper), or NOT_RUN
    message: str = ""  # the first line of the failure or of the skip's reason
    seconds: float = 0.0


def outcomes(report: Path, chosen: list[str]) -> dict[str, Outcome]:
    """The outcome of each chosen spec in a run's report; a chosen spec the report lacks (a run that ended
    early) was not run."""
    by_name = {spec_name(s): s for s in its(report)} if report.exists() else {}
    out = {}
    for name in chosen:
        spec = by_name.get(name)
        if spec is None:
            out[name] = Outcome(NOT_RUN, "not in the report")
            continue
        state = spec.get("State", "")
        message = next(iter(((spec.get("Failure") or {}).get("Message") or "").strip().splitlines()), "")
        if state in FAILED:
            state = "failed"
        elif state == "interrupted" or (state == "skipped" and not message):
            state, message = NOT_RUN, message or "the suite ended first (its timeout, or an interrupt)"
        out[name] = Outcome(state, message, spec.get("RunTime", 0) / 1e9)
    return out


# --- the table ------------------------------------------------------------------------------------------------

@dataclass
class Settings:
    """What selected and bounded the specs of a run (results/settings.json), for the table's first line."""
    focus: str = FOCUS
    skip: str = SKIP
    procs: int = PROCS
    timeout: str = TIMEOUT
    spec_set: str = "node"


@dataclass
class PairRun:
    pair: str
    wall: float  # s, the ginkgo run
    outcomes: dict[str, Outcome]
    note: str = ""  # why the pair did not run, when it did not

    def count(self, state: str, only: str = "") -> int:
        return sum(1 for name, o in self.outcomes.items() if o.state == state and only in name)


def _cell(text: str, limit: int = 160) -> str:
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def table(runs: list[PairRun], settings: Settings) -> str:
    """The Markdown of bench/README.md's section: a row per pair, then each spec whose outcome differs between
    the pairs (the first failure's first line as its cause)."""
    chosen = len(runs[0].outcomes) if runs else 0
    nodes = SETS[settings.spec_set].nodes
    lines = [f"{chosen} specs selected (focus `{settings.focus}`, skip `{settings.skip}`), {settings.procs} ginkgo "
             f"processes, suite timeout {settings.timeout}, {nodes} node{'s' if nodes > 1 else ''}.", "",
             "| kubelet / runtime | passed | failed | skipped | not run | [Conformance] passed | wall time |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        if run.note:
            lines.append(f"| {run.pair} | - | - | - | - | - | {_cell(run.note)} |")
            continue
        conformance = run.count("passed", "[Conformance]")
        of = sum(1 for name in run.outcomes if "[Conformance]" in name)
        lines.append(f"| {run.pair} | {run.count('passed')} | {run.count('failed')} | {run.count('skipped')} | "
                     f"{run.count(NOT_RUN)} | {conformance} of {of} | {run.wall / 60:.0f} min |")
    ran = [r for r in runs if not r.note]
    differing = sorted(name for name in (ran[0].outcomes if ran else {})
                       if len({r.outcomes[name].state for r in ran}) > 1)
    if differing:
        lines += ["", f"{len(differing)} specs differ between the pairs:", "",
                  "| spec | " + " | ".join(r.pair for r in ran) + " | cause |",
                  "|---|" + "---|" * len(ran) + "---|"]
        for name in differing:
            cause = next((f"{r.pair}: {r.outcomes[name].message}" for r in ran
                          if r.outcomes[name].state in ("failed", NOT_RUN)), "")
            lines.append(f"| {_cell(name, 400)} | " + " | ".join(r.outcomes[name].state for r in ran) +
                         f" | {_cell(cause)} |")
    return "\n".join(lines)


def regressions(runs: list[PairRun]) -> dict[str, list[str]]:
    """pair -> the specs the stock pair passed and it did not (issue 27's target)."""
    base = next((r for r in runs if r.pair == BASE and not r.note), None)
    if base is None:
        return {}
    passed = {name for name, o in base.outcomes.items() if o.state == "passed"}
    return {r.pair: sorted(n for n in passed if r.outcomes[n].state != "passed")
            for r in runs if r is not base and not r.note}


# --- a run ----------------------------------------------------------------------------------------------------

def pair_dir(results: Path, pair: str) -> Path:
    return results / pair.replace("/", "+")


def save(run: PairRun, out: Path) -> None:
    (out / "outcomes.json").write_text(json.dumps(asdict(run), indent=1, sort_keys=True))


def load(out: Path) -> PairRun:
    data = json.loads((out / "outcomes.json").read_text())
    data["outcomes"] = {name: Outcome(**o) for name, o in data["outcomes"].items()}
    return PairRun(**data)


def list_images() -> list[str]:
    return subprocess.run([str(E2E_TEST), "--list-images"], check=True, capture_output=True, text=True,
                          timeout=120).stdout.splitlines()


def dry_run(results: Path, focus: str, skip: str) -> list[str]:
    """The specs this run selects (results/selected.json keeps them)."""
    out = results / "dry-run"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "ginkgo.log", "wb") as f:
        subprocess.run(ginkgo_argv(out, focus=focus, skip=skip, dry_run=True), stdout=f, stderr=subprocess.STDOUT,
                       check=True, timeout=600, cwd=out)
    chosen = selected(out / "report.json")
    (results / "selected.json").write_text(json.dumps(chosen, indent=1))
    return chosen


def run_pair(pair: str, layouts: list[tuple[CriImage, Path]], chosen: list[str], out: Path,
             settings: Settings) -> PairRun:
    """One cluster for `pair`, the suite against it, the cluster removed; the host is left as found."""
    kubelet, runtime = pair.split("/")
    out.mkdir(parents=True, exist_ok=True)
    with integration_lock("conformance-k8s"):
        if cluster.Record.load() is not None:  # someone's cluster, of another pair maybe: left alone
            return PairRun(pair, 0.0, {}, f"a cluster was up already ({cluster.STATE}): `make cluster-down` first")
        try:
            log(f"{pair}: make cluster")
            up = provision("up", "--kubelet", kubelet, "--runtime", runtime, "--nodes",
                           str(SETS[settings.spec_set].nodes), timeout=900)
            (out / "cluster-up.log").write_text(up.stdout + up.stderr)
            record = cluster.Record.load()
            if up.returncode != 0 or record is None:
                return PairRun(pair, 0.0, {}, f"make cluster failed: see {out / 'cluster-up.log'}")
            if not record.registry:
                raise RuntimeError("the cluster has no test registry: vagrant/provision/cluster.py runs outside a "
                                   "checkout?")
            log(f"{pair}: pushing {sum(len(i.tags) for i, _ in layouts)} images to {record.registry}")
            push_layouts(cluster_registry.at(record.registry, cluster.STATE / "registry"), layouts)
            argv = ginkgo_argv(out, focus=settings.focus, skip=settings.skip, procs=settings.procs,
                               timeout=settings.timeout, kubeconfig=cluster.admin_kubeconfig(),
                               kubectl=components.peer("kubectl"))
            log(f"{pair}: ginkgo, {len(chosen)} specs, {settings.procs} processes (log: {out / 'ginkgo.log'})")
            started = time.monotonic()
            with open(out / "ginkgo.log", "wb") as f:
                proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=out, start_new_session=True)
                try:
                    proc.wait(timeout=_seconds(settings.timeout) + MARGIN)
                except subprocess.TimeoutExpired:
                    log(f"{pair}: ginkgo still ran {MARGIN} s past its suite timeout: killed")
                finally:  # after ^C or SIGTERM too: its processes go before the cluster does
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            wall = time.monotonic() - started
            run = PairRun(pair, wall, outcomes(out / "report.json", chosen))
            save(run, out)
            return run
        finally:
            node_logs = out / "logs"
            node_logs.mkdir(exist_ok=True)
            for name, path in cluster.logs().items():
                if any(part in name for part in NODE_LOGS) and Path(path).exists():
                    shutil.copy2(path, node_logs / f"{name}.log")
            log(f"{pair}: make cluster-down")
            down = provision("down", timeout=600)
            (out / "cluster-down.log").write_text(down.stdout + down.stderr)
            if down.returncode != 0:
                log(f"{pair}: make cluster-down left things behind: {out / 'cluster-down.log'}")


def _seconds(duration: str) -> float:
    """A ginkgo --timeout (Go's duration: 90m, 2h, 1h30m) in seconds."""
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1}
    for ch in duration:
        if ch.isdigit() or ch == ".":
            number += ch
        elif ch in units and number:
            total, number = total + float(number) * units[ch], ""
        else:
            raise ValueError(f"timeout {duration!r}: a duration such as 90m or 2h")
    if number or not total:
        raise ValueError(f"timeout {duration!r}: a duration such as 90m or 2h")
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.k8s_suite", description=__doc__.splitlines()[0])
    # no `choices`: argparse would check the default list as one value against them and refuse it
    p.add_argument("pairs", nargs="*", default=list(PAIRS), metavar="KUBELET/RUNTIME",
                   help=f"default: all of {' '.join(PAIRS)}")
    p.add_argument("--procs", type=int, default=PROCS, help="ginkgo processes")
    p.add_argument("--timeout", default=TIMEOUT, help="the suite timeout per pair (ginkgo --timeout)")
    p.add_argument("--set", dest="spec_set", choices=sorted(SETS), default="node",
                   help="node: [NodeConformance] on one node (the default); conformance: every [Conformance] spec")
    p.add_argument("--focus", help="instead of the set's")
    p.add_argument("--skip", help="instead of the set's")
    p.add_argument("--results", type=Path, default=RESULTS / date.today().isoformat())
    p.add_argument("--list", action="store_true", help="only list the selected specs and the images (no cluster)")
    p.add_argument("--table", action="store_true", help="only write the table again from --results' pairs")
    p.add_argument("--no-record", dest="record", action="store_false", help="leave bench/README.md alone")
    args = p.parse_args(argv)
    for pair in args.pairs:
        if pair not in PAIRS:
            p.error(f"pair {pair!r}: not one of {', '.join(PAIRS)}")
    _seconds(args.timeout)
    for needed in (E2E_TEST, GINKGO, AGNHOST, STAMP):
        if not needed.exists():
            p.error(f"{needed} is missing: run `scripts/build-peers.sh e2e` (scripts/peers/e2e.sh)")
    results: Path = args.results
    if args.table:
        runs = [load(pair_dir(results, pair)) for pair in args.pairs
                if (pair_dir(results, pair) / "outcomes.json").exists()]
        settings = Settings(**json.loads((results / "settings.json").read_text()))
        return _report(runs, settings, results, args.record)
    chosen_set = SETS[args.spec_set]
    settings = Settings(args.focus or chosen_set.focus, args.skip or chosen_set.skip, args.procs, args.timeout,
                        args.spec_set)
    results.mkdir(parents=True, exist_ok=True)
    listed = list_images()
    images = e2e_images.wanted(listed, chosen_set.images)
    chosen = dry_run(results, settings.focus, settings.skip)
    if args.list:
        print("\n".join(chosen))
        print(f"{len(chosen)} specs selected; images:")
        print("\n".join(f"  {repo}:{tag}" for repo, tags in sorted(images.items()) for tag in tags))
        return 0
    if os.geteuid() != 0:
        p.error("`make cluster` needs root")
    (results / "settings.json").write_text(json.dumps(asdict(settings), indent=1))
    runs = []
    with tempfile.TemporaryDirectory(prefix="pynode-e2e-images-", dir="/var/tmp") as tmp:
        log(f"building {len(images)} images")
        layouts = e2e_images.layouts(Path(tmp), images, e2e_images.E2E_BIN,
                                     e2e_images.k8s_module(STAMP.read_text().strip()))
        for pair in args.pairs:
            runs.append(run_pair(pair, layouts, chosen, pair_dir(results, pair), settings))
    return _report(runs, settings, results, args.record)


def _report(runs: list[PairRun], settings: Settings, results: Path, record: bool) -> int:
    body = table(runs, settings)
    (results / "summary.md").write_text(body + "\n")
    if record:
        marker = SETS[settings.spec_set].marker
        record_section(f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->", body, README)
    print(body)
    bad = regressions(runs)
    for pair, specs in bad.items():
        for spec in specs:
            print(f"{pair}: passes on {BASE}, not here: {spec}", file=sys.stderr)
    return 1 if any(r.note for r in runs) or any(bad.values()) else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))  # a SIGTERM unwinds: the cluster goes down
    sys.exit(main())
