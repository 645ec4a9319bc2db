"""The daemon's sandbox and container logic over small fakes of the launcher, the runtime, the image store and
the network: records before steps, rollback of a failed run/create, idempotent stop/remove, recovery, the
supervisor watcher, events, ExecSync's timeout, and the gRPC error table."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import grpc
import pytest

from proto import api_pb2
from pynode_os.proc import process_start_time
from pyruntime.cri.containers import SUPERVISOR_DIED, Containers, ExecTimeoutError
from pyruntime.cri.events import EventHub, SupervisorWatcher
from pyruntime.cri.jobs import ContainerJob, ExecJob, PauseJob
from pyruntime.cri.model import ContainerRecord, ExitRecord, Layout, SandboxRecord
from pyruntime.cri.sandbox import Sandboxes
from pyruntime.cri.service import instrument
from pyruntime.cri.store import RecordStore
from pyruntime.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from pyruntime.linux.syscalls import LinuxSyscalls

# ---- fakes ------------------------------------------------------------------------------------------------


class FakeExecHandle:
    def __init__(self, code):
        self.pid, self.pty, self.code, self.killed = 1, None, code, False

    def wait(self, timeout):
        return self.code

    def kill(self):
        self.killed = True

    def close(self):
        pass


class FakeLauncher:
    def __init__(self):
        self.pauses, self.jobs, self.supervisors = [], [], []
        self.fail_create = None
        self.exec_output = (b"out\n", b"err\n", 3)

    def run_pause(self, job):
        self.pauses.append(job)
        pid = os.getpid()
        ns = {"net": os.path.join(job.ns_dir, "net")} if job.new_net else {}
        return SimpleNamespace(pid=pid, start_time=process_start_time(pid), namespaces=ns)

    def create_container(self, job):
        if self.fail_create:
            raise self.fail_create
        self.jobs.append(job)
        sup = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.supervisors.append(sup)
        time.sleep(0.05)
        return SimpleNamespace(pid=sup.pid, start_time=process_start_time(sup.pid), init_pid=sup.pid)

    def exec(self, job, stdin, stdout, stderr):
        out, err, code = self.exec_output
        os.write(stdout, out)
        os.write(stderr, err)
        return FakeExecHandle(code)

    def stop(self):
        for sup in self.supervisors:
            sup.kill()
            sup.wait()


class FakeRuntime:
    """Plays the runtime and the supervisor: a kill writes the exit record as the supervisor would."""

    def __init__(self, layout):
        self.layout, self.calls = layout, []

    def start(self, cid):
        self.calls.append(("start", cid))

    def kill(self, cid, sig, all_processes=False):
        self.calls.append(("kill", cid, sig))
        if os.path.isdir(self.layout.container_dir(cid)):
            ExitRecord(exit_code=137 if sig == 9 else 143, finished_at=time.time_ns(),
                       reason="Error").dump(self.layout.exit_record(cid))

    def delete(self, cid, force=False):
        self.calls.append(("delete", cid))

    def update(self, cid, resources):
        self.calls.append(("update", cid, resources))


class FakeImages:
    def __init__(self):
        self.image = SimpleNamespace(id="sha256:" + "a" * 64, config_digest="sha256:" + "b" * 64,
                                     repo_digests=["busybox@sha256:" + "c" * 64],
                                     config=SimpleNamespace(stop_signal="SIGQUIT"))
        self.content = SimpleNamespace(read=lambda digest: json.dumps({"config": {"Cmd": ["sh"]}}).encode())
        self.prepared, self.released = [], []

    def get(self, ref):
        if ref not in ("busybox", self.image.id):
            raise NotFoundError(f"image {ref!r} not found")
        return self.image

    def prepare_mounts(self, image_id, cid, driver=None):
        self.prepared.append(cid)
        return SimpleNamespace(mounts=[], driver="copy")

    def release_rootfs(self, cid):
        self.released.append(cid)


class FakeNetwork:
    def __init__(self):
        self.setups, self.teardowns = [], []
        self.fail_setup = self.fail_teardown = None

    def status(self):
        return True, "", ""

    def setup(self, sandbox_id, netns, **kw):
        self.setups.append(sandbox_id)
        if self.fail_setup:
            raise self.fail_setup
        return ["10.88.0.5", "fd00::5"]

    def teardown(self, sandbox_id, netns, **kw):
        self.teardowns.append((sandbox_id, netns))
        if self.fail_teardown:
            raise self.fail_teardown


class Env:
    def __init__(self, tmp_path):
        self.layout = Layout(str(tmp_path / "root"), str(tmp_path / "state"))
        self.launcher, self.network, self.images = FakeLauncher(), FakeNetwork(), FakeImages()
        self.runtime = FakeRuntime(self.layout)
        self.released_pauses = []
        self.specs = []
        self.reopened = []
        self.build()

    def build(self):
        self.store = RecordStore(self.layout)
        self.events = EventHub()
        self.containers = Containers(
            self.store, self.layout, launcher=self.launcher, runtime=self.runtime, images=self.images,
            events=self.events, container_spec=self.spec, linux_resources=lambda r: {"cpu": {"shares": r.cpu_shares}},
            reopen_log=self.reopened.append, job_types=(ContainerJob, ExecJob),
            kernel=LinuxSyscalls())  # the bundle's mode in the test's tmp dir; nothing here mounts
        self.sandboxes = Sandboxes(self.store, self.layout, self.containers, launcher=self.launcher,
                                   pause_job=PauseJob, release_pause=lambda r, d: self.released_pauses.append(r.id),
                                   network=self.network)
        self.watcher = SupervisorWatcher(self.containers.supervisor_exited)
        self.containers.watch = self.watcher.watch
        self.watcher.start()

    def spec(self, config, sandbox, sandbox_config, image, rootfs, **kw):
        self.specs.append((config.metadata.name, image, rootfs, kw["container_id"]))
        return {"ociVersion": "1.0.2", "root": {"path": rootfs},
                "process": {"user": {"uid": 1000, "gid": 100, "additionalGids": [100, 5]}}}

    def close(self):
        self.watcher.stop()
        self.launcher.stop()


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def pod_config(name="web", **kw):
    config = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=name, namespace="default", uid="uid-" + name),
        hostname=name, log_directory="/tmp/unused-logs", labels={"app": name}, **kw)
    return config


def run_pod(env, name="web", **kw):
    return env.sandboxes.run(api_pb2.RunPodSandboxRequest(config=pod_config(name, **kw)))


def container_config(name="c", image="busybox"):
    return api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name=name),
                                   image=api_pb2.ImageSpec(image=image), labels={"role": name})


def create(env, sandbox_id, name="c", image="busybox"):
    return env.containers.create(api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox_id, config=container_config(name, image), sandbox_config=pod_config()))


# ---- sandboxes --------------------------------------------------------------------------------------------


def test_run_pod_writes_record_files_and_network(env):
    options = api_pb2.NamespaceOption(pid=api_pb2.CONTAINER)
    sid = run_pod(env, dns_config=api_pb2.DNSConfig(servers=["10.0.0.10"], searches=["svc.local"],
                                                    options=["ndots:5"]),
                  linux=api_pb2.LinuxPodSandboxConfig(
                      security_context=api_pb2.LinuxSandboxSecurityContext(namespace_options=options)))
    job = env.launcher.pauses[0]
    assert job.new_net and job.new_uts and job.new_ipc and not job.share_pid and job.hostname == "web"
    record = SandboxRecord.load(os.path.join(env.layout.sandbox_dir(sid), "sandbox.json"))
    assert record.ips == ["10.88.0.5", "fd00::5"] and record.pause_pid == os.getpid() and record.ready
    with open(os.path.join(env.layout.sandbox_dir(sid), "resolv.conf")) as f:
        assert f.read() == "nameserver 10.0.0.10\nsearch svc.local\noptions ndots:5\n"
    status = env.sandboxes.status(sid[:12], verbose=True)
    assert status.status.state == api_pb2.SANDBOX_READY and status.status.network.ip == "10.88.0.5"
    assert [ip.ip for ip in status.status.network.additional_ips] == ["fd00::5"]
    assert json.loads(status.info["info"])["pid"] == os.getpid()


def test_host_network_pod_gets_no_cni_and_no_new_net(env):
    options = api_pb2.NamespaceOption(network=api_pb2.NODE, pid=api_pb2.POD)
    sid = run_pod(env, linux=api_pb2.LinuxPodSandboxConfig(
        security_context=api_pb2.LinuxSandboxSecurityContext(namespace_options=options)))
    job = env.launcher.pauses[0]
    assert not job.new_net and not job.new_uts and job.share_pid
    assert env.network.setups == []
    env.sandboxes.stop(sid)
    assert env.network.teardowns == []


def test_same_pod_name_twice_is_already_exists(env):
    run_pod(env)
    with pytest.raises(AlreadyExistsError):
        run_pod(env)


def test_failed_pause_rolls_back_without_cni(env):
    env.launcher.run_pause = lambda job: (_ for _ in ()).throw(InvalidArgumentError("sysctls: bad"))
    with pytest.raises(InvalidArgumentError):
        run_pod(env)
    assert env.network.teardowns == [] and len(env.released_pauses) == 1 and env.store.sandboxes() == []


def test_failed_network_rolls_back_everything(env):
    env.network.fail_setup = InvalidArgumentError("cni: plugin pybridge: no address")
    with pytest.raises(InvalidArgumentError):
        run_pod(env)
    assert env.store.sandboxes() == []
    assert not os.listdir(os.path.join(env.layout.root, "sandboxes"))
    assert len(env.released_pauses) == 1 and len(env.network.teardowns) == 1
    env.network.fail_setup = None
    run_pod(env)  # the name is free again


def test_stop_succeeds_when_teardown_fails_and_is_idempotent(env):
    sid = run_pod(env)
    cid = create(env, sid)
    env.network.fail_teardown = InternalError("cni DEL: netns gone")
    env.sandboxes.stop(sid)
    env.sandboxes.stop(sid)
    assert env.containers.status(cid).status.state == api_pb2.CONTAINER_EXITED
    assert len(env.network.teardowns) == 1  # torn down once, recorded
    status = env.sandboxes.status(sid).status
    assert status.state == api_pb2.SANDBOX_NOTREADY and status.network.ip == ""
    with pytest.raises(FailedPreconditionError):
        create(env, sid, name="late")
    env.sandboxes.remove(sid)
    env.sandboxes.remove(sid)
    env.sandboxes.stop(sid)
    assert env.store.sandboxes() == [] and env.store.containers() == []


def test_list_pods_filters(env):
    a, b = run_pod(env, "a"), run_pod(env, "b")
    env.sandboxes.stop(b)
    ids = lambda f: sorted(p.id for p in env.sandboxes.list(f))  # noqa: E731
    assert ids(None) == sorted([a, b])
    assert ids(api_pb2.PodSandboxFilter(label_selector={"app": "a"})) == [a]
    f = api_pb2.PodSandboxFilter()
    f.state.state = api_pb2.SANDBOX_NOTREADY
    assert ids(f) == [b]
    assert ids(api_pb2.PodSandboxFilter(id=a[:8])) == [a]


def test_bad_metadata_and_handler(env):
    with pytest.raises(InvalidArgumentError, match=r"config\.metadata\.uid"):
        env.sandboxes.run(api_pb2.RunPodSandboxRequest(config=api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name="x", namespace="y"))))
    with pytest.raises(NotFoundError, match="runtime_handler"):
        env.sandboxes.run(api_pb2.RunPodSandboxRequest(config=pod_config(), runtime_handler="kata"))
    userns = pod_config()
    userns.linux.security_context.namespace_options.userns_options.mode = api_pb2.NamespaceMode.POD
    with pytest.raises(InvalidArgumentError, match=r"userns_options\.uids: 0 mappings"):
        env.sandboxes.run(api_pb2.RunPodSandboxRequest(config=userns))
    assert env.sandboxes.list(api_pb2.PodSandboxFilter()) == []  # nothing made


# ---- containers -------------------------------------------------------------------------------------------


def test_container_life_cycle_and_events(env):
    sid = run_pod(env)
    seen: list[int] = []
    stop = threading.Event()
    listener = threading.Thread(target=lambda: seen.extend(e.container_event_type for e in
                                                          env.events.subscribe(lambda: not stop.is_set(), 0.05)))
    listener.start()
    time.sleep(0.1)
    cid = create(env, sid)
    job = env.launcher.jobs[0]
    assert job.bundle == env.layout.bundle(cid) and job.exit_path == env.layout.exit_record(cid)
    with open(os.path.join(env.layout.bundle(cid), "config.json")) as f:
        assert json.load(f)["root"]["path"] == os.path.join(env.layout.bundle(cid), "rootfs")
    assert env.specs[0][1] == {"config": {"Cmd": ["sh"]}}
    assert env.containers.status(cid).status.state == api_pb2.CONTAINER_CREATED
    env.containers.start(cid)
    with pytest.raises(FailedPreconditionError):
        env.containers.start(cid)
    status = env.containers.status(cid, verbose=True)
    assert status.status.state == api_pb2.CONTAINER_RUNNING and status.status.image.image == "busybox"
    assert status.status.image_ref.startswith("busybox@sha256:") and status.status.image_id == env.images.image.id
    user = status.status.user.linux
    assert (user.uid, user.gid, list(user.supplemental_groups)) == (1000, 100, [100, 5])
    env.containers.stop(cid, 5)
    assert ("kill", cid, signal.SIGQUIT) in env.runtime.calls  # the image's StopSignal
    status = env.containers.status(cid).status
    assert status.state == api_pb2.CONTAINER_EXITED and status.exit_code == 143
    env.containers.stop(cid, 5)  # stopping an exited container is fine
    env.containers.remove(cid)
    env.containers.remove(cid)
    env.containers.stop(cid, 5)  # and stopping one that is gone (critest's Idempotence StopContainer)
    assert env.images.released == [cid] and not os.path.exists(env.layout.container_dir(cid))
    with pytest.raises(NotFoundError):
        env.containers.status(cid)
    time.sleep(0.2)
    stop.set()
    listener.join()
    assert seen[:3] == [api_pb2.CONTAINER_CREATED_EVENT, api_pb2.CONTAINER_STARTED_EVENT,
                        api_pb2.CONTAINER_STOPPED_EVENT]
    assert seen[-1] == api_pb2.CONTAINER_DELETED_EVENT


def test_failed_create_leaves_nothing_and_frees_the_name(env):
    sid = run_pod(env)
    env.launcher.fail_create = InvalidArgumentError("process.args: must not be empty")
    with pytest.raises(InvalidArgumentError, match=r"process\.args"):
        create(env, sid)
    assert env.store.containers() == [] and not os.listdir(os.path.join(env.layout.root, "containers"))
    assert len(env.images.released) == 1
    env.launcher.fail_create = None
    create(env, sid)
    with pytest.raises(AlreadyExistsError):
        create(env, sid)
    with pytest.raises(NotFoundError):
        create(env, sid, name="other", image="missing")


def settled_as_supervisor_died(env, cid, timeout: float = 5.0):
    """The container's status once the daemon has recorded its supervisor's death (the last one seen after
    `timeout`): the fake runtime's kill writes an exit record first, as a live supervisor would, and the
    daemon's own follows it."""
    deadline = time.monotonic() + timeout
    status = env.containers.status(cid).status
    while status.message != SUPERVISOR_DIED and time.monotonic() < deadline:
        time.sleep(0.01)
        status = env.containers.status(cid).status
    return status


