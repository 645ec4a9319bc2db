"""runc's own bats integration suite, run against runc 1.3.6 and pyruntime side by side.

runc's suite is the conformance test of a runc-compatible runtime: every test that runc passes on this
machine should pass with pyruntime too. `make conformance-runc` runs it; it is not part of `make test`,
because the whole suite takes far longer than that budget.

The suite tree, runc and the suite's Go helpers come from scripts/peers/runc.sh; the two test images the
suite would otherwise download (busybox, debian) are made here from Debian packages and cached. Each .bats
file runs in a pty as runc's CI runs it, under the shared integration lock taken per file (so that other
users of the lock interleave), with a per-test timeout (bats' own) and a per-file one. A runtime under test
may hang or leave things behind, so after every file, finished or killed, this runner removes what the file
left: containers (`delete -f` through the same runtime), every process it started (it is their
subreaper, so even double-forked ones stay its descendants), cgroups and mounts that appeared during the
file, and the file's temporary directory.
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import lzma
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import psutil

from pynode_cluster import hosts
from tests.kit.busybox import CACHE, build_rootfs, tar_directory

# the users and groups of the docker-library busybox image the suite was written against: some tests
# look users up by name or rely on their home directories
from tests.kit.cri_images import BUSYBOX_GROUP, BUSYBOX_PASSWD
from tests.leakcheck import Snapshot, format_leaks, reap_orphans

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.3.6"
SUITE = Path(os.environ.get("PEERS_BIN", CACHE / "bin")) / f"runc-{VERSION}"
INTEGRATION = SUITE / "tests" / "integration"
LOCK = Path("/tmp/pynode-itest.lock")
RUNTIMES = {"runc": SUITE / "runc", "pyruntime": REPO / ".venv" / "bin" / "pyruntime"}
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_TARBALL = CACHE / f"runc-suite-debian-{DEBIAN_SUITE}-minbase.tar.xz"
BUSYBOX_TARBALL = CACHE / "runc-suite-busybox-hardlinked.tar.xz"


PR_SET_CHILD_SUBREAPER = 36
TAP_RESULT = re.compile(r"^(ok|not ok) (\d+) (.*?)(?: # (skip|timeout)\b.*)?$")
TEST_DECL = re.compile(r'^@test "((?:[^"\\]|\\.)*)"', re.M)


def busybox_image() -> Path:
    """The busybox test image: the test kit's static busybox with the docker image's users and directories."""
    if not BUSYBOX_TARBALL.exists():
        with tempfile.TemporaryDirectory(dir=CACHE, prefix=".runc-suite-busybox-") as tmp:
            root = build_rootfs(Path(tmp) / "rootfs")
            # hard links, as in the docker image: the tests chmod applets from the host (`chmod go-x
            # rootfs/bin/echo`), and an absolute symlink would carry that to the host's /bin/busybox
            for applet in root.rglob("*"):
                if applet.is_symlink() and os.readlink(applet) == "/bin/busybox":
                    applet.unlink()
                    os.link(root / "bin/busybox", applet)
            (root / "etc/passwd").write_text(BUSYBOX_PASSWD)
            (root / "etc/group").write_text(BUSYBOX_GROUP)
            for d in ("home", "var/spool/mail", "var/www", "usr/sbin"):
                (root / d).mkdir(parents=True, exist_ok=True)
            part = Path(tmp) / "image.tar.xz"
            part.write_bytes(lzma.compress(tar_directory(root)))
            part.rename(BUSYBOX_TARBALL)
    return BUSYBOX_TARBALL


def debian_image() -> Path:
    """A minimal Debian rootfs made by debootstrap from Debian's mirror (the suite's is a buster-slim tarball)."""
    if not DEBIAN_TARBALL.exists():
        with tempfile.TemporaryDirectory(dir=CACHE, prefix=".runc-suite-debian-") as tmp:
            root = Path(tmp) / "rootfs"
            argv = ["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(root), DEBIAN_MIRROR]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            # slim, as the suite's debian:slim image: every test unpacks the image into its bundle
            for leftover in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                             "usr/share/locale"):
                shutil.rmtree(root / leftover, ignore_errors=True)
            part = Path(tmp) / "image.tar.xz"
            subprocess.run(f"tar --numeric-owner -C {root} -c . | xz -1 -T0 > {part}", shell=True, check=True)
            part.rename(DEBIAN_TARBALL)
    return DEBIAN_TARBALL


def install_images() -> None:
    """Puts the images where the suite's get-images.sh looks first, so that it downloads nothing."""
    arch = subprocess.run(["/usr/local/go/bin/go", "env", "GOARCH"], capture_output=True, text=True,
                          check=True).stdout.strip()
    testdata = INTEGRATION / "testdata"
    for name, image in ((f"busybox-{arch}.tar.xz", busybox_image()), (f"debian-{arch}.tar.xz", debian_image())):
        link = testdata / name
        if not (link.is_symlink() and link.resolve() == image):
            link.unlink(missing_ok=True)
            link.symlink_to(image)


