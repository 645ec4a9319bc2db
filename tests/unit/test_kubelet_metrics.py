"""/metrics/resource, /metrics/probes and /configz as the stock kubelet v1.37 serves them: the text read
back by a small parser of the Prometheus text format, and every family's name, type, HELP text and label
names checked against the stock collectors' (tests/kit/kubelet_metrics.py); the values from a fake stats
source."""
from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from proto import api_pb2
from pykubelet import config
from pykubelet.config import Settings, integer
from pykubelet.durations import duration, duration_string
from pykubelet.eviction.policy import Value
from pykubelet.prober.manager import DURATION_BUCKETS, ProbeTally
from pykubelet.server import stats as stats_module
from pykubelet.server.configz import configz, fields_from, kubelet_configuration
from pykubelet.server.metrics import ProbeCollector, ResourceCollector, registry, render
from pykubelet.server.stats import Summary
from tests.kit.fake_cri import FakeCRI
from tests.kit.kubelet_metrics import STOCK_PROBES, STOCK_RESOURCE, check_stock, parse, samples

NODE_T, POD_T = 1_800_000_000.25, 1_800_000_001.5

FAKE = {
    "node": {"cpu": {"time": NODE_T, "usageCoreNanoSeconds": 12_500_000_000},
             "memory": {"time": NODE_T, "workingSetBytes": 4096, "usageBytes": 8192},
             "swap": {"time": NODE_T, "swapUsageBytes": 0, "swapAvailableBytes": 100}},
    "pods": [{"podRef": {"name": "web", "namespace": "default", "uid": "u1"}, "startTime": POD_T - 10,
              "cpu": {"time": POD_T, "usageCoreNanoSeconds": 3_000_000_000},
              "memory": {"time": POD_T, "workingSetBytes": 300},
              "containers": [
                  {"name": "app", "startTime": 1_799_999_990.123456789,
                   "cpu": {"time": POD_T, "usageCoreNanoSeconds": 2_000_000_000},
                   "memory": {"time": POD_T, "workingSetBytes": 200},
                   "swap": {"time": POD_T, "swapUsageBytes": 5, "swapAvailableBytes": 95}},
                  {"name": "side", "startTime": 1_799_999_991,
                   "cpu": {"time": POD_T, "usageCoreNanoSeconds": 1_000_000_000},
                   "memory": {"time": POD_T, "workingSetBytes": 100}}]}],
}


def test_resource_metrics_are_the_stock_collectors():
    families = parse(render(registry(ResourceCollector(lambda: FAKE))).decode())
    check_stock(families, STOCK_RESOURCE)
    assert set(families) == set(STOCK_RESOURCE) - {"pod_swap_usage_bytes"}  # no pod swap in the source
    node_ms, pod_ms = int(NODE_T * 1000), int(POD_T * 1000)
    assert samples(families, "node_cpu_usage_seconds_total") == {(): (12.5, node_ms)}
    assert samples(families, "node_memory_working_set_bytes") == {(): (4096, node_ms)}
    assert samples(families, "node_swap_usage_bytes") == {(): (0, node_ms)}
    assert samples(families, "container_cpu_usage_seconds_total") == {
        ("app", "default", "web"): (2.0, pod_ms), ("side", "default", "web"): (1.0, pod_ms)}
    assert samples(families, "container_memory_working_set_bytes") == {
        ("app", "default", "web"): (200, pod_ms), ("side", "default", "web"): (100, pod_ms)}
    assert samples(families, "container_swap_usage_bytes") == {("app", "default", "web"): (5, pod_ms)}
    assert samples(families, "container_swap_limit_bytes") == {("app", "default", "web"): (100, pod_ms)}
    assert samples(families, "pod_cpu_usage_seconds_total") == {("default", "web"): (3.0, pod_ms)}
    assert samples(families, "pod_memory_working_set_bytes") == {("default", "web"): (300, pod_ms)}
    starts = samples(families, "container_start_time_seconds")
    assert starts[("app", "default", "web")] == (pytest.approx(1_799_999_990.123456789), None)  # no timestamp
    assert samples(families, "resource_scrape_error") == {(): (0, None)}


def test_a_failed_scrape_serves_only_the_error():
    def broken() -> dict:
        raise ConnectionError("the runtime is down")

    families = parse(render(registry(ResourceCollector(broken))).decode())
    assert list(families) == ["resource_scrape_error"]
    assert samples(families, "resource_scrape_error") == {(): (1, None)}


