"""Pure logic of the runtime: config validation, mount options, argument parsing, fd closing."""
from __future__ import annotations

import copy
import os

import pytest

from pyruntime.cli.args import Flag, UsageError, parse
from pyruntime.container import process, rootfs
from pyruntime.linux import syscalls
from pyruntime.linux.syscalls import FakeSyscalls
from pyruntime.oci import spec as specmod
from pyruntime.oci.default import default_spec
from pyruntime.oci.spec import SpecError
from pyruntime.oci.validate import validate


def config(**edits):
    c = copy.deepcopy(default_spec())
    c.update(edits)
    return c


def test_default_spec_parses_into_typed_objects():
    s = specmod.parse(default_spec(), "/bundle")
    assert s.root.path == "/bundle/rootfs" and s.root.readonly
    assert s.process is not None
    assert s.process.args == ("sh",) and s.process.no_new_privileges
    assert s.linux.namespace("pid") and s.linux.namespace("user") is None
    assert s.process.rlimits[0].type == "RLIMIT_NOFILE"


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c.__setitem__("ociVersion", "0.9"), "ociVersion: unsupported version"),
    (lambda c: c["process"].__setitem__("args", []), "process.args: must name the program"),
    (lambda c: c["process"].__setitem__("env", ["NOEQUALS"]), "process.env[0]: 'NOEQUALS' is not KEY=VALUE"),
    (lambda c: c["process"]["rlimits"].append({"type": "RLIMIT_NOFILE", "soft": 1, "hard": 1}),
     "duplicate rlimit RLIMIT_NOFILE"),
    (lambda c: c["process"]["rlimits"].append({"type": "RLIMIT_BOGUS", "soft": 1, "hard": 1}), "unknown rlimit"),
    (lambda c: c["process"].__setitem__("oomScoreAdj", 5000), "process.oomScoreAdj: 5000 is out of range"),
    (lambda c: c["process"]["user"].__setitem__("uid", True), "process.user.uid: must be an integer"),
    (lambda c: c["mounts"].append({"destination": ""}), "mounts[7].destination: must be a path inside the container"),
    (lambda c: c["linux"].__setitem__("uidMappings", [{"containerID": 0, "hostID": 1, "size": 1}]),
     "need a user namespace"),
    (lambda c: c["linux"]["namespaces"].remove({"type": "uts"}), "hostname: setting a hostname needs the container"),
    (lambda c: c["linux"]["namespaces"].remove({"type": "mount"}), "linux.namespaces: a mount namespace"),
    (lambda c: c["linux"].__setitem__("devices", [{"type": "x", "path": "/dev/x"}]), "linux.devices[0].type"),
    (lambda c: c["linux"].__setitem__("rootfsPropagation", "sideways"), "unknown propagation"),
    (lambda c: c["linux"].__setitem__("intelRdt", {"closID": "x"}), "linux.intelRdt: not supported"),
    (lambda c: c.__setitem__("hooks", {"prestart": [{"path": "hook"}]}), "hooks.prestart[0].path"),
    (lambda c: c.__setitem__("root", "rootfs"), "root: must be an object"),
])
def test_invalid_configs_name_the_field(mutate, message):
    c = config()
    mutate(c)
    with pytest.raises(SpecError) as err:
        validate(specmod.parse(c, "/bundle"), "v1", FakeSyscalls())
    assert message in str(err.value)


def test_a_relative_mount_destination_is_relative_to_the_containers_root():
    """Deprecated but allowed by the runtime spec (runc's idmap.bats uses one)."""
    c = config()
    c["mounts"].append({"destination": "tmp/mount-1", "type": "tmpfs", "source": "tmpfs"})
    assert specmod.parse(c, "/bundle").mounts[-1].destination == "/tmp/mount-1"


def test_mount_options_split_into_flags_propagation_and_data():
    opts = rootfs.parse_options(("nosuid", "ro", "rw", "rslave", "mode=755", "size=64k", "tmpcopyup"))
    assert opts.flags == syscalls.MS_NOSUID
    assert opts.propagation == (syscalls.MS_SLAVE | syscalls.MS_REC,)
    assert opts.data == "mode=755,size=64k"


def test_recursive_mount_options_become_mount_setattr_attributes():
    opts = rootfs.parse_options(("rbind", "rro", "rnoatime", "rsuid", "rnosuid", "rrw"))
    assert opts.data == "" and opts.flags == syscalls.MS_BIND | syscalls.MS_REC
    attr_set, attr_clr = opts.recursive
    assert attr_set == syscalls.MOUNT_ATTR_NOATIME | syscalls.MOUNT_ATTR_NOSUID
    assert attr_clr == syscalls.MOUNT_ATTR__ATIME | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_RDONLY


