"""cri/ocispec.py: CRI ContainerConfig + pod + image -> config.json, as containerd's CRI builds it."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from proto import api_pb2
from pyruntime.cri import ocispec
from pyruntime.cri.model import Layout, SandboxRecord
from pyruntime.cri.seccomp_default import default_profile
from pyruntime.errors import InvalidArgumentError
from pyruntime.linux.seccomp.profile import Seccomp
from pyruntime.linux.syscalls import FakeSyscalls
from pyruntime.oci import spec as specmod
from pyruntime.oci.validate import validate

PASSWD = """root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
alice:x:1000:1000:Alice:/home/alice:/bin/sh
bob:x:1001:1001::/home/bob:/bin/sh
"""
GROUP = """root:x:0:
wheel:x:10:alice,root
audio:x:29:bob,alice
alice:x:1000:alice
bob:x:1001:
staff:x:50:
"""
SC = "config.linux.security_context"


@pytest.fixture
def rootfs(tmp_path):
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(GROUP)
    return str(root)


@pytest.fixture
def layout(tmp_path):
    lay = Layout(str(tmp_path / "root"), str(tmp_path / "state"))
    d = lay.sandbox_dir("sb1")
    os.makedirs(d)
    for name in ("hostname", "hosts", "resolv.conf"):
        with open(os.path.join(d, name), "w") as f:
            f.write("x\n")
    return lay


def sandbox(**namespaces: str) -> SandboxRecord:
    return SandboxRecord(id="sb1", config="", created_at=1, namespaces=dict(namespaces), cgroup_parent="/kubepods/pod1")


def pod(privileged: bool = False) -> api_pb2.PodSandboxConfig:
    c = api_pb2.PodSandboxConfig(hostname="podhost")
    c.metadata.name, c.metadata.namespace, c.metadata.uid = "web", "default", "uid-1"
    c.linux.security_context.privileged = privileged
    return c


def container(**kw) -> api_pb2.ContainerConfig:
    c = api_pb2.ContainerConfig(**kw)
    c.metadata.name = "app"
    c.image.image = "busybox:latest"
    return c


IMAGE = {"config": {"Entrypoint": ["/entry"], "Cmd": ["serve", "--port=80"], "Env": ["PATH=/img/bin", "A=image"],
                    "WorkingDir": "/srv"}}


def build(cfg, rootfs, layout, image=IMAGE, sb=None, podc=None, driver="cgroupfs", **kw) -> dict:
    return ocispec.container_spec(cfg, sb or sandbox(), podc or pod(), image, rootfs, layout=layout,
                                  cgroup_driver=driver, container_id="c1", kernel=FakeSyscalls(), **kw)


def refused(*args, **kw) -> str:
    with pytest.raises(InvalidArgumentError) as err:
        build(*args, **kw)
    return str(err.value)


# ---- process -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command,args,want", [
    ([], [], ["/entry", "serve", "--port=80"]),
    (["/bin/sh"], [], ["/bin/sh"]),
    (["/bin/sh"], ["-c", "true"], ["/bin/sh", "-c", "true"]),
    ([], ["other"], ["/entry", "other"]),
])
def test_args_follow_kubernetes(rootfs, layout, command, args, want):
    assert build(container(command=command, args=args), rootfs, layout)["process"]["args"] == want


def test_no_command_at_all_is_refused(rootfs, layout):
    assert refused(container(), rootfs, layout, image={"config": {}}).startswith("config.command:")


def test_env_image_then_request_and_hostname_home(rootfs, layout):
    cfg = container(envs=[api_pb2.KeyValue(key="A", value=b"req"), api_pb2.KeyValue(key="B", value=b"b=c")])
    env = build(cfg, rootfs, layout)["process"]["env"]
    assert env == ["PATH=/img/bin", "HOSTNAME=podhost", "A=req", "B=b=c", "HOME=/root"]


def test_bad_env_key(rootfs, layout):
    cfg = container(envs=[api_pb2.KeyValue(key="A=B", value=b"x")])
    assert refused(cfg, rootfs, layout).startswith("config.envs[0].key:")
    cfg = container(envs=[api_pb2.KeyValue(key="A", value=b"\xff")])
    assert refused(cfg, rootfs, layout).startswith("config.envs[0].value: not UTF-8")


def test_cwd_request_then_image_then_root(rootfs, layout):
    assert build(container(working_dir="/w"), rootfs, layout)["process"]["cwd"] == "/w"
    assert build(container(), rootfs, layout)["process"]["cwd"] == "/srv"
    assert build(container(command=["x"]), rootfs, layout, image={"config": {}})["process"]["cwd"] == "/"
    assert refused(container(working_dir="rel"), rootfs, layout).startswith("config.working_dir:")


def test_terminal_and_no_new_privs(rootfs, layout):
    cfg = container(tty=True)
    cfg.linux.security_context.no_new_privs = True
    p = build(cfg, rootfs, layout)["process"]
    assert p["terminal"] is True and p["noNewPrivileges"] is True


def test_oom_score_adj_is_not_below_our_own(rootfs, layout):
    with open("/proc/self/oom_score_adj") as f:
        own = int(f.read())
    cfg = container()
    cfg.linux.resources.oom_score_adj = -1000
    assert build(cfg, rootfs, layout)["process"]["oomScoreAdj"] == max(-1000, own)
    cfg.linux.resources.oom_score_adj = 1000
    assert build(cfg, rootfs, layout)["process"]["oomScoreAdj"] == 1000
    cfg.linux.resources.oom_score_adj = 1001
    assert refused(cfg, rootfs, layout).startswith("config.linux.resources.oom_score_adj:")


# ---- user --------------------------------------------------------------------------------------------------

def user_of(rootfs, layout, image_user="", **sc):
    cfg = container()
    s = cfg.linux.security_context
    for k, v in sc.items():
        if k in ("run_as_user", "run_as_group"):
            getattr(s, k).value = v
        elif k == "supplemental_groups":
            s.supplemental_groups.extend(v)
        else:
            setattr(s, k, v)
    spec = build(cfg, rootfs, layout, image={"config": {**IMAGE["config"], "User": image_user}})
    home = next(e for e in spec["process"]["env"] if e.startswith("HOME="))
    return spec["process"]["user"], home


def test_default_user_is_root_with_its_groups(rootfs, layout):
    assert user_of(rootfs, layout) == ({"uid": 0, "gid": 0, "additionalGids": [0, 10]}, "HOME=/root")


def test_run_as_username(rootfs, layout):
    user, home = user_of(rootfs, layout, run_as_username="alice")
    assert user == {"uid": 1000, "gid": 1000, "additionalGids": [1000, 10, 29]} and home == "HOME=/home/alice"


def test_run_as_username_missing(rootfs, layout):
    with pytest.raises(InvalidArgumentError) as err:
        user_of(rootfs, layout, run_as_username="x")
    assert str(err.value) == f"{SC}.run_as_username: no user 'x' in the image's /etc/passwd"


def test_run_as_user_numeric_unknown_uid_gets_gid_0(rootfs, layout):
    assert user_of(rootfs, layout, run_as_user=4242) == ({"uid": 4242, "gid": 0, "additionalGids": [0]}, "HOME=/")


def test_run_as_user_and_group_with_supplemental(rootfs, layout):
    user, _ = user_of(rootfs, layout, run_as_user=1001, run_as_group=50, supplemental_groups=[7, 50])
    assert user == {"uid": 1001, "gid": 50, "additionalGids": [50, 29, 7]}


def test_strict_policy_ignores_etc_group(rootfs, layout):
    user, _ = user_of(rootfs, layout, run_as_user=1000, supplemental_groups=[7],
                      supplemental_groups_policy=api_pb2.Strict)
    assert user == {"uid": 1000, "gid": 1000, "additionalGids": [1000, 7]}


def test_group_without_user_is_refused(rootfs, layout):
    with pytest.raises(InvalidArgumentError) as err:
        user_of(rootfs, layout, run_as_group=5)
    assert str(err.value).startswith(f"{SC}.run_as_group:")


def test_image_user_name_and_group(rootfs, layout):
    user, home = user_of(rootfs, layout, image_user="bob:staff")
    assert user == {"uid": 1001, "gid": 50, "additionalGids": [50, 29]} and home == "HOME=/home/bob"
    with pytest.raises(InvalidArgumentError) as err:
        user_of(rootfs, layout, image_user="bob:nogroup")
    assert str(err.value) == "image config User: no group 'nogroup' in the image's /etc/group"


def test_request_user_overrides_image_user(rootfs, layout):
    assert user_of(rootfs, layout, image_user="bob", run_as_user=1000)[0]["uid"] == 1000


def test_passwd_symlink_cannot_leave_the_rootfs(tmp_path, layout):
    """An image's /etc/passwd pointing at an absolute path is resolved inside the image, never the host's."""
    root = tmp_path / "evil"
    (root / "etc").mkdir(parents=True)
    (root / "decoy").write_text("mallory:x:7:7::/m:/bin/sh\n")
    os.symlink("/decoy", root / "etc" / "passwd")
    assert user_of(str(root), layout, run_as_username="mallory")[0]["uid"] == 7
    os.remove(root / "etc" / "passwd")
    os.symlink("../../../../../../etc/passwd", root / "etc" / "passwd")
    with pytest.raises(InvalidArgumentError):
        user_of(str(root), layout, run_as_username="root")  # the host's root entry is out of reach


def test_no_passwd_file_numeric_user_still_works(tmp_path, layout):
    root = tmp_path / "bare"
    root.mkdir()
    assert user_of(str(root), layout, run_as_user=5)[0] == {"uid": 5, "gid": 0, "additionalGids": [0]}


# ---- capabilities, privileged, masked paths --------------------------------------------------------------

def caps_of(rootfs, layout, add=(), drop=(), ambient=()):
    cfg = container()
    c = cfg.linux.security_context.capabilities
    c.add_capabilities.extend(add)
    c.drop_capabilities.extend(drop)
    c.add_ambient_capabilities.extend(ambient)
    return build(cfg, rootfs, layout)["process"]["capabilities"]


def test_default_capabilities(rootfs, layout):
    caps = build(container(), rootfs, layout)["process"]["capabilities"]
    assert caps["bounding"] == list(ocispec.DEFAULT_CAPS) == caps["effective"] == caps["permitted"]
    assert "inheritable" not in caps and "ambient" not in caps


def test_add_drop_capabilities(rootfs, layout):
    caps = caps_of(rootfs, layout, add=["SYS_ADMIN", "CAP_NET_ADMIN"], drop=["chown", "KILL"])
    assert "CAP_SYS_ADMIN" in caps["bounding"] and "CAP_NET_ADMIN" in caps["permitted"]
    assert "CAP_CHOWN" not in caps["effective"] and "CAP_KILL" not in caps["bounding"]


def test_all_then_drop_and_drop_all_then_add(rootfs, layout):
    caps = caps_of(rootfs, layout, add=["ALL"], drop=["CHOWN"])
    assert "CAP_SYS_ADMIN" in caps["bounding"] and "CAP_CHOWN" not in caps["bounding"]
    assert caps_of(rootfs, layout, add=["NET_RAW"], drop=["all"])["bounding"] == ["CAP_NET_RAW"]


def test_ambient_capabilities(rootfs, layout):
    caps = caps_of(rootfs, layout, ambient=["NET_ADMIN"])
    assert caps["ambient"] == caps["inheritable"] == ["CAP_NET_ADMIN"] and "CAP_NET_ADMIN" in caps["bounding"]


def test_unknown_capability(rootfs, layout):
    with pytest.raises(InvalidArgumentError) as err:
        caps_of(rootfs, layout, drop=["CHOWN", "NOPE"])
    assert str(err.value) == f"{SC}.capabilities.drop_capabilities[1]: unknown capability 'NOPE'"


def test_masked_and_readonly_paths(rootfs, layout):
    linux = build(container(), rootfs, layout)["linux"]
    assert linux["maskedPaths"] == list(ocispec.MASKED_PATHS)
    assert linux["readonlyPaths"] == list(ocispec.READONLY_PATHS)
    cfg = container()
    cfg.linux.security_context.masked_paths.append("/proc/x")
    cfg.linux.security_context.readonly_paths.append("/proc/y")
    linux = build(cfg, rootfs, layout)["linux"]
    assert linux["maskedPaths"] == ["/proc/x"] and linux["readonlyPaths"] == ["/proc/y"]


def test_privileged_needs_a_privileged_pod(rootfs, layout):
    cfg = container()
    cfg.linux.security_context.privileged = True
    assert refused(cfg, rootfs, layout) == f"{SC}.privileged: the pod sandbox is not privileged"


def test_privileged(rootfs, layout):
    cfg = container()
    cfg.linux.security_context.privileged = True
    cfg.linux.security_context.seccomp.profile_type = api_pb2.SecurityProfile.RuntimeDefault
    spec = build(cfg, rootfs, layout, podc=pod(privileged=True))
    linux = spec["linux"]
    assert linux["maskedPaths"] == [] and linux["readonlyPaths"] == [] and "seccomp" not in linux
    assert linux["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert any(d["path"] == "/dev/null" for d in linux["devices"])
    assert not any(d["path"].startswith("/dev/pts/") for d in linux["devices"])
    assert "CAP_SYS_ADMIN" in spec["process"]["capabilities"]["bounding"]
    sysfs = next(m for m in spec["mounts"] if m["destination"] == "/sys")
    assert "rw" in sysfs["options"]


# ---- seccomp / apparmor ----------------------------------------------------------------------------------

def test_seccomp_unset_is_unconfined_and_runtime_default(rootfs, layout):
    assert "seccomp" not in build(container(), rootfs, layout)["linux"]
    cfg = container()
    cfg.linux.security_context.seccomp.profile_type = api_pb2.SecurityProfile.RuntimeDefault
    profile = build(cfg, rootfs, layout)["linux"]["seccomp"]
    Seccomp.from_spec(profile)
    names = {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and "args" not in r for n in r["names"]}
    assert "read" in names and "mount" not in names and "ptrace" in names
    clone3 = next(r for r in profile["syscalls"] if r["names"] == ["clone3"])
    assert clone3["errnoRet"] == errno.ENOSYS and profile["defaultAction"] == "SCMP_ACT_ERRNO"


def test_the_launchers_precompiled_filter_is_the_one_a_default_container_loads(rootfs, layout, monkeypatch):
    """A RuntimeDefault container with the default capabilities finds its filter compiled by the launcher's
    precompile (libseccomp is not run again); another capability set is compiled on its own."""
    from pyruntime.cri import seccomp_default
    from pyruntime.linux.seccomp import compiler
    monkeypatch.setattr(compiler, "_compiled", {})
    seccomp_default.precompile()
    assert len(compiler._compiled) == 1
    cfg = container()
    cfg.linux.security_context.seccomp.profile_type = api_pb2.SecurityProfile.RuntimeDefault
    profile = Seccomp.from_spec(json.loads(json.dumps(build(cfg, rootfs, layout)["linux"]["seccomp"])))
    assert profile in compiler._compiled
    monkeypatch.setattr(compiler, "libseccomp", lambda: pytest.fail("compiled again"))
    assert compiler.compile_filter(profile) is compiler._compiled[profile]
    cfg.linux.security_context.capabilities.add_capabilities.append("CAP_SYS_TIME")
    assert Seccomp.from_spec(build(cfg, rootfs, layout)["linux"]["seccomp"]) not in compiler._compiled


def test_seccomp_default_follows_capabilities():
    admin = default_profile(["CAP_SYS_ADMIN", "CAP_SYS_TIME"], machine="x86_64")
    names = {n for r in admin["syscalls"] for n in r["names"]}
    assert {"mount", "setns", "clock_settime", "arch_prctl"} <= names
    assert not any(r["names"] == ["clone3"] for r in admin["syscalls"])
    assert admin["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    s390 = default_profile([], machine="s390x")
    clone = next(r for r in s390["syscalls"] if r["names"] == ["clone"])
    assert clone["args"][0]["index"] == 1


def test_seccomp_localhost_and_legacy(rootfs, layout, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW",
                                "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO"}]}))
    cfg = container()
    cfg.linux.security_context.seccomp.profile_type = api_pb2.SecurityProfile.Localhost
    cfg.linux.security_context.seccomp.localhost_ref = str(path)
    assert build(cfg, rootfs, layout)["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ALLOW"
    cfg.linux.security_context.seccomp.localhost_ref = str(tmp_path / "none.json")
    assert refused(cfg, rootfs, layout).startswith(f"{SC}.seccomp: cannot read seccomp profile")
    path.write_text(json.dumps({"defaultAction": "BOGUS"}))
    cfg.linux.security_context.seccomp.localhost_ref = str(path)
    assert refused(cfg, rootfs, layout).startswith(f"{SC}.seccomp ({path}).defaultAction")
    legacy = container()
    legacy.linux.security_context.seccomp_profile_path = "runtime/default"
    assert "seccomp" in build(legacy, rootfs, layout)["linux"]
    legacy.linux.security_context.seccomp_profile_path = "unconfined"
    assert "seccomp" not in build(legacy, rootfs, layout)["linux"]
    unconfined = container()
    unconfined.linux.security_context.seccomp.profile_type = api_pb2.SecurityProfile.Unconfined
    assert "seccomp" not in build(unconfined, rootfs, layout)["linux"]


def test_apparmor(rootfs, layout):
    cfg = container()
    cfg.linux.security_context.apparmor.profile_type = api_pb2.SecurityProfile.RuntimeDefault
    build(cfg, rootfs, layout)
    cfg.linux.security_context.apparmor.profile_type = api_pb2.SecurityProfile.Localhost
    cfg.linux.security_context.apparmor.localhost_ref = "k8s-deny"
    assert "does not support AppArmor" in refused(cfg, rootfs, layout)


# ---- namespaces --------------------------------------------------------------------------------------------

def ns_of(spec):
    return {n["type"]: n.get("path") for n in spec["linux"]["namespaces"]}


def test_pod_namespaces_by_path_and_host_when_absent(rootfs, layout):
    sb = sandbox(net="/ns/net", ipc="/ns/ipc", uts="/ns/uts")
    ns = ns_of(build(container(), rootfs, layout, sb=sb))
    assert ns["network"] == "/ns/net" and ns["ipc"] == "/ns/ipc" and ns["uts"] == "/ns/uts"
    assert ns["mount"] is None and "pid" in ns and ns["pid"] is None  # POD without a pod pid ns: its own
    host = ns_of(build(container(), rootfs, layout, sb=sandbox()))
    assert "network" not in host and "ipc" not in host and "uts" not in host


def test_pid_modes(rootfs, layout):
    sb = sandbox(pid="/proc/99/ns/pid")
    cfg = container()
    assert ns_of(build(cfg, rootfs, layout, sb=sb))["pid"] == "/proc/99/ns/pid"
    cfg.linux.security_context.namespace_options.pid = api_pb2.CONTAINER
    assert ns_of(build(cfg, rootfs, layout, sb=sb))["pid"] is None
    cfg.linux.security_context.namespace_options.pid = api_pb2.NODE
    assert "pid" not in ns_of(build(cfg, rootfs, layout, sb=sb))
    cfg.linux.security_context.namespace_options.pid = api_pb2.TARGET
    assert refused(cfg, rootfs, layout).startswith(f"{SC}.namespace_options.target_id:")
    cfg.linux.security_context.namespace_options.target_id = "other"
    spec = build(cfg, rootfs, layout, target_pid_ns=lambda cid: f"/proc/{len(cid)}/ns/pid")
    assert ns_of(spec)["pid"] == "/proc/5/ns/pid"


def test_user_namespace(rootfs, layout):
    p = pod()
    u = p.linux.security_context.namespace_options.userns_options
    u.mode = api_pb2.POD
    assert "needs uids and gids" in refused(container(), rootfs, layout, podc=p)
    u.uids.append(api_pb2.IDMapping(host_id=100000, container_id=0, length=65536))
    u.gids.append(api_pb2.IDMapping(host_id=100000, container_id=0, length=65536))
    assert "no user namespace to join" in refused(container(), rootfs, layout, podc=p)
    spec = build(container(), rootfs, layout, podc=p, sb=sandbox(user="/ns/user"))
    assert ns_of(spec)["user"] == "/ns/user"
    assert spec["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 100000, "size": 65536}]


# ---- mounts and devices ------------------------------------------------------------------------------------

def mounts_of(spec):
    return {m["destination"]: m for m in spec["mounts"]}


def test_default_and_pod_mounts(rootfs, layout):
    m = mounts_of(build(container(), rootfs, layout, sb=sandbox(ipc="/ns/ipc")))
    for dest in ("/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup"):
        assert dest in m
    assert "ro" in m["/sys"]["options"]
    d = layout.sandbox_dir("sb1")
    assert m["/etc/resolv.conf"]["source"] == os.path.join(d, "resolv.conf")
    assert m["/etc/hosts"]["options"] == ["rbind", "rprivate", "rw"]
    assert m["/dev/shm"]["type"] == "tmpfs"  # the sandbox made no shm: a private one
    host_ipc = mounts_of(build(container(), rootfs, layout, sb=sandbox()))
    assert host_ipc["/dev/shm"]["source"] == "/dev/shm"


def test_pod_shm_and_readonly_rootfs(rootfs, layout):
    os.mkdir(os.path.join(layout.sandbox_dir("sb1"), "shm"))
    cfg = container()
    cfg.linux.security_context.readonly_rootfs = True
    spec = build(cfg, rootfs, layout, sb=sandbox(ipc="/ns/ipc"))
    m = mounts_of(spec)
    assert m["/dev/shm"]["type"] == "bind" and m["/dev/shm"]["source"].endswith("/sb1/shm")
    assert "ro" in m["/etc/hostname"]["options"] and spec["root"]["readonly"] is True


def test_idmapped_request_mounts(rootfs, layout, tmp_path):
    """The stock kubelet gives every mount of a pod with a user namespace the pod's mappings."""
    ids = [api_pb2.IDMapping(container_id=0, host_id=100000, length=65536)]
    cfg = container(mounts=[api_pb2.Mount(container_path="/v", host_path=str(tmp_path), uidMappings=ids,
                                          gidMappings=ids)])
    m = mounts_of(build(cfg, rootfs, layout))["/v"]
    assert m["uidMappings"] == m["gidMappings"] == [{"containerID": 0, "hostID": 100000, "size": 65536}]
    assert "uidMappings" not in mounts_of(build(cfg, rootfs, layout))["/etc/hosts"]
    del cfg.mounts[0].gidMappings[:]
    assert refused(cfg, rootfs, layout) == ("config.mounts[0].gidMappings: an idmapped mount needs both uidMappings "
                                            "and gidMappings")


