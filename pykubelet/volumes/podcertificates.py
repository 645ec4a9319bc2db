"""The files of a projected volume's podCertificate source: a private key the node makes for the pod and the
certificate chain a signer issues for it, asked for through a PodCertificateRequest (certificates.k8s.io/v1).

Threat model: the key is the pod's identity. It is made here, never leaves the node but in the pod's volume
(a tmpfs, as every projected volume: pykubelet/volumes/manager.py), and is kept in this process's memory
only; the request carries a stub PKCS#10 request signed by it, the proof of possession the API server checks.
The node can ask only for pods bound to it (the Node authorizer and NodeRestriction: spec.nodeName, the pod's
UID, its service account's UID, all checked by the API server), and reads back only those requests.

As the kubelet's podcertificate manager (pkg/kubelet/podcertificate), each source of each pod moves through
the same states: none yet, a request waiting, a chain fresh (until its beginRefreshAt plus up to 5 min of
jitter), a refresh waiting (the old chain still served), or denied / failed for good. Where the kubelet
drives them from a PodCertificateRequest informer and a minute's refresh pass, pykubelet's pod sync drives
them (every sync of a pod reads its volumes again; a pod waiting for its chain is synced again in 2 s): a
request is one GET per sync until the signer answers. As the kubelet's, nothing is kept across a restart:
a restarted kubelet asks again, and the pod's files stay as they were until the new chain is there.
"""
from __future__ import annotations

import base64
import datetime
import random
import threading
import time
from dataclasses import dataclass

from pykubelet.api.podmodel import Pod, PodCertificateProjection
from pykubelet.volumes.objects import ObjectError
from pykubelet.volumes.trustbundles import certificates, pem

ASSUME_DELETED = 10 * 60  # a request not found this long after its creation was deleted: ask again
JITTER = 5 * 60


class Refused(ObjectError):
    """The signer denied the request, or failed it: final for the pod, as the kubelet's credStateDenied."""


@dataclass
class Request:
    """A PodCertificateRequest made and not answered yet, and the key it is for."""
    name: str
    key: bytes  # PKCS#8 PEM
    abandon_at: float


@dataclass
class Credentials:
    """What the pod's files hold (key and chain, PEM), whether a refresh `waiting` or not."""
    key: bytes
    chain: bytes
    refresh_at: float
    waiting: Request | None = None


