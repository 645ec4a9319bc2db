"""pykubelet's CRI client against containerd 1.6's CRI and pyruntime-cri: the calls answer, and failures
arrive as the typed errors the kubelet branches on (NotFound for a gone container, Unimplemented for the
event stream containerd 1.6 lacks, Unavailable for a runtime that is not there)."""
from __future__ import annotations

import pytest

from proto import api_pb2
from pykubelet import runtime as cri
from tests.conformance.critest import PyruntimeCri
from tests.kit.containerd_cri import containerd_cri


@pytest.fixture(scope="module", params=["containerd", "pyruntime-cri"])
def endpoint(request, tmp_path_factory):
    work = tmp_path_factory.mktemp(request.param)
    if request.param == "containerd":
        with containerd_cri(work) as e:
            yield e
        return
    (work / "certs.d").mkdir()
    cri_server = PyruntimeCri(work, work / "certs.d")
    cri_server.start()
    try:
        yield cri_server
    finally:
        cri_server.stop()


@pytest.fixture
def client(endpoint):
    c = cri.CRIRuntime(endpoint.url, timeout=30)
    yield c
    c.close()


def test_version_and_status(client, endpoint):
    v = client.version()
    assert v.runtime_name == ("containerd" if endpoint.name == "containerd-cri" else "pyruntime")
    assert v.runtime_api_version == "v1"
    conditions = {c.type: c.status for c in client.status().status.conditions}
    assert conditions == {"RuntimeReady": True, "NetworkReady": True}


def test_lists_and_image_status(client):
    assert client.list_pod_sandbox() == []
    assert client.list_containers(api_pb2.ContainerFilter(state=api_pb2.ContainerStateValue(
        state=api_pb2.CONTAINER_RUNNING))) == []
    assert client.image_status("registry.k8s.io/not-here:1").image.ByteSize() == 0
    assert client.image_fs_info().image_filesystems


def test_errors_are_typed(client, endpoint):
    with pytest.raises(cri.NotFound) as e:
        client.container_status("no-such-container")
    assert e.value.rpc == "ContainerStatus" and "no-such-container" in str(e.value)
    with pytest.raises(cri.NotFound):
        client.pod_sandbox_status("no-such-sandbox")
    if endpoint.name == "containerd-cri":
        with pytest.raises(cri.Unimplemented):
            next(client.container_events())


def test_unavailable_when_nothing_listens(tmp_path):
    c = cri.CRIRuntime(f"unix://{tmp_path}/none.sock", timeout=2)
    with pytest.raises(cri.Unavailable) as e:
        c.version()
    assert e.value.rpc == "Version"
    c.close()
