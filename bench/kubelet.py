"""pykubelet against the stock kubelet (v1.37.2): pod start latency, memory and CPU, on the same CRI runtime.

What a user of a node waits for is the time from `kubectl create` to the pod Running; what the node pays is
the kubelet's memory and CPU. Both kubelets run in turn (one at a time, each as a node of its own) against
one stock control plane (etcd + kube-apiserver, tests/kit/controlplane.py) and one CRI runtime, so the only
difference is the kubelet: containerd 1.6 with CRI on (tests/kit/containerd_cri.py, our CNI plugins), then
pyruntime-cri (tests/integration/cri_node.py), each with a fresh control plane.

Latency is measured from just before the pod's create request to the first watch event that shows it
Running (a watch opened before the create, at the resourceVersion of a list, so no event is missed): for
one pod at a time (repeated) and for N pods created at once (a pool of threads sends the creates). The
image (busybox, from the test registry through certs.d mirrors) is pulled before any timing, and each
kubelet runs one warm-up pod first. Memory is the kubelet process's RSS and PSS (/proc/PID/smaps_rollup)
idle and with the N pods running; CPU is the process's user+system time (its threads and the children it
reaped, /proc/PID/stat) from the first create of the N pods until all run, and until all are deleted,
per pod.

It takes the integration lock for each runtime in turn (the runtimes and the stock kubelet make bridges,
netns, cgroups, iptables chains and mounts) and puts the host back as found: the stock kubelet's host
changes with the stock kubelet test's own clean-up (tests/e2e/test_cri_stock_kubelet.py), the cgroups
with the kubelet kit's.
Needs root and the peers (`make peers`).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import start_as_root
from bench.cri import memory_kib
from bench.runtime import pct
from tests.conformance import critest

SINGLE = 10
BATCH = 30
KUBELETS = ("pykubelet", "kubelet")
RUNTIMES = ("containerd", "pyruntime-cri")
PYRUNTIME_CRI_BRIDGE, PYRUNTIME_CRI_SUBNET = "pyt-benchk0", "10.239.0.0/24"
NODES = {"pykubelet": ("bench-pykubelet", "10.201.0.250"), "kubelet": ("bench-kubelet", "")}
NAMESPACE = "default"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"bench.kubelet: {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLK_TCK


def pod_manifest(name: str, node: str, tag: str) -> dict:
    from tests.kit.kubelet_node import BUSYBOX

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench": tag}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 5, "automountServiceAccountToken": False,
                     "enableServiceLinks": False,
                     "containers": [{"name": "sleep", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}]}}


class Kubelets:
    """Starts and stops either kubelet as a node of the control plane `cp`, on the CRI `endpoint`."""

    def __init__(self, work: Path, cp, endpoint) -> None:
        self.work, self.cp, self.endpoint = work, cp, endpoint

    def start(self, kind: str):
        from tests.e2e.test_cri_stock_kubelet import Kubelet as Stock
        from tests.kit.kubelet_node import Kubelet

        node, ip = NODES[kind]
        kubeconfig = self.cp.node_kubeconfig(node)
        k: Kubelet | Stock
        if kind == "pykubelet":
            k = Kubelet.for_node(self.work / kind, node, ip, self.endpoint.url, kubeconfig, {"syncFrequency": "1m"})
        else:
            k = Stock(self.work / kind, self.endpoint, node=node, config={"syncFrequency": "1m"},
                      args=("--kubeconfig", str(kubeconfig)))
        k.start()
        return k


class Bench:
    def __init__(self, client, runtime, logs: Path | None = None) -> None:
        self.client, self.runtime, self.logs = client, runtime, logs

    def node_ready(self, node: str, timeout: float = 90) -> None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                conditions = self.client.get(Node, node).status.conditions or []
                if any(c.type == "Ready" and c.status == "True" for c in conditions):
                    return
            except ApiError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"node {node} not Ready within {timeout:.0f} s")

    def round(self, node: str, tag: str, n: int, timeout: float = 180) -> dict:
        """Creates `n` pods at once on `node`; returns their latencies (s) and the CPU and RSS figures of
        the kubelet process read through `self.pid` around it."""
        from lightkube import codecs
        from lightkube.resources.core_v1 import Pod

        listing = self.client.list(Pod, namespace=NAMESPACE, labels={"bench": tag})
        list(listing)
        version = listing.resourceVersion
        running: dict[str, float] = {}
        all_running = threading.Event()

        def watch() -> None:
            for _type, pod in self.client.watch(Pod, namespace=NAMESPACE, labels={"bench": tag},
                                                resource_version=version):
                name = pod.metadata.name
                if pod.status is not None and pod.status.phase == "Running" and name not in running:
                    running[name] = time.monotonic()
                    if len(running) == n:
                        all_running.set()
                        return

        threading.Thread(target=watch, daemon=True, name=f"watch-{tag}").start()
        names = [f"{tag}-{i}" for i in range(n)]
        created: dict[str, float] = {}

        def create(name: str) -> None:
            obj = codecs.from_dict(pod_manifest(name, node, tag))
            created[name] = time.monotonic()
            self.client.create(obj)

        cpu0 = cpu_seconds(self.pid)
        with ThreadPoolExecutor(min(n, 10)) as pool:
            list(pool.map(create, names))
        if not all_running.wait(timeout):
            raise RuntimeError(f"{tag}: not Running within {timeout:.0f} s: {sorted(set(names) - set(running))}")
        cpu_start = cpu_seconds(self.pid) - cpu0
        time.sleep(1)  # let the kubelet settle (status patches after Running, allocations of the pass)
        rss, pss = memory_kib(self.pid)
        for name in names:
            self.client.delete(Pod, name, namespace=NAMESPACE)
        self.gone(tag, timeout)
        return {"latency": [running[name] - created[name] for name in names], "cpu_start": cpu_start,
                "cpu_cycle": cpu_seconds(self.pid) - cpu0, "rss": rss, "pss": pss}

    def gone(self, tag: str, timeout: float) -> None:
        from lightkube.resources.core_v1 import Pod

        deadline = time.monotonic() + timeout
        while list(self.client.list(Pod, namespace=NAMESPACE, labels={"bench": tag})):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: pods not deleted within {timeout:.0f} s")
            time.sleep(0.2)

    def sweep(self) -> None:
        """Whatever a kubelet left in the runtime (the stock kubelet removes dead sandboxes only later)."""
        from pykubelet import runtime as cri

        for s in self.runtime.list_pod_sandbox():
            try:
                self.runtime.stop_pod_sandbox(s.id)
                self.runtime.remove_pod_sandbox(s.id)
            except cri.NotFound:
                pass

    def run(self, kind: str, kubelets: Kubelets, single: int, batch: int) -> dict:
        node = NODES[kind][0]
        k = kubelets.start(kind)
        try:
            self.pid = k.proc.pid
            self.node_ready(node)
            self.round(node, f"{kind[:2]}-warmup", 1)
            idle_rss, idle_pss = memory_kib(self.pid)
            singles = [self.round(node, f"{kind[:2]}-one{i}", 1) for i in range(single)]
            log(f"{kind}: {single} single pods done")
            many = self.round(node, f"{kind[:2]}-batch", batch) if batch else None
            log(f"{kind}: {batch} pods at once done")
        except BaseException:
            log(f"{kind} log tail:\n{k.log_tail()}")
            raise
        finally:
            k.stop()
            if self.logs is not None:
                self.logs.mkdir(parents=True, exist_ok=True)
                log_file = k.log_path if kind == "pykubelet" else k.root / "kubelet.log"
                shutil.copy(log_file, self.logs / f"{kind}.log")
            self.sweep()
            if kind == "kubelet":
                k.remove_cgroups()
        return {"single": [s["latency"][0] for s in singles], "batch": many and many["latency"],
                "idle_rss": idle_rss, "idle_pss": idle_pss, "rss": many and many["rss"], "pss": many and many["pss"],
                "cpu_start": many and many["cpu_start"] / batch, "cpu_cycle": many and many["cpu_cycle"] / batch,
                "cpu_single": statistics.median(s["cpu_start"] for s in singles) if singles else None}


def report(results: dict, single: int, batch: int) -> str:
    ms = 1000
    mib = 1024
    lines = [f"times in ms from the create request to Running seen through a watch; {single} single pods, "
             f"then {batch} at once", "",
             "| kubelet | 1 pod median | 1 pod p99 | " + f"{batch} pods median | {batch} pods p99 | "
             "RSS idle MiB | RSS MiB | PSS MiB | CPU ms/pod start | CPU ms/pod start+delete |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, r in results.items():
        one, many = r["single"], r["batch"] or [0.0]
        lines.append(f"| {kind} | {statistics.median(one) * ms:.0f} | {pct(one, 0.99) * ms:.0f} | "
                     f"{statistics.median(many) * ms:.0f} | {pct(many, 0.99) * ms:.0f} | {r['idle_rss'] / mib:.1f} | "
                     f"{(r['rss'] or 0) / mib:.1f} | {(r['pss'] or 0) / mib:.1f} | "
                     f"{(r['cpu_start'] or 0) * ms:.0f} | {(r['cpu_cycle'] or 0) * ms:.0f} |")
    if {"pykubelet", "kubelet"} <= set(results) and batch:
        ours, stock = results["pykubelet"], results["kubelet"]
        checks = [("1 pod median", statistics.median(ours["single"]), statistics.median(stock["single"])),
                  ("1 pod p99", pct(ours["single"], 0.99), pct(stock["single"], 0.99)),
                  (f"{batch} pods median", statistics.median(ours["batch"]), statistics.median(stock["batch"])),
                  (f"{batch} pods p99", pct(ours["batch"], 0.99), pct(stock["batch"], 0.99)),
                  (f"RSS with {batch} pods", ours["rss"], stock["rss"])]
        lines += ["", "targets (pykubelet at or below the stock kubelet): " + "; ".join(
            f"{what} {'met' if a <= b else 'NOT met'}" for what, a, b in checks)]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def cri_runtime(name: str, work: Path, hosts_dir: Path) -> Iterator:
    """The CRI runtime `name` (its endpoint has `.url`), with the pod network, until the block ends."""
    from tests.kit.containerd_cri import containerd_cri

    if name == "containerd":
        with containerd_cri(work / "cri", hosts_dir) as endpoint:
            yield endpoint
        return
    from tests.kit.cri_server import CriNode

    node = CriNode(hosts_dir, bridge=PYRUNTIME_CRI_BRIDGE, subnet=PYRUNTIME_CRI_SUBNET)
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


def bench_runtime(name: str, kinds: list[str], single: int, batch: int, work: Path, hosts_dir: Path,
                  logs: Path | None) -> dict:
    """Both kubelets in turn on a fresh control plane and the CRI runtime `name`, under the integration lock."""
    from pykubelet.api.client import make_client
    from pykubelet.runtime import CRIRuntime
    from tests.e2e.test_cri_stock_kubelet import kubelet_host_state
    from tests.kit.controlplane import ControlPlane
    from tests.kit.kubelet_node import BUSYBOX, kubepods_dirs, remove_new_cgroups

    results: dict = {}
    work.mkdir(parents=True)
    with open(critest.LOCK, "a") as lock:
        t0 = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        log(f"{name}: lock held after {time.monotonic() - t0:.0f} s")
        cgroups = kubepods_dirs()
        cp = ControlPlane(work / "controlplane")
        try:
            with kubelet_host_state():
                cp.start()
                assert cp.admin is not None  # made by start()
                cp.kubectl("create", "serviceaccount", "default", "-n", NAMESPACE)
                with cri_runtime(name, work, hosts_dir) as endpoint:
                    runtime = CRIRuntime(endpoint.url, timeout=60)
                    client = make_client(cp.admin)
                    try:
                        runtime.pull_image(BUSYBOX)
                        b = Bench(client, runtime, logs and logs / name)
                        log(f"{name}: control plane and runtime up, image pulled")
                        for kind in kinds:
                            try:
                                results[kind] = b.run(kind, Kubelets(work, cp, endpoint), single, batch)
                            except RuntimeError as e:  # one kubelet failing on a runtime: the others still run
                                log(f"{name}: {kind}: {e}")
                    finally:
                        client.close()
                        runtime.close()
        finally:
            cp.stop()
            remove_new_cgroups(cgroups)
    return results


def bench(runtimes: list[str], kinds: list[str], single: int, batch: int, out: Path | None,
          logs: Path | None) -> int:
    # this checkout's pykubelet, pyruntime-cri and CNI plugins, as `make` runs with the venv's launchers
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    os.environ["PYCNI_HELPER"] = "off"  # its process outlives a pod by its idle time (as tests/e2e/conftest.py)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="pynode-bench-kubelet-", dir="/var/tmp") as tmp, \
            critest.critest_registry(Path(tmp) / "mirror") as mirror:
        for name in runtimes:
            results[name] = bench_runtime(name, kinds, single, batch, Path(tmp) / name, mirror.hosts_dir, logs)
    for name, by_kubelet in results.items():
        print(f"on {name}: " + report(by_kubelet, single, batch))
    if out:
        out.write_text(json.dumps(results, indent=1))
    return 0 if all(len(r) == len(kinds) for r in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--single", type=int, default=SINGLE, help=f"single-pod rounds (default {SINGLE})")
    p.add_argument("-b", "--batch", type=int, default=BATCH, help=f"pods created at once (default {BATCH})")
    p.add_argument("-r", "--runtime", action="append", choices=RUNTIMES, help="default: both, in this order")
    p.add_argument("-k", "--kubelet", action="append", choices=KUBELETS, help="default: both, in this order")
    p.add_argument("--json", type=Path, help="also write the raw samples here")
    p.add_argument("--logs", type=Path, help="keep the kubelets' logs in this directory")
    args = p.parse_args(argv or [])
    if not start_as_root("bench.kubelet"):
        return 1
    from pynode_cluster.components import PEERS

    for name in ("kube-apiserver", "etcd", "kubelet"):
        if not (PEERS / name).exists():
            log(f"{PEERS / name} is missing: run `make peers`")
            return 1
    return bench(args.runtime or list(RUNTIMES), args.kubelet or list(KUBELETS), args.single, args.batch, args.json,
                 args.logs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