def test_supervisor_killed_reports_exit_255(env):
    sid = run_pod(env)
    cid = create(env, sid)
    env.containers.start(cid)
    env.launcher.supervisors[0].kill()
    env.launcher.supervisors[0].wait()
    status = settled_as_supervisor_died(env, cid)
    assert (status.state, status.exit_code, status.message) == (api_pb2.CONTAINER_EXITED, 255, SUPERVISOR_DIED)
    assert ("kill", cid, 9) in env.runtime.calls


def test_recover_after_restart(env):
    sid = run_pod(env)
    running = create(env, sid, "running")
    env.containers.start(running)
    lost = create(env, sid, "lost")
    gone_pod = run_pod(env, "gone")
    env.watcher.stop()
    # the daemon "restarts": a supervisor died meanwhile, a pod's pause is gone
    env.launcher.supervisors[1].kill()
    env.launcher.supervisors[1].wait()
    record = SandboxRecord.load(os.path.join(env.layout.sandbox_dir(gone_pod), "sandbox.json"))
    record.pause_start_time += 1  # its pid names another process now
    record.dump(os.path.join(env.layout.sandbox_dir(gone_pod), "sandbox.json"))
    env.build()
    env.store.recover()
    env.sandboxes.recover()
    env.containers.recover()
    assert env.containers.wait_exit(lost, 5)
    assert env.containers.status(running).status.state == api_pb2.CONTAINER_RUNNING
    assert env.containers.status(lost).status.message == SUPERVISOR_DIED
    assert env.sandboxes.status(sid).status.state == api_pb2.SANDBOX_READY
    assert env.sandboxes.status(gone_pod).status.state == api_pb2.SANDBOX_NOTREADY
    with pytest.raises(AlreadyExistsError):  # names are reserved again
        run_pod(env)
    assert sorted(c.id for c in env.containers.list(None)) == sorted([running, lost])


