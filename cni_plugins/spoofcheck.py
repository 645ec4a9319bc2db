"""MAC spoof checking for a bridge port with nftables, chain for chain as the reference's pkg/link spoofcheck.

Frames entering the bridge from the host end of the veth go through a per-attachment chain that returns
for the container's MAC and drops everything else. Teardown works from the attachment id alone.
"""
from __future__ import annotations

import json
import subprocess

from cni_plugins.skel import ERR_INTERNAL, CNIError

TABLE = "bridge nat"
BASE_CHAIN = "PREROUTING"


def _unique(container_id: str, ifname: str) -> str:
    return f"{container_id}-{ifname}"


def _nft(script: str | None = None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["nft", *(args or ("-f", "-"))]
    proc = subprocess.run(argv, input=script, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise CNIError(ERR_INTERNAL, f"nft failed: {proc.stderr.strip()}")
    return proc


def setup(host_ifname: str, mac: str, container_id: str, ifname: str) -> None:
    uid = _unique(container_id, ifname)
    chain, mac_chain, note = f"cni-br-iface-{uid}", f"cni-br-iface-{uid}-mac", json.dumps(f"macspoofchk-{uid}")
    _nft("\n".join([
        f"add table {TABLE}",
        f"add chain {TABLE} {BASE_CHAIN} {{ type filter hook prerouting priority -300 ; policy accept ; }}",
        f"add chain {TABLE} {chain}",
        f"add chain {TABLE} {mac_chain}",
        f"flush chain {TABLE} {chain}",
        f"flush chain {TABLE} {mac_chain}",
        f"add rule {TABLE} {BASE_CHAIN} iifname {json.dumps(host_ifname)} jump {chain} comment {note}",
        f"add rule {TABLE} {chain} jump {mac_chain} comment {note}",
        f"add rule {TABLE} {mac_chain} ether saddr {mac} return comment {note}",
        f"add rule {TABLE} {mac_chain} drop comment {note}",
    ]) + "\n")


def teardown(container_id: str, ifname: str) -> None:
    """Deletes the base-chain jumps tagged with this attachment and its two chains; missing pieces are fine."""
    uid = _unique(container_id, ifname)
    listing = _nft(None, "-j", "list", "chain", *TABLE.split(), BASE_CHAIN, check=False)
    if listing.returncode != 0:
        return
    lines = []
    for item in json.loads(listing.stdout).get("nftables", []):
        rule = item.get("rule")
        if rule and rule.get("comment") == f"macspoofchk-{uid}":
            lines.append(f"delete rule {TABLE} {BASE_CHAIN} handle {rule['handle']}")
    for chain in (f"cni-br-iface-{uid}", f"cni-br-iface-{uid}-mac"):
        if _nft(None, "list", "chain", *TABLE.split(), chain, check=False).returncode == 0:
            lines += [f"flush chain {TABLE} {chain}"]
    for chain in (f"cni-br-iface-{uid}", f"cni-br-iface-{uid}-mac"):
        if _nft(None, "list", "chain", *TABLE.split(), chain, check=False).returncode == 0:
            lines += [f"delete chain {TABLE} {chain}"]
    if lines:
        _nft("\n".join(lines) + "\n")
