"""pyruntime against runc and crun on one bundle, in one process, interleaved run by run.

Container start-up latency is what a kubelet pays on every pod, so the figure that matters is the ratio to
runc measured under the same load at the same moment; interleaving makes drift (other jobs on the machine,
page cache, CPU frequency) hit all runtimes alike instead of whichever ran last.

Peak RSS comes from separate rounds under /usr/bin/time -f %M (ru_maxrss of the command and of every
descendant it reaped, the container's init included), kept out of the timed rounds so the extra fork and
exec do not blur the millisecond figures. Measuring it from here would not work: exec folds the forking
parent's resident set into the child's ru_maxrss, so every command would report this Python's ~19 MiB.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
PYRUNTIME = REPO / ".venv" / "bin" / "pyruntime"
RUNC = "/usr/sbin/runc"
CRUN = "/usr/bin/crun"
WARMUP = 2
RSS_ROUNDS = 5
TIME = "/usr/bin/time"
_probe_ids = itertools.count()

# crun 1.8 rejects a hybrid layout whose cgroup2 mount has any controller; it sees plain v1 once that
# mount is gone, which a private mount namespace can arrange without touching the host.
HIDE_UNIFIED = 'umount /sys/fs/cgroup/unified && exec "$0" -m bench.runtime --worker'


@dataclass
class Result:
    seconds: float
    rc: int
    stdout: str
    stderr: str


Runner = Callable[[list[str]], Result]


def timed(argv: list[str]) -> Result:
    """Wall time from fork to reap; output goes to files so a container holding stdio cannot stall us."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        proc.wait()
        elapsed = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return Result(elapsed, proc.returncode, out.read().decode(errors="replace"),
                      err.read().decode(errors="replace").strip())


