"""What host-local needs of the place its allocations live: the reference's backend.Store interface.

The allocator and the commands see only this; DiskAllocationStore (store.py), the reference's disk.Store and
file-compatible with it, is the one implementation. A command works on the store locked: `locked()` is the
reference's Lock, Unlock and Close around one command.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from cni_plugins.result import IPAddress


class AllocationStore(Protocol):
    def locked(self) -> AbstractContextManager[AllocationStore]:
        """The store, held exclusively by this call (processes and threads alike) until the block ends."""
        ...

    def reserve(self, container_id: str, ifname: str, ip: IPAddress, range_id: int) -> bool:
        """Claims `ip` for the attachment and makes it range `range_id`'s last reserved address; False when
        another attachment holds it (Reserve)."""
        ...

    def last_reserved(self, range_id: int) -> IPAddress | None:
        """Where range `range_id`'s round robin goes on from; None to start at the range's start
        (LastReservedIP)."""
        ...

    def ips_of(self, container_id: str, ifname: str) -> list[IPAddress]:
        """The addresses the attachment holds (GetByID)."""
        ...

    def release_by_id(self, container_id: str, ifname: str) -> None:
        """Frees every address the attachment holds, and whatever a killed reservation of it left (ReleaseByID)."""
        ...

    def release(self, ip: IPAddress) -> None:
        """Frees one address: an ADD undoing what it reserved before it failed."""
        ...

    def release_all_but(self, valid: set[tuple[str, str]]) -> None:
        """Frees the addresses of every attachment (container id, ifname) not in `valid` (GC)."""
        ...

    def is_allocated(self, ip: IPAddress) -> bool:
        ...
