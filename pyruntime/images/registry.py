"""A client for the OCI distribution API: hosts and mirrors, auth challenges, manifests, resumable blob fetches.

Host selection follows containerd's hosts.toml: `<config_dir>/<registry>/hosts.toml` lists mirrors tried in
order before the registry itself (`server`), each with its own CA bundle or `skip_verify`. Without a file,
docker.io means registry-1.docker.io over HTTPS, and localhost/127.0.0.0/8 registries are spoken to over
plain HTTP, as docker and containerd do. Auth is driven by the 401 challenge: Bearer tokens are fetched from
the realm (with the user's credentials if any, anonymously otherwise) and cached per scope; Basic just sends
the credentials.

Credentials are the pull's, for the registry the reference names (and the mirrors its hosts.toml lists, the
node admin's choice); a caller never hands one registry's credentials to a pull from another. They go to a
token realm only over HTTPS or to a loopback host, and never across a redirect to another host (requests
drops Authorization there: blob redirects to storage hosts get only the URL's own signature).

Every request has a progress deadline, as containerd's image_pull_progress_timeout: a read waits at most
that long, and a blob whose bytes have not moved for that long (through retries and resumed ranges) is
given up with an error that says so, rather than after reads and retries of a minute each that a registry
(or a path to one) stalling mid-blob could stretch for as long as it liked.
"""
from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import requests
import urllib3.exceptions

from pyruntime.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, UnavailableError
from pyruntime.images.content import ContentStore, DigestError, sha256_digest
from pyruntime.images.reference import DEFAULT_DOMAIN, Reference, is_loopback_host
from pyruntime.images.request import Credentials, Platform, norm_variant

MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (MEDIA_OCI_INDEX, MEDIA_DOCKER_LIST)
MANIFEST_TYPES = (MEDIA_OCI_MANIFEST, MEDIA_DOCKER_MANIFEST)
ACCEPT = ", ".join((MEDIA_OCI_INDEX, MEDIA_DOCKER_LIST, MEDIA_OCI_MANIFEST, MEDIA_DOCKER_MANIFEST))
MANIFEST_MAX = 4 << 20
_CHUNK = 1 << 20
_BLOB_READ = 64 << 10  # a blob's progress is seen at this grain, a slow link's too
PROGRESS_TIMEOUT = 300.0  # containerd's image_pull_progress_timeout default


class RegistryError(UnavailableError):
    """No endpoint of the registry served the request (refused connection, TLS or HTTP failure, a broken
    answer); a later retry may succeed. The message names the reference, host and status. A missing
    manifest or blob is a NotFoundError instead, and refused credentials an AuthError."""


class AuthError(FailedPreconditionError):
    """The registry wants credentials that were not given or were refused. A failed precondition (gRPC
    has PERMISSION_DENIED, which the six kinds fold in here): retrying the same request can't succeed,
    and the request itself is well formed; it succeeds once the right credentials are configured."""


def select_platform(index: dict, platform: Platform, what: str) -> dict:
    """The first manifest for the platform; with no variant asked for, one without a variant is preferred."""
    candidates = [m for m in index.get("manifests", []) if platform.matches(m.get("platform") or {})]
    if not candidates:
        offered = sorted({"/".join(x for x in (m.get("platform", {}).get("os", "?"),
                                               m.get("platform", {}).get("architecture", "?"),
                                               m.get("platform", {}).get("variant", "")) if x)
                          for m in index.get("manifests", [])})
        raise NotFoundError(f"{what}: no manifest for platform {platform} (offered: {', '.join(offered) or 'none'})")
    exact = [m for m in candidates if norm_variant(platform.architecture, m.get("platform", {}).get("variant", ""))
             == norm_variant(platform.architecture, platform.variant)]
    return (exact or candidates)[0]


@dataclass
class Endpoint:
    url: str
    ca: str | None = None
    skip_verify: bool = False
    override_path: bool = False
    mirror: bool = False
    capabilities: tuple[str, ...] = ("pull", "resolve")

    @property
    def verify(self) -> bool | str:
        if self.skip_verify:
            return False
        return self.ca or True


