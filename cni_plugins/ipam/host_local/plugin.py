"""The host-local commands: ADD allocates one address per range set, DEL and GC release, CHECK and STATUS look."""
from __future__ import annotations

from pathlib import Path

from cni_plugins.ipam.host_local import allocator, config
from cni_plugins.ipam.host_local.backend import AllocationStore
from cni_plugins.ipam.host_local.store import DiskAllocationStore
from cni_plugins.result import Result
from cni_plugins.skel import ERR_INVALID_NETWORK_CONFIG, ERR_NOT_AVAILABLE, ERR_UNKNOWN_CONTAINER, CmdArgs, CNIError

VALID_ATTACHMENTS = "cni.dev/valid-attachments"


def store_at(directory: Path) -> AllocationStore:
    """The network's store: on disk, as the reference keeps it."""
    return DiskAllocationStore(directory)


def add(args: CmdArgs) -> Result:
    conf = config.load(args)
    result = Result(routes=list(conf.routes), dns=conf.dns)
    requested = list(conf.requested_ips)
    with store_at(conf.store_dir).locked() as store:
        try:
            for idx, range_set in enumerate(conf.range_sets):
                mine = next((ip for ip in requested if range_set.range_for(ip) is not None), None)
                if mine is not None:
                    requested.remove(mine)
                result.ips.append(allocator.allocate(store, range_set, idx, args.container_id, args.ifname, mine))
            if requested:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                               "failed to allocate all requested IPs: " + " ".join(map(str, requested)))
        except BaseException:
            for ip in result.ips:
                store.release(ip.address.ip)
            raise
    return result


def delete(args: CmdArgs) -> None:
    name, data_dir = config.load_for_release(args)
    with store_at(data_dir / name).locked() as store:
        store.release_by_id(args.container_id, args.ifname)


def check(args: CmdArgs) -> None:
    conf = config.load(args)
    with store_at(conf.store_dir).locked() as store:
        if not store.ips_of(args.container_id, args.ifname):
            raise CNIError(
                ERR_UNKNOWN_CONTAINER, f"host-local: Failed to find address added by container {args.container_id}"
            )


def status(args: CmdArgs) -> None:
    conf = config.load(args)
    with store_at(conf.store_dir).locked() as store:
        for idx, range_set in enumerate(conf.range_sets):
            if not allocator.has_free(store, range_set):
                raise CNIError(ERR_NOT_AVAILABLE, f"no IP addresses available in range set {idx}: {range_set}")


def gc(args: CmdArgs) -> None:
    name, data_dir = config.load_for_release(args)
    raw = args.config.get(VALID_ATTACHMENTS) or []
    if not isinstance(raw, list) or not all(isinstance(a, dict) for a in raw):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"{VALID_ATTACHMENTS} must be a list of objects")
    valid = {(a.get("containerID", ""), a.get("ifname", "")) for a in raw}
    with store_at(data_dir / name).locked() as store:
        store.release_all_but(valid)
