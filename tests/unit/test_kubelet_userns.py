"""hostUsers: false in pykubelet: the host id ranges pods get (read back from their directories) and the sandbox
config that asks the runtime for the pod's own user namespace."""
from __future__ import annotations

import json
import shutil

import pytest

from proto import api_pb2
from pykubelet.api.podmodel import Pod, parse_pod
from pykubelet.config import Settings
from pykubelet.pods import userns
from pykubelet.pods.criconfig import container_config, sandbox_config


def pod(uid: str, host_users: bool | None = False) -> Pod:
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}]}
    if host_users is not None:
        spec["hostUsers"] = host_users
    return parse_pod({"metadata": {"name": f"p-{uid}", "namespace": "default", "uid": uid}, "spec": spec})


def test_pods_in_the_hosts_user_namespace_get_no_range(tmp_path):
    ns = userns.UserNamespaces(tmp_path)
    assert ns.host_range(pod("a", None)) is None and ns.host_range(pod("b", True)) is None
    assert list(tmp_path.iterdir()) == []


def test_each_pod_gets_a_range_of_its_own_that_survives_a_restart_and_is_freed_with_its_directory(tmp_path):
    ns = userns.UserNamespaces(tmp_path)
    assert [ns.host_range(pod(u)) for u in ("a", "b", "c")] == [65536, 131072, 196608]
    assert json.loads((tmp_path / "b" / "userns").read_text()) == {"hostID": 131072, "length": 65536}
    restarted = userns.UserNamespaces(tmp_path)
    assert restarted.host_range(pod("b")) == 131072  # the record, not a new allocation
    shutil.rmtree(tmp_path / "a")  # the pod is gone: its range is free again
    assert restarted.host_range(pod("d")) == 65536


def test_an_unreadable_record_refuses_the_pod_rather_than_guess(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "userns").write_text('{"hostID": 12, "length": 65536}')
    with pytest.raises(userns.UserNamespaceError, match="not a user namespace range of this kubelet"):
        userns.UserNamespaces(tmp_path).host_range(pod("a"))


def test_the_sandbox_asks_for_the_pods_own_user_namespace(tmp_path):
    settings = Settings(node_name="n", root_dir=tmp_path)
    opts = sandbox_config(pod("a"), settings, host_range=131072).linux.security_context.namespace_options
    ids = [api_pb2.IDMapping(container_id=0, host_id=131072, length=65536)]
    assert opts.userns_options == api_pb2.UserNamespace(mode=api_pb2.NamespaceMode.POD, uids=ids, gids=ids)
    plain = sandbox_config(pod("a", None), settings).linux.security_context.namespace_options
    assert not plain.HasField("userns_options")


def test_the_containers_volumes_are_idmapped_through_the_pods_mappings(tmp_path):
    """As the stock kubelet: what root owns in an emptyDir on the host, the pod's root owns."""
    settings = Settings(node_name="n", root_dir=tmp_path)
    p = pod("a")
    volume = api_pb2.Mount(container_path="/data", host_path="/var/lib/x")
    config = container_config(p, p.spec.containers[0], "busybox", 0,
                              sandbox_config(p, settings, host_range=131072), memory_capacity=1 << 30,
                              mounts=[volume])
    ids = [api_pb2.IDMapping(container_id=0, host_id=131072, length=65536)]
    assert list(config.mounts[0].uidMappings) == list(config.mounts[0].gidMappings) == ids
    assert not volume.uidMappings  # the volume manager's mount is not changed
    plain = container_config(p, p.spec.containers[0], "busybox", 0, sandbox_config(p, settings),
                             memory_capacity=1 << 30, mounts=[volume])
    assert not plain.mounts[0].uidMappings