def endpoints_for(domain: str, hosts_dir: Path | None = None) -> list[Endpoint]:
    """Mirrors from hosts.toml in order (when a hosts dir is given), then the registry itself."""
    if domain == DEFAULT_DOMAIN:
        default = Endpoint("https://registry-1.docker.io")
    elif is_loopback_host(domain):
        default = Endpoint(f"http://{domain}")
    else:
        default = Endpoint(f"https://{domain}")
    if hosts_dir is None:
        return [default]
    for candidate in (hosts_dir / domain / "hosts.toml", hosts_dir / "_default" / "hosts.toml"):
        if candidate.is_file():
            break
    else:
        return [default]
    try:
        config = tomllib.loads(candidate.read_text())
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgumentError(f"{candidate}: {e}") from e
    out = []
    for url, host in (config.get("host") or {}).items():
        caps = tuple(host.get("capabilities", ("pull", "resolve")))
        ca = host.get("ca")
        if isinstance(ca, list):
            ca = ca[0] if ca else None
        if ca and not os.path.isabs(ca):
            ca = str(candidate.parent / ca)
        out.append(Endpoint(url.rstrip("/"), ca, bool(host.get("skip_verify", False)),
                            bool(host.get("override_path", False)), True, caps))
    server = config.get("server")
    if server:
        default = Endpoint(server.rstrip("/"), config.get("ca"), bool(config.get("skip_verify", False)))
    out.append(default)
    return out


_CHALLENGE_RE = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class _Auth:
    credentials: Credentials | None
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)
    schemes: dict[str, str] = field(default_factory=dict)  # endpoint URL -> "basic" | "bearer"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def header(self, host: str, scope: str) -> dict[str, str]:
        if self.credentials and self.credentials.token and not self.credentials.username:
            return {"Authorization": f"Bearer {self.credentials.token}"}
        scheme = self.schemes.get(host)
        if scheme == "basic" and self.credentials:
            raw = f"{self.credentials.username}:{self.credentials.password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        token = self.tokens.get((host, scope))
        return {"Authorization": f"Bearer {token}"} if token else {}

    def challenge(self, session: requests.Session, host: str, scope: str, response: requests.Response,
                  verify) -> None:
        header = response.headers.get("WWW-Authenticate", "")
        kind = header.split(" ", 1)[0].lower()
        if kind == "basic":
            if not self.credentials:
                raise AuthError(f"{host} requires credentials (Basic auth) for {scope}")
            self.schemes[host] = "basic"
            return
        if kind != "bearer":
            raise AuthError(f"{host}: unsupported auth challenge {header!r}")
        params = dict(_CHALLENGE_RE.findall(header))
        realm = params.get("realm")
        if not realm:
            raise AuthError(f"{host}: bearer challenge without realm: {header!r}")
        query = {"scope": params.get("scope", scope)}
        if params.get("service"):
            query["service"] = params["service"]
        auth = None
        if self.credentials and self.credentials.username:
            auth = (self.credentials.username, self.credentials.password)
        realm_url = urlparse(realm)
        if auth and realm_url.scheme != "https" and not (realm_url.scheme == "http"
                                                        and is_loopback_host(realm_url.netloc)):
            raise AuthError(f"{host}: token realm {realm} is neither HTTPS nor loopback: the credentials are "
                            "not sent to it in clear")
        if realm_url.netloc != urlparse(host).netloc:
            verify = True  # a registry's own CA bundle says nothing about a token server elsewhere
        try:
            r = session.get(realm, params=query, auth=auth, timeout=(10, 60), verify=verify)
        except requests.RequestException as e:
            raise AuthError(f"{host}: token request to {realm} failed: {e}") from e
        if r.status_code != 200:
            raise AuthError(f"{host}: token server {realm} answered {r.status_code} for {query['scope']}"
                            + ("" if auth else " (no credentials given)"))
        body = r.json()
        token = body.get("token") or body.get("access_token")
        if not token:
            raise AuthError(f"{host}: token server {realm} returned no token")
        with self.lock:
            self.schemes[host] = "bearer"
            self.tokens[(host, scope)] = token


