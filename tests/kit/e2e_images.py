"""The images the specs of Kubernetes' e2e suite run (`make conformance-k8s`, tests/conformance/k8s_suite.py), made
here and pushed to `make cluster`'s test registry under their own repository paths, so that the pods name the
images upstream's suite names and the cluster's mirror config (tests/kit/cluster_registry.py) serves them.

e2e.test names its images in test/utils/image/manifest.go and prints them with --list-images; each set of specs
(k8s_suite.SETS) lists the repositories its specs run (NODE_IMAGES, CONFORMANCE_IMAGES), and every tag
--list-images gives one of them is pushed. The [NodeConformance] specs (test/e2e/common/node, common/storage,
common/network, apps/job) run agnhost, busybox, glibc-dns-testing, nginx, nonewprivs, nonroot and pause; every
SIG's [Conformance] specs run those and four more: kitten (the ImageVolume spec mounts it and reads its data.json
and /etc/os-release), nautilus (kubectl's Update Demo specs serve its data.json), sample-apiserver and etcd (the
Aggregator spec runs the sample API server with /usr/local/bin/etcd beside it).

agnhost is itself: the binary scripts/peers/e2e.sh builds from the same k8s.io/kubernetes module, in an image laid
out as its Dockerfile lays it out (/agnhost, /agnhost-2, /uploads, porter's certificate, the user and group its
SupplementalGroups spec expects), on the busybox base the critest images have (cri_images.build_dynamic_rootfs)
instead of Alpine, whose packages cannot be built from a module, and with the host's bash, curl, netcat-openbsd's
nc, dig and getent (Alpine's packages in upstream's image: the probe specs run /bin/bash, the Networking Granular
Checks curl and `nc -u`, the DNS specs' queriers dig and getent); its /etc/os-release is that of the Alpine release
its BASEIMAGE names, which the ImageVolume spec looks for in kitten. kitten and nautilus are agnhost's image with
their picture and data.json from the module's test/images, serving them (CMD test-webserver), as their Dockerfiles
make them. sample-apiserver is the k8s.io/sample-apiserver module of the same release, which e2e.sh builds too
(upstream's Makefile builds an older tag), at /sample-apiserver as its Dockerfile puts it; etcd is the control
plane's own (scripts/peers/kubernetes.sh, not the image's tag) at /usr/local/bin/etcd, as etcd's image has it.
busybox is Docker's busybox image of the version its BASEIMAGE names, upstream's build (scripts/peers/busybox.sh:
Debian's, which the base has, reverts a change of upstream's ash that the environment specs need), as that image
lays it out, on no base. glibc-dns-testing is the base with the host's dig and getent (the DNS specs' glibc querier;
upstream's is Debian with dnsutils). The rest are stand-ins on the base: nonroot as busybox with its user 1234,
nonewprivs and pause as the critest images' small static programs, nginx as their busybox httpd behind nginx's name.

Not made: what must not exist (invalid.registry.k8s.io, the authenticated gcr.io agnhost), and the images only
other specs run. agnhost's fake registry (/var/registry, pulled from registry.k8s.io when upstream builds it)
serves only [Serial] image-pull specs that are neither set's.
"""
from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from pynode_cluster.components import PEERS, PEERS_BIN
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
from tests.kit.images import Entry, d, f, hardlink, symlink

E2E_BIN = PEERS_BIN / "kubernetes" / "e2e"  # scripts/peers/e2e.sh
E2E_BUILD = "scripts/build-peers.sh e2e"  # scripts/peers/e2e.sh, into E2E_BIN
ETCD = PEERS / "etcd"
ETCD_BUILD = "scripts/build-peers.sh kubernetes"  # scripts/peers/kubernetes.sh, the control plane's
BUSYBOX = PEERS_BIN / "busybox"  # scripts/peers/busybox.sh: VERSION/busybox
BUSYBOX_BUILD = "scripts/build-peers.sh busybox"
# the directories of busybox's image besides /root (0700) and /tmp (1777)
BUSYBOX_DIRS = ("bin", "etc", "home", "usr", "usr/sbin", "var", "var/spool", "var/spool/mail", "var/www")
GOMODCACHE = CACHE / "go" / "pkg" / "mod"  # build-peers.sh's GOPATH
AGNHOST_PORTS = (80, 8080, 8081, 9376, 5000)
# agnhost's Dockerfile: `adduser -u 1000 -D user-defined-in-image`, `addgroup -g 50000 group-defined-in-image`
AGNHOST_PASSWD = (BUSYBOX_PASSWD +
                  "user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n")