def test_a_supervisor_pid_that_names_another_process_is_neither_watched_nor_signalled(env):
    """After a restart, a record's supervisor pid whose start time is not the recorded one names another
    process (the pid was reused): the container is settled as its supervisor died (killed through the
    runtime, its exit recorded), and the process holding the pid is left alone, not taken for the supervisor."""
    sid = run_pod(env)
    cid = create(env, sid)
    env.containers.start(cid)
    stranger = env.launcher.supervisors[0]  # alive: it plays the process that took the supervisor's pid
    env.watcher.stop()
    path = os.path.join(env.layout.container_dir(cid), "container.json")
    record = ContainerRecord.load(path)
    record.supervisor_start_time += 1
    record.dump(path)
    env.build()
    env.store.recover()
    env.sandboxes.recover()
    env.containers.recover()
    status = settled_as_supervisor_died(env, cid)
    assert (status.state, status.exit_code, status.message) == (api_pb2.CONTAINER_EXITED, 255, SUPERVISOR_DIED)
    assert ("kill", cid, 9) in env.runtime.calls
    assert stranger.poll() is None, "the process that took the supervisor's pid was signalled"


def test_a_pod_without_a_pause_is_held_by_its_pins_and_one_cut_short_is_not(env):
    """A pod that shares no pid namespace has no pause process (pid 0): its pinned namespaces keep it ready
    across a restart. A run cut short before its namespaces were made is not ready after one."""
    env.launcher.run_pause = lambda job: SimpleNamespace(pid=0, start_time=0,
                                                         namespaces={"net": os.path.join(job.ns_dir, "net")})
    held = run_pod(env)
    cut = run_pod(env, "cut")
    path = os.path.join(env.layout.sandbox_dir(cut), "sandbox.json")
    record = SandboxRecord.load(path)
    record.pinned, record.ips = False, []
    record.dump(path)
    env.watcher.stop()
    env.build()
    env.store.recover()
    env.sandboxes.recover()
    assert env.sandboxes.status(held).status.state == api_pb2.SANDBOX_READY
    assert env.sandboxes.status(cut).status.state == api_pb2.SANDBOX_NOTREADY