ProgressFn = Callable[[str, str, int, int | None], None]  # (digest, status, done, total)


class RegistryClient:
    """Talks to the endpoints of one registry for one repository; mirrors that fail are skipped in order."""

    def __init__(self, ref: Reference, *, credentials: Credentials | None = None, hosts_dir: Path | None = None,
                 retries: int = 5, timeout: float = 60.0, progress_timeout: float = PROGRESS_TIMEOUT) -> None:
        """`progress_timeout`: seconds a blob's bytes may stand still before the pull is given up (0: never)."""
        self.ref = ref
        self.endpoints = [e for e in endpoints_for(ref.domain, hosts_dir) if "pull" in e.capabilities]
        self.auth = _Auth(credentials)
        self.session = requests.Session()
        self.session.trust_env = False  # a proxy from the environment must not see registry credentials
        self.retries = retries
        self.progress_timeout = progress_timeout or float("inf")
        self.timeout = min(timeout, self.progress_timeout)  # seconds a read may wait
        self.scope = f"repository:{ref.path}:pull"
        self.preferred: Endpoint | None = None

    def close(self) -> None:
        self.session.close()

    def _url(self, endpoint: Endpoint, kind: str, obj: str) -> str:
        prefix = endpoint.url if endpoint.override_path else endpoint.url + "/v2"
        url = f"{prefix}/{self.ref.path}/{kind}/{obj}"
        if endpoint.mirror:
            url += f"?ns={self.ref.domain}"
        return url

    def _request(self, endpoint: Endpoint, method: str, url: str, headers: dict[str, str],
                 stream: bool = False) -> requests.Response:
        host = endpoint.url
        for _ in range(3):
            h = dict(headers)
            h.update(self.auth.header(host, self.scope))
            r = self.session.request(method, url, headers=h, stream=stream, timeout=(10, self.timeout),
                                     verify=endpoint.verify, allow_redirects=True)
            if r.status_code != 401:
                return r
            already = "Authorization" in h
            r.close()
            if already and self.auth.schemes.get(host) == "basic":
                break
            self.auth.challenge(self.session, host, self.scope, r, endpoint.verify)
        given = self.auth.credentials is not None
        raise AuthError(f"{self.ref}: {host} denied access (401)"
                        + ("; the credentials were refused" if given else "; no credentials were given"))

    def _each_endpoint(self, what: str, fn):
        """Try endpoints in order, starting with the one that last answered, so a dead mirror costs one failure."""
        errors = []
        order = sorted(self.endpoints, key=lambda e: e is not self.preferred)
        for endpoint in order:
            try:
                result = fn(endpoint)
                self.preferred = endpoint
                return result
            except AuthError as e:
                if not endpoint.mirror:
                    raise
                errors.append(f"{endpoint.url}: {e}")
            except (requests.RequestException, RegistryError) as e:
                errors.append(f"{endpoint.url}: {e}")
        if errors and all(": not found" in e for e in errors):
            raise NotFoundError(f"{what}: not found ({'; '.join(errors)})")
        raise RegistryError(f"{what}: every endpoint failed ({'; '.join(errors)})")

    def get_manifest(self, obj: str) -> tuple[str, str, bytes]:
        """(media type, digest, body) of a manifest or index, verified against the digest asked for."""
        what = f"{self.ref.name}:{obj}" if not obj.startswith("sha256:") else f"{self.ref.name}@{obj}"

        def fetch(endpoint: Endpoint):
            r = self._request(endpoint, "GET", self._url(endpoint, "manifests", obj), {"Accept": ACCEPT},
                              stream=True)
            with r:
                if r.status_code == 404:
                    raise RegistryError(f"{what}: not found")
                if r.status_code != 200:
                    raise RegistryError(f"{what}: HTTP {r.status_code}: {r.text[:200]}")
                body = self._read_manifest(r, what)
            if len(body) > MANIFEST_MAX:
                raise RegistryError(f"{what}: manifest larger than {MANIFEST_MAX} bytes")
            actual = sha256_digest(body)
            expected = obj if obj.startswith("sha256:") else r.headers.get("Docker-Content-Digest")
            if expected and expected.startswith("sha256:") and expected != actual:
                raise DigestError(f"manifest {expected} of {what}: content hashes to {actual}")
            media = (r.headers.get("Content-Type") or "").split(";")[0].strip()
            try:
                media = json.loads(body).get("mediaType") or media
            except ValueError as e:
                raise RegistryError(f"{what}: manifest is not JSON: {e}") from e
            return media, actual, body

        return self._each_endpoint(what, fetch)

    def _read_manifest(self, r: requests.Response, what: str) -> bytes:
        """Up to MANIFEST_MAX + 1 bytes of the body, all within the progress timeout: a manifest is small,
        and one read at a time with a timeout each would let a registry drip it for as long as it liked."""
        deadline = time.monotonic() + self.progress_timeout
        body = bytearray()
        while len(body) <= MANIFEST_MAX:
            if time.monotonic() > deadline:
                raise RegistryError(f"{what}: manifest not received within {self.progress_timeout:g}s "
                                    "(image pull progress timeout)")
            chunk = r.raw.read1(MANIFEST_MAX + 1 - len(body), decode_content=True)
            if not chunk:
                break
            body += chunk
        return bytes(body)

    def fetch_blob(self, store: ContentStore, digest: str, size: int | None,
                   progress: ProgressFn | None = None) -> None:
        """Download a blob into the store, resuming from a partial download and after broken connections."""
        with store.lock(digest):
            if store.has(digest):
                if progress:
                    progress(digest, "exists", size or 0, size)
                return
            with store.writer(digest, size) as w:
                self._each_endpoint(f"blob {digest} of {self.ref.name}",
                                    lambda ep: self._download(ep, digest, w, progress))
            if progress:
                progress(digest, "done", w.offset, size)

    def _download(self, endpoint: Endpoint, digest: str, w, progress: ProgressFn | None) -> None:
        url = self._url(endpoint, "blobs", digest)
        attempt = 0
        moved = time.monotonic()  # when the blob's bytes last moved
        while True:
            start = w.offset
            if w.size is not None and w.offset == w.size:
                return
            headers = {"Range": f"bytes={w.offset}-"} if w.offset else {}
            try:
                r = self._request(endpoint, "GET", url, headers, stream=True)
                with r:
                    if r.status_code == 404:
                        raise RegistryError(f"blob {digest}: not found")
                    if r.status_code == 416 and w.size is not None and w.offset >= w.size:
                        return
                    if r.status_code == 200 and w.offset:
                        w.restart()
                    elif r.status_code not in (200, 206):
                        raise RegistryError(f"blob {digest}: HTTP {r.status_code}")
                    for chunk in r.raw.stream(_BLOB_READ, decode_content=False):
                        w.write(chunk)
                        moved = time.monotonic()
                        if progress:
                            progress(digest, "downloading", w.offset, w.size)
                if w.size is None or w.offset >= w.size:
                    return
                raise requests.ConnectionError(f"blob {digest}: connection closed at byte {w.offset}")
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                    urllib3.exceptions.HTTPError) as e:
                if isinstance(e, requests.ConnectionError) and _refused(e):
                    raise  # nothing listens there: the next endpoint, not a retry
                attempt = 0 if w.offset > start else attempt + 1
                if time.monotonic() - moved >= self.progress_timeout:
                    raise RegistryError(f"blob {digest}: no progress for {self.progress_timeout:g}s at byte "
                                        f"{w.offset} (image pull progress timeout): {e}") from e
                if attempt > self.retries:
                    raise RegistryError(f"blob {digest}: gave up after {attempt} attempts: {e}") from e
                time.sleep(min(0.2 * 2 ** attempt, 3))


def _refused(e: BaseException) -> bool:
    """A connection that never opened, as opposed to one that broke after it had opened."""
    todo: list[BaseException | None] = [e]
    seen: set[int] = set()
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, (ConnectionRefusedError, urllib3.exceptions.NewConnectionError)):
            return True
        todo += [cur.__cause__, cur.__context__, getattr(cur, "reason", None)]
        todo += [a for a in getattr(cur, "args", ()) if isinstance(a, BaseException)]
    return False
