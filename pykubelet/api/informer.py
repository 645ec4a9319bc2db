"""List+watch informers: the kubelet's only way of learning about API objects. Watch, never poll.

An informer lists once (the cache and a resourceVersion), then watches from that version, so it sees
every change exactly in order without re-reading what it has. What can go wrong, and what it does:
- the watch ends (server timeout, connection dropped): it watches again from the last resourceVersion it
  saw, which BOOKMARK events (allowWatchBookmarks) keep fresh even when nothing of ours changes;
- the watch goes silent (a half-open connection: the API server or a middlebox gone without a FIN, which
  would freeze the informer for good while the lease keeps the node Ready): the server sends a BOOKMARK
  on every quiet watch each minute, so a watch that hears nothing for WATCH_READ_TIMEOUT is dropped and
  watched again, as a failed one;
- the version is too old for the server (410 Gone, "expired"): it lists again and turns the difference
  between the old cache and the new list into add/update/delete events, so a deletion missed while away
  is still delivered;
- the API server is away: it retries with exponential back-off and jitter (0.8 s doubling to 30 s, as
  client-go's reflector) so a fleet of kubelets does not stampede a returning API server, and the cache
  keeps serving the last known state meanwhile (running pods keep running).

Objects are lightkube models (`lightkube.resources.core_v1.Pod`, `.Node` ...), read-only by convention:
the cache hands out the same instances to every reader; copy before changing one. Keys are
"namespace/name" (just "name" for cluster-scoped objects), the keys handlers enqueue into a WorkQueue.
Handlers run on the informer's thread and must be quick (enqueue a key, nothing more).

The watch source is an interface (list() and watch(rv)) so the 410 and bookmark logic is unit-tested
against a fake; LightkubeSource is the real one.
"""
from __future__ import annotations

import json
import logging
import random
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

from pykubelet.errors import FailedPreconditionError

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"
# twice the API server's bookmark period on a quiet watch: a live watch never waits this long for a line
WATCH_READ_TIMEOUT = 120.0


class Gone(FailedPreconditionError):
    """The watch's resourceVersion is older than the server keeps (HTTP 410): list again."""


class WatchSource(Protocol):
    def list(self) -> tuple[str, list[Any]]:
        """(the list's resourceVersion, the objects)."""
        ...

    def watch(self, resource_version: str) -> Iterator[tuple[str, Any]]:
        """(event type, object) from `resource_version` on; raises Gone on 410, anything else on failure;
        returns when the server ends the watch."""
        ...


def key_of(obj: Any) -> str:
    meta = obj.metadata
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


Handler = Callable[[str, Any, Any], None]  # (ADDED|MODIFIED|DELETED, old or None, new or the deleted object)


class Informer:
    def __init__(self, source: WatchSource, *, name: str = "", backoff_base: float = 0.8, backoff_cap: float = 30.0,
                 rand: Callable[[], float] = random.random) -> None:
        self.source, self.name = source, name
        self.backoff_base, self.backoff_cap, self._rand = backoff_base, backoff_cap, rand
        self.resource_version = ""
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._handlers: list[Handler] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0  # consecutive failed list/watch attempts

    # --- the cache --------------------------------------------------------------------------------

    def get(self, key: str) -> Any | None:
        with self._lock:
            return self._cache.get(key)

    def objects(self) -> list[Any]:
        with self._lock:
            return list(self._cache.values())

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._cache)

    def add_handler(self, handler: Handler) -> None:
        """Add before start(): a handler added later misses what is already cached."""
        self._handlers.append(handler)

    def enqueue_into(self, queue) -> None:
        """Every change puts the object's key into `queue` (a WorkQueue)."""
        self.add_handler(lambda _kind, _old, new: queue.add(key_of(new)))

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    # --- running ----------------------------------------------------------------------------------

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the loop and ends the open watch (a source with close() drops its connection)."""
        self._stop.set()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for the thread after stop(); True if it ended."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def backoff(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failures: base doubling to the cap, plus up to 100%
        jitter."""
        delay = min(self.backoff_cap, self.backoff_base * 2 ** (failures - 1))
        return delay * (1 + self._rand())

    def run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                self._watch()
            except Gone:
                log.info("informer %s: resourceVersion %s expired, listing again", self.name, self.resource_version)
                need_list = True
            except Exception as e:
                if self._stop.is_set():
                    return
                self.failures += 1
                delay = self.backoff(self.failures)
                log.warning("informer %s: %s: %s; retrying in %.1f s", self.name, "list" if need_list else "watch",
                            e, delay)
                self._stop.wait(delay)

    def _relist(self) -> None:
        rv, items = self.source.list()
        fresh = {key_of(o): o for o in items}
        with self._lock:
            old = self._cache
            self._cache = dict(fresh)
            self.resource_version = rv
        self.failures = 0
        for key, obj in old.items():
            if key not in fresh:
                self._notify(DELETED, obj, obj)
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._notify(ADDED, None, obj)
            elif before.metadata.resourceVersion != obj.metadata.resourceVersion:
                self._notify(MODIFIED, before, obj)
        self._synced.set()

    def _watch(self) -> None:
        for kind, obj in self.source.watch(self.resource_version):
            self.failures = 0
            rv = obj.metadata.resourceVersion
            if kind == BOOKMARK:
                self.resource_version = rv
            elif kind in (ADDED, MODIFIED, DELETED):
                key = key_of(obj)
                with self._lock:
                    old = self._cache.get(key)
                    if kind == DELETED:
                        self._cache.pop(key, None)
                    else:
                        self._cache[key] = obj
                    self.resource_version = rv
                self._notify(kind, old, obj)
            if self._stop.is_set():
                return

    def _notify(self, kind: str, old: Any, new: Any) -> None:
        if kind != DELETED:
            kind = MODIFIED if old is not None else ADDED
        for handler in self._handlers:
            try:
                handler(kind, old, new)
            except Exception:
                log.exception("informer %s: handler failed on %s %s", self.name, kind, key_of(new))


