"""A pod's image pull credentials: its pull secrets parsed and matched to an image as the kubelet's keyring
(pkg/credentialprovider) matches them.

A pull secret is a docker config: registry locations (a host, a host with a path prefix, `*` globs of whole
host labels, an optional port) mapped to credentials. An image gets every entry whose location matches its
repository, most specific first (the locations reverse-sorted, so `quay.io/team` before `quay.io`); the
kubelet tries them in that order until a pull succeeds. The port must match exactly, the host must have as
many labels as the glob, and a location with a path matches only repositories under that prefix. So a
secret for one registry is never sent to another, and a pod that names no matching secret pulls with the
runtime's own node-wide credentials, which the runtime scopes per registry host.

Pure: no API access here (pods/sync.py reads the secrets), so that the matching rules are tested by tables.
"""
from __future__ import annotations

import base64
import binascii
import fnmatch
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pykubelet.errors import InvalidArgumentError

DOCKER_CONFIG_JSON = ("kubernetes.io/dockerconfigjson", ".dockerconfigjson")
DOCKER_CFG = ("kubernetes.io/dockercfg", ".dockercfg")
DEFAULT_REGISTRY_HOST = "index.docker.io"  # the key `https://index.docker.io/v1/` becomes


class PullSecretError(InvalidArgumentError):
    """A pull secret of a docker config type whose content is not a docker config; names the secret."""


@dataclass(frozen=True)
class RegistryAuth:
    """One credential, the fields of the CRI's AuthConfig; the secrets never show in a repr or a log."""
    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)


def _entry(secret: str, location: str, raw: object) -> RegistryAuth:
    if not isinstance(raw, dict):
        raise PullSecretError(f'pull secret "{secret}": entry {location!r} is not an object')
    text = {k: raw.get(k) or "" for k in ("username", "password", "auth", "identitytoken", "registrytoken")}
    if not all(isinstance(v, str) for v in text.values()):
        raise PullSecretError(f'pull secret "{secret}": entry {location!r}: fields must be strings')
    username, password = text["username"], text["password"]
    if text["auth"]:  # as docker's: `auth` (base64 of USER:PASSWORD) wins over username and password
        try:
            username, sep, password = base64.b64decode(text["auth"], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError) as e:
            raise PullSecretError(f'pull secret "{secret}": entry {location!r}: auth is not base64: {e}') from e
        if not sep:
            raise PullSecretError(f'pull secret "{secret}": entry {location!r}: auth is not base64 of '
                                  "USER:PASSWORD")
    return RegistryAuth(username, password, text["identitytoken"], text["registrytoken"])


def parse_secret(name: str, type_: str, data: Mapping[str, bytes]) -> dict[str, RegistryAuth]:
    """The docker config (location -> credential) of a Secret of type kubernetes.io/dockerconfigjson or
    kubernetes.io/dockercfg; any other type, or an empty key, gives none, as the kubelet's."""
    for kind, key in (DOCKER_CONFIG_JSON, DOCKER_CFG):
        if type_ == kind and data.get(key):
            try:
                config = json.loads(data[key])
            except ValueError as e:
                raise PullSecretError(f'pull secret "{name}": {key} is not JSON: {e}') from e
            if kind == DOCKER_CONFIG_JSON[0]:
                config = config.get("auths") if isinstance(config, dict) else None
                config = {} if config is None else config
            if not isinstance(config, dict):
                raise PullSecretError(f'pull secret "{name}": {key} is not a docker config object')
            return {loc: _entry(name, loc, raw) for loc, raw in config.items()}
    return {}


def _location_key(location: str) -> str | None:
    """A config location as the keyring indexes it: host[:port][/path], without scheme and /v1/ or /v2/."""
    value = location if location.startswith(("https://", "http://")) else "https://" + location
    try:
        parts = urlsplit(value)
    except ValueError:
        return None  # the kubelet ignores an entry it cannot parse
    path = parts.path
    if path.startswith(("/v2/", "/v1/")):
        path = path[3:]
    return parts.netloc + path if path and path != "/" else parts.netloc


def _split(netloc: str) -> tuple[list[str], str]:
    """Host labels and port, as Go's net.SplitHostPort (no port: the whole of it is the host)."""
    if netloc.startswith("["):
        host, _, rest = netloc[1:].partition("]")
        return [host], rest[1:] if rest.startswith(":") else ""
    if netloc.count(":") == 1:
        host, _, port = netloc.partition(":")
        return host.split("."), port
    return netloc.split("."), ""


def urls_match(glob: str, target: str) -> bool:
    """Whether repository `target` (host[:port]/path) falls under keyring location `glob`."""
    try:
        g, t = urlsplit("https://" + glob), urlsplit("https://" + target)
    except ValueError:
        return False
    (g_labels, g_port), (t_labels, t_port) = _split(g.netloc), _split(t.netloc)
    if g_port != t_port or len(g_labels) != len(t_labels) or not t.path.startswith(g.path):
        return False
    return all(fnmatch.fnmatchcase(label, pattern) for pattern, label in zip(g_labels, t_labels, strict=True))


def is_default_registry(repository: str) -> bool:
    """Whether a repository is Docker Hub's by the shape of its name (no domain part, or docker.io)."""
    first, slash, _ = repository.partition("/")
    if not first:
        return False
    if not slash or first in ("docker.io", "index.docker.io"):
        return True
    return not any(c in first for c in ".:")


def repository(image: str) -> str:
    """An image reference's repository, normalized as the kubelet's Lookup is given it: a name without
    a domain is Docker Hub's (`busybox` -> `docker.io/library/busybox`); the tag and digest go."""
    name = image.partition("@")[0]
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name = name[:colon]
    first, slash, _ = name.partition("/")
    if not slash or not (any(c in first for c in ".:") or first == "localhost"):
        name = "docker.io/" + (name if slash else "library/" + name)
    return name


class Keyring:
    """Credentials from docker configs, looked up per image."""

    def __init__(self, configs: Iterable[Mapping[str, RegistryAuth]] = ()) -> None:
        self._creds: dict[str, list[RegistryAuth]] = {}
        for config in configs:
            for location, auth in config.items():
                key = _location_key(location)
                if key is not None:
                    self._creds.setdefault(key, []).append(auth)
        self._index = sorted(self._creds, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._creds)

    def lookup(self, repo: str) -> list[RegistryAuth]:
        """Every credential for repository `repo` (as repository() gives it), most specific location first;
        [] when none matches."""
        found = [auth for key in self._index if urls_match(key, repo) for auth in self._creds[key]]
        if not found and is_default_registry(repo):
            found = list(self._creds.get(DEFAULT_REGISTRY_HOST, ()))
        return found
