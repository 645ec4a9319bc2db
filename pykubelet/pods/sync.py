"""SyncPod: one level-triggered pass that makes the runtime hold what a pod asks for.

The runtime is the record of what runs, not a memory of this process: every container and sandbox carries
the kubelet's labels (pod name/namespace/uid, container name) and annotations (the spec hash, the restart
count), and each pass reads them back and compares. So a kubelet that restarts, or crashes between two
calls, picks up where it was, and a container whose spec hash did not change is never recreated
(upstream's kubernetes#23104): only a spec change, an exited container that the restart policy restarts,
or a sandbox that died makes it act. Each pass does at most what is due now and says when to come back
(a back-off ending, an init container still running); the PLEG brings it back on container changes.

A pass decides before it acts, as the kubelet's SyncPod: compute_pod_actions (pods/actions.py) says what
is due; this module carries it out (the volumes, the sandbox, the image pulls, env and mounts, the CRI
calls, the hooks, the kubelet's events) and reports what failed as the containers' waiting reasons.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from proto import api_pb2
from pykubelet import dirs
from pykubelet import runtime as cri
from pykubelet.api import quantity
from pykubelet.api.podmodel import Container, ImageSource, Pod
from pykubelet.config import Settings
from pykubelet.durations import go_duration
from pykubelet.errors import FailedPreconditionError
from pykubelet.events import NORMAL, WARNING, EventRecorder, node_ref, pod_ref
from pykubelet.images import pullsecrets
from pykubelet.images.keyring import PullSecretError
from pykubelet.node import hostfacts
from pykubelet.node.status import NETWORK_NOT_READY, runtime_problems
from pykubelet.pods import dns, hosts, lifecycle, securitycontext, terminationmessage, userns
from pykubelet.pods.actions import (
    CRASH_LOOP,
    BackOff,
    CannotStart,
    KillContainer,
    KillReason,
    PodActions,
    Probes,
    ResetContainer,
    ResizeContainer,
    ResizePod,
    StartContainer,
    Step,
    after_kill,
    compute_pod_actions,
)
from pykubelet.pods.backoff import Backoff
from pykubelet.pods.criconfig import container_config, linux_resources, log_directory, sandbox_config
from pykubelet.pods.podspec import is_finished, parse_quantity, plain_env
from pykubelet.pods.runtimepod import RuntimePod, observe, pod_ip
from pykubelet.volumes.errors import ContainerConfigError, VolumeError
from pykubelet.volumes.manager import pod_dir
from pynode_os.files import NONE, atomic_write
from pynode_os.systemd import SystemdError

if TYPE_CHECKING:
    from pykubelet.pods.allocation import AllocationManager
    from pykubelet.pods.env import EnvSource
    from pykubelet.pods.nodecgroups import NodeCgroups
    from pykubelet.volumes.manager import VolumeManager

log = logging.getLogger(__name__)


class SyncError(FailedPreconditionError):
    """A step failed in a way the pod's status shows: `reason` is the container's waiting reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class SyncResult:
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)  # container -> (reason, message)
    requeue_after: float | None = None
    init_failed: bool = False
    resize_error: str | None = None  # why an accepted resize was not actuated (PodResizeInProgress, Error)

    def again_in(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


def network_problem(runtime: cri.CRIRuntime) -> str:
    """Why the runtime cannot give a pod its network now ('' if it can, or cannot say: RunPodSandbox will)."""
    return next((p for p in runtime_problems(runtime, "") if p.startswith(NETWORK_NOT_READY)), "")


class PodSyncer:
    """Runs SyncPod passes against one runtime; shared by every pod worker (its state is the back-offs)."""

    def __init__(self, runtime: cri.CRIRuntime, settings: Settings, backoff: Backoff | None = None,
                 image_backoff: Backoff | None = None, events: EventRecorder | None = None,
                 probes: Probes | None = None, volumes: VolumeManager | None = None,
                 env: EnvSource | None = None, allocations: AllocationManager | None = None,
                 cgroups: NodeCgroups | None = None, memory_capacity: int | None = None) -> None:
        self.runtime, self.settings, self.events = runtime, settings, events
        # the node's memory (None: MemTotal, as its status's capacity), which Burstable oom scores are shares of
        self.memory_capacity = hostfacts.meminfo()["MemTotal"] if memory_capacity is None else memory_capacity
        self.cgroups = cgroups  # the pods' cgroups with their limits; None: the runtime makes them, unlimited
        self.probes = probes  # None: no probes, every running container is started and healthy
        self.volumes = volumes  # None: no volumes
        self.env = env  # None: the env's plain values only
        self.allocations = allocations  # None: no resize (the pod's spec is what its containers have)
        self.backoff = backoff or Backoff()
        self.image_backoff = image_backoff or Backoff()
        self._pull_lock = threading.Lock() if settings.serialize_image_pulls else None
        # "UID/image/IMAGE" -> when the pod's last pull of IMAGE failed: per pod, as the kubelet's image back-off,
        # so that a pod that can't pull an image (no pull secret) never holds back another pod that can
        self._failed_pulls: dict[str, float] = {}
        self.userns = userns.UserNamespaces(settings.root_dir / "pods")

    def _user_namespace(self, pod: Pod) -> int | None:
        """The pod's host id range for hostUsers: false, once the runtime says it can make such a pod: the
        stock kubelet's check, so that the pod is never run in the host's user namespace instead."""
        if pod.spec.host_users:
            return None
        handlers = self.runtime.status().runtime_handlers
        if not any(h.name == "" and h.features.user_namespaces for h in handlers):
            raise userns.UserNamespaceError("spec.hostUsers: false: the container runtime does not support user "
                                            "namespaces (no features.user_namespaces in its Status)")
        return self.userns.host_range(pod)

    def forget(self, uid: str) -> None:
        """Drops the image pull back-offs of a pod gone from the node."""
        self.image_backoff.forget_prefix(uid + "/")
        for key in list(self._failed_pulls):  # one C call: other pods' threads may add keys meanwhile
            if key.startswith(uid + "/"):
                self._failed_pulls.pop(key, None)

    def event(self, pod: Pod, container: str | None, type_: str, reason: str, message: str) -> None:
        """An event about `pod`, or about its (init, regular or ephemeral) container `container`."""
        if self.events is not None:
            self.events.event(pod_ref(pod, container), type_, reason, message)

    # --- images -----------------------------------------------------------------------------------

    def ensure_image(self, pod: Pod, container: Container, sandbox: api_pb2.PodSandboxConfig) -> str:
        """The image's reference, pulled if the pull policy says so, with the kubelet's Pulling / Pulled
        events; raises SyncError (ErrImagePull, ImagePullBackOff, ErrImageNeverPull)."""
        return self._ensure(pod, container.name, container.image, container.image_pull_policy, sandbox)

    def ensure_image_volumes(self, pod: Pod, container: Container, sandbox: api_pb2.PodSandboxConfig,
                             pulled: dict[str, str]) -> dict[str, str]:
        """The reference of each image volume `container` mounts, by volume name, pulled as ensure_image pulls
        (the events are the pod's, as the kubelet's getImageVolumes) unless in `pulled`, this pass's: a volume
        two starting containers mount is pulled once a pass, as the kubelet's, not once per container."""
        wanted = {vm.name for vm in container.volume_mounts}
        for v in pod.spec.volumes:
            if v.name in wanted and v.name not in pulled and isinstance(v.source, ImageSource):
                pulled[v.name] = self._ensure(pod, None, v.source.reference, v.source.pull_policy, sandbox)
        return {name: ref for name, ref in pulled.items() if name in wanted}

    def _ensure(self, pod: Pod, name: str | None, image: str, policy: str, sandbox: api_pb2.PodSandboxConfig) -> str:
        if policy != "Always":
            present = self.runtime.image_status(image).image
            if present.ByteSize():
                self.event(pod, name, NORMAL, "Pulled",
                           f'Container image "{image}" already present on machine and can be accessed by the pod')
                return present.id
            if policy == "Never":
                raise SyncError("ErrImageNeverPull",
                                f'Container image "{image}" is not present with pull policy of Never')
        key = f"{pod.uid}/image/{image}"
        wait = self.image_backoff.remaining(key, self._failed_pulls.get(key, 0.0))
        if wait > 0:
            raise SyncError("ImagePullBackOff", f'Back-off pulling image "{image}"')
        self.event(pod, name, NORMAL, "Pulling", f'Pulling image "{image}"')
        asked = began = time.monotonic()
        try:
            creds = pullsecrets.for_image(self.volumes.client if self.volumes is not None else None, pod, image)
            if creds.missing:
                self.event(pod, None, WARNING, "FailedToRetrieveImagePullSecret",
                           f"Unable to retrieve some image pull secrets ({', '.join(creds.missing)}); "
                           "attempting to pull the image may not succeed.")
            if self._pull_lock is not None:
                with self._pull_lock:
                    began = time.monotonic()
                    ref = self._pull(image, sandbox, creds.auths)
            else:
                ref = self._pull(image, sandbox, creds.auths)
        except (cri.CRIError, PullSecretError) as e:
            self._failed_pulls[key] = time.time()
            self.image_backoff.restarted(key)
            raise SyncError("ErrImagePull", f'Failed to pull image "{image}": '
                                            f"{e.details if isinstance(e, cri.CRIError) else e}") from e
        done = time.monotonic()
        self._failed_pulls.pop(key, None)
        try:
            size = self.runtime.image_status(ref).image.size
        except cri.CRIError:
            size = 0
        self.event(pod, name, NORMAL, "Pulled", f'Successfully pulled image "{image}" in {go_duration(done - began)} '
                   f"({go_duration(done - asked)} including waiting). Image size: {size} bytes.")
        return ref

    def _pull(self, image: str, sandbox: api_pb2.PodSandboxConfig, auths: list[api_pb2.AuthConfig]) -> str:
        """Each of the pod's matching credentials in turn until one pull succeeds, as the kubelet; with none,
        one pull without an AuthConfig (the runtime's own credentials for that registry)."""
        if not auths:
            return self.runtime.pull_image(image, sandbox_config=sandbox)
        errors = []
        for auth in auths:
            try:
                return self.runtime.pull_image(image, auth, sandbox_config=sandbox)
            except cri.CRIError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        raise cri.CRIError(errors[-1].rpc, errors[-1].code, "[" + ", ".join(e.details for e in errors) + "]")

    # --- the pass ---------------------------------------------------------------------------------

    def sync(self, pod: Pod, state: RuntimePod, restarts: Mapping[str, int] | None = None) -> SyncResult:
        """One pass over `pod`, given what the runtime has of it: the volumes, then the
        steps compute_pod_actions decides, carried out in order. `restarts`: the restart count the pod's
        status shows of each container the runtime has none of (pods/status.py's carried_restarts)."""
        result = SyncResult()
        if not is_finished(pod) and not self._mount_volumes(pod, result, starting=state.sandbox is None) \
                and state.sandbox is None:
            return result  # the sandbox waits for the volumes, as the kubelet's
        actuated = self.allocations.actuated.get(pod.uid) if self.allocations is not None else None
        actions = compute_pod_actions(pod, state, self.probes, self.backoff, actuated, restarts)
        if actions.create_sandbox:
            made = self._create_sandbox(pod, state, actions, result)
            if made is None:
                return result
            state, sandbox_cfg = made
            actions = compute_pod_actions(pod, state, self.probes, self.backoff,  # its containers, in it
                                          restarts=restarts)
            if self.allocations is not None:  # the pod's cgroup was made with its allocated pod-level resources
                self.allocations.actuated.set_pod(pod.uid, pod.spec.resources)
        elif state.sandbox is None:
            return result  # a finished pod is not brought back
        else:  # the range the sandbox was made with, from the pod's record (its containers join that namespace)
            attempt, host_range = state.sandbox.metadata.attempt, self.userns.host_range(pod)
            # as the kubelet's: the config (and the DNS with its warnings) is formed again only for a start,
            # and no container starts without it
            starting = any(isinstance(step, StartContainer) for step in actions.steps)
            try:
                sandbox_cfg = (self._sandbox_config(pod, attempt, host_range) if starting
                               else sandbox_config(pod, self.settings, attempt=attempt, host_range=host_range))
            except (dns.DNSError, hosts.HostnameError) as e:
                log.warning("pod %s: the sandbox's config: %s", pod.key, e)
                result.again_in(10.0)
                return result
        self._carry_out(pod, state, actions, sandbox_cfg, result)
        return result

    def _create_sandbox(self, pod: Pod, state: RuntimePod, actions: PodActions,
                        result: SyncResult) -> tuple[RuntimePod, api_pb2.PodSandboxConfig] | None:
        """Stops the dead sandboxes and makes the new one; the runtime's state with it and its config, or None
        (and the containers' waiting reasons) when it was not made."""
        spec = pod.spec
        for old in actions.sandboxes_to_stop:  # a dead sandbox: its containers go with it
            self._stop_sandbox(old, state)
        if not spec.host_network and (why := network_problem(self.runtime)):
            # as the kubelet's: no sandbox is made (and undone, every pass) on a network that is not there
            for c in spec.all_containers:
                result.waiting[c.name] = ("ContainerCreating", f"network is not ready: {why}")
            self.event(pod, None, WARNING, "NetworkNotReady", f"network is not ready: {why}")
            result.again_in(2.0)
            return None
        try:
            host_range = self._user_namespace(pod)
        except userns.UserNamespaceError as e:
            for c in spec.containers:
                result.waiting[c.name] = ("ContainerCreating", f"failed to create the pod sandbox: {e}")
            self.event(pod, None, WARNING, "FailedCreatePodSandBox", str(e))
            result.again_in(10.0)
            return None
        try:
            sandbox_cfg = self._sandbox_config(pod, actions.sandbox_attempt, host_range)
        except (dns.DNSError, hosts.HostnameError) as e:
            for c in spec.containers:
                result.waiting[c.name] = ("ContainerCreating", f"failed to create the pod sandbox: {e}")
            self.event(pod, None, WARNING, "FailedCreatePodSandBox", f"Failed to create pod sandbox: {e}")
            result.again_in(10.0)
            return None
        log_directory(pod, self.settings).mkdir(parents=True, exist_ok=True)
        try:
            if self.cgroups is not None:
                self.cgroups.ensure_pod(pod)
        except (SystemdError, OSError) as e:
            log.warning("pod %s: its cgroup: %s", pod.metadata.name, e)
            for c in spec.containers:
                result.waiting[c.name] = ("ContainerCreating", f"failed to create the pod's cgroup: {e}")
            self.event(pod, None, WARNING, "FailedCreatePodSandBox", f"failed to create the pod's cgroup: {e}")
            result.again_in(10.0)
            return None
        try:
            sandbox_id = self.runtime.run_pod_sandbox(sandbox_cfg)
        except cri.CRIError as e:
            log.warning("pod %s: RunPodSandbox: %s", pod.metadata.name, e)
            for c in spec.containers:
                result.waiting[c.name] = ("ContainerCreating", f"failed to create the pod sandbox: {e.details}")
            result.again_in(2.0)
            return None
        log.info("pod %s: sandbox %s", pod.key, sandbox_id[:12])
        state = observe(self.runtime, pod.uid)
        if state.sandbox is None:
            result.again_in(1.0)
            return None
        return state, sandbox_cfg

    def _sandbox_config(self, pod: Pod, attempt: int, host_range: int | None) -> api_pb2.PodSandboxConfig:
        """The sandbox's config with the pod's DNS, the host's resolv.conf read now; the kubelet's warnings on
        the way (limits exceeded, no cluster DNS) recorded. Raises dns.DNSError and hosts.HostnameError."""
        found = dns.pod_dns(pod, cluster_dns=self.settings.cluster_dns, cluster_domain=self.settings.cluster_domain,
                            host=dns.read_resolv_conf(self.settings.resolv_conf),
                            node_ips=[self.settings.node_ip] if self.settings.node_ip else [])
        for reason, message in found.pod_events:
            self.event(pod, None, WARNING, reason, message)
        if self.events is not None:
            for reason, message in found.node_events:
                self.events.event(node_ref(self.settings.node_name), WARNING, reason, message)
        return sandbox_config(pod, self.settings, attempt=attempt, host_range=host_range, dns=found)

    def _carry_out(self, pod: Pod, state: RuntimePod, actions: PodActions, sandbox_cfg: api_pb2.PodSandboxConfig,
                   result: SyncResult) -> None:
        """The steps in order; a kill's follow-up is decided once it is done, and a start that failed, when the
        steps after it wait for it, ends the pass (and with it the plan's verdict on the init containers)."""
        assert state.sandbox is not None
        sandbox_id = state.sandbox.id
        steps, whole = list(actions.steps), True
        result.resize_error = self._memory_decreases(pod, steps, state)
        if result.resize_error is not None:  # as the kubelet's: no part of the resize is done
            steps = [s for s in steps if not isinstance(s, ResizeContainer | ResizePod)]
            result.again_in(10.0)
        resizes = [s for s in steps if isinstance(s, ResizeContainer | ResizePod)]
        shrinking = {s.resource if isinstance(s, ResizeContainer) else r
                     for s in resizes if s.decrease for r in ("cpu", "memory")}
        if resizes:  # what grows, in the pod's cgroup first: on cgroup v1 a child's CFS quota must fit its parent's
            self._resize_pod_cgroup(pod, result, leave=frozenset(shrinking))
        restart_sizes_cgroup = actions.resize_pod_cgroup and not resizes
        image_volumes: dict[str, str] = {}  # volume name -> the image pulled for it this pass
        while steps:
            step = steps.pop(0)
            if isinstance(step, ResizeContainer | ResizePod):
                if not self._resize(pod, step, sandbox_id, result):
                    steps = [s for s in steps if not isinstance(s, ResizeContainer | ResizePod)]
            elif isinstance(step, KillContainer):
                after = self._kill(pod, step, state)
                if after is not None:
                    more, halt = after_kill(pod, state, step, after, self.probes, self.backoff)
                    steps = more if halt else more + steps
                    whole = whole and not halt
            elif isinstance(step, BackOff):
                meta = pod.metadata
                result.waiting[step.name] = (CRASH_LOOP, step.message)
                self.event(pod, step.name, WARNING, "BackOff", "Back-off restarting failed container "
                           f"{step.name} in pod {meta.name}_{meta.namespace}({meta.uid})")
                result.again_in(step.wait)
            elif isinstance(step, StartContainer):
                if restart_sizes_cgroup:  # once the container it replaces is gone, before the new one is made
                    self._resize_pod_cgroup(pod, result)
                    restart_sizes_cgroup = False
                if not self._start(pod, step, sandbox_id, sandbox_cfg, result, state, image_volumes) \
                        and step.halt_unless_started:
                    return
            elif isinstance(step, CannotStart):
                result.waiting[step.name] = (step.reason, step.message)
                self.event(pod, step.name, WARNING, "Failed", f"Error: {step.message}")
                result.again_in(2.0)
            elif isinstance(step, ResetContainer):
                self._reset(pod, step)
                result.again_in(0.0)  # as the kubelet's: the pod runs again at once, not at the next event
            else:
                for container_id in step.container_ids:
                    self._remove(container_id)
        if shrinking and result.resize_error is None:  # what shrinks, after its containers did
            self._resize_pod_cgroup(pod, result)
        result.init_failed = whole and actions.init_failed

    def _resize_pod_cgroup(self, pod: Pod, result: SyncResult, leave: frozenset[str] = frozenset()) -> None:
        """The pod's cgroup to its resized limits but those of `leave` ("cpu", "memory"), as the kubelet's
        doPodResizeAction sets the pod's cgroup config; a failure is the pod's resize error."""
        if self.cgroups is None:
            return
        try:
            self.cgroups.update_pod(pod, leave)
        except (SystemdError, OSError) as e:
            log.warning("pod %s: resize: the pod's cgroup: %s", pod.key, e)
            result.resize_error = str(e)
            result.again_in(10.0)

    def _memory_decreases(self, pod: Pod, steps: list[Step], state: RuntimePod) -> str | None:
        """Why the plan's memory limit decreases cannot be done now (None: they can), as the kubelet's
        validateMemoryResizeAction: a limit at or below what the pod or the container uses would have it
        OOM-killed, so the resize waits (PodResizeInProgress, Error) until the usage is lower or the resize is
        undone. The pod's usage is its running containers' together."""
        errors = []
        for step in steps:
            if isinstance(step, ResizePod) and step.limit_decrease:
                limit = quantity.value(parse_quantity(step.resources.limits["memory"]))
                usage = self._pod_memory_usage(state)
                if usage is None:
                    errors.append("missing pod memory usage")
                elif usage >= limit:
                    errors.append(f"attempting to set pod memory limit ({limit}) below current usage ({usage})")
        for step in steps:
            if not (isinstance(step, ResizeContainer) and step.limit_decrease):
                continue
            limit = linux_resources(step.resources, pod.spec.resources).memory_limit_in_bytes
            used = self._memory_usage(step.container_id)
            if used is None:
                errors.append(f'missing container "{step.name}" memory usage')
            elif used >= limit:
                errors.append(f'attempting to set container "{step.name}" memory limit ({limit}) below current '
                              f"usage ({used})")
        if not errors:
            return None
        return "cannot decrease memory limits: " + (errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")

    def _pod_memory_usage(self, state: RuntimePod) -> int | None:
        """The memory the pod's running containers use together (None: the runtime could not say for one)."""
        used = [self._memory_usage(c.id) for c in state.containers if c.state == api_pb2.CONTAINER_RUNNING]
        return None if None in used else sum(u for u in used if u is not None)

    def _memory_usage(self, container_id: str) -> int | None:
        """The container's memory usage as the runtime's stats give it (None: they do not)."""
        try:
            memory = self.runtime.container_stats(container_id).memory
        except cri.CRIError:
            return None
        return memory.usage_bytes.value if memory.HasField("usage_bytes") else None

    def _resize(self, pod: Pod, step: ResizeContainer | ResizePod, sandbox_id: str, result: SyncResult) -> bool:
        """One in-place resize, recorded as actuated once the runtime took it; False (and the pod's resize
        error) if it refused, and the resizes after it wait for the next pass, as the kubelet's."""
        assert self.allocations is not None  # only planned against its records
        try:
            if isinstance(step, ResizePod):
                try:
                    self.runtime.update_pod_sandbox_resources(sandbox_id, linux_resources(step.resources))
                except cri.Unimplemented:  # as the kubelet's: a runtime without it sizes no pod cgroup by it
                    log.debug("pod %s: the runtime has no UpdatePodSandboxResources", pod.key)
                self.allocations.actuated.set_pod(pod.uid, step.resources)
                return True
            self.runtime.update_container_resources(step.container_id,
                                                    linux_resources(step.resources, pod.spec.resources))
        except cri.CRIError as e:
            log.warning("pod %s: resize: %s", pod.key, e)
            result.resize_error = e.details
            result.again_in(10.0)
            return False
        log.info("pod %s: container %s: %s resized in place", pod.key, step.name, step.resource)
        self.allocations.actuated.set_container(pod.uid, step.name, step.resources)
        return True

    def _kill(self, pod: Pod, kill: KillContainer, state: RuntimePod) -> api_pb2.ContainerStatus | None:
        """Stops the container (its preStop first); its status after, when what follows depends on it."""
        name = pod.metadata.name
        if kill.reason is KillReason.POD_DONE:
            log.info("pod %s: stopping sidecar %s", name, kill.name)
        elif kill.reason is KillReason.SPEC_CHANGED:
            log.info("pod %s: container %s changed: recreating", name, kill.name)
        elif kill.reason is KillReason.RESIZED:
            log.info("pod %s: container %s resized: restarting", name, kill.name)
        else:
            log.info("pod %s: %s", name, kill.message)
        lifecycle.stop_container(self.runtime, pod, kill.name, kill.container_id, kill.grace,
                                 pod_ip(pod, state, self.settings.node_ip), self.event, kill.message)
        if kill.reason is KillReason.POD_DONE:
            return None
        return self.runtime.container_status(kill.container_id).status

    def _reset(self, pod: Pod, step: ResetContainer) -> None:
        """Removes a container for RestartAllContainers, killed first if it runs: as the kubelet's, without
        the pod's grace or a preStop hook (only the minimum grace), the Killing event saying "killing"."""
        if step.kill:
            log.info("pod %s: RestartAllContainers: killing container %s", pod.key, step.name)
            self.event(pod, step.name, NORMAL, "Killing", "killing")
            try:
                self.runtime.stop_container(step.container_id, lifecycle.MIN_GRACE)
            except cri.NotFound:
                pass
        self._remove(step.container_id)

    def _start(self, pod: Pod, step: StartContainer, sandbox_id: str, sandbox_cfg: api_pb2.PodSandboxConfig,
               result: SyncResult, state: RuntimePod, pulled_volumes: dict[str, str]) -> bool:
        """Makes and starts the container; True if it started. `pulled_volumes`: see ensure_image_volumes."""
        name = step.name
        container = pod.container(name)
        if step.backoff_key is not None:
            self.backoff.restarted(step.backoff_key)
        if step.remove_first is not None:
            self._remove(step.remove_first)
        try:
            image_ref = self.ensure_image(pod, container, sandbox_cfg)
            image_volumes = self.ensure_image_volumes(pod, container, sandbox_cfg, pulled_volumes)
        except SyncError as e:
            result.waiting[name] = (e.reason, str(e))
            # the image manager's event, then the container's "Error: REASON", as the kubelet's
            if e.reason == "ImagePullBackOff":
                self.event(pod, name, NORMAL, "BackOff", str(e))
            else:
                self.event(pod, name, WARNING, "Failed" if e.reason == "ErrImagePull" else e.reason, str(e))
            self.event(pod, name, WARNING, "Failed", f"Error: {e.reason}")
            result.again_in(self.image_backoff.initial)
            return False
        try:
            envs, mounts = self._container_options(pod, container, sandbox_id, image_volumes)
            securitycontext.check_run_as_non_root(pod, container, lambda: self._image(image_ref))
        except ContainerConfigError as e:
            result.waiting[name] = ("CreateContainerConfigError", str(e))
            self.event(pod, name, WARNING, "Failed", f"Error: {e}")
            result.again_in(2.0)
            return False
        config = container_config(pod, container, image_ref, step.attempt, sandbox_cfg,
                                  memory_capacity=self.memory_capacity, envs=envs, mounts=mounts,
                                  target_id=step.target_id)
        try:
            cid = self.runtime.create_container(sandbox_id, config, sandbox_cfg)
        except cri.CRIError as e:
            result.waiting[name] = ("CreateContainerError", e.details)
            self.event(pod, name, WARNING, "Failed", f"Error: {e.details}")
            result.again_in(self.backoff.initial)
            return False
        self.event(pod, name, NORMAL, "Created", f"Created container: {name}")
        if self.allocations is not None:  # made with its allocation: what it has until resized
            self.allocations.actuated.set_container(pod.uid, name, container.resources)
        try:
            self.runtime.start_container(cid)
        except cri.CRIError as e:
            result.waiting[name] = ("RunContainerError", e.details)
            self.event(pod, name, WARNING, "Failed", f"Error: {e.details}")
            result.again_in(self.backoff.initial)
            return False
        log.info("pod %s: started container %s (%s, restart %d)", pod.key, name, cid[:12], step.attempt)
        self.event(pod, name, NORMAL, "Started", f"Started container {name}")
        failed = lifecycle.post_start(self.runtime, pod, container, cid, pod_ip(pod, state, self.settings.node_ip),
                                      self.event)
        if failed is not None:
            result.waiting[name] = ("PostStartHookError", failed)
            result.again_in(self.backoff.initial)
            return False
        return True

    def _image(self, image_ref: str) -> api_pb2.Image:
        """The image's ImageStatus, for the checks that depend on its config (its user)."""
        try:
            return self.runtime.image_status(image_ref).image
        except cri.CRIError as e:
            raise ContainerConfigError(f"failed to get the image's status: {e.details}") from e

    def _mount_volumes(self, pod: Pod, result: SyncResult, starting: bool) -> bool:
        """Sets up or refreshes the pod's volumes; on failure a FailedMount event, and a pod not started
        yet waits in ContainerCreating."""
        if self.volumes is None:
            return True
        try:
            self.volumes.mount_pod(pod)
            return True
        except VolumeError as e:
            self.event(pod, None, WARNING, "FailedMount", str(e))
            if starting:
                for c in pod.spec.all_containers:
                    result.waiting[c.name] = ("ContainerCreating", str(e))
            result.again_in(2.0)
            return False

    def _container_options(self, pod: Pod, container: Container, sandbox_id: str,
                           images: Mapping[str, str]) -> tuple[dict[str, str] | None, list[api_pb2.Mount]]:
        """The container's resolved env (None: its plain values) and its mounts: its volumes (`images`: the
        pulled references of its image volumes), the kubelet's /etc/hosts and its termination message file, as
        the kubelet's GenerateRunContainerOptions."""
        network = self.runtime.pod_sandbox_status(sandbox_id).status.network
        ips = [ip for ip in [network.ip, *(a.ip for a in network.additional_ips)] if ip]
        env = None
        if self.env is not None:
            env = self.env.resolve(
                pod, container, pod_ips=ips,
                warn=lambda reason, message: self.event(pod, container.name, WARNING, reason, message))
        mounts = [] if self.volumes is None else \
            self.volumes.mounts(pod, container, plain_env(container) if env is None else env, images)
        base = pod_dir(self.settings.root_dir, pod.uid)
        try:
            if hosts.mounts_hosts(pod, container, ips):
                mounts.append(self._hosts_mount(pod, base, ips))
            if container.termination_message_path:
                mounts.append(api_pb2.Mount(container_path=container.termination_message_path,
                                            host_path=str(terminationmessage.new_file(base, container.name))))
        except (hosts.HostnameError, OSError) as e:
            raise ContainerConfigError(str(e)) from e
        return env, mounts

    def _hosts_mount(self, pod: Pod, base: Path, ips: list[str]) -> api_pb2.Mount:
        """The pod's hosts file brought up to date (rewritten only when it changed, so that the containers
        that have it see one file) and its mount at /etc/hosts (ensureHostsFile, makeHostsMount)."""
        if pod.spec.host_network:
            content = hosts.node_hosts(Path(hosts.ETC_HOSTS).read_bytes(), pod.spec.host_aliases)
        else:
            hostname, domain = hosts.hostname_and_domain(pod, self.settings.cluster_domain)
            content = hosts.managed_hosts(ips, hostname, domain, pod.spec.host_aliases)
        path = hosts.hosts_path(base)
        try:
            current = path.read_bytes()
        except FileNotFoundError:
            current = None
        if current != content:
            dirs.make_dirs(base)
            # no fsync: the file is written again before any container of the pod starts after a reboot
            atomic_write(path, content, mode=0o644, sync=NONE)
        return api_pb2.Mount(container_path=hosts.ETC_HOSTS, host_path=str(path))

    def _remove(self, container_id: str) -> None:
        try:
            self.runtime.remove_container(container_id)
        except cri.NotFound:
            pass

    def _stop_sandbox(self, sandbox_id: str, state: RuntimePod) -> None:
        for c in state.containers:
            if c.pod_sandbox_id == sandbox_id and c.state == api_pb2.CONTAINER_RUNNING:
                try:
                    self.runtime.stop_container(c.id, 0)
                except cri.NotFound:
                    pass
        try:
            self.runtime.stop_pod_sandbox(sandbox_id)
        except cri.NotFound:
            pass