def test_request_mounts(rootfs, layout, tmp_path):
    host = tmp_path / "data"
    host.mkdir()
    cfg = container(mounts=[
        api_pb2.Mount(container_path="/data/sub", host_path=str(host), readonly=True),
        api_pb2.Mount(container_path="/data", host_path=str(tmp_path / "made"), selinux_relabel=True),
        api_pb2.Mount(container_path="/etc/hosts", host_path=str(host)),
        api_pb2.Mount(container_path="/r", host_path=str(host), readonly=True, recursive_read_only=True,
                      mount_options=["noexec"]),
    ])
    spec = build(cfg, rootfs, layout)
    dests = [m["destination"] for m in spec["mounts"]]
    assert dests.index("/data") < dests.index("/data/sub")
    m = mounts_of(spec)
    assert (tmp_path / "made").is_dir()
    assert m["/data/sub"]["options"] == ["rbind", "rprivate", "ro"]
    assert m["/etc/hosts"]["source"] == str(host)
    assert m["/r"]["options"] == ["rbind", "rprivate", "ro", "rro", "noexec"]
    bad = container(mounts=[api_pb2.Mount(container_path="/r", host_path=str(host), recursive_read_only=True)])
    assert refused(bad, rootfs, layout) == "config.mounts[0].recursive_read_only: needs readonly"


