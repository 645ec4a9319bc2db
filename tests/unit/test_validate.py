"""oci/validate.py: every rule, with the exact field path its error starts with."""
from __future__ import annotations

import copy
import os

import pytest

from pyruntime.linux.syscalls import FakeSyscalls
from pyruntime.oci import spec as specmod
from pyruntime.oci import validate as validate_mod
from pyruntime.oci.default import default_spec
from pyruntime.oci.spec import SpecError
from pyruntime.oci.validate import validate

# default namespaces: pid 0, network 1, ipc 2, uts 3, mount 4, cgroup 5


def config(edit=None) -> dict:
    c = copy.deepcopy(default_spec())
    if edit is not None:
        edit(c)
    return c


def check(c: dict, driver: str = "v1") -> None:
    validate(specmod.parse(c, "/bundle"), driver, FakeSyscalls())


def refused(c: dict, driver: str = "v1") -> str:
    with pytest.raises(SpecError) as err:
        check(c, driver)
    return str(err.value)


def namespaces(*kinds: str, **paths: str) -> list[dict]:
    out = [{"type": k} for k in kinds]
    out += [{"type": k, "path": p} for k, p in paths.items()]
    return out


def userns(c: dict) -> dict:
    """`c` with a user namespace and mappings for it, so an edit can build on them."""
    c["linux"]["namespaces"].append({"type": "user"})
    c["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    c["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    return c


@pytest.mark.parametrize("driver", ["v1", "v2"])
def test_the_default_spec_passes(driver):
    check(config(), driver)
    check(config(userns), driver)


def test_a_mount_namespace_is_required():
    c = config(lambda c: c["linux"]["namespaces"].remove({"type": "mount"}))
    assert refused(c).startswith("linux.namespaces: a mount namespace (new or by path) is required")


def test_namespace_paths_must_exist_and_be_namespaces_of_their_type(tmp_path):
    c = config(lambda c: c["linux"]["namespaces"].__setitem__(1, {"type": "network", "path": "/nonexistent/ns"}))
    assert refused(c) == "linux.namespaces[1].path: open /nonexistent/ns: No such file or directory"
    (tmp_path / "plain").write_text("")
    c["linux"]["namespaces"][1]["path"] = str(tmp_path / "plain")
    assert refused(c) == f"linux.namespaces[1].path: {tmp_path}/plain is not a namespace file"
    c["linux"]["namespaces"][1]["path"] = "/proc/self/ns/ipc"
    assert refused(c) == "linux.namespaces[1].path: /proc/self/ns/ipc is not a network namespace (its type is ipc)"
    c["linux"]["namespaces"][1]["path"] = "/proc/self/ns/net"
    check(c)


def test_a_new_namespace_the_kernel_lacks_is_refused(monkeypatch):
    real = os.path.exists
    monkeypatch.setattr(validate_mod.os.path, "exists", lambda p: p != "/proc/self/ns/time" and real(p))
    c = config(lambda c: c["linux"]["namespaces"].append({"type": "time"}))
    assert refused(c) == "linux.namespaces[6]: this kernel has no time namespaces"


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["linux"].__setitem__("uidMappings", [{"containerID": 0, "hostID": 1, "size": 1}]),
     "linux.uidMappings: mappings need a user namespace in linux.namespaces"),
    (lambda c: c["linux"].__setitem__("gidMappings", [{"containerID": 0, "hostID": 1, "size": 1}]),
     "linux.gidMappings: mappings need a user namespace in linux.namespaces"),
    (lambda c: (userns(c), c["linux"].pop("uidMappings")),
     "linux.uidMappings: required for a new user namespace (linux.namespaces[6])"),
    (lambda c: (userns(c), c["linux"].pop("gidMappings")),
     "linux.gidMappings: required for a new user namespace (linux.namespaces[6])"),
    (lambda c: (userns(c), c["linux"]["uidMappings"].append({"containerID": 65535, "hostID": 0, "size": 1})),
     "linux.uidMappings[1]: containerID range overlaps linux.uidMappings[0]"),
    (lambda c: (userns(c), c["linux"]["gidMappings"].append({"containerID": 70000, "hostID": 100001, "size": 1})),
     "linux.gidMappings[1]: hostID range overlaps linux.gidMappings[0]"),
    (lambda c: (userns(c), c["linux"].__setitem__("gidMappings", [{"containerID": 0, "hostID": 2**32 - 1,
                                                                    "size": 2}])),
     "linux.gidMappings[0]: hostID 4294967295 + size 2 goes past the last id 4294967295"),
    (lambda c: (userns(c), c["linux"].__setitem__("uidMappings", [{"containerID": i, "hostID": 1000 + i, "size": 1}
                                                                   for i in range(341)])),
     "linux.uidMappings: 341 mappings, the kernel takes at most 340"),
])
def test_user_namespace_mappings(edit, message):
    assert refused(config(edit)) == message