class PodCertificates:
    """The credentials of every podCertificate source of the node's pods, by (pod UID, the source's field)."""

    def __init__(self, client, node_name: str, clock=time.time) -> None:
        self.client, self.node_name, self.clock = client, node_name, clock
        self._state: dict[tuple[str, str], Request | Credentials | Refused] = {}
        self._lock = threading.Lock()
        self._node_uid = ""

    def bundle(self, pod: Pod, field: str, source: PodCertificateProjection) -> tuple[bytes, bytes]:
        """(private key, certificate chain), PEM, of the source at `field` of `pod`; raises ObjectError while
        there is none yet (the pod waits), and Refused once the signer said no."""
        key = (pod.uid, field)
        with self._lock:
            state = self._state.get(key)
        if isinstance(state, Refused):
            raise state
        now = self.clock()
        if state is None:
            state = self._ask(pod, source)
        elif isinstance(state, Request):
            answer = self._answer(pod, state)
            if answer is not None:
                state = answer
            elif now > state.abandon_at:
                state = self._ask(pod, source)
        elif (waiting := state.waiting) is not None:  # a refresh: the files keep the current chain meanwhile
            answer = self._answer(pod, waiting)
            if answer is not None:
                state = answer
            elif now > waiting.abandon_at:
                state.waiting = None
        elif now >= state.refresh_at:
            state.waiting = self._ask(pod, source)
        with self._lock:
            self._state[key] = state
        if isinstance(state, Request):
            raise ObjectError(f"no credentials yet for {field}: PodCertificateRequest "
                              f"{pod.metadata.namespace}/{state.name} not issued")
        if isinstance(state, Refused):
            raise state
        return state.key, state.chain

    def forget(self, uid: str) -> None:
        with self._lock:
            for k in [k for k in self._state if k[0] == uid]:
                del self._state[k]

    def _ask(self, pod: Pod, source: PodCertificateProjection) -> Request:
        """Creates a PodCertificateRequest for a new key of `source.key_type`."""
        from lightkube.core.exceptions import ApiError
        from lightkube.models.certificates_v1 import PodCertificateRequestSpec
        from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
        from lightkube.resources.certificates_v1 import PodCertificateRequest
        from lightkube.resources.core_v1 import Node, ServiceAccount

        meta, account = pod.metadata, pod.spec.service_account_name or "default"
        if self.client is None:
            raise ObjectError("podCertificate: standalone mode (no --kubeconfig) has no API server to ask")
        try:
            account_uid = self.client.get(ServiceAccount, account, namespace=meta.namespace).metadata.uid
            if not self._node_uid:
                self._node_uid = self.client.get(Node, self.node_name).metadata.uid
            private_key, stub = key_and_proof(source.key_type)
            made = self.client.create(PodCertificateRequest(
                metadata=ObjectMeta(namespace=meta.namespace, generateName="req-", ownerReferences=[
                    OwnerReference(apiVersion="v1", kind="Pod", name=meta.name, uid=meta.uid)]),
                spec=PodCertificateRequestSpec(
                    signerName=source.signer_name, podName=meta.name, podUID=meta.uid,
                    serviceAccountName=account, serviceAccountUID=account_uid,
                    nodeName=self.node_name, nodeUID=self._node_uid,
                    maxExpirationSeconds=source.max_expiration_seconds,
                    stubPKCS10Request=base64.b64encode(stub).decode(),
                    unverifiedUserAnnotations=dict(source.user_annotations) or None)))
        except ApiError as e:
            raise ObjectError(f"while creating a PodCertificateRequest for signer {source.signer_name}: "
                              f"{e.status.message}") from e
        return Request(made.metadata.name, private_key, self.clock() + ASSUME_DELETED + random.uniform(0, JITTER))

    def _answer(self, pod: Pod, request: Request) -> Credentials | Refused | None:
        """What became of `request`: issued, refused, or None (pending, or gone)."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.certificates_v1 import PodCertificateRequest

        name = f"{pod.metadata.namespace}/{request.name}"
        try:
            got = self.client.get(PodCertificateRequest, request.name, namespace=pod.metadata.namespace)
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise ObjectError(f"while getting PodCertificateRequest {name}: {e.status.message}") from e
        status = got.status
        for c in (status.conditions or []) if status is not None else []:
            if c.type in ("Denied", "Failed"):
                verb = "was denied" if c.type == "Denied" else "failed"
                return Refused(f"PodCertificateRequest {name} {verb}, reason={c.reason!r}, message={c.message!r}")
            if c.type == "Issued":
                return Credentials(request.key, pem(certificates(status.certificateChain.encode())),
                                   _seconds(status.beginRefreshAt) + random.uniform(0, JITTER))
        return None


def _seconds(when: datetime.datetime | str) -> float:
    if isinstance(when, str):
        when = datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
    return when.timestamp()


def key_and_proof(key_type: str) -> tuple[bytes, bytes]:
    """A new private key of `key_type` (PKCS#8 PEM) and a stub PKCS#10 request it signs (DER): no subject, no
    extension, only the proof that the asker holds the key, as the kubelet's generateKeyAndProof."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
    digest: hashes.SHA256 | hashes.SHA384 | hashes.SHA512 | None = hashes.SHA256()
    if key_type.startswith("RSA"):
        key = rsa.generate_private_key(65537, int(key_type[3:]))
    elif key_type == "ECDSAP384":
        key, digest = ec.generate_private_key(ec.SECP384R1()), hashes.SHA384()
    elif key_type == "ECDSAP521":
        key, digest = ec.generate_private_key(ec.SECP521R1()), hashes.SHA512()
    elif key_type == "ECDSAP256":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        key, digest = ed25519.Ed25519PrivateKey.generate(), None
    stub = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, digest)
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
            stub.public_bytes(serialization.Encoding.DER))
