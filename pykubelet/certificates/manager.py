"""The doing part: the client certificate's TLS bootstrap at start, and a rotation loop per certificate
(the client's with rotateCertificates, the serving one's with serverTLSBootstrap), as the kubelet's
bootstrap.LoadClientCert and client-go's certificate manager.

Bootstrap runs before anything else talks to the API server: with --bootstrap-kubeconfig and no valid
client certificate in --kubeconfig (missing, unreadable, expired), a key is made, a CSR for
system:node:NAME posted with the bootstrap credential, and once it is signed the pair goes into
--cert-dir and --kubeconfig is written to name kubelet-client-current.pem. The key made for a CSR that is
still pending is kept in kubelet-client.key.tmp (0600), so a restart asks again under the same CSR name
(policy.bootstrap_csr_name) and finds its request instead of leaving another one to approve.

A rotation loop sleeps until a random point in 70-90% of the current certificate's life (at once when
there is none, or it no longer satisfies the request), asks for a new pair with a new key, stores it and
hands it to `on_rotate` (the API client's transport reloads; the HTTPS server serves new handshakes with
it). A failure is retried with backoff; the old certificate serves until the new one is in.
"""
from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pykubelet.certificates import csr, policy
from pykubelet.certificates.store import DIR_MODE, PEM_MODE, FileStore, Pair, parse
from pykubelet.dirs import make_dirs
from pykubelet.errors import FailedPreconditionError, KubeletError, UnavailableError
from pynode_os.files import FULL, atomic_write

log = logging.getLogger(__name__)
BOOTSTRAP_WAIT = 3600.0  # as the kubelet's requestNodeCertificate
ROTATION_WAIT = 900.0  # as client-go's certificateWaitTimeout
BACKOFF_FIRST, BACKOFF_CAP = 2.0, 32.0
NO_TEMPLATE_RETRY = 30.0
CLIENT_STORE, SERVER_STORE = "kubelet-client", "kubelet-server"
TMP_KEY = "kubelet-client.key.tmp"


class BootstrapError(UnavailableError):
    """The bootstrap kubeconfig cannot be used (unreadable, no server)."""


def client_config_problem(kubeconfig: Path, now: datetime.datetime | None = None) -> str | None:
    """Why `kubeconfig` cannot serve as the kubelet's credential (missing, unreadable, no client
    certificate, one of its certificates expired), or None when it can: the kubelet's
    isClientConfigStillValid."""
    from pykubelet.api.client import load_kubeconfig

    if not kubeconfig.exists():
        return "missing"
    try:
        config = load_kubeconfig(kubeconfig)
        user = config.user
        if not (user.client_cert or user.client_cert_data):
            return "no client certificate"
        if user.client_cert_data:
            data = base64.b64decode(user.client_cert_data)
        else:
            data = Path(config.abs_file(user.client_cert)).read_bytes()
        certs = x509.load_pem_x509_certificates(data)
    except Exception as e:  # any fault of the file means: bootstrap again, as the kubelet does
        return f"unreadable: {e}"
    now = now or datetime.datetime.now(datetime.UTC)
    for cert in certs:
        if now >= cert.not_valid_after_utc:
            return f"its certificate expired at {cert.not_valid_after_utc.isoformat()}"
    return None


def kubeconfig_pair(kubeconfig: Path) -> Pair | None:
    """The client certificate and key `kubeconfig` names (files or inline data), None if it has no pair that
    reads: what rotation starts from when the cert dir has no pair of its own yet."""
    from pykubelet.api.client import load_kubeconfig

    try:
        config = load_kubeconfig(kubeconfig)
        user = config.user
        parts = []
        for data, name in ((user.client_cert_data, user.client_cert), (user.client_key_data, user.client_key)):
            parts.append(base64.b64decode(data) if data else Path(config.abs_file(name)).read_bytes())
        return parse(b"\n".join(parts), Path(config.abs_file(user.client_cert)) if user.client_cert else kubeconfig)
    except (OSError, ValueError, TypeError, KubeletError) as e:
        log.warning("kubeconfig %s: no client certificate to rotate from: %s", kubeconfig, e)
        return None


def _load_or_make_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The pending CSR's key kept across a restart, else a new one kept there."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
    except (OSError, ValueError, TypeError):
        pass
    key = policy.new_key()
    atomic_write(path, policy.key_pem(key), mode=PEM_MODE, sync=FULL, exact=True)
    return key


