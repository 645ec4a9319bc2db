"""critest (cri-tools v1.37.0), the CRI conformance suite, against one or more CRI endpoints side by side.

`make conformance` runs it (not part of `make test`: the whole suite takes minutes). For each endpoint
(containerd 1.6, Debian's, with runc and the reference CNI plugins; pyruntime-cri when it is on PATH) it:
starts the test registry and pushes the images critest pulls (tests/kit/cri_images.py), writes the mirror
config that sends registry.k8s.io, gcr.io, docker.io ... to it (containerd's certs.d layout, which
pyruntime-cri reads too), a CNI conf dir (bridge + host-local + portmap), starts the endpoint with its own
root/state/socket under a scratch directory, runs critest with --parallel as cri-tools' CI does and a
ginkgo JSON and JUnit report, then stops everything and removes what the run left on the host.

critest leaves things its specs make outside any pod: SysV shared memory segments (host-IPC specs) and the
portmap plugin's CNI-HOSTPORT-* iptables chains; the runner removes those that appeared during the run, and
every mount, cgroup, netns, link and process that appeared (it is their subreaper), and puts host
forwarding back as it was. It holds the
integration lock for each endpoint's run, since it makes global kernel objects.

Scores (passed/failed/skipped per spec) go to ~/.cache/pynode/critest-results/DATE/ENDPOINT/ and a
side-by-side summary.md in DATE/.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import psutil

from cni_plugins import helper, launch
from pynode_cluster import hosts
from pynode_cluster.node import containerd_config
from pynode_cluster.node import install_plugins as install_our_plugins
from tests.integration.cni_helpers import FORWARDING
from tests.integration.registry_server import Registry
from tests.kit.busybox import CACHE
from tests.kit.cri_images import DIGEST_PINNED_SPECS, push_all, write_hosts_dir
from tests.leakcheck import Snapshot, format_leaks, reap_orphans

PEERS_BIN = Path(os.environ.get("PEERS_BIN", CACHE / "bin"))
CRITEST = PEERS_BIN / "critest"
CRICTL = PEERS_BIN / "crictl"
REFERENCE_CNI = PEERS_BIN / "cni"
RESULTS = CACHE / "critest-results"
LOCK = Path("/tmp/pynode-itest.lock")
CONTAINERD_RUN = Path("/run/containerd")  # 1.6's shims put their sockets here, whatever the config says
PR_SET_CHILD_SUBREAPER = 36
POD_SUBNET = "10.234.0.0/16"
BRIDGE = "pyt-critest0"
NETWORK = "pynode-critest"

def conflist(bridge_type: str, ipam_type: str, portmap_type: str, data_dir: Path, *, name: str = NETWORK,
             bridge: str = BRIDGE, subnet: str = POD_SUBNET) -> dict:
    return {"cniVersion": "1.0.0", "name": name, "plugins": [
        {"type": bridge_type, "bridge": bridge, "isGateway": True, "ipMasq": True,
         "ipam": {"type": ipam_type, "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                  "dataDir": str(data_dir)}},
        {"type": portmap_type, "capabilities": {"portMappings": True}},
    ]}


class Endpoint:
    """A CRI server under test, with its own root, state and socket under `work`, and its pods on `bridge`
    in `subnet` (a subclass picks others, so two suites' pods never share a bridge)."""
    name = ""
    bridge = BRIDGE
    subnet = POD_SUBNET

    def __init__(self, work: Path, hosts_dir: Path) -> None:
        self.work, self.hosts_dir = work, hosts_dir
        self.sock = work / "cri.sock"
        self.cni_conf = work / "net.d"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def cni_setup(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self.cni_setup()
        with open(self.work / "daemon.log", "wb") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not serve on {self.sock}: {self.log_tail()}")
            if self.sock.exists() and subprocess.run(
                    [str(CRICTL), "--runtime-endpoint", self.url, "--timeout", "5s", "info"],
                    capture_output=True).returncode == 0:
                return
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None:
            return
        hosts.terminate(psutil.Process(self.proc.pid), 30)
        self.proc.wait()  # its status, for Popen (terminate reaped it already)
        self.proc = None

    def log_tail(self) -> str:
        return (self.work / "daemon.log").read_text(errors="replace")[-3000:]


class Containerd(Endpoint):
    """Debian's containerd 1.6 with runc (the runc v2 shim) and the reference CNI plugins v1.10.0; `cgroup_driver`
    "systemd": runc's systemd driver (SystemdCgroup), else its cgroupfs one."""
    name = "containerd"
    cni_bin = REFERENCE_CNI
    cgroup_driver: str | None = None

    def cni_setup(self) -> None:
        self.cni_conf.mkdir(parents=True, exist_ok=True)
        (self.cni_conf / "10-critest.conflist").write_text(json.dumps(
            conflist("bridge", "host-local", "portmap", self.work / "ipam", bridge=self.bridge,
                     subnet=self.subnet)))

    def argv(self) -> list[str]:
        config = self.work / "containerd.toml"
        config.write_text(containerd_config(self.work, self.sock, self.cni_bin, self.cni_conf, self.hosts_dir,
                                            systemd_cgroup=self.cgroup_driver == "systemd"))
        return [shutil.which("containerd") or "/usr/bin/containerd", "--config", str(config)]


def pyruntime_cri_bin() -> str | None:
    """This checkout's launcher (next to the interpreter running the harness), else the one on PATH."""
    own = Path(sys.executable).with_name("pyruntime-cri")
    return str(own) if own.exists() else shutil.which("pyruntime-cri")


class PyruntimeCri(Endpoint):
    """pyruntime-cri with our CNI plugins (installed into its own bin dir, as `make run` does)."""
    name = "pyruntime-cri"

    def cni_setup(self) -> None:
        install_our_plugins(self.work / "cni-bin")
        self.cni_conf.mkdir(parents=True, exist_ok=True)
        (self.cni_conf / "10-critest.conflist").write_text(json.dumps(
            conflist("pybridge", "pyhost-local", "pyportmap", self.work / "ipam", bridge=self.bridge,
                     subnet=self.subnet)))

    def argv(self) -> list[str]:
        return [pyruntime_cri_bin() or "pyruntime-cri", "--listen", self.url,
                "--root", str(self.work / "root"), "--state", str(self.work / "state"),
                "--cni-conf-dir", str(self.cni_conf), "--cni-bin-dir", str(self.work / "cni-bin"),
                "--registry-config-dir", str(self.hosts_dir)]


ENDPOINTS: dict[str, type[Endpoint]] = {"containerd": Containerd, "pyruntime-cri": PyruntimeCri}

# Failures of a reference that are its own, not the harness's: they don't fail `make conformance`.
KNOWN_FAILURES = {"containerd": {
    # containerd 1.6 answers NotFound to a stop of an unknown id; the CRI says stop is idempotent
    "[k8s.io] Idempotence StopContainer should not return an error if not found",
    "[k8s.io] Idempotence StopPodSandbox should not return an error if not found",
}}


# --- what critest leaves on the host ---------------------------------------------------------------------

def shm_segments() -> set[int]:
    """SysV shared memory ids in the host's IPC namespace (critest's host-IPC specs make some)."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(line.split()[1]) for line in lines if line.strip()}


def nat_chains(tool: str) -> set[str]:
    out = subprocess.run([tool, "-w", "-t", "nat", "-S"], capture_output=True, text=True).stdout
    return {line.split()[1] for line in out.splitlines() if line.startswith("-N ")}


def remove_chains(tool: str, chains: set[str]) -> None:
    """Deletes the rules that jump to `chains` (made by this run), then the chains themselves."""
    if not chains:
        return
    rules = subprocess.run([tool, "-w", "-t", "nat", "-S"], capture_output=True, text=True).stdout.splitlines()
    for rule in rules:
        parts = shlex.split(rule)  # comments are quoted
        if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in chains:
            subprocess.run([tool, "-w", "-t", "nat", "-D", *parts[1:]], capture_output=True)
    for chain in chains:
        subprocess.run([tool, "-w", "-t", "nat", "-F", chain], capture_output=True)
    for chain in chains:
        subprocess.run([tool, "-w", "-t", "nat", "-X", chain], capture_output=True)


@dataclass
class HostState:
    snapshot: Snapshot
    shm: set[int]
    chains: dict[str, set[str]]
    forwarding: dict[str, str]  # the bridge plugin turns host forwarding on for its gateway

    @classmethod
    def take(cls) -> HostState:
        return cls(Snapshot.take(), shm_segments(), {t: nat_chains(t) for t in ("iptables", "ip6tables")},
                   {p: Path(p).read_text() for p in FORWARDING if Path(p).exists()})


def cleanup(before: HostState, work: Path, keep: set[int]) -> str:
    """Removes what the run left that was not there before (processes but `keep`, the registry); returns
    what could not be removed."""
    try:  # our plugins' helper in this netns outlives the daemon; killed below, it would leave its socket and lock
        helper.stop(launch.DEFAULT_NAME)
    except TimeoutError:
        pass  # killed below with the rest
    for child in psutil.Process().children(recursive=True):
        if child.pid in keep:
            continue
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs([c for c in psutil.Process().children(recursive=True) if c.pid not in keep], timeout=10)
    reap_orphans()
    after = Snapshot.take()
    new = {k: after.kinds[k] - before.snapshot.kinds.get(k, set()) for k in after.kinds}
    for mount_point in sorted(new["mounts"], key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], capture_output=True)
    for ns in new["network namespaces"]:
        Path(ns).unlink(missing_ok=True)
    for link in new["links"]:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    for cg in sorted(new["cgroups"], key=len, reverse=True):
        hosts.remove_cgroup(Path(cg), kill=True, tries=20)  # the cgroup is new: its processes are the run's
    for shmid in shm_segments() - before.shm:
        subprocess.run(["ipcrm", "-m", str(shmid)], capture_output=True)
    for tool, chains in before.chains.items():
        remove_chains(tool, {c for c in nat_chains(tool) - chains if c.startswith("CNI-")})
    for knob, value in before.forwarding.items():
        Path(knob).write_text(value)
    shutil.rmtree(work, ignore_errors=True)
    leaks = Snapshot.take().leaked_since(before.snapshot)
    extra = []
    if shm_segments() - before.shm:
        extra.append(f"shm segments: {sorted(shm_segments() - before.shm)}")
    for tool, chains in before.chains.items():
        if nat_chains(tool) - chains:
            extra.append(f"{tool} nat chains: {sorted(nat_chains(tool) - chains)}")
    return "; ".join(x for x in (format_leaks(leaks), *extra) if x)


# --- running critest and reading its report ---------------------------------------------------------------

def skip_pattern(extra: list[str]) -> str:
    return "|".join(re.escape(s) for s in [*DIGEST_PINNED_SPECS, *extra])


def critest_argv(url: str, report_dir: Path, parallel: int, skip: str, focus: str) -> list[str]:
    argv = [str(CRITEST), f"--runtime-endpoint={url}", f"--image-endpoint={url}", f"--parallel={parallel}",
            f"--ginkgo.skip={skip}", f"--ginkgo.json-report={report_dir / 'report.json'}",
            f"--ginkgo.junit-report={report_dir / 'junit.xml'}", "--ginkgo.no-color", "--ginkgo.timeout=1h"]
    if focus:
        argv.append(f"--ginkgo.focus={focus}")
    return argv


def scores(report: Path) -> dict[str, dict]:
    """spec name -> {"state": passed|failed|skipped|..., "message": why} from ginkgo's JSON report."""
    out: dict[str, dict] = {}
    for suite in json.loads(report.read_text()):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            name = " ".join([*(spec.get("ContainerHierarchyTexts") or []), spec.get("LeafNodeText", "")])
            failure = spec.get("Failure") or {}
            message = (failure.get("Message") or "").strip().splitlines()[:3]
            if spec.get("State") == "skipped" and not message:
                message = ["not selected (--ginkgo.skip/--ginkgo.focus, or a benchmark)"]
            out[name] = {"state": spec.get("State", "unknown"), "message": message}
    return out


def run_endpoint(cls: type[Endpoint], mirror: Mirror, out_dir: Path, *, parallel: int, skip: str, focus: str = "",
                 lock: bool = True) -> dict[str, dict]:
    """critest against one endpoint; the host is left as found. lock=False when the caller holds the
    integration lock already (a pytest run under flock)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock_file:
        if lock:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        before = HostState.take()
        work = Path(tempfile.mkdtemp(prefix=f"pynode-critest-{cls.name}-", dir="/var/tmp"))
        endpoint = cls(work, mirror.hosts_dir)
        run_dir_existed = CONTAINERD_RUN.exists()
        try:
            endpoint.start()
            env = {**os.environ, "PATH": f"{PEERS_BIN}:{os.environ.get('PATH', '')}"}
            with open(out_dir / "critest.log", "wb") as log:
                subprocess.run(critest_argv(endpoint.url, out_dir, parallel, skip, focus), stdout=log,
                               stderr=subprocess.STDOUT, env=env, cwd=work, timeout=3600)
        finally:
            endpoint.stop()
            if (work / "daemon.log").exists():
                shutil.copy2(work / "daemon.log", out_dir / "daemon.log")
            if not run_dir_existed:
                shutil.rmtree(CONTAINERD_RUN, ignore_errors=True)
            leaks = cleanup(before, work, {mirror.registry_pid})
    if leaks:
        (out_dir / "leaks.txt").write_text(leaks + "\n")
        print(f"{cls.name}: left behind (could not remove): {leaks}", file=sys.stderr)
    report = out_dir / "report.json"
    result = scores(report) if report.exists() else {}
    (out_dir / "scores.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    return result


@dataclass
class Mirror:
    hosts_dir: Path
    registry_pid: int


@contextlib.contextmanager
def critest_registry(tmp: Path) -> Iterator[Mirror]:
    """The test registry holding every image critest pulls, and the certs.d mirror config pointing at it."""
    registry = Registry(tmp / "registry").start()
    try:
        assert registry.proc is not None
        push_all(registry, tmp / "images")
        yield Mirror(write_hosts_dir(tmp / "certs.d", registry.host), registry.proc.pid)
    finally:
        registry.stop()


def summary(results: dict[str, dict[str, dict]]) -> str:
    names = sorted({spec for r in results.values() for spec in r})
    lines = ["| endpoint | passed | failed | skipped |", "|---|---|---|---|"]
    for ep, r in results.items():
        states = [s["state"] for s in r.values()]
        lines.append(f"| {ep} | {states.count('passed')} | {states.count('failed')} | "
                     f"{len(states) - states.count('passed') - states.count('failed')} |")
    lines += ["", "| spec | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    lines += [f"| {n} | " + " | ".join(results[ep].get(n, {}).get("state", "-") for ep in results) + " |"
              for n in names]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    default = ["containerd"] + (["pyruntime-cri"] if pyruntime_cri_bin() else [])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # no `choices`: argparse would check the default list as one value against them and refuse it
    p.add_argument("endpoints", nargs="*", default=default,
                   help=f"CRI servers to run critest against: {', '.join(sorted(ENDPOINTS))} "
                        f"(default: {' '.join(default)})")
    p.add_argument("--parallel", type=int, default=8, help="critest --parallel, as cri-tools' CI (8)")
    p.add_argument("--skip", action="append", default=[], help="more specs to skip (literal substrings)")
    p.add_argument("--focus", default="", help="ginkgo focus regexp")
    p.add_argument("--results", type=Path, default=RESULTS / date.today().isoformat())
    args = p.parse_args(argv)
    for name in args.endpoints:
        if name not in ENDPOINTS:
            p.error(f"endpoint {name!r}: not one of {', '.join(sorted(ENDPOINTS))}")
    if os.geteuid() != 0:
        p.error("critest needs root")
    for needed in (CRITEST, PEERS_BIN / "ginkgo", CRICTL):
        if not needed.exists():
            p.error(f"{needed} is missing: run `make peers`")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="pynode-critest-registry-", dir="/var/tmp") as tmp, \
            critest_registry(Path(tmp)) as mirror:
        for name in args.endpoints:
            results[name] = run_endpoint(ENDPOINTS[name], mirror, args.results / name, parallel=args.parallel,
                                         skip=skip_pattern(args.skip), focus=args.focus)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "summary.md").write_text(summary(results))
    for name, r in results.items():
        states = [s["state"] for s in r.values()]
        print(f"{name}: {states.count('passed')} passed, {states.count('failed')} failed, "
              f"{len(states) - states.count('passed') - states.count('failed')} skipped "
              f"({args.results / name})")
    unexpected = {name: sorted(spec for spec, s in r.items() if s["state"] == "failed"
                               and spec not in KNOWN_FAILURES.get(name, set()))
                  for name, r in results.items()}
    for name, specs in unexpected.items():
        for spec in specs:
            print(f"{name}: FAILED {spec}", file=sys.stderr)
    return 0 if all(results.values()) and not any(unexpected.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