AGNHOST_GROUP = BUSYBOX_GROUP + "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
ETCD_PORTS = (2379, 2380, 4001, 7001)  # etcd's image: EXPOSE

# what upstream's agnhost image adds from Alpine's packages that the specs run, as the host's Debian programs
# (image path, host path): bash (the probe specs' /bin/bash), curl and netcat-openbsd's nc (the Networking
# Granular Checks' node-pod http and udp specs; busybox's nc has no -u), ahead of busybox's in PATH
HOST_PROGRAMS = (("bin/bash", Path("/bin/bash")), ("usr/bin/curl", Path("/usr/bin/curl")),
                 ("usr/bin/nc", Path("/bin/nc.openbsd")))
# the lookups of the DNS specs' queriers, `dig` and `getent hosts`, which upstream's agnhost (Alpine's bind-tools
# and musl-utils) and glibc-dns-testing (Debian's dnsutils) have: the host's bind9-dnsutils and libc-bin
DNS_PROGRAMS = (("usr/bin/dig", Path("/usr/bin/dig")), ("usr/bin/getent", Path("/usr/bin/getent")))


class Parts:
    """What the builders put in their images, each read or made once: the binaries scripts/peers build (e2e.sh's
    in `e2e_bin`, the control plane's `etcd`, busybox.sh's under `busybox`), the k8s.io/kubernetes module's files,
    and the static programs compiled into `workdir`."""

    def __init__(self, workdir: Path, e2e_bin: Path, k8s_module: Path, etcd: Path = ETCD,
                 busybox: Path = BUSYBOX) -> None:
        self.workdir, self.e2e_bin, self.k8s_module, self.etcd = workdir, e2e_bin, k8s_module, etcd
        self.busybox = busybox
        workdir.mkdir(parents=True, exist_ok=True)
        self._compiled: dict[str, bytes] = {}
        self._built: dict[Path, bytes] = {}

    def compiled(self, name: str, source: str) -> bytes:
        if name not in self._compiled:
            self._compiled[name] = compile_static(source, self.workdir / name)
        return self._compiled[name]

    def built(self, path: Path, build: str) -> bytes:
        """A binary of scripts/peers'; missing, an error naming the command that builds it."""
        if path not in self._built:
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: run `{build}`")
            self._built[path] = path.read_bytes()
        return self._built[path]

    def e2e(self, name: str) -> bytes:
        return self.built(self.e2e_bin / name, E2E_BUILD)


Builder = Callable[[Parts], tuple[list[Entry], dict, bool]]  # -> (entries, config, on the busybox base)


def _agnhost(parts: Parts) -> tuple[list[Entry], dict, bool]:
    porter = parts.k8s_module / "test" / "images" / "agnhost" / "porter"
    entries = [f("agnhost", parts.e2e("agnhost"), 0o755), symlink("agnhost-2", "agnhost"), d("uploads"),
               f("localhost.crt", (porter / "localhost.crt").read_bytes()),
               f("localhost.key", (porter / "localhost.key").read_bytes()),
               d("etc"), f("etc/passwd", AGNHOST_PASSWD), f("etc/group", AGNHOST_GROUP),
               f("etc/os-release", _alpine_os_release(parts.k8s_module)),
               d("home"), d("home/user-defined-in-image", uid=1000, gid=1000),
               *_programs(HOST_PROGRAMS + DNS_PROGRAMS)]
    config = {"Entrypoint": ["/agnhost"], "Cmd": ["pause"],
              "ExposedPorts": {f"{port}/tcp": {} for port in AGNHOST_PORTS}}
    return entries, config, True


