"""cri/stats.py on a real container and its pod cgroup: CPU time and rate, memory, writable layer, the
pod's figures from its cgroup parent and its network namespace, the metrics."""
from __future__ import annotations

import os
import time

from proto import api_pb2
from pyruntime.cri import stats
from pyruntime.cri.model import ContainerRecord, Layout, SandboxRecord, encode_pb
from pyruntime.linux.syscalls import LinuxSyscalls
from pyruntime.oci.spec import load_bundle
from pyruntime.runtime import Runtime
from pyruntime.settings import Settings
from tests.kit.runtime import bundle_config


def test_container_and_pod_stats(tmp_path, rootfs, make_bundle):
    rt = Runtime(Settings.from_env({}, root=str(tmp_path / "state")), kernel=LinuxSyscalls())
    layout = Layout(str(tmp_path / "root"), str(tmp_path / "state"))
    upper = os.path.join(layout.images, "containers", "c1", "upper")
    os.makedirs(upper)
    with open(os.path.join(upper, "written"), "wb") as f:
        f.write(b"x" * 100_000)
    config = bundle_config(rootfs, ["sh", "-c", "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; sleep 100"])
    config["linux"]["cgroupsPath"] = "/pyruntime/podtest/c1"
    bundle = make_bundle([], config=config)
    cfg = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="app"), labels={"l": "v"})
    record = ContainerRecord(id="c1", sandbox_id="sb1", config=encode_pb(cfg), created_at=1, image_ref="busybox",
                             image_id="sha256:00")
    pod_config = api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(name="web", uid="u", namespace="ns"))
    try:
        state = rt.create("c1", str(bundle), spec=load_bundle(str(bundle)))
        rt.start("c1")
        time.sleep(0.3)
        stats.forget("c1")
        first = stats.container_stats(record, rt, layout)
        assert first.attributes.id == "c1" and first.attributes.metadata.name == "app"
        assert dict(first.attributes.labels) == {"l": "v"}
        assert first.cpu.usage_core_nano_seconds.value > 0 and not first.cpu.HasField("usage_nano_cores")
        assert first.memory.working_set_bytes.value > 0 and first.memory.usage_bytes.value > 0
        assert first.writable_layer.used_bytes.value >= 100_000 and first.writable_layer.inodes_used.value == 2
        time.sleep(0.05)
        assert stats.container_stats(record, rt, layout).cpu.HasField("usage_nano_cores")

        sandbox = SandboxRecord(id="sb1", config=encode_pb(pod_config), created_at=1,
                                namespaces={"net": f"/proc/{state.pid}/ns/net"}, pause_pid=state.pid,
                                cgroup_parent="/pyruntime/podtest")
        pod = stats.sandbox_stats(sandbox, [record], rt, layout)
        assert pod.attributes.metadata.name == "web" and len(pod.linux.containers) == 1
        assert pod.linux.cpu.usage_core_nano_seconds.value >= first.cpu.usage_core_nano_seconds.value
        assert pod.linux.memory.working_set_bytes.value > 0 and pod.linux.process.process_count.value >= 1
        assert pod.linux.HasField("network")  # a new netns: only lo, which is not reported
        metrics = stats.sandbox_metrics(sandbox, [record], rt, layout)
        [container] = metrics.container_metrics
        by_name = {m.name: m for m in container.metrics}
        assert by_name["container_memory_working_set_bytes"].value.value > 0
        assert list(by_name["container_fs_usage_bytes"].label_values) == ["c1", "app", "busybox"]
        # the figures read from /proc and statvfs for the full set (critest's metrics specs check the names)
        assert by_name["container_threads"].value.value >= 1 and by_name["container_processes"].value.value >= 1
        assert by_name["container_file_descriptors"].value.value >= 3  # sh's stdio at least
        assert by_name["container_fs_limit_bytes"].value.value > 0 and "container_oom_events_total" in by_name
        assert all(len(m.label_values) == len(stats.LABELS) + len(stats._DESCRIPTORS[m.name][2])
                   for m in container.metrics)
    finally:
        rt.delete("c1", force=True)
    gone = stats.container_stats(record, rt, layout)
    assert not gone.HasField("cpu") and gone.writable_layer.used_bytes.value >= 100_000
    stats.forget("c1")
    stats.forget("pod:sb1")