@pytest.mark.parametrize("field", ["hostname", "domainname"])
def test_host_and_domain_names_need_a_uts_namespace(field):
    c = config(lambda c: c["linux"]["namespaces"].remove({"type": "uts"}))
    c.pop("hostname", None)
    c[field] = "box"
    assert refused(c) == f"{field}: setting a {field} needs the container's own uts namespace in linux.namespaces"


@pytest.mark.parametrize("key, kinds, error", [
    ("net.ipv4.ip_forward", ("network",), None),
    ("net.ipv4.ip_forward", (), "needs the container's own network namespace in linux.namespaces"),
    ("kernel.shmmax", ("ipc",), None),
    ("kernel.shm_rmid_forced", ("ipc",), None),
    ("kernel.msgmnb", ("ipc",), None),
    ("kernel.sem", ("ipc",), None),
    ("fs.mqueue.queues_max", ("ipc",), None),
    ("kernel.msgmax", ("network", "uts"), "needs the container's own ipc namespace in linux.namespaces"),
    ("fs.mqueue.msg_max", (), "needs the container's own ipc namespace in linux.namespaces"),
    ("kernel.hostname", ("uts",), None),
    ("kernel.domainname", ("ipc",), "needs the container's own uts namespace in linux.namespaces"),
    ("kernel.panic", ("ipc", "network", "uts"), "not a namespaced sysctl: refusing to change the host"),
    ("kernel.semx", ("ipc",), "not a namespaced sysctl: refusing to change the host"),
    ("vm.swappiness", ("ipc", "network", "uts"), "not a namespaced sysctl: refusing to change the host"),
])
def test_only_sysctls_of_the_containers_own_namespaces(key, kinds, error):
    c = config()
    c.pop("hostname", None)
    c["linux"]["namespaces"] = namespaces("mount", *kinds)
    c["linux"]["sysctl"] = {key: "1"}
    if error is None:
        check(c)
    else:
        assert refused(c) == f'linux.sysctl["{key}"]: {error}'


def test_a_sysctl_in_a_namespace_joined_by_path_must_not_be_the_runtimes_own():
    c = config()
    c.pop("hostname", None)
    c["linux"]["namespaces"] = namespaces("mount", "ipc", network="/proc/self/ns/net", uts="/proc/self/ns/uts")
    for key, ns, index in (("net.ipv4.ip_forward", "network", 2), ("kernel.hostname", "uts", 3)):
        c["linux"]["sysctl"] = {key: "1"}
        assert refused(c) == (f'linux.sysctl["{key}"]: linux.namespaces[{index}].path /proc/self/ns/'
                              f'{"net" if ns == "network" else ns} is the runtime\'s own {ns} namespace: '
                              "refusing to change the host")


