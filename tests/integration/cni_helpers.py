"""Helpers for the CNI plugin tests: a CNI bin dir, namespaces, bridges and calls to plugins (fixtures: conftest.py).

Everything a test makes is named with a random `pyt-` suffix and removed on teardown: namespaces,
bridges, the iptables chains whose comment names the test network, and the resident helper when a test
lets one start (each test gets its own helper socket name, whose files in the default socket directory go
with it, and its own helper log under tmp_path).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_plugins import helper, launch
from cni_plugins.install import install
from tests.kit.busybox import static_busybox

PEERS_CNI = Path(os.environ.get("PEERS_BIN", Path.home() / ".cache/pynode/bin")) / "cni"
REFERENCE_PLUGINS = ("bridge", "host-local", "loopback")
DEBIAN_CNI = Path("/usr/lib/cni")
ACCEPTCON = "00010000"  # /proc/net/unix flags of a listening socket (bound but not listening: 00000000)
FORWARDING = ("/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding")


def have_reference() -> bool:
    return all((PEERS_CNI / p).is_file() for p in REFERENCE_PLUGINS)


@dataclass
class PluginResult:
    rc: int
    out: Any  # the JSON the plugin printed, None when it printed nothing
    raw: bytes

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class CNIEnv:
    """One test's CNI world: bin dir, data dir, helper socket name and log, and the objects to clean up."""
    tmp: Path
    bin_dir: Path
    data_dir: Path
    helper_name: str
    use_helper: bool = False
    namespaces: list[str] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    had_bridge_nat: bool = field(default_factory=lambda: bridge_nat_exists())

    def suffix(self) -> str:
        return secrets.token_hex(3)

    def netns(self) -> str:
        name = f"pyt-{self.suffix()}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.namespaces.append(name)
        return f"/run/netns/{name}"

    def bridge(self) -> str:
        name = f"pyt-br-{self.suffix()}"
        self.bridges.append(name)
        return name

    def network(self) -> str:
        name = f"pyt-net-{self.suffix()}"
        self.networks.append(name)
        return name

    def env(self, command: str, netns: str = "", container_id: str = "", ifname: str = "eth0",
            extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYCNI_"))}
        env.update({"CNI_COMMAND": command, "CNI_PATH": str(self.bin_dir),
                    "PYCNI_HELPER_SOCKET": self.helper_name, "PYCNI_HELPER_LOG": str(self.helper_log),
                    "PYCNI_HELPER": "auto" if self.use_helper else "off"})
        if container_id:
            env["CNI_CONTAINERID"] = container_id
        if netns:
            env["CNI_NETNS"] = netns
        if ifname:
            env["CNI_IFNAME"] = ifname
        env.update(extra or {})
        return env

    def run(self, plugin: str, command: str, conf: dict[str, Any] | bytes, netns: str = "",
            container_id: str = "c1", ifname: str = "eth0", extra: dict[str, str] | None = None,
            timeout: float = 60, caller_netns: str | None = None) -> PluginResult:
        """Execs the plugin as a runtime would; `caller_netns` runs it from that netns (a node in its own), in
        our mount namespace (`ip netns exec` would make a new one per call, which no helper serves)."""
        stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
        exe = plugin if "/" in plugin else str(self.bin_dir / plugin)
        argv = ["nsenter", f"--net={caller_netns}", "--", exe] if caller_netns else [exe]
        proc = subprocess.run(argv, input=stdin, env=self.env(command, netns, container_id, ifname, extra),
                              stdout=subprocess.PIPE, timeout=timeout, check=False)
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
        return PluginResult(proc.returncode, out, proc.stdout)

    @property
    def helper_log(self) -> Path:
        return self.tmp / "helper.log"

    def allocations(self, network: str) -> list[str]:
        d = self.data_dir / network
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if p.name != "lock" and not p.name.startswith("last_reserved_ip"))

    def cleanup(self) -> None:
        helper.stop(self.helper_name)
        for name in self.namespaces:
            delete_netns(name)
        for path in Path(launch.DEFAULT_DIR).glob(f"{self.helper_name}.*"):
            path.unlink()  # the lock files, and the socket of a helper that was killed
        for name in self.bridges:
            subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)
        for network in self.networks:
            remove_chains(network)
        if not self.had_bridge_nat and bridge_nat_exists():
            # macspoofchk made the table (the plugins, like the reference, leave it in place)
            subprocess.run(["nft", "delete", "table", "bridge", "nat"], check=False, capture_output=True)