def test_image_volume_and_relative_paths_refused(rootfs, layout):
    cfg = container(mounts=[api_pb2.Mount(container_path="/v", image=api_pb2.ImageSpec(image="busybox"))])
    # image volumes are supported now (see below), read-only only
    assert refused(cfg, rootfs, layout).startswith("config.mounts[0].readonly: an image volume must be read-only")
    cfg = container(mounts=[api_pb2.Mount(container_path="v", host_path="/tmp")])
    assert refused(cfg, rootfs, layout).startswith("config.mounts[0].container_path:")


def test_propagation_follows_the_source_mount(rootfs, layout, tmp_path):
    from pynode_os import mountinfo
    info = mountinfo.mount_of(os.path.realpath(str(tmp_path)), mountinfo.read())
    assert info is not None
    shared = any(t.startswith("shared:") for t in info.optional)
    cfg = container(mounts=[api_pb2.Mount(container_path="/p", host_path=str(tmp_path),
                                          propagation=api_pb2.PROPAGATION_BIDIRECTIONAL)])
    if shared:
        spec = build(cfg, rootfs, layout)
        assert mounts_of(spec)["/p"]["options"][1] == "rshared" and spec["linux"]["rootfsPropagation"] == "rshared"
    else:
        assert "not on a shared mount" in refused(cfg, rootfs, layout)