def bootstrap_client(kubeconfig: Path, bootstrap_kubeconfig: Path, cert_dir: Path, node: str,
                     stop: threading.Event, timeout: float = BOOTSTRAP_WAIT) -> bool:
    """Makes `kubeconfig` a valid credential for system:node:`node` unless it is one already; False if
    `stop` was set first. Raises csr's errors (denied, not approved in `timeout`) naming the CSR."""
    from pykubelet.api.client import load_kubeconfig, make_client

    problem = client_config_problem(kubeconfig)
    if problem is None:
        log.info("kubeconfig %s is valid: no bootstrap", kubeconfig)
        return True
    log.info("kubeconfig %s: %s; TLS bootstrap with %s", kubeconfig, problem, bootstrap_kubeconfig)
    if not bootstrap_kubeconfig.is_file():
        raise BootstrapError(f"--kubeconfig {kubeconfig}: {problem}; --bootstrap-kubeconfig "
                             f"{bootstrap_kubeconfig}, which would ask for a new credential, does not exist")
    make_dirs(cert_dir, DIR_MODE)
    store = FileStore(CLIENT_STORE, cert_dir)
    template = policy.client_template(node)
    now = datetime.datetime.now(datetime.UTC)
    current = store.current()
    tmp_key = cert_dir / TMP_KEY
    # a valid pair's key is reused, as the kubelet does (the same CSR name finds the request that issued it,
    # when --kubeconfig alone was lost); never an expired pair's, whose request would give the same certificate
    if current is not None and isinstance(current.key, ec.EllipticCurvePrivateKey) \
            and policy.unsatisfied(current.leaf, template, now) is None:
        key = current.key
    else:
        key = _load_or_make_key(tmp_key)
    try:
        boot = load_kubeconfig(bootstrap_kubeconfig)
        client = make_client(bootstrap_kubeconfig)
    except Exception as e:  # lightkube's ConfigError, a CA file it can't read, bad YAML
        raise BootstrapError(f"--bootstrap-kubeconfig {bootstrap_kubeconfig}: {e}") from e
    try:
        name = policy.bootstrap_csr_name(key.public_key(), template)
        request = policy.make_csr(key, template)
        deadline, failures = time.monotonic() + timeout, 0
        while True:  # the API server may start after the kubelet, as the kubelet's waitForServer allows
            try:
                csr.request(client, request, policy.CLIENT_SIGNER, template.usages, name=name)
                break
            except csr.CSRUnavailableError as e:
                if time.monotonic() >= deadline:
                    raise
                delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** failures)
                failures += 1
                log.warning("TLS bootstrap: %s; again in %.0f s", e, delay)
                if stop.wait(delay):
                    return False
        log.info("posted CSR %s for %s; waiting for its certificate", name, template.common_name)
        cert = csr.wait(client, name, timeout, stop)
    finally:
        client.close()
    if cert is None:
        return False
    try:
        leaf = x509.load_pem_x509_certificate(cert)
    except ValueError as e:
        raise csr.CSRError(f"CSR {name}: the issued certificate does not parse: {e}") from None
    why = policy.unsatisfied(leaf, template, datetime.datetime.now(datetime.UTC))
    if why is not None:
        raise csr.CSRError(f"CSR {name}: the issued certificate does not serve: {why}")
    pair = store.update(cert, policy.key_pem(key))
    try:
        os.unlink(tmp_key)
    except FileNotFoundError:
        pass
    ca_file = str(boot.abs_file(boot.cluster.certificate_auth)) if boot.cluster.certificate_auth else None
    doc = policy.kubeconfig(boot.cluster.server, ca_file, boot.cluster.certificate_auth_data,
                            boot.cluster.insecure, str(store.current_path))
    # JSON is YAML: every kubeconfig reader takes it
    atomic_write(kubeconfig, json.dumps(doc, indent=2).encode(), mode=PEM_MODE, sync=FULL, exact=True)
    log.info("client certificate %s issued, valid until %s; wrote %s", pair.path,
             pair.leaf.not_valid_after_utc.isoformat(), kubeconfig)
    return True


class CertificateManager:
    """Keeps one certificate (store `store`) fresh through CSRs of `signer` for `template()`."""

    def __init__(self, client, store: FileStore, signer: str, template: Callable[[], policy.Template | None],
                 on_rotate: Callable[[Pair], None], *, current: Pair | None = None,
                 wait_timeout: float = ROTATION_WAIT, rng: random.Random | None = None,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)) -> None:
        self.client, self.store, self.signer, self.template = client, store, signer, template
        self.on_rotate, self.wait_timeout, self.rng, self.now = on_rotate, wait_timeout, rng or random.Random(), now
        self.current = current if current is not None else store.current()
        self._fraction: tuple[int, float] | None = None  # (the leaf's serial, its drawn point of life)

    def deadline(self) -> datetime.datetime:
        """When to rotate: now when there is no certificate or it no longer serves the request."""
        template = self.template()
        if self.current is None or template is None:
            return self.now()
        if (why := policy.unsatisfied(self.current.leaf, template, self.now())) is not None:
            log.info("%s certificate %s: %s: rotating now", self.store.name, self.current.path, why)
            return self.now()
        serial = self.current.leaf.serial_number
        if self._fraction is None or self._fraction[0] != serial:
            self._fraction = (serial, policy.rotation_fraction(self.rng))
        return policy.rotation_deadline(self.current.leaf, self._fraction[1])

    def rotate(self, stop: threading.Event) -> bool:
        """One new pair; False if `stop` was set while waiting for it."""
        template = self.template()
        if template is None:
            raise FailedPreconditionError(f"{self.store.name}: no address to ask a certificate for")
        key = policy.new_key()
        name = csr.request(self.client, policy.make_csr(key, template), self.signer, template.usages)
        log.info("%s: posted CSR %s; waiting for its certificate", self.store.name, name)
        cert = csr.wait(self.client, name, self.wait_timeout, stop)
        if cert is None:
            return False
        pair = self.store.update(cert, policy.key_pem(key))
        self.current = pair
        log.info("%s: certificate %s issued, valid until %s", self.store.name, pair.path,
                 pair.leaf.not_valid_after_utc.isoformat())
        self.on_rotate(pair)
        return True

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            if self.template() is None:  # no address yet: nothing a signer would take
                stop.wait(NO_TEMPLATE_RETRY)
                continue
            wait = (self.deadline() - self.now()).total_seconds()
            if wait > 0:
                log.info("%s: next rotation in %.0f s", self.store.name, wait)
                if stop.wait(wait):
                    return
            try:
                if not self.rotate(stop):
                    return
                failures = 0
            except (KubeletError, OSError) as e:
                delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** failures)
                failures += 1
                log.warning("%s: rotation failed: %s; again in %.0f s", self.store.name, e, delay)
                stop.wait(delay)