def test_names(bats_file: Path) -> list[str]:
    return [m.group(1).replace('\\"', '"') for m in TEST_DECL.finditer(bats_file.read_text())]


@dataclass
class FileRun:
    results: dict[str, str] = field(default_factory=dict)  # test name -> pass, fail, skip, timeout
    details: dict[str, list[str]] = field(default_factory=dict)  # test name -> bats' diagnostics if it failed
    timed_out: bool = False
    leaks: str = ""


def _run_in_pty(argv: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float,
                on_stall: tuple[float, Callable[[], str]]) -> bool:
    """Runs argv on a new pty as its controlling terminal, its output into log; returns whether it timed out.

    bats prints nothing while a test runs; after on_stall[0] seconds of silence on_stall[1] unsticks the
    test, and what it says goes into the log."""
    master, slave = pty.openpty()

    def controlling_tty() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            start_new_session=True, preexec_fn=controlling_tty)
    os.close(slave)
    # As subreaper we inherit the tests' orphans (exited containers, recvtty): reap them at once, as init
    # would, or `kill -0` in the tests' wait_pids_gone would still see them.
    previous = signal.signal(signal.SIGCHLD, lambda *_: reap_orphans())
    deadline = time.monotonic() + timeout
    stall_after, unstick = on_stall
    progress = time.monotonic()
    timed_out = False
    with open(log, "wb") as out:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([master], [], [], min(left, 5))
            if not ready:
                if proc.poll() is not None and not _readable(master):
                    break
                if time.monotonic() - progress > stall_after:
                    out.write(f"\n# runner: {unstick()}\n".encode())
                    progress = time.monotonic()
                continue
            progress = time.monotonic()
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the slave side has closed it
                break
            if not data:
                break
            out.write(data)
            out.flush()
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the rest of its descendants: _cleanup
        except ProcessLookupError:
            pass
    proc.wait()
    signal.signal(signal.SIGCHLD, previous)
    os.close(master)
    return timed_out


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _thaw(cgroup: Path) -> None:
    # r+, never create: the suite's create_parent also makes plain directories on /sys/fs/cgroup's tmpfs
    # for v1 controllers that are not mounted
    for f, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
        try:
            with open(cgroup / f, "r+") as control:
                control.write(value)
        except OSError:
            pass


def _unstick(runtime: Path, before: Snapshot) -> str:
    """Kills the runtime commands that a test waits on (bats' own per-test timeout cannot interrupt a
    command that hangs), thawing the file's frozen cgroups first so that SIGKILL lands."""
    for cg in Snapshot.take().kinds["cgroups"] - before.kinds["cgroups"]:
        _thaw(Path(cg))
    killed = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = child.cmdline()
            if str(runtime) in cmdline[:3] and "init" not in cmdline[1:4]:  # not a runc init
                child.kill()
                killed.append(" ".join(cmdline)[:300])
        except psutil.Error:
            pass
    return f"test stalled; killed {len(killed)} runtime command(s): " + " | ".join(killed)


