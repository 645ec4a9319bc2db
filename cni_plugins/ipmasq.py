"""IP masquerade for a bridge network with iptables, rule for rule as the reference's iptables backend.

One nat chain per (network, container) named by `iptables.chain_name`; POSTROUTING sends the container's source
address there; the chain accepts traffic to the container's own subnet, leaves multicast alone and
masquerades the rest. Teardown works from the chain name alone, so it also cleans up after an ADD that
was killed before it learnt the addresses.
"""
from __future__ import annotations

import json
import shlex

from cni_plugins import iptables
from cni_plugins.result import IPInterface
from cni_plugins.skel import ERR_INVALID_NETWORK_CONFIG, ERR_UNSUPPORTED_FIELD, CNIError

BACKENDS = ("iptables",)
NOT_IMPLEMENTED = ("nftables",)


def comment(network: str, container_id: str) -> str:
    return f"name: {json.dumps(network)} id: {json.dumps(container_id)}"


def setup(address: IPInterface, network: str, container_id: str) -> None:
    version = address.version
    chain = iptables.chain_name(network, container_id)
    note = comment(network, container_id)
    if iptables.run(version, "-n", "-L", chain, check=False).returncode != 0:
        iptables.run(version, "-N", chain)
    multicast = "224.0.0.0/4" if version == 4 else "ff00::/8"
    tagged = ["-m", "comment", "--comment", note]
    iptables.insert_unique(version, chain, ["-d", str(address.network), "-j", "ACCEPT", *tagged])
    iptables.insert_unique(version, chain, ["!", "-d", multicast, "-j", "MASQUERADE", *tagged])
    iptables.insert_unique(version, "POSTROUTING", ["-s", str(address.ip), "-j", chain, *tagged])


def teardown(network: str, container_id: str, versions: tuple[int, ...] = (4, 6)) -> None:
    """Removes the POSTROUTING jumps to the attachment's chain and the chain itself; missing pieces are fine."""
    chain = iptables.chain_name(network, container_id)
    for version in versions:
        listing = iptables.run(version, "-S", "POSTROUTING", check=False)
        for line in listing.stdout.splitlines():
            if line.startswith("-A POSTROUTING ") and f"-j {chain}" in line:
                iptables.run(version, "-D", "POSTROUTING", *shlex.split(line[len("-A POSTROUTING "):]), check=False)
        if iptables.run(version, "-n", "-L", chain, check=False).returncode == 0:
            iptables.run(version, "-F", chain, check=False)
            iptables.run(version, "-X", chain, check=False)


def validate_backend(backend: str | None) -> None:
    if backend in NOT_IMPLEMENTED:
        raise CNIError(
            ERR_UNSUPPORTED_FIELD, f"unsupported field ipMasqBackend: {backend!r}", "only iptables is implemented"
        )
    if backend not in (None, *BACKENDS):
        raise CNIError(
            ERR_INVALID_NETWORK_CONFIG, f"unsupported ipMasqBackend {backend!r}", f"supported: {list(BACKENDS)}"
        )
