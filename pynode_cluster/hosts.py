"""Hosts made of network namespaces on a bridge of our own, and the daemons that run in them, tracked by pid.

Why namespaces: a kubelet refuses a loopback node IP and kube-apiserver a loopback advertise address, and the
cluster may send traffic only to addresses it made; so the control plane and each node are a network
namespace with an address on the bridge (only the network namespace: mounts, cgroups and /run stay the
host's). The host reaches them over the bridge; nothing gets a default route, so nothing leaves the machine
through them.

Daemons outlive the command that starts them, so each one's pid and start time go into a file under the
state dir: `down` ends exactly those (a pid whose start time differs is someone else's now) and never a
process by name. The start time is the kernel's, in ticks since boot: the wall-clock one psutil gives by default
adds the boot time, which moves by a second when the clock is adjusted, and a daemon would then look gone.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from pynode_os.proc import process_start_time

NETNS_DIR = Path("/run/netns")


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def sysctl(netns: str, key: str, value: str) -> None:
    """A per-namespace knob (net.*) inside `netns`."""
    subprocess.run(["ip", "netns", "exec", netns, "sysctl", "-qw", f"{key}={value}"], check=True,
                   capture_output=True)


def make_bridge(name: str, address: str) -> None:
    ip("link", "add", name, "type", "bridge")
    ip("addr", "add", address, "dev", name)
    ip("link", "set", name, "up")


def make_host(netns: str, bridge: str, address: str) -> None:
    """Namespace `netns` with eth0 at `address` (CIDR) on `bridge`; its host-side veth is named `netns`."""
    ip("netns", "add", netns)
    ip("link", "add", netns, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", netns, "master", bridge, "up")
    ip("addr", "add", address, "dev", "eth0", netns=netns)
    ip("link", "set", "eth0", "up", netns=netns)
    ip("link", "set", "lo", "up", netns=netns)


def remove_host(netns: str) -> None:
    """The veth pair goes explicitly: a namespace whose name is gone lives on while a process or a copied
    mount holds it, and its links with it."""
    ip("link", "del", netns, check=False)
    if (NETNS_DIR / netns).exists():
        ip("netns", "del", netns, check=False)


@dataclass
class Daemons:
    """The pid files of the daemons under `dir` (NAME.json: pid, start time, argv)."""
    dir: Path

    def start(self, name: str, argv: list[str], log: Path, netns: str | None = None,
              env: dict[str, str] | None = None) -> int:
        """`argv` in `netns` (nsenter execs it, so the pid is the daemon's), detached, output to `log`."""
        self.dir.mkdir(parents=True, exist_ok=True)
        full = (["nsenter", f"--net={NETNS_DIR / netns}", "--"] if netns else []) + argv
        with open(log, "ab") as out:
            proc = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, **(env or {})}, cwd=log.parent)
        started = process_start_time(proc.pid)
        (self.dir / f"{name}.json").write_text(json.dumps({"pid": proc.pid, "start": started, "argv": argv,
                                                           "log": str(log), "netns": netns, "env": env}))
        return proc.pid

    def restart(self, name: str) -> int:
        """`name` started again as it was the first time, after it died (a crash, a kill -9); one that still
        runs is left alone (its pid is returned)."""
        proc = self.process(name)
        if proc is not None:
            return proc.pid
        record = json.loads((self.dir / f"{name}.json").read_text())
        return self.start(name, record["argv"], Path(record["log"]), record.get("netns"), record.get("env"))

    def process(self, name: str) -> psutil.Process | None:
        """The daemon `name` if it still runs (same pid and start time)."""
        try:
            record = json.loads((self.dir / f"{name}.json").read_text())
            proc = psutil.Process(record["pid"])
            if process_start_time(proc.pid) == record["start"] and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (OSError, ValueError, psutil.Error):
            pass
        return None

    def exited(self, *names: str) -> str | None:
        """The first of `names` that no longer runs, with the end of its log; None while all run (a wait's
        `failed`)."""
        for name in names:
            if self.process(name) is None:
                return f"{name} exited; its log ends:\n{self.log(name)}"
        return None

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json")) if self.dir.is_dir() else []

    def log(self, name: str, chars: int = 3000) -> str:
        try:
            record = json.loads((self.dir / f"{name}.json").read_text())
            return Path(record["log"]).read_text(errors="replace")[-chars:]
        except (OSError, ValueError, KeyError):
            return ""

    def stop(self, name: str, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL after `grace` (kube-apiserver may take more than 15 s without etcd)."""
        proc = self.process(name)
        if proc is not None:
            terminate(proc, grace)
        (self.dir / f"{name}.json").unlink(missing_ok=True)


def terminate(proc: psutil.Process, grace: float) -> None:
    """SIGTERM to a process we started, SIGKILL if it has not ended after `grace`, and reaped if it is ours."""
    with contextlib.suppress(psutil.Error):
        proc.send_signal(signal.SIGTERM)
        if not ended(proc, grace):
            proc.kill()
            ended(proc, 10)
    _reap(proc.pid)


def ended(proc: psutil.Process, timeout: float) -> bool:
    """Whether `proc` ended within `timeout`. A daemon's parent is whoever adopted it (init, or a subreaper
    such as the test session), so it may stay a zombie until that one reaps it: ended all the same."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(proc.pid)
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _reap(pid: int) -> None:
    """Reaps `pid` if it is our child (the test harness is a subreaper, so orphans come back to it)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_for(what: str, check, timeout: float = 60, interval: float = 0.25, failed=None):
    """`check()`'s first truthy answer, or TimeoutError naming `what` and the last answer; `failed()` (a
    message or None) ends the wait early with a RuntimeError."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        if failed is not None and (why := failed()):
            raise RuntimeError(f"waiting for {what}: {why}")
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


def remove_cgroup(path: Path, kill: bool = False, tries: int = 50) -> bool:
    """Removes one cgroup directory, retrying while the kernel still counts an exiting task in it. With
    `kill`, what is still in it is SIGKILLed first: only for a cgroup the caller made, whose processes are
    its own. False if it could not be removed."""
    for _ in range(tries):
        if kill:
            with contextlib.suppress(OSError, ValueError):
                for pid in (path / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)
    return False


def remove_cgroup_tree(top: Path, kill: bool = False) -> list[str]:
    """`top` and every cgroup below it, deepest first (a cgroup with children cannot go); the ones left."""
    if not top.is_dir():
        return []
    dirs = sorted((Path(d) for d, _subdirs, _files in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
    return [f"cgroup {d} could not be removed" for d in dirs if not remove_cgroup(d, kill)]