def _cleanup(runtime: Path, tmpdir: Path, before: Snapshot) -> str:
    """Removes what one file left behind; returns what could not be removed."""
    for state in tmpdir.glob("**/state"):
        try:
            listing = subprocess.run([str(runtime), "--root", str(state), "list", "-q"], capture_output=True,
                                     text=True, timeout=60, check=False).stdout.split()
        except subprocess.TimeoutExpired:
            listing = []
        for ct in listing:
            try:
                subprocess.run([str(runtime), "--root", str(state), "delete", "-f", ct], capture_output=True,
                               timeout=60, check=False)
            except subprocess.TimeoutExpired:
                pass
    after = Snapshot.take()
    new_cgroups = sorted(after.kinds["cgroups"] - before.kinds["cgroups"], key=len, reverse=True)
    for cg in new_cgroups:
        _thaw(Path(cg))
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(psutil.Process().children(recursive=True), timeout=10)
    reap_orphans()
    for mount_point in sorted(after.kinds["mounts"] - before.kinds["mounts"], key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)
    for cg in new_cgroups:
        hosts.remove_cgroup(Path(cg), kill=True, tries=20)  # started by this file's tests: the cgroup is new
    shutil.rmtree(tmpdir, ignore_errors=True)
    return format_leaks(Snapshot.take().leaked_since(before))


FILE_TIMEOUT_MARK = "# runner: file timed out"
LEAK_MARK = "# runner: left behind: "


def run_file(bats_file: Path, runtime: Path, logdir: Path, file_timeout: float, test_timeout: int) -> FileRun:
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = Snapshot.take()
        tmpdir = Path(tempfile.mkdtemp(prefix=f"runc-suite-{bats_file.stem}-"))
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/go/bin",
               "HOME": os.environ.get("HOME", "/root"), "TERM": "xterm", "LANG": "C.UTF-8",
               "RUNC": str(runtime), "TMPDIR": str(tmpdir), "BATS_TEST_TIMEOUT": str(test_timeout)}
        log = logdir / f"{bats_file.stem}.log"
        try:
            timed_out = _run_in_pty(["bats", "--tap", str(bats_file)], env, INTEGRATION, log, file_timeout,
                                    (test_timeout + 30, lambda: _unstick(runtime, before)))
        finally:
            leaks = _cleanup(runtime, tmpdir, before)
    with open(log, "a") as f:
        if timed_out:
            f.write(f"\n{FILE_TIMEOUT_MARK} after {file_timeout:.0f}s\n")
        if leaks:
            f.write(f"\n{LEAK_MARK}{leaks}\n")
    return parse_log(bats_file, log)


def parse_log(bats_file: Path, log: Path) -> FileRun:
    """A file's results from its TAP log; a test that never reported counts as failed (timeout if killed)."""
    output = log.read_text(errors="replace").replace("\r\n", "\n")
    run = FileRun(timed_out=FILE_TIMEOUT_MARK in output)
    current: list[str] = []
    for line in output.splitlines():
        if line.startswith(LEAK_MARK):
            run.leaks = line[len(LEAK_MARK):]
            continue
        m = TAP_RESULT.match(line.strip())
        if not m:
            if line.startswith("# "):
                current.append(line[2:])
            continue
        verdict, _, name, tag = m.groups()
        run.results[name] = tag or ("pass" if verdict == "ok" else "fail")
        current = run.details.setdefault(name, [])
    for name in test_names(bats_file):
        run.results.setdefault(name, "timeout" if run.timed_out else "fail")
    return run


def write_table(path: Path, order: list[tuple[str, str]], runs: dict[str, dict[str, FileRun]],
                runtimes: list[str]) -> None:
    lines = ["\t".join(["file", "test", *runtimes])]
    for stem, name in order:
        lines.append("\t".join([stem, name, *(runs[r][stem].results.get(name, "-") if stem in runs[r] else "-"
                                              for r in runtimes)]))
    path.write_text("\n".join(lines) + "\n")


