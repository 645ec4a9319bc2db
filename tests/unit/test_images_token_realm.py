"""A registry's Bearer challenge names the token realm the client sends its credentials to: a registry (or a
man in the middle of its plain HTTP) that names an http:// realm elsewhere would get the node's password in
clear. Basic credentials go to a realm only over HTTPS or to a loopback host; an anonymous token request may
go anywhere. A recording session stands in for the network: the refusal comes before any request, so no
test traffic leaves loopback (tests/integration/test_images_registry.py pulls through a real token server)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pyruntime.images.registry import AuthError, _Auth
from pyruntime.images.request import Credentials

REGISTRY = "http://127.0.0.1:5000"
SCOPE = "repository:private/app:pull"


class Session:
    def __init__(self) -> None:
        self.gets: list[tuple[str, object]] = []

    def get(self, url: str, *, auth=None, **_kw):
        self.gets.append((url, auth))
        return SimpleNamespace(status_code=200, json=lambda: {"token": "t0ken"})


def challenge(realm: str) -> SimpleNamespace:
    return SimpleNamespace(headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="reg",scope="{SCOPE}"'})


@pytest.mark.parametrize("realm", ["http://token.example/token", "http://10.0.0.7:8080/token",
                                   "ftp://token.example/token", "//token.example/token"])
def test_credentials_never_go_to_a_plain_http_realm_elsewhere(realm):
    auth, session = _Auth(Credentials("alice", "n0de-s3cret")), Session()
    with pytest.raises(AuthError, match="neither HTTPS nor loopback") as e:
        auth.challenge(session, REGISTRY, SCOPE, challenge(realm), verify=True)  # type: ignore[arg-type] # fakes
    assert session.gets == [] and "n0de-s3cret" not in str(e.value)


@pytest.mark.parametrize("realm", ["https://token.example/token", "http://127.0.0.1:5001/token",
                                   "http://localhost:5001/token", "http://[::1]:5001/token"])
def test_credentials_go_to_an_https_or_loopback_realm(realm):
    auth, session = _Auth(Credentials("alice", "n0de-s3cret")), Session()
    auth.challenge(session, REGISTRY, SCOPE, challenge(realm), verify=True)  # type: ignore[arg-type] # fakes
    assert session.gets == [(realm, ("alice", "n0de-s3cret"))]
    assert auth.header(REGISTRY, SCOPE) == {"Authorization": "Bearer t0ken"}


def test_an_anonymous_token_request_may_go_to_any_realm():
    auth, session = _Auth(None), Session()
    auth.challenge(session, REGISTRY, SCOPE, challenge("http://token.example/token"),  # type: ignore[arg-type] # fakes
                   verify=True)
    assert session.gets == [("http://token.example/token", None)]
