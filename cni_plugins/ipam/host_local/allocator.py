"""Picks addresses from a range set: a requested one, or round-robin after the last reserved address.

Round robin (starting after `last_reserved_ip.N`, wrapping once through every range, skipping the
gateway) is what the reference does, so a just-released address is not immediately handed out again.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from cni_plugins.ipam.host_local.backend import AllocationStore
from cni_plugins.ipam.host_local.config import Range, RangeSet
from cni_plugins.result import IPAddress, IPConfig
from cni_plugins.skel import ERR_INVALID_NETWORK_CONFIG, ERR_TRY_AGAIN_LATER, CNIError


def _candidates(range_set: RangeSet, last: IPAddress | None) -> Iterator[tuple[IPAddress, Range]]:
    """Every address of the set once, starting right after `last` when `last` is in the set."""
    ranges = range_set.ranges
    start_idx, start_ip = 0, ranges[0].start
    owner = range_set.range_for(last) if last is not None else None
    if owner is not None and last is not None:
        start_idx = ranges.index(owner)
        if last < owner.end:  # type: ignore[operator]  # one address family: last is in owner
            start_ip = last + 1
        else:
            start_idx = (start_idx + 1) % len(ranges)
            start_ip = ranges[start_idx].start
    total = sum(int(r.end) - int(r.start) + 1 for r in ranges)
    idx, ip = start_idx, start_ip
    for _ in range(total):
        r = ranges[idx]
        if ip != r.gateway:
            yield ip, r
        if ip >= r.end:  # type: ignore[operator]  # one address family: ip walks r
            idx = (idx + 1) % len(ranges)
            ip = ranges[idx].start
        else:
            ip = ip + 1


def _config(ip: IPAddress, r: Range) -> IPConfig:
    return IPConfig(ipaddress.ip_interface(f"{ip}/{r.subnet.prefixlen}"), r.gateway)


def allocate(store: AllocationStore, range_set: RangeSet, range_id: int, container_id: str, ifname: str,
             requested: IPAddress | None) -> IPConfig:
    """Reserves one address of `range_set` for the attachment; the caller holds the store lock."""
    if requested is not None:
        r = range_set.range_for(requested)
        if r is None:
            raise CNIError(
                ERR_INVALID_NETWORK_CONFIG, f"requested IP address {requested} is not in range set {range_set}"
            )
        if requested == r.gateway:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"requested ip {requested} is subnet's gateway")
        if not store.reserve(container_id, ifname, requested, range_id):
            raise CNIError(
                ERR_TRY_AGAIN_LATER, f"requested IP address {requested} is not available in range set {range_set}"
            )
        return _config(requested, r)
    for held in store.ips_of(container_id, ifname):
        if range_set.range_for(held) is not None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"{held} has been allocated to {container_id}, duplicate allocation is not allowed")
    for ip, r in _candidates(range_set, store.last_reserved(range_id)):
        if store.reserve(container_id, ifname, ip, range_id):
            return _config(ip, r)
    raise CNIError(ERR_TRY_AGAIN_LATER, f"no IP addresses available in range set: {range_set}")


def has_free(store: AllocationStore, range_set: RangeSet) -> bool:
    return any(not store.is_allocated(ip) for ip, _ in _candidates(range_set, None))
