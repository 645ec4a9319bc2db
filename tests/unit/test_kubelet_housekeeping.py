"""Which images the image GC removes and which log files the log rotation keeps (pure selection logic,
and one pass of each against a stand-in runtime)."""
from __future__ import annotations

import calendar
import gzip
from pathlib import Path

import grpc
import pytest

from proto import api_pb2
from pykubelet import config
from pykubelet import runtime as cri
from pykubelet.images.gc import ImageGC, ImageRecord, amount_to_free, select
from pykubelet.logs.rotation import LogRotator, plan
from tests.kit.fake_cri import FakeCRI

GiB = 1 << 30


def test_amount_to_free_follows_the_thresholds():
    assert amount_to_free(100 * GiB, 30 * GiB, 85, 80) == 0  # 70 % used
    assert amount_to_free(100 * GiB, 15 * GiB, 85, 80) == 5 * GiB  # 85 %: down to 80 %
    assert amount_to_free(100 * GiB, 10 * GiB, 85, 80) == 10 * GiB
    assert amount_to_free(100 * GiB, 76 * GiB, 1, 0) == 24 * GiB  # low 0: everything used
    assert amount_to_free(100 * GiB, 0, 100, 80) == 0  # 100: off
    assert amount_to_free(0, 0, 85, 80) == 0


def image(id_: str, size: int = 10, first: float = 0.0, last: float = 0.0, in_use: bool = False,
          pinned: bool = False) -> ImageRecord:
    return ImageRecord(id_, size, first, last, in_use, pinned)


def test_select_takes_unused_old_images_least_recently_used_first():
    images = [image("used", in_use=True), image("pinned", pinned=True), image("young", first=95),
              image("b", last=50), image("a", last=20), image("never", first=10), image("c", last=70)]
    assert [i.id for i in select(images, 25, now=100, min_age=10)] == ["never", "a", "b"]
    assert [i.id for i in select(images, 10**9, now=100, min_age=10)] == ["never", "a", "b", "c"]
    assert select(images, 0, now=100, min_age=10) == []
    # never used comes first, then by last use
    assert [i.id for i in select(images, 10**9, now=100, min_age=0)] == ["never", "young", "a", "b", "c"]


def removed(rt: FakeCRI) -> list[str]:
    return [c[1] for c in rt.calls if c[0] == "RemoveImage"]


def settings(**values) -> config.Settings:
    return config.Settings(node_name="n", **values)


def test_image_gc_keeps_images_in_use_pinned_and_the_pause_image(tmp_path):
    rt = FakeCRI()
    rt.add_image("sha256:busybox", "busybox:1", size=100)
    rt.add_image("sha256:httpd", "httpd:2", size=200)
    rt.add_image("sha256:pause", "pause:3.6", size=1)
    rt.add_image("sha256:pinned", size=1, pinned=True)
    rt.add_image("sha256:data", "data:1", size=300)
    rt.image_fs_mountpoint = str(tmp_path)
    rt.sandbox_image("pause:3.6")
    app = rt.add_container("c1", "app", image="busybox:1", image_ref="sha256:busybox")
    # an image volume's image: in use while a container mounts it, which only the container's status says
    app.mounts.append(api_pb2.Mount(container_path="/data", image=api_pb2.ImageSpec(
        image="data:1", image_ref="sha256:data")))
    clock = [1000.0]
    gc = ImageGC(rt, settings(image_gc_high_threshold_percent=1, image_gc_low_threshold_percent=0,
                              image_minimum_gc_age=60), clock=lambda: clock[0])
    assert gc.collect() == []  # everything just seen: younger than the minimum age
    clock[0] += 60
    assert gc.collect() == ["sha256:httpd"]
    assert removed(rt) == ["sha256:httpd"]
    assert gc.records["sha256:busybox"].last_used == clock[0]


def test_image_gc_does_nothing_below_the_high_threshold(tmp_path):
    rt = FakeCRI()
    rt.add_image("sha256:x", size=1)
    rt.image_fs_mountpoint = str(tmp_path)
    gc = ImageGC(rt, settings(image_minimum_gc_age=0))
    assert gc.collect() == []  # the default 85 %: this test machine's disk is not that full
    assert removed(rt) == []


def test_plan_keeps_max_files_minus_two_rotated_newest_first_and_compresses_them():
    rotated = ["0.log.20261203-100000.gz", "0.log.20261203-100100.gz", "0.log.20261203-100200"]
    assert plan(rotated, 5) == ([], ["0.log.20261203-100200"])
    assert plan(rotated, 4) == (["0.log.20261203-100000.gz"], ["0.log.20261203-100200"])
    assert plan(rotated, 2) == (rotated, [])
    # leftovers of an interrupted pass: a temporary archive, an original whose archive is complete
    leftovers = ["0.log.20261203-100000", "0.log.20261203-100000.gz", "0.log.20261203-100100.gz.tmp"]
    assert plan(leftovers, 5) == (["0.log.20261203-100000", "0.log.20261203-100100.gz.tmp"], [])


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_rotate_renames_compresses_and_reopens(tmp_path):
    live = write(tmp_path / "0.log", "x" * 2048)
    old = write(tmp_path / "0.log.20261203-100000", "old lines\n")
    write(tmp_path / "0.log.20261203-090000.gz", "")
    write(tmp_path / "1.log", "another container's log")
    rt = FakeCRI()
    rt.add_container("c1", "app", log_path=str(live))
    clock = calendar.timegm((2026, 12, 3, 11, 0, 0))
    rotator = LogRotator(rt, settings(container_log_max_size=1024, container_log_max_files=3),
                         clock=lambda: clock)
    assert rotator.rotate("c1", live) is True
    assert [c for c in rt.calls if c[0] == "ReopenContainerLog"] == [("ReopenContainerLog", "c1")]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["0.log", "0.log.20261203-100000.gz", "0.log.20261203-110000", "1.log"]
    assert gzip.decompress((tmp_path / "0.log.20261203-100000.gz").read_bytes()) == b"old lines\n"
    assert not old.exists() and live.stat().st_size == 0
    assert (tmp_path / "0.log.20261203-110000").read_text() == "x" * 2048
    assert rotator.rotate("c1", live) is False  # under the size now


def test_rotate_undoes_the_rename_when_the_runtime_cannot_reopen(tmp_path):
    live = write(tmp_path / "0.log", "x" * 2048)
    refusing = FakeCRI()
    refusing.errors["ReopenContainerLog"] = cri.Unimplemented("ReopenContainerLog", grpc.StatusCode.UNIMPLEMENTED, "no")
    rotator = LogRotator(refusing, settings(container_log_max_size=1024))
    with pytest.raises(cri.Unimplemented):
        rotator.rotate("c1", live)
    assert [p.name for p in tmp_path.iterdir()] == ["0.log"]


def test_config_takes_the_housekeeping_fields(tmp_path):
    path = tmp_path / "k.json"
    path.write_text('{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", '
                    '"imageMinimumGCAge": "30s", "containerLogMonitorInterval": "5s", "containerLogMaxSize": "1Ki", '
                    '"containerLogMaxFiles": 2}')
    s = config.build({}, path)
    assert (s.image_minimum_gc_age, s.container_log_monitor_interval, s.container_log_max_size,
            s.container_log_max_files) == (30.0, 5.0, 1024, 2)
    path.write_text('{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", '
                    '"containerLogMonitorInterval": "1s"}')
    with pytest.raises(config.ConfigError, match="containerLogMonitorInterval"):
        config.build({}, path)
