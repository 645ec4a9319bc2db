"""The Node's pod CIDRs reach the runtime once per change, as the stock kubelet's updatePodCIDR: not before
the Node has them, again when they change, and again after a call that failed."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import grpc

from pykubelet.node.podcidr import PodCIDR, pod_cidrs
from pykubelet.runtime import CRIError
from tests.kit.fake_cri import FakeCRI


class NodeCache:
    """The informer's interface as PodCIDR uses it."""

    def __init__(self) -> None:
        self.node: SimpleNamespace | None = None
        self.handlers: list = []

    def get(self, key: str):
        return self.node if key == "node-1" else None

    def add_handler(self, handler) -> None:
        self.handlers.append(handler)

    def set(self, cidrs: list[str] | None, single: str | None = None) -> None:
        old, self.node = self.node, SimpleNamespace(spec=SimpleNamespace(podCIDRs=cidrs, podCIDR=single))
        for handler in self.handlers:
            handler("MODIFIED", old, self.node)


def sent(runtime: FakeCRI) -> list[str]:
    return [c[1] for c in runtime.calls if c[0] == "UpdateRuntimeConfig"]


def test_sent_once_per_change_and_not_before_there_is_one() -> None:
    cache, runtime = NodeCache(), FakeCRI()
    pod_cidr = PodCIDR(cache, runtime, "node-1")
    pod_cidr.sync()
    cache.set(None)
    pod_cidr.sync()
    assert sent(runtime) == []  # no Node yet, then a Node without CIDRs: nothing to say
    cache.set(["10.244.1.0/24", "fd00:10:244:1::/64"])
    pod_cidr.sync()
    pod_cidr.sync()
    assert sent(runtime) == ["10.244.1.0/24,fd00:10:244:1::/64"]  # dual-stack as one string, once
    cache.set(["10.244.2.0/24"])
    pod_cidr.sync()
    assert sent(runtime) == ["10.244.1.0/24,fd00:10:244:1::/64", "10.244.2.0/24"]


def test_a_failed_call_is_made_again() -> None:
    cache, runtime = NodeCache(), FakeCRI()
    pod_cidr = PodCIDR(cache, runtime, "node-1", retry=0.01)
    runtime.errors["UpdateRuntimeConfig"] = CRIError("UpdateRuntimeConfig", grpc.StatusCode.UNAVAILABLE,
                                                     "connection refused")
    cache.set(["10.244.1.0/24"])
    stop = threading.Event()
    loop = threading.Thread(target=pod_cidr.run, args=(stop,))
    loop.start()
    try:
        threading.Event().wait(0.05)
        assert runtime.pod_cidr == "" and pod_cidr.applied == ""
        del runtime.errors["UpdateRuntimeConfig"]
        for _ in range(200):
            if runtime.pod_cidr:
                break
            threading.Event().wait(0.01)
        assert runtime.pod_cidr == "10.244.1.0/24" and pod_cidr.applied == "10.244.1.0/24"
    finally:
        stop.set()
        loop.join(5)


def test_the_older_single_field_counts() -> None:
    assert pod_cidrs(SimpleNamespace(spec=SimpleNamespace(podCIDRs=None, podCIDR="10.244.3.0/24"))) == "10.244.3.0/24"
    assert pod_cidrs(None) == ""
