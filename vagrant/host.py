#!/usr/bin/env python3
"""The lab's host side around libvirt: what `make lab-setup` readies and `make lab-down` undoes.

`setup` makes libvirt usable on a machine whose PID 1 is not systemd (this workplace's): the system user that
Debian's libvirt-daemon-system would add (its qemu driver refuses to start without it; that package itself
would replace the init), a qemu.conf that runs the guests as root (the box's kernel lives under root's home),
libvirtd and virtlogd started by hand when they do not run, and the lab's storage pool. It records which
daemons and which pool it started in RUN/started.json, so `teardown` stops those and never one it found.

`check` is the precondition check run before anything is made: the tools, libvirt answering, the memory.
`leftovers` lists what of the lab libvirt still holds (domains, networks, pool, volumes, qemu processes).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pynode_os.proc import process_start_time  # pid + start: a daemon we started, not a pid reused

PREFIX = "pynode-lab-"  # the Vagrantfile's domain and network prefix
POOL = "pynode-lab"
LAB_VAR = Path("/var/lib/pynode-lab")  # pool/ (the VMs' disks) and console/ (their serial consoles)
POOL_DIR = LAB_VAR / "pool"
RUN = Path("/run/pynode-lab")
URI = "qemu:///system"
QEMU_CONF = Path("/etc/libvirt/qemu.conf")
DAEMONS = {  # name: (the socket that answers when it runs, argv)
    "virtlogd": (Path("/run/libvirt/virtlogd-sock"), ["virtlogd", "-d", "-p", str(RUN / "virtlogd.pid")]),
    "libvirtd": (Path("/run/libvirt/libvirt-sock"), ["libvirtd", "-d", "-p", str(RUN / "libvirtd.pid")]),
}
TOOLS = ("vagrant", "virsh", "libvirtd", "virtlogd", "qemu-system-x86_64", "qemu-img", "debootstrap", "dnsmasq")


class HostError(RuntimeError):
    """The host cannot run the lab; the message says what is missing and what provides it."""


def virsh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["virsh", "-q", "-c", URI, *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise HostError(f"virsh {' '.join(args)}: {result.stderr.strip()}")
    return result


def _listening(sock: Path) -> bool:
    """Whether a daemon accepts on `sock`: the file alone may be left from one that was killed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


def _answers() -> bool:
    return shutil.which("virsh") is not None and virsh("uri", check=False).returncode == 0


def check(memory_mib: int) -> None:
    """Raises HostError naming the first thing missing; makes nothing."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise HostError(f"missing on this host: {', '.join(missing)} (`make lab-setup` installs "
                        "scripts/lab-packages.txt)")
    plugins = subprocess.run(["vagrant", "plugin", "list"], capture_output=True, text=True, timeout=120).stdout
    if "vagrant-libvirt" not in plugins:
        raise HostError("vagrant has no vagrant-libvirt plugin (Debian's vagrant-libvirt package)")
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) // 1024
    if available < memory_mib:
        raise HostError(f"not enough memory: the lab needs {memory_mib} MiB, {available} MiB is available")


def _started() -> dict:
    try:
        return json.loads((RUN / "started.json").read_text())
    except (OSError, ValueError):
        return {"daemons": {}, "pool": False}


def _save(started: dict) -> None:
    RUN.mkdir(parents=True, exist_ok=True)
    tmp = RUN / "started.json.tmp"
    tmp.write_text(json.dumps(started))
    tmp.replace(RUN / "started.json")


def _libvirt_chains() -> list[str]:
    """libvirt's iptables chains, as "TOOL TABLE CHAIN"."""
    found = []
    for tool in ("iptables", "ip6tables"):
        out = subprocess.run([f"{tool}-save"], capture_output=True, text=True).stdout
        table = ""
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":LIBVIRT_"):
                found.append(f"{tool} {table} {line[1:].split()[0]}")
    return found


def _remove_chains(keep: list[str]) -> list[str]:
    """The libvirt chains that were not there at setup, with the jumps to them, once libvirtd is gone; a chain
    that still holds a rule (a network of someone else's) stays and is returned."""
    left = []
    for entry in _libvirt_chains():
        if entry in keep:
            continue
        tool, table, chain = entry.split()
        out = subprocess.run([f"{tool}-save", "-t", table], capture_output=True, text=True).stdout
        for line in out.splitlines():
            words = line.split()
            if words[:1] == ["-A"] and words[2:] == ["-j", chain]:
                subprocess.run([tool, "-t", table, "-D", words[1], "-j", chain], capture_output=True)
        if subprocess.run([tool, "-t", table, "-X", chain], capture_output=True).returncode != 0:
            left.append(f"{tool} chain {chain} in table {table}")
    return left


