"""The node's pod CIDR handed to the runtime, as the stock kubelet's updatePodCIDR does.

Whoever gives the Node its spec.podCIDRs (the controller manager's allocator, or the lab's provisioning, which
makes the Node first) does so after or around registration, so the kubelet learns them from its own Node and
passes them on with CRI UpdateRuntimeConfig: containerd renders its CNI config template from them
(conf_template), pyruntime-cri records them (its verbose Status shows them). Dual-stack CIDRs go as one
comma-separated string, as the kubelet sends them.

Level-triggered: every change of the Node wakes the loop, which compares the Node's CIDRs with what the runtime
last accepted; a call that failed (the runtime down, restarting) is tried again at the next wake-up or after
`retry` seconds, so the runtime is told exactly once per change that reached it.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from pykubelet import runtime as cri

log = logging.getLogger(__name__)


def pod_cidrs(node: Any) -> str:
    """The Node's spec.podCIDRs joined by commas; its older single spec.podCIDR when only that is set."""
    spec = getattr(node, "spec", None)
    if spec is None:
        return ""
    return ",".join(spec.podCIDRs or ([spec.podCIDR] if spec.podCIDR else []))


class PodCIDR:
    def __init__(self, node_informer: Any, runtime: cri.CRIRuntime, node_name: str, retry: float = 10.0) -> None:
        self.node_informer, self.runtime, self.node_name, self.retry = node_informer, runtime, node_name, retry
        self.applied = ""  # what the runtime last accepted
        self.changed = threading.Event()  # set by a change of the Node, or by whoever stops the loop
        node_informer.add_handler(lambda _kind, _old, _new: self.changed.set())

    def sync(self) -> None:
        """UpdateRuntimeConfig when the Node's CIDRs differ from what the runtime has; raises CRIError."""
        want = pod_cidrs(self.node_informer.get(self.node_name))
        if want and want != self.applied:
            self.runtime.update_runtime_config(want)
            log.info("pod CIDR %s handed to the runtime", want)
            self.applied = want

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync()
            except cri.CRIError as e:
                log.warning("pod CIDR not handed to the runtime yet: %s", e)
            self.changed.wait(self.retry)
            self.changed.clear()
