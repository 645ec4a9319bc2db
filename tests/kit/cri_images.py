"""The images critest (cri-tools v1.37.0) pulls, made from Debian packages and served by the test registry.

critest names its images in pkg/framework and pkg/validate: busybox, nginx, httpd and nonewprivs from
registry.k8s.io/e2e-test-images, and from gcr.io/k8s-staging-cri-tools the test-image-* family (distinct
images, one image under several tags, images whose config sets a user or a predefined group) and
hostnet-nginx-ARCH. This machine reaches no public registry, so each is built here and pushed to a local
registry under the same repository path; a mirror config (containerd's certs.d layout, which pyruntime's
image store reads too) sends registry.k8s.io, gcr.io and the rest to it.

The base is Debian's DYNAMIC busybox with one hard link per applet, plus the host's loader and the
libraries it needs: the static busybox runs an applet inside its own process when a shell calls it,
ignoring PATH, so critest's masked-paths spec (which execs applets through the PATH) would not see the
kernel's behaviour. The nginx and httpd images are busybox httpd behind small scripts that keep what
critest checks (nginx's pid file and "master process" in its command line, "httpd" in the log, ports 80
and 12003). nonewprivs and the sandbox's pause are tiny C programs built static by Debian's gcc.

Not reproducible offline: gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9a2...: a reference
pinned to the digest of the upstream image, which no local build can have (see DIGEST_PINNED_SPECS).
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pynode_cluster.components import MIRRORED_REGISTRIES, mirror_hosts
from tests.kit.busybox import ARCH, CACHE, busybox_from_deb, tar_directory
from tests.kit.images import Entry, add_image, d, f, tar_entries, write_index

DYNAMIC_ROOT = CACHE / "busybox-dynamic"  # the extracted busybox .deb

# The two images the CRI and kubelet tests run (built by image_set below): busybox with its applets, and busybox
# httpd serving "It works!" on port 80.
BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
HTTPD = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4"
# the tag Kubernetes' e2e rolling updates start from (imageutils.Httpd; HTTPD is its HttpdNew): the same build
HTTPD_PREVIOUS = "registry.k8s.io/e2e-test-images/httpd:2.4.38-4"

# critest specs that pull a reference pinned to an upstream digest: they cannot pass offline.
DIGEST_PINNED_SPECS = ["public image with digest should be pulled and removed"]


# The users and groups of docker-library busybox:1.37.0, the base of cri-tools' own test images.
BUSYBOX_PASSWD = """root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""
BUSYBOX_GROUP = "".join(f"{name}:x:{gid}:{members}\n" for name, gid, members in (
    ("root", 0, ""), ("daemon", 1, ""), ("bin", 2, ""), ("sys", 3, ""), ("adm", 4, ""), ("tty", 5, ""),
    ("disk", 6, ""), ("lp", 7, ""), ("mail", 8, ""), ("kmem", 9, ""), ("wheel", 10, "root"), ("cdrom", 11, ""),
    ("dialout", 18, ""), ("floppy", 19, ""), ("video", 28, ""), ("audio", 29, ""), ("tape", 32, ""),
    ("www-data", 33, ""), ("operator", 37, ""), ("utmp", 43, ""), ("plugdev", 46, ""), ("staff", 50, ""),
    ("lock", 54, ""), ("netdev", 82, ""), ("users", 100, ""), ("nogroup", 65534, "")))

# Applets docker-library's busybox has and Debian's (both builds) leaves to other packages, which critest
# runs in containers: ipcs (host-IPC specs) is util-linux's, needing only libc; pgrep (execSync timeout
# spec) is procps', which drags in libsystemd and more, so a script over /proc stands in for it.
HOST_TOOLS = ("/usr/bin/ipcs",)
PGREP_SH = """#!/bin/sh
# pgrep PATTERN: the pids whose command name matches (stand-in: Debian's busybox has no pgrep)
found=1
for dir in /proc/[0-9]*; do
  comm=$(cat "$dir/comm" 2>/dev/null) || continue
  if echo "$comm" | grep -q -- "$1"; then echo "${dir#/proc/}"; found=0; fi
done
exit $found
"""

# k8s e2e's nonewprivs: a setuid-root program printing its effective uid.
NNP_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("Effective uid: %d\n", (int)geteuid()); return 0; }
"""

# The pause program of Kubernetes' pause image, reduced: exits on INT/TERM, reaps its children.
PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &q, NULL); sigaction(SIGTERM, &q, NULL); sigaction(SIGCHLD, &r, NULL);
    for (;;) pause();
}
"""