class Worker:
    """A timing loop in another mount namespace, driven one command at a time over a pipe."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", HIDE_UNIFIED, sys.executable],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # Popen(stdin=PIPE, stdout=PIPE)
        self.stdin: IO[str] = self.proc.stdin
        self.stdout: IO[str] = self.proc.stdout

    def __call__(self, argv: list[str]) -> Result:
        self.stdin.write(json.dumps(argv) + "\n")
        self.stdin.flush()
        line = self.stdout.readline()
        if not line:
            raise RuntimeError("namespaced timing worker died")
        return Result(**json.loads(line))

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=10)


def serve() -> None:
    for line in sys.stdin:
        print(json.dumps(timed(json.loads(line)).__dict__), flush=True)


@dataclass
class Runtime:
    name: str
    prefix: list[str]
    runner: Runner = timed
    note: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)
    rss_kb: dict[str, list[int]] = field(default_factory=dict)

    failures: list[str] = field(default_factory=list)

    def __call__(self, *args: str) -> Result:
        return self.runner([*self.prefix, *args])

    def step(self, op: str, mode: str, out: dict, *args: str) -> Result:
        """One command; `mode` is warmup (checked only), timed, or rss (under /usr/bin/time)."""
        if mode == "rss":
            fd, path = tempfile.mkstemp(prefix="rss-")
            os.close(fd)
            try:
                result = self.runner([TIME, "-f", "%M", "-o", path, *self.prefix, *args])
                out[op] = int(Path(path).read_text().split()[-1])
            finally:
                os.unlink(path)
        else:
            result = self(*args)
            out[op] = result.seconds
        if result.rc != 0:
            raise RuntimeError(f"{self.name} {op} exited {result.rc}: {result.stderr}")
        return result

    def commit(self, mode: str, out: dict) -> None:
        """Keeps a round only when all its steps worked, so the per-op series stay aligned."""
        by_mode: dict[str, dict[str, list[Any]]] = {"timed": self.samples, "rss": self.rss_kb}
        series = by_mode.get(mode)
        for op, value in out.items():
            if series is not None and op != "state":
                series.setdefault(op, []).append(value)


def make_bundle(tmp: Path) -> Path:
    from tests.kit.busybox import build_rootfs

    bundle = tmp / "bundle"
    build_rootfs(bundle / "rootfs")
    subprocess.run([RUNC, "spec", "--bundle", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    # what runc >= 1.2 and `pyruntime spec` emit by default; runc 1.1's template predates it
    config["linux"]["namespaces"].append({"type": "cgroup"})
    (bundle / "config.json").write_text(json.dumps(config, indent=2))
    return bundle


def probe(name: str, variants: Sequence[tuple[list[str], Runner, str]], bundle: Path) -> Runtime | str:
    """The first way of invoking a runtime that runs the bundle, or why none did."""
    errors = []
    for prefix, runner, note in variants:
        rt = Runtime(name, prefix, runner, note)
        res = rt("run", "--bundle", str(bundle), f"probe-{next(_probe_ids)}")
        if res.rc == 0:
            return rt
        errors.append(f"{' '.join(prefix[:1] + prefix[3:])}: {res.stderr.splitlines()[-1] if res.stderr else res.rc}")
    return "; ".join(errors)


def wait_stopped(rt: Runtime, cid: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if json.loads(rt.step("state", "warmup", {}, "state", cid).stdout)["status"] == "stopped":
            return
        time.sleep(0.002)
    raise RuntimeError(f"{rt.name}: {cid} did not stop")


def one_round(rt: Runtime, bundle: Path, tag: str, mode: str) -> None:
    """run, then create/start/delete; a failing command is reported and its round left out."""
    out: dict = {}
    cid = f"cycle-{tag}"
    try:
        rt.step("run", mode, out, "run", "--bundle", str(bundle), f"run-{tag}")
        rt.step("create", mode, out, "create", "--bundle", str(bundle), cid)
        rt.step("start", mode, out, "start", cid)
        wait_stopped(rt, cid)
        rt.step("delete", mode, out, "delete", cid)
    except RuntimeError as e:
        rt.failures.append(f"{mode} round {tag}: {e}")
        rt("delete", "--force", cid)
        return
    rt.commit(mode, out)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def report(runtimes: list[Runtime], n: int) -> None:
    runtimes = [rt for rt in runtimes if rt.samples and rt.rss_kb]
    base = next((rt for rt in runtimes if rt.name == "runc"), None)
    print(f"{'op':<8}{'runtime':<11}{'median ms':>10}{'p90 ms':>9}{'x runc':>8}{'peak RSS MiB':>14}")
    for op in ("run", "create", "start", "delete", "cycle"):
        for rt in runtimes:
            times, rss = _series(rt, op)
            med = statistics.median(times)
            ratio = med / statistics.median(_series(base, op)[0]) if base else float("nan")
            print(f"{op:<8}{rt.name:<11}{med * 1e3:>10.1f}{pct(times, 0.9) * 1e3:>9.1f}{ratio:>8.2f}"
                  f"{max(rss) / 1024:>14.1f}")
    print(f"(N={n} rounds per runtime less any failed, {WARMUP} warm-up rounds; cycle = create+start+delete, "
          f"excluding the wait for exit; peak RSS = largest of {RSS_ROUNDS} separate rounds under {TIME} -f %M)")


def _series(rt: Runtime, op: str) -> tuple[list[float], list[int]]:
    if op != "cycle":
        return rt.samples[op], rt.rss_kb[op]
    ops = ("create", "start", "delete")
    return [sum(s) for s in zip(*(rt.samples[o] for o in ops), strict=True)], [max(rt.rss_kb[o]) for o in ops]


def cleanup(runtimes: list[Runtime], roots: list[Path]) -> None:
    for rt in runtimes:
        root = Path(rt.prefix[rt.prefix.index("--root") + 1])
        for cid in os.listdir(root) if root.is_dir() else []:
            rt("delete", "--force", cid)
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="timed runs per runtime and operation")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        serve()
        return 0
    if os.geteuid() != 0:
        print("bench.runtime: needs root, skipped")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="pynode-bench-runtime-"))
    worker = None
    runtimes: list[Runtime] = []
    try:
        bundle = make_bundle(tmp)
        roots = {name: str(tmp / f"root-{name}") for name in ("pyruntime", "runc", "crun")}
        candidates = {
            "pyruntime": [([str(PYRUNTIME), "--root", roots["pyruntime"]], timed, "")],
            "runc": [([RUNC, "--root", roots["runc"]], timed, "")],
        }
        crun = [CRUN, "--root", roots["crun"]]
        disabled = "refused this hybrid cgroup layout; timed with --cgroup-manager=disabled"
        candidates["crun"] = [(crun, timed, ""), ([*crun, "--cgroup-manager=disabled"], timed, disabled)]
        for name, variants in candidates.items():
            found = probe(name, variants, bundle)
            if isinstance(found, str) and name == "crun":
                worker = Worker()
                found = probe(name, [(crun, worker, "")], bundle)
                if not isinstance(found, str):
                    found.note = ("refused this hybrid cgroup layout, also with --cgroup-manager=disabled; timed "
                                  "in a private mount namespace with /sys/fs/cgroup/unified unmounted (plain v1)")
            if isinstance(found, str):
                print(f"{name}: cannot run the bundle, left out: {found}")
                continue
            runtimes.append(found)
        for rt in runtimes:
            if rt.note:
                print(f"{rt.name}: {rt.note}")
        for mode, rounds in (("warmup", WARMUP), ("timed", args.n), ("rss", RSS_ROUNDS)):
            for i in range(rounds):
                for rt in runtimes:
                    one_round(rt, bundle, f"{mode}{i}", mode)
        print(f"/bin/true in a busybox bundle (runc spec, cgroup namespace added), {time.strftime('%Y-%m-%d')}")
        report(runtimes, args.n)
        for rt in runtimes:
            for failure in rt.failures:
                print(f"FAILED {failure}")
        complete = {"pyruntime", "runc"} <= {rt.name for rt in runtimes}
        return 0 if complete and not any(rt.failures for rt in runtimes) else 1
    finally:
        cleanup(runtimes, [tmp])
        if worker:
            worker.close()


if __name__ == "__main__":
    sys.exit(main())
