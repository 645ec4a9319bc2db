"""The interop matrix of issue 11 timed end to end: a deployment on `make cluster`, for each pair of kubelet
(pykubelet, the stock kubelet) and CRI runtime (pyruntime-cri, containerd).

bench.cri and bench.kubelet time one layer each with the others held still; what a user waits for is the
whole path: `kubectl create deployment` through the API server, the deployment and ReplicaSet controllers, the
scheduler, the kubelet, the runtime, the CNI plugins and the OCI runtime, until the pods are Ready. So each pair
gets a cluster of its own (the provisioning entry `make cluster` runs, one node), and each deployment size
runs on it in turn: the time from just before `kubectl create` to the last pod Ready, and each pod's start
latency, from the first watch event that shows it (ADDED, its creation) to the first that shows it Running,
both on the watch's own clock (creationTimestamp has 1 s granularity). The watch is opened before the create,
at a list's resourceVersion, so no event is missed. With the largest deployment running, the node's memory as
PSS: the kubelet, the runtime daemon (pyruntime-cri: with its launcher, the fork server), and per pod the
process that keeps the container (containerd-shim-runc-v2 / our supervisor) plus the pause, found through the
CRI's verbose statuses as bench.cri does. Between sizes the deployment is deleted and the node left empty
(no pod, no ready sandbox, no running container, no allocated IP); between pairs the cluster is taken down.
The pairs kubeadm:KUBELET/RUNTIME time the same on `make cluster KUBEADM=1` with three nodes of the pair (its
control plane node-1's static pods, the deployment over the two workers): 30 replicas, no memory.

Only one cluster can exist on the machine, and it makes netns, links, cgroups and mounts: the bench holds the
integration lock for its whole run (an inherited lock, as `flock /tmp/pynode-itest.lock ...` passes one, counts
as held). It writes the table between its markers in bench/README.md and a plot of the start latencies
(matplotlib, the `bench` extra) beside it. Needs root and the peers (`make setup`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from bench import README, record_section, start_as_root
from bench.cri import Grpc, daemon_memory, integration_lock, memory_kib, pod_memory
from bench.runtime import pct
from pynode_cluster import cluster, coredns
from pynode_cluster.hosts import wait_for
from pynode_cluster.node import KUBELETS, RUNTIMES
from tests.kit.cluster_admin import kubectl, provision

PLOT = README.with_name("cluster-start-latency.png")
BEGIN, END = "<!-- bench-cluster:begin -->", "<!-- bench-cluster:end -->"
SIZES = (30, 108)  # 108: the node full (maxPods 110) with CoreDNS's two pods
BASE, OURS = "kubelet/containerd", "pykubelet/pyruntime-cri"
# kubeadm's clusters (`make cluster KUBEADM=1`): every node of the pair, the control plane node-1's static pods,
# the deployment across the two workers; one size, the stock pair's kubeadm cluster the base of ours
KUBEADM, KUBEADM_NODES, KUBEADM_SIZES = "kubeadm:", 3, (30,)
PAIRS = tuple(f"{k}/{r}" for k in KUBELETS for r in RUNTIMES) + (KUBEADM + BASE, KUBEADM + OURS)
APP, NAMESPACE = "bench", "default"
SETTLE = 5.0  # s after the last pod Ready before memory is read (status patches, the runtime's bookkeeping)
MIB = 1024
NAMESPACE_LABEL = "io.kubernetes.pod.namespace"  # the kubelet's label on a container: its pod's namespace


def log(message: str) -> None:
    print(f"bench.cluster: {message}", file=sys.stderr, flush=True)


class PodWatch:
    """When each pod of the deployment was first seen (time.monotonic() at the event): ADDED, Running, Ready."""

    def __init__(self, client) -> None:
        from lightkube.resources.core_v1 import Pod

        self.client = client
        listing = client.list(Pod, namespace=NAMESPACE, labels={"app": APP})
        list(listing)
        self.added: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.stopped = False
        self.thread = threading.Thread(target=self._watch, args=(Pod, listing.resourceVersion), daemon=True,
                                       name="pod-watch")
        self.thread.start()

    def _watch(self, kind, version: str) -> None:
        try:
            for event, pod in self.client.watch(kind, namespace=NAMESPACE, labels={"app": APP},
                                                resource_version=version):
                now = time.monotonic()
                if self.stopped:
                    return
                name = pod.metadata.name
                if event in ("ADDED", "MODIFIED"):
                    self.added.setdefault(name, now)
                status = pod.status
                if status is not None and status.phase == "Running":
                    self.running.setdefault(name, now)
                if status is not None and any(c.type == "Ready" and c.status == "True"
                                              for c in status.conditions or []):
                    self.ready.setdefault(name, now)
        except Exception as e:  # the client closed under it at the end, or the API server went away
            if not self.stopped:
                log(f"pod watch ended: {e}")

    def stop(self) -> None:
        self.stopped = True


def summary(latencies: list[float]) -> dict[str, float]:
    """p50 and p99 (nearest rank, as bench.runtime's pct) of start latencies in seconds."""
    return {"p50": pct(latencies, 0.50), "p99": pct(latencies, 0.99)} if latencies else {}


def node_empty(node) -> bool:
    """No ready sandbox, no running container and no IP held in host-local's store (as the journey checks) but
    the cluster's own pods' (kube-system: CoreDNS; with kubeadm the control plane's and kube-proxy, on the
    host network); dead sandboxes the stock kubelet removes later cost nothing running."""
    from proto import api_pb2
    from pykubelet.runtime import CRIRuntime

    client = CRIRuntime(node.endpoint, timeout=30)
    try:
        ready = [s for s in client.list_pod_sandbox() if s.state == api_pb2.SANDBOX_READY]
        if any(s.metadata.namespace != coredns.NAMESPACE for s in ready) or any(
                c.state == api_pb2.CONTAINER_RUNNING and c.labels.get(NAMESPACE_LABEL) != coredns.NAMESPACE
                for c in client.list_containers()):
            return False
        ips = {client.pod_sandbox_status(s.id).status.network.ip for s in ready} - {"", node.address}
    finally:
        client.close()
    return {p.name for p in (node.dir / "ipam").rglob("*") if p.is_file() and p.name[0].isdigit()} == ips


def node_memory(node, kubelet: str, runtime: str) -> dict:
    """KiB of PSS (and RSS) of the kubelet, the runtime daemon and, per running pod, shim/supervisor + pause."""
    from proto import api_pb2
    from pykubelet.runtime import CRIRuntime

    d = cluster.daemons()
    k, r = d.process(f"{node.name}-{kubelet}"), d.process(f"{node.name}-{runtime}")
    if k is None or r is None:
        raise RuntimeError(f"{node.name}: the kubelet or the runtime is not running")
    client = CRIRuntime(node.endpoint, timeout=30)
    try:
        ready = {s.id for s in client.list_pod_sandbox()
                 if s.state == api_pb2.SANDBOX_READY and s.metadata.namespace != coredns.NAMESPACE}
        pods = [(c.pod_sandbox_id, c.id) for c in client.list_containers()
                if c.state == api_pb2.CONTAINER_RUNNING and c.pod_sandbox_id in ready]
    finally:
        client.close()
    grpc = Grpc(node.endpoint)
    try:
        per_pod = pod_memory(grpc, pods)
    finally:
        grpc.close()
    kubelet_rss, kubelet_pss = memory_kib(k.pid)
    rt = daemon_memory(runtime, r.pid)
    return {"pods": len(pods), "kubelet_rss": kubelet_rss, "kubelet_pss": kubelet_pss,
            "runtime_pss": rt["pss"] + rt.get("launcher_pss", 0), "pod_pss": per_pod["pss"],
            "keeper_pss": per_pod["parent_pss"], "pause_pss": per_pod["pause_pss"]}


def stuck(limit: int = 8) -> str:
    """Why pods are not Ready: their waiting reasons and the last warning events, for the record."""
    pods = json.loads(kubectl("get", "pods", "-l", f"app={APP}", "-o", "json").stdout)["items"]
    reasons: dict[str, int] = {}
    for p in pods:
        status = p.get("status", {})
        why = status.get("phase", "?")
        for c in status.get("containerStatuses") or []:
            if "waiting" in c.get("state", {}):
                why = c["state"]["waiting"].get("reason", why)
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                why = f"unschedulable: {c.get('message', '')}"
        reasons[why] = reasons.get(why, 0) + 1
    events = json.loads(kubectl("get", "events", "--field-selector", "type=Warning", "-o", "json").stdout)["items"]
    last = [f"{e.get('reason')}: {e.get('message', '').strip()[:200]}" for e in events[-limit:]]
    return "; ".join(f"{n} {why}" for why, n in sorted(reasons.items())) + (
        " | warnings: " + " / ".join(last) if last else "")


def deployment(client, nodes: list, size: int, timeout: float, measure: bool, kubelet: str, runtime: str) -> dict:
    """One deployment of `size` replicas from create to all Ready (times in s), memory (of the one node) when
    `measure`; then deleted and the nodes empty again."""
    from tests.kit.kubelet_node import HTTPD

    watch = PodWatch(client)
    result: dict = {"size": size}
    try:
        created = time.monotonic()
        kubectl("create", "deployment", APP, f"--image={HTTPD}", f"--replicas={size}")
        try:
            wait_for(f"{size} pods Ready", lambda: len(watch.ready) >= size, timeout)
        except TimeoutError as e:
            result["error"] = f"{e}: {stuck()}"
            log(f"{size} pods: {result['error']}")
        result["ready_s"] = max(watch.ready.values()) - created if len(watch.ready) >= size else None
        result["reached"] = {"running": len(watch.running), "ready": len(watch.ready)}
        result["latency"] = sorted(watch.running[n] - watch.added[n] for n in watch.running if n in watch.added)
        if measure and "error" not in result:
            time.sleep(SETTLE)
            result["memory"] = node_memory(nodes[0], kubelet, runtime)
    finally:
        watch.stop()
        deleted = time.monotonic()
        kubectl("delete", "deployment", APP, "--ignore-not-found", "--wait=true", timeout=300)
        wait_for("the pods gone", lambda: not json.loads(kubectl("get", "pods", "-l", f"app={APP}", "-o", "json")
                                                        .stdout)["items"], 300, interval=1)
        wait_for("the nodes empty", lambda: all(node_empty(n) for n in nodes), 180, interval=1)
        result["delete_s"] = time.monotonic() - deleted
    return result


def bench_pair(pair: str, sizes: list[int]) -> dict:
    """`make cluster` with one node for `pair` (`make cluster KUBEADM=1` with KUBEADM_NODES of it for a
    kubeadm pair), a warm-up pod on each worker, each size in turn, `make cluster-down`."""
    from pykubelet.api.client import make_client

    kubeadm = pair.startswith(KUBEADM)
    kubelet, runtime = pair.removeprefix(KUBEADM).split("/")
    if kubeadm:
        sizes = list(KUBEADM_SIZES)
    if cluster.running():
        raise RuntimeError(f"a cluster is running already (state in {cluster.STATE}); the bench needs the only one")
    out: dict = {"pair": pair, "sizes": {}}
    started = time.monotonic()
    up = provision("up", "--kubelet", kubelet, "--runtime", runtime,
                   *(["--kubeadm", "--nodes", str(KUBEADM_NODES)] if kubeadm else []), timeout=600)
    out["up_s"] = time.monotonic() - started
    try:
        if up.returncode != 0:
            raise RuntimeError(f"make cluster: {up.stdout[-3000:]}{up.stderr[-3000:]}")
        log(f"{pair}: cluster up in {out['up_s']:.1f} s")
        record = cluster.Record.load()
        assert record is not None  # written by up
        nodes = [n.node() for n in record.nodes]
        client = make_client(cluster.admin_kubeconfig())
        try:
            # the images pulled and every cache warm: a pod on each worker through the whole path, not timed
            deployment(client, nodes, len(nodes) - 1 if kubeadm else 1, 180, False, kubelet, runtime)
            for size in sizes:
                r = deployment(client, nodes, size, 60 + 3 * size, size == max(sizes) and not kubeadm, kubelet,
                               runtime)
                out["sizes"][str(size)] = r
                p = summary(r["latency"])
                log(f"{pair}: {size} pods: all Ready {r['ready_s'] or float('nan'):.1f} s, start p50 "
                    f"{p.get('p50', float('nan')):.2f} s p99 {p.get('p99', float('nan')):.2f} s, "
                    f"deleted in {r['delete_s']:.1f} s")
        finally:
            client.close()
    except Exception as e:
        out["error"] = str(e)
        log(f"{pair}: {e}")
        for name, path in cluster.logs().items():
            if "kubelet" in name or "cri" in name or "containerd" in name:
                log(f"--- {name}\n{Path(path).read_text(errors='replace')[-2000:]}")
    finally:
        started = time.monotonic()
        down = provision("down")
        out["down_s"] = time.monotonic() - started
        if down.returncode != 0:
            out["error"] = (out.get("error", "") + f"; make cluster-down: {down.stdout[-2000:]}").lstrip("; ")
            log(f"{pair}: make cluster-down failed:\n{down.stdout}{down.stderr}")
    return out


# ---- the report ---------------------------------------------------------------------------------------------

def ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}" if value is not None and base else "-"


