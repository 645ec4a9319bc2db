"""Who may do what on the kubelet's HTTPS server: each request becomes the kubelet's authorization
attributes (verb from the HTTP method, resource `nodes` named after this node, a subresource from the
path) and the API server decides through a SubjectAccessReview, so RBAC on nodes/proxy, nodes/stats,
nodes/metrics, nodes/log... governs the kubelet as it does the stock one.

Exec, attach, port-forward and run are `nodes/proxy` with verb `create` whatever the HTTP method: a
websocket upgrade is a GET, and reading `get` there would let a read-only role run commands in every
container of the node (the hole upstream closed the same way). /healthz and /pods are first checked
against their fine-grained subresources (nodes/healthz, nodes/pods, upstream's KubeletFineGrainedAuthz)
and fall back to nodes/proxy.

Decisions are cached as the kubelet does (authorized 5 min, unauthorized 30 s by default; the
KubeletConfiguration's authorization.webhook.cacheAuthorizedTTL / cacheUnauthorizedTTL), keyed by
everything the review is sent (user, uid, groups, extra, attributes): a denial must not hammer the API
server, and a new RoleBinding counts within the unauthorized TTL. A key without `extra` would hand one
user's decision to another who differs only there, and authorizers (webhooks, scopes of a token in
extra) do decide on it. A failed review denies (never allows) and is not cached.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from pykubelet.server.authn import User
from pykubelet.server.ttlcache import TTLCache

log = logging.getLogger("pykubelet.server")

VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
STREAMING = ("exec", "attach", "portForward", "run")  # path heads that run things in containers
# path head -> the subresources checked in turn (the first that allows wins)
SUBRESOURCES: dict[str, tuple[str, ...]] = {
    "stats": ("stats",), "metrics": ("metrics",), "logs": ("log",), "spec": ("spec",),
    "checkpoint": ("checkpoint",), "healthz": ("healthz", "proxy"), "pods": ("pods", "proxy"),
    "configz": ("configz", "proxy"),
}


@dataclass(frozen=True)
class Attributes:
    verb: str
    subresource: str
    name: str  # the node's name
    resource: str = "nodes"

    def describe(self, user: User) -> str:
        """Upstream's 403 text: the user and the check that failed."""
        return (f"Forbidden (user={user.name}, verb={self.verb}, resource={self.resource}, "
                f"subresource={self.subresource})")


def attributes(method: str, path: str, node: str) -> list[Attributes]:
    """The checks for `method path`, in order: the request is allowed when any of them allows it."""
    head = path.lstrip("/").split("/", 1)[0]
    if head in STREAMING:
        return [Attributes("create", "proxy", node)]
    verb = VERBS.get(method.upper(), method.lower())
    return [Attributes(verb, sub, node) for sub in SUBRESOURCES.get(head, ("proxy",))]


class Authorizer:
    """SubjectAccessReviews through the kubelet's lightkube client, or AlwaysAllow when `client` is None
    and the mode says so."""

    def __init__(self, client, mode: str, authorized_ttl: float = 300.0, unauthorized_ttl: float = 30.0) -> None:
        self.client, self.mode = client, mode
        self.ttl = {True: authorized_ttl, False: unauthorized_ttl}
        self._cache: TTLCache[bool] = TTLCache()

    def allowed(self, user: User, attrs: Attributes) -> bool:
        if self.mode == "AlwaysAllow":
            return True
        if self.client is None:
            return False  # Webhook without an API server: nobody can be checked, so nobody passes
        extra = tuple(sorted((k, tuple(v)) for k, v in user.extra.items()))
        key = (user.name, user.uid, tuple(sorted(user.groups)), extra, attrs)
        hit, cached = self._cache.get(key)
        if hit:
            return bool(cached)
        try:
            decision = self._review(user, attrs)
        except Exception as e:  # any failure of the review denies; the cause goes to the log
            log.warning("SubjectAccessReview for %s: %s", attrs.describe(user), e)
            return False
        self._cache.put(key, decision, self.ttl[decision])
        return decision

    def _review(self, user: User, attrs: Attributes) -> bool:
        from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
        from lightkube.resources.authorization_v1 import SubjectAccessReview

        review = self.client.create(SubjectAccessReview(spec=SubjectAccessReviewSpec(
            user=user.name, groups=list(user.groups), uid=user.uid or None, extra=user.extra or None,
            resourceAttributes=ResourceAttributes(verb=attrs.verb, resource=attrs.resource,
                                                  subresource=attrs.subresource, name=attrs.name,
                                                  group="", version="v1"))))
        return bool(review.status is not None and review.status.allowed)
