"""The daemon's index of its sandboxes and containers: the records of model.py, in memory, with the locks
that keep concurrent RPCs on one object in order.

The records on disk are the truth; this index is a cache of them that `recover()` rebuilds at start-up, so
every change goes to disk first (`save_*` writes the record, then indexes it). Names are reserved here, under
the index lock, so two RunPodSandbox (or CreateContainer) calls with the same metadata race to one winner and
the loser gets ALREADY_EXISTS before it made anything. Per-id locks serialise the life-cycle calls on one
object (a Stop racing a Remove), while calls on different objects run in parallel.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from proto import api_pb2
from pynode_os.files import FULL
from pyruntime.cri.model import ContainerRecord, ExitRecord, Layout, SandboxRecord, decode_pb
from pyruntime.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, PyRuntimeError

log = logging.getLogger(__name__)

R = TypeVar("R", SandboxRecord, ContainerRecord)

SANDBOX_RECORD = "sandbox.json"
CONTAINER_RECORD = "container.json"


def sandbox_name(config: api_pb2.PodSandboxConfig) -> str:
    m = config.metadata
    return f"{m.name}_{m.namespace}_{m.uid}_{m.attempt}"


def container_name(sandbox_id: str, config: api_pb2.ContainerConfig) -> str:
    return f"{config.metadata.name}_{sandbox_id}_{config.metadata.attempt}"


class RecordStore:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._mutex = threading.Lock()
        self._sandboxes: dict[str, SandboxRecord] = {}
        self._containers: dict[str, ContainerRecord] = {}
        self._names: dict[str, str] = {}  # reserved name -> id, sandboxes and containers (the forms never meet)
        self._locks: dict[str, threading.RLock] = {}

    # ---- locks and names ----------------------------------------------------------------------------------

    @contextmanager
    def lock(self, object_id: str) -> Iterator[None]:
        with self._mutex:
            lock = self._locks.setdefault(object_id, threading.RLock())
        with lock:
            yield

    def reserve(self, name: str, object_id: str, what: str) -> None:
        with self._mutex:
            owner = self._names.get(name)
            if owner is not None and owner != object_id:
                raise AlreadyExistsError(f"{what} name {name!r} is reserved for {owner}")
            self._names[name] = object_id

    def release(self, name: str, object_id: str) -> None:
        with self._mutex:
            if self._names.get(name) == object_id:
                del self._names[name]

    # ---- records ------------------------------------------------------------------------------------------

    def save_sandbox(self, record: SandboxRecord, sync: str = FULL) -> None:
        path = self.layout.sandbox_dir(record.id)
        os.makedirs(path, mode=0o711, exist_ok=True)
        record.dump(os.path.join(path, SANDBOX_RECORD), sync)
        with self._mutex:
            self._sandboxes[record.id] = record

    def save_container(self, record: ContainerRecord, sync: str = FULL) -> None:
        path = self.layout.container_dir(record.id)
        os.makedirs(path, mode=0o711, exist_ok=True)
        record.dump(os.path.join(path, CONTAINER_RECORD), sync)
        with self._mutex:
            self._containers[record.id] = record

    def forget_sandbox(self, sandbox_id: str) -> None:
        with self._mutex:
            self._sandboxes.pop(sandbox_id, None)
            self._locks.pop(sandbox_id, None)

    def forget_container(self, container_id: str) -> None:
        with self._mutex:
            self._containers.pop(container_id, None)
            self._locks.pop(container_id, None)

    def sandbox(self, sandbox_id: str) -> SandboxRecord:
        """By id or a unique prefix of one (crictl's short ids); NotFoundError names the id."""
        with self._mutex:
            return self._sandboxes[self._resolve(self._sandboxes, sandbox_id, "pod sandbox")]

    def container(self, container_id: str) -> ContainerRecord:
        with self._mutex:
            return self._containers[self._resolve(self._containers, container_id, "container")]

    def sandboxes(self) -> list[SandboxRecord]:
        with self._mutex:
            return list(self._sandboxes.values())

    def containers(self, sandbox_id: str | None = None) -> list[ContainerRecord]:
        with self._mutex:
            return [c for c in self._containers.values() if sandbox_id is None or c.sandbox_id == sandbox_id]

    def exit_of(self, container_id: str) -> ExitRecord | None:
        try:
            return ExitRecord.load(self.layout.exit_record(container_id))
        except FileNotFoundError:
            return None

    @staticmethod
    def _resolve(index: dict, object_id: str, what: str) -> str:
        if not object_id:
            raise InvalidArgumentError(f"{what} id: must not be empty")
        if object_id in index:
            return object_id
        matches = [k for k in index if k.startswith(object_id)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise InvalidArgumentError(f"{what} id {object_id!r}: ambiguous, matches {len(matches)} ids")
        raise NotFoundError(f"{what} {object_id!r} not found")

    # ---- start-up -----------------------------------------------------------------------------------------

    def recover(self) -> None:
        """Index every record on disk and reserve its name. A record that can't be read or decoded is logged
        and left out (one bad file must not keep the daemon down, nor fail every List); settling what the
        records claim is the managers' job (Sandboxes.recover, Containers.recover)."""
        for record in _load_all(os.path.join(self.layout.root, "sandboxes"), SANDBOX_RECORD, SandboxRecord):
            try:
                name = sandbox_name(decode_pb(api_pb2.PodSandboxConfig, record.config))
            except Exception as e:  # base64 or protobuf decoding: a corrupt record
                log.error("pod sandbox %s: unreadable config in its record: %s", record.id, e)
                continue
            self._recovered(self._sandboxes, record, name, "pod sandbox")
        for crecord in _load_all(os.path.join(self.layout.root, "containers"), CONTAINER_RECORD, ContainerRecord):
            try:
                name = container_name(crecord.sandbox_id, decode_pb(api_pb2.ContainerConfig, crecord.config))
            except Exception as e:
                log.error("container %s: unreadable config in its record: %s", crecord.id, e)
                continue
            self._recovered(self._containers, crecord, name, "container")

    def _recovered(self, index: dict, record: SandboxRecord | ContainerRecord, name: str, what: str) -> None:
        try:
            self.reserve(name, record.id, what)
        except AlreadyExistsError as e:  # two records claim one name: both stay visible, for removal
            log.error("%s %s: %s", what, record.id, e)
        with self._mutex:
            index[record.id] = record


def _load_all(directory: str, filename: str, cls: type[R]) -> list[R]:
    try:
        ids = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    out = []
    for object_id in ids:
        path = os.path.join(directory, object_id, filename)
        try:
            out.append(cls.load(path))
        except FileNotFoundError:
            log.warning("%s: no record; a half-made object from before a crash, left for removal", path)
        except PyRuntimeError as e:
            log.error("%s", e)
    return out
