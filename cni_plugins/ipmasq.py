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
    """A new chain (the usual case) goes in with its rules and jump in one iptables-restore batch: nothing
    of the attachment can exist yet, since no rule may jump to a missing chain. An existing one (a
    repeated ADD) gets each rule checked and added unless there."""
    version = address.version
    chain = iptables.chain_name(network, container_id)
    note = comment(network, container_id)
    multicast = "224.0.0.0/4" if version == 4 else "ff00::/8"
    tagged = ["-m", "comment", "--comment", note]
    rules = [(chain, ["-d", str(address.network), "-j", "ACCEPT", *tagged]),
             (chain, ["!", "-d", multicast, "-j", "MASQUERADE", *tagged]),
             ("POSTROUTING", ["-s", str(address.ip), "-j", chain, *tagged])]
    if iptables.run(version, "-n", "-L", chain, check=False).returncode != 0:
        if iptables.restore(version, [f"-N {chain}", *(f"-A {c} {iptables.quoted(r)}" for c, r in rules)]):
            return
        iptables.run(version, "-N", chain)
    for target, rule in rules:
        iptables.insert_unique(version, target, rule)


def teardown(network: str, container_id: str, versions: tuple[int, ...] = (4, 6)) -> None:
    """Removes the POSTROUTING jumps to the attachment's chain and the chain itself; missing pieces are fine.
    Per family, a listing of POSTROUTING (not the whole nat table, which kube-proxy can fill with thousands
    of rules) and one iptables-restore batch (iptables.restore); command by command when the batch is
    refused (the chain is gone already, or a rule went meanwhile). `versions`: the families the attachment
    had addresses in."""
    chain = iptables.chain_name(network, container_id)
    for version in versions:
        listing = iptables.run(version, "-S", "POSTROUTING", check=False).stdout.splitlines()
        jumps = [line[len("-A POSTROUTING "):] for line in listing
                 if line.startswith("-A POSTROUTING ") and _jumps_to(line, chain)]
        if iptables.restore(version, [*(f"-D POSTROUTING {rule}" for rule in jumps), f"-F {chain}", f"-X {chain}"]):
            continue
        for rule in jumps:
            iptables.run(version, "-D", "POSTROUTING", *shlex.split(rule), check=False)
        if iptables.run(version, "-n", "-L", chain, check=False).returncode == 0:
            iptables.run(version, "-F", chain, check=False)
            iptables.run(version, "-X", chain, check=False)


def _jumps_to(line: str, chain: str) -> bool:
    return f" -j {chain} " in f"{line} "


def validate_backend(backend: str | None) -> None:
    if backend in NOT_IMPLEMENTED:
        raise CNIError(
            ERR_UNSUPPORTED_FIELD, f"unsupported field ipMasqBackend: {backend!r}", "only iptables is implemented"
        )
    if backend not in (None, *BACKENDS):
        raise CNIError(
            ERR_INVALID_NETWORK_CONFIG, f"unsupported ipMasqBackend {backend!r}", f"supported: {list(BACKENDS)}"
        )