def test_devices(rootfs, layout):
    cfg = container(devices=[api_pb2.Device(container_path="/dev/mynull", host_path="/dev/null", permissions="rw")])
    spec = build(cfg, rootfs, layout)
    dev = spec["linux"]["devices"][0]
    assert (dev["path"], dev["type"], dev["major"], dev["minor"]) == ("/dev/mynull", "c", 1, 3)
    assert spec["linux"]["resources"]["devices"][-1] == {"allow": True, "type": "c", "major": 1, "minor": 3,
                                                         "access": "rw"}
    bad = container(devices=[api_pb2.Device(container_path="/dev/x", host_path="/etc/hostname")])
    assert refused(bad, rootfs, layout) == "config.devices[0].host_path: /etc/hostname is not a device"
    bad = container(devices=[api_pb2.Device(container_path="/dev/x", host_path="/dev/null", permissions="rwx")])
    assert refused(bad, rootfs, layout).startswith("config.devices[0].permissions:")


# ---- resources, cgroups, annotations, validity ---------------------------------------------------------------

def test_resources(rootfs, layout, monkeypatch):
    monkeypatch.setattr(ocispec, "_swap_available", lambda: True)
    cfg = container()
    r = cfg.linux.resources
    r.cpu_period, r.cpu_quota, r.cpu_shares, r.cpuset_cpus, r.cpuset_mems = 100000, 50000, 512, "0", "0"
    r.memory_limit_in_bytes = 64 << 20
    r.hugepage_limits.append(api_pb2.HugepageLimit(page_size="2MB", limit=0))
    res = build(cfg, rootfs, layout)["linux"]["resources"]
    assert res["cpu"] == {"period": 100000, "quota": 50000, "shares": 512, "cpus": "0", "mems": "0"}
    assert res["memory"] == {"limit": 64 << 20, "swap": 64 << 20}
    assert res["hugepageLimits"] == [{"pageSize": "2MB", "limit": 0}]
    r.memory_swap_limit_in_bytes = 1 << 20
    assert refused(cfg, rootfs, layout).startswith("config.linux.resources.memory_swap_limit_in_bytes:")
    monkeypatch.setattr(ocispec, "_swap_available", lambda: False)
    r.memory_swap_limit_in_bytes = 0
    assert "swap" not in build(cfg, rootfs, layout)["linux"]["resources"]["memory"]