# The web server stand-ins: busybox httpd as a child of a shell that stays pid 1, so that the stop signal
# (no default action for a namespace's init) ends it at once. The nginx one keeps nginx's pid file, has
# "master process" in /proc/1/cmdline and comm "nginx" (the script's name), so `pidof nginx` finds it;
# the httpd one says "httpd" in its log.
WEB_SH = """#!/bin/sh
{prologue}
echo "{name} stand-in: busybox httpd on port {port}"
httpd -f -p {port} -h {root} &
child=$!
trap 'kill $child; exit 0' TERM INT QUIT
wait $child
"""
NGINX_PROLOGUE = """[ "$1" = "master process" ] || exec /usr/sbin/nginx "master process" "$@"
echo $$ > /var/run/nginx.pid"""
NGINX_ROOT = "usr/share/nginx/html"
HTTPD_ROOT = "usr/local/apache2/htdocs"

INDEX_HTML = "<html><body><h1>It works!</h1></body></html>\n"


def _run(argv: list[str], **kw) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


@functools.cache
def dynamic_busybox() -> Path:
    """Debian's dynamically linked busybox."""
    return busybox_from_deb("busybox", DYNAMIC_ROOT)


def shared_libraries(binary: Path) -> list[Path]:
    """The loader and every library `binary` loads, as the host's ldd resolves them."""
    out = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(Path(path))
    return libs


def _install_with_libraries(binary: Path, target: Path, root: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, target)
    for lib in shared_libraries(binary):
        lib_target = root / lib.relative_to("/")
        if not lib_target.exists():
            lib_target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib.resolve(), lib_target)


def build_dynamic_rootfs(dest: Path) -> Path:
    """busybox:1.37.0's layout: the dynamic busybox, one hard link per applet, its libraries, users."""
    dest = Path(dest)
    for sub in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "tmp", "root", "var/run",
                "var/spool/mail", "var/www", "home"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    busybox = dest / "bin/busybox"
    _install_with_libraries(dynamic_busybox(), busybox, dest)
    for tool in HOST_TOOLS:
        _install_with_libraries(Path(tool), dest / tool.lstrip("/"), dest)
    (dest / "usr/bin/pgrep").write_text(PGREP_SH)
    (dest / "usr/bin/pgrep").chmod(0o755)
    applets = subprocess.run([str(busybox), "--list-full"], check=True, capture_output=True, text=True).stdout
    for applet in (a.strip() for a in applets.splitlines()):
        link = dest / applet
        if applet and not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(busybox, link)
    (dest / "etc/passwd").write_text(BUSYBOX_PASSWD)
    (dest / "etc/group").write_text(BUSYBOX_GROUP)
    return dest


def compile_static(source: str, out: Path) -> bytes:
    """A static executable from C source, by the host's gcc (Debian's gcc and libc6-dev)."""
    src = out.with_suffix(".c")
    src.write_text(source)
    _run(["gcc", "-static", "-O2", "-s", "-o", str(out), str(src)])
    return out.read_bytes()


@dataclass
class CriImage:
    """One image: its repository path on every mirrored registry, its tags, and what it adds to the base."""
    repo: str
    tags: list[str]
    entries: list[Entry] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    base: bool = True  # on top of the busybox layer


def _marker(name: str) -> list[Entry]:
    # image-test/Dockerfile: `ADD ${TEST} ${TEST}`, an empty file named after the image
    return [f(name)]