def _base_tag(k8s_module: Path, image: str, base: str) -> str:
    """The tag of `base` that the BASEIMAGE of the module's test/images/`image` names for linux/amd64."""
    baseimage = k8s_module / "test" / "images" / image / "BASEIMAGE"
    for line in baseimage.read_text().splitlines():
        platform, _, ref = line.strip().partition("=")
        if platform == "linux/amd64" and ref.startswith(f"{base}:"):
            return ref.removeprefix(f"{base}:")
    raise ValueError(f"{baseimage}: no linux/amd64={base}:TAG line; {image}'s base changed")


def _alpine_os_release(k8s_module: Path) -> str:
    """/etc/os-release of the Alpine release agnhost's BASEIMAGE names, saying what stands in for it: the ImageVolume
    spec looks for "Alpine Linux" in kitten's, which upstream builds on agnhost."""
    release = _base_tag(k8s_module, "agnhost", "alpine")
    return (f'NAME="Alpine Linux"\nID=alpine\nVERSION_ID={release}\n'
            f'PRETTY_NAME="Alpine Linux v{release} (a busybox stand-in: tests/kit/e2e_images.py)"\n')


def _programs(programs: tuple[tuple[str, Path], ...]) -> list[Entry]:
    """The host's `programs` (image path, host path) in the image, with the libraries they load that the busybox
    base lacks, each once."""
    base = {lib.resolve() for lib in shared_libraries(dynamic_busybox())}
    entries, libraries = [], {}
    for at, path in programs:
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run `scripts/install-apt.sh scripts/test-packages.txt`")
        entries.append(f(at, path.read_bytes(), 0o755))
        libraries.update({str(lib).lstrip("/"): lib for lib in shared_libraries(path) if lib.resolve() not in base})
    return entries + [f(name, lib.resolve().read_bytes(), 0o644) for name, lib in sorted(libraries.items())]


def _update_demo(name: str) -> Builder:
    """kitten's or nautilus' image: agnhost's with the picture and data.json of test/images/NAME/html at /, which
    test-webserver serves."""
    def build(parts: Parts) -> tuple[list[Entry], dict, bool]:
        entries, config, base = _agnhost(parts)
        html = parts.k8s_module / "test" / "images" / name / "html"
        return ([*entries, f(f"{name}.jpg", (html / f"{name}.jpg").read_bytes()),
                 f("data.json", (html / "data.json").read_bytes())], {**config, "Cmd": ["test-webserver"]}, base)
    return build


def _sample_apiserver(parts: Parts) -> tuple[list[Entry], dict, bool]:
    return [f("sample-apiserver", parts.e2e("sample-apiserver"), 0o755)], {"Entrypoint": ["/sample-apiserver"]}, True


def _etcd(parts: Parts) -> tuple[list[Entry], dict, bool]:
    parts.built(parts.etcd, ETCD_BUILD)  # missing, the error names the command that builds it
    etcd = _programs((("usr/local/bin/etcd", parts.etcd),))
    return ([d("usr/local"), d("usr/local/bin"), *etcd],
            {"ExposedPorts": {f"{port}/tcp": {} for port in ETCD_PORTS}}, True)


def _busybox(parts: Parts) -> tuple[list[Entry], dict, bool]:
    """busybox:VERSION, VERSION the one test/images/busybox/BASEIMAGE names: upstream's busybox, every applet a
    hard link to it in /bin, /root, /tmp, and the passwd and group of the base, with no base under it. Its ash, unlike
    Debian's, passes on a variable whose name is no shell name (`data-1`: the ConfigMap and Secrets "consumable
    via the environment" [Conformance] specs run `sh -c env`), and its messages are the ones specs expect
    ("/bin/sh: can't create /file: Read-only file system")."""
    path = parts.busybox / _base_tag(parts.k8s_module, "busybox", "busybox") / "busybox"
    binary = parts.built(path, BUSYBOX_BUILD)
    applets = subprocess.run([str(path), "--list"], check=True, capture_output=True, text=True).stdout.split()
    return ([*(d(name) for name in BUSYBOX_DIRS), d("root", 0o700), d("tmp", 0o1777),
             f("bin/busybox", binary, 0o755),
             *(hardlink(f"bin/{applet}", "bin/busybox", 0o755) for applet in sorted(set(applets) - {"busybox"})),
             f("etc/passwd", BUSYBOX_PASSWD), f("etc/group", BUSYBOX_GROUP)],
            {"Cmd": ["sh"]}, False)


