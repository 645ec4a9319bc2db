from __future__ import annotations

import pytest

from pyruntime.images.reference import ReferenceFormatError, is_image_id, is_loopback_host, parse
from pyruntime.images.registry import select_platform
from pyruntime.images.request import Platform

D = "sha256:" + "a" * 64


@pytest.mark.parametrize("text,expected", [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("library/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/busybox", "docker.io/library/busybox:latest"),
    ("index.docker.io/library/busybox", "docker.io/library/busybox:latest"),
    ("user/app:v1", "docker.io/user/app:v1"),
    ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
    ("localhost/app", "localhost/app:latest"),
    ("localhost:5000/app", "localhost:5000/app:latest"),
    ("127.0.0.1:5000/library/busybox:latest", "127.0.0.1:5000/library/busybox:latest"),
    ("[::1]:5000/a/b", "[::1]:5000/a/b:latest"),
    (f"busybox@{D}", f"docker.io/library/busybox@{D}"),
    (f"quay.io/a/b:tag@{D}", f"quay.io/a/b:tag@{D}"),
    ("a.b/c/d/e.f_g__h-i", "a.b/c/d/e.f_g__h-i:latest"),
])
def test_parse_normalises(text: str, expected: str) -> None:
    assert str(parse(text)) == expected


def test_parts_and_familiar() -> None:
    ref = parse("busybox:1.36")
    assert (ref.domain, ref.path, ref.tag, ref.digest) == ("docker.io", "library/busybox", "1.36", None)
    assert ref.familiar() == "busybox:1.36"
    assert parse(f"busybox:1@{D}").object == D


@pytest.mark.parametrize("text,why", [
    ("", "empty"), ("Busybox", "lowercase"), ("busybox:", "tag"), ("busybox:-x", "tag"),
    ("busybox@sha256:abc", "digest"), ("a//b", "lowercase"), ("/busybox", "lowercase"),
    ("busybox:" + "x" * 129, "tag"), (" busybox", "whitespace"), ("bad_host:5000x/a", "registry host"),
    ("a" * 256, "longer"), ("-a/b", "lowercase"), ("a/b-", "lowercase"),
])
def test_parse_rejects_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(ReferenceFormatError, match=why):
        parse(text)


def test_error_quotes_the_reference() -> None:
    with pytest.raises(ReferenceFormatError, match="'UPPER/case'"):
        parse("UPPER/case")


def test_image_id_and_loopback() -> None:
    assert is_image_id("a" * 64) and is_image_id(D) and not is_image_id("busybox")
    assert is_loopback_host("127.0.0.1:5000") and is_loopback_host("localhost") and is_loopback_host("[::1]:5000")
    assert is_loopback_host("127.1.2.3")
    assert not is_loopback_host("registry.k8s.io") and not is_loopback_host("10.0.0.1:5000")


INDEX = {"manifests": [
    {"digest": "amd64", "platform": {"os": "linux", "architecture": "amd64"}},
    {"digest": "arm64", "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
    {"digest": "armv6", "platform": {"os": "linux", "architecture": "arm", "variant": "v6"}},
    {"digest": "armv7", "platform": {"os": "linux", "architecture": "arm", "variant": "v7"}},
    {"digest": "att", "platform": {"os": "unknown", "architecture": "unknown"}},
]}


@pytest.mark.parametrize("platform,expected", [
    ("linux/amd64", "amd64"), ("linux/arm64", "arm64"), ("linux/arm64/v8", "arm64"),
    ("linux/arm/v7", "armv7"), ("linux/arm/v6", "armv6"), ("linux/arm", "armv6"),
])
def test_platform_selection(platform: str, expected: str) -> None:
    assert select_platform(INDEX, Platform.parse(platform), "x")["digest"] == expected


def test_platform_missing_lists_what_is_offered() -> None:
    with pytest.raises(Exception, match=r"linux/s390x.*linux/amd64"):
        select_platform(INDEX, Platform.parse("linux/s390x"), "busybox")
