"""The images `kubeadm init` v1.37.2 pulls (`kubeadm config images list`, but CoreDNS's: tests/kit/coredns.py),
made here and pushed to the test registry under their registry.k8s.io repository paths: this machine reaches
no public registry, and the mirror config sends registry.k8s.io to the test one.

They hold what upstream's hold where upstream has it: the control plane's and etcd's one static binary
(scripts/peers/kubeadm-images.sh builds them CGO_ENABLED=0, as Kubernetes' release does) in /usr/local/bin, on
the PATH, since kubeadm's static pod manifests name bare commands; the binary is the entrypoint, upstream's
/go-runner having no part in how kubeadm runs them. kube-proxy in iptables mode execs iptables, ip6tables and
their -save and -restore, so its image is distroless-iptables' way: Debian's iptables (the nft backend, by
xtables-nft-multi), the extensions it dlopens for -m comment, -j MARK ..., and their libraries, from this
Debian host. The pause is the CRI images' (tests/kit/cri_images.py).

Every cluster start pushes them, and compressing ~100 MB binaries is most of the work: each layout is kept in
~/.cache/pynode under the digest of its config and layer, and made again only when those change.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pynode_cluster.components import PEERS_BIN
from tests.kit.busybox import CACHE, require_static
from tests.kit.cri_images import PAUSE_C, compile_static, shared_libraries
from tests.kit.images import Entry, add_image, d, f, symlink, tar_entries, write_index

BINARIES = PEERS_BIN / "kubeadm-images"  # scripts/peers/kubeadm-images.sh builds them
LAYOUTS = CACHE / "kubeadm-images"  # a layout per image, under the digest of its config and layer

KUBERNETES = "v1.37.2"
KUBE_PROXY = f"registry.k8s.io/kube-proxy:{KUBERNETES}"
PAUSE = "registry.k8s.io/pause:3.10.2"
ETCD = "registry.k8s.io/etcd:3.7.0-0"
IMAGES = [*(f"registry.k8s.io/{name}:{KUBERNETES}"
            for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")), KUBE_PROXY, PAUSE, ETCD]

PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
XTABLES_MULTI = Path("/usr/sbin/xtables-nft-multi")
XTABLES_EXTENSIONS = Path(f"/usr/lib/{os.uname().machine}-linux-gnu/xtables")
IPTABLES_COMMANDS = [family + suffix for family in ("iptables", "ip6tables") for suffix in ("", "-save", "-restore")]
IPTABLES_FILES = [Path("/etc/ethertypes"), Path("/etc/protocols")]  # protocol names, where the host has them


def _binary(name: str) -> bytes:
    path = BINARIES / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run `scripts/build-peers.sh kubeadm-images` (or `make setup`)")
    return require_static(path).read_bytes()


def _host_file(path: Path) -> Entry:
    """The host's file at `path` (its content, through symlinks) at the same path in the image."""
    real = path.resolve()
    return f(str(path.relative_to("/")), real.read_bytes(), real.stat().st_mode & 0o7777)


def _iptables() -> list[Entry]:
    """Debian's iptables under the six names kube-proxy execs, its extensions, the libraries of both."""
    extensions = sorted(XTABLES_EXTENSIONS.iterdir())
    entries = [_host_file(XTABLES_MULTI)]
    entries += [symlink(f"usr/sbin/{command}", XTABLES_MULTI.name) for command in IPTABLES_COMMANDS]
    entries += [symlink(str(ext.relative_to("/")), os.readlink(ext)) if ext.is_symlink() else _host_file(ext)
                for ext in extensions]
    libraries = {lib for elf in [XTABLES_MULTI, *extensions] if not elf.is_symlink() for lib in shared_libraries(elf)}
    entries += [_host_file(lib) for lib in sorted(libraries)]
    return entries + [_host_file(path) for path in IPTABLES_FILES if path.exists()] + [
        d("run"), symlink("var/run", "/run")]


def _tree(entries: list[Entry]) -> list[Entry]:
    """`entries` with a directory for each parent they lack, in path order: a directory before what it holds."""
    parents = {"/".join(e.name.split("/")[:i]) for e in entries for i in range(1, e.name.count("/") + 1)}
    return sorted(entries + [d(p) for p in parents - {e.name for e in entries}], key=lambda e: e.name.split("/"))


def _images() -> Iterator[tuple[str, dict, bytes]]:
    """Each of IMAGES, one at a time (a binary is ~100 MB): its reference, its config and its one layer's tar."""
    for ref in IMAGES:
        if ref == PAUSE:
            with tempfile.TemporaryDirectory() as work:
                pause = compile_static(PAUSE_C, Path(work) / "pause")
            yield ref, {"Entrypoint": ["/pause"], "Cmd": [], "Env": []}, tar_entries([f("pause", pause, 0o755)])
            continue
        name = ref.rsplit("/", 1)[1].split(":")[0]
        binary = f"usr/local/bin/{name}"
        entries = [f(binary, _binary(name), 0o755), d("tmp", 0o1777)] + (_iptables() if ref == KUBE_PROXY else [])
        yield ref, {"Entrypoint": ["/" + binary], "Cmd": [], "Env": [PATH]}, tar_entries(_tree(entries))


def cached_layouts() -> list[tuple[str, Path]]:
    """(reference, OCI layout tagged "latest") for each of IMAGES, from the cache, built there first where it
    holds none for this content; the cache keeps no other layout."""
    out = []
    for ref, config, layer in _images():
        layout = LAYOUTS / hashlib.sha256(json.dumps(config, sort_keys=True).encode() + layer).hexdigest()
        if not layout.is_dir():  # built aside and renamed: a layout there is whole
            aside = layout.with_suffix(".tmp")
            shutil.rmtree(aside, ignore_errors=True)
            desc, _ = add_image(aside, [(layer, "gzip")], config_extra=config)
            write_index(aside, [desc])
            aside.rename(layout)
        out.append((ref, layout))
    for stale in set(LAYOUTS.iterdir()) - {layout for _, layout in out}:
        shutil.rmtree(stale)
    return out


def push(registry) -> list[str]:
    """Pushes every image to `registry` (tests/integration/registry_server.Registry) under its repository path;
    returns those repo:tag names."""
    pushed = []
    for ref, layout in cached_layouts():
        repository = ref.split("/", 1)[1]
        registry.push(layout, repository)
        pushed.append(repository)
    return pushed
