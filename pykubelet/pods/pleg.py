"""The pod lifecycle event generator: how a pod worker learns that something changed in the runtime
(a container exited, a sandbox died), so it syncs the pod at once instead of at the next resync.

Event-driven where the runtime can: CRI GetContainerEvents (pyruntime-cri has it; containerd 1.6 answers
Unimplemented) names the pod of each change, so a container's start or exit reaches its worker within
milliseconds. A relist (ListPodSandbox + ListContainers, compared with the previous one) runs beside it as
the safety net for events lost while the stream reconnects, every `relist_period` seconds, or every
`fallback_period` when there is no stream. It only enqueues pod UIDs; the worker reads the runtime itself,
so a duplicate or a stale event costs one idempotent sync and nothing else. A slow or failing runtime
slows this loop and nothing more: the node's Ready condition does not depend on it.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pykubelet import runtime as cri
from pykubelet.pods.labels import POD_UID

log = logging.getLogger(__name__)

class PLEG:
    def __init__(self, runtime: cri.CRIRuntime, enqueue: Callable[[str], None], *, relist_period: float = 10.0,
                 fallback_period: float = 1.0, beat: Callable[[], None] = lambda: None) -> None:
        self.runtime, self.enqueue, self.beat = runtime, enqueue, beat
        self.relist_period, self.fallback_period = relist_period, fallback_period
        self.streaming = threading.Event()  # the event stream is up
        self._last: dict[str, tuple[str, int]] = {}  # sandbox or container id -> (pod uid, state)

    def relist(self) -> set[str]:
        """Enqueues the pods whose sandboxes or containers changed since the last relist; returns them."""
        now: dict[str, tuple[str, int]] = {}
        for s in self.runtime.list_pod_sandbox():
            now["s:" + s.id] = (s.labels.get(POD_UID, ""), s.state)
        for c in self.runtime.list_containers():
            now["c:" + c.id] = (c.labels.get(POD_UID, ""), c.state)
        changed = {uid for key, (uid, state) in now.items() if self._last.get(key) != (uid, state)}
        changed |= {uid for key, (uid, _) in self._last.items() if key not in now}
        self._last = now
        changed.discard("")
        for uid in changed:
            self.enqueue(uid)
        return changed

    def watch_events(self, stop: threading.Event) -> None:
        """Follows GetContainerEvents until `stop`; returns at once (relist only) if the runtime has none."""
        delay = 0.5
        while not stop.is_set():
            try:
                for event in self.runtime.container_events():
                    self.streaming.set()
                    delay = 0.5
                    uid = event.pod_sandbox_status.labels.get(POD_UID) or next(
                        (s.labels.get(POD_UID) for s in event.containers_statuses if s.labels.get(POD_UID)), "")
                    if uid:
                        self.enqueue(uid)
                    if stop.is_set():
                        return
            except cri.Unimplemented:
                log.info("the runtime has no GetContainerEvents: relisting every %.1f s", self.fallback_period)
                return
            except cri.CRIError as e:
                log.warning("container event stream: %s; reconnecting in %.1f s", e, delay)
            self.streaming.clear()
            stop.wait(delay)
            delay = min(delay * 2, 10.0)

    def run(self, stop: threading.Event) -> None:
        events = threading.Thread(target=self.watch_events, args=(stop,), name="pleg-events", daemon=True)
        events.start()
        while not stop.is_set():
            self.beat()
            try:
                self.relist()
            except cri.CRIError as e:
                log.warning("relist: %s", e)
            stop.wait(self.relist_period if self.streaming.is_set() else self.fallback_period)
        events.join(timeout=5)
