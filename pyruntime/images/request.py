"""What a pull is asked with: the registry's credentials and the platform to pick from an index.

Apart from the registry client (registry.py) so that a process which reads the image store but never pulls
itself does not load requests and TLS (bench.cri's memory): pyruntime-cri, whose pulls run in a child of its
launcher.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(os.uname().machine, os.uname().machine)


@dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = ""
    token: str = ""  # an identity token or a registry token, sent as Bearer without a challenge round trip

    @classmethod
    def parse(cls, text: str) -> Credentials:
        user, sep, password = text.partition(":")
        if not sep:
            raise ValueError("credentials must be USER:PASSWORD")
        return cls(user, password)

    @classmethod
    def parse_scoped(cls, text: str) -> tuple[str, Credentials]:
        """HOST=USER:PASSWORD: the registry host (HOST or HOST:PORT) and the credentials that go to it only.
        An unscoped USER:PASSWORD is refused: a node's credentials sent to whatever registry an image names
        are handed to the owner of any registry a pod names. The error never quotes the text (a password)."""
        host, eq, creds = text.partition("=")
        name, colon, port = host.partition(":")
        if not eq or ":" not in creds or not name or "/" in host or "@" in host or (colon and not port.isdigit()):
            raise ValueError("must be HOST=USER:PASSWORD, for the registry HOST only (an unscoped USER:PASSWORD "
                             "is refused: it would be sent to any registry an image names)")
        return host, cls.parse(creds)


@dataclass(frozen=True)
class Platform:
    os: str = "linux"
    architecture: str = _ARCH
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> Platform:
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"invalid platform {text!r}: expected os/arch[/variant]")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else "")

    def matches(self, p: dict) -> bool:
        if p.get("os") != self.os or p.get("architecture") != self.architecture:
            return False
        want, have = norm_variant(self.architecture, self.variant), norm_variant(self.architecture,
                                                                                  p.get("variant", ""))
        return not want or want == have

    def __str__(self) -> str:
        return f"{self.os}/{self.architecture}" + (f"/{self.variant}" if self.variant else "")


def norm_variant(arch: str, variant: str) -> str:
    if arch == "arm64" and variant in ("", "v8"):
        return "v8"
    if arch == "amd64" and variant in ("", "v1"):
        return ""
    return variant