@pytest.mark.parametrize("mount, message", [
    ({"destination": "/x", "type": "tmp fs"}, 'mounts[7].type: "tmp fs" is not a filesystem type'),
    ({"destination": "/x", "type": "a/b"}, 'mounts[7].type: "a/b" is not a filesystem type'),
    ({"destination": "/x", "type": "bind", "options": ["rbind"]}, "mounts[7].source: required for a bind mount"),
    ({"destination": "/x", "options": ["bind"]}, "mounts[7].source: required for a bind mount"),
    ({"destination": "/x", "type": "bind", "source": "/s", "options": ["rbind"],
      "uidMappings": [{"containerID": 0, "hostID": 1, "size": 1}]},
     "mounts[7].gidMappings: an idmapped mount needs both uidMappings and gidMappings"),
    ({"destination": "/x", "type": "bind", "source": "/s", "options": ["rbind"],
      "gidMappings": [{"containerID": 0, "hostID": 1, "size": 1}]},
     "mounts[7].uidMappings: an idmapped mount needs both uidMappings and gidMappings"),
    ({"destination": "/x", "type": "bind", "source": "/s", "options": ["rbind", "idmap"]},
     "mounts[7].uidMappings: an idmapped mount needs both uidMappings and gidMappings"),
    ({"destination": "/x", "type": "tmpfs", "source": "tmpfs", "options": ["idmap"],
      "uidMappings": [{"containerID": 0, "hostID": 1, "size": 1}],
      "gidMappings": [{"containerID": 0, "hostID": 1, "size": 1}]},
     'mounts[7].type: idmapped mounts are only supported for bind mounts, not "tmpfs"'),
    ({"destination": "/x", "type": "bind", "source": "/s", "options": ["rbind"],
      "uidMappings": [{"containerID": 0, "hostID": 1, "size": 10}, {"containerID": 5, "hostID": 100, "size": 1}],
      "gidMappings": [{"containerID": 0, "hostID": 1, "size": 1}]},
     "mounts[7].uidMappings[1]: containerID range overlaps mounts[7].uidMappings[0]"),
])
def test_mounts(mount, message):
    assert refused(config(lambda c: c["mounts"].append(mount))) == message


def _userns_with_mount(mount: dict):
    ids = [{"containerID": 0, "hostID": 100000, "size": 65536}]

    def change(c):
        c["linux"]["namespaces"].append({"type": "user"})
        c["linux"]["uidMappings"] = c["linux"]["gidMappings"] = ids
        c["mounts"].append(mount)
    return change


def test_an_idmapped_mount_into_a_container_with_its_own_user_namespace_comes_from_outside_its_rootfs():
    ids = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    check(config(_userns_with_mount({"destination": "/x", "type": "bind", "source": "/s", "options": ["rbind"],
                                     "uidMappings": ids, "gidMappings": ids})))
    check(config(_userns_with_mount({"destination": "/x", "type": "bind", "source": "/s",
                                     "options": ["rbind", "idmap"]})))  # the container's mappings
    joined = config(_userns_with_mount({"destination": "/x", "type": "bind", "source": "/s",
                                        "options": ["rbind", "idmap"]}))
    del joined["linux"]["uidMappings"], joined["linux"]["gidMappings"]
    joined["linux"]["namespaces"][-1]["path"] = "/proc/self/ns/user"
    check(joined)  # the joined namespace's own mappings
    assert refused(config(_userns_with_mount({"destination": "/x", "type": "bind", "source": "/bundle/rootfs/s",
                                              "options": ["rbind", "idmap"]}))) == (
        "mounts[7].source: /bundle/rootfs/s is inside the rootfs; pyruntime idmaps a mount into a container with "
        "a user namespace of its own only from a source outside it")


def test_a_valid_bind_mount_passes():
    check(config(lambda c: c["mounts"].append({"destination": "/x", "type": "bind", "source": "/s",
                                               "options": ["rbind", "ro"]})))


@pytest.mark.parametrize("devices, message", [
    ([{"type": "c", "path": "/dev/fuse", "major": 10, "minor": 229},
      {"type": "c", "path": "/dev//fuse", "major": 10, "minor": 229}],
     "linux.devices[1].path: /dev//fuse is already linux.devices[0]"),
    ([{"type": "c", "path": "/dev/../etc/x", "major": 1, "minor": 3}],
     "linux.devices[0].path: /dev/../etc/x must not contain '..'"),
    ([{"type": "p", "path": "/"}], "linux.devices[0].path: names the root directory, not a device"),
])
def test_devices(devices, message):
    assert refused(config(lambda c: c["linux"].__setitem__("devices", devices))) == message


