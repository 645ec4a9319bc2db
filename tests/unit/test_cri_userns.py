"""A pod's user namespace, without root: which requests RunPodSandbox refuses (and the field it names), and the
idmapped rootfs's mounts as the syscall layer's fake records them."""
from __future__ import annotations

import re

import pytest

from proto import api_pb2
from pyruntime.cri.sandbox import user_namespace_maps
from pyruntime.errors import InvalidArgumentError
from pyruntime.images.mount import IdMap, Mount, mount_all
from pyruntime.linux.syscalls import FakeSyscalls

NS = api_pb2.NamespaceMode


def config(mode: api_pb2.NamespaceMode = NS.POD, uids=((0, 1000, 65536),), gids=((0, 1000, 65536),),
           **host) -> api_pb2.PodSandboxConfig:
    c = api_pb2.PodSandboxConfig()
    opts = c.linux.security_context.namespace_options
    for kind, value in host.items():
        setattr(opts, kind, value)
    opts.userns_options.mode = mode
    for field, ranges in (("uids", uids), ("gids", gids)):
        for inside, outside, length in ranges:
            getattr(opts.userns_options, field).add(container_id=inside, host_id=outside, length=length)
    return c


def test_the_hosts_user_namespace_needs_no_maps():
    assert user_namespace_maps(api_pb2.PodSandboxConfig()) == {"uid_map": [], "gid_map": []}
    assert user_namespace_maps(config(NS.NODE, uids=(), gids=())) == {"uid_map": [], "gid_map": []}


def test_a_pod_user_namespace_maps_its_one_range():
    assert user_namespace_maps(config(gids=((0, 5000, 100),))) == {"uid_map": [[0, 1000, 65536]],
                                                                   "gid_map": [[0, 5000, 100]]}


@pytest.mark.parametrize("bad, where", [
    (config(NS.CONTAINER), "userns_options.mode: CONTAINER"),
    (config(NS.TARGET), "userns_options.mode: TARGET"),
    (config(uids=((0, 1000, 10), (10, 2000, 10))), "userns_options.uids: 2 mappings"),
    (config(gids=()), "userns_options.gids: 0 mappings"),
    (config(uids=((1, 1000, 10),)), "userns_options.uids[0].container_id: 1"),
    (config(gids=((0, 1000, 0),)), "userns_options.gids[0]: host_id 1000 and length 0"),
    (config(uids=((0, 4294967295 - 10, 11),)), "userns_options.uids[0]: host_id 4294967285 and length 11"),
    (config(network=NS.NODE), "network: NODE"),
    (config(ipc=NS.NODE), "ipc: NODE"),
    (config(pid=NS.NODE), "pid: NODE"),
])
def test_refused_requests_name_the_field(bad, where):
    prefix = "config.linux.security_context.namespace_options."
    with pytest.raises(InvalidArgumentError, match=re.escape(prefix + where)):
        user_namespace_maps(bad)


def test_an_idmapped_overlay_maps_the_lower_layers_and_hands_the_upper_to_the_pods_root(tmp_path):
    userns = tmp_path / "userns"
    userns.write_text("")  # a stand-in: the fake never hands the fd to the kernel
    target = tmp_path / "rootfs"
    target.mkdir()
    fake = FakeSyscalls()
    overlay = Mount("overlay", "overlay", ["lowerdir=/l/2:/l/1", "upperdir=/c/upper", "workdir=/c/work", "index=off"])
    mount_all([overlay], target, fake, IdMap(str(userns), 1000, 2000))
    staging = f"{target}.idmap"
    assert [(c[1], c[3]) for c in fake.named("mount_idmapped")] == [("/l/2", f"{staging}/0"), ("/l/1", f"{staging}/1")]
    assert fake.named("chown") == [("chown", "/c/upper", 1000, 2000)]
    (_, _source, where, fstype, _flags, data), = fake.named("mount")
    assert (where, fstype) == (str(target), "overlay")
    assert data == f"lowerdir={staging}/0:{staging}/1,upperdir=/c/upper,workdir=/c/work,index=off"
    # the overlay holds its layers: the staging mounts are detached and their directory is gone
    assert sorted(c[1] for c in fake.named("umount")) == [f"{staging}/0", f"{staging}/1"]
    assert not (tmp_path / "rootfs.idmap").exists()


def test_an_idmapped_copy_rootfs_is_one_idmapped_bind(tmp_path):
    userns = tmp_path / "userns"
    userns.write_text("")
    fake = FakeSyscalls()
    mount_all([Mount("bind", "/c/rootfs", ["rbind", "rw"])], tmp_path / "rootfs", fake, IdMap(str(userns), 1, 1))
    assert [(c[1], c[3]) for c in fake.named("mount_idmapped")] == [("/c/rootfs", f"{tmp_path}/rootfs")]
    assert fake.named("mount") == [] and fake.named("chown") == []