def test_runc_style_arguments():
    flags = [Flag(("bundle", "b"), True, default="."), Flag(("detach", "d")), Flag(("env", "e"), True, repeat=True)]
    p = parse(["-b", "/x", "--detach", "id", "--env=A=1", "-e", "B=2"], flags)
    assert p.options == {"bundle": "/x", "detach": True, "env": ["A=1", "B=2"]}
    assert p.positional == ["id"]
    p = parse(["id", "sh", "-c", "x"], flags, stop_at_positional=True)
    assert p.positional == ["id", "sh", "-c", "x"]
    with pytest.raises(UsageError, match="--nope"):
        parse(["--nope"], flags)
    with pytest.raises(UsageError, match="needs an argument"):
        parse(["--bundle"], flags)


def test_exec_cpu_affinity_is_read_as_cpu_sets_and_refused_by_name():
    proc = config()["process"]
    proc["execCPUAffinity"] = {"initial": "0-2,7", "final": " 1 "}
    parsed = specmod.parse(config(process=proc), "/bundle").process
    assert parsed is not None
    assert parsed.exec_cpu_affinity == specmod.ExecCPUAffinity(frozenset({0, 1, 2, 7}), frozenset({1}))
    for bad, message in (({"initial": "a"}, "process.execCPUAffinity.initial: must be a list like '0-3,7'"),
                         ({"final": ""}, "process.execCPUAffinity.final: names no CPU"),
                         ({"final": "3-1"}, "process.execCPUAffinity.final: has a range whose start is above")):
        proc["execCPUAffinity"] = bad
        with pytest.raises(SpecError, match=message.replace("(", r"\(")):
            specmod.parse(config(process=proc), "/bundle")


def test_the_final_affinity_replaces_the_reset_to_every_cpu():
    fake = FakeSyscalls()
    process.set_affinity(fake, frozenset({1}))
    process.set_affinity(fake, None)
    assert fake.named("sched_setaffinity")[0] == ("sched_setaffinity", 0, {1})
    assert fake.named("sched_setaffinity")[1][2] == set(range(os.cpu_count() or 1))


def test_close_fds_closes_everything_but_what_is_kept():
    fake = FakeSyscalls()
    process.close_fds(fake, {7, 9, 1})
    assert fake.named("close_range") == [("close_range", 3, 6), ("close_range", 8, 8),
                                        ("close_range", 10, 2**31 - 2)]


def test_oom_score_adj_is_never_lowered_below_our_own(monkeypatch, tmp_path):
    own = tmp_path / "oom"
    own.write_text("200\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(own if p == "/proc/self/oom_score_adj" else p,
                                                                       *a, **k))
    assert process.restrict_oom_score_adj(-999) == 200
    assert process.restrict_oom_score_adj(500) == 500


@pytest.mark.parametrize("key, namespaces, ok", [
    ("net.ipv4.ip_forward", ["network"], True), ("net.ipv4.ip_forward", [], False),
    ("kernel.shmmax", ["ipc"], True), ("fs.mqueue.queues_max", ["ipc"], True),
    ("kernel.panic", ["ipc", "network", "uts"], False), ("vm.swappiness", ["ipc"], False),
])
def test_only_namespaced_sysctls_are_allowed(key, namespaces, ok):
    c = config()
    c["linux"]["namespaces"] = [{"type": t} for t in set(namespaces) | {"uts", "mount"}]
    c["linux"]["sysctl"] = {key: "1"}
    s = specmod.parse(c, "/bundle")
    if ok:
        validate(s, "v1", FakeSyscalls())
    else:
        with pytest.raises(SpecError, match=key):
            validate(s, "v1", FakeSyscalls())


def _namespaces(*entries: tuple[str, str | None]) -> dict:
    c = default_spec(False)
    c["linux"]["namespaces"] = [{"type": kind, **({"path": path} if path else {})} for kind, path in entries]
    return c


@pytest.mark.parametrize("entries, expected", [
    # the usual container: born in its new namespaces; the cgroup one is unshared once in its v1 cgroups
    ([("pid", None), ("network", None), ("ipc", None), ("uts", None), ("mount", None), ("cgroup", None)],
     syscalls.CLONE_NEWPID | syscalls.CLONE_NEWNET | syscalls.CLONE_NEWIPC | syscalls.CLONE_NEWUTS
     | syscalls.CLONE_NEWNS),
    # a pod's container: joins the pod's network, ipc and uts namespaces after it is born
    ([("pid", None), ("network", "/run/netns/pod"), ("ipc", "/proc/1/ns/ipc"), ("mount", None)],
     syscalls.CLONE_NEWPID | syscalls.CLONE_NEWNS),
    # a stage 1 is needed: user namespaces are mapped from outside, and a joined pid or a new time
    # namespace applies to children only
    ([("user", None), ("pid", None), ("mount", None)], 0),
    ([("user", "/proc/1/ns/user"), ("mount", None)], 0),
    ([("pid", "/proc/1/ns/pid"), ("mount", None)], 0),
    ([("time", None), ("pid", None), ("mount", None)], 0),
    ([("cgroup", None)], 0),
])
def test_when_the_init_is_cloned_straight_into_its_namespaces(entries, expected):
    from pyruntime.container import init
    assert init.clone_flags(specmod.parse(_namespaces(*entries), "/bundle")) == expected
