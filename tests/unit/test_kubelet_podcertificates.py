"""The podCertificate source's states (pykubelet/volumes/podcertificates.py), against an in-memory stand-in for
the API server's PodCertificateRequests and a clock the test moves: one request per source, the pod waiting
until the signer issues, a refresh at beginRefreshAt that keeps serving the old chain until the new one, a
denial final, and a request the API server lost asked again."""
from __future__ import annotations

import base64
import datetime
import itertools
from types import SimpleNamespace

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import Status

from pykubelet.api.podmodel import PodCertificateProjection, parse_pod
from pykubelet.volumes import trustbundles
from pykubelet.volumes.objects import ObjectError
from pykubelet.volumes.podcertificates import ASSUME_DELETED, JITTER, PodCertificates, Refused, key_and_proof
from tests.kit.trust_anchors import ca_pem

POD = parse_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
                 "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": [{"name": "c", "image": "i"}]}})
SOURCE = PodCertificateProjection("example.com/spiffe", "ECDSAP256", max_expiration_seconds=3600,
                                  user_annotations=(("spiffe/path", "/x"),))
FIELD = "spec.volumes[0].projected.sources[0]"


class FakeAPI:
    def __init__(self) -> None:
        self.requests: dict[str, SimpleNamespace] = {}
        self.names = (f"req-{i}" for i in itertools.count(1))

    def get(self, kind, name, namespace=None):
        if kind.__name__ == "ServiceAccount":
            return SimpleNamespace(metadata=SimpleNamespace(uid=f"sa-uid-{namespace}-{name}"))
        if kind.__name__ == "Node":
            return SimpleNamespace(metadata=SimpleNamespace(uid=f"node-uid-{name}"))
        if name not in self.requests:
            raise ApiError(status=Status(code=404, message=f"{name} not found"))
        return self.requests[name]

    def create(self, request):
        request.metadata.name = next(self.names)
        request.status = None
        self.requests[request.metadata.name] = request
        return request

    def answer(self, name: str, kind: str, *, chain: bytes = b"", refresh_at: float = 0.0) -> None:
        when = datetime.datetime.fromtimestamp(refresh_at, datetime.UTC)
        self.requests[name].status = SimpleNamespace(
            conditions=[SimpleNamespace(type=kind, reason="Because", message="the signer says so")],
            certificateChain=chain.decode(), beginRefreshAt=when)


def test_a_source_waits_for_its_chain_then_serves_it_until_a_refresh_replaces_it():
    api, now = FakeAPI(), [1_000_000.0]
    certs = PodCertificates(api, "n1", clock=lambda: now[0])
    with pytest.raises(ObjectError, match=r"no credentials yet for spec.volumes\[0\].projected.sources\[0\]: "
                                          "PodCertificateRequest ns/req-1 not issued"):
        certs.bundle(POD, FIELD, SOURCE)
    request = api.requests["req-1"]
    spec = request.spec
    assert (spec.signerName, spec.podName, spec.podUID, spec.serviceAccountName, spec.serviceAccountUID,
            spec.nodeName, spec.nodeUID, spec.maxExpirationSeconds, spec.unverifiedUserAnnotations) == (
        "example.com/spiffe", "p", "pod-uid", "sa", "sa-uid-ns-sa", "n1", "node-uid-n1", 3600, {"spiffe/path": "/x"})
    assert request.metadata.ownerReferences[0].uid == "pod-uid" and request.metadata.namespace == "ns"
    stub = x509.load_der_x509_csr(base64.b64decode(spec.stubPKCS10Request))
    assert stub.is_signature_valid and stub.subject == x509.Name([])
    with pytest.raises(ObjectError, match="not issued"):  # pending: asked once, read again
        certs.bundle(POD, FIELD, SOURCE)
    assert list(api.requests) == ["req-1"]

    leaf, ca = ca_pem("leaf"), ca_pem("ca")
    api.answer("req-1", "Issued", chain=b"junk between blocks\n" + leaf + ca, refresh_at=now[0] + 600)
    key, chain = certs.bundle(POD, FIELD, SOURCE)
    assert chain == trustbundles.pem(trustbundles.certificates(leaf + ca))  # only the blocks, in their order
    assert public_der(serialization.load_pem_private_key(key, None)) == public_der(stub)

    now[0] += 600 + JITTER + 1  # past beginRefreshAt and its jitter: a new request, the old chain meanwhile
    assert certs.bundle(POD, FIELD, SOURCE) == (key, chain)
    assert list(api.requests) == ["req-1", "req-2"]
    assert certs.bundle(POD, FIELD, SOURCE) == (key, chain)
    api.answer("req-2", "Issued", chain=ca, refresh_at=now[0] + 600)
    new_key, new_chain = certs.bundle(POD, FIELD, SOURCE)
    assert new_key != key and new_chain == ca
    assert certs.bundle(POD, FIELD, SOURCE) == (new_key, new_chain) and len(api.requests) == 2

    certs.forget("pod-uid")  # the pod left the node: a pod of the same UID would start over
    with pytest.raises(ObjectError, match="req-3 not issued"):
        certs.bundle(POD, FIELD, SOURCE)


def test_a_denial_is_final_and_a_lost_request_is_asked_again():
    api, now = FakeAPI(), [1_000_000.0]
    certs = PodCertificates(api, "n1", clock=lambda: now[0])
    for _ in range(2):
        with pytest.raises(ObjectError, match="req-1 not issued"):
            certs.bundle(POD, FIELD, SOURCE)
    del api.requests["req-1"]  # gone: not found may be lag at first, then it counts as deleted
    with pytest.raises(ObjectError, match="req-1 not issued"):
        certs.bundle(POD, FIELD, SOURCE)
    now[0] += ASSUME_DELETED + JITTER + 1
    with pytest.raises(ObjectError, match="req-2 not issued"):
        certs.bundle(POD, FIELD, SOURCE)
    api.answer("req-2", "Denied")
    for _ in range(2):
        with pytest.raises(Refused, match=r"PodCertificateRequest ns/req-2 was denied, reason='Because', "
                                          "message='the signer says so'"):
            certs.bundle(POD, FIELD, SOURCE)
    assert list(api.requests) == ["req-2"]


@pytest.mark.parametrize("key_type", ["RSA3072", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"])
def test_each_key_type_proves_its_key(key_type):
    key, stub = key_and_proof(key_type)
    csr = x509.load_der_x509_csr(stub)
    assert csr.is_signature_valid and key.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert public_der(serialization.load_pem_private_key(key, None)) == public_der(csr)


def public_der(holder) -> bytes:
    """The SubjectPublicKeyInfo of a private key or a certificate request."""
    return holder.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
