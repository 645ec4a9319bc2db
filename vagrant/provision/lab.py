#!/usr/bin/env python3
"""The Vagrant lab's host side: `prepare` writes what the VMs are provisioned from, `control-plane up|down` runs the
lab's control plane on this host (make test-lab) instead of in a VM.

    lab.py prepare --out vagrant/.lab --control-plane-ip IP --node NAME=IP [--node NAME=IP ...] [--with-tests]
    lab.py control-plane up --config vagrant/.lab/lab.json [--ip IP]
    lab.py control-plane down

`prepare` writes OUT/: lab.json (pynode_cluster.lab.Lab), pki/ (the CA on the first run, kept after it, and every
certificate), bin/ (the Go-built peers, from ~/.cache/pynode/bin), wheelhouse/ (the project's wheel and its
dependencies' for the guests' Python 3.11), debs/ (the Debian packages a bare Debian 12 VM lacks, their
dependencies, and a Packages index: a local repository), provision.sh (run in each VM). The VMs need no network.
`--with-tests` (make test-lab, which runs the project's root tests inside its node VM too) adds the wheels of
pytest and its plugins at the host venv's versions to the wheelhouse, crictl to bin/, and to debs/ the
packages the CRI tests' fixtures run (debs/tests.txt names them; provision.sh installs none of these). Each
file is written atomically and only when its content changes: a second `prepare` with the same inputs changes
nothing (it asks the package registries only for what is missing or has a newer version).

Run it with the project's Python (.venv/bin/python); control-plane up/down as root.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from pynode_cluster import components, lab, lab_kubeadm

CHECKOUT = Path(__file__).resolve().parents[2]

# what a bare Debian 12 VM lacks for a node or the control plane: the venv, the runtime's libseccomp,
# kube-proxy's iptables and conntrack, the routes' iproute2, modprobe (br_netfilter)
GUEST_PACKAGES = ("python3-venv", "libseccomp2", "iproute2", "iptables", "conntrack", "kmod")
# what the root tests need in a VM beyond the project's dependencies (the test extra less its linters and
# generators), and the peer they drive the node's CRI server with
TEST_DISTRIBUTIONS = ("pytest", "pytest-timeout")
TEST_PEERS = ("crictl",)
# what the CRI tests' fixtures run in a VM: the test registry and what pushes to it (tests/integration/
# registry_server.py: docker-registry, skopeo, apache2-utils' htpasswd), and the C compiler that builds the
# pause and nonewprivs images' static programs (tests/kit/cri_images.py), and nft, with which the CNI tests'
# fixtures look for and remove the bridge's nat table (tests/integration/cni_helpers.py), and containerd (1.6,
# with runc, which its package depends on), the stock runtime the systemd driver's and the node shutdown's tests
# run beside pyruntime-cri (tests/kit/containerd_cri.py); installed by the test tier only, no service started
TEST_PACKAGES = ("docker-registry", "skopeo", "apache2-utils", "gcc", "libc6-dev", "nftables", "containerd")


class PrepareError(RuntimeError):
    pass


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise PrepareError(f"{' '.join(map(str, argv))} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result


def write(path: Path, data: bytes, mode: int = 0o644) -> bool:
    return lab.System().write(path, data, mode)


# ---- wheelhouse --------------------------------------------------------------------------------------------

def _wheel_content(path: Path) -> list[tuple[str, int]]:
    """A wheel's members and their CRCs: two builds of the same tree differ only in the zip's timestamps."""
    with zipfile.ZipFile(path) as z:
        return sorted((i.filename, i.CRC) for i in z.infolist())


def wheelhouse(dir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The project's wheel (replaced only when its content changed) and every runtime dependency's and the
    `extra` requirements' (asked of the index only when the wheelhouse cannot satisfy them offline)."""
    dir.mkdir(parents=True, exist_ok=True)
    changed = []
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    with tempfile.TemporaryDirectory(dir=dir.parent, prefix=".wheel-") as tmp:
        run([*pip, "wheel", "--no-deps", "-w", tmp, str(CHECKOUT)], cwd=tmp)
        shutil.rmtree(CHECKOUT / "build", ignore_errors=True)  # setuptools' leftover in the checkout
        (built,) = Path(tmp).glob("pynode-*.whl")
        target = dir / built.name
        if not target.exists() or _wheel_content(target) != _wheel_content(built):
            for old in dir.glob("pynode-*.whl"):
                old.unlink()
            os.replace(built, target)
            changed.append(target.name)
    with tempfile.TemporaryDirectory(dir=dir.parent, prefix=".deps-") as tmp:
        wanted = [str(target), *extra]
        offline = subprocess.run([*pip, "wheel", "--no-index", "--find-links", str(dir), "-w", tmp, *wanted],
                                 capture_output=True, text=True)
        if offline.returncode != 0:  # something is missing: ask the index
            run([*pip, "wheel", "--find-links", str(dir), "-w", tmp, *wanted])
            for wheel in Path(tmp).glob("*.whl"):
                if not (dir / wheel.name).exists():
                    os.replace(wheel, dir / wheel.name)
                    changed.append(wheel.name)
    return changed


