"""The images Kubernetes' e2e [NodeConformance] specs run (`make conformance-k8s`, tests/conformance/k8s_suite.py),
made here and pushed to `make cluster`'s test registry under their own repository paths, so that the pods name
the images upstream's suite names and the cluster's mirror config (tests/kit/cluster_registry.py) serves them.

e2e.test names its images in test/utils/image/manifest.go and prints them with --list-images; the specs that
--focus '[NodeConformance]' selects (test/e2e/common/node, common/storage, common/network, apps/job) run
BUILDERS' repositories, and every tag --list-images gives one of them is pushed. agnhost is itself: the binary
scripts/peers/e2e.sh builds from the same k8s.io/kubernetes module, in an image laid out as its Dockerfile
lays it out (/agnhost, /agnhost-2, /uploads, porter's certificate, the user and group its SupplementalGroups
spec expects), on the busybox base the critest images have (cri_images.build_dynamic_rootfs) instead of Alpine,
whose packages cannot be built from a module, and with the host's bash (Alpine's bash package in upstream's
image: the probe specs run /bin/bash). The rest are stand-ins on that base: busybox for busybox (with /bin/sysctl,
which the Sysctls specs run) and for glibc-dns-testing (the specs run sh and hostname), nonroot as busybox with
its user 1234, nonewprivs and pause as the critest images' small static programs, nginx as their busybox httpd
behind nginx's name.

Not made: what must not exist (invalid.registry.k8s.io, the authenticated gcr.io agnhost), and the images only
other specs run. agnhost's fake registry (/var/registry, pulled from registry.k8s.io when upstream builds it)
serves only [Serial] specs, which the suite skips.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pynode_cluster.components import PEERS_BIN
from tests.kit.busybox import CACHE
from tests.kit.cri_images import (
    BUSYBOX_GROUP,
    BUSYBOX_PASSWD,
    NGINX_PROLOGUE,
    NGINX_ROOT,
    NNP_C,
    PAUSE_C,
    WEB_SH,
    CriImage,
    build_layouts,
    compile_static,
    dynamic_busybox,
    shared_libraries,
    web_entries,
)
from tests.kit.images import Entry, d, f, symlink

E2E_BIN = PEERS_BIN / "kubernetes" / "e2e"  # scripts/peers/e2e.sh
GOMODCACHE = CACHE / "go" / "pkg" / "mod"  # build-peers.sh's GOPATH
AGNHOST_PORTS = (80, 8080, 8081, 9376, 5000)
# agnhost's Dockerfile: `adduser -u 1000 -D user-defined-in-image`, `addgroup -g 50000 group-defined-in-image`
AGNHOST_PASSWD = (BUSYBOX_PASSWD +
                  "user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n")
AGNHOST_GROUP = BUSYBOX_GROUP + "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"

HOST_BASH = Path("/bin/bash")


class Parts:
    """What the builders put in their images, each made once: the agnhost binary and its module's files, and the
    static programs compiled into `workdir`."""

    def __init__(self, workdir: Path, agnhost: Path, k8s_module: Path) -> None:
        self.workdir, self.agnhost, self.k8s_module = workdir, agnhost, k8s_module
        workdir.mkdir(parents=True, exist_ok=True)
        self._compiled: dict[str, bytes] = {}

    def compiled(self, name: str, source: str) -> bytes:
        if name not in self._compiled:
            self._compiled[name] = compile_static(source, self.workdir / name)
        return self._compiled[name]


Builder = Callable[[Parts], tuple[list[Entry], dict, bool]]  # -> (entries, config, on the busybox base)


def _agnhost(parts: Parts) -> tuple[list[Entry], dict, bool]:
    porter = parts.k8s_module / "test" / "images" / "agnhost" / "porter"
    entries = [f("agnhost", parts.agnhost.read_bytes(), 0o755), symlink("agnhost-2", "agnhost"), d("uploads"),
               f("localhost.crt", (porter / "localhost.crt").read_bytes()),
               f("localhost.key", (porter / "localhost.key").read_bytes()),
               d("etc"), f("etc/passwd", AGNHOST_PASSWD), f("etc/group", AGNHOST_GROUP),
               d("home"), d("home/user-defined-in-image", uid=1000, gid=1000), *_host_program(HOST_BASH)]
    config = {"Entrypoint": ["/agnhost"], "Cmd": ["pause"],
              "ExposedPorts": {f"{port}/tcp": {} for port in AGNHOST_PORTS}}
    return entries, config, True


def _host_program(path: Path) -> list[Entry]:
    """The host's program at the same path, with the libraries it loads that the busybox base lacks."""
    base = {lib.resolve() for lib in shared_libraries(dynamic_busybox())}
    return [f(str(path).lstrip("/"), path.read_bytes(), 0o755)] + [
        f(str(lib).lstrip("/"), lib.resolve().read_bytes(), 0o644)
        for lib in shared_libraries(path) if lib.resolve() not in base]


