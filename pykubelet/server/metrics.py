"""/metrics: a few of the stock kubelet's metrics under their upstream names, in the Prometheus text
format through prometheus_client (never hand-formatted), so dashboards and alerts written for the kubelet
read these as they are.

/metrics/resource and /metrics/probes are the stock kubelet's two other registries, each a collector of its
own here: the names, labels, types and HELP texts (with component-base's "[STABLE]"-style stability
prefix) of its resource metrics collector and of its prober's ProberResults and ProberDuration, families in
name order and labels in name order as client_golang writes them, a family with no series left out. The
resource metrics are what metrics-server (v0.8, v0.9) reads for `kubectl top`, with the sample times it takes its
rates from; their numbers are stats.py's (Summary.cpu_and_memory), the same as /stats/summary's.

What runs is asked of the CRI at scrape time (kubelet_running_pods: ready sandboxes,
kubelet_running_containers by container_state), so the numbers cannot drift from the runtime's; the
server counts its own requests (kubelet_http_requests_total, by method, path head and long_running);
kubelet_pod_start_duration_seconds is observed by the pod workers when a pod first turns Running;
the process's own cpu/memory/fds come from prometheus_client's process collector. The registry is the
server's own, not the library's global one, so two kubelets in one test process do not collide.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proto import api_pb2
from pykubelet.prober.manager import DURATION_BUCKETS, ProbeTally
from pykubelet.server.stats import USER_HZ, boot_time
from pynode_os.proc import process_start_time

log = logging.getLogger("pykubelet.server")

CONTENT_TYPE = CONTENT_TYPE_LATEST
POD_START_BUCKETS = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
                     1800, 2700, 3600)
STATES = {api_pb2.CONTAINER_CREATED: "created", api_pb2.CONTAINER_RUNNING: "running",
          api_pb2.CONTAINER_EXITED: "exited", api_pb2.CONTAINER_UNKNOWN: "unknown"}


class RuntimeCollector:
    """Running pods and containers, asked of the runtime at each scrape."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime

    def collect(self):
        pods = GaugeMetricFamily("kubelet_running_pods", "Number of pods that have a running pod sandbox")
        containers = GaugeMetricFamily("kubelet_running_containers", "Number of containers currently running",
                                       labels=["container_state"])
        try:
            sandboxes = self.runtime.list_pod_sandbox()
            listed = self.runtime.list_containers()
        except Exception as e:  # a runtime that does not answer leaves the gauges out
            log.warning("/metrics: the runtime did not answer: %s", e)
            return
        pods.add_metric([], sum(1 for s in sandboxes if s.state == api_pb2.SANDBOX_READY))
        counts = dict.fromkeys(STATES.values(), 0)
        for c in listed:
            counts[STATES.get(c.state, "unknown")] += 1
        for state, n in counts.items():
            containers.add_metric([state], n)
        yield pods
        yield containers


