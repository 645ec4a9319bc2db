"""The stock kubelet's /metrics/resource and /metrics/probes families (name -> type, HELP text, label
names), transcribed from k8s.io/kubernetes v1.37.2's pkg/kubelet/metrics/collectors/resource_metrics.go and
pkg/kubelet/prober/prober_manager.go, and a small reader of the Prometheus text format to check a scrape
against them: the unit tests and the e2e tests read pykubelet's answers back with it."""
from __future__ import annotations

import re

C, P = ("container", "namespace", "pod"), ("namespace", "pod")
# name -> (type, HELP, label names) of the stock kubelet's resource metrics collector
STOCK_RESOURCE = {
    "node_cpu_usage_seconds_total": ("counter", "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
                                     ()),
    "node_memory_working_set_bytes": ("gauge", "[STABLE] Current working set of the node in bytes", ()),
    "node_swap_usage_bytes": ("gauge", "[ALPHA] Current swap usage of the node in bytes. Reported only on "
                              "non-windows systems", ()),
    "container_cpu_usage_seconds_total": ("counter", "[STABLE] Cumulative cpu time consumed by the container in "
                                          "core-seconds", C),
    "container_memory_working_set_bytes": ("gauge", "[STABLE] Current working set of the container in bytes", C),
    "container_swap_usage_bytes": ("gauge", "[ALPHA] Current amount of the container swap usage in bytes. "
                                   "Reported only on non-windows systems", C),
    "container_swap_limit_bytes": ("gauge", "[ALPHA] Current amount of the container swap limit in bytes. "
                                   "Reported only on non-windows systems", C),
    "pod_cpu_usage_seconds_total": ("counter", "[STABLE] Cumulative cpu time consumed by the pod in core-seconds", P),
    "pod_memory_working_set_bytes": ("gauge", "[STABLE] Current working set of the pod in bytes", P),
    "pod_swap_usage_bytes": ("gauge", "[ALPHA] Current amount of the pod swap usage in bytes. Reported only on "
                             "non-windows systems", P),
    "resource_scrape_error": ("gauge", "[STABLE] 1 if there was an error while getting container metrics, 0 "
                              "otherwise", ()),
    "container_start_time_seconds": ("gauge", "[STABLE] Start time of the container since unix epoch in seconds", C),
}
STOCK_PROBES = {
    "prober_probe_total": ("counter", "[BETA] Cumulative number of a liveness, readiness or startup probe for a "
                           "container by result.", ("container", "namespace", "pod", "pod_uid", "probe_type",
                                                    "result")),
    "prober_probe_duration_seconds": ("histogram", "[ALPHA] Duration in seconds for a probe response.",
                                      ("container", "namespace", "pod", "probe_type")),
    "process_start_time_seconds": ("gauge", "[ALPHA] Start time of the process since unix epoch in seconds.", ()),
}

_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (-?\d+))?')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def parse(text: str) -> dict[str, dict]:
    """Families of the Prometheus text format: name -> {type, help, samples: [(name, labels, value, ms)]}."""
    families: dict[str, dict] = {}
    current: dict = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            current = families.setdefault(name, {"samples": []})
            current["help"] = help_
        elif line.startswith("# TYPE "):
            name, _, type_ = line[7:].partition(" ")
            families[name]["type"] = type_
        elif line and not line.startswith("#"):
            m = _SAMPLE.fullmatch(line)
            assert m is not None, line
            labels = dict(_LABEL.findall(m.group(2) or ""))
            assert "".join(f'{k}="{v}",' for k, v in labels.items()).rstrip(",") == (m.group(2) or ""), line
            current["samples"].append((m.group(1), labels, float(m.group(3)),
                                       int(m.group(4)) if m.group(4) else None))
    return families


def check_stock(families: dict[str, dict], stock: dict[str, tuple[str, str, tuple[str, ...]]]) -> None:
    assert list(families) == sorted(families), "families in name order, as client_golang writes them"
    for name, family in families.items():
        type_, help_, labels = stock[name]
        assert (family["type"], family["help"]) == (type_, help_), name
        for sample, got, _, _ in family["samples"]:
            assert sample.startswith(name)
            assert tuple(k for k in got if k != "le") == labels, sample


def samples(families: dict[str, dict], name: str) -> dict[tuple[str, ...], tuple[float, int | None]]:
    return {tuple(labels.values()): (value, ms) for _, labels, value, ms in families[name]["samples"]}
