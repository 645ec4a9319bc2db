"""The file of a projected volume's clusterTrustBundle source: the certificates of the ClusterTrustBundle it
names, or of every bundle of its signer that its label selector matches, as one PEM file, each certificate once.

The bundles are read from the API server (certificates.k8s.io/v1) as `system:node:NAME`, whose role may get
and list every ClusterTrustBundle: they hold public trust anchors, no secret. A bundle that does not exist, or
a selector that matches none, fails the volume (the pod waits, as for a missing configMap) unless the source
is optional, which makes the file empty.

As the kubelet's clustertrustbundle manager, but for the order: the kubelet shuffles the certificates anew at
each of its starts; here they are in the order of their DER bytes, so the file changes only when the anchors
do (every pod sync reads the bundles again, and the AtomicWriter writes only a changed payload).
"""
from __future__ import annotations

import base64
import re
import textwrap

from pykubelet.api.podmodel import ClusterTrustBundleProjection, LabelSelector
from pykubelet.volumes.objects import ObjectError

PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.S)


def anchors(client, source: ClusterTrustBundleProjection) -> bytes:
    """The PEM file of `source`'s trust anchors; raises ObjectError when the bundles cannot be read, or none
    is there and the source is not optional."""
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.certificates_v1 import ClusterTrustBundle

    if client is None:
        raise ObjectError("clusterTrustBundle: standalone mode (no --kubeconfig) has no API server to read it from")
    try:
        if source.name is not None:
            try:
                bundles = [client.get(ClusterTrustBundle, source.name).spec.trustBundle]
            except ApiError as e:
                if e.status.code != 404:
                    raise
                if source.optional:
                    return b""
                raise ObjectError(f"while getting ClusterTrustBundle: clustertrustbundle.certificates.k8s.io "
                                  f'"{source.name}" not found') from e
        else:
            bundles = [] if source.label_selector is None else [
                b.spec.trustBundle for b in client.list(ClusterTrustBundle, labels=selector(source.label_selector))
                if b.spec.signerName == source.signer_name]
            if not bundles:
                if source.optional:
                    return b""
                raise ObjectError("combination of signerName and labelSelector matched zero ClusterTrustBundles")
    except ApiError as e:
        raise ObjectError(f"clusterTrustBundle {source.name or source.signer_name}: {e.status.message}") from e
    return pem(sorted({der for text in bundles for der in certificates(text.encode())}))


def selector(s: LabelSelector) -> list[tuple[str, object]]:
    """`s` as lightkube's label selector pairs (none: every object)."""
    from lightkube import operators

    pairs: list[tuple[str, object]] = list(s.match_labels)
    ops = {"In": operators.in_, "NotIn": operators.not_in}
    for key, op, values in s.match_expressions:
        pairs.append((key, ops[op](list(values)) if op in ops
                      else operators.exists() if op == "Exists" else operators.not_exists()))
    return pairs


def certificates(text: bytes) -> list[bytes]:
    """The DER bytes of each PEM block of `text` (the API server lets only CERTIFICATE blocks into a bundle)."""
    return [base64.b64decode(b"".join(body.split())) for _kind, body in PEM_BLOCK.findall(text)]


def pem(ders: list[bytes]) -> bytes:
    """CERTIFICATE blocks, 64 columns, as Go's pem.EncodeToMemory writes them."""
    return b"".join(b"-----BEGIN CERTIFICATE-----\n"
                    + "".join(line + "\n" for line in textwrap.wrap(base64.b64encode(d).decode(), 64)).encode()
                    + b"-----END CERTIFICATE-----\n" for d in ders)
