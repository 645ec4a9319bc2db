"""pykubelet's pod logic that needs no runtime: the CrashLoopBackOff schedule, the CRI configs built from a
pod (labels, annotations, resources, DNS, cgroup parent), and the phase/status computed from what the
runtime reports."""
from __future__ import annotations

import copy
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from proto import api_pb2
from pykubelet.api.podmodel import ObjectMeta, Pod, Resources, parse_pod
from pykubelet.config import Settings
from pykubelet.pods import status as pod_status
from pykubelet.pods.backoff import Backoff
from pykubelet.pods.criconfig import container_config, linux_resources, sandbox_config
from pykubelet.pods.dns import pod_dns
from pykubelet.pods.labels import HASH, POD_UID, RESTART_COUNT, container_hash
from pykubelet.pods.podspec import parse_quantity, qos_class
from pykubelet.pods.runtimepod import RuntimePod
from pykubelet.pods.sync import SyncResult, network_problem
from tests.kit.fake_cri import FakeCRI

UID = "0b5d2e3c-1111-2222-3333-444455556666"
GI = 1 << 30


def meta(generation: int) -> ObjectMeta:
    return ObjectMeta("web", "ns", UID, generation=generation)


def pod(**spec) -> Pod:
    return parse_pod({"metadata": {"name": "web", "namespace": "ns", "uid": UID, "labels": {"app": "web"}},
                      "spec": {"containers": [{"name": "c", "image": "img:1"}], **spec}})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_first_restart_at_once_then_doubles_to_the_cap():
    clock = Clock()
    b = Backoff(clock=clock)
    assert b.remaining("k", finished_at=clock.now) == 0
    delays = []
    for _ in range(7):
        delays.append(b.restarted("k"))
        clock.now += 1
    assert delays == [10, 20, 40, 80, 160, 300, 300]
    assert b.remaining("k", finished_at=clock.now) == 300
    assert b.remaining("k", finished_at=clock.now - 290) == 10


def test_backoff_resets_after_running_twice_the_cap():
    clock = Clock()
    b = Backoff(clock=clock)
    b.restarted("k")
    b.restarted("k")
    clock.now += 601
    assert b.remaining("k", finished_at=clock.now) == 0
    assert b.restarted("k") == 10
    b.forget_prefix("k")
    assert b.current("k") == 0


def test_quantities_and_qos():
    assert parse_quantity("100m") * 1000 == 100 and parse_quantity("64Mi") == 64 * 2**20
    assert parse_quantity("1G") == 10**9 and parse_quantity("1.5") * 2 == 3
    assert qos_class(pod()) == "BestEffort"
    limits = {"cpu": "1", "memory": "64Mi"}
    assert qos_class(pod(containers=[{"name": "c", "image": "i", "resources": {"limits": limits}}])) == "Guaranteed"
    assert qos_class(pod(containers=[{"name": "c", "image": "i",
                                      "resources": {"requests": {"cpu": "100m"}}}])) == "Burstable"