def _busybox(_parts: Parts) -> tuple[list[Entry], dict, bool]:
    # busybox's image has every applet in /bin; the base lays them out as busybox --list-full says (/sbin/sysctl)
    return [symlink("bin/sysctl", "busybox")], {}, True


def _nonroot(_parts: Parts) -> tuple[list[Entry], dict, bool]:
    return [], {"User": "1234"}, True


def _nonewprivs(parts: Parts) -> tuple[list[Entry], dict, bool]:
    nnp = parts.compiled("nnp", NNP_C)
    return [d("usr/local"), d("usr/local/bin"), f("usr/local/bin/nnp", nnp, 0o4755)], {"Cmd": ["nnp"]}, True


def _nginx(_parts: Parts) -> tuple[list[Entry], dict, bool]:
    script = WEB_SH.format(prologue=NGINX_PROLOGUE, name="nginx", port=80, root="/" + NGINX_ROOT)
    return web_entries(script, NGINX_ROOT, "nginx"), {"Entrypoint": ["/usr/sbin/nginx"], "Cmd": ["-g", "daemon off;"],
                                                      "ExposedPorts": {"80/tcp": {}}, "StopSignal": "SIGQUIT"}, True


def _pause(parts: Parts) -> tuple[list[Entry], dict, bool]:
    # the pause image's own user (build/pause/Dockerfile: USER 65535:65535)
    return ([f("pause", parts.compiled("pause", PAUSE_C), 0o755)],
            {"Entrypoint": ["/pause"], "Cmd": [], "Env": [], "User": "65535:65535"}, False)


E2E = "registry.k8s.io/e2e-test-images"
BUILDERS: dict[str, Builder] = {
    f"{E2E}/agnhost": _agnhost,
    f"{E2E}/busybox": _busybox,
    f"{E2E}/glibc-dns-testing": _busybox,
    f"{E2E}/nginx": _nginx,
    f"{E2E}/nonewprivs": _nonewprivs,
    f"{E2E}/nonroot": _nonroot,
    "registry.k8s.io/pause": _pause,
}


def wanted(listed: list[str]) -> dict[str, list[str]]:
    """repository (as e2e.test names it) -> its tags, of the images `e2e.test --list-images` printed that BUILDERS
    make; every one of BUILDERS must be among them, or upstream renamed an image the specs run."""
    out: dict[str, list[str]] = {}
    for line in listed:
        ref = line.strip()
        if not ref or "@" in ref:
            continue
        repo, _, tag = ref.rpartition(":")
        if repo in BUILDERS and tag:
            out.setdefault(repo, []).append(tag)
    for tags in out.values():
        tags.sort()
    missing = sorted(set(BUILDERS) - set(out))
    if missing:
        raise ValueError(f"e2e.test --list-images names none of {', '.join(missing)}: its image manifest changed")
    return out


def image_set(workdir: Path, listed: list[str], agnhost: Path, k8s_module: Path) -> list[CriImage]:
    """The images for `listed` (e2e.test --list-images), each under its repository path on the mirror."""
    parts = Parts(workdir, agnhost, k8s_module)
    images = []
    for repo, tags in sorted(wanted(listed).items()):
        entries, config, base = BUILDERS[repo](parts)
        images.append(CriImage(repo.split("/", 1)[1], sorted(tags), entries, config, base=base))
    return images


def layouts(workdir: Path, listed: list[str], agnhost: Path, k8s_module: Path) -> list[tuple[CriImage, Path]]:
    """Each image as an OCI layout under workdir: built once for a run, pushed to each pair's cluster
    (cri_images.push_layouts)."""
    return build_layouts(workdir, lambda w: image_set(w, listed, agnhost, k8s_module))


def k8s_module(version: str) -> Path:
    """The k8s.io/kubernetes module e2e.sh built from, in the module cache."""
    return GOMODCACHE / "k8s.io" / f"kubernetes@{version}"