def test_linux_resources_for_update(monkeypatch):
    monkeypatch.setattr(ocispec, "_swap_available", lambda: False)
    r = api_pb2.LinuxContainerResources(cpu_quota=20000, memory_limit_in_bytes=1 << 30)
    assert ocispec.linux_resources(r, "linux") == {"cpu": {"quota": 20000}, "memory": {"limit": 1 << 30}}
    with pytest.raises(InvalidArgumentError, match=r"^linux\.cpu_shares:"):
        ocispec.linux_resources(api_pb2.LinuxContainerResources(cpu_shares=-2), "linux")


def test_cgroups_path():
    assert ocispec.cgroups_path("/kubepods/pod1", "c1", "cgroupfs") == "/kubepods/pod1/c1"
    assert ocispec.cgroups_path("", "c1", "cgroupfs") == "/pyruntime/c1"
    assert ocispec.cgroups_path("/kubepods.slice/kubepods-pod1.slice", "c1", "systemd") == \
        "kubepods-pod1.slice:pyruntime-cri:c1"
    assert ocispec.cgroups_path("kubepods-besteffort-pod1_2.slice", "c1", "systemd") == \
        "kubepods-besteffort-pod1_2.slice:pyruntime-cri:c1"
    assert ocispec.cgroups_path("", "c1", "systemd") == "system.slice:pyruntime-cri:c1"
    with pytest.raises(InvalidArgumentError):
        ocispec.cgroups_path("", "c1", "bogus")


