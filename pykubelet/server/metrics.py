"""/metrics: a few of the stock kubelet's metrics under their upstream names, in the Prometheus text
format through prometheus_client (never hand-formatted), so dashboards and alerts written for the kubelet
read these as they are.

What runs is asked of the CRI at scrape time (kubelet_running_pods: ready sandboxes,
kubelet_running_containers by container_state), so the numbers cannot drift from the runtime's; the
server counts its own requests (kubelet_http_requests_total, by method, path head and long_running);
kubelet_pod_start_duration_seconds is observed by the pod workers when a pod first turns Running;
the process's own cpu/memory/fds come from prometheus_client's process collector. The registry is the
server's own, not the library's global one, so two kubelets in one test process do not collide.
"""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proto import api_pb2

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
