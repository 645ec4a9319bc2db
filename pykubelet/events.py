"""Events: what `kubectl describe pod` and `kubectl get events` show of the kubelet's work (Pulling,
Pulled, Created, Started, BackOff, Unhealthy, Killing, a rejected pod's reason) and of the node's
(Starting, NodeReady / NodeNotReady and the pressure conditions' transitions, in namespace default).

Recording an event must never slow or fail a pod sync: `event()` only queues it, and one thread sends
it, dropping it (with a log line) if the API server refuses or is away; events are best effort in the
stock kubelet too. What each event becomes (a new object, a patch of the count of a like one, nothing) is
eventcorrelator.py's decision, so a crash-looping container cannot flood the API server or etcd.
"""
from __future__ import annotations

import datetime
import logging
import queue
import threading
import uuid

from pykubelet.api.podmodel import Pod
from pykubelet.eventcorrelator import EventCorrelator

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
COMPONENT = "kubelet"
QUEUE_SIZE = 1000


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_ref(pod: Pod, container: str | None = None) -> dict:
    """The involvedObject of an event about `pod`, or about one of its containers."""
    meta = pod.metadata
    ref = {"apiVersion": "v1", "kind": "Pod", "name": meta.name, "namespace": meta.namespace, "uid": meta.uid}
    if meta.resource_version:
        ref["resourceVersion"] = meta.resource_version
    if container is not None:
        ref["fieldPath"] = pod.field_path(container)
    return ref


def node_ref(node_name: str) -> dict:
    """The involvedObject of an event about the node (the kubelet's nodeRef: the name is the uid)."""
    return {"kind": "Node", "name": node_name, "uid": node_name}


class EventRecorder:
    """Sends the kubelet's events as `source.component=kubelet, source.host=NODE`."""

    def __init__(self, client, node_name: str) -> None:
        self.client, self.node_name = client, node_name
        self._queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self._correlator = EventCorrelator()
        self._thread: threading.Thread | None = None

    def event(self, ref: dict, type_: str, reason: str, message: str) -> None:
        """Queues one event about `ref` (see pod_ref); never blocks and never raises. Without an API client
        (standalone mode) the event is only logged."""
        if self.client is None:
            log.log(logging.WARNING if type_ == WARNING else logging.INFO, "event %s %s/%s: %s: %s", type_,
                    ref.get("namespace"), ref.get("name"), reason, message)
            return
        try:
            self._queue.put_nowait((ref, type_, reason, message, _now()))
        except queue.Full:
            log.warning("event queue full: dropped %s %s: %s", type_, reason, message)

    def run(self, stop: threading.Event) -> None:
        """Sends queued events until `stop`."""
        while not stop.is_set():
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._send(*item)
            except Exception as e:  # the API server's answer must not end the loop
                log.info("event %s %s not recorded: %s", item[1], item[2], e)

    def start(self, stop: threading.Event) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, args=(stop,), name="events", daemon=True)
        self._thread.start()
        return self._thread

    def _send(self, ref: dict, type_: str, reason: str, message: str, when: datetime.datetime) -> None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Event
        from lightkube.types import PatchType

        decision = self._correlator.correlate(ref, type_, reason, message, when)
        if decision is None:
            log.debug("event %s %s about %s dropped by the spam filter", type_, reason, ref.get("name"))
            return
        if decision.name is not None:
            try:
                self.client.patch(Event, decision.name, {"count": decision.count, "lastTimestamp": _stamp(when),
                                                         "message": decision.message},
                                  namespace=decision.namespace, patch_type=PatchType.MERGE)
                return
            except ApiError as e:  # gone (the API server's event TTL): made again, as client-go does
                if e.status.code != 404:
                    raise
        namespace = ref.get("namespace") or "default"
        name = f"{ref['name']}.{uuid.uuid4().hex[:16]}"
        self.client.create(Event.from_dict({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
            "involvedObject": ref, "type": type_, "reason": reason, "message": decision.message,
            "source": {"component": COMPONENT, "host": self.node_name}, "count": decision.count,
            "firstTimestamp": _stamp(when), "lastTimestamp": _stamp(when),
            "reportingComponent": COMPONENT, "reportingInstance": self.node_name}), namespace=namespace)
        self._correlator.made(decision, name, namespace)
