"""The iptables calls the plugins share, made the way the reference's go-iptables makes them.

The reference plugins exec the `iptables`/`ip6tables` found on PATH (iptables-nft on this host) with
`--wait`; ours do the same, so rules made by one are found, checked and removed by the other. Only the
nat table is used (bridge's ipMasq, portmap's DNAT and masquerade chains).
"""
from __future__ import annotations

import hashlib
import subprocess

from cni_plugins.skel import ERR_INTERNAL, CNIError

NAT = "nat"
MAX_CHAIN_LENGTH = 28


def chain_name(network: str, container_id: str, prefix: str = "") -> str:
    """The reference's per-attachment chain name: CNI-<prefix> and the SHA-512 of network + id, 28 characters."""
    return (f"CNI-{prefix}" + hashlib.sha512((network + container_id).encode()).hexdigest())[:MAX_CHAIN_LENGTH]


def tool(version: int) -> str:
    return "iptables" if version == 4 else "ip6tables"


def quoted(args: list[str]) -> str:
    """`args` as one line of iptables-restore input (its quoting is `iptables -S`'s: double quotes, with
    backslashes before quotes and backslashes inside)."""
    def one(arg: str) -> str:
        if arg and not any(c in arg for c in ' "\\\'\t'):
            return arg
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return " ".join(one(a) for a in args)


def restore(version: int, commands: list[str], table: str = NAT) -> bool:
    """Applies `commands` (lines as `iptables -S` prints them, -A/-D/-F/-X) to `table` in one transaction
    (`iptables-restore --noflush`): one exec where a command each would take as many. False when it is
    refused as a whole (a rule gone meanwhile, no iptables-restore), for the caller to go command by command."""
    batch = f"*{table}\n" + "".join(f"{c}\n" for c in commands) + "COMMIT\n"
    try:
        proc = subprocess.run([f"{tool(version)}-restore", "-w", "--noflush"], input=batch, capture_output=True,
                              text=True, check=False)
    except OSError:
        return False
    return proc.returncode == 0


def run(version: int, *args: str, check: bool = True, table: str = NAT) -> subprocess.CompletedProcess[str]:
    """`iptables -w -t TABLE ARGS`; a failure with `check` is a CNIError naming the command and iptables' words."""
    proc = subprocess.run([tool(version), "-w", "-t", table, *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise CNIError(ERR_INTERNAL, f"{tool(version)} -t {table} {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def chain_exists(version: int, chain: str) -> bool:
    return run(version, "-S", chain, "1", check=False).returncode == 0


def ensure_chain(version: int, chain: str) -> None:
    if not chain_exists(version, chain):
        proc = run(version, "-N", chain, check=False)
        if proc.returncode not in (0, 1):  # 1: made meanwhile by a concurrent call
            run(version, "-N", chain)


def rule_exists(version: int, chain: str, rule: list[str]) -> bool:
    return run(version, "-C", chain, *rule, check=False).returncode == 0


def insert_unique(version: int, chain: str, rule: list[str], prepend: bool = False) -> None:
    """Adds `rule` to `chain` unless it is there: appended, or first with `prepend`."""
    if rule_exists(version, chain, rule):
        return
    if prepend:
        run(version, "-I", chain, "1", *rule)
    else:
        run(version, "-A", chain, *rule)


def delete_chain(version: int, chain: str) -> bool:
    """Flushes and deletes `chain` if it exists; False when something still refers to it."""
    if not chain_exists(version, chain):
        return True
    run(version, "-F", chain, check=False)
    return run(version, "-X", chain, check=False).returncode == 0


def usable(version: int) -> bool:
    """Whether this family's iptables works at all (the reference lists nat OUTPUT to find out)."""
    try:
        return run(version, "-S", "OUTPUT", check=False).returncode == 0
    except OSError:
        return False
