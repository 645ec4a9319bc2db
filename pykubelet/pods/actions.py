"""What one sync of a pod is to do, decided before anything is done: the kubelet's computePodActions.

A pure function of the pod, what the runtime has of it, the probes' verdicts and the restart back-offs:
the sandbox to make (and the dead ones to stop first), then, in order, the containers to kill and why,
the ones to start (the ephemeral containers not started yet, the next init container, the sidecars, the
regular containers the restart policy restarts), the ones that wait out their CrashLoopBackOff and with
which message, and the dead containers to remove. The executor (pods/sync.py) carries the steps out in
that order and reports what failed; deciding nothing itself, it cannot decide differently from the table
test of this module.

Two facts only the acts can tell, and the plan says what hangs on each:
- whether a start succeeded: a sidecar that did not start holds back the init containers after it
  (StartContainer.halt_unless_started);
- how a killed container ended: after a failed probe the restart policy decides on the exit the kill
  left, and the restart's back-off counts from it, so `after_kill` decides again, on the status the
  runtime gives once the container is stopped. A spec change restarts the container whatever the policy.
A pod with no sandbox gets only the sandbox: its containers are decided, by a second call, against the
runtime's state once the sandbox is made.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Protocol

from proto import api_pb2
from pykubelet.api.podmodel import DEFAULT_GRACE, Container, Pod
from pykubelet.pods.labels import CONTAINER_NAME, GRACE, HASH, container_hash, restart_count
from pykubelet.pods.podspec import is_finished, termination_grace
from pykubelet.pods.runtimepod import RuntimePod

CRASH_LOOP = "CrashLoopBackOff"


class Probes(Protocol):
    """The probes' verdicts on running containers (pykubelet/prober/manager.py's ProbeManager)."""

    def started(self, uid: str, name: str, container_id: str) -> bool: ...

    def kill_reason(self, uid: str, name: str, container_id: str) -> tuple[str, int | None] | None: ...


class Backoffs(Protocol):
    """The restart back-offs of exited containers (pykubelet/pods/backoff.py's Backoff)."""

    def remaining(self, key: str, finished_at: float) -> float: ...

    def current(self, key: str) -> float: ...


class KillReason(enum.Enum):
    POD_DONE = "the pod's regular containers are done"  # a sidecar: it never keeps a pod from completing
    PROBE_FAILED = "failed its liveness or startup probe"  # the restart policy decides on its exit
    SPEC_CHANGED = "its spec changed"  # restarted whatever the policy, as the kubelet's


@dataclass(frozen=True)
class KillContainer:
    name: str
    container_id: str
    grace: int
    reason: KillReason
    message: str | None = None  # the Killing event's; None: "Stopping container NAME"


@dataclass(frozen=True)
class StartContainer:
    name: str
    attempt: int  # the restart count the new container carries (its log is ATTEMPT.log)
    backoff_key: str | None = None  # a restart after an exit: the back-off counts it
    remove_first: str | None = None  # a container created but never started (a pass that died half-way)
    halt_unless_started: bool = False  # the steps after it wait until it has started
    target_id: str = ""  # an ephemeral container's target: the container whose pid namespace it joins


@dataclass(frozen=True)
class CannotStart:
    """A container that cannot be made this pass, and why, as its waiting reason shows it; the next pass
    decides again."""
    name: str
    reason: str
    message: str


@dataclass(frozen=True)
class BackOff:
    """An exited container that waits out its back-off before it starts again."""
    name: str
    message: str  # its waiting message
    wait: float  # seconds until it may start


@dataclass(frozen=True)
class RemoveContainers:
    """Dead containers beyond the newest of each name and the newest dead one (`kubectl logs --previous`)."""
    container_ids: tuple[str, ...]


Step = KillContainer | StartContainer | BackOff | CannotStart | RemoveContainers


@dataclass(frozen=True)
class PodActions:
    create_sandbox: bool = False
    sandbox_attempt: int = 0  # the new sandbox's: how many the pod had before it
    sandboxes_to_stop: tuple[str, ...] = ()  # dead sandboxes: their containers go with them
    steps: tuple[Step, ...] = ()  # in the order they are carried out
    init_failed: bool = False  # an init container failed under restartPolicy Never: the pod has failed

    @property
    def waiting(self) -> dict[str, tuple[str, str]]:
        """The containers that wait out a back-off: name -> (reason, message), as their status shows it."""
        return {s.name: (CRASH_LOOP, s.message) for s in self.steps if isinstance(s, BackOff)}


def compute_pod_actions(pod: Pod, state: RuntimePod, probes: Probes | None, backoffs: Backoffs) -> PodActions:
    """What this sync of `pod` does, given what the runtime has of it (`state`)."""
    if state.sandbox is None:
        if is_finished(pod):
            return PodActions()  # a finished pod is not brought back
        return PodActions(create_sandbox=True, sandbox_attempt=len(state.sandboxes),
                          sandboxes_to_stop=tuple(s.id for s in state.sandboxes))
    return _Planner(pod, state, probes, backoffs).actions()


def after_kill(pod: Pod, state: RuntimePod, kill: KillContainer, status: api_pb2.ContainerStatus,
               probes: Probes | None, backoffs: Backoffs) -> tuple[list[Step], bool]:
    """The steps that follow `kill`, one of compute_pod_actions' steps, decided on the status the container
    has once killed (`state` is what the actions were computed from); and whether the steps after `kill`
    in the plan are dropped (a sidecar that must start before the next init container does not)."""
    planner = _Planner(pod, state, probes, backoffs)
    container = pod.container(kill.name)
    if kill.reason is KillReason.SPEC_CHANGED:
        return [planner.start(container, status)], False
    if kill.reason is KillReason.PROBE_FAILED:
        if pod.is_init(kill.name):  # a sidecar: the init containers have no probes
            return planner.sidecar(container, status, probed=True)
        return planner.regular(container, status, probed=True), False
    return [], False


class _Planner:
    """One computation of a pod's actions against one ready sandbox."""

    def __init__(self, pod: Pod, state: RuntimePod, probes: Probes | None, backoffs: Backoffs) -> None:
        assert state.sandbox is not None
        self.pod, self.state, self.probes, self.backoffs = pod, state, probes, backoffs
        self.sandbox_id = state.sandbox.id
        self.uid = pod.uid
        self.policy = pod.spec.restart_policy
        containers = pod.spec.containers
        # once a regular container ran in this sandbox, the init containers are done; once they all ended
        # for good, the sidecars go (they never keep a pod from completing)
        self.initialized = any(self.current(c.name) is not None for c in containers)
        self.finished = self.initialized and self._regular_done()

    def actions(self) -> PodActions:
        steps: list[Step] = []
        if self.finished:
            steps += self._stop_sidecars()
        else:  # before the init containers, as the kubelet's: a debugger may look at one that is stuck
            for container in self.pod.spec.ephemeral_containers:
                steps += self.ephemeral(container)
        # init containers, one at a time, in order; each must succeed (a sidecar: start) before the next starts
        for container in self.pod.spec.init_containers:
            current = self.current(container.name)
            if container.is_sidecar:
                more, halt = self.sidecar(container, current)
                steps += more
                if halt:
                    return PodActions(steps=tuple(steps))
                continue
            if current is not None and current.state == api_pb2.CONTAINER_EXITED and current.exit_code == 0:
                continue
            if current is not None and current.state in (api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_CREATED):
                return PodActions(steps=tuple(steps))  # the PLEG brings the pod back when it exits
            if current is not None and self.policy == "Never":
                return PodActions(steps=tuple(steps), init_failed=True)
            steps.append(self.start(container, current))
            return PodActions(steps=tuple(steps))
        for container in self.pod.spec.containers:
            steps += self.regular(container, self.current(container.name))
        dead = self._dead()
        if dead:
            steps.append(RemoveContainers(dead))
        return PodActions(steps=tuple(steps))

    def current(self, name: str) -> api_pb2.ContainerStatus | None:
        """The newest container `name`, if it is in the ready sandbox."""
        history = self.state.history(name)
        if history and any(c.id == history[0].id and c.pod_sandbox_id == self.sandbox_id
                           for c in self.state.containers):
            return history[0]
        return None

    def sidecar(self, container: Container, current: api_pb2.ContainerStatus | None,
                probed: bool = False) -> tuple[list[Step], bool]:
        """A sidecar's steps, and whether the init containers after it wait (`probed`: its probes' verdict
        was acted on already)."""
        if self.finished:
            return [], False
        if current is not None and current.state == api_pb2.CONTAINER_RUNNING:
            kill = None if probed else self._probe_kill(container, current)
            if kill is not None:
                return [kill], False
            return [], not (self.initialized or self._started(container.name, current.id))
        step = self.start(container, current)
        if self.initialized:
            return [step], False
        if isinstance(step, BackOff) or container.startup_probe is not None:
            return [step], True  # the next one waits until this one has started (its startup probe)
        return [replace(step, halt_unless_started=True)], False

    def ephemeral(self, container: Container) -> list[Step]:
        """Started once, never restarted: whatever ran of that name, in any sandbox, is its one run (but a
        container created and never started, which is made again). With a target, it joins the pid
        namespace of the target's newest container, as the kubelet's getTargetID."""
        current = self.current(container.name)
        if self.state.history(container.name) and (current is None or current.state != api_pb2.CONTAINER_CREATED):
            return []
        target_id = ""
        if container.target_container_name:
            target = self.state.history(container.target_container_name)
            if not target:
                return [CannotStart(container.name, "CreateContainerConfigError",
                                    f"unable to find target container {container.target_container_name}")]
            target_id = target[0].id
        step = self.start(container, current)
        assert isinstance(step, StartContainer)  # only an exited container waits out a back-off
        return [replace(step, target_id=target_id)]

    def regular(self, container: Container, current: api_pb2.ContainerStatus | None,
                probed: bool = False) -> list[Step]:
        if current is not None and current.state == api_pb2.CONTAINER_RUNNING:
            if current.annotations.get(HASH) != container_hash(container):
                return [KillContainer(container.name, current.id,
                                      int(current.annotations.get(GRACE, "") or DEFAULT_GRACE),
                                      KillReason.SPEC_CHANGED,
                                      f"Container {container.name} definition changed, will be restarted")]
            kill = None if probed else self._probe_kill(container, current)
            return [kill] if kill is not None else []
        if current is not None and current.state != api_pb2.CONTAINER_CREATED and not self._restarts(current):
            return []
        return [self.start(container, current)]

    def _restarts(self, ended: api_pb2.ContainerStatus) -> bool:
        """Whether the restart policy restarts a regular container that ended so."""
        return not (self.policy == "Never" or (self.policy == "OnFailure" and ended.exit_code == 0))

    def start(self, container: Container, current: api_pb2.ContainerStatus | None) -> StartContainer | BackOff:
        """Starts the container, unless it exited and its back-off is not over."""
        name, meta = container.name, self.pod.metadata
        history = self.state.history(name)
        attempt = restart_count(history[0]) + 1 if history else 0
        key = None
        if current is not None and current.state == api_pb2.CONTAINER_EXITED:
            key = f"{self.uid}/{name}/{container_hash(container)}"
            wait = self.backoffs.remaining(key, current.finished_at / 1e9)
            if wait > 0:
                return BackOff(name, f"back-off {self.backoffs.current(key):g}s restarting failed container={name} "
                                     f"pod={meta.name}_{meta.namespace}({meta.uid})", wait)
        created = current.id if current is not None and current.state == api_pb2.CONTAINER_CREATED else None
        return StartContainer(name, attempt, backoff_key=key, remove_first=created)

    def _started(self, name: str, container_id: str) -> bool:
        return self.probes is None or self.probes.started(self.uid, name, container_id)

    def _probe_kill(self, container: Container, current: api_pb2.ContainerStatus) -> KillContainer | None:
        """A running container that failed its liveness or startup probe is killed."""
        verdict = self.probes.kill_reason(self.uid, container.name, current.id) if self.probes is not None else None
        if verdict is None:
            return None
        message, grace = verdict
        return KillContainer(container.name, current.id, termination_grace(self.pod) if grace is None else grace,
                             KillReason.PROBE_FAILED, message)

    def _regular_done(self) -> bool:
        """Whether every regular container has ended and the restart policy restarts none of them."""
        if self.policy == "Always":
            return False
        for c in self.pod.spec.containers:
            current = self.current(c.name)
            if current is None or current.state != api_pb2.CONTAINER_EXITED:
                return False
            if self.policy == "OnFailure" and current.exit_code != 0:
                return False
        return True

    def _stop_sidecars(self) -> list[Step]:
        """The running sidecars of a pod whose regular containers are done: in reverse order, with preStop."""
        steps: list[Step] = []
        for container in reversed([c for c in self.pod.spec.init_containers if c.is_sidecar]):
            current = self.current(container.name)
            if current is not None and current.state == api_pb2.CONTAINER_RUNNING:
                steps.append(KillContainer(container.name, current.id, termination_grace(self.pod),
                                           KillReason.POD_DONE))
        return steps

    def _dead(self) -> tuple[str, ...]:
        """Of each name, the exited containers but the newest one that is not the current container."""
        out: list[str] = []
        for name in dict.fromkeys(c.labels.get(CONTAINER_NAME, "") for c in self.state.containers):
            history = self.state.history(name)
            if not history:
                continue  # every one of them gone from the runtime since it was listed
            dead = [s.id for s in history[1:] if s.state == api_pb2.CONTAINER_EXITED]
            out += dead[1:] if history[0].state != api_pb2.CONTAINER_EXITED else dead
        return tuple(out)