# ---- debs --------------------------------------------------------------------------------------------------

def _closure(packages: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """The packages and everything they depend on (not recommends), but for the `required` ones every Debian
    has: name -> (candidate version, architecture)."""
    out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
               "--no-breaks", "--no-replaces", "--no-enhances", *packages]).stdout
    names = sorted({line.strip() for line in out.splitlines() if line and not line[0].isspace()
                    and not line.startswith("<")})
    return _candidates(names, packages, with_required=False)


def _installed_on_nothing(packages: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """What apt would install for the packages on a machine that has nothing, `required` ones included (a
    package may pin one at its own version: libc6-dev's libc6): apt's own choice among alternatives, where
    _closure takes them all (skopeo's gpg-agent would bring every pinentry, GTK's and Qt's)."""
    with tempfile.NamedTemporaryFile(prefix="lab-empty-status-") as status:
        out = run(["apt-get", "-s", "-q", "--no-install-recommends", "-o", f"Dir::State::status={status.name}",
                   "-o", "Debug::NoLocking=1", "install", *packages]).stdout
    names = sorted({line.split()[1] for line in out.splitlines() if line.startswith("Inst ")})
    return _candidates(names, packages, with_required=True)


def _candidates(names: list[str], packages: tuple[str, ...], with_required: bool) -> dict[str, tuple[str, str]]:
    shown = run(["apt-cache", "show", "--no-all-versions", *names]).stdout
    closure = {}
    for stanza in shown.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Package") and (with_required or fields.get("Priority") != "required"):
            closure[fields["Package"]] = (fields["Version"], fields["Architecture"])
    missing = [p for p in packages if p not in closure]
    if missing:
        raise PrepareError(f"apt knows no candidate for {', '.join(missing)}: run `apt-get update`")
    return closure


def debs(dir: Path, packages: tuple[str, ...] = GUEST_PACKAGES, tests: tuple[str, ...] = ()) -> list[str]:
    """A local repository in `dir`: each package of the closure at apt's candidate version (downloaded only when
    that file is not there yet), a Packages index, wanted.txt (what provision.sh installs when missing) and
    tests.txt (`tests`, which the test tier installs from it, their dependencies in the repository too)."""
    dir.mkdir(parents=True, exist_ok=True)
    closure = {**(_installed_on_nothing(tests) if tests else {}), **_closure(packages)}
    wanted = {f"{p}_{v.replace(':', '%3a')}_{a}.deb": p for p, (v, a) in closure.items()}  # apt-get download's
    changed = []
    need = [package for name, package in wanted.items() if not (dir / name).exists()]
    if need:
        with tempfile.TemporaryDirectory(dir=dir.parent, prefix=".debs-") as tmp:
            run(["apt-get", "download", "-q", *(f"{p}={closure[p][0]}" for p in need)], cwd=tmp)
            for deb in Path(tmp).glob("*.deb"):
                os.replace(deb, dir / deb.name)
                changed.append(deb.name)
    for old in dir.glob("*.deb"):
        if old.name not in wanted:
            old.unlink()
            changed.append(f"removed {old.name}")
    missing = [name for name in wanted if not (dir / name).exists()]
    if missing:
        raise PrepareError(f"apt-get download left no {', '.join(missing)} in {dir}")
    index = "".join(_stanza(dir / name) for name in sorted(wanted))
    if write(dir / "Packages", index.encode()):
        changed.append("Packages")
    for listing, names in (("wanted.txt", packages), ("tests.txt", tests)):
        if write(dir / listing, "".join(f"{p}\n" for p in names).encode()):
            changed.append(listing)
    return changed


def _stanza(deb: Path) -> str:
    """The deb's Packages entry: its control fields, where it is, its size and hash."""
    control = run(["dpkg-deb", "-f", str(deb)]).stdout.rstrip("\n")
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    return f"{control}\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\nSHA256: {digest}\n\n"


# ---- prepare -----------------------------------------------------------------------------------------------

def _pinned(distributions: tuple[str, ...]) -> tuple[str, ...]:
    """NAME==VERSION of each as this Python has it installed: the guests test with what the host tests with."""
    from importlib import metadata
    try:
        return tuple(f"{d}=={metadata.version(d)}" for d in distributions)
    except metadata.PackageNotFoundError as e:
        raise PrepareError(f"{e.name} is not installed in {sys.prefix}: `make setup` installs the test extra") from e


def prepare(out: Path, control_plane_ip: str, nodes: list[tuple[str, str]], registry_mirror: str = "",
            with_debs: bool = True, with_tests: bool = False, kubeadm: bool = False) -> int:
    started = time.monotonic()
    config = lab.Lab.make(control_plane_ip, nodes, registry_mirror=registry_mirror)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps: list[tuple[str, list[str]]] = []
    pki_written = lab.prepare_pki(config, out / "pki")
    if kubeadm:  # the token of an earlier prepare is kept: VMs provisioned with it may join still
        try:
            earlier = lab.Lab.load(out / "lab.json").kubeadm
        except lab.LabError:
            earlier = None
        config = dataclasses.replace(config, kubeadm=lab.KubeadmJoin(
            earlier.token if earlier else lab_kubeadm.new_token(),
            lab_kubeadm.ca_cert_hash((out / "pki" / "ca.crt").read_bytes())))
    steps.append(("lab.json", ["lab.json"] if write(out / "lab.json", config.to_json().encode()) else []))
    steps.append(("pki", pki_written))
    system = lab.System()
    test_peers = tuple(components.PEERS.parent / p for p in TEST_PEERS) if with_tests else ()
    for source in (*(components.PEERS / peer for peer in lab.PEERS), *test_peers):
        peer = source.name
        if not source.is_file():
            raise PrepareError(f"{source} is missing: `make setup` builds the peers")
        system.copy(source, out / "bin" / peer)
    steps.append(("bin", system.changes))
    steps.append(("wheelhouse", wheelhouse(out / "wheelhouse", _pinned(TEST_DISTRIBUTIONS) if with_tests else ())))
    if with_debs:
        steps.append(("debs", debs(out / "debs", tests=TEST_PACKAGES if with_tests else ())))
    script = (Path(__file__).with_name("provision.sh")).read_bytes()
    steps.append(("provision.sh", ["provision.sh"] if write(out / "provision.sh", script, 0o755) else []))
    for step, changes in steps:
        print(f"{step}: {', '.join(changes) if changes else 'unchanged'}")
    print(f"prepared {out} in {time.monotonic() - started:.1f} s: {sum(len(c) for _, c in steps) or 'no'} change(s)")
    return 0


def _node(value: str) -> tuple[str, str]:
    name, sep, ip = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--node {value!r}: NAME=IP")
    return name, ip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write OUT (lab.json, pki, bin, wheelhouse, debs, provision.sh)")
    prep.add_argument("--out", type=Path, required=True)
    prep.add_argument("--control-plane-ip", required=True)
    prep.add_argument("--node", type=_node, action="append", required=True, metavar="NAME=IP",
                      help="a node VM, in order (node i gets the pod CIDR 10.244.i.0/24)")
    prep.add_argument("--registry-mirror", default="", metavar="HOST:PORT",
                      help="a plain-HTTP registry the nodes pull every image from (VMs without network)")
    prep.add_argument("--no-debs", dest="debs", action="store_false",
                      help="no Debian packages (for VMs that have them or reach a mirror)")
    prep.add_argument("--kubeadm", action="store_true",
                      help="a lab made by kubeadm init (the control-plane VM) and kubeadm join (the node VMs)")
    prep.add_argument("--with-tests", action="store_true",
                      help="pytest's wheels, crictl and the CRI tests' packages too, for the root tests run in a "
                           "node VM (make test-lab)")
    cp = sub.add_parser("control-plane", help="the lab's control plane on this host (root)")
    cp.add_argument("action", choices=("up", "down"))
    cp.add_argument("--config", type=Path, default=CHECKOUT / "vagrant" / ".lab" / "lab.json")
    cp.add_argument("--ip", help="the address to serve on: must be lab.json's control_plane.ip")
    args = p.parse_args(argv)
    try:
        if args.command == "prepare":
            return prepare(args.out, args.control_plane_ip, args.node, args.registry_mirror, args.debs,
                           args.with_tests, args.kubeadm)
        if os.geteuid() != 0:
            p.error("the control plane writes under /var/lib/pynode: run it as root")
        from pynode_cluster import lab_host
        if args.action == "up":
            return lab_host.up(args.config, args.ip, out=sys.stdout)
        return lab_host.down(out=sys.stdout)
    except (lab.LabError, PrepareError) as e:
        print(f"lab.py {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