@dataclass(frozen=True)
class Bookmark:
    """What a BOOKMARK event carries: only metadata.resourceVersion is meaningful."""
    metadata: Any


def decode_event(line: bytes, resource: type) -> tuple[str, Any]:
    """One line of a watch stream as (type, object). A BOOKMARK's object is an empty object of the kind
    (the API server sends a Pod's with `spec.containers: null`, which the typed model refuses), so only
    its resourceVersion is read; an ERROR raises Gone (410) or ApiError."""
    from lightkube.core import decoders
    from lightkube.core.exceptions import ApiError

    event = decoders.decode_watch_event(line)
    if event.type == "ERROR":
        status = decoders.decode_status(event.object)
        if status.code == 410:
            raise Gone(status.message or "expired")
        raise ApiError(status=status)
    if event.type == BOOKMARK:
        meta = (json.loads(bytes(event.object)) or {}).get("metadata") or {}
        return BOOKMARK, Bookmark(SimpleNamespace(resourceVersion=meta.get("resourceVersion", "")))
    return event.type, decoders.decode_object(event.object, resource)


class LightkubeSource:
    """list and watch of one resource type through a lightkube Client, with allowWatchBookmarks."""

    def __init__(self, client, resource: type, *, namespace: str | None = None,
                 fields: dict[str, Any] | None = None, labels: dict[str, Any] | None = None,
                 timeout_seconds: int | None = None, read_timeout: float = WATCH_READ_TIMEOUT) -> None:
        self.client, self.resource = client, resource
        self.namespace, self.fields, self.labels = namespace, fields, labels
        # the server ends each watch after this, as client-go's reflector asks (5 to 10 minutes, spread)
        self.timeout_seconds = timeout_seconds or int(300 * (1 + random.random()))
        self.read_timeout = read_timeout  # the longest silence of an open watch (lightkube's has none)
        self._response: Any = None  # the open watch, for close()

    def close(self) -> None:
        """Ends the open watch: its socket is shut down, so the reader blocked on it sees the end at once
        (closing the response object would wait for that reader)."""
        response = self._response
        stream = response.extensions.get("network_stream") if response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def _scope(self) -> dict[str, Any]:
        from lightkube.core.resource import NamespacedResource
        if issubclass(self.resource, NamespacedResource):
            return {"namespace": self.namespace or "*"}
        return {}

    def list(self) -> tuple[str, list[Any]]:
        it = self.client.list(self.resource, fields=self.fields, labels=self.labels, chunk_size=500, **self._scope())
        items = list(it)
        return it.resourceVersion, items

    def watch(self, resource_version: str) -> Iterator[tuple[str, Any]]:
        import httpx2
        from lightkube.core.selector import build_selector

        generic = self.client._client  # lightkube's Client.watch() has no allowWatchBookmarks parameter
        br = generic.prepare_request("list", res=self.resource, watch=True, params={
            "timeoutSeconds": self.timeout_seconds, "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "labelSelector": build_selector(self.labels) if self.labels else None,
            "fieldSelector": build_selector(self.fields, for_fields=True) if self.fields else None,
        }, **self._scope())
        timeout = generic._watch_timeout
        timeout = httpx2.Timeout(connect=timeout.connect, read=self.read_timeout, write=timeout.write,
                                 pool=timeout.pool)
        req = generic._client.build_request(br.method, br.url, params=br.params, timeout=timeout)
        resp = self._response = generic.send(req, stream=True)
        try:
            if resp.status_code == 410:
                raise Gone(f"watch from resourceVersion {resource_version}")
            generic.raise_for_status(resp)
            for line in resp.iter_lines():
                yield decode_event(line, self.resource)
        finally:
            self._response = None
            resp.close()


def pod_informer(client, node_name: str) -> Informer:
    """The pods bound to this node, selected by the server (`spec.nodeName=NAME`, which the Node
    authorizer requires of a node's pod list and watch)."""
    from lightkube.resources.core_v1 import Pod
    return Informer(LightkubeSource(client, Pod, fields={"spec.nodeName": node_name}), name="pods")


def node_informer(client, node_name: str) -> Informer:
    """This node's own Node object (its podCIDR, taints, labels set by others)."""
    from lightkube.resources.core_v1 import Node
    return Informer(LightkubeSource(client, Node, fields={"metadata.name": node_name}), name="node")


def service_informer(client) -> Informer:
    """Every Service (the Node authorizer lets a node list and watch them): the pods' service env vars."""
    from lightkube.resources.core_v1 import Service
    return Informer(LightkubeSource(client, Service), name="services")
