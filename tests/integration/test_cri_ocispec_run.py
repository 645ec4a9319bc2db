"""A config.json from cri/ocispec.py runs under pyruntime as the request said: the user and groups looked up
in the image, HOME, the pod's files, RuntimeDefault seccomp, capabilities, masked paths, a read-only rootfs."""
from __future__ import annotations

import os
import time

from proto import api_pb2
from pyruntime.cri.model import Layout, SandboxRecord
from pyruntime.cri.ocispec import container_spec
from pyruntime.linux.syscalls import LinuxSyscalls
from pyruntime.oci.spec import parse
from pyruntime.runtime import Runtime
from pyruntime.settings import Settings
from tests.kit.busybox import build_rootfs

SCRIPT = """
id > /out/id
echo "$HOME $HOSTNAME $FOO" > /out/env
cat /etc/resolv.conf > /out/resolv
grep -E '^(Seccomp|CapBnd|NoNewPrivs):' /proc/self/status > /out/status
cat /proc/timer_list > /out/masked 2>&1; echo $? >> /out/masked
touch /rootfs-write 2>/out/rofs; echo $? >> /out/rofs
unshare -n true 2>/out/unshare; echo $? >> /out/unshare
"""


def test_spec_runs_as_asked(tmp_path):
    rootfs = build_rootfs(tmp_path / "rootfs")
    with open(rootfs / "etc/passwd", "a") as f:
        f.write("app:x:1000:1000::/home/app:/bin/sh\n")
    with open(rootfs / "etc/group", "a") as f:
        f.write("app:x:1000:\nstaff:x:50:app\n")
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    layout = Layout(str(tmp_path / "root"), str(tmp_path / "state"))
    sandbox_dir = layout.sandbox_dir("sb1")
    os.makedirs(sandbox_dir)
    for name, text in (("resolv.conf", "nameserver 192.0.2.53\n"), ("hosts", "127.0.0.1 localhost\n"),
                       ("hostname", "pod\n")):
        with open(os.path.join(sandbox_dir, name), "w") as f:
            f.write(text)
    config = api_pb2.ContainerConfig(command=["sh", "-c", SCRIPT], envs=[api_pb2.KeyValue(key="FOO", value=b"bar")],
                                     mounts=[api_pb2.Mount(container_path="/out", host_path=str(out))])
    config.metadata.name = "app"
    sc = config.linux.security_context
    sc.run_as_username = "app"
    sc.supplemental_groups.append(4242)
    sc.readonly_rootfs = True
    sc.seccomp.profile_type = api_pb2.SecurityProfile.RuntimeDefault
    sc.capabilities.drop_capabilities.append("NET_RAW")
    pod = api_pb2.PodSandboxConfig(hostname="pod")
    sandbox = SandboxRecord(id="sb1", config="", created_at=1)
    spec = container_spec(config, sandbox, pod, {"config": {"Env": ["FOO=image"]}}, str(rootfs), layout=layout,
                          cgroup_driver="cgroupfs", container_id="cri-spec-run", kernel=LinuxSyscalls())
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    rt = Runtime(Settings.from_env({}, root=str(tmp_path / "rtstate")), kernel=LinuxSyscalls())
    try:
        rt.create("cri-spec-run", str(bundle), spec=parse(spec, str(bundle)))
        rt.start("cri-spec-run")
        deadline = time.monotonic() + 20
        while rt.state("cri-spec-run").status != "stopped":
            assert time.monotonic() < deadline, "the container did not finish"
            time.sleep(0.05)
    finally:
        rt.delete("cri-spec-run", force=True)
    assert (out / "id").read_text().strip() == "uid=1000(app) gid=1000(app) groups=50(staff),1000(app),4242"
    assert (out / "env").read_text() == "/home/app pod bar\n"
    assert (out / "resolv").read_text() == "nameserver 192.0.2.53\n"
    status = dict(line.split(":\t") for line in (out / "status").read_text().splitlines())
    assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "0"
    assert int(status["CapBnd"], 16) & (1 << 13) == 0 and int(status["CapBnd"], 16) & (1 << 0)  # NET_RAW, CHOWN
    assert (out / "masked").read_text() == "0\n"  # root-only, masked by /dev/null: empty and readable
    assert (out / "rofs").read_text().splitlines()[-1] != "0"
    assert (out / "unshare").read_text().splitlines()[-1] != "0"  # unshare is outside the default profile
