"""SyncPod: one level-triggered pass that makes the runtime hold what a pod asks for.

The runtime is the record of what runs, not a memory of this process: every container and sandbox carries
the kubelet's labels (pod name/namespace/uid, container name) and annotations (the spec hash, the restart
count), and each pass reads them back and compares. So a kubelet that restarts, or crashes between two
calls, picks up where it was, and a container whose spec hash did not change is never recreated
(upstream's kubernetes#23104): only a spec change, an exited container that the restart policy restarts,
or a sandbox that died makes it act. Each pass does at most what is due now and says when to come back
(a back-off ending, an init container still running); the PLEG brings it back on container changes.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proto import api_pb2
from pykubelet import runtime as cri
from pykubelet.config import Settings
from pykubelet.durations import go_duration
from pykubelet.events import NORMAL, WARNING, EventRecorder, pod_ref
from pykubelet.images import pullsecrets
from pykubelet.images.keyring import PullSecretError
from pykubelet.node.status import NETWORK_NOT_READY, runtime_problems
from pykubelet.pods import lifecycle, securitycontext, userns
from pykubelet.pods.backoff import Backoff
from pykubelet.pods.criconfig import container_config, log_directory, sandbox_config
from pykubelet.pods.labels import CONTAINER_NAME, GRACE, HASH, container_hash, restart_count
from pykubelet.pods.podspec import is_finished, is_init, is_sidecar, restart_policy, termination_grace
from pykubelet.pods.runtimepod import RuntimePod, observe, pod_ip
from pykubelet.volumes.errors import ContainerConfigError, VolumeError

if TYPE_CHECKING:
    from pykubelet.volumes.manager import VolumeManager

log = logging.getLogger(__name__)


class SyncError(Exception):
    """A step failed in a way the pod's status shows: `reason` is the container's waiting reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class SyncResult:
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)  # container -> (reason, message)
    requeue_after: float | None = None
    init_failed: bool = False

    def again_in(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


def network_problem(runtime: cri.CRIRuntime) -> str:
    """Why the runtime cannot give a pod its network now ('' if it can, or cannot say: RunPodSandbox will)."""
    return next((p for p in runtime_problems(runtime, "") if p.startswith(NETWORK_NOT_READY)), "")


class PodSyncer:
    """Runs SyncPod passes against one runtime; shared by every pod worker (its state is the back-offs)."""

    def __init__(self, runtime: cri.CRIRuntime, settings: Settings, backoff: Backoff | None = None,
                 image_backoff: Backoff | None = None, events: EventRecorder | None = None, probes=None,
                 volumes: VolumeManager | None = None) -> None:
        self.runtime, self.settings, self.events = runtime, settings, events
        self.probes = probes  # a pykubelet.prober.manager.ProbeManager: started / kill_reason of containers
        self.volumes = volumes  # None: no volumes, plain env only
        self.backoff = backoff or Backoff()
        self.image_backoff = image_backoff or Backoff()
        self._pull_lock = threading.Lock() if settings.serialize_image_pulls else None
        # "UID/image/IMAGE" -> when the pod's last pull of IMAGE failed: per pod, as the kubelet's image back-off,
        # so that a pod that can't pull an image (no pull secret) never holds back another pod that can
        self._failed_pulls: dict[str, float] = {}
        self.userns = userns.UserNamespaces(settings.root_dir / "pods")

    def _user_namespace(self, pod: dict) -> int | None:
        """The pod's host id range for hostUsers: false, once the runtime says it can make such a pod: the
        stock kubelet's check, so that the pod is never run in the host's user namespace instead."""
        if pod["spec"].get("hostUsers", True) is not False:
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

    def event(self, pod: dict, container: str | None, type_: str, reason: str, message: str) -> None:
        """An event about `pod`, or about its (init or regular) container `container`."""
        if self.events is not None:
            init = container is not None and is_init(pod, container)
            self.events.event(pod_ref(pod, container, init), type_, reason, message)

    # --- images -----------------------------------------------------------------------------------

    def ensure_image(self, pod: dict, container: dict, sandbox: api_pb2.PodSandboxConfig) -> str:
        """The image's reference, pulled if the pull policy says so, with the kubelet's Pulling / Pulled
        events; raises SyncError (ErrImagePull, ImagePullBackOff, ErrImageNeverPull)."""
        image, name = container["image"], container["name"]
        policy = container.get("imagePullPolicy") or (
            "Always" if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest") else "IfNotPresent")
        if policy != "Always":
            present = self.runtime.image_status(image).image
            if present.ByteSize():
                self.event(pod, name, NORMAL, "Pulled",
                           f'Container image "{image}" already present on machine and can be accessed by the pod')
                return present.id
            if policy == "Never":
                raise SyncError("ErrImageNeverPull",
                                f'Container image "{image}" is not present with pull policy of Never')
        key = f"{pod['metadata']['uid']}/image/{image}"
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

    def sync(self, pod: dict, state: RuntimePod) -> SyncResult:
        """One pass over `pod` (a dict of the Pod), given what the runtime has of it."""
        result = SyncResult()
        spec, uid = pod["spec"], pod["metadata"]["uid"]
        sandbox = state.sandbox
        finished = is_finished(pod)
        if not finished and not self._mount_volumes(pod, result, starting=sandbox is None) and sandbox is None:
            return result  # the sandbox waits for the volumes, as the kubelet's
        if sandbox is None:
            if finished:
                return result  # a finished pod is not brought back
            for old in state.sandboxes:  # a dead sandbox: its containers go with it
                self._stop_sandbox(old.id, state)
            if not spec.get("hostNetwork") and (why := network_problem(self.runtime)):
                # as the kubelet's: no sandbox is made (and undone, every pass) on a network that is not there
                for c in spec.get("initContainers", []) + spec.get("containers", []):
                    result.waiting[c["name"]] = ("ContainerCreating", f"network is not ready: {why}")
                self.event(pod, None, WARNING, "NetworkNotReady", f"network is not ready: {why}")
                result.again_in(2.0)
                return result
            try:
                host_range = self._user_namespace(pod)
            except userns.UserNamespaceError as e:
                for c in spec.get("containers", []):
                    result.waiting[c["name"]] = ("ContainerCreating", f"failed to create the pod sandbox: {e}")
                self.event(pod, None, WARNING, "FailedCreatePodSandBox", str(e))
                result.again_in(10.0)
                return result
            sandbox_cfg = sandbox_config(pod, self.settings, attempt=len(state.sandboxes), host_range=host_range)
            log_directory(pod, self.settings).mkdir(parents=True, exist_ok=True)
            try:
                sandbox_id = self.runtime.run_pod_sandbox(sandbox_cfg)
            except cri.CRIError as e:
                log.warning("pod %s: RunPodSandbox: %s", pod["metadata"]["name"], e)
                for c in spec.get("containers", []):
                    result.waiting[c["name"]] = ("ContainerCreating", f"failed to create the pod sandbox: {e.details}")
                result.again_in(2.0)
                return result
            log.info("pod %s/%s: sandbox %s", pod["metadata"]["namespace"], pod["metadata"]["name"], sandbox_id[:12])
            state = observe(self.runtime, uid)
            sandbox = state.sandbox
            if sandbox is None:
                result.again_in(1.0)
                return result
        else:  # the range the sandbox was made with, from the pod's record (its containers join that namespace)
            sandbox_cfg = sandbox_config(pod, self.settings, attempt=sandbox.metadata.attempt,
                                         host_range=self.userns.host_range(pod))
        policy = restart_policy(pod)
        # once a regular container ran in this sandbox, the init containers are done; once they all ended
        # for good, the sidecars go (they never keep a pod from completing)
        initialized = any(self._current(state, c["name"], sandbox.id) is not None for c in spec.get("containers", []))
        finished = initialized and self._finished(pod, state, sandbox.id)
        if finished:
            self._stop_sidecars(pod, state, sandbox.id)
        # init containers, one at a time, in order; each must succeed (a sidecar: start) before the next starts
        for container in spec.get("initContainers", []):
            history = list(state.history(container["name"]))
            current = history[0] if history and self._in(state, history[0], sandbox.id) else None
            if is_sidecar(container):
                if finished:
                    continue
                if current is not None and current.state == api_pb2.CONTAINER_RUNNING:
                    current = self._kill_if_unhealthy(pod, container, current, state)
                if current is not None and current.state == api_pb2.CONTAINER_RUNNING:
                    if initialized or self._started(uid, container["name"], current.id):
                        continue
                    return result  # the next one waits until this one has started (its startup probe)
                started = self._start_or_back_off(pod, container, history, current, sandbox.id, sandbox_cfg,
                                                  result, state)
                if initialized or (started and not container.get("startupProbe")):
                    continue
                return result
            if current is not None and current.state == api_pb2.CONTAINER_EXITED and current.exit_code == 0:
                continue
            if current is not None and current.state in (api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_CREATED):
                return result  # the PLEG brings us back when it exits
            if current is not None and policy == "Never":
                result.init_failed = True
                return result
            self._start_or_back_off(pod, container, history, current, sandbox.id, sandbox_cfg, result, state)
            return result
        for container in spec.get("containers", []):
            history = state.history(container["name"])
            current = history[0] if history and self._in(state, history[0], sandbox.id) else None
            if current is not None and current.state == api_pb2.CONTAINER_RUNNING:
                if current.annotations.get(HASH) == container_hash(container):
                    current = self._kill_if_unhealthy(pod, container, current, state)
                    if current.state == api_pb2.CONTAINER_RUNNING:
                        continue
                else:
                    log.info("pod %s: container %s changed: recreating", pod["metadata"]["name"], container["name"])
                    lifecycle.stop_container(self.runtime, pod, container["name"], current.id,
                                             int(current.annotations.get(GRACE, "30") or 30),
                                             pod_ip(pod, state, self.settings.node_ip), self.event,
                                             f"Container {container['name']} definition changed, will be restarted")
                    current = self.runtime.container_status(current.id).status
                    self._start_or_back_off(pod, container, history, current, sandbox.id, sandbox_cfg, result, state)
                    continue
            if current is not None and current.state != api_pb2.CONTAINER_CREATED:
                succeeded = current.exit_code == 0
                if policy == "Never" or (policy == "OnFailure" and succeeded):
                    continue
            self._start_or_back_off(pod, container, history, current, sandbox.id, sandbox_cfg, result, state)
        self._remove_dead(state)
        return result

    def _current(self, state: RuntimePod, name: str, sandbox_id: str) -> api_pb2.ContainerStatus | None:
        history = state.history(name)
        return history[0] if history and self._in(state, history[0], sandbox_id) else None

    def _finished(self, pod: dict, state: RuntimePod, sandbox_id: str) -> bool:
        """Whether every regular container has ended and the restart policy restarts none of them."""
        policy = restart_policy(pod)
        if policy == "Always":
            return False
        for c in pod["spec"].get("containers", []):
            current = self._current(state, c["name"], sandbox_id)
            if current is None or current.state != api_pb2.CONTAINER_EXITED:
                return False
            if policy == "OnFailure" and current.exit_code != 0:
                return False
        return True

    def _stop_sidecars(self, pod: dict, state: RuntimePod, sandbox_id: str) -> None:
        """The running sidecars of a pod whose regular containers are done: in reverse order, with preStop."""
        grace = termination_grace(pod)
        for container in reversed([c for c in pod["spec"].get("initContainers", []) if is_sidecar(c)]):
            current = self._current(state, container["name"], sandbox_id)
            if current is not None and current.state == api_pb2.CONTAINER_RUNNING:
                log.info("pod %s: stopping sidecar %s", pod["metadata"]["name"], container["name"])
                lifecycle.stop_container(self.runtime, pod, container["name"], current.id, grace,
                                         pod_ip(pod, state, self.settings.node_ip), self.event)

    def _started(self, uid: str, name: str, container_id: str) -> bool:
        return self.probes is None or self.probes.started(uid, name, container_id)

    def _kill_if_unhealthy(self, pod: dict, container: dict, current: api_pb2.ContainerStatus,
                           state: RuntimePod) -> api_pb2.ContainerStatus:
        """Kills a running container that failed its liveness or startup probe; its status after."""
        verdict = self.probes.kill_reason(pod["metadata"]["uid"], container["name"], current.id) \
            if self.probes is not None else None
        if verdict is None:
            return current
        message, grace = verdict
        if grace is None:
            grace = termination_grace(pod)
        log.info("pod %s: %s", pod["metadata"]["name"], message)
        lifecycle.stop_container(self.runtime, pod, container["name"], current.id, grace,
                                 pod_ip(pod, state, self.settings.node_ip), self.event, message)
        return self.runtime.container_status(current.id).status

    @staticmethod
    def _in(state: RuntimePod, status: api_pb2.ContainerStatus, sandbox_id: str) -> bool:
        return any(c.id == status.id and c.pod_sandbox_id == sandbox_id for c in state.containers)

    def _start_or_back_off(self, pod: dict, container: dict, history: list[api_pb2.ContainerStatus],
                           current: api_pb2.ContainerStatus | None, sandbox_id: str,
                           sandbox_cfg: api_pb2.PodSandboxConfig, result: SyncResult, state: RuntimePod) -> bool:
        """Starts the container, unless its back-off is not over; True if it started."""
        name, meta = container["name"], pod["metadata"]
        restart = restart_count(history[0]) + 1 if history else 0
        if current is not None and current.state == api_pb2.CONTAINER_EXITED:
            key = f"{meta['uid']}/{name}/{container_hash(container)}"
            wait = self.backoff.remaining(key, current.finished_at / 1e9)
            if wait > 0:
                delay = self.backoff.current(key)
                result.waiting[name] = ("CrashLoopBackOff", f"back-off {delay:g}s restarting failed container={name} "
                                        f"pod={meta['name']}_{meta['namespace']}({meta['uid']})")
                self.event(pod, name, WARNING, "BackOff", "Back-off restarting failed container "
                           f"{name} in pod {meta['name']}_{meta['namespace']}({meta['uid']})")
                result.again_in(wait)
                return False
            self.backoff.restarted(key)
        if current is not None and current.state == api_pb2.CONTAINER_CREATED:
            self._remove(current.id)  # created but never started: a pass that died half-way
        try:
            image_ref = self.ensure_image(pod, container, sandbox_cfg)
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
            envs, mounts = self._container_options(pod, container, sandbox_id)
            securitycontext.check_run_as_non_root(pod, container, lambda: self._image(image_ref))
        except ContainerConfigError as e:
            result.waiting[name] = ("CreateContainerConfigError", str(e))
            self.event(pod, name, WARNING, "Failed", f"Error: {e}")
            result.again_in(2.0)
            return False
        config = container_config(pod, container, image_ref, restart, sandbox_cfg, envs=envs, mounts=mounts)
        try:
            cid = self.runtime.create_container(sandbox_id, config, sandbox_cfg)
        except cri.CRIError as e:
            result.waiting[name] = ("CreateContainerError", e.details)
            self.event(pod, name, WARNING, "Failed", f"Error: {e.details}")
            result.again_in(self.backoff.initial)
            return False
        self.event(pod, name, NORMAL, "Created", f"Created container: {name}")
        try:
            self.runtime.start_container(cid)
        except cri.CRIError as e:
            result.waiting[name] = ("RunContainerError", e.details)
            self.event(pod, name, WARNING, "Failed", f"Error: {e.details}")
            result.again_in(self.backoff.initial)
            return False
        log.info("pod %s/%s: started container %s (%s, restart %d)", meta["namespace"], meta["name"], name, cid[:12],
                 restart)
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

    def _mount_volumes(self, pod: dict, result: SyncResult, starting: bool) -> bool:
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
                for c in pod["spec"].get("initContainers", []) + pod["spec"].get("containers", []):
                    result.waiting[c["name"]] = ("ContainerCreating", str(e))
            result.again_in(2.0)
            return False

    def _container_options(self, pod: dict, container: dict,
                           sandbox_id: str) -> tuple[dict[str, str] | None, list[api_pb2.Mount]]:
        if self.volumes is None:
            return None, []
        network = self.runtime.pod_sandbox_status(sandbox_id).status.network
        ips = [ip for ip in [network.ip, *(a.ip for a in network.additional_ips)] if ip]
        return self.volumes.container_options(
            pod, container, pod_ips=ips,
            warn=lambda reason, message: self.event(pod, container["name"], WARNING, reason, message))

    def _remove(self, container_id: str) -> None:
        try:
            self.runtime.remove_container(container_id)
        except cri.NotFound:
            pass

    def _remove_dead(self, state: RuntimePod) -> None:
        """Keeps the newest container of each name and the newest dead one (`kubectl logs --previous`)."""
        names = {c.labels.get(CONTAINER_NAME) for c in state.containers}
        for name in names:
            history = state.history(name)
            dead = [s for s in history[1:] if s.state == api_pb2.CONTAINER_EXITED]
            for s in dead[1:] if history[0].state != api_pb2.CONTAINER_EXITED else dead:
                self._remove(s.id)

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
