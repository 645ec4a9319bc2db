"""PodSyncer.ensure_image with a pod's imagePullSecrets, as the kubelet's PullImage: each matching credential in
turn until one pull succeeds, every failure in the error when none does, no AuthConfig at all (the runtime's
own per-registry credentials) when no secret matches, secrets read only in the pod's own namespace, and a
pull failure of one pod never holding back another pod's pull of the same image. A fake runtime and API
client: the matching and ordering are pure logic."""
from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import Status

from proto import api_pb2
from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.config import Settings
from pykubelet.pods.sync import PodSyncer, SyncError
from tests.kit.fake_cri import FakeCRI

IMAGE = "registry.example:5000/team/app:1"


def registry(*passwords: str, anonymous: bool = False) -> FakeCRI:
    """A runtime whose pulls succeed only with one of `passwords` (or with no AuthConfig when `anonymous`)."""
    runtime = FakeCRI()
    runtime.registry_passwords, runtime.anonymous_pulls = set(passwords), anonymous
    return runtime


def pulls(runtime: FakeCRI) -> list[tuple[str, str | None]]:
    """The pulls made: (image, the password sent or None)."""
    return [(c[1], c[2]) for c in runtime.calls if c[0] == "PullImage"]


class FakeSecrets:
    """The API server's Secrets by (namespace, name); reads are recorded."""

    def __init__(self, secrets: dict[tuple[str, str], dict]) -> None:
        self.secrets, self.reads = secrets, list[tuple[str, str]]()

    def get(self, _kind, name: str, namespace: str):
        self.reads.append((namespace, name))
        if (namespace, name) not in self.secrets:
            raise ApiError(status=Status(code=404, message=f'secrets "{name}" not found'))
        return SimpleNamespace(type="kubernetes.io/dockerconfigjson", data={".dockerconfigjson": base64.b64encode(
            json.dumps({"auths": self.secrets[(namespace, name)]}).encode()).decode()})


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def event(self, _ref, _type: str, reason: str, message: str) -> None:
        self.seen.append((reason, message))


def creds(user: str, password: str) -> dict:
    return {"username": user, "password": password}


def syncer(runtime: FakeCRI, secrets: FakeSecrets) -> tuple[PodSyncer, Events]:
    events = Events()
    s = PodSyncer(runtime, Settings(), events=events,  # type: ignore[arg-type] # a fake of the recorder
                  volumes=SimpleNamespace(client=secrets))  # type: ignore[arg-type] # only .client is read
    return s, events


def pod(uid: str, namespace: str, *secrets: str) -> Pod:
    return parse_pod({"metadata": {"name": f"p-{uid}", "namespace": namespace, "uid": uid},
                      "spec": {"containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Always"}],
                               "imagePullSecrets": [{"name": n} for n in secrets]}})


def ensure(s: PodSyncer, p: Pod) -> str:
    return s.ensure_image(p, p.spec.containers[0], api_pb2.PodSandboxConfig())


def test_each_matching_credential_in_turn_most_specific_first_until_one_pulls():
    secrets = FakeSecrets({
        ("ns", "broad"): {"registry.example:5000": creds("u1", "stale")},
        ("ns", "narrow"): {"registry.example:5000/team": creds("u2", "also-stale")},
        ("ns", "good"): {"https://registry.example:5000/v2/": creds("u3", "right")},
        ("ns", "other"): {"other.example:5000": creds("u4", "for-another-registry")},
    })
    runtime = registry("right")
    s, _ = syncer(runtime, secrets)
    assert ensure(s, pod("1", "ns", "other", "broad", "good", "narrow")).startswith("sha256:")
    tried = [password for _, password in pulls(runtime)]
    assert tried[0] == "also-stale" and set(tried[1:]) == {"stale", "right"}  # the path prefix first
    assert "for-another-registry" not in tried  # a secret for another registry never goes to this one


def test_every_failure_is_in_the_error_when_no_credential_pulls():
    secrets = FakeSecrets({("ns", "a"): {"registry.example:5000": creds("alice", "x")},
                           ("ns", "b"): {"registry.example:5000/team/app": creds("bob", "y")}})
    runtime = registry()
    s, _ = syncer(runtime, secrets)
    with pytest.raises(SyncError) as e:
        ensure(s, pod("1", "ns", "a", "b"))
    assert e.value.reason == "ErrImagePull"
    assert "[bob: 401 Unauthorized, alice: 401 Unauthorized]" in str(e.value)
    assert [password for _, password in pulls(runtime)] == ["y", "x"]  # no anonymous try after them


def test_no_matching_secret_pulls_without_an_auth_config():
    """The runtime then uses its own node-wide credentials, which it keeps per registry host."""
    runtime = registry(anonymous=True)
    s, events = syncer(runtime, FakeSecrets({("ns", "other"): {"other.example": creds("u", "p")}}))
    ensure(s, pod("1", "ns", "other"))
    assert pulls(runtime) == [(IMAGE, None)]
    assert not [r for r, _ in events.seen if r == "FailedToRetrieveImagePullSecret"]


def test_a_secret_of_another_namespace_is_never_read():
    secrets = FakeSecrets({("team-x", "regcred"): {"registry.example:5000": creds("robot", "x-only")}})
    runtime = registry("x-only")
    s, events = syncer(runtime, secrets)
    with pytest.raises(SyncError, match="anonymous: 401"):
        ensure(s, pod("1", "team-y", "regcred"))
    assert secrets.reads == [("team-y", "regcred")]
    assert pulls(runtime) == [(IMAGE, None)]
    warning = [m for r, m in events.seen if r == "FailedToRetrieveImagePullSecret"]
    assert warning and "regcred" in warning[0]


def test_one_pods_failed_pull_does_not_back_off_another_pods_pull_of_the_image():
    """The kubelet's back-off is per pod and image: a pod without the secret (or an attacker's pod naming a
    victim's image) must not put the image in ImagePullBackOff for the pod that has the secret."""
    secrets = FakeSecrets({("x", "regcred"): {"registry.example:5000": creds("robot", "x-only")}})
    runtime = registry("x-only")
    s, _ = syncer(runtime, secrets)
    with pytest.raises(SyncError, match="anonymous: 401"):
        ensure(s, pod("attacker", "y"))
    with pytest.raises(SyncError) as again:
        ensure(s, pod("attacker", "y"))
    assert again.value.reason == "ImagePullBackOff"  # its own back-off holds
    assert ensure(s, pod("victim", "x", "regcred")).startswith("sha256:")
    s.forget("attacker")  # its pod gone from the node: nothing of it is kept
    with pytest.raises(SyncError) as fresh:
        ensure(s, pod("attacker", "y"))
    assert fresh.value.reason == "ErrImagePull"
