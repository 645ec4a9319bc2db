"""The kubelet's API client: one lightkube Client built from --kubeconfig, shared by every part.

The kubelet talks to the API server as `system:node:NAME` (its client certificate), so what it may do is
exactly what the Node authorizer and NodeRestriction allow: its own Node and Lease, pods bound to it,
and the secrets/configmaps those pods name. Changes go out as patches under one field manager, so a
kubectl or a controller writing the same object keeps its own fields.
"""
from __future__ import annotations

from pathlib import Path

FIELD_MANAGER = "pykubelet"


def make_client(kubeconfig: Path, timeout: float = 30.0):
    """A lightkube Client for `kubeconfig`'s current context; `timeout` bounds each request's connect and
    each read (a watch has its own read timeout: informer.WATCH_READ_TIMEOUT)."""
    import httpx2
    from lightkube import Client, KubeConfig

    config = KubeConfig.from_file(kubeconfig)
    return Client(config, timeout=httpx2.Timeout(timeout), field_manager=FIELD_MANAGER, trust_env=False)