def seconds(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def table(results: dict[str, dict], sizes: list[int]) -> str:
    """Markdown: per size and pair the time to all Ready, start p50/p99 and their ratios to the stock
    kubelet + containerd; memory at the largest size; then the issue's targets, met or not."""
    def stats(pair: str, size: int) -> dict:
        r = results.get(pair, {}).get("sizes", {}).get(str(size), {})
        return {"ready": r.get("ready_s"), **summary(r.get("latency", []))}

    lines = ["| pods | kubelet / runtime | create → all Ready s | start p50 s | start p99 s | p50 ÷ base | "
             "p99 ÷ base | reached |", "|---:|---|---:|---:|---:|---:|---:|---|"]
    for size in sizes:
        for pair in results:
            if pair.startswith(KUBEADM) and size not in KUBEADM_SIZES:
                continue
            base = stats(KUBEADM + BASE if pair.startswith(KUBEADM) else BASE, size)
            s, r = stats(pair, size), results[pair].get("sizes", {}).get(str(size), {})
            reached = "all" if r and "error" not in r else (
                f"{r['reached']['ready']}/{size} Ready" if r else results[pair].get("error", "not run")[:80])
            lines.append(f"| {size} | {pair} | {seconds(s['ready'])} | {seconds(s.get('p50'))} | "
                         f"{seconds(s.get('p99'))} | {ratio(s.get('p50'), base.get('p50'))} | "
                         f"{ratio(s.get('p99'), base.get('p99'))} | {reached} |")
    big = max(sizes)
    memory = {pair: r.get("sizes", {}).get(str(big), {}).get("memory") for pair, r in results.items()
              if not pair.startswith(KUBEADM)}
    lines += ["", f"| MiB, {big} pods running | kubelet RSS | kubelet PSS | runtime daemon PSS | per pod: "
              "shim / supervisor + pause | of which pause | node total ÷ pods | per pod ÷ base |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    base_mem = memory.get(BASE)
    for pair, m in memory.items():
        if not m:
            lines.append(f"| {pair} | - | - | - | - | - | - | - |")
            continue
        total = (m["kubelet_pss"] + m["runtime_pss"]) / m["pods"] + m["pod_pss"] if m["pods"] else None
        lines.append(f"| {pair} | {m['kubelet_rss'] / MIB:.1f} | {m['kubelet_pss'] / MIB:.1f} | "
                     f"{m['runtime_pss'] / MIB:.1f} | {m['pod_pss'] / MIB:.2f} | {m['pause_pss'] / MIB:.2f} | "
                     f"{total / MIB if total else 0:.2f} | "
                     f"{ratio(m['pod_pss'], base_mem['pod_pss'] if base_mem else None)} |")
    targets = []
    for size in sizes:
        ours, base = stats(OURS, size), stats(BASE, size)
        for q in ("p50", "p99"):
            if ours.get(q) is not None and base.get(q):
                ok = ours[q] <= base[q] / 2
                targets.append(f"{size} pods {q} {ours[q] / base[q]:.2f} of base: {'met' if ok else 'NOT met'}")
    if memory.get(OURS) and base_mem:
        ok = memory[OURS]["pod_pss"] <= base_mem["pod_pss"]
        targets.append(f"memory per pod {memory[OURS]['pod_pss'] / base_mem['pod_pss']:.2f} of base: "
                       f"{'met' if ok else 'NOT met'}")
    lines += ["", f"Targets ({OURS} against {BASE}: start latency p50 and p99 at or below half, memory per pod "
              "at or below): " + ("; ".join(targets) if targets else "not measured (a pair missing)") + "."]
    return "\n".join(lines)


def plot(results: dict[str, dict], sizes: list[int], path: Path) -> None:
    """The start-latency distribution (CDF) of each pair, one panel per deployment size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.2), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for pair, r in results.items():
            values = r.get("sizes", {}).get(str(size), {}).get("latency", [])
            if values:  # a step up by 1/n at each pod's latency, from 0 at the fastest
                ax.step([values[0], *values], [0.0] + [(i + 1) / len(values) for i in range(len(values))],
                        where="post", color=f"C{PAIRS.index(pair)}" if pair in PAIRS else None,
                        label=f"{pair} (p50 {pct(values, 0.5):.1f} s)", linewidth=2 if pair == OURS else 1.3)
        ax.set_title(f"deployment of {size} replicas")
        ax.set_xlabel("pod start latency, ADDED → Running (s)")
        ax.set_ylabel("fraction of pods")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("make cluster, one node: pod start latency per kubelet / runtime pair")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def bench(pairs: list[str], sizes: list[int], record: bool, out: Path | None) -> int:
    # this checkout's launchers (pykubelet, pyruntime-cri, the CNI plugins), as `make` runs them
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    results: dict[str, dict] = {}
    started = time.monotonic()
    with integration_lock("bench.cluster"):
        for pair in pairs:
            t0 = time.monotonic()
            results[pair] = bench_pair(pair, sizes)
            log(f"{pair}: done in {time.monotonic() - t0:.0f} s")
    elapsed = time.monotonic() - started
    text = table(results, sizes)
    print(text)
    print(f"\nbench.cluster took {elapsed:.0f} s")
    if out:
        out.write_text(json.dumps(results, indent=1))
    if record:
        plot(results, sizes, PLOT)
        when = time.strftime("%Y-%m-%d %H:%M")
        kubeadm = f" (the {KUBEADM} rows: {KUBEADM_NODES})" if any(p.startswith(KUBEADM) for p in pairs) else ""
        record_section(BEGIN, END, f"{when}, `python -m bench.cluster` (whole run {elapsed / 60:.0f} min); one "
                                   f"node{kubeadm}, sizes {', '.join(map(str, sizes))}; times in s, memory in "
                                   f"MiB.\n\n"
                                   f"{text}\n\n![start latency per pair]({PLOT.name})")
    return 0 if all("error" not in r and all("error" not in s for s in r["sizes"].values())
                    for r in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="replicas per deployment")
    p.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS), metavar="KUBELET/RUNTIME",
                   help=f"default: all of {', '.join(PAIRS)}")
    p.add_argument("--no-record", dest="record", action="store_false",
                   help=f"print only: leave bench/README.md and {PLOT.name} alone")
    p.add_argument("--json", type=Path, help="also write the raw samples here")
    args = p.parse_args(argv or [])
    if not start_as_root("bench.cluster"):
        return 1
    return bench(args.pairs, sorted(args.sizes), args.record, args.json)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
