"""The checked-in CRI stubs are what proto/api.proto generates today: a stale stub would let the CRI
server and the kubelet disagree with the proto on the wire without any test noticing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_stubs_match_a_fresh_generation(tmp_path):
    subprocess.run([str(REPO / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True,
                   env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    stale = [name for name in GENERATED
             if (tmp_path / "proto" / name).read_bytes() != (REPO / "proto" / name).read_bytes()]
    assert not stale, f"proto/{', proto/'.join(stale)} differ from a fresh generation: run `make proto`"


def test_stubs_load_and_name_both_services():
    from proto import api_pb2, api_pb2_grpc
    services = api_pb2.DESCRIPTOR.services_by_name
    assert {"RuntimeService", "ImageService"} <= set(services)
    assert hasattr(api_pb2_grpc, "RuntimeServiceStub") and hasattr(api_pb2_grpc, "ImageServiceServicer")
