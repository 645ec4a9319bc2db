"""CoreDNS's image for `make cluster`'s cluster DNS (pynode_cluster/coredns.py), as CoreDNS's Dockerfile makes it:
its one static binary (scripts/peers/coredns.sh builds it from CoreDNS's Go module) as /coredns, the entrypoint,
ports 53 and 53/udp. The test registry holds it under kubeadm's name for it, which the mirror config sends
there, so the Deployment names the image a kubeadm cluster runs.

Upstream's image runs as user 65532 and binds :53 through a file capability on the binary; a file capability
is an xattr of the layer, which an unpacker may drop, so this one runs as root, and the Deployment's
securityContext (every capability dropped but NET_BIND_SERVICE, no privilege escalation, a read-only root) is
what confines it, as it confines upstream's.

Every cluster start pushes it, and compressing the binary is most of the work: the layout is kept in
~/.cache/pynode under the binary's digest, and made again only for another binary.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from pynode_cluster.components import PEERS_BIN
from pynode_cluster.coredns import IMAGE
from tests.kit.busybox import CACHE, require_static
from tests.kit.images import add_image, f, tar_entries, write_index

BINARY = PEERS_BIN / "coredns"
LAYOUTS = CACHE / "coredns-image"  # one layout, under the digest of the binary it holds


def build_layout(layout: Path, binary: Path = BINARY) -> Path:
    """The image as an OCI layout, tagged as IMAGE is."""
    layer = tar_entries([f("coredns", require_static(binary).read_bytes(), 0o755)])
    desc, _ = add_image(layout, [(layer, "gzip")], config_extra={
        "Entrypoint": ["/coredns"], "Cmd": [], "ExposedPorts": {"53/tcp": {}, "53/udp": {}}})
    write_index(layout, [desc], tag=IMAGE.rsplit(":", 1)[1])
    return layout


def cached_layout(binary: Path = BINARY) -> Path:
    """The image's layout for `binary`, from the cache, built there first if it holds another binary's."""
    if not binary.is_file():
        raise RuntimeError(f"{binary} is missing: run `make setup` (scripts/peers/coredns.sh builds it)")
    layout = LAYOUTS / hashlib.sha256(binary.read_bytes()).hexdigest()
    if not layout.is_dir():  # built aside and renamed: a layout there is whole
        shutil.rmtree(LAYOUTS, ignore_errors=True)
        build_layout(layout.with_suffix(".tmp"), binary).rename(layout)
    return layout


def push(registry) -> str:
    """Pushes the image to `registry` (tests/integration/registry_server.Registry) under IMAGE's repository path;
    returns that repo:tag."""
    repository = IMAGE.split("/", 1)[1]
    registry.push(cached_layout(), repository, tag=IMAGE.rsplit(":", 1)[1])
    return repository