def test_a_built_in_pause_that_stays_is_a_scope_in_the_pods_slice_with_the_systemd_driver():
    from pyruntime.cri.pause import pause_cgroup
    parent = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice"
    assert pause_cgroup(parent, "s1", systemd=True) == "kubepods-besteffort-pod1_2.slice:pyruntime-cri:s1"
    assert pause_cgroup("/kubepods/besteffort/pod1", "s1") == "/kubepods/besteffort/pod1/pause"


def test_annotations(rootfs, layout):
    ann = build(container(), rootfs, layout)["annotations"]
    assert ann == {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.container-name": "app",
                   "io.kubernetes.cri.sandbox-id": "sb1", "io.kubernetes.cri.sandbox-name": "web",
                   "io.kubernetes.cri.sandbox-namespace": "default", "io.kubernetes.cri.sandbox-uid": "uid-1",
                   "io.kubernetes.cri.image-name": "busybox:latest"}


def test_pyruntime_accepts_the_spec(rootfs, layout, tmp_path):
    cfg = container(devices=[api_pb2.Device(container_path="/dev/mynull", host_path="/dev/null")])
    cfg.linux.security_context.seccomp.profile_type = api_pb2.SecurityProfile.RuntimeDefault
    cfg.linux.resources.memory_limit_in_bytes = 64 << 20
    sb = sandbox(net="/proc/self/ns/net", ipc="/proc/self/ns/ipc", uts="/proc/self/ns/uts")
    spec = specmod.parse(build(cfg, rootfs, layout, sb=sb), str(tmp_path))
    validate(spec, "v1", FakeSyscalls())
    assert spec.process is not None and spec.process.user.uid == 0 and spec.linux.seccomp is not None