def test_recover_skips_a_corrupt_record(env):
    sid = run_pod(env)
    good = create(env, sid, "good")
    bad = create(env, sid, "bad")
    path = os.path.join(env.layout.container_dir(bad), "container.json")
    record = ContainerRecord.load(path)
    record.config = "!!not base64!!"
    record.dump(path)
    env.watcher.stop()
    env.build()
    env.store.recover()
    assert [c.id for c in env.containers.list(None)] == [good]


def test_list_containers_filters(env):
    a, b = run_pod(env, "a"), run_pod(env, "b")
    ca, cb = create(env, a, "x"), create(env, b, "y")
    env.containers.start(cb)
    ids = lambda f: [c.id for c in env.containers.list(f)]  # noqa: E731
    assert ids(api_pb2.ContainerFilter(pod_sandbox_id=a)) == [ca]
    assert ids(api_pb2.ContainerFilter(label_selector={"role": "y"})) == [cb]
    f = api_pb2.ContainerFilter()
    f.state.state = api_pb2.CONTAINER_RUNNING
    assert ids(f) == [cb]


def test_update_exec_sync_and_reopen(env):
    sid = run_pod(env)
    cid = create(env, sid)
    with pytest.raises(FailedPreconditionError):
        env.containers.exec_sync(cid, ["true"], 0)
    env.containers.start(cid)
    response = env.containers.exec_sync(cid, ["sh", "-c", "x"], 2)
    assert (response.stdout, response.stderr, response.exit_code) == (b"out\n", b"err\n", 3)
    env.launcher.exec_output = (b"", b"", None)
    with pytest.raises(ExecTimeoutError):
        env.containers.exec_sync(cid, ["sleep", "9"], 1)
    env.containers.update_resources(cid, api_pb2.LinuxContainerResources(cpu_shares=512))
    assert env.runtime.calls[-1] == ("update", cid, {"cpu": {"shares": 512}})
    assert env.containers.status(cid).status.resources.linux.cpu_shares == 512
    env.containers.reopen_container_log(cid)
    assert env.reopened == [os.path.join(env.layout.supervisor_dir(cid), "supervisor.sock")]


