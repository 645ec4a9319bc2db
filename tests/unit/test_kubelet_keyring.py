"""The pull-secret keyring matches credentials to images as the kubelet's (pkg/credentialprovider/keyring.go and
its tests): host globs by whole labels, the port exactly, a path prefix, most specific location first, Docker
Hub's `index.docker.io` entry for Hub images; and pull secrets parse as the kubelet parses them."""
from __future__ import annotations

import base64
import json

import pytest

from pykubelet.images.keyring import (
    Keyring,
    PullSecretError,
    RegistryAuth,
    is_default_registry,
    parse_secret,
    repository,
    urls_match,
)

ADA = RegistryAuth("ada", "smash")
GRACE = RegistryAuth("grace", "squash")


@pytest.mark.parametrize(("glob", "target", "match"), [
    ("*.kubernetes.io", "prefix.kubernetes.io", True),
    ("prefix.*.io", "prefix.kubernetes.io", True),
    ("prefix.kubernetes.*", "prefix.kubernetes.io", True),
    ("*-good.kubernetes.io", "prefix-good.kubernetes.io", True),
    ("*.kubernetes.io", "kubernetes.io", False),  # a glob label stands for exactly one label
    ("*.*.kubernetes.io", "prefix.kubernetes.io", False),
    ("*.kubernetes.io", "prefix.kubernetes.io.evil.example", False),
    ("kubernetes.io", "kubernetes.io.evil.example", False),
    ("prefix.*.io", "prefix.kubernetes.org", False),
    ("*.kubernetes.io/foo", "prefix.kubernetes.io/foo/bar", True),
    ("*.kubernetes.io/foo", "prefix.kubernetes.io/bar", False),
    ("*.kubernetes.io:1111", "prefix.kubernetes.io:1111", True),
    ("*.kubernetes.io:1111", "prefix.kubernetes.io:1112", False),  # the port must match
    ("*.kubernetes.io", "prefix.kubernetes.io:1111", False),
    ("prefix.kubernetes.io:1111", "prefix.kubernetes.io", False),
    ("127.0.0.1:5000", "127.0.0.1:5000/private/busybox", True),
    ("127.0.0.1:5000", "127.0.0.1:5001/private/busybox", False),
    ("127.0.0.1", "127.0.0.1:5000/private/busybox", False),
])
def test_urls_match(glob: str, target: str, match: bool) -> None:
    assert urls_match(glob, target) is match


@pytest.mark.parametrize(("repo", "want"), [
    ("bar.example.com", [ADA]),
    ("bar.example.com/pong", [GRACE, ADA]),  # the longer location first
    ("bar.example.com/ponger", [GRACE, ADA]),  # a string prefix, as the kubelet's
    ("bar.example.com/pong/pang", [GRACE, ADA]),
    ("bar.example.com/ping", [ADA]),
    ("example.com", []),
    ("foo.example.com", []),
    ("bar.example.com:5000/pong", []),
])
def test_lookup_most_specific_first(repo: str, want: list[RegistryAuth]) -> None:
    keyring = Keyring([{"bar.example.com/pong": GRACE, "bar.example.com": ADA}])
    assert keyring.lookup(repo) == want


def test_locations_with_a_scheme_and_api_version_mean_the_host() -> None:
    keyring = Keyring([{"https://quay.io/v1/": ADA, "http://registry.example/v2/team": GRACE}])
    assert keyring.lookup("quay.io/foo/bar") == [ADA]
    assert keyring.lookup("registry.example/team/app") == [GRACE]
    assert keyring.lookup("registry.example/other/app") == []


def test_several_secrets_for_one_location_are_all_tried_in_order() -> None:
    keyring = Keyring([{"r.example": ADA}, {"r.example": GRACE}, {"*.example": RegistryAuth("glob")}])
    assert keyring.lookup("r.example/app") == [ADA, GRACE, RegistryAuth("glob")]


def test_glob_location() -> None:
    keyring = Keyring([{"*.docker.io": ADA}])
    assert keyring.lookup("blah.docker.io/foo/bar") == [ADA]
    assert keyring.lookup("not.right.io/foo/bar") == []