def test_resource_metrics_from_the_cri(tmp_path):
    """Summary.cpu_and_memory over the CRI: containers' stats by their pod's labels, the pod's sums, the
    container's exact creation time as its start."""
    runtime = FakeCRI()
    runtime.add_sandbox("s1", "web", "default", "u1")
    created = 1_799_999_990_123_456_789
    runtime.add_container("c1", "app", "s1").created_at = created
    stamp = int(POD_T * 1e9)
    runtime.stats = [api_pb2.ContainerStats(
        attributes=api_pb2.ContainerAttributes(id="c1", metadata=api_pb2.ContainerMetadata(name="app")),
        cpu=api_pb2.CpuUsage(timestamp=stamp, usage_core_nano_seconds=api_pb2.UInt64Value(value=1_500_000_000)),
        memory=api_pb2.MemoryUsage(timestamp=stamp, working_set_bytes=api_pb2.UInt64Value(value=7)),
        swap=api_pb2.SwapUsage(timestamp=stamp, swap_usage_bytes=api_pb2.UInt64Value(value=3)))]
    summary = Summary(runtime, Settings(node_name="node-a", root_dir=tmp_path, pod_logs_dir=tmp_path))
    families = parse(render(registry(ResourceCollector(summary.cpu_and_memory))).decode())
    check_stock(families, STOCK_RESOURCE)
    key = ("app", "default", "web")
    assert samples(families, "container_cpu_usage_seconds_total")[key] == (1.5, int(POD_T * 1000))
    assert samples(families, "pod_memory_working_set_bytes")[("default", "web")] == (7, int(POD_T * 1000))
    assert samples(families, "pod_swap_usage_bytes")[("default", "web")] == (3, int(POD_T * 1000))
    assert samples(families, "container_start_time_seconds")[key][0] == pytest.approx(created / 1e9)
    assert samples(families, "node_cpu_usage_seconds_total")[()][0] > 0
    assert samples(families, "node_memory_working_set_bytes")[()][0] > 0
    assert "logs" not in summary.cpu_and_memory()["pods"][0]["containers"][0]  # only what is served
    rendered = summary.summary()  # the Summary API keeps its whole-second RFC 3339 times
    assert rendered["pods"][0]["containers"][0]["startTime"] == "2027-01-15T07:59:50Z"


def test_node_numbers_are_the_root_cgroups(tmp_path, monkeypatch):
    """cgroup v2: usage_usec of the root's cpu.stat; anon + file less inactive_file of its memory.stat (the
    working set as runc and cadvisor count it for "/"). Without them (v1): /proc/stat and /proc/meminfo."""
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (tmp_path / "memory.stat").write_text("anon 1000\nfile 500\ninactive_file 200\npgfault 9\npgmajfault 1\n")
    meminfo = {"MemTotal": 10_000, "MemFree": 4_000, "MemAvailable": 6_000, "SwapTotal": 50, "SwapFree": 30}
    assert stats_module._cpu_and_boot(tmp_path)[0] == 2_500_000_000
    memory = stats_module._node_memory(1.0, meminfo, tmp_path)
    assert (memory["usageBytes"], memory["workingSetBytes"], memory["availableBytes"]) == (1500, 1300, 6000)
    v1 = stats_module._node_memory(1.0, meminfo, tmp_path / "none")
    assert (v1["usageBytes"], v1["workingSetBytes"]) == (6000, 4000)
    assert stats_module._cpu_and_boot(tmp_path / "none")[0] > 0
    assert stats_module._node_swap(1.0, meminfo) == {"time": 1.0, "swapAvailableBytes": 30, "swapUsageBytes": 20}