def test_record_is_written_before_the_supervisor(env):
    sid = run_pod(env)
    seen = {}

    def create_container(job):
        seen["record"] = ContainerRecord.load(os.path.join(env.layout.container_dir(job.container_id),
                                                           "container.json"))
        return FakeLauncher.create_container(env.launcher, job)
    env.launcher.create_container = create_container
    cid = create(env, sid)
    assert seen["record"].id == cid and seen["record"].supervisor_pid == 0


# ---- the gRPC error table ---------------------------------------------------------------------------------


class Aborted(Exception):
    pass


class FakeContext:
    def abort(self, code, message):
        self.code, self.message = code, message
        raise Aborted()


@pytest.mark.parametrize(("error", "code"), [
    (NotFoundError("x"), grpc.StatusCode.NOT_FOUND), (AlreadyExistsError("x"), grpc.StatusCode.ALREADY_EXISTS),
    (InvalidArgumentError("x"), grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPreconditionError("x"), grpc.StatusCode.FAILED_PRECONDITION),
    (UnavailableError("x"), grpc.StatusCode.UNAVAILABLE), (InternalError("x"), grpc.StatusCode.INTERNAL),
    (ExecTimeoutError("x"), grpc.StatusCode.DEADLINE_EXCEEDED), (KeyError("x"), grpc.StatusCode.INTERNAL),
    (NotImplementedError("x"), grpc.StatusCode.UNIMPLEMENTED),
])
def test_every_error_maps_and_never_escapes(error, code):
    @instrument.instrumented("RuntimeService")
    class Servicer:
        def Version(self, request, context):
            raise error

        def GetContainerEvents(self, request, context):
            yield 1
            raise error

    context = FakeContext()
    with pytest.raises(Aborted):
        Servicer().Version(None, context)
    assert context.code == code
    if code == grpc.StatusCode.INTERNAL and not isinstance(error, InternalError):
        assert "Version: internal error: KeyError" in context.message
    with pytest.raises(Aborted):
        list(Servicer().GetContainerEvents(None, context))
    assert context.code == code


