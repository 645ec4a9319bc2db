"""Who is asking the kubelet's HTTPS server: the identity is taken from, in turn, a client certificate
the TLS layer verified against --client-ca-file (CN the user, O the groups: the API server's kubelet
client cert says kube-apiserver-kubelet-client), a bearer token the API server vouches for through a
TokenReview (webhook authentication), or, only when authentication.anonymous.enabled, system:anonymous.
Anything else gets 401: a kubelet runs commands in containers and must not answer strangers.

Token reviews are cached: a kubectl exec session sends one request, but /metrics scrapers send many. An
authenticated token for authentication.webhook.cacheTTL (2 min, as the kubelet), a refused one for at
most UNAUTHENTICATED_TTL, so a token the API server starts to accept works soon. The cache holds at most
MAX_TOKENS tokens, least recently used first out (ttlcache.py): every distinct token a client sends is a
new key. Only the token's hash is kept. A review that fails (API server away) refuses the request and is
not cached.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pykubelet.server.ttlcache import TTLCache

log = logging.getLogger("pykubelet.server")

ANONYMOUS = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED_TTL = 30.0
MAX_TOKENS = 4096


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


def from_certificate(peercert: dict | None) -> User | None:
    """The user of a verified client certificate (ssl.SSLSocket.getpeercert()); None: there was none."""
    if not peercert:
        return None
    names = [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]
    groups = [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "organizationName"]
    if not names:
        return None
    return User(names[-1], tuple(groups) + (AUTHENTICATED,))


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Authenticator:
    """`client` is the kubelet's lightkube client (None in standalone mode: tokens cannot be checked)."""

    def __init__(self, client, *, anonymous: bool, webhook: bool, cache_ttl: float = 120.0,
                 unauthenticated_ttl: float = UNAUTHENTICATED_TTL, max_tokens: int = MAX_TOKENS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.anonymous, self.webhook = client, anonymous, webhook
        self.ttl = {True: cache_ttl, False: min(cache_ttl, unauthenticated_ttl)}
        self._cache: TTLCache[User | None] = TTLCache(max_tokens, clock)

    def authenticate(self, peercert: dict | None, authorization: str | None) -> User | None:
        """The request's user, or None for 401."""
        user = from_certificate(peercert)
        if user is not None:
            return user
        token = bearer_token(authorization)
        if token is not None:
            return self._token(token) if self.webhook and self.client is not None else None
        return User(ANONYMOUS, (UNAUTHENTICATED,)) if self.anonymous else None

    def _token(self, token: str) -> User | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit, cached = self._cache.get(key)
        if hit:
            return cached
        try:
            user = self._review(token)
        except Exception as e:  # any failure of the review refuses; the cause goes to the log
            log.warning("TokenReview: %s", e)
            return None
        self._cache.put(key, user, self.ttl[user is not None])
        return user

    def _review(self, token: str) -> User | None:
        from lightkube.models.authentication_v1 import TokenReviewSpec
        from lightkube.resources.authentication_v1 import TokenReview

        review = self.client.create(TokenReview(spec=TokenReviewSpec(token=token)))
        status = review.status
        if status is None or not status.authenticated or status.user is None or not status.user.username:
            return None
        u = status.user
        return User(u.username, tuple(u.groups or ()), u.uid or "", dict(u.extra or {}))
