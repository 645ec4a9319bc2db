"""The desired pods of this node, from every source the kubelet has: the API server (pods bound to the node)
and the static pod manifests, behind one informer-shaped view that the pod workers read.

Mirror pods are the API server's picture of static pods, not pods to run: they are left out here (the
static pod is what runs; MirrorPods in pykubelet/pods/static.py keeps them), so a static pod runs once
whether or not its mirror exists, and deleting the mirror never stops it. A static pod and its mirror
share a key ("namespace/name"); the static pod is what `get` answers.
"""
from __future__ import annotations

from typing import Any

from pykubelet.api.informer import Handler
from pykubelet.pods.static import is_mirror


class PodSources:
    """`api`: the pod informer (None in standalone mode); `static`: StaticPods (None without a manifest
    path). The same reading interface as an Informer."""

    def __init__(self, api=None, static=None) -> None:
        self.api, self.static = api, static
        self.sources = [s for s in (static, api) if s is not None]

    def add_handler(self, handler: Handler) -> None:
        if self.static is not None:
            self.static.add_handler(handler)
        if self.api is not None:
            def not_mirror(kind: str, old: Any, new: Any) -> None:
                if not is_mirror(new):
                    handler(kind, old, new)
            self.api.add_handler(not_mirror)

    def get(self, key: str) -> Any | None:
        if self.static is not None:
            pod = self.static.get(key)
            if pod is not None:
                return pod
        if self.api is not None:
            pod = self.api.get(key)
            if pod is not None and not is_mirror(pod):
                return pod
        return None

    def objects(self) -> list[Any]:
        static = self.static.objects() if self.static is not None else []
        api = [p for p in self.api.objects() if not is_mirror(p)] if self.api is not None else []
        return static + api

    def has_synced(self) -> bool:
        return all(s.has_synced() for s in self.sources)

    def wait_synced(self, timeout: float | None = None) -> bool:
        return all(s.wait_synced(timeout) for s in self.sources)