class Metrics:
    def __init__(self, runtime, node: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(RuntimeCollector(runtime))
        ProcessCollector(registry=self.registry)
        Gauge("kubelet_node_name", "The node's name. The count is always 1.", ["node"],
              registry=self.registry).labels(node).set(1)
        # observed by the pod workers (PodWorkers(on_started=...)), upstream's buckets
        self.pod_start_duration = Histogram(
            "kubelet_pod_start_duration_seconds", "Duration in seconds from kubelet seeing a pod for the first time "
            "to the pod starting to run", registry=self.registry, buckets=POD_START_BUCKETS)
        self.requests = Counter("kubelet_http_requests", "Number of the http requests received since the "
                                "server started", ["method", "path", "server_type", "long_running"],
                                registry=self.registry)

    def request(self, method: str, path: str, long_running: bool) -> None:
        head = "/" + path.lstrip("/").split("/", 1)[0]
        self.requests.labels(method.lower(), head, "readwrite", str(long_running).lower()).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


# --- /metrics/resource ---------------------------------------------------------------------------------------

CONTAINER = ["container", "namespace", "pod"]
POD = ["namespace", "pod"]


class ResourceCollector:
    """The stock kubelet's resource metrics collector over `source()` (Summary.cpu_and_memory): cumulative
    CPU and working sets of the node, its pods and their containers, swap where known, the containers'
    start times, and resource_scrape_error (1, and nothing else, when the numbers could not be had)."""

    def __init__(self, source: Callable[[], dict]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        error = GaugeMetricFamily("resource_scrape_error", "[STABLE] 1 if there was an error while getting "
                                  "container metrics, 0 otherwise")
        try:
            stats = self.source()
        except Exception as e:  # upstream's too: the error is the one series served
            log.warning("/metrics/resource: %s", e)
            error.add_metric([], 1)
            yield error
            return
        error.add_metric([], 0)
        families = [error, *_resource_families(stats)]
        yield from sorted((f for f in families if f.samples), key=lambda f: f.name)


def _resource_families(stats: dict) -> list[Metric]:
    def counter(name: str, help: str, labels: list[str]) -> CounterMetricFamily:
        return CounterMetricFamily(name, help, labels=labels)

    def gauge(name: str, help: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, help, labels=labels)

    node_cpu = counter("node_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the node in "
                       "core-seconds", [])
    node_memory = gauge("node_memory_working_set_bytes", "[STABLE] Current working set of the node in bytes", [])
    node_swap = gauge("node_swap_usage_bytes", "[ALPHA] Current swap usage of the node in bytes. Reported only "
                      "on non-windows systems", [])
    start = gauge("container_start_time_seconds", "[STABLE] Start time of the container since unix epoch in "
                  "seconds", CONTAINER)
    cpu = counter("container_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the container "
                  "in core-seconds", CONTAINER)
    memory = gauge("container_memory_working_set_bytes", "[STABLE] Current working set of the container in "
                   "bytes", CONTAINER)
    swap = gauge("container_swap_usage_bytes", "[ALPHA] Current amount of the container swap usage in bytes. "
                 "Reported only on non-windows systems", CONTAINER)
    swap_limit = gauge("container_swap_limit_bytes", "[ALPHA] Current amount of the container swap limit in "
                       "bytes. Reported only on non-windows systems", CONTAINER)
    pod_cpu = counter("pod_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the pod in "
                      "core-seconds", POD)
    pod_memory = gauge("pod_memory_working_set_bytes", "[STABLE] Current working set of the pod in bytes", POD)
    pod_swap = gauge("pod_swap_usage_bytes", "[ALPHA] Current amount of the pod swap usage in bytes. Reported "
                     "only on non-windows systems", POD)

    def usage(family: CounterMetricFamily | GaugeMetricFamily, labels: list[str], stats: dict | None, key: str,
              scale: float = 1.0) -> None:
        if stats is not None and key in stats:
            family.add_metric(labels, stats[key] / scale, timestamp=stats["time"])

    node = stats["node"]
    usage(node_cpu, [], node.get("cpu"), "usageCoreNanoSeconds", 1e9)
    usage(node_memory, [], node.get("memory"), "workingSetBytes")
    usage(node_swap, [], node.get("swap"), "swapUsageBytes")
    for pod in stats["pods"]:
        ref = pod["podRef"]
        for c in pod["containers"]:
            labels = [c["name"], ref["namespace"], ref["name"]]
            if c.get("startTime", 0) > 0:
                start.add_metric(labels, c["startTime"])
            usage(cpu, labels, c.get("cpu"), "usageCoreNanoSeconds", 1e9)
            usage(memory, labels, c.get("memory"), "workingSetBytes")
            if "swap" in c:  # upstream's limit is what is available plus what is used
                used = c["swap"].get("swapUsageBytes", 0)
                usage(swap, labels, c["swap"], "swapUsageBytes")
                if "swapAvailableBytes" in c["swap"]:
                    swap_limit.add_metric(labels, c["swap"]["swapAvailableBytes"] + used, timestamp=c["swap"]["time"])
        labels = [ref["namespace"], ref["name"]]
        usage(pod_cpu, labels, pod.get("cpu"), "usageCoreNanoSeconds", 1e9)
        usage(pod_memory, labels, pod.get("memory"), "workingSetBytes")
        usage(pod_swap, labels, pod.get("swap"), "swapUsageBytes")
    for family in (start, cpu, memory, swap, swap_limit, pod_cpu, pod_memory, pod_swap):
        family.samples.sort(key=lambda s: sorted(s.labels.items()))
    return [node_cpu, node_memory, node_swap, start, cpu, memory, swap, swap_limit, pod_cpu, pod_memory, pod_swap]


# --- /metrics/probes -----------------------------------------------------------------------------------------

class ProbeCollector:
    """The stock kubelet's prober metrics over `tallies()` (ProbeManager.tallies), and
    process_start_time_seconds that its registry carries for counter resets."""

    def __init__(self, tallies: Callable[[], list[ProbeTally]]) -> None:
        self.tallies = tallies
        ticks = process_start_time(os.getpid())
        self.started = boot_time() + (ticks or 0) / USER_HZ

    def collect(self) -> Iterator[Metric]:
        durations = HistogramMetricFamily("prober_probe_duration_seconds", "[ALPHA] Duration in seconds for a "
                                          "probe response.", labels=["container", "namespace", "pod", "probe_type"])
        totals = CounterMetricFamily("prober_probe_total", "[BETA] Cumulative number of a liveness, readiness or "
                                     "startup probe for a container by result.",
                                     labels=["container", "namespace", "pod", "pod_uid", "probe_type", "result"])
        for t in sorted(self.tallies(), key=lambda t: (t.container, t.namespace, t.pod, t.uid, t.kind)):
            for result, n in (("failed", t.failed), ("successful", t.successful)):
                if n:
                    totals.add_metric([t.container, t.namespace, t.pod, t.uid, t.kind, result], n)
            if t.successful:
                cumulative, buckets = 0, []
                for le, n in zip((*(_go_float(b) for b in DURATION_BUCKETS), "+Inf"), t.buckets, strict=True):
                    cumulative += n
                    buckets.append((le, cumulative))
                durations.add_metric([t.container, t.namespace, t.pod, t.kind], buckets, t.duration_sum)
        started = GaugeMetricFamily("process_start_time_seconds", "[ALPHA] Start time of the process since unix "
                                    "epoch in seconds.")
        started.add_metric([], self.started)
        yield from (f for f in (durations, totals, started) if f.samples)


def _go_float(value: float) -> str:
    """A bucket bound as Go writes it ("1", not "1.0")."""
    return repr(value).removesuffix(".0")


def registry(*collectors) -> CollectorRegistry:
    """A registry of `collectors`, never collected but to serve them (no description at registration, which
    would ask the runtime for its stats)."""
    out = CollectorRegistry(auto_describe=False)
    for c in collectors:
        out.register(c)
    return out


def render(collectors: CollectorRegistry) -> bytes:
    return generate_latest(collectors)
