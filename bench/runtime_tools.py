"""The OCI runtime-tools validation suite against pyruntime, with runc as the yardstick.

Not part of `make test`: the suite is the spec authors' reading of runtime-spec and some of its checks
are known to fail on runc too, so the useful number is ours next to runc's, test by test. Each binary
prints TAP; a binary that dies before its plan counts as one error. The totals go into bench/README.md
between the runtime-tools markers. Build the suite first with scripts/peers/runtime-tools.sh.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import record_section

REPO = Path(__file__).resolve().parent.parent
SUITE = Path(os.environ.get("PEERS_BIN", Path.home() / ".cache/pynode/bin")) / "runtime-tools"
RUNTIMES = {"pyruntime": str(REPO / ".venv" / "bin" / "pyruntime"), "runc": "/usr/sbin/runc"}
# the suite names no --root, so containers it fails to delete land in each runtime's default root
DEFAULT_ROOTS = {"pyruntime": Path("/run/pyruntime"), "runc": Path("/run/runc")}
BEGIN, END = "<!-- runtime-tools:begin -->", "<!-- runtime-tools:end -->"
TAP_LINE = re.compile(r"^(not )?ok\b.*?(#\s*(SKIP|TODO)\b.*)?$", re.IGNORECASE)


@dataclass
class Outcome:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    def cell(self) -> str:
        text = f"{self.passed}/{self.passed + self.failed}"
        if self.skipped:
            text += f" ({self.skipped} skipped)"
        return text + (" error" if self.errors else "")


def parse_tap(out: str) -> Outcome:
    result = Outcome()
    planned = False
    for line in out.splitlines():
        planned |= bool(re.match(r"^1\.\.\d+", line))
        m = TAP_LINE.match(line)
        if not m:
            continue
        if m.group(3):
            result.skipped += 1
        elif m.group(1):
            result.failed += 1
        else:
            result.passed += 1
    if not planned:
        result.errors.append("no TAP plan")
    elif not result.passed + result.failed + result.skipped:
        result.errors.append("no TAP results")  # e.g. the hooks tests report a failure only as YAML
    return result


def run_test(binary: Path, runtime: str, timeout: float) -> Outcome:
    env = dict(os.environ, RUNTIME=runtime)
    try:
        proc = subprocess.run([str(binary)], cwd=SUITE, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        outcome = parse_tap(e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or "")
        outcome.errors = [f"timed out after {timeout:.0f}s"]
    else:
        outcome = parse_tap(proc.stdout)
        if outcome.errors:
            # the Go harness ends with its own "exit status N"; the runtime's complaint comes before it
            said = [ln for ln in proc.stderr.splitlines() if ln.strip() and not re.match(r"^exit status \d+$", ln)]
            outcome.errors.append((said or [f"exit {proc.returncode}"])[-1][:200])
    outcome.failed += bool(outcome.errors)
    return outcome


def bundles() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("ocitest*"))


def remove_bundles(paths: set[Path]) -> None:
    """Tests that drop the mount namespace (linux_ns_itype, linux_ns_nopath) have the runtime mount the
    container's rootfs, /proc, /dev and /sys on the host, and the suite never unmounts them."""
    with open("/proc/self/mountinfo") as f:
        mounted = {line.split()[4] for line in f}
    for path in paths:
        if str(path) in mounted:
            subprocess.run(["umount", "-R", str(path)], check=True)
        shutil.rmtree(path, ignore_errors=True)


def leftovers(name: str) -> set[str]:
    root = DEFAULT_ROOTS[name]
    return set(os.listdir(root)) if root.is_dir() else set()


def record(table: str) -> None:
    record_section(BEGIN, END, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime_tools", description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="*", help="validation test names (default: all)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per test binary")
    parser.add_argument("--no-record", action="store_true", help="print only, leave bench/README.md alone")
    args = parser.parse_args(argv)
    binaries = sorted((SUITE / "validation").iterdir()) if (SUITE / "validation").is_dir() else []
    if args.tests:
        binaries = [b for b in binaries if b.name in args.tests]
    if not binaries or not (SUITE / "runtimetest").exists():
        print(f"runtime-tools suite not built under {SUITE}: run scripts/build-peers.sh", file=sys.stderr)
        return 1
    before = {name: leftovers(name) for name in RUNTIMES}
    known_bundles = bundles()
    rows, totals = [], {name: Outcome() for name in RUNTIMES}
    for binary in binaries:
        row = [binary.name]
        for name, path in RUNTIMES.items():
            start = time.monotonic()
            outcome = run_test(binary, path, args.timeout)
            remove_bundles(bundles() - known_bundles)
            total = totals[name]
            total.passed += outcome.passed
            total.failed += outcome.failed
            total.skipped += outcome.skipped
            if outcome.errors:
                total.errors.append(f"{binary.name}: {'; '.join(outcome.errors)}")
            row.append(outcome.cell())
            print(f"{binary.name:<36}{name:<10}{outcome.cell():<24}{time.monotonic() - start:6.1f}s"
                  f"  {'; '.join(outcome.errors)}", flush=True)
        rows.append(row)
    for name, path in RUNTIMES.items():
        for cid in sorted(leftovers(name) - before[name]):
            print(f"{name}: removing container {cid} that the suite left behind")
            subprocess.run([path, "delete", "--force", cid], capture_output=True)
    header = ["test", *RUNTIMES]
    lines = [f"runtime-tools validation, {time.strftime('%Y-%m-%d')}: passed/run per test (a binary that dies "
             "before its TAP plan, or reports no result, counts one failure and is marked error)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("| **total** | " + " | ".join(f"**{t.passed}/{t.passed + t.failed}** ({t.skipped} skipped, "
                                              f"{len(t.errors)} errors)" for t in totals.values()) + " |")
    table = "\n".join(lines)
    print(table)
    if not args.no_record:
        record(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
