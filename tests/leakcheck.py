"""Snapshots of the kernel objects that a test may leave behind, and their difference.

Every root test runs between two snapshots; anything present after that was not present before is a
leak. The session takes one more pair around the whole run, so a leak that a per-test check could not
see (a process that outlives its test) still fails the run.

A fixture that cleans up after the code under test never does so in its own teardown, which runs before the
check looks and would hide what that code left: it hands its cleanup to the check (Check.after), which runs it
once it has looked, and names what may legitimately stay (Check.allow: a running kubelet's QoS cgroups).
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from pynode_os import mountinfo

CGROUP_ROOT = Path("/sys/fs/cgroup")
# /run/pycni/helper by its files: each CNI helper's socket and lock (cni_plugins/helper.py) is a leak of its own
STATE_ROOTS = (Path("/run/pyruntime"), Path("/run/pynode"), Path("/var/lib/pynode"), Path("/run/pycni/helper"))


# the mount the first `ip netns add` on a machine makes of /run/netns on itself, which stays for good: the
# machine's, not a test's (the namespaces' own mounts below it are checked)
HOST_MOUNTS = frozenset({"/run/netns"})


def _mounts() -> set[str]:
    return {m.mount_point for m in mountinfo.read()} - HOST_MOUNTS


def _netns() -> set[str]:
    """Named namespaces; one held only by a process shows up as that process."""
    run_netns = Path("/run/netns")
    return {str(p) for p in run_netns.iterdir()} if run_netns.is_dir() else set()


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


# a table's built-in chains, which appear with it the first time anything on the machine uses it (the first
# masquerade rule of a fresh machine makes the nat table): a table is not a leak, its rules and own chains are
BUILTIN_CHAINS = frozenset({"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"})


def _iptables() -> set[str]:
    """Every user chain and rule of every table, IPv4 and IPv6 (counters left out): a CNI plugin's masquerade
    or portmap chain left behind is a leak like a link."""
    found: set[str] = set()
    for tool in ("iptables-save", "ip6tables-save"):
        try:
            out = subprocess.run([tool], capture_output=True, text=True, check=False, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        table = ""
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and (chain := line[1:].split()[0]) not in BUILTIN_CHAINS:
                found.add(f"{tool} {table} chain {chain}")
            elif line.startswith("-A "):
                found.add(f"{tool} {table} {line}")
    return found


# cgroups that the machine's own process supervisor makes for every command it runs, ours or not
FOREIGN_CGROUPS = ("/process_api/",)


def _cgroups() -> set[str]:
    found: set[str] = set()
    if not CGROUP_ROOT.is_dir():
        return found
    for hierarchy in CGROUP_ROOT.iterdir():
        if not hierarchy.is_dir() or hierarchy.is_symlink():
            continue
        for dirpath, _dirs, _files in os.walk(hierarchy):
            if not any(f in dirpath + "/" for f in FOREIGN_CGROUPS):
                found.add(dirpath)
    return found


def _state() -> set[str]:
    found: set[str] = set()
    for root in STATE_ROOTS:
        if root.is_dir():
            found |= {str(p) for p in root.iterdir()}
    return found


def _descendants() -> set[str]:
    """Only a zombie says its state: a daemon that was running before a test and sleeps after it is no leak.
    A process is named by its pid and start time: one that retitled itself meanwhile (pyruntime-cri's
    launcher, once its imports are done) is the same process (`_identity`)."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            zombie = " (zombie)" if child.status() == psutil.STATUS_ZOMBIE else ""
            out.add(f"{child.pid}@{child.create_time():.2f} {' '.join(child.cmdline())[:120]}{zombie}")
        except psutil.Error:
            pass
    return out


def _identity(kind: str, item: str) -> str:
    """What makes two snapshots' items the same one: a process's pid, start time and zombie state."""
    if kind != "processes":
        return item
    return item.split(" ", 1)[0] + (" (zombie)" if item.endswith(" (zombie)") else "")


KINDS: dict[str, Callable[[], set[str]]] = {
    "mounts": _mounts,
    "network namespaces": _netns,
    "links": _links,
    "cgroups": _cgroups,
    "state dirs": _state,
    "processes": _descendants,
    "iptables": _iptables,
}


@dataclass
class Snapshot:
    kinds: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def processes(cls) -> Snapshot:
        """What a test without root can leave behind: a child process (a unit test's stand-in init)."""
        return cls({"processes": _descendants()})

    @classmethod
    def take(cls) -> Snapshot:
        return cls({kind: look() for kind, look in KINDS.items()})

    def leaked_since(self, before: Snapshot) -> dict[str, list[str]]:
        leaks = {}
        for kind, now in self.kinds.items():
            seen = {_identity(kind, item) for item in before.kinds.get(kind, set())}
            new = sorted(item for item in now if _identity(kind, item) not in seen)
            if new:
                leaks[kind] = new
        return leaks


@dataclass
class Check:
    """One leak check's window: the snapshot it started from, what fixtures allow to stay, and the cleanups
    they left to run after it."""
    before: Snapshot
    allowed: dict[str, list[Callable[[str], bool]]] = field(default_factory=dict)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def allow(self, kind: str, allowed: Callable[[str], bool]) -> None:
        """New items of `kind` for which `allowed` is true are no leak of this window."""
        if kind not in KINDS:
            raise ValueError(f"no leak kind {kind!r}: one of {sorted(KINDS)}")
        self.allowed.setdefault(kind, []).append(allowed)

    def after(self, cleanup: Callable[[], None]) -> None:
        """Runs `cleanup` once the check has looked (newest first, as fixtures' teardowns), pass or fail."""
        self.cleanups.append(cleanup)

    def leaks(self, now: Snapshot) -> dict[str, list[str]]:
        leaks = {}
        for kind, new in now.leaked_since(self.before).items():
            kept = [item for item in new if not any(allowed(item) for allowed in self.allowed.get(kind, ()))]
            if kept:
                leaks[kind] = kept
        return leaks

    def clean_up(self) -> None:
        """Every cleanup runs though an earlier one failed; the first failure is raised at the end."""
        failure: Exception | None = None
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception as e:
                failure = failure or e
        if failure is not None:
            raise failure


def reap_orphans() -> None:
    """Reaps every exited child without waiting: a subreaper inherits the orphans a test leaves, and a
    zombie would look like a live leak (and keep a pid namespace's init from finishing its exit)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def format_leaks(leaks: dict[str, list[str]]) -> str:
    return "; ".join(f"{kind}: {', '.join(items[:8])}" + (" ..." if len(items) > 8 else "")
                     for kind, items in leaks.items())