def test_all_and_privileged_are_the_capabilities_the_daemon_holds(rootfs, layout, monkeypatch):
    # a host that withholds CAP_SYS_RESOURCE (bit 24): asking for it would put the runtime's warning on
    # the container's stderr, as critest's "adding ALL capabilities" spec saw
    monkeypatch.setattr(ocispec, "_bounding_mask", lambda: ((1 << 41) - 1) & ~(1 << 24))
    caps = caps_of(rootfs, layout, add=["ALL"])
    assert "CAP_SYS_RESOURCE" not in caps["bounding"] and "CAP_SYS_ADMIN" in caps["bounding"]
    cfg = container()
    cfg.linux.security_context.privileged = True
    privileged = build(cfg, rootfs, layout, podc=pod(privileged=True))
    assert "CAP_SYS_RESOURCE" not in privileged["process"]["capabilities"]["effective"]


def test_bounding_mask_is_our_own():
    status = Path("/proc/self/status").read_text()
    want = int(next(line for line in status.splitlines() if line.startswith("CapBnd:")).split()[1], 16)
    assert ocispec._bounding_mask() == want


# ---- image volumes ---------------------------------------------------------------------------------------

def image_volume(layout, index=0):
    root = ocispec.image_volume_dir(layout, "c1", index)
    os.makedirs(os.path.join(root, "etc"))
    os.symlink("/etc", os.path.join(root, "hostetc"))
    return root


