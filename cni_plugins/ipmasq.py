"""IP masquerade for a bridge network with iptables, rule for rule as the reference's iptables backend.

One nat chain per (network, container) named by `chain_name`; POSTROUTING sends the container's source
address there; the chain accepts traffic to the container's own subnet, leaves multicast alone and
masquerades the rest. Teardown works from the chain name alone, so it also cleans up after an ADD that
was killed before it learnt the addresses.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import subprocess

from cni_plugins.result import IPInterface
from cni_plugins.skel import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, ERR_UNSUPPORTED_FIELD, CNIError

MAX_CHAIN_LENGTH = 28
BACKENDS = ("iptables",)
NOT_IMPLEMENTED = ("nftables",)


def chain_name(network: str, container_id: str) -> str:
    return ("CNI-" + hashlib.sha512((network + container_id).encode()).hexdigest())[:MAX_CHAIN_LENGTH]


def comment(network: str, container_id: str) -> str:
    return f"name: {json.dumps(network)} id: {json.dumps(container_id)}"


def _tool(version: int) -> str:
    return "iptables" if version == 4 else "ip6tables"


def _run(version: int, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([_tool(version), "-w", "-t", "nat", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise CNIError(ERR_INTERNAL, f"{_tool(version)} {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _append_unique(version: int, chain: str, rule: list[str]) -> None:
    if _run(version, "-C", chain, *rule, check=False).returncode != 0:
        _run(version, "-A", chain, *rule)


def setup(address: IPInterface, network: str, container_id: str) -> None:
    version = address.version
    chain = chain_name(network, container_id)
    note = comment(network, container_id)
    if _run(version, "-n", "-L", chain, check=False).returncode != 0:
        _run(version, "-N", chain)
    multicast = "224.0.0.0/4" if version == 4 else "ff00::/8"
    _append_unique(version, chain, ["-d", str(address.network), "-j", "ACCEPT", "-m", "comment", "--comment", note])
    _append_unique(version, chain, ["!", "-d", multicast, "-j", "MASQUERADE", "-m", "comment", "--comment", note])
    _append_unique(version, "POSTROUTING", ["-s", str(address.ip), "-j", chain, "-m", "comment", "--comment", note])


def teardown(network: str, container_id: str, versions: tuple[int, ...] = (4, 6)) -> None:
    """Removes the POSTROUTING jumps to the attachment's chain and the chain itself; missing pieces are fine."""
    chain = chain_name(network, container_id)
    for version in versions:
        listing = _run(version, "-S", "POSTROUTING", check=False)
        for line in listing.stdout.splitlines():
            if line.startswith("-A POSTROUTING ") and f"-j {chain}" in line:
                _run(version, "-D", "POSTROUTING", *shlex.split(line[len("-A POSTROUTING "):]), check=False)
        if _run(version, "-n", "-L", chain, check=False).returncode == 0:
            _run(version, "-F", chain, check=False)
            _run(version, "-X", chain, check=False)


def validate_backend(backend: str | None) -> None:
    if backend in NOT_IMPLEMENTED:
        raise CNIError(
            ERR_UNSUPPORTED_FIELD, f"unsupported field ipMasqBackend: {backend!r}", "only iptables is implemented"
        )
    if backend not in (None, *BACKENDS):
        raise CNIError(
            ERR_INVALID_NETWORK_CONFIG, f"unsupported ipMasqBackend {backend!r}", f"supported: {list(BACKENDS)}"
        )