def web_entries(script: str, root: str, name: str) -> list[Entry]:
    dirs = [d(p) for p in _parents(root)]
    return dirs + [f(f"{root}/index.html", INDEX_HTML), f(f"usr/sbin/{name}", script, 0o755)]


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def image_set(workdir: Path) -> list[CriImage]:
    """Every image critest pulls (but the digest-pinned one), keyed by repository path."""
    staging, e2e = "k8s-staging-cri-tools", "e2e-test-images"
    nnp = compile_static(NNP_C, workdir / "nnp")
    pause = compile_static(PAUSE_C, workdir / "pause")
    nginx, hostnet_nginx = (WEB_SH.format(prologue=NGINX_PROLOGUE, name="nginx", port=port, root="/" + NGINX_ROOT)
                            for port in (80, 12003))
    httpd = WEB_SH.format(prologue="", name="httpd", port=80, root="/" + HTTPD_ROOT)
    predefined_passwd = BUSYBOX_PASSWD + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"
    predefined_group = BUSYBOX_GROUP + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"
    images = [
        CriImage(f"{e2e}/busybox", ["1.29-2"]),
        CriImage(f"{e2e}/nginx", ["1.14-2"], web_entries(nginx, NGINX_ROOT, "nginx"),
                 {"Entrypoint": ["/usr/sbin/nginx"], "Cmd": ["-g", "daemon off;"], "ExposedPorts": {"80/tcp": {}},
                  "StopSignal": "SIGQUIT"}),
        CriImage(f"{staging}/hostnet-nginx-{ARCH}", ["latest"], web_entries(hostnet_nginx, NGINX_ROOT, "nginx"),
                 {"Entrypoint": ["/usr/sbin/nginx"], "Cmd": ["-g", "daemon off;"],
                  "ExposedPorts": {"12003/tcp": {}}, "StopSignal": "SIGQUIT"}),
        CriImage(f"{e2e}/httpd", ["2.4.39-4", "2.4.38-4"], web_entries(httpd, HTTPD_ROOT, "httpd-foreground"),
                 {"Cmd": ["httpd-foreground"], "ExposedPorts": {"80/tcp": {}}}),
        CriImage(f"{e2e}/nonewprivs", ["1.3"],
                 [d("usr/local"), d("usr/local/bin"), f("usr/local/bin/nnp", nnp, 0o4755)],
                 {"Entrypoint": ["/usr/local/bin/nnp"], "Cmd": []}),
        CriImage("pause", ["3.9", "3.10"], [f("pause", pause, 0o755)],
                 {"Entrypoint": ["/pause"], "Cmd": [], "Env": []}, base=False),
        # containerd 1.6's sandbox image by default: a different image, since critest counts the tags of
        # pause:3.9 (and removes it)
        CriImage("pause", ["3.6"], [f("pause", pause, 0o755)],
                 {"Entrypoint": ["/pause"], "Cmd": [], "Env": [], "Labels": {"org.pynode.role": "sandbox"}},
                 base=False),
        CriImage(f"{staging}/test-image-predefined-group", ["latest"],
                 [d("etc"), f("etc/passwd", predefined_passwd), f("etc/group", predefined_group),
                  d("home/default-user", uid=1000, gid=1000)], {"User": "1000"}),
        CriImage(f"{staging}/test-image-tags", ["1", "2", "3"], _marker("same-image")),
    ]
    for name, user in (("uid", "1002"), ("username", "www-data"), ("uid-group", "1003:1004"),
                       ("username-group", "www-data:1004")):
        images.append(CriImage(f"{staging}/test-image-user-{name}", ["latest"], config={"User": user}))
    for name in ("test-image-1", "test-image-2", "test-image-3", "test-image-latest", "test-image-digest"):
        images.append(CriImage(f"{staging}/{name}", ["latest"], _marker(name)))
    for tag in ("test", "all"):
        images.append(CriImage(f"{staging}/test-image-tag", [tag], _marker(tag)))
    return images


def build_layouts(workdir: Path, images: Callable[[Path], list[CriImage]] = image_set) -> list[tuple[CriImage, Path]]:
    """Each image of the set `images` makes in workdir as an OCI layout (tag "latest") under workdir; the busybox
    layer is built once."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    base = tar_directory(build_dynamic_rootfs(workdir / "rootfs"))
    out = []
    for i, image in enumerate(images(workdir)):
        layout = workdir / f"layout-{i}"
        layers = ([(base, "gzip")] if image.base else []) + ([(tar_entries(image.entries), "gzip")]
                                                             if image.entries else [])
        desc, _ = add_image(layout, layers, config_extra=image.config)
        write_index(layout, [desc])
        out.append((image, layout))
    return out


def push_all(registry, workdir: Path) -> list[str]:
    """Builds every image and pushes it under each of its tags; returns the repo:tag names pushed."""
    return push_layouts(registry, build_layouts(workdir))


def push_layouts(registry, layouts: list[tuple[CriImage, Path]]) -> list[str]:
    """Pushes each built image under each of its tags; returns the repo:tag names pushed."""
    pushed = []
    for image, layout in layouts:
        for tag in image.tags:
            registry.push(layout, f"{image.repo}:{tag}")
            pushed.append(f"{image.repo}:{tag}")
    return pushed


def write_hosts_dir(hosts_dir: Path, mirror: str, registries: tuple[str, ...] = MIRRORED_REGISTRIES) -> Path:
    """The certs.d mirror config (pynode_cluster.components.mirror_hosts) written into `hosts_dir`."""
    for name, text in mirror_hosts(mirror, registries).items():
        (Path(hosts_dir) / name).parent.mkdir(parents=True, exist_ok=True)
        (Path(hosts_dir) / name).write_text(text)
    return Path(hosts_dir)
