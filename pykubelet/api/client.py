"""The kubelet's API client: one lightkube Client built from --kubeconfig, shared by every part.

The kubelet talks to the API server as `system:node:NAME` (its client certificate), so what it may do is
exactly what the Node authorizer and NodeRestriction allow: its own Node and Lease, pods bound to it,
and the secrets/configmaps those pods name. Changes go out as patches under one field manager, so a
kubectl or a controller writing the same object keeps its own fields.

Its connections go through a ReloadingTransport, so a rotated client certificate takes effect without a
restart: reload() builds a new TLS context from the kubeconfig's files (the current pem the rotation just
pointed elsewhere), sends every new request through it, and closes the connections made with the old one,
as the stock kubelet's closeAllConns does. An idle connection goes at once; a watch blocked reading on one
fails at its next read (a bookmark comes each minute, informer.py) and the informer reconnects with the new
certificate, so no long-lived connection keeps the old one.
"""
from __future__ import annotations

import ssl
import threading
from pathlib import Path

import httpx2

FIELD_MANAGER = "pykubelet"
# the API server did not answer (refused, reset, timed out): the kubelet retries, and says so in a line, not a
# stack trace, since the API server may be one of its own static pods that has not started yet
Unreachable = httpx2.TransportError


def load_kubeconfig(path: Path):
    """`path`'s current context (lightkube's SingleConfig), with a user; ValueError when there is none."""
    from lightkube import KubeConfig

    config = KubeConfig.from_file(path).get()
    if config is None or config.user is None:
        raise ValueError(f"{path}: no current context with a user")
    return config


class ReloadingTransport(httpx2.BaseTransport):
    """An HTTP transport whose TLS client credentials can be swapped while requests run."""

    def __init__(self, kubeconfig: Path, cert_file: Path | None = None) -> None:
        self.kubeconfig, self.cert_file = kubeconfig, cert_file
        self._lock = threading.Lock()
        self._current = httpx2.HTTPTransport(verify=self._context())

    def _context(self) -> ssl.SSLContext:
        """The kubeconfig's TLS context (its CA, its client pair read now); `cert_file`, a pem with the
        certificate and its key, replaces the kubeconfig's client pair when set (a rotated certificate of a
        kubelet whose kubeconfig names fixed files)."""
        from lightkube.config.client_adapter import verify_cluster

        config = load_kubeconfig(self.kubeconfig)
        ctx = verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False)
        if self.cert_file is not None:
            ctx.load_cert_chain(self.cert_file, self.cert_file)
        return ctx

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        with self._lock:
            current = self._current
        return current.handle_request(request)

    def reload(self, cert_file: Path | None = None) -> None:
        """New connections use the credentials on disk now (or `cert_file`); the old connections close."""
        if cert_file is not None:
            self.cert_file = cert_file
        fresh = httpx2.HTTPTransport(verify=self._context())
        with self._lock:
            old, self._current = self._current, fresh
        old.close()

    def close(self) -> None:
        with self._lock:
            current = self._current
        current.close()


def make_client(kubeconfig: Path, timeout: float = 30.0, transport: httpx2.BaseTransport | None = None):
    """A lightkube Client for `kubeconfig`'s current context; `timeout` bounds each request's connect and
    each read (a watch has its own read timeout: informer.WATCH_READ_TIMEOUT). `transport`: a
    ReloadingTransport of the same kubeconfig when the client certificate rotates."""
    from lightkube import Client, KubeConfig

    config = KubeConfig.from_file(kubeconfig)
    return Client(config, timeout=httpx2.Timeout(timeout), field_manager=FIELD_MANAGER, trust_env=False,
                  transport=transport)