def test_sandbox_config_labels_logs_dns_ports_and_cgroup():
    settings = Settings(node_name="n1", pod_logs_dir=Path("/logs"), cluster_dns=["10.96.0.10"],
                        cluster_domain="cluster.local")
    p = pod(containers=[{"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}]}])
    config = sandbox_config(p, settings, attempt=2, dns=pod_dns(p, cluster_dns=settings.cluster_dns,
                                                                cluster_domain=settings.cluster_domain, host=""))
    assert (config.metadata.name, config.metadata.namespace, config.metadata.uid, config.metadata.attempt) == \
        ("web", "ns", UID, 2)
    assert config.hostname == "web" and config.log_directory == f"/logs/ns_web_{UID}"
    assert config.labels[POD_UID] == UID and config.labels["app"] == "web"
    assert list(config.dns_config.servers) == ["10.96.0.10"] and list(config.dns_config.options) == ["ndots:5"]
    assert list(config.dns_config.searches) == ["ns.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    (mapping,) = config.port_mappings
    assert (mapping.container_port, mapping.host_port, mapping.protocol) == (80, 8080, api_pb2.TCP)
    assert config.linux.cgroup_parent == f"/kubepods/besteffort/pod{UID}"
    assert config.linux.security_context.namespace_options.network == api_pb2.POD
    host = sandbox_config(pod(hostNetwork=True), settings)
    assert host.hostname == "" and host.linux.security_context.namespace_options.network == api_pb2.NODE
    assert not host.HasField("dns_config")  # no DNS given: the runtime's own (the host's resolv.conf)



def test_container_config_hash_restart_count_resources_and_log_path():
    c = {"name": "c", "image": "img:1", "command": ["sh"], "args": ["-c", "true"], "workingDir": "/w",
         "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
         "resources": {"limits": {"cpu": "500m", "memory": "32Mi"}},
         "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
    p = pod(containers=[c])
    config = container_config(p, p.spec.containers[0], "sha256:abc", 3, sandbox_config(p, Settings()),
                              memory_capacity=GI)
    assert config.metadata.attempt == 3 and config.log_path == "c/3.log"
    assert config.annotations[RESTART_COUNT] == "3"
    assert config.image.image == "sha256:abc" and config.image.user_specified_image == "img:1"
    assert list(config.command) == ["sh"] and list(config.args) == ["-c", "true"] and config.working_dir == "/w"
    assert [(e.key, e.value) for e in config.envs] == [("A", b"1")]
    r = config.linux.resources
    assert (r.cpu_period, r.cpu_quota, r.cpu_shares, r.memory_limit_in_bytes) == (100000, 50000, 512, 32 * 2**20)
    # as the kubelet's MilliCPUToQuota and MilliCPUToShares: a cpu limit of 0 is none, a tiny one 1 ms, shares capped
    assert linux_resources(Resources({}, {"cpu": "0"})).cpu_quota == 0
    assert linux_resources(Resources({}, {"cpu": "1m"})).cpu_quota == 1000
    assert linux_resources(Resources({"cpu": "1000"}, {})).cpu_shares == 262144
    sc = config.linux.security_context
    assert sc.no_new_privs and list(sc.capabilities.drop_capabilities) == ["ALL"] and "/proc/kcore" in sc.masked_paths
    assert config.annotations[HASH] == container_hash(p.spec.containers[0])
    assert hashed(c) != hashed({**c, "image": "img:2"})
    # resources resize in place, probes and fields a newer API server defaults restart nothing
    assert hashed(c) == hashed({**c, "resources": {}, "livenessProbe": {"exec": {}},
                                "terminationMessagePolicy": "File"})


def test_a_privileged_container_makes_its_sandbox_privileged_and_is_unmasked():
    """What the PrivilegedPod spec's pod asks of the runtime: the sandbox privileged because one container
    (or an init or ephemeral one) is, that container privileged with /proc unmasked, the other one not."""
    p = pod(containers=[{"name": "priv", "image": "i", "securityContext": {"privileged": True}},
                        {"name": "plain", "image": "i", "securityContext": {"privileged": False}}])
    sandbox = sandbox_config(p, Settings())
    assert sandbox.linux.security_context.privileged
    priv, plain = (container_config(p, c, "sha256:abc", 0, sandbox, memory_capacity=GI).linux.security_context
                   for c in p.spec.containers)
    assert priv.privileged and list(priv.masked_paths) == list(priv.readonly_paths) == []
    assert not plain.privileged and "/proc/kcore" in plain.masked_paths and "/proc/sys" in plain.readonly_paths
    assert priv.seccomp.profile_type == plain.seccomp.profile_type == api_pb2.SecurityProfile.Unconfined
    assert not sandbox_config(pod(), Settings()).linux.security_context.privileged
    debug = {"name": "debug", "image": "i", "securityContext": {"privileged": True}}
    assert sandbox_config(pod(ephemeralContainers=[debug]), Settings()).linux.security_context.privileged
    assert sandbox_config(pod(initContainers=[debug]), Settings()).linux.security_context.privileged


def hashed(container: dict) -> str:
    return container_hash(pod(containers=[container]).spec.containers[0])


def test_the_hash_of_a_container_is_the_one_it_was_started_with_before_the_typed_pod():
    """A kubelet upgraded under running containers finds their hash unchanged: no restart. The hash is of the
    container as it came (its raw dict), not of the parsed record with its defaults; the digest is the one
    the dict-reading kubelet (before the typed pod) gave."""
    c = {"name": "web", "image": "nginx:1.25", "command": ["nginx"], "args": ["-g", "daemon off;"],
         "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80, "protocol": "TCP"}],
         "volumeMounts": [{"name": "data", "mountPath": "/data"}], "securityContext": {"runAsUser": 1000},
         "resources": {"limits": {"cpu": "1"}}, "imagePullPolicy": "IfNotPresent",
         "terminationMessagePath": "/dev/termination-log"}
    assert hashed(c) == "546bb9ad1d22244b"


def test_env_references_expand_as_the_api_says():
    c = {"name": "c", "image": "i", "command": ["echo", "$(A)-$(B)", "$$(A)", "$(MISSING)"],
         "env": [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)y"}]}
    p = pod(containers=[c])
    config = container_config(p, p.spec.containers[0], "i", 0, sandbox_config(p, Settings()), memory_capacity=GI)
    assert list(config.command) == ["echo", "x-xy", "$(A)", "$(MISSING)"]
    assert [(e.key, e.value) for e in config.envs] == [("A", b"x"), ("B", b"xy")]


def container(cid: str, state: api_pb2.ContainerState, restart: int, exit_code: int = 0,
              reason: str = "") -> api_pb2.ContainerStatus:
    return api_pb2.ContainerStatus(id=cid, state=state, exit_code=exit_code, reason=reason, image_ref="sha256:i",
                                   started_at=1_700_000_000 * 10**9, finished_at=1_700_000_001 * 10**9,
                                   labels={"io.kubernetes.container.name": "c"},
                                   annotations={RESTART_COUNT: str(restart)})


def runtime_pod(*statuses: api_pb2.ContainerStatus) -> RuntimePod:
    state = RuntimePod(sandboxes=[api_pb2.PodSandbox(id="s", state=api_pb2.SANDBOX_READY)],
                       containers=[api_pb2.Container(id=s.id, pod_sandbox_id="s", labels=s.labels) for s in statuses],
                       statuses={s.id: s for s in statuses})
    state.sandbox_status = api_pb2.PodSandboxStatus(network=api_pb2.PodSandboxNetworkStatus(ip="10.0.0.5"))
    return state


def test_status_running_and_ready():
    s = pod_status.pod_status(pod(), runtime_pod(container("c1", api_pb2.CONTAINER_RUNNING, 0)), SyncResult(),
                              host_ip="10.1.1.1", runtime_name="containerd")
    assert s["phase"] == "Running" and s["podIP"] == "10.0.0.5" and s["hostIP"] == "10.1.1.1"
    conditions = {c["type"]: c["status"] for c in s["conditions"]}
    assert conditions["Ready"] == conditions["ContainersReady"] == conditions["Initialized"] == "True"
    (cs,) = s["containerStatuses"]
    assert cs["containerID"] == "containerd://c1" and cs["ready"] and "running" in cs["state"]


def test_status_crash_loop_back_off_shows_the_last_termination():
    result = SyncResult(waiting={"c": ("CrashLoopBackOff", "back-off 10s restarting failed container=c")})
    state = runtime_pod(container("c2", api_pb2.CONTAINER_EXITED, 1, exit_code=3),
                        container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=3))
    s = pod_status.pod_status(pod(), state, result, host_ip=None, runtime_name="containerd")
    (cs,) = s["containerStatuses"]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff" and cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 3 and cs["lastState"]["terminated"]["reason"] == "Error"
    assert s["phase"] == "Running" and not cs["ready"]


def test_phase_by_restart_policy():
    done = runtime_pod(container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=0, reason="Completed"))
    failed = runtime_pod(container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=1))
    assert pod_status.pod_status(pod(restartPolicy="Never"), done, SyncResult(), host_ip=None,
                                 runtime_name="x")["phase"] == "Succeeded"
    assert pod_status.pod_status(pod(restartPolicy="Never"), failed, SyncResult(), host_ip=None,
                                 runtime_name="x")["phase"] == "Failed"
    assert pod_status.pod_status(pod(restartPolicy="OnFailure"), failed, SyncResult(), host_ip=None,
                                 runtime_name="x")["phase"] == "Running"
    nothing = RuntimePod()
    s = pod_status.pod_status(pod(), nothing, SyncResult(), host_ip=None, runtime_name="x")
    assert s["phase"] == "Pending"
    assert s["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"


class FakeClient:
    def __init__(self) -> None:
        self.patches: list[dict] = []

    def patch(self, _res, _name, obj, **_kw) -> None:
        self.patches.append(obj)


def test_status_manager_patches_only_changes_and_keeps_transition_times():
    client = FakeClient()
    manager = pod_status.StatusManager(client)
    state = runtime_pod(container("c1", api_pb2.CONTAINER_RUNNING, 0))
    first = pod_status.pod_status(pod(), state, SyncResult(), host_ip=None, runtime_name="x")
    assert manager.set_pod_status(meta(1), first)
    again = pod_status.pod_status(pod(), state, SyncResult(), host_ip=None, runtime_name="x")
    assert not manager.set_pod_status(meta(1), again)
    assert len(client.patches) == 1
    times = {c["type"]: c["lastTransitionTime"] for c in client.patches[0]["status"]["conditions"]}
    assert all(times.values())


def test_the_status_says_which_generation_of_the_spec_it_is_of():
    """PodObservedGenerationTracking (GA in 1.35; e2e's PLR Pod InPlace Resize specs wait for it after a
    resize): status.observedGeneration and the kubelet's conditions carry the pod's generation, never going
    back; a resize condition keeps the generation of its resize, another's condition is left as it is."""
    client = FakeClient()
    manager = pod_status.StatusManager(client)
    state = runtime_pod(container("c1", api_pb2.CONTAINER_RUNNING, 0))
    status = pod_status.pod_status(pod(), state, SyncResult(), host_ip=None, runtime_name="x",
                                   resize_conditions=[{"type": "PodResizeInProgress", "status": "True",
                                                       "observedGeneration": 2}])
    status["conditions"].append({"type": "example.com/gate", "status": "True"})
    assert manager.set_pod_status(meta(3), status)
    sent = client.patches[-1]["status"]
    assert sent["observedGeneration"] == 3
    generations = {c["type"]: c.get("observedGeneration") for c in sent["conditions"]}
    assert generations.pop("PodResizeInProgress") == 2 and generations.pop("example.com/gate") is None
    assert set(generations.values()) == {3}
    older = pod_status.pod_status(pod(), state, SyncResult(), host_ip=None, runtime_name="x")
    manager.set_pod_status(meta(2), older)
    assert client.patches[-1]["status"]["observedGeneration"] == 3


def test_network_problem_in_the_kubelets_words():
    """What keeps the kubelet from making a sandbox (and says why in the pod's status and event)."""
    runtime = FakeCRI()
    assert network_problem(runtime) == ""
    runtime.set_condition("NetworkReady", False, "NetworkPluginNotReady", "cni plugin not initialized")
    assert network_problem(runtime) == (
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
        "message:cni plugin not initialized")


def test_a_pass_makes_the_sandbox_then_starts_what_is_due_in_it(tmp_path):
    """The executor against the shared fake runtime: a new pod's first pass makes its sandbox and, in it,
    starts its init container; the next pass, once that one ended, its regular containers; a dead sandbox
    is stopped and the pod made again in a new one, restart counts going on."""
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer

    rt = FakeCRI()
    rt.add_image("sha256:i", "img:1")
    p = pod(initContainers=[{"name": "init", "image": "img:1"}])
    syncer = PodSyncer(rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"))
    result = syncer.sync(p, observe(rt, UID))
    (sandbox,) = rt.sandboxes.values()
    assert rt.started == ["init-0"] and rt.sandbox_of["init-0"] == sandbox.id and not result.waiting
    assert (tmp_path / "logs" / f"ns_web_{UID}").is_dir()
    syncer.sync(p, observe(rt, UID))
    assert rt.started == ["init-0"]  # it still runs
    rt.exit("init-0", 0)
    syncer.sync(p, observe(rt, UID))
    assert rt.started == ["init-0", "c-0"]
    rt.stop_pod_sandbox(sandbox.id)
    syncer.sync(p, observe(rt, UID))
    assert [s.metadata.attempt for s in rt.sandboxes.values()] == [0, 1]
    assert rt.started == ["init-0", "c-0", "init-1"] and rt.statuses["c-0"].state == api_pb2.CONTAINER_EXITED


def test_an_image_volume_two_starting_containers_mount_is_pulled_once_a_pass(tmp_path):
    """pullPolicy Always: one pull of the volume's image for the pass that starts both containers (as the
    kubelet's getImageVolumes), and one more for the pass that restarts one of them."""
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer

    rt = FakeCRI()
    rt.add_image("sha256:i", "img:1")
    mount = [{"name": "data", "mountPath": "/data"}]
    p = pod(containers=[{"name": "a", "image": "img:1", "volumeMounts": mount},
                        {"name": "b", "image": "img:1", "volumeMounts": mount}],
            volumes=[{"name": "data", "image": {"reference": "data:1", "pullPolicy": "Always"}}])
    syncer = PodSyncer(rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"))
    syncer.sync(p, observe(rt, UID))
    assert rt.started == ["a-0", "b-0"]
    assert [c[1] for c in rt.calls if c[0] == "PullImage"] == ["data:1"]
    rt.exit("a-0", 1)
    syncer.sync(p, observe(rt, UID))
    assert rt.started == ["a-0", "b-0", "a-1"]
    assert [c[1] for c in rt.calls if c[0] == "PullImage"] == ["data:1", "data:1"]


class Cache:
    """The pod informer's reading side, over objects shaped as its lightkube models."""

    def __init__(self) -> None:
        self.by_key: dict[str, SimpleNamespace] = {}
        self.listed = threading.Event()  # every source has listed its pods
        self.listed.set()

    def add_handler(self, _handler) -> None:
        pass

    def has_synced(self) -> bool:
        return self.listed.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self.listed.wait(timeout)

    def objects(self) -> list[SimpleNamespace]:
        return list(self.by_key.values())

    def get(self, key: str) -> SimpleNamespace | None:
        return self.by_key.get(key)

    def put(self, raw: dict) -> SimpleNamespace:
        meta = raw["metadata"]
        obj = SimpleNamespace(metadata=SimpleNamespace(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"],
                                                       deletionGracePeriodSeconds=meta.get("deletionGracePeriodSeconds")),
                              to_dict=lambda: copy.deepcopy(raw))
        self.by_key[f"{meta['namespace']}/{meta['name']}"] = obj
        return obj


def test_the_workers_parse_a_pod_once_per_change_and_run_none_they_cannot_read(tmp_path, caplog):
    from pykubelet.pods.workers import PodWorkers

    cache, rt = Cache(), FakeCRI()
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path), cache)
    raw: dict = {"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                 "spec": {"containers": [{"name": "c", "image": "img:1"}]}}
    workers._on_pod("ADDED", None, cache.put(raw))
    first = workers.pod(UID)
    assert first is not None and first is workers.pod(UID)  # the same object: not parsed again
    workers._on_pod("MODIFIED", None, cache.put({**raw, "spec": {"restartPolicy": "Never", **raw["spec"]}}))
    changed = workers.pod(UID)
    assert changed is not None and changed is not first and changed.spec.restart_policy == "Never"
    bad = {**raw, "spec": {"containers": [{"name": "c", "image": "img:1", "ports": [{"containerPort": "80"}]}]}}
    workers._on_pod("MODIFIED", None, cache.put(bad))
    with caplog.at_level(logging.WARNING):
        assert workers.sync(UID) is None
    assert rt.calls == []  # nothing of it made, nothing stopped
    assert 'not run: spec.containers[0].ports[0].containerPort: must be an integer, got "80"' in caplog.text


def test_a_pod_gone_from_the_api_and_the_runtime_still_leaves_nothing_on_the_node(tmp_path):
    """The API server deletes a Failed pod at once, and an evicted pod has nothing left in the runtime to be
    named by: the kubelet still removes what it made for it (its volumes and log directory here; its cgroup
    the same way), by the name it last saw the pod under."""
    from pykubelet.pods.workers import PodWorkers

    cache = Cache()
    settings = Settings(root_dir=tmp_path / "root", pod_logs_dir=tmp_path / "logs")
    workers = PodWorkers(None, FakeCRI(), settings, cache)
    workers._on_pod("ADDED", None, cache.put({"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                                              "spec": {"containers": [{"name": "c", "image": "img:1"}]}}))
    cache.by_key.clear()  # the API server deleted it
    logs, volumes = settings.pod_logs_dir / f"ns_web_{UID}" / "c", settings.root_dir / "pods" / UID / "volumes"
    logs.mkdir(parents=True)
    volumes.mkdir(parents=True)
    assert workers.sync(UID) is None
    assert not logs.parent.exists() and not volumes.parent.exists()


def test_a_pod_no_source_has_listed_yet_is_left_alone_until_every_source_has(tmp_path):
    """A static pod runs while the API server is away (kubeadm's control plane is static pods), but a pod
    the runtime runs that no source has named yet is "not listed yet", not "deleted", until all have listed."""
    from pykubelet.api.workqueue import WorkQueue
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer
    from pykubelet.pods.workers import PodWorkers

    rt, cache = FakeCRI(), Cache()
    rt.add_image("sha256:i", "img:1")
    PodSyncer(rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs")).sync(pod(), observe(rt, UID))
    assert rt.started == ["c-0"]  # an API pod, from before the kubelet's restart
    cache.listed.clear()
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache)
    static = {"metadata": {"name": "etcd", "namespace": "kube-system", "uid": "static-uid"},
              "spec": {"containers": [{"name": "etcd", "image": "img:1"}]}}
    workers._on_pod("ADDED", None, cache.put(static))
    workers.sync("static-uid")
    assert rt.started == ["c-0", "etcd-0"]
    assert workers.sync(UID) is None
    assert rt.statuses["c-0"].state == api_pb2.CONTAINER_RUNNING
    cache.listed.set()  # the API server listed its pods: UID's is not among them
    workers.queue = WorkQueue()
    workers._when_listed(threading.Event())
    assert {workers.queue.get(), workers.queue.get()} == {UID, "static-uid"}
    workers.sync(UID)
    assert observe(rt, UID).containers == [] and observe(rt, UID).sandboxes == []  # stopped and removed
    assert observe(rt, "static-uid").sandbox is not None


DEBUGGER = {"name": "debugger", "image": "img:1", "targetContainerName": "c", "stdin": True, "tty": True}


def test_an_ephemeral_container_with_a_target_joins_its_pid_namespace_unless_the_pod_shares_one():
    for spec, pid, target in (({}, api_pb2.TARGET, "c-0"), ({"shareProcessNamespace": True}, api_pb2.POD, ""),
                              ({"hostPID": True}, api_pb2.NODE, "")):
        p = pod(ephemeralContainers=[DEBUGGER], **spec)
        sandbox = sandbox_config(p, Settings())
        config = container_config(p, p.spec.ephemeral_containers[0], "i", 0, sandbox, memory_capacity=GI,
                                  target_id="c-0")
        ns = config.linux.security_context.namespace_options
        assert (ns.pid, ns.target_id) == (pid, target)
        assert config.stdin and config.tty and config.labels["io.kubernetes.container.name"] == "debugger"
        assert sandbox.linux.security_context.namespace_options.pid != api_pb2.TARGET  # the sandbox's untouched


def test_status_of_ephemeral_containers_as_the_kubelets():
    """Reported as containers are, never ready nor started, and outside the phase and the pod's readiness."""
    debugger = container("d1", api_pb2.CONTAINER_EXITED, 0, exit_code=1)
    debugger.labels["io.kubernetes.container.name"] = "debugger"
    state = runtime_pod(container("c1", api_pb2.CONTAINER_RUNNING, 0), debugger)
    s = pod_status.pod_status(pod(ephemeralContainers=[DEBUGGER]), state, SyncResult(), host_ip=None,
                              runtime_name="containerd")
    (es,) = s["ephemeralContainerStatuses"]
    assert (es["name"], es["containerID"], es["ready"], es["restartCount"]) == ("debugger", "containerd://d1", False, 0)
    assert es["state"]["terminated"]["exitCode"] == 1 and "started" not in es
    assert s["phase"] == "Running" and {c["type"]: c["status"] for c in s["conditions"]}["Ready"] == "True"
    waiting = SyncResult(waiting={"debugger": ("ErrImagePull", "no such image")})
    (es,) = pod_status.pod_status(pod(ephemeralContainers=[DEBUGGER]), runtime_pod(), waiting, host_ip=None,
                                  runtime_name="x")["ephemeralContainerStatuses"]
    assert es["state"] == {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}
    assert "ephemeralContainerStatuses" not in pod_status.pod_status(pod(), state, SyncResult(), host_ip=None,
                                                                     runtime_name="x")


def test_kubectl_debug_starts_the_ephemeral_container_once_in_the_running_pod(tmp_path):
    """The executor against the fake runtime: the pod runs; the ephemeral container its API object gains is
    started in its sandbox, in the target's pid namespace, without touching the pod's container; once it
    exits it is never started again. A target that has no container yet: a config error, then a start."""
    from pykubelet.pods.runtimepod import observe
    from pykubelet.pods.sync import PodSyncer

    rt = FakeCRI()
    rt.add_image("sha256:i", "img:1")
    syncer = PodSyncer(rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"))
    syncer.sync(pod(), observe(rt, UID))
    assert rt.started == ["c-0"]
    debugged = pod(ephemeralContainers=[DEBUGGER])
    assert not syncer.sync(debugged, observe(rt, UID)).waiting
    assert rt.started == ["c-0", "debugger-0"] and rt.sandbox_of["debugger-0"] == rt.sandbox_of["c-0"]
    (created,) = [args[1] for rpc, *args in rt.calls
                  if rpc == "CreateContainer" and args[1].metadata.name == "debugger"]
    assert (created.linux.security_context.namespace_options.pid,
            created.linux.security_context.namespace_options.target_id) == (api_pb2.TARGET, "c-0")
    rt.exit("debugger-0", 0)
    syncer.sync(debugged, observe(rt, UID))
    assert rt.started == ["c-0", "debugger-0"]  # neither restarted

    fresh = FakeCRI()
    fresh.add_image("sha256:i", "img:1")
    early = PodSyncer(fresh, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"))
    gated = pod(initContainers=[{"name": "init", "image": "img:1"}], ephemeralContainers=[DEBUGGER])
    result = early.sync(gated, observe(fresh, UID))
    assert result.waiting == {"debugger": ("CreateContainerConfigError", "unable to find target container c")}
    assert fresh.started == ["init-0"] and result.requeue_after is not None
    fresh.exit("init-0", 0)
    early.sync(gated, observe(fresh, UID))
    early.sync(gated, observe(fresh, UID))
    assert fresh.started == ["init-0", "c-0", "debugger-0"]


def test_the_workers_see_an_ephemeral_container_patched_in(tmp_path):
    """PATCH pods/NAME/ephemeralcontainers changes the pod object: the informer's MODIFIED queues the pod and
    hands a new object, which is parsed again."""
    from pykubelet.pods.workers import PodWorkers

    cache = Cache()
    workers = PodWorkers(None, FakeCRI(), Settings(root_dir=tmp_path), cache)
    raw: dict = {"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                 "spec": {"containers": [{"name": "c", "image": "img:1"}]}}
    workers._on_pod("ADDED", None, cache.put(raw))
    assert workers.queue.get(timeout=0) == UID
    before = workers.pod(UID)
    assert before is not None and before.spec.ephemeral_containers == ()
    workers.queue.done(UID)
    workers._on_pod("MODIFIED", None, cache.put({**raw, "spec": {**raw["spec"], "ephemeralContainers": [DEBUGGER]}}))
    assert workers.queue.get(timeout=0) == UID
    after = workers.pod(UID)
    assert after is not None and [c.name for c in after.spec.ephemeral_containers] == ["debugger"]


def named(name: str, cid: str, state: api_pb2.ContainerState, exit_code: int = 0) -> api_pb2.ContainerStatus:
    s = container(cid, state, 0, exit_code=exit_code)
    s.labels["io.kubernetes.container.name"] = name
    return s


def conditions_of(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_failed_init_container_leaves_the_pod_not_initialized_and_its_containers_pod_initializing():
    """As the [Conformance] specs "should not start app containers if init containers fail on a RestartAlways
    pod" and "... on a RestartNever pod" (test/e2e/common/node/init_container.go) check: Initialized False
    with reason ContainersNotInitialized naming every init container not done, the app containers waiting in
    PodInitializing; restartPolicy Never fails the pod."""
    inits = [{"name": "init1", "image": "img:1"}, {"name": "init2", "image": "img:1"}]
    always = pod(initContainers=inits)
    result = SyncResult(waiting={"init1": ("CrashLoopBackOff", "back-off 10s restarting failed container=init1")})
    s = pod_status.pod_status(always, runtime_pod(named("init1", "i1", api_pb2.CONTAINER_EXITED, exit_code=1)),
                              result, host_ip=None, runtime_name="x")
    assert s["phase"] == "Pending"
    init = conditions_of(s)["Initialized"]
    assert (init["status"], init["reason"], init["message"]) == (
        "False", "ContainersNotInitialized", "containers with incomplete status: [init1 init2]")
    ready, containers_ready = conditions_of(s)["Ready"], conditions_of(s)["ContainersReady"]
    assert ready["status"] == containers_ready["status"] == "False"
    assert ready["reason"] == containers_ready["reason"] == "ContainersNotReady"
    assert containers_ready["message"] == "containers with unready status: [c]"
    assert [c["state"]["waiting"]["reason"] for c in s["containerStatuses"]] == ["PodInitializing"]
    assert s["initContainerStatuses"][1]["state"]["waiting"]["reason"] == "PodInitializing"

    never = pod(initContainers=inits, restartPolicy="Never")
    state = runtime_pod(named("init1", "i1", api_pb2.CONTAINER_EXITED),
                        named("init2", "i2", api_pb2.CONTAINER_EXITED, exit_code=1))
    s = pod_status.pod_status(never, state, SyncResult(init_failed=True), host_ip=None, runtime_name="x")
    assert s["phase"] == "Failed"
    init = conditions_of(s)["Initialized"]
    assert (init["status"], init["reason"], init["message"]) == (
        "False", "ContainersNotInitialized", "containers with incomplete status: [init2]")
    assert conditions_of(s)["Ready"]["reason"] == conditions_of(s)["ContainersReady"]["reason"] == "PodFailed"
    assert s["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"


def test_a_finished_pod_is_initialized_with_pod_completed():
    done = runtime_pod(container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=0, reason="Completed"))
    s = pod_status.pod_status(pod(restartPolicy="Never"), done, SyncResult(), host_ip=None, runtime_name="x")
    assert conditions_of(s)["Initialized"] == {"type": "Initialized", "status": "True", "reason": "PodCompleted"}
    assert conditions_of(s)["ContainersReady"]["reason"] == "PodCompleted"


def test_readiness_gates_hold_ready_until_each_gates_condition_is_true():
    """As the spec "should support pod readiness gates" (test/e2e/common/node/pods.go): the containers ready,
    Ready is True only once every readiness gate's condition, which a client sets through pods/status, is
    True; the kubelet keeps those conditions as the API server has them."""
    gates = [{"conditionType": "k8s.io/test-condition1"}, {"conditionType": "k8s.io/test-condition2"}]
    state = runtime_pod(container("c1", api_pb2.CONTAINER_RUNNING, 0))

    def status(*conditions: tuple[str, str]) -> dict:
        raw = pod(readinessGates=gates).raw
        raw["status"] = {"conditions": [{"type": t, "status": v, "lastTransitionTime": "2026-01-01T00:00:00Z"}
                                        for t, v in conditions] + [{"type": "Ready", "status": "False"}]}
        return pod_status.pod_status(parse_pod(raw), state, SyncResult(), host_ip=None, runtime_name="x")

    s = status()
    assert conditions_of(s)["ContainersReady"]["status"] == "True"
    ready = conditions_of(s)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ReadinessGatesNotReady")
    assert ready["message"] == ('corresponding condition of pod readiness gate "k8s.io/test-condition1" does not '
                                'exist., corresponding condition of pod readiness gate "k8s.io/test-condition2" '
                                'does not exist.')
    s = status(("k8s.io/test-condition1", "True"))
    assert conditions_of(s)["Ready"]["message"] == (
        'corresponding condition of pod readiness gate "k8s.io/test-condition2" does not exist.')
    s = status(("k8s.io/test-condition1", "True"), ("k8s.io/test-condition2", "False"))
    assert conditions_of(s)["Ready"]["message"] == (
        'the status of pod readiness gate "k8s.io/test-condition2" is not "True", but False')
    s = status(("k8s.io/test-condition1", "True"), ("k8s.io/test-condition2", "True"))
    assert conditions_of(s)["Ready"] == {"type": "Ready", "status": "True"}
    assert conditions_of(s)["k8s.io/test-condition2"] == {"type": "k8s.io/test-condition2", "status": "True",
                                                          "lastTransitionTime": "2026-01-01T00:00:00Z"}

    client = FakeClient()
    manager = pod_status.StatusManager(client)
    assert manager.set_pod_status(meta(1), s)
    sent = conditions_of(client.patches[0]["status"])
    assert sent["k8s.io/test-condition1"] == {"type": "k8s.io/test-condition1", "status": "True",
                                              "lastTransitionTime": "2026-01-01T00:00:00Z"}
    assert sent["Ready"]["lastTransitionTime"] and "lastProbeTime" in sent["Ready"]


def test_readiness_gates_are_parsed_with_their_field_path():
    import pytest

    from pykubelet.api.fields import FieldError

    assert pod(readinessGates=[{"conditionType": "a/b"}]).spec.readiness_gates == ("a/b",)
    with pytest.raises(FieldError, match=r"^spec.readinessGates\[0\].conditionType: required$"):
        pod(readinessGates=[{}])


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def event(self, _ref, type_: str, reason: str, message: str) -> None:
        self.seen.append((type_, reason, message))


def test_the_active_deadline_is_what_the_spec_says_now_from_the_start_time():
    import datetime

    from pykubelet.pods.podspec import deadline_left

    now = datetime.datetime(2026, 1, 1, 0, 1, tzinfo=datetime.UTC)
    assert deadline_left(pod(), "2026-01-01T00:00:00Z", now) is None
    assert deadline_left(pod(activeDeadlineSeconds=600), None, now) is None  # not started yet
    assert deadline_left(pod(activeDeadlineSeconds=600), "2026-01-01T00:00:00Z", now) == 540
    assert deadline_left(pod(activeDeadlineSeconds=5), "2026-01-01T00:00:00Z", now) == -55


def test_a_pod_whose_active_deadline_is_lowered_below_its_age_is_killed_and_failed_with_deadline_exceeded(tmp_path):
    """As the [Conformance] spec "should allow activeDeadlineSeconds to be updated" (test/e2e/common/node/
    pods.go): a running pod's activeDeadlineSeconds lowered to 5 through the informer, the pod, started
    longer ago, is killed and Failed with reason DeadlineExceeded (no DisruptionTarget: its own spec ended
    it), a Normal event says so, and nothing of it starts again."""
    from pykubelet.pods.workers import PodWorkers

    cache, rt, events = Cache(), FakeCRI(), Events()
    rt.add_image("sha256:i", "img:1")
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache,
                         events=events)  # type: ignore[arg-type]  # a recorder's event() is all the workers call
    raw: dict = {"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                 "spec": {"containers": [{"name": "c", "image": "img:1"}]},
                 "status": {"phase": "Pending", "startTime": "2026-01-01T00:00:00Z"}}
    workers._on_pod("ADDED", None, cache.put(raw))
    assert workers.sync(UID) is None  # no deadline: nothing to come back for
    assert workers.statuses.last(UID)["phase"] == "Running" and rt.started == ["c-0"]
    workers._on_pod("MODIFIED", None, cache.put({**raw, "spec": {**raw["spec"], "activeDeadlineSeconds": 5}}))
    assert workers.sync(UID) is None
    status = workers.statuses.last(UID)
    assert (status["phase"], status["reason"]) == ("Failed", "DeadlineExceeded")
    assert status["message"] == "Pod was active on the node longer than the specified deadline"
    assert "DisruptionTarget" not in conditions_of(status) and conditions_of(status)["Ready"]["status"] == "False"
    assert status["containerStatuses"][0]["state"]["terminated"]
    assert ("Normal", "DeadlineExceeded", status["message"]) in events.seen
    assert not rt.sandboxes and not rt.statuses
    assert workers.sync(UID) is None and rt.started == ["c-0"]


def test_a_pod_with_an_active_deadline_is_synced_again_when_it_runs_out(tmp_path):
    import datetime

    from pykubelet.pods.workers import PodWorkers

    cache, rt = Cache(), FakeCRI()
    rt.add_image("sha256:i", "img:1")
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache)
    start = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=100)).strftime("%Y-%m-%dT%H:%M:%SZ")
    workers._on_pod("ADDED", None, cache.put({
        "metadata": {"name": "web", "namespace": "ns", "uid": UID},
        "spec": {"containers": [{"name": "c", "image": "img:1"}], "activeDeadlineSeconds": 3600},
        "status": {"phase": "Pending", "startTime": start}}))
    again = workers.sync(UID)
    assert again is not None and 3400 < again <= 3500


class SlowStop(FakeCRI):
    """A runtime whose StopContainer returns once `release` is set: a container taking its grace to end."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        self.release.wait(10)
        super().stop_container(container_id, timeout)


class ApiClient(FakeClient):
    """Records the status patches and the deletions, in order, and the names deleted."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.deleted: list[str] = []

    def patch(self, _res, _name, obj, **_kw) -> None:
        super().patch(_res, _name, obj)
        self.calls.append("patch")

    def delete(self, _res, name, **_kw) -> None:
        self.calls.append("delete")
        self.deleted.append(name)


def test_a_deleted_pod_turns_not_ready_while_it_terminates_and_its_liveness_is_off(tmp_path):
    """As the [NodeConformance] specs "should mark readiness on pods to false [and disable liveness probes]
    while pod is in progress of terminating" (test/e2e/common/node/container_probe.go): once the pod is
    deleted, its liveness and startup probes stop (a container failing them on its way out is not killed
    nor reported), its readiness probe goes on, and the status is written while the containers take their
    grace, so the readiness it loses shows before the pod is gone."""
    from pykubelet.pods.workers import PodWorkers
    from pykubelet.prober.manager import LIVENESS, READINESS

    cache, rt, client = Cache(), SlowStop(), ApiClient()
    rt.add_image("sha256:i", "img:1")
    workers = PodWorkers(client, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache)
    probe = {"exec": {"command": ["cat"]}, "failureThreshold": 1, "periodSeconds": 2}
    raw: dict = {"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                 "spec": {"containers": [{"name": "c", "image": "img:1", "readinessProbe": probe,
                                          "livenessProbe": probe}], "terminationGracePeriodSeconds": 30}}
    workers._on_pod("ADDED", None, cache.put(raw))
    workers.sync(UID)
    probes = workers.probes
    readiness = probes._workers[(UID, "c", READINESS)]
    probes.probe_once(readiness)
    workers.sync(UID)
    assert conditions_of(workers.statuses.last(UID))["Ready"]["status"] == "True"

    deleted = {**raw, "metadata": {**raw["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z",
                                   "deletionGracePeriodSeconds": 30}}
    workers._on_pod("MODIFIED", None, cache.put(deleted))
    terminating = threading.Thread(target=workers.sync, args=(UID,))
    terminating.start()
    deadline = time.monotonic() + 5
    while (UID, "c", LIVENESS) in probes._workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (UID, "c", LIVENESS) not in probes._workers and (UID, "c", READINESS) in probes._workers
    rt.exec_answers["cat"] = 1  # the container, sent its stop signal, stops serving
    probes.probe_once(readiness)
    while conditions_of(workers.statuses.last(UID))["Ready"]["status"] == "True" and time.monotonic() < deadline:
        time.sleep(0.01)
    ready = conditions_of(workers.statuses.last(UID))["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
    assert terminating.is_alive() and not client.deleted  # still terminating: the pod is there
    rt.release.set()
    terminating.join(5)
    assert not terminating.is_alive() and client.deleted == ["web"] and not probes._workers


def test_a_restart_never_pod_whose_init_container_failed_stays_failed(tmp_path):
    """Its sandbox stopped, the passes after the one that failed it find nothing to judge the init container
    by: the phase it was given stays, as the kubelet's (the RestartNever spec's pod ends Failed)."""
    from pykubelet.pods.workers import PodWorkers

    cache, rt = Cache(), FakeCRI()
    rt.add_image("sha256:i", "img:1")
    workers = PodWorkers(None, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache)
    workers._on_pod("ADDED", None, cache.put({
        "metadata": {"name": "web", "namespace": "ns", "uid": UID},
        "spec": {"restartPolicy": "Never", "initContainers": [{"name": "init", "image": "img:1"}],
                 "containers": [{"name": "c", "image": "img:1"}]}}))
    workers.sync(UID)
    rt.exit("init-0", 1)
    workers.sync(UID)
    assert workers.statuses.last(UID)["phase"] == "Failed"
    assert all(s.state == api_pb2.SANDBOX_NOTREADY for s in rt.sandboxes.values())
    workers.sync(UID)
    status = workers.statuses.last(UID)
    assert status["phase"] == "Failed" and conditions_of(status)["Initialized"]["reason"] == "ContainersNotInitialized"
    assert rt.started == ["init-0"]
def test_phase_of_a_deleted_pod_whose_containers_all_stopped_is_terminal():
    """The kubelet's getPhase with podIsTerminal: none restarts whatever the policy, so Succeeded if each
    exited 0, else Failed; a container that never ran keeps it Pending; a static pod keeps the policy's."""
    def phase(p: Pod, *statuses: api_pb2.ContainerStatus) -> str:
        return pod_status.pod_status(p, runtime_pod(*statuses), SyncResult(), host_ip=None, runtime_name="x",
                                     terminal=True)["phase"]

    assert phase(pod(), container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=0)) == "Succeeded"
    assert phase(pod(), container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=137)) == "Failed"
    assert phase(pod(restartPolicy="OnFailure"), container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=1)) == "Failed"
    assert phase(pod()) == "Pending"
    static = parse_pod({"metadata": {"name": "web", "namespace": "ns", "uid": UID,
                                     "annotations": {"kubernetes.io/config.source": "file"}},
                        "spec": {"containers": [{"name": "c", "image": "img:1"}]}})
    assert phase(static, container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=0)) == "Running"


def test_a_deleted_pod_reports_its_containers_terminated_before_it_leaves_the_runtime(tmp_path):
    """As the kubelet's syncTerminatingPod: once the containers stopped, the pod's status says so (each
    terminated, with its finish time; a terminal phase) before the containers are removed and the pod
    object deleted, so a pod kept by a finalizer shows how it ended ([sig-node] Lifecycle Sleep Hook specs
    wait for the container's terminated state and read its finishedAt)."""
    from pykubelet.pods.workers import PodWorkers

    cache, rt, client = Cache(), FakeCRI(), ApiClient()
    rt.add_image("sha256:i", "img:1")
    settings = Settings(root_dir=tmp_path / "root", pod_logs_dir=tmp_path / "logs")
    workers = PodWorkers(client, rt, settings, cache)
    raw: dict = {"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                 "spec": {"containers": [{"name": "c", "image": "img:1"}], "terminationGracePeriodSeconds": 5}}
    workers._on_pod("ADDED", None, cache.put(raw))
    workers.sync(UID)
    assert rt.started == ["c-0"] and client.patches[-1]["status"]["phase"] == "Running"
    deleted = {**raw, "metadata": {**raw["metadata"], "deletionTimestamp": "2026-01-01T00:00:05Z",
                                   "deletionGracePeriodSeconds": 5, "finalizers": ["test/finalizer"]}}
    workers._on_pod("MODIFIED", None, cache.put(deleted))
    client.calls.clear()
    assert workers.sync(UID) is None
    # reported (while it terminates, then as it ended), then removed, then deleted
    assert client.calls[-2:] == ["patch", "delete"] and set(client.calls[:-1]) == {"patch"} and not rt.statuses
    final = client.patches[-1]["status"]
    (cs,) = final["containerStatuses"]
    assert final["phase"] == "Succeeded" and cs["state"]["terminated"]["finishedAt"] and not cs["ready"]
    assert next(c for c in final["conditions"] if c["type"] == "Ready")["status"] == "False"


def test_a_deletion_with_a_shorter_grace_cuts_the_termination_under_way(tmp_path):
    """As the kubelet's pod workers (a shortened grace cancels the termination and runs it again with the new
    one): a pod whose preStop sleeps 50 s of its 100 s grace, deleted again with grace 1, ends within it
    ([sig-node] Lifecycle Sleep Hook reduce GracePeriodSeconds during runtime)."""
    import threading
    import time

    from pykubelet.pods.lifecycle import MIN_GRACE
    from pykubelet.pods.workers import PodWorkers

    cache, rt, client = Cache(), FakeCRI(), ApiClient()
    rt.add_image("sha256:i", "img:1")
    workers = PodWorkers(client, rt, Settings(root_dir=tmp_path / "root", pod_logs_dir=tmp_path / "logs"), cache)
    raw: dict = {"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                 "spec": {"containers": [{"name": "c", "image": "img:1",
                                          "lifecycle": {"preStop": {"sleep": {"seconds": 50}}}}],
                          "terminationGracePeriodSeconds": 100}}
    workers._on_pod("ADDED", None, cache.put(raw))
    workers.sync(UID)
    deleted = {**raw, "metadata": {**raw["metadata"], "deletionTimestamp": "2026-01-01T00:01:40Z",
                                   "deletionGracePeriodSeconds": 100}}
    workers._on_pod("MODIFIED", None, cache.put(deleted))
    began = time.monotonic()
    t = threading.Thread(target=workers.sync, args=(UID,))
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # the preStop sleeps
    again = {**deleted, "metadata": {**deleted["metadata"], "deletionGracePeriodSeconds": 1}}
    workers._on_pod("MODIFIED", None, cache.put(again))
    t.join(5)
    assert not t.is_alive() and time.monotonic() - began < 3
    assert ("StopContainer", "c-0", MIN_GRACE) in rt.calls and not workers._deadlines


def test_phase_with_a_containers_own_restart_policy_and_rules():
    """getPhase with ContainerRestartRules: the pod runs while a stopped container restarts by its own
    policy or a matching rule, else it has ended (Succeeded if each exited 0)."""
    def phase(policy: str, container: dict, exit_code: int) -> str:
        p = pod(restartPolicy=policy, containers=[{"name": "c", "image": "img:1", **container}])
        state = runtime_pod(container_status_exited(exit_code))
        return pod_status.pod_status(p, state, SyncResult(), host_ip=None, runtime_name="x")["phase"]

    def container_status_exited(code: int) -> api_pb2.ContainerStatus:
        return container("c1", api_pb2.CONTAINER_EXITED, 0, exit_code=code)

    rule = {"restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}
    assert phase("Always", {"restartPolicy": "Never"}, 0) == "Succeeded"
    assert phase("Always", {"restartPolicy": "Never"}, 1) == "Failed"
    assert phase("Never", {"restartPolicy": "Always"}, 0) == "Running"
    assert phase("Never", {"restartPolicy": "Never", **rule}, 42) == "Running"
    assert phase("Never", {"restartPolicy": "Never", **rule}, 1) == "Failed"
    assert phase("Never", {"restartPolicy": "OnFailure"}, 0) == "Succeeded"


ALL_ON_42 = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]


def test_a_restart_all_containers_rule_resets_the_pod_in_place(tmp_path):
    """As the [NodeConformance] spec "Pod Extended (RestartAllContainers) should restart all containers on
    regular container exit" (test/e2e/common/node/container_restart_policy.go): the exit by the rule is
    written first (AllContainersRestarting True), then every init and regular container is killed (without
    grace) and removed, the one that exited last; the status says each was removed (RestartingAllContainers,
    one restart more) and the pod runs again from its first init container, each container at the restart
    count its status shows and with that last termination, in the same sandbox."""
    from pykubelet.pods.workers import PodWorkers

    cache, rt, client, events = Cache(), FakeCRI(), ApiClient(), Events()
    rt.add_image("sha256:i", "img:1")
    workers = PodWorkers(client, rt, Settings(root_dir=tmp_path, pod_logs_dir=tmp_path / "logs"), cache,
                         events=events)  # type: ignore[arg-type]  # a recorder's event() is all the workers call
    raw: dict = {"metadata": {"name": "web", "namespace": "ns", "uid": UID},
                 "spec": {"restartPolicy": "Never",
                          "initContainers": [{"name": "init", "image": "img:1"},
                                             {"name": "sidecar", "image": "img:1", "restartPolicy": "Always"}],
                          "containers": [{"name": "source", "image": "img:1", "restartPolicy": "Never",
                                          "restartPolicyRules": ALL_ON_42},
                                         {"name": "regular", "image": "img:1"}]}}
    workers._on_pod("ADDED", None, cache.put(raw))
    workers.sync(UID)
    rt.exit("init-0", 0)
    workers.sync(UID)
    assert rt.started == ["init-0", "sidecar-0", "source-0", "regular-0"]
    sandboxes = set(rt.sandboxes)
    rt.exit("source-0", 42)
    before = len(client.patches)
    assert workers.sync(UID) == 0.0  # at once: the pod runs again without waiting for an event
    marked, reset = client.patches[before:]
    restarting = conditions_of(marked["status"])["AllContainersRestarting"]
    assert (restarting["status"], restarting["reason"], restarting["message"]) == (
        "True", "RestartAllContainersStarted", "container exited with restart policy rule")
    assert marked["status"]["phase"] == "Running"
    assert [c for c in rt.calls if c[0] in ("StopContainer", "RemoveContainer")] == [
        ("StopContainer", "regular-0", 2), ("RemoveContainer", "regular-0"), ("RemoveContainer", "init-0"),
        ("StopContainer", "sidecar-0", 2), ("RemoveContainer", "sidecar-0"), ("RemoveContainer", "source-0")]
    assert ("Normal", "Killing", "killing") in events.seen
    status = reset["status"]
    assert conditions_of(status)["AllContainersRestarting"]["status"] == "False"
    assert conditions_of(status)["Initialized"]["status"] == "True"  # initialized once, it stays so
    for s in status["initContainerStatuses"] + status["containerStatuses"]:
        assert s["state"] == {"waiting": {"reason": "RestartingAllContainers",
                                          "message": "The container is removed because RestartAllContainers in place"}}
        assert s["lastState"]["terminated"]["reason"] == "RestartingAllContainers"
        assert (s["restartCount"], s["lastState"]["terminated"]["exitCode"]) == (1, 137)
    assert workers.sync(UID) is None
    assert rt.started[4:] == ["init-1"] and set(rt.sandboxes) == sandboxes  # no new sandbox
    rt.exit("init-1", 0)
    workers.sync(UID)
    assert rt.started[5:] == ["sidecar-1", "source-1", "regular-1"]
    status = workers.statuses.last(UID)
    assert status["phase"] == "Running"
    assert conditions_of(status)["AllContainersRestarting"]["status"] == "False"
    for s in status["initContainerStatuses"] + status["containerStatuses"]:
        assert s["restartCount"] == 1 and s["lastState"]["terminated"]["reason"] == "RestartingAllContainers"
    rt.exit("source-1", 0)  # no rule matches: its own policy, Never, and nothing else restarts
    workers.sync(UID)
    assert rt.started[8:] == []
    source = workers.statuses.last(UID)["containerStatuses"][0]
    assert source["state"]["terminated"]["exitCode"] == 0 and source["restartCount"] == 1


def test_restart_all_containers_status_across_a_reset():
    """The status of a pod with a RestartAllContainers rule (the kubelet's GenerateAllContainersRestartingCondition
    and convertToAPIContainerStatuses): the condition True from the exit by the rule until the runtime has
    none of its containers; each container the reset removed waits with one restart more; a restart count
    never goes down; a pod without such a rule has no such condition; a finished pod says why it is False."""
    p = pod(restartPolicy="Never", containers=[
        {"name": "c", "image": "img:1", "restartPolicy": "Never", "restartPolicyRules": ALL_ON_42},
        {"name": "w", "image": "img:1"}])
    exited = named("c", "c1", api_pb2.CONTAINER_EXITED, exit_code=42)
    exited.annotations[RESTART_COUNT] = "2"
    marked = pod_status.pod_status(p, runtime_pod(exited, named("w", "w1", api_pb2.CONTAINER_RUNNING)), SyncResult(),
                                   host_ip=None, runtime_name="x", last={})
    assert conditions_of(marked)["AllContainersRestarting"]["status"] == "True" and marked["phase"] == "Running"
    empty = runtime_pod()
    assert pod_status.carried_restarts(p, empty, marked) == {"c": 3, "w": 1}
    reset = pod_status.pod_status(p, empty, SyncResult(), host_ip=None, runtime_name="x", last=marked)
    assert reset["phase"] == "Running"  # restarting, not ended
    assert conditions_of(reset)["AllContainersRestarting"] == {"type": "AllContainersRestarting", "status": "False"}
    assert [s["restartCount"] for s in reset["containerStatuses"]] == [3, 1]
    assert pod_status.carried_restarts(p, empty, reset) == {"c": 3, "w": 1}  # counted once
    again = named("c", "c2", api_pb2.CONTAINER_RUNNING)
    again.annotations[RESTART_COUNT] = "3"
    running = pod_status.pod_status(p, runtime_pod(again), SyncResult(), host_ip=None, runtime_name="x", last=reset)
    c, w = running["containerStatuses"]
    assert (c["restartCount"], c["lastState"]["terminated"]["reason"], "running" in c["state"]) == (
        3, "RestartingAllContainers", True)
    assert (w["restartCount"], w["state"]["waiting"]["reason"]) == (1, "ContainerCreating")
    assert conditions_of(running)["AllContainersRestarting"]["status"] == "False"
    assert "AllContainersRestarting" not in conditions_of(
        pod_status.pod_status(pod(), runtime_pod(), SyncResult(), host_ip=None, runtime_name="x", last={}))
    failed = parse_pod({**p.raw, "status": {"phase": "Failed"}})
    assert conditions_of(pod_status.pod_status(failed, empty, SyncResult(), host_ip=None, runtime_name="x",
                                               last=marked))["AllContainersRestarting"]["reason"] == "PodFailed"
