"""IP masquerade for a bridge network with iptables, rule for rule as the reference's iptables backend.

One nat chain per (network, container) named by `iptables.chain_name`; POSTROUTING sends the container's source
address there; the chain accepts traffic to the container's own subnet, leaves multicast alone and
masquerades the rest. Teardown works from the chain name alone, so it also cleans up after an ADD that
was killed before it learnt the addresses.
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

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
             ("POSTROUTING", _jump(address, chain, note))]
    if iptables.run(version, "-n", "-L", chain, check=False).returncode != 0:
        if iptables.restore(version, [f"-N {chain}", *(f"-A {c} {iptables.quoted(r)}" for c, r in rules)]):
            return
        iptables.run(version, "-N", chain)
    for target, rule in rules:
        iptables.insert_unique(version, target, rule)


def _jump(address: IPInterface, chain: str, note: str) -> list[str]:
    return ["-s", str(address.ip), "-j", chain, "-m", "comment", "--comment", note]


def teardown(network: str, container_id: str, versions: tuple[int, ...] = (4, 6),
             addresses: Sequence[IPInterface] = ()) -> None:
    """Removes the POSTROUTING jumps to the attachment's chain and the chain itself; missing pieces are fine.
    `versions`: the families the attachment had addresses in; `addresses`: those addresses, when known (the
    prevResult of a DEL). Per family, one iptables-restore batch (iptables.restore) deleting the jumps
    setup() made for those addresses, as the reference's teardown rebuilds them; else, or when the batch
    is refused (a jump or the chain gone already), a listing of POSTROUTING (not the whole nat table, which
    kube-proxy can fill with thousands of rules) and a batch of the jumps found, then command by command."""
    chain = iptables.chain_name(network, container_id)
    note = comment(network, container_id)
    for version in versions:
        known = [a for a in addresses if a.version == version]
        if known and iptables.restore(version, [*(f"-D POSTROUTING {iptables.quoted(_jump(a, chain, note))}"
                                                  for a in known), f"-F {chain}", f"-X {chain}"]):
            continue
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
