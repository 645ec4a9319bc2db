"""bench.cluster's pure logic: the percentiles of the start latencies and the table with its ratios and targets."""
from bench import record_section
from bench.cluster import BASE, KUBEADM, OURS, summary, table


def result(latencies, ready, memory=None, error=None):
    size = {"latency": sorted(latencies), "ready_s": ready, "reached": {"running": len(latencies),
                                                                        "ready": len(latencies)}}
    if memory:
        size["memory"] = memory
    if error:
        size["error"] = error
    return size


def memory(pod_pss, pods=10):
    return {"pods": pods, "kubelet_rss": 50 * 1024, "kubelet_pss": 40 * 1024, "runtime_pss": 60 * 1024,
            "pod_pss": pod_pss * 1024, "keeper_pss": (pod_pss - 1) * 1024, "pause_pss": 1024}


def test_summary_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert summary(values) == {"p50": 50.0, "p99": 99.0}
    assert summary([3.0]) == {"p50": 3.0, "p99": 3.0}
    assert summary([]) == {}


def test_table_ratios_and_targets():
    results = {
        BASE: {"sizes": {"10": result([2.0] * 10, 5.0, memory(3.0))}},
        OURS: {"sizes": {"10": result([0.5] * 9 + [1.5], 2.0, memory(4.5))}},
        "kubelet/pyruntime-cri": {"sizes": {"10": result([1.0] * 4, None, error="timed out")}},
    }
    text = table(results, [10])
    assert f"| 10 | {BASE} | 5.00 | 2.00 | 2.00 | 1.00 | 1.00 | all |" in text
    assert f"| 10 | {OURS} | 2.00 | 0.50 | 1.50 | 0.25 | 0.75 | all |" in text
    assert "| 10 | kubelet/pyruntime-cri | - | 1.00 | 1.00 | 0.50 | 0.50 | 4/10 Ready |" in text
    # per pod 4.5 MiB; node total per pod: (40 + 60) / 10 + 4.5
    assert f"| {OURS} | 50.0 | 40.0 | 60.0 | 4.50 | 1.00 | 14.50 | 1.50 |" in text
    assert "10 pods p50 0.25 of base: met" in text and "10 pods p99 0.75 of base: NOT met" in text
    assert "memory per pod 1.50 of base: NOT met" in text


def test_kubeadm_rows_are_against_the_stock_pairs_kubeadm_cluster():
    """A kubeadm pair has a row at its one size, its ratios against the stock pair's kubeadm cluster (not the
    one-node cluster's), and no memory row."""
    results = {
        BASE: {"sizes": {"30": result([2.0] * 30, 6.0, memory(3.0))}},
        OURS: {"sizes": {"30": result([1.0] * 30, 3.0, memory(3.0))}},
        KUBEADM + BASE: {"sizes": {"30": result([4.0] * 30, 8.0)}},
        KUBEADM + OURS: {"sizes": {"30": result([1.0] * 30, 4.0)}},
    }
    text = table(results, [30])
    assert f"| 30 | {KUBEADM}{BASE} | 8.00 | 4.00 | 4.00 | 1.00 | 1.00 | all |" in text
    assert f"| 30 | {KUBEADM}{OURS} | 4.00 | 1.00 | 1.00 | 0.25 | 0.25 | all |" in text
    assert f"| {KUBEADM}" not in text.split("MiB, 30 pods running")[1]
    assert "30 pods p50 0.50 of base: met" in text  # the targets stay the one-node cluster's


def test_table_without_the_base_pair():
    text = table({OURS: {"sizes": {}, "error": "make cluster: failed"}}, [10])
    assert f"| 10 | {OURS} | - | - | - | - | - | make cluster: failed |" in text
    assert "not measured" in text


def test_record_section_replaces_only_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- a:begin -->\nold\n<!-- a:end -->\nrest\n")
    record_section("<!-- a:begin -->", "<!-- a:end -->", "new", readme)
    assert readme.read_text() == "intro\n<!-- a:begin -->\nnew\n<!-- a:end -->\nrest\n"
    record_section("<!-- b:begin -->", "<!-- b:end -->", "more", readme)
    assert readme.read_text().endswith("rest\n\n<!-- b:begin -->\nmore\n<!-- b:end -->\n")