def image_mount(**kw) -> api_pb2.Mount:
    return api_pb2.Mount(container_path="/mnt/iv", image=api_pb2.ImageSpec(image="busybox:latest"), **kw)


def test_image_volume_is_bound_read_only_from_its_mount(rootfs, layout):
    root = image_volume(layout)
    m = mounts_of(build(container(mounts=[image_mount(readonly=True)]), rootfs, layout))["/mnt/iv"]
    assert m["source"] == os.path.realpath(root) and "ro" in m["options"] and "noexec" not in m["options"]
    m = mounts_of(build(container(mounts=[image_mount(readonly=True, image_sub_path="etc")]), rootfs,
                        layout))["/mnt/iv"]
    assert m["source"] == os.path.realpath(os.path.join(root, "etc"))


def test_image_volume_refusals(rootfs, layout):
    image_volume(layout)
    assert refused(container(mounts=[image_mount()]), rootfs, layout) == \
        "config.mounts[0].readonly: an image volume must be read-only"
    missing = container(mounts=[image_mount(readonly=True, image_sub_path="nope")])
    assert "config.mounts[0].image_sub_path: 'nope' does not exist" in refused(missing, rootfs, layout)
    escape = container(mounts=[image_mount(readonly=True, image_sub_path="hostetc")])
    assert refused(escape, rootfs, layout) == "config.mounts[0].image_sub_path: 'hostetc' leaves the image"
