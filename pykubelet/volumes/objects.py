"""The configMaps, secrets and service account tokens a pod's volumes and env take, read from the API
server as `system:node:NAME`.

The Node authorizer lets the node read only the objects its pods reference, and only once its graph
has seen the pod: a "forbidden" right after a pod appears is transient and surfaces as a retried error.
A token is requested through TokenRequest bound to the pod (NodeRestriction requires it: the token dies
with the pod) and kept until 80% of its life has passed, or 24 hours, as the kubelet's token manager;
each pod sync asks again, so a token is refreshed at most one sync period late.
"""
from __future__ import annotations

import base64
import datetime
import threading
import time
from dataclasses import dataclass

from pykubelet.api.podmodel import ObjectMeta, Pod
from pykubelet.errors import FailedPreconditionError

MAX_TOKEN_AGE = 24 * 3600


class ObjectError(FailedPreconditionError):
    """A configMap, secret or token could not be read (missing, refused, no API server): the pod waits
    until it can be; the message names it as the kubelet does."""


def _get(client, kind, kind_name: str, namespace: str, name: str):
    from lightkube.core.exceptions import ApiError

    if client is None:
        raise ObjectError(f"{kind_name} {namespace}/{name}: standalone mode (no --kubeconfig) has no API server "
                          "to read it from")
    try:
        return client.get(kind, name, namespace=namespace)
    except ApiError as e:
        if e.status.code == 404:
            return None
        raise ObjectError(f"{kind_name} {namespace}/{name}: {e.status.message}") from e


def config_map(client, namespace: str, name: str) -> dict[str, bytes] | None:
    """A configMap's data and binaryData as bytes by key; None if it does not exist."""
    from lightkube.resources.core_v1 import ConfigMap

    obj = _get(client, ConfigMap, "configmap", namespace, name)
    if obj is None:
        return None
    out = {k: v.encode() for k, v in (obj.data or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (obj.binaryData or {}).items()})
    return out


def secret(client, namespace: str, name: str) -> dict[str, bytes] | None:
    from lightkube.resources.core_v1 import Secret

    obj = _get(client, Secret, "secret", namespace, name)
    if obj is None:
        return None
    return {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}


def not_found(kind_name: str, name: str) -> ObjectError:
    return ObjectError(f'{kind_name} "{name}" not found')


@dataclass
class Token:
    token: str
    expires: float  # epoch seconds
    ttl: float  # the requested life, seconds

    def needs_refresh(self, now: float) -> bool:
        issued = self.expires - self.ttl
        return now > self.expires - 0.2 * self.ttl or now > issued + MAX_TOKEN_AGE


class TokenManager:
    """Service account tokens by (pod uid, namespace, account, audience, life)."""

    def __init__(self, client, clock=time.time) -> None:
        self.client, self.clock = client, clock
        self._tokens: dict[tuple, Token] = {}
        self._lock = threading.Lock()

    def get(self, pod: Pod, account: str, audience: str, expiration: int) -> str:
        meta = pod.metadata
        key = (meta.uid, meta.namespace, account, audience, expiration)
        now = self.clock()
        with self._lock:
            cached = self._tokens.get(key)
            for k in [k for k, t in self._tokens.items() if t.expires < now]:
                del self._tokens[k]
        if cached is not None and not cached.needs_refresh(now):
            return cached.token
        token = self._request(meta, account, audience, expiration)
        with self._lock:
            self._tokens[key] = token
        return token.token

    def forget(self, uid: str) -> None:
        with self._lock:
            for k in [k for k in self._tokens if k[0] == uid]:
                del self._tokens[k]

    def _request(self, meta: ObjectMeta, account: str, audience: str, expiration: int) -> Token:
        from lightkube.core.exceptions import ApiError
        from lightkube.models import meta_v1
        from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
        from lightkube.resources.core_v1 import ServiceAccountToken

        request = ServiceAccountToken(metadata=meta_v1.ObjectMeta(), spec=TokenRequestSpec(
            audiences=[audience] if audience else [], expirationSeconds=expiration,
            boundObjectRef=BoundObjectReference(kind="Pod", apiVersion="v1", name=meta.name, uid=meta.uid)))
        if self.client is None:
            raise ObjectError(f"failed to fetch token for service account {meta.namespace}/{account}: "
                              "standalone mode (no --kubeconfig) has no API server")
        try:
            answer = self.client.create(request, account, namespace=meta.namespace)
        except ApiError as e:
            raise ObjectError(f"failed to fetch token for service account {meta.namespace}/{account}: "
                              f"{e.status.message}") from e
        expires = answer.status.expirationTimestamp
        if isinstance(expires, str):
            expires = datetime.datetime.fromisoformat(expires.replace("Z", "+00:00"))
        ttl = float(answer.spec.expirationSeconds or expiration)
        return Token(answer.status.token, expires.timestamp(), ttl)