def bridge_nat_exists() -> bool:
    return subprocess.run(["nft", "list", "table", "bridge", "nat"], capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def scratch_netns(prefix: str) -> Iterator[str]:
    """A named network namespace with lo up, deleted (veths first) when the block ends."""
    name = f"{prefix}-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        delete_netns(name)


def delete_netns(name: str) -> None:
    """Deletes the netns's veths first: the kernel tears a deleted netns down asynchronously, and its veths
    would otherwise linger in the host netns for a while after the test."""
    links = subprocess.run(
        ["ip", "-n", name, "-o", "link", "show", "type", "veth"], capture_output=True, text=True, check=False
    )
    for line in links.stdout.splitlines():
        ifname = line.split(":")[1].strip().split("@")[0]
        subprocess.run(["ip", "-n", name, "link", "del", ifname], check=False, capture_output=True)
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def remove_chains(network: str) -> None:
    """Deletes any masquerade chain (and its POSTROUTING jump) whose comment names `network`."""
    for tool in ("iptables", "ip6tables"):
        listing = subprocess.run([tool, "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=False).stdout
        chains = set()
        for line in listing.splitlines():
            if f'name: \\"{network}\\"' in line and line.startswith("-A POSTROUTING"):
                parts = line.split()
                chains.add(parts[parts.index("-j") + 1])
                subprocess.run(
                    [tool, "-w", "-t", "nat", "-D", "POSTROUTING", *shlex.split(line[len("-A POSTROUTING ") :])],
                    check=False,
                    capture_output=True,
                )
            elif f'name: \\"{network}\\"' in line and line.startswith("-A CNI-"):
                chains.add(line.split()[1])
        for chain in chains:
            subprocess.run([tool, "-w", "-t", "nat", "-F", chain], check=False, capture_output=True)
            subprocess.run([tool, "-w", "-t", "nat", "-X", chain], check=False, capture_output=True)


HOSTPORT_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")


def hostport_state() -> set[tuple[str, str]]:
    """The portmap plugins' shared nat chains and their rules present now, as (tool, "-N CHAIN") and
    (tool, "-A CHAIN ..."): the plugins make them once and never remove them, so a machine may have them
    before a test does."""
    found = set()
    for tool in ("iptables", "ip6tables"):
        listing = subprocess.run([tool, "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=False).stdout
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) > 1 and fields[0] in ("-N", "-A") and fields[1] in HOSTPORT_CHAINS:
                found.add((tool, line))
    return found


def remove_hostport_state(keep: set[tuple[str, str]]) -> None:
    """Removes what a test's pods made of the shared portmap chains: the rules not in `keep` (a masquerade
    mark bit of the test's, added to chains the machine had), then the chains not in `keep` and every jump
    to them."""
    made = hostport_state() - keep
    for tool, line in sorted(made):
        if line.startswith("-A "):
            subprocess.run([tool, "-w", "-t", "nat", "-D", *shlex.split(line)[1:]], check=False, capture_output=True)
    for tool, line in sorted(made):
        if not line.startswith("-N "):
            continue
        chain = line.split()[1]
        nat = [tool, "-w", "-t", "nat"]
        listing = subprocess.run([*nat, "-S"], capture_output=True, text=True, check=False).stdout
        for rule in listing.splitlines():
            if rule.startswith("-A ") and rule.endswith(f"-j {chain}"):
                subprocess.run([*nat, "-D", *shlex.split(rule)[1:]], check=False, capture_output=True)
        subprocess.run([*nat, "-F", chain], check=False, capture_output=True)
        subprocess.run([*nat, "-X", chain], check=False, capture_output=True)


def chains_for(network: str) -> list[str]:
    out = []
    for tool in ("iptables", "ip6tables"):
        listing = subprocess.run([tool, "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=False).stdout
        out += [line for line in listing.splitlines() if f'name: \\"{network}\\"' in line]
    return out


def make_cni_env(tmp_path: Path, use_helper: bool = False) -> CNIEnv:
    bin_dir = tmp_path / "bin"
    install(bin_dir)
    if have_reference():
        for name in REFERENCE_PLUGINS:
            os.symlink(PEERS_CNI / name, bin_dir / name)
    return CNIEnv(tmp=tmp_path, bin_dir=bin_dir, data_dir=tmp_path / "data",
                  helper_name=f"pyt-helper-{secrets.token_hex(4)}", use_helper=use_helper)


def helper_listening(name: str, netns: str | None = None) -> bool:
    """Whether a helper listens on the socket `name` of `netns` (None: the test's own)."""
    path = launch.socket_path(name, os.stat(netns or "/proc/self/ns/net").st_ino)
    table = ns_exec(netns, "cat", "/proc/net/unix").stdout if netns else Path("/proc/net/unix").read_text()
    return any(line.split()[-1] == path and line.split()[3] == ACCEPTCON
               for line in table.splitlines()[1:] if len(line.split()) > 7)


def ns_exec(netns: str, *argv: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    name = os.path.basename(netns)
    return subprocess.run(
        ["ip", "netns", "exec", name, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def ping(netns: str | None, address: str, attempts: int = 1) -> bool:
    """One ping; `attempts` > 1 waits out IPv6 duplicate address detection on the bridge's gateway address."""
    argv = [str(static_busybox()), "ping", "-c", "1", "-W", "2", address]
    for _ in range(attempts):
        proc = (
            ns_exec(netns, *argv)
            if netns
            else subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        )
        if proc.returncode == 0:
            return True
        time.sleep(0.5)
    return False


TCP_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7777)); s.listen(1); print('ready', flush=True)
c, _ = s.accept(); c.sendall(c.recv(64).upper()); c.close()
"""
TCP_CLIENT = """
import socket, sys
port = int(sys.argv[2]) if len(sys.argv) > 2 else 7777
c = socket.create_connection((sys.argv[1], port), timeout=5); c.sendall(b'hello'); print(c.recv(64).decode())
"""


def tcp_roundtrip(server_ns: str, server_ip: str, client_ns: str | None, via: tuple[str, int] | None = None) -> str:
    """Runs a one-shot TCP echo in `server_ns` and connects from `client_ns` (None: the host), to the server's
    address or to `via` (a host port mapped to it)."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", os.path.basename(server_ns), sys.executable, "-c", TCP_SERVER, server_ip],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        argv = [sys.executable, "-c", TCP_CLIENT, *((via[0], str(via[1])) if via else (server_ip,))]
        proc = (
            ns_exec(client_ns, *argv)
            if client_ns
            else subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        )
        return proc.stdout.strip()
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