def test_runtime_servicer_covers_every_rpc():
    from pyruntime.cri.service.runtime import RuntimeServicer
    rpcs = set(api_pb2.DESCRIPTOR.services_by_name["RuntimeService"].methods_by_name)
    streams = {name for name in rpcs if name.startswith("Stream")}
    not_ours = {"CheckpointPod", "RestorePod", "UpdatePodSandboxResources"}
    assert rpcs - streams - not_ours <= set(vars(RuntimeServicer))


# ---- over a real gRPC server ------------------------------------------------------------------------------


def test_runtime_service_over_grpc(env, tmp_path):
    from concurrent import futures

    from proto import api_pb2_grpc
    from pyruntime.cri.service.runtime import RuntimeServicer

    servicer = RuntimeServicer(env.store, env.sandboxes, env.containers, env.events, network=env.network,
                               streaming=None, stats=None, runtime=env.runtime, layout=env.layout,
                               cgroup_driver="cgroupfs", version="0.1.0", info={"root": env.layout.root})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{tmp_path}/cri.sock")
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path}/cri.sock")
    try:
        stub = api_pb2_grpc.RuntimeServiceStub(channel)
        version = stub.Version(api_pb2.VersionRequest())
        assert (version.runtime_name, version.runtime_api_version) == ("pyruntime", "v1")
        status = stub.Status(api_pb2.StatusRequest(verbose=True))
        assert [(c.type, c.status) for c in status.status.conditions] == [("RuntimeReady", True),
                                                                          ("NetworkReady", True)]
        assert json.loads(status.info["config"])["root"] == env.layout.root
        # what critest reads to run (not skip) its recursive read-only and supplemental groups specs
        assert status.runtime_handlers[0].features.recursive_read_only_mounts
        assert status.features.supplemental_groups_policy
        assert stub.RuntimeConfig(api_pb2.RuntimeConfigRequest()).linux.cgroup_driver == api_pb2.CGROUPFS
        events = stub.GetContainerEvents(api_pb2.GetEventsRequest())
        sid = stub.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=pod_config())).pod_sandbox_id
        with pytest.raises(grpc.RpcError) as e:
            stub.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=pod_config()))
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(grpc.RpcError) as e:
            stub.ContainerStatus(api_pb2.ContainerStatusRequest(container_id="nope"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.CheckpointContainer(api_pb2.CheckpointContainerRequest(container_id="x"))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        cid = stub.CreateContainer(api_pb2.CreateContainerRequest(
            pod_sandbox_id=sid, config=container_config(), sandbox_config=pod_config())).container_id
        event = next(events)
        assert (event.container_id, event.container_event_type) == (cid, api_pb2.CONTAINER_CREATED_EVENT)
        assert event.pod_sandbox_status.id == sid and [c.id for c in event.containers_statuses] == [cid]
        events.cancel()
        stub.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sid))
        stub.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sid))
        assert stub.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items == []
    finally:
        channel.close()
        env.events.close()
        server.stop(None).wait()
