"""The node's heartbeat: a Lease kube-node-lease/NAME renewed every 10 s (a quarter of its 40 s duration).

The node lifecycle controller marks a node NotReady and evicts its pods when the Lease stops being
renewed, so the renewal is its own thread, independent of pod syncs and of the (rarely sent) node
status: a busy kubelet still heartbeats. The Lease is owned by the Node (ownerReference), so deleting
the Node collects it. A renewal that fails retries quickly (0.2 s doubling up to the renew interval)
rather than waiting a whole period, as the stock kubelet's lease controller does.
"""
from __future__ import annotations

import datetime
import logging
import threading

from pykubelet.config import Settings

log = logging.getLogger(__name__)
NAMESPACE = "kube-node-lease"


def micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeLease:
    def __init__(self, client, settings: Settings) -> None:
        self.client, self.settings = client, settings
        self.interval = settings.node_lease_duration_seconds / 4
        self._node_uid: str | None = None

    def renew(self) -> None:
        """Creates the Lease or moves its renewTime to now."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.coordination_v1 import Lease
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        name = self.settings.node_name
        if self._node_uid is None:
            self._node_uid = self.client.get(Node, name).metadata.uid
        spec = {"holderIdentity": name, "leaseDurationSeconds": self.settings.node_lease_duration_seconds,
                "renewTime": micro_time()}
        try:
            self.client.patch(Lease, name, {"spec": spec}, namespace=NAMESPACE, patch_type=PatchType.MERGE)
        except ApiError as e:
            if e.status.code != 404:
                raise
            self.client.create(Lease.from_dict({
                "metadata": {"name": name, "namespace": NAMESPACE, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node_uid}]},
                "spec": spec}))

    def run(self, stop: threading.Event) -> None:
        retry = 0.2
        while not stop.is_set():
            try:
                self.renew()
                retry = 0.2
                wait = self.interval
            except Exception as e:
                log.warning("renewing lease %s/%s failed: %s", NAMESPACE, self.settings.node_name, e)
                wait, retry = retry, min(retry * 2, self.interval)
            stop.wait(wait)