@pytest.mark.parametrize(("image", "hit"), [
    ("docker.io/google/docker-registry", True),
    ("docker.io/library/jenkins", True),
    ("index.docker.io/google/docker-registry", True),
    ("quay.io/foo/bar", False),
    ("localhost:5000/foo", False),
])
def test_docker_hub_credentials_only_for_hub_images(image: str, hit: bool) -> None:
    keyring = Keyring([{"https://index.docker.io/v1/": ADA}])
    assert keyring.lookup(image) == ([ADA] if hit else [])


@pytest.mark.parametrize(("repo", "default"), [
    ("foo", True), ("foo/bar", True), ("docker.io/foo/bar", True), ("index.docker.io/foo", True),
    ("localhost/foo", True), ("localhost:5000/foo", False), ("gcr.io/foo", False), ("", False),
])
def test_is_default_registry(repo: str, default: bool) -> None:
    assert is_default_registry(repo) is default


@pytest.mark.parametrize(("image", "repo"), [
    ("busybox", "docker.io/library/busybox"),
    ("busybox:1.36", "docker.io/library/busybox"),
    ("team/app@sha256:" + "a" * 64, "docker.io/team/app"),
    ("127.0.0.1:5000/private/busybox:1", "127.0.0.1:5000/private/busybox"),
    ("localhost/app", "localhost/app"),
    ("quay.io/team/app:v1", "quay.io/team/app"),
])
def test_repository(image: str, repo: str) -> None:
    assert repository(image) == repo


def _json(obj: dict) -> dict[str, bytes]:
    return {".dockerconfigjson": json.dumps(obj).encode()}


def test_parse_dockerconfigjson_and_dockercfg() -> None:
    auth = base64.b64encode(b"alice:pw:with:colons").decode()
    config = {"auths": {"r.example": {"auth": auth, "username": "ignored"},
                        "t.example": {"identitytoken": "idt"}, "u.example": {"username": "bob", "password": "x"}}}
    parsed = parse_secret("regcred", "kubernetes.io/dockerconfigjson", _json(config))
    assert parsed == {"r.example": RegistryAuth("alice", "pw:with:colons"), "t.example": RegistryAuth(
        identity_token="idt"), "u.example": RegistryAuth("bob", "x")}
    legacy = parse_secret("old", "kubernetes.io/dockercfg", {".dockercfg": json.dumps(
        {"r.example": {"username": "carol", "password": "y"}}).encode()})
    assert legacy == {"r.example": RegistryAuth("carol", "y")}


def test_other_secret_types_give_no_credentials() -> None:
    config = _json({"auths": {"r.example": {"username": "a", "password": "b"}}})
    assert parse_secret("s", "Opaque", config) == {}
    assert parse_secret("s", "kubernetes.io/dockercfg", config) == {}  # the key of the other type
    assert parse_secret("s", "kubernetes.io/dockerconfigjson", {}) == {}


@pytest.mark.parametrize(("data", "message"), [
    ({".dockerconfigjson": b"{not json"}, "is not JSON"),
    (_json({"auths": {"r.example": "x"}}), "is not an object"),
    (_json({"auths": {"r.example": {"auth": "!!!"}}}), "auth is not base64"),
    (_json({"auths": {"r.example": {"auth": base64.b64encode(b"nocolon").decode()}}}), "USER:PASSWORD"),
    (_json({"auths": ["r.example"]}), "not a docker config object"),
])
def test_malformed_secret_names_it(data: dict[str, bytes], message: str) -> None:
    with pytest.raises(PullSecretError, match=f'^pull secret "bad": .*{message}'):
        parse_secret("bad", "kubernetes.io/dockerconfigjson", data)


def test_secrets_never_in_repr() -> None:
    shown = repr(RegistryAuth("user", "hunter2", "idtok", "regtok"))
    assert "hunter2" not in shown and "idtok" not in shown and "regtok" not in shown
