"""Registering the Node: the object that makes this machine schedulable.

Runs first at start-up and retries with back-off until the API server takes it (it may start after the
kubelet). A Node that already exists (a kubelet restart, or a re-install on a host of the same name) is
adopted: its labels are brought back to what this kubelet sets, nothing else of it is touched (the taints
of --register-with-taints go on a Node this kubelet creates, as the stock kubelet's), and the status loop
overwrites its status. NodeRestriction lets `system:node:NAME` create and patch only the Node NAME, and
only these labels (kubernetes.io/*, not node-role, and --node-labels, which the settings let through only
in the namespaces a kubelet may set), which is all this does.
"""
from __future__ import annotations

import logging
import random
import threading

from pykubelet.config import Settings
from pykubelet.node.status import ARCH, NodeStatus

log = logging.getLogger(__name__)


def labels(settings: Settings) -> dict[str, str]:
    return {**settings.node_labels, "kubernetes.io/hostname": settings.node_name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": ARCH, "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": ARCH}


def register(client, settings: Settings, status: NodeStatus, stop: threading.Event,
             backoff_cap: float = 7.0) -> bool:
    """Creates (or adopts) the Node, then reports its status; False if `stop` was set before it could."""
    from lightkube.core.exceptions import ApiError
    from lightkube.models.core_v1 import NodeSpec, Taint
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node
    from lightkube.types import PatchType

    attempt = 0
    while not stop.is_set():
        try:
            node = Node(metadata=ObjectMeta(name=settings.node_name, labels=labels(settings), annotations={
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}),
                spec=NodeSpec(taints=[Taint(key=t["key"], value=t["value"], effect=t["effect"])
                                      for t in settings.register_with_taints] or None))
            try:
                client.create(node)
                log.info("registered node %s", settings.node_name)
            except ApiError as e:
                if e.status.code != 409:
                    raise
                client.patch(Node, settings.node_name, {"metadata": {"labels": labels(settings)}},
                             patch_type=PatchType.STRATEGIC)
                log.info("node %s already registered: adopted", settings.node_name)
            status.update(force=True)
            return True
        except Exception as e:
            attempt += 1
            delay = min(backoff_cap, 0.1 * 2 ** attempt) * (1 + random.random())
            log.warning("registering node %s failed: %s; retrying in %.1f s", settings.node_name, e, delay)
            stop.wait(delay)
    return False
