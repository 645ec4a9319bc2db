"""User namespaces for pods with `hostUsers: false`: which host ids each such pod gets, as the kubelet's
userns manager hands them out.

Each pod gets a range of 65536 host ids of its own (its uid and gid 0 map to the first), the ranges at
multiples of 65536 from 65536 on, so no two pods on the node share an id and none maps to the host's
system ids (0-65535). The range is written into the pod's directory (`<root-dir>/pods/<uid>/userns`)
before the sandbox asks for it, and the directory is the record: a restarted pykubelet gives the pod the
same range again (its containers must join the user namespace the sandbox made with it), and a range is
free again once the pod's directory is removed, after its sandbox is gone. Which ranges are taken is read
from the pod directories each time, never kept in memory, so nothing of it can drift from the disk.

Threat model: the ranges are what keeps one pod's root from owning another's files, so an allocation is
made under a lock and never reuses a range a pod directory still names; an unreadable record refuses the
pod rather than guess its range.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

from pykubelet.api.podmodel import Pod
from pykubelet.dirs import make_dirs
from pykubelet.errors import FailedPreconditionError
from pynode_os.files import atomic_write

RECORD = "userns"
LENGTH = 65536  # ids per pod: the kubelet's default (userNamespaces.idsPerPod)
FIRST = LENGTH  # the first range: past the host's own system ids
RANGES = (1 << 32) // LENGTH - 2  # ranges below 2^32 - 1, the first one left out


class UserNamespaceError(FailedPreconditionError):
    """The pod can't have a user namespace: why, naming the pod's field or record."""


class UserNamespaces:
    def __init__(self, pods_dir: Path) -> None:
        self.pods_dir = pods_dir
        self._lock = threading.Lock()

    def host_range(self, pod: Pod) -> int | None:
        """The first host id of the pod's range (LENGTH ids), allocating it on first use; None for a pod
        in the host's user namespace (hostUsers absent or true)."""
        if pod.spec.host_users:
            return None
        uid = pod.uid
        with self._lock:
            known = self._recorded(uid)
            if known is not None:
                return known
            taken = {first for other in self._pod_uids() if other != uid
                     if (first := self._recorded(other)) is not None}
            first = next((FIRST + i * LENGTH for i in range(RANGES) if FIRST + i * LENGTH not in taken), None)
            if first is None:
                raise UserNamespaceError(f"spec.hostUsers: false: all {RANGES} user namespace ranges of this "
                                         "node are taken")
            record = self.pods_dir / uid / RECORD
            make_dirs(record.parent)  # the pod's directory, 0750 (pykubelet/dirs.py)
            atomic_write(record, json.dumps({"hostID": first, "length": LENGTH}).encode())
            return first

    def _pod_uids(self) -> list[str]:
        try:
            return [d.name for d in self.pods_dir.iterdir()]
        except FileNotFoundError:
            return []

    def _recorded(self, uid: str) -> int | None:
        path = self.pods_dir / uid / RECORD
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise UserNamespaceError(f"{path}: unreadable: {e}") from e
        first = data.get("hostID") if isinstance(data, dict) else None
        if not isinstance(first, int) or first < FIRST or first % LENGTH or data.get("length") != LENGTH:
            raise UserNamespaceError(f"{path}: not a user namespace range of this kubelet: {data!r}")
        return first