def setup() -> None:
    """Readies libvirt (see the module's docstring); idempotent."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise HostError(f"missing on this host: {', '.join(missing)} (scripts/lab-packages.txt)")
    if subprocess.run(["getent", "passwd", "libvirt-qemu"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/var/lib/libvirt",
                        "--shell", "/usr/sbin/nologin", "libvirt-qemu"], check=True)
    if not QEMU_CONF.exists():
        QEMU_CONF.write_text("# written by the pynode lab (vagrant/host.py): the guests run as root, so they read\n"
                             "# the box's kernel under root's home\nuser = \"root\"\ngroup = \"root\"\n")
    Path("/var/log/libvirt").mkdir(parents=True, exist_ok=True)
    (LAB_VAR / "console").mkdir(parents=True, exist_ok=True)
    started = _started()
    for name, (sock, argv) in DAEMONS.items():
        if _listening(sock) and (name != "libvirtd" or _answers()):
            continue
        sock.unlink(missing_ok=True)  # a daemon killed without its clean-up leaves its socket: it would not start
        RUN.mkdir(parents=True, exist_ok=True)
        if name == "libvirtd":  # its first network adds chains for good: teardown removes the new ones
            started["chains"] = _libvirt_chains()
        subprocess.run(argv, check=True, timeout=60)  # -d: it forks, writes its pid file, and we return
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        pid = int((RUN / f"{name}.pid").read_text())
        started["daemons"][name] = [pid, process_start_time(pid)]
        _save(started)
        if not sock.exists():
            raise HostError(f"{name} started but {sock} did not appear: see /var/log/libvirt/{name}.log")
    if virsh("pool-info", POOL, check=False).returncode != 0:
        POOL_DIR.mkdir(parents=True, exist_ok=True)
        virsh("pool-define-as", POOL, "dir", "--target", str(POOL_DIR))
        started["pool"] = True
        _save(started)
    if "inactive" in virsh("pool-info", POOL).stdout.split("State:")[1].split("\n")[0]:
        virsh("pool-start", POOL)


def leftovers() -> list[str]:
    """What of the lab is still there: domains, networks, the pool and its volumes, qemu processes."""
    if not _answers():
        found = []
    else:
        found = [f"domain {d}" for d in virsh("list", "--all", "--name").stdout.split() if d.startswith(PREFIX)]
        found += [f"network {n}" for n in virsh("net-list", "--all", "--name").stdout.split() if n.startswith(PREFIX)]
        if virsh("pool-info", POOL, check=False).returncode == 0:
            vols = virsh("vol-list", POOL, check=False).stdout.split("\n")
            found += [f"volume {v.split()[0]} in pool {POOL}" for v in vols if v.strip()]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if cmdline.startswith("/usr/bin/qemu-system") and f"guest={PREFIX}" in cmdline:
                found.append(f"process {proc.name}: {cmdline[:120]}")
    return found


def teardown() -> list[str]:
    """Removes the pool's volumes, the pool if setup made it, and stops the daemons setup started; returns what
    is left. Domains and networks are Vagrant's to destroy (`vagrant destroy -f`) and are only reported."""
    started = _started()
    if _answers() and virsh("pool-info", POOL, check=False).returncode == 0:
        for line in virsh("vol-list", POOL, check=False).stdout.split("\n"):
            if line.strip():
                virsh("vol-delete", "--pool", POOL, line.split()[0], check=False)
        if started.get("pool"):
            virsh("pool-destroy", POOL, check=False)
            virsh("pool-undefine", POOL, check=False)
            shutil.rmtree(POOL_DIR, ignore_errors=True)
            started["pool"] = False
            _save(started)
    left = leftovers()
    for name in reversed(DAEMONS):  # libvirtd before virtlogd
        pid, start = started["daemons"].get(name, (None, None))
        if pid is not None and process_start_time(pid) == start:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while process_start_time(pid) == start and time.monotonic() < deadline:
                time.sleep(0.2)
            if process_start_time(pid) == start:
                left.append(f"{name} (pid {pid}) did not stop on SIGTERM")
                continue
        started["daemons"].pop(name, None)
        _save(started)
    if not started["daemons"] and "chains" in started:
        left += _remove_chains(started.pop("chains"))
        _save(started)
    shutil.rmtree(LAB_VAR / "console", ignore_errors=True)
    for log in Path("/var/log/libvirt/qemu").glob(f"{PREFIX}*.log"):
        log.unlink()
    with contextlib.suppress(OSError):
        LAB_VAR.rmdir()  # when the pool went with it
    if not started["daemons"] and not started["pool"]:
        shutil.rmtree(RUN, ignore_errors=True)
    return left


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="ready libvirt: user, qemu.conf, daemons, storage pool")
    c = sub.add_parser("check", help="the tools, libvirt and the memory, before anything is made")
    c.add_argument("--memory", type=int, required=True, help="MiB the VMs need on this host")
    sub.add_parser("leftovers", help="what of the lab libvirt still holds")
    sub.add_parser("teardown", help="remove the pool's volumes and stop the daemons setup started")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("libvirt's system instance: run it as root")
    try:
        if args.command == "setup":
            setup()
        elif args.command == "check":
            check(args.memory)
        else:
            left = leftovers() if args.command == "leftovers" else teardown()
            for thing in left:
                print(thing)
            return 1 if left else 0
    except HostError as e:
        print(f"lab host {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