def _glibc_dns_testing(_parts: Parts) -> tuple[list[Entry], dict, bool]:
    """glibc-dns-testing: upstream's is Debian with dnsutils; here the busybox base (its sh and hostname, on
    glibc) with the host's dig and getent."""
    return _programs(DNS_PROGRAMS), {"Cmd": ["sh"]}, True


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
    f"{E2E}/glibc-dns-testing": _glibc_dns_testing,
    f"{E2E}/kitten": _update_demo("kitten"),
    f"{E2E}/nautilus": _update_demo("nautilus"),
    f"{E2E}/nginx": _nginx,
    f"{E2E}/nonewprivs": _nonewprivs,
    f"{E2E}/nonroot": _nonroot,
    f"{E2E}/sample-apiserver": _sample_apiserver,
    "registry.k8s.io/etcd": _etcd,
    "registry.k8s.io/pause": _pause,
}
# the repositories each set's specs run (k8s_suite.SETS)
NODE_IMAGES = tuple(f"{E2E}/{name}" for name in ("agnhost", "busybox", "glibc-dns-testing", "nginx", "nonewprivs",
                                                 "nonroot")) + ("registry.k8s.io/pause",)
CONFORMANCE_IMAGES = NODE_IMAGES + (f"{E2E}/kitten", f"{E2E}/nautilus", f"{E2E}/sample-apiserver",
                                    "registry.k8s.io/etcd")


def wanted(listed: list[str], repos: Iterable[str]) -> dict[str, list[str]]:
    """repository (as e2e.test names it) -> its tags, of the images `e2e.test --list-images` printed that are among
    `repos`, a set's (NODE_IMAGES, CONFORMANCE_IMAGES); every one of `repos` must be among them, or upstream renamed
    an image the specs run."""
    repos = set(repos)
    unknown = sorted(repos - set(BUILDERS))
    if unknown:
        raise ValueError(f"no builder makes {', '.join(unknown)}")
    out: dict[str, list[str]] = {}
    for line in listed:
        ref = line.strip()
        if not ref or "@" in ref:
            continue
        repo, _, tag = ref.rpartition(":")
        if repo in repos and tag:
            out.setdefault(repo, []).append(tag)
    for tags in out.values():
        tags.sort()
    missing = sorted(repos - set(out))
    if missing:
        raise ValueError(f"e2e.test --list-images names none of {', '.join(missing)}: its image manifest changed")
    return out


def image_set(workdir: Path, images: dict[str, list[str]], e2e_bin: Path, k8s_module: Path,
              etcd: Path = ETCD, busybox: Path = BUSYBOX) -> list[CriImage]:
    """The images `wanted` chose (repository -> tags), each under its repository path on the mirror."""
    parts = Parts(workdir, e2e_bin, k8s_module, etcd, busybox)
    out = []
    for repo, tags in sorted(images.items()):
        entries, config, base = BUILDERS[repo](parts)
        out.append(CriImage(repo.split("/", 1)[1], sorted(tags), entries, config, base=base))
    return out


def layouts(workdir: Path, images: dict[str, list[str]], e2e_bin: Path,
            k8s_module: Path) -> list[tuple[CriImage, Path]]:
    """Each image as an OCI layout under workdir: built once for a run, pushed to each pair's cluster
    (cri_images.push_layouts)."""
    return build_layouts(workdir, lambda w: image_set(w, images, e2e_bin, k8s_module))


def k8s_module(version: str) -> Path:
    """The k8s.io/kubernetes module e2e.sh built from, in the module cache."""
    return GOMODCACHE / "k8s.io" / f"kubernetes@{version}"