def write_differences(path: Path, order: list[tuple[str, str]], runs: dict[str, dict[str, FileRun]]) -> int:
    """The tests that runc passes and pyruntime does not, each with the start of pyruntime's diagnostics."""
    out = []
    for stem, name in order:
        ref, ours = runs["runc"].get(stem), runs["pyruntime"].get(stem)
        if ref and ours and ref.results.get(name) == "pass" and ours.results.get(name) != "pass":
            out.append(f"{stem}: {name} [{ours.results.get(name, '-')}]")
            out.extend(f"    {line}" for line in ours.details.get(name, [])[:12])
    path.write_text("\n".join(out) + "\n")
    return sum(1 for line in out if not line.startswith(" "))


def summary(runs: dict[str, FileRun]) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "skip": 0, "timeout": 0}
    for run in runs.values():
        for verdict in run.results.values():
            counts[verdict] = counts.get(verdict, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="bats files (stems such as `run` or `exec`); default: all")
    parser.add_argument("--runtime", choices=[*RUNTIMES, "both"], default="both")
    parser.add_argument("--file-timeout", type=float, default=10, help="minutes per .bats file and runtime")
    parser.add_argument("--test-timeout", type=int, default=60, help="seconds per test (BATS_TEST_TIMEOUT)")
    parser.add_argument("--from-logs", action="store_true",
                        help="run nothing: rebuild the table and the differences from the logs in --out")
    parser.add_argument("--out", type=Path, default=CACHE / "runc-suite-results" / date.today().isoformat())
    args = parser.parse_args(argv)
    if os.geteuid() != 0 and not args.from_logs:
        parser.error("runc's integration suite runs as root here (its rootless mode is not set up)")
    if not (SUITE / ".complete").exists():
        parser.error(f"{SUITE} is missing: run `make peers` (scripts/peers/runc.sh) first")
    runtimes = list(RUNTIMES) if args.runtime == "both" else [args.runtime]
    stems = args.files or sorted(p.stem for p in INTEGRATION.glob("*.bats"))
    if not args.from_logs:
        install_images()
    # Orphans of the tests (recvtty, detached containers) become our children, so cleanup can find them.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, FileRun]] = {r: {} for r in runtimes}
    order: list[tuple[str, str]] = []
    differing = 0
    for stem in stems:
        bats_file = INTEGRATION / f"{stem}.bats"
        for r in runtimes:
            logdir = args.out / r
            logdir.mkdir(exist_ok=True)
            started = time.monotonic()
            if args.from_logs:
                if not (logdir / f"{stem}.log").exists():
                    continue
                run = runs[r][stem] = parse_log(bats_file, logdir / f"{stem}.log")
            else:
                run = runs[r][stem] = run_file(bats_file, RUNTIMES[r], logdir, args.file_timeout * 60,
                                               args.test_timeout)
            counts = summary({stem: run})
            print(f"{stem:<28} {r:<10} {time.monotonic() - started:6.0f}s  " +
                  " ".join(f"{k}={v}" for k, v in counts.items() if v) +
                  ("  FILE TIMEOUT" if run.timed_out else "") + (f"  LEFT: {run.leaks}" if run.leaks else ""),
                  flush=True)
            for name in run.results:
                if (stem, name) not in order:
                    order.append((stem, name))
        write_table(args.out / "results.tsv", order, runs, runtimes)
        if len(runtimes) == 2:
            differing = write_differences(args.out / "differences.txt", order, runs)
    for r in runtimes:
        counts = summary(runs[r])
        print(f"{r}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    if len(runtimes) == 2:
        print(f"runc passes, pyruntime does not: {differing} tests ({args.out / 'differences.txt'})")
    print(f"per-test table: {args.out / 'results.tsv'}; logs: {args.out}/<runtime>/<file>.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
