"""Asking the API server for a certificate: a certificates.k8s.io/v1 CertificateSigningRequest, then its
status read until the signer has put a certificate in it, as client-go's csr.RequestCertificate and
WaitForCertificate do.

The wait reads the one CSR by name once a second rather than watching it: it is one small object, asked
for at bootstrap and once per rotation, and a read survives an API server restart with no relist logic.
"""
from __future__ import annotations

import base64
import logging
import threading
import time

from pykubelet.errors import DeadlineExceededError, FailedPreconditionError, UnavailableError

log = logging.getLogger(__name__)
POLL = 1.0


class CSRError(FailedPreconditionError):
    """The CSR was denied or failed, or a CSR of that name is someone else's request."""


class CSRTimeoutError(DeadlineExceededError):
    """No certificate was issued for the CSR within the wait (nobody approved it)."""


class CSRUnavailableError(UnavailableError):
    """The API server did not take the CSR (unreachable, or refused the request)."""


def request(client, csr_pem: bytes, signer: str, usages: tuple[str, ...], name: str | None = None) -> str:
    """Posts the CSR and returns its name: `name` when given (a CSR of that name with the same request is
    reused, as after a restart while waiting), else one the API server generates from "csr-"."""
    from lightkube.core.exceptions import ApiError
    from lightkube.models.certificates_v1 import CertificateSigningRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.certificates_v1 import CertificateSigningRequest

    encoded = base64.b64encode(csr_pem).decode()
    obj = CertificateSigningRequest(
        metadata=ObjectMeta(name=name) if name else ObjectMeta(generateName="csr-"),
        spec=CertificateSigningRequestSpec(request=encoded, signerName=signer, usages=list(usages)))
    try:
        created = client.create(obj)
    except ApiError as e:
        if e.status.code != 409 or not name:
            raise CSRUnavailableError(f"creating a {signer} CSR: {e}") from e
        try:
            existing = client.get(CertificateSigningRequest, name)
        except ApiError as e2:
            raise CSRUnavailableError(f"reading CSR {name}: {e2}") from e2
        if existing.spec.request != encoded:
            raise CSRError(f"CSR {name} exists with another request") from None
        return name
    except Exception as e:
        raise CSRUnavailableError(f"creating a {signer} CSR: {e}") from e
    return created.metadata.name


def wait(client, name: str, timeout: float, stop: threading.Event) -> bytes | None:
    """The issued certificate (PEM) of CSR `name`, once approved and signed; None if `stop` is set first.
    Errors of the API server are retried until the deadline: the control plane may be restarting."""
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.certificates_v1 import CertificateSigningRequest

    deadline = time.monotonic() + timeout
    last_error = ""
    while not stop.is_set():
        try:
            csr = client.get(CertificateSigningRequest, name)
        except ApiError as e:
            if e.status.code == 404:
                raise CSRError(f"CSR {name} was deleted before a certificate was issued") from e
            last_error = str(e)
        except Exception as e:  # the connection: retried
            last_error = str(e)
        else:
            conditions = (csr.status.conditions if csr.status is not None else None) or []
            for c in conditions:
                if c.type in ("Denied", "Failed") and c.status == "True":
                    raise CSRError(f"CSR {name} {c.type.lower()}: {c.reason or ''} {c.message or ''}".rstrip())
            approved = any(c.type == "Approved" and c.status == "True" for c in conditions)
            if approved and csr.status.certificate:
                return base64.b64decode(csr.status.certificate)
        if time.monotonic() >= deadline:
            also = f"; last error: {last_error}" if last_error else ""
            raise CSRTimeoutError(f"CSR {name}: no certificate issued within {timeout:g} s (not approved? "
                                  f"`kubectl certificate approve {name}`){also}")
        stop.wait(POLL)
    return None
