"""What one sync of a pod is to do, decided before anything is done: the kubelet's computePodActions.

A pure function of the pod, what the runtime has of it, the probes' verdicts and the restart back-offs:
the sandbox to make (and the dead ones to stop first), then, in order, the containers to kill and why,
the ones to start (the ephemeral containers not started yet, the next init container, the sidecars, the
regular containers the restart policy restarts), the ones that wait out their CrashLoopBackOff and with
which message, the in-place resizes (what the kubelet allocated a running container against what it was
last given: pods/allocation.py), and the dead containers to remove. The executor (pods/sync.py) carries the steps out in
that order and reports what failed; deciding nothing itself, it cannot decide differently from the table
test of this module.

Two facts only the acts can tell, and the plan says what hangs on each:
- whether a start succeeded: a sidecar that did not start holds back the init containers after it
  (StartContainer.halt_unless_started);
- how a killed container ended: after a failed probe the restart policy decides on the exit the kill
  left, and the restart's back-off counts from it, so `after_kill` decides again, on the status the
  runtime gives once the container is stopped. A spec change restarts the container whatever the policy, and
  so does a resize of a resource whose resizePolicy is RestartContainer.
A pod with no sandbox gets only the sandbox: its containers are decided, by a second call, against the
runtime's state once the sandbox is made.

A container that exits with a code its RestartAllContainers rule matches (restarting_all) restarts the
pod in place, as the kubelet's computePodActions with RestartAllContainersOnContainerExits (beta, on in
1.37): that pass does nothing else but reset every init and regular container (ephemeral ones are left):
the running ones killed without grace and every one of them removed, the ones that exited by the rule
last, so that a pass cut short finds the pod still to be reset. The next pass finds no container and
runs the pod again from its first init container, in the same sandbox, each container starting at the
restart count its status shows (`restarts`: the runtime has no record of it any more).
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Protocol

from proto import api_pb2
from pykubelet.api.podmodel import DEFAULT_GRACE, Container, Pod, Resources
from pykubelet.pods.labels import CONTAINER_NAME, GRACE, HASH, container_hash, restart_count
from pykubelet.pods.podspec import is_finished, parse_quantity, restarts_all, should_restart, termination_grace
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


class Actuated(Protocol):
    """What a pod's containers and its cgroup were last given (pykubelet/pods/allocation.py's PodResources)."""

    @property
    def containers(self) -> Mapping[str, Resources]: ...

    @property
    def pod(self) -> Resources | None: ...


class KillReason(enum.Enum):
    POD_DONE = "the pod's regular containers are done"  # a sidecar: it never keeps a pod from completing
    PROBE_FAILED = "failed its liveness or startup probe"  # the restart policy decides on its exit
    SPEC_CHANGED = "its spec changed"  # restarted whatever the policy, as the kubelet's
    RESIZED = "its resize requires a restart"  # resizePolicy RestartContainer: restarted whatever the policy


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


@dataclass(frozen=True)
class ResizeContainer:
    """UpdateContainerResources of a running container for one resource: `resources` is what it is to have
    once done, `resource`'s requests and limit as allocated and the other one's as it has them (the stock
    kubelet's updatePodContainerResources), so that one resource's failure leaves the other as it was."""
    name: str
    container_id: str
    resource: str  # "memory" or "cpu"
    resources: Resources
    decrease: bool = False  # the limit (or without a limit change, the request) goes down
    limit_decrease: bool = False  # a memory limit lowered or set: refused while the container uses that much


@dataclass(frozen=True)
class ResizePod:
    """The pod-level resources (spec.resources) to the pod's cgroup: UpdatePodSandboxResources."""
    resources: Resources
    decrease: bool = False  # a limit goes down: after the containers' resizes, else before them
    limit_decrease: bool = False  # the memory limit goes down (or is set): not below what the pod uses


@dataclass(frozen=True)
class ResetContainer:
    """A container removed for RestartAllContainers, killed first (without grace or preStop) if it runs."""
    name: str
    container_id: str
    kill: bool = False


Step = (KillContainer | StartContainer | BackOff | CannotStart | RemoveContainers | ResizeContainer | ResizePod
        | ResetContainer)


@dataclass(frozen=True)
class PodActions:
    create_sandbox: bool = False
    sandbox_attempt: int = 0  # the new sandbox's: how many the pod had before it
    sandboxes_to_stop: tuple[str, ...] = ()  # dead sandboxes: their containers go with them
    steps: tuple[Step, ...] = ()  # in the order they are carried out
    init_failed: bool = False  # an init container failed under restartPolicy Never: the pod has failed
    # a container starts with other resources than it last had (its resize restarts it, or it restarts after
    # one): the pod's cgroup takes the pod's allocation first, as the kubelet's startingResizedContainer; on
    # cgroup v1 a container's CFS quota must fit its pod's
    resize_pod_cgroup: bool = False

    @property
    def waiting(self) -> dict[str, tuple[str, str]]:
        """The containers that wait out a back-off: name -> (reason, message), as their status shows it."""
        return {s.name: (CRASH_LOOP, s.message) for s in self.steps if isinstance(s, BackOff)}


def compute_pod_actions(pod: Pod, state: RuntimePod, probes: Probes | None, backoffs: Backoffs,
                        actuated: Actuated | None = None, restarts: Mapping[str, int] | None = None) -> PodActions:
    """What this sync of `pod` (with its allocated resources) does, given what the runtime has of it (`state`),
    what its running containers were last given (`actuated`; None: nothing to resize) and the restart count
    its status shows of each container (`restarts`: where the runtime has none of a container, the one it
    starts next carries that count, pods/status.py's carried_restarts)."""
    if state.sandbox is None:
        if is_finished(pod):
            return PodActions()  # a finished pod is not brought back
        return PodActions(create_sandbox=True, sandbox_attempt=len(state.sandboxes),
                          sandboxes_to_stop=tuple(s.id for s in state.sandboxes))
    if restarting_all(pod, state):
        return PodActions(steps=tuple(_resets(pod, state)))
    return _Planner(pod, state, probes, backoffs, actuated, restarts).actions()


def _in_sandbox(state: RuntimePod, name: str) -> api_pb2.ContainerStatus | None:
    """The newest container `name`, if it is in the ready sandbox."""
    history = state.history(name)
    if history and state.sandbox is not None and any(
            c.id == history[0].id and c.pod_sandbox_id == state.sandbox.id for c in state.containers):
        return history[0]
    return None


def restarting_all(pod: Pod, state: RuntimePod) -> bool:
    """Whether an init or regular container of the ready sandbox exited with a code its RestartAllContainers
    rule matches (the kubelet's ShouldAllContainersRestart on the runtime's state): the pod restarts in place.
    A finished pod restarts nothing, as the kubelet's AllContainersRestarting is False for it."""
    if is_finished(pod):
        return False
    for c in pod.spec.init_containers + pod.spec.containers:
        current = _in_sandbox(state, c.name)
        if current is not None and current.state == api_pb2.CONTAINER_EXITED and restarts_all(c, current.exit_code):
            return True
    return False


def _resets(pod: Pod, state: RuntimePod) -> list[ResetContainer]:
    """Every container of the pod's init and regular containers the runtime has, in any sandbox, as the
    kubelet's getContainersToReset: the regular ones, then the init ones, then those that exited by their
    RestartAllContainers rule (the sources: regular, then init), so that the sources go last."""
    def split(containers: tuple[Container, ...]) -> tuple[list[ResetContainer], list[ResetContainer]]:
        sources: list[ResetContainer] = []
        targets: list[ResetContainer] = []
        for c in containers:
            for s in state.history(c.name):
                if s.state != api_pb2.CONTAINER_EXITED:
                    targets.append(ResetContainer(c.name, s.id, kill=True))
                elif restarts_all(c, s.exit_code):
                    sources.append(ResetContainer(c.name, s.id))
                else:
                    targets.append(ResetContainer(c.name, s.id))
        return sources, targets
    init_sources, init_targets = split(pod.spec.init_containers)
    sources, targets = split(pod.spec.containers)
    return targets + init_targets + sources + init_sources


def after_kill(pod: Pod, state: RuntimePod, kill: KillContainer, status: api_pb2.ContainerStatus,
               probes: Probes | None, backoffs: Backoffs) -> tuple[list[Step], bool]:
    """The steps that follow `kill`, one of compute_pod_actions' steps, decided on the status the container
    has once killed (`state` is what the actions were computed from); and whether the steps after `kill`
    in the plan are dropped (a sidecar that must start before the next init container does not)."""
    planner = _Planner(pod, state, probes, backoffs)
    container = pod.container(kill.name)
    if kill.reason in (KillReason.SPEC_CHANGED, KillReason.RESIZED):
        return [planner.start(container, status)], False
    if kill.reason is KillReason.PROBE_FAILED:
        if pod.is_init(kill.name):  # a sidecar: the init containers have no probes
            return planner.sidecar(container, status, probed=True)
        return planner.regular(container, status, probed=True), False
    return [], False


RESIZABLE = ("memory", "cpu")


Effective = dict[str, tuple[Decimal | None, Decimal | None]]


def _effective(r: Resources, pod_level: Resources | None) -> Effective:
    """resource -> (request, limit) as amounts, the limit falling back to the pod-level one."""
    out: Effective = {}
    for name in RESIZABLE:
        limit = r.limits.get(name, pod_level.limits.get(name) if pod_level is not None else None)
        request = r.requests.get(name)
        out[name] = (None if request is None else parse_quantity(request),
                     None if limit is None else parse_quantity(limit))
    return out


def _with(base: Resources, source: Resources, resource: str) -> Resources:
    """`base` with `resource`'s request and limit as `source` has them (or has not)."""
    def merged(mine: dict[str, str], theirs: dict[str, str]) -> dict[str, str]:
        out = {k: v for k, v in mine.items() if k != resource}
        if resource in theirs:
            out[resource] = theirs[resource]
        return out
    return Resources(requests=merged(base.requests, source.requests), limits=merged(base.limits, source.limits))


class _Planner:
    """One computation of a pod's actions against one ready sandbox."""

    def __init__(self, pod: Pod, state: RuntimePod, probes: Probes | None, backoffs: Backoffs,
                 actuated: Actuated | None = None, restarts: Mapping[str, int] | None = None) -> None:
        assert state.sandbox is not None
        self.pod, self.state, self.probes, self.backoffs, self.actuated = pod, state, probes, backoffs, actuated
        self.restarts = restarts or {}
        self.resizes: list[ResizeContainer] = []
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
                    return self._plan(steps)
                continue
            if current is not None and current.state == api_pb2.CONTAINER_EXITED and current.exit_code == 0:
                continue
            if current is not None and current.state in (api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_CREATED):
                if current.state == api_pb2.CONTAINER_RUNNING:  # resized while it runs, as a regular container
                    steps += self.resize(container, current)
                return self._plan(steps)  # the PLEG brings the pod back when it exits
            if current is not None and not self._init_restarts(container, current):
                return PodActions(steps=tuple(steps), init_failed=True)
            steps.append(self.start(container, current))
            return self._plan(steps)
        for container in self.pod.spec.containers:
            steps += self.regular(container, self.current(container.name))
        dead = self._dead()
        return self._plan(steps, RemoveContainers(dead) if dead else None)

    def _plan(self, steps: list[Step], last: RemoveContainers | None = None) -> PodActions:
        """The steps with the resizes after them, as the kubelet's SyncPod: memory before cpu, each resource's
        decreases before its increases; the pod's cgroup before the containers' when it grows, after when
        it shrinks."""
        ordered = sorted(self.resizes, key=lambda r: (r.resource != "memory", not r.decrease))
        resizes: list[Step] = list(ordered)
        pod_step = self._resize_pod()
        if pod_step is not None:
            resizes = [*resizes, pod_step] if pod_step.decrease else [pod_step, *resizes]
        restarted = {s.name for s in steps if isinstance(s, StartContainer)
                     or (isinstance(s, KillContainer) and s.reason is KillReason.RESIZED)}
        return PodActions(steps=tuple(steps + resizes + ([last] if last is not None else [])),
                          resize_pod_cgroup=any(want != had for want, had in (
                              self._wanted_and_had(self.pod.container(name)) for name in restarted)))

    def _wanted_and_had(self, container: Container) -> tuple[Effective, Effective]:
        """The container's allocation and what it was last given, each with the pod-level limits where it has
        none of its own (both empty without a record of what it was given)."""
        if self.actuated is None or container.name not in self.actuated.containers:
            return {}, {}
        return (_effective(container.resources, self.pod.spec.resources),
                _effective(self.actuated.containers[container.name], self.actuated.pod))

    def current(self, name: str) -> api_pb2.ContainerStatus | None:
        return _in_sandbox(self.state, name)

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
            resized = self.resize(container, current)
            if resized:
                return resized, False
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
            return [kill] if kill is not None else self.resize(container, current)
        if current is not None and current.state != api_pb2.CONTAINER_CREATED \
                and not should_restart(container, self.pod, current.exit_code):
            return []
        return [self.start(container, current)]

    def resize(self, container: Container, current: api_pb2.ContainerStatus) -> list[Step]:
        """A running container whose allocation differs from what it was given, as the kubelet's
        computePodResizeAction: killed (and so restarted) if a changed resource's resizePolicy is
        RestartContainer, else an UpdateContainerResources per changed resource, queued in self.resizes for
        the end of the plan."""
        want, have = self._wanted_and_had(container)
        changed = [r for r in RESIZABLE if want.get(r) != have.get(r)]
        if not changed:
            return []
        if any(container.resize_policy.get(r) == "RestartContainer" for r in changed):
            return [KillContainer(container.name, current.id,
                                  int(current.annotations.get(GRACE, "") or DEFAULT_GRACE), KillReason.RESIZED,
                                  f"Container {container.name} resize requires restart")]
        assert self.actuated is not None  # something changed: there is a record of what it was given
        given = self.actuated.containers[container.name]
        for r in changed:  # memory first: the cpu update carries the memory the memory update gave
            (req_w, lim_w), (req_h, lim_h) = want[r], have[r]
            decrease = (lim_w or 0) < (lim_h or 0) if lim_w != lim_h else (req_w or 0) < (req_h or 0)
            given = _with(given, container.resources, r)
            self.resizes.append(ResizeContainer(
                container.name, current.id, r, given, decrease=decrease,
                limit_decrease=r == "memory" and lim_w is not None and (lim_h is None or lim_w < lim_h)))
        return []

    def _resize_pod(self) -> ResizePod | None:
        """The pod's cgroup, when its pod-level resources were resized: their requests (the cgroup's cpu
        shares) as well as their limits."""
        allocated = self.pod.spec.resources
        if self.actuated is None or allocated is None:
            return None
        want, have = _effective(allocated, None), _effective(self.actuated.pod or Resources(), None)
        if want == have:
            return None
        memory, had = want["memory"][1], have["memory"][1]
        return ResizePod(allocated, decrease=any((want[r][1] or 0) < (have[r][1] or 0)
                                                 for r in RESIZABLE if want[r][1] is not None),
                         limit_decrease=memory is not None and (had is None or memory < had))

    def _init_restarts(self, container: Container, failed: api_pb2.ContainerStatus) -> bool:
        """Whether an init container that failed runs again (else the pod has failed): by its exit code as
        any container's (should_restart); one in an unknown state has no exit code, so only the
        restartPolicy (the container's, else the pod's) says, as the kubelet's."""
        if failed.state == api_pb2.CONTAINER_EXITED:
            return should_restart(container, self.pod, failed.exit_code)
        return (container.restart_policy or self.policy) != "Never"

    def start(self, container: Container, current: api_pb2.ContainerStatus | None) -> StartContainer | BackOff:
        """Starts the container, unless it exited and its back-off is not over."""
        name, meta = container.name, self.pod.metadata
        history = self.state.history(name)
        attempt = restart_count(history[0]) + 1 if history else self.restarts.get(name, 0)
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
        for c in self.pod.spec.containers:
            current = self.current(c.name)
            if current is None or current.state != api_pb2.CONTAINER_EXITED:
                return False
            if should_restart(c, self.pod, current.exit_code):
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
