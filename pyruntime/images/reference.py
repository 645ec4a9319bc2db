"""Image references as docker and containerd read them.

`busybox` means `docker.io/library/busybox:latest`, a first component with a dot, a colon or the name
`localhost` is a registry host, and a digest pins the content whatever the tag says. The grammar follows
the distribution project's reference package so a name that docker accepts parses the same way here.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from pyruntime.errors import InvalidArgumentError

DEFAULT_DOMAIN = "docker.io"
DEFAULT_TAG = "latest"
_LEGACY_DOMAINS = {"index.docker.io": DEFAULT_DOMAIN, "registry-1.docker.io": DEFAULT_DOMAIN}

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_DOMAIN_RE = re.compile(r"^(?:\[[0-9a-fA-F:.%a-z]+\]|(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)"
                        r"(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*)(?::[0-9]+)?$")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST_RE = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$")
_SHA256_HEX = re.compile(r"^[a-f0-9]{64}$")
NAME_MAX = 255


class ReferenceFormatError(InvalidArgumentError):
    """A string that is not an image reference; the message quotes it and says which part is wrong."""


@dataclass(frozen=True)
class Reference:
    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def object(self) -> str:
        """What the registry's manifest endpoint is asked for: the digest wins over the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.domain, self.path, None, digest)

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    def familiar(self) -> str:
        """The short form docker prints (`busybox:latest`), for messages and listings."""
        name = self.name
        if self.domain == DEFAULT_DOMAIN:
            name = self.path[len("library/"):] if self.path.startswith("library/") else self.path
        return name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def is_image_id(text: str) -> bool:
    """A bare config digest hex (or sha256:hex) names an image by ID rather than by reference."""
    return bool(_SHA256_HEX.match(text.removeprefix("sha256:")))


def is_tag(text: str) -> bool:
    """A bare tag (`latest`), as an OCI layout's ref.name annotation often is, rather than a full reference."""
    return "/" not in text and bool(_TAG_RE.match(text))


def is_loopback_host(host: str) -> bool:
    """localhost and 127.0.0.0/8 (and ::1) registries are reached over plain HTTP without configuration."""
    hostname = host
    if hostname.startswith("["):
        hostname = hostname[1:hostname.index("]")]
    elif hostname.count(":") == 1:
        hostname = hostname.split(":", 1)[0]
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def parse(text: str, *, default_tag: bool = True) -> Reference:
    """Parse and normalise a reference; tag `latest` is added when neither tag nor digest is given."""
    if not text or text != text.strip():
        raise ReferenceFormatError(f"invalid reference {text!r}: empty or surrounded by whitespace")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise ReferenceFormatError(f"invalid reference {text!r}: bad digest {digest!r}")
        algo, hexpart = digest.split(":", 1)
        if algo == "sha256" and not _SHA256_HEX.match(hexpart):
            raise ReferenceFormatError(f"invalid reference {text!r}: sha256 digest must be 64 lowercase hex characters")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG_RE.match(tag):
            raise ReferenceFormatError(f"invalid reference {text!r}: bad tag {tag!r}")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        domain, path = first, remainder
        if not _DOMAIN_RE.match(domain):
            raise ReferenceFormatError(f"invalid reference {text!r}: bad registry host {domain!r}")
    else:
        domain, path = DEFAULT_DOMAIN, rest
    domain = _LEGACY_DOMAINS.get(domain, domain)
    if not path or not _PATH_RE.match(path):
        raise ReferenceFormatError(f"invalid reference {text!r}: repository name {path!r} must be lowercase "
                             "components of [a-z0-9] joined by '.', '_', '__' or '-', separated by '/'")
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = f"library/{path}"
    if len(f"{domain}/{path}") > NAME_MAX:
        raise ReferenceFormatError(f"invalid reference {text!r}: name longer than {NAME_MAX} characters")
    if tag is None and digest is None and default_tag:
        tag = DEFAULT_TAG
    return Reference(domain, path, tag, digest)