@pytest.mark.parametrize("path", ["", "/kubepods/pod1/c1", "mine/c1", "test.slice:cri-containerd:abc",
                                  "/test.slice:cri-containerd:abc"])
def test_cgroups_paths_runc_takes_pass(path):
    check(config(lambda c: c["linux"].__setitem__("cgroupsPath", path)))


@pytest.mark.parametrize("path, message", [
    ("/a/../../etc", "linux.cgroupsPath: '/a/../../etc' must not contain '..'"),
    ("/", "linux.cgroupsPath: '/' names the hierarchy root, not a container cgroup"),
])
def test_cgroups_paths_refused(path, message):
    assert refused(config(lambda c: c["linux"].__setitem__("cgroupsPath", path))) == message


def resources(**r):
    return lambda c: c["linux"].__setitem__("resources", r)


@pytest.mark.parametrize("edit, driver, message", [
    (resources(unified={"memory.high": "1"}), "v1",
     "linux.resources.unified: invalid configuration: needs cgroup v2, this host uses cgroup v1"),
    (resources(memory={"limit": 200, "swap": 100}), "v1",
     "linux.resources.memory.swap: 100 is below memory limit 200; OCI swap is memory+swap"),
    (resources(memory={"limit": 200, "swap": 100}), "v2",
     "linux.resources.memory.swap: 100 is below memory limit 200; OCI swap is memory+swap"),
    (resources(memory={"swap": 100}), "v2", "linux.resources.memory.swap: cannot limit swap without a memory limit"),
    (resources(memory={"kernelTCP": 1 << 20}), "v2",
     "linux.resources.memory.kernelTCP: cgroup v2 has no kernel TCP memory limit"),
    (resources(cpu={"realtimeRuntime": 1000}), "v2",
     "linux.resources.cpu.realtimeRuntime: cgroup v2 has no realtime CPU scheduling"),
    (resources(cpu={"realtimePeriod": 1000}), "v2",
     "linux.resources.cpu.realtimePeriod: cgroup v2 has no realtime CPU scheduling"),
    # a hole in a wildcard rule, which v1 would silently ignore (here: the default allow-list's /dev/null)
    (resources(devices=[{"allow": True}, {"allow": False, "type": "c"}]), "v2",
     "linux.resources.devices[4] (allow c 1:3 rwm): cannot take access away from inside the wider rule c *:* "
     "(cgroup v1 would ignore it)"),
])
def test_resources_against_the_cgroup_driver(edit, driver, message):
    assert refused(config(edit), driver) == message


@pytest.mark.parametrize("edit, driver", [
    (resources(unified={"memory.high": "1"}), "v2"),
    (resources(memory={"kernelTCP": 1 << 20, "swap": 100}), "v1"),
    (resources(cpu={"realtimeRuntime": 1000}), "v1"),
    (resources(devices=[{"allow": False, "type": "c", "major": 1, "minor": 3}]), "v1"),
    (lambda c: c["linux"].__setitem__("devices", [{"type": "c", "path": "/dev/fuse", "major": 10, "minor": 229}]),
     "v1"),
    # cgroup v2 enforces any device rule list through its eBPF program
    (resources(devices=[{"allow": False, "type": "c", "major": 1, "minor": 3}]), "v2"),
    (lambda c: (c["linux"].__setitem__("devices", [{"type": "c", "path": "/dev/fuse", "major": 10, "minor": 229}]),
                c["linux"]["resources"].pop("devices")), "v2"),
])
def test_what_one_driver_cannot_apply_passes_on_the_one_that_can(edit, driver):
    check(config(edit), driver)

def test_map_entries_are_named_by_their_key_as_validation_names_them():
    with pytest.raises(SpecError) as err:
        specmod.parse(config(lambda c: c["linux"].__setitem__("sysctl", {"net.ipv4.ip_forward": 1})), "/bundle")
    assert str(err.value) == 'linux.sysctl["net.ipv4.ip_forward"]: must be a string, got 1'