def test_probe_metrics_are_the_stock_probers():
    tally = ProbeTally("Liveness", "app", "web", "default", "u1", successful=3, failed=2,
                       buckets=(1, 2) + (0,) * (len(DURATION_BUCKETS) - 1), duration_sum=0.02)
    failing = ProbeTally("Readiness", "app", "web", "default", "u1", successful=0, failed=4,
                         buckets=(0,) * (len(DURATION_BUCKETS) + 1), duration_sum=0.0)
    families = parse(render(registry(ProbeCollector(lambda: [tally, failing]))).decode())
    check_stock(families, STOCK_PROBES)
    assert samples(families, "prober_probe_total") == {
        ("app", "default", "web", "u1", "Liveness", "failed"): (2, None),
        ("app", "default", "web", "u1", "Liveness", "successful"): (3, None),
        ("app", "default", "web", "u1", "Readiness", "failed"): (4, None)}
    buckets = {s[1]["le"]: s[2] for s in families["prober_probe_duration_seconds"]["samples"]
               if s[0].endswith("_bucket")}
    assert list(buckets) == ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"]
    assert (buckets["0.005"], buckets["0.01"], buckets["+Inf"]) == (1, 3, 3)  # cumulative; failures not timed
    [started] = samples(families, "process_start_time_seconds").values()
    assert started[0] > 1_600_000_000


def test_no_probe_ran_yet():
    families = parse(render(registry(ProbeCollector(list))).decode())
    assert list(families) == ["process_start_time_seconds"]


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.1, "100ms"), (1.5e-6, "1.5µs"), (20, "20s"), (90.5, "1m30.5s"), (120, "2m0s"), (14400, "4h0m0s"),
    (90001, "25h0m1s")])
def test_durations_as_go_writes_them(seconds, text):
    assert duration_string(seconds) == text


def test_configz_is_the_v1beta1_configuration():
    settings = Settings(node_name="node-a", client_ca_file=Path("/etc/kubernetes/pki/ca.crt"), max_pods=50,
                        cluster_dns=["10.96.0.10"], cluster_domain="cluster.local",
                        eviction_hard={"memory.available": Value(quantity=200 << 20),
                                       "nodefs.available": Value(percentage=0.05)},
                        eviction_soft_grace_period={"memory.available": 90.0})
    doc = json.loads(configz(settings))
    assert list(doc) == ["kubeletconfig"]
    kc = doc["kubeletconfig"]
    assert (kc["kind"], kc["apiVersion"]) == ("KubeletConfiguration", "kubelet.config.k8s.io/v1beta1")
    assert kc["authentication"] == {"x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
                                    "anonymous": {"enabled": False}, "webhook": {"enabled": True, "cacheTTL": "2m0s"}}
    assert kc["authorization"] == {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "5m0s",
                                                                  "cacheUnauthorizedTTL": "30s"}}
    assert (kc["maxPods"], kc["clusterDNS"], kc["clusterDomain"]) == (50, ["10.96.0.10"], "cluster.local")
    assert (kc["streamingConnectionIdleTimeout"], kc["syncFrequency"], kc["containerLogMaxSize"]) == (
        "4h0m0s", "1m0s", "10Mi")
    assert kc["evictionHard"] == {"memory.available": "200Mi", "nodefs.available": "5%"}
    assert kc["evictionSoftGracePeriod"] == {"memory.available": "1m30s"}
    assert "tlsCertFile" not in kc and "staticPodPath" not in kc and "evictionSoft" not in kc  # empty: omitted
    assert "failSwapOn" not in kc  # accepted from a file, not implemented: not claimed
    assert kc["tlsMinVersion"] == "VersionTLS12"


def test_configz_writes_back_what_a_file_gave():
    """The values a file sets come back as the file wrote them (the cipher suites by Go's names)."""
    settings = Settings(node_name="n", system_reserved={"cpu": 500, "memory": 512 << 20, "pid": 1000},
                        tls_min_version=ssl.TLSVersion.TLSv1_3,
                        tls_cipher_suites=config.cipher_suites(["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]))
    kc = kubelet_configuration(settings)
    assert kc["systemReserved"] == {"cpu": "500m", "memory": "512Mi", "pid": "1000"}
    assert kc["tlsMinVersion"] == "VersionTLS13"
    assert kc["tlsCipherSuites"] == ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]


def test_configz_fields_come_from_the_field_table():
    """A table of config.Field, as config.FILE_FIELDS: what it accepts without an attribute is not shown, each
    value is written back by its parser's kind."""
    fields = fields_from({"maxPods": config.sets("max_pods", integer(1)),
                          "a.b.syncFrequency": config.sets("sync_frequency", duration),
                          "ignored": config.ignored(integer(1))})
    assert kubelet_configuration(Settings(node_name="n"), fields) == {
        "maxPods": 110, "a": {"b": {"syncFrequency": "1m0s"}}, "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1"}
