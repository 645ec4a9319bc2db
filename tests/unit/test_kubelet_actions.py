"""compute_pod_actions as a table, as kubernetes' TestComputePodActions: a pod, what the runtime has of it,
the probes' verdicts and the back-offs in; the sandbox to make, the containers to kill and start, the
back-off waits and the containers to remove out. Then after_kill: what follows a kill, decided on the
status the killed container ends with. A pod being deleted is never planned here: the pod workers hand
it to pods/termination.py; a finished one is (it is not brought back, its sidecars stop)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from proto import api_pb2
from pykubelet.api.podmodel import Pod, Resources, parse_pod
from pykubelet.pods.actions import (
    BackOff,
    CannotStart,
    KillContainer,
    KillReason,
    PodActions,
    RemoveContainers,
    ResetContainer,
    ResizeContainer,
    ResizePod,
    StartContainer,
    Step,
    after_kill,
    compute_pod_actions,
)
from pykubelet.pods.allocation import PodResources
from pykubelet.pods.backoff import Backoff
from pykubelet.pods.labels import CONTAINER_NAME, GRACE, HASH, RESTART_COUNT, container_hash
from pykubelet.pods.runtimepod import RuntimePod

UID = "uid-1"
NOW = 1_700_000_100.0
EXITED_AT = NOW - 5  # when the exited containers below ended, unless they say otherwise
STATES = {"running": api_pb2.CONTAINER_RUNNING, "exited": api_pb2.CONTAINER_EXITED,
          "created": api_pb2.CONTAINER_CREATED}


def spec(name: str, **fields) -> dict:
    return {"name": name, "image": "busybox:1", **fields}


MAIN, SETUP, SETUP2 = spec("main"), spec("setup"), spec("setup2")
SIDE, SIDE2 = spec("side", restartPolicy="Always"), spec("side2", restartPolicy="Always")
SIDE_PROBED = spec("side", restartPolicy="Always", startupProbe={"exec": {"command": ["true"]}})
DEBUG, DEBUG_MAIN = spec("debug", stdin=True, tty=True), spec("debug", targetContainerName="main")


def pod(*containers: dict, init: tuple[dict, ...] = (), policy: str | None = None, phase: str | None = None,
        grace: int | None = None, ephemeral: tuple[dict, ...] = (), resources: dict | None = None) -> Pod:
    p: dict = {"metadata": {"name": "p", "namespace": "ns", "uid": UID},
               "spec": {"containers": list(containers), "initContainers": list(init),
                        "ephemeralContainers": list(ephemeral)}}
    if policy is not None:
        p["spec"]["restartPolicy"] = policy
    if grace is not None:
        p["spec"]["terminationGracePeriodSeconds"] = grace
    if resources is not None:
        p["spec"]["resources"] = resources
    if phase is not None:
        p["status"] = {"phase": phase}
    return parse_pod(p)


@dataclass(frozen=True)
class C:
    """A container the runtime has: made from the pod's spec of `name` unless `changed`."""
    name: str
    id: str
    state: str = "running"
    exit: int = 0
    restart: int = 0
    sandbox: str = "s"
    finished: float = EXITED_AT
    changed: bool = False  # made from another spec than the pod's (its hash differs)
    grace: int | None = None  # the grace it was started with


def runtime(p: Pod, *containers: C, sandboxes: tuple[tuple[str, bool], ...] = (("s", True),)) -> RuntimePod:
    """What the runtime has of `p`: `containers` and `sandboxes` (id, ready) newest first."""
    specs = {c.name: c for c in p.spec.all_containers + p.spec.ephemeral_containers}
    statuses = []
    for c in containers:
        annotations = {RESTART_COUNT: str(c.restart),
                       HASH: "0" * 16 if c.changed else container_hash(specs[c.name])}
        if c.grace is not None:
            annotations[GRACE] = str(c.grace)
        statuses.append(api_pb2.ContainerStatus(
            id=c.id, state=STATES[c.state], exit_code=c.exit, labels={CONTAINER_NAME: c.name},
            annotations=annotations, finished_at=int(c.finished * 1e9) if c.state == "exited" else 0))
    return RuntimePod(
        sandboxes=[api_pb2.PodSandbox(id=s, state=api_pb2.SANDBOX_READY if ready else api_pb2.SANDBOX_NOTREADY)
                   for s, ready in sandboxes],
        containers=[api_pb2.Container(id=c.id, pod_sandbox_id=c.sandbox, labels={CONTAINER_NAME: c.name})
                    for c in containers],
        statuses={s.id: s for s in statuses})


@dataclass
class Probes:
    not_started: set[str] = field(default_factory=set)  # container ids whose startup probe has not passed
    failed: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # container id -> kill verdict

    def started(self, uid: str, name: str, container_id: str) -> bool:
        return container_id not in self.not_started

    def kill_reason(self, uid: str, name: str, container_id: str) -> tuple[str, int | None] | None:
        return self.failed.get(container_id)


def key(container: dict) -> str:
    return f"{UID}/{container['name']}/{container_hash(pod(container).spec.containers[0])}"


def backoffs(*crashed: dict) -> Backoff:
    """Back-offs in which each of `crashed` restarted once, just now: its next wait is 10 s from its exit."""
    b = Backoff(clock=lambda: NOW)
    for c in crashed:
        b.restarted(key(c))
    return b


def waits(name: str) -> BackOff:
    return BackOff(name, f"back-off 10s restarting failed container={name} pod=p_ns({UID})", 5.0)


LIVENESS = "Container main failed liveness probe, will be restarted"


@dataclass
class Case:
    name: str
    pod: Pod
    containers: tuple[C, ...]  # what the runtime has of the pod, newest first
    expected: PodActions
    sandboxes: tuple[tuple[str, bool], ...] = (("s", True),)  # (id, ready), newest first
    probes: Probes = field(default_factory=Probes)
    backoffs: Backoff = field(default_factory=backoffs)
    actuated: PodResources | None = None  # what the running containers were last given (None: no records)
    restarts: dict[str, int] = field(default_factory=dict)  # the restart counts the pod's status shows


def steps(*s: Step) -> PodActions:
    return PodActions(steps=s)


def resized_steps(*s: Step) -> PodActions:
    """Steps that start a container with a new allocation: the pod's cgroup takes it first."""
    return PodActions(steps=s, resize_pod_cgroup=True)


P = pod(MAIN)
INIT = pod(MAIN, init=(SETUP, SETUP2))
SIDECARS = pod(MAIN, init=(SIDE, SETUP))
DONE = pod(MAIN, init=(SIDE, SIDE2), policy="Never", grace=7)
NO_SANDBOX: tuple[tuple[str, bool], ...] = ()
NEVER, ALWAYS = spec("main", restartPolicy="Never"), spec("main", restartPolicy="Always")
RULED = spec("main", restartPolicy="Never",
             restartPolicyRules=[{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}])
NOT_ZERO = spec("main", restartPolicy="Never",
                restartPolicyRules=[{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}])
SETUP_ON_FAILURE = spec("setup", restartPolicy="OnFailure")
ALL_ON_42 = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
SOURCE = spec("main", restartPolicy="Never", restartPolicyRules=ALL_ON_42)
SOURCE_ALWAYS = spec("main", restartPolicy="Always", restartPolicyRules=ALL_ON_42)
SOURCE_INIT = spec("setup2", restartPolicy="Never", restartPolicyRules=ALL_ON_42)
SOURCE_SIDE = spec("side2", restartPolicy="Always", restartPolicyRules=ALL_ON_42)


def res(cpu: str | None = None, memory: str | None = None, *, limits: bool = True) -> Resources:
    """Requests of `cpu` and `memory`, and the same limits unless not `limits`."""
    amounts = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return Resources(requests=dict(amounts), limits=dict(amounts) if limits else {})


def sized(name: str, r: Resources, **fields) -> dict:
    return spec(name, resources={"requests": r.requests, "limits": r.limits}, **fields)


def given(*containers: tuple[str, Resources], pod_level: Resources | None = None) -> PodResources:
    return PodResources(dict(containers), pod_level)


RESTART_MEMORY = [{"resourceName": "memory", "restartPolicy": "RestartContainer"},
                  {"resourceName": "cpu", "restartPolicy": "NotRequired"}]

CASES = [
    # --- the sandbox ----------------------------------------------------------------------------------
    Case("a new pod gets its sandbox first", P, (), PodActions(create_sandbox=True), sandboxes=NO_SANDBOX),
    Case("a dead sandbox is stopped and a new one made, the next attempt", P, (C("main", "m1", sandbox="s1"),),
         PodActions(create_sandbox=True, sandbox_attempt=1, sandboxes_to_stop=("s1",)), sandboxes=(("s1", False),)),
    Case("a finished pod without a sandbox is not brought back", pod(MAIN, phase="Succeeded"), (), PodActions(),
         sandboxes=(("s1", False),)),
    Case("in a new sandbox the containers start again, restart count on, no back-off",
         P, (C("main", "m1", "exited", exit=1, restart=2, sandbox="s1"),), steps(StartContainer("main", 3)),
         sandboxes=(("s2", True), ("s1", False)), backoffs=backoffs(MAIN)),
    Case("a pod whose containers run: nothing to do", P, (C("main", "m1"),), PodActions()),
    # --- init containers ------------------------------------------------------------------------------
    Case("the first init container alone", INIT, (), steps(StartContainer("setup", 0))),
    Case("a running init container holds the next back", INIT, (C("setup", "i1"),), PodActions()),
    Case("an init container that succeeded: the next one", INIT, (C("setup", "i1", "exited"),),
         steps(StartContainer("setup2", 0))),
    Case("init containers done: the regular containers", INIT,
         (C("setup2", "i2", "exited"), C("setup", "i1", "exited")), steps(StartContainer("main", 0))),
    Case("a failed init container under restartPolicy Never fails the pod", pod(MAIN, init=(SETUP,), policy="Never"),
         (C("setup", "i1", "exited", exit=1),), PodActions(init_failed=True)),
    Case("a failed init container under OnFailure is restarted, the back-off counting it",
         pod(MAIN, init=(SETUP,), policy="OnFailure"), (C("setup", "i1", "exited", exit=1),),
         steps(StartContainer("setup", 1, backoff_key=key(SETUP)))),
    Case("a failed init container waits out its back-off, and so does the rest", INIT,
         (C("setup", "i1", "exited", exit=1),), steps(waits("setup")), backoffs=backoffs(SETUP)),
    Case("an init container created but not started yet is waited for", INIT, (C("setup", "i1", "created"),),
         PodActions()),
    # --- sidecars -------------------------------------------------------------------------------------
    Case("a sidecar without a startup probe starts, and the next init container with it if it started",
         SIDECARS, (), steps(StartContainer("side", 0, halt_unless_started=True), StartContainer("setup", 0))),
    Case("a sidecar with a startup probe starts alone", pod(MAIN, init=(SIDE_PROBED, SETUP)), (),
         steps(StartContainer("side", 0))),
    Case("a running sidecar not started yet holds the next back", SIDECARS, (C("side", "s1"),), PodActions(),
         probes=Probes(not_started={"s1"})),
    Case("a started sidecar lets the next one start", SIDECARS, (C("side", "s1"),), steps(StartContainer("setup", 0))),
    Case("a sidecar in its back-off holds the next back", SIDECARS, (C("side", "s1", "exited", exit=1),),
         steps(waits("side")), backoffs=backoffs(SIDE)),
    Case("a sidecar that died once the pod is initialized restarts, whatever the restart policy",
         pod(MAIN, init=(SIDE,), policy="Never"), (C("main", "m1"), C("side", "s1", "exited", exit=1)),
         steps(StartContainer("side", 1, backoff_key=key(SIDE)))),
    Case("a sidecar failing its probe is killed; what follows the kill is decided once it is stopped",
         SIDECARS, (C("side", "s1"),),
         steps(KillContainer("side", "s1", 30, KillReason.PROBE_FAILED, "Container side failed startup probe"),
               StartContainer("setup", 0)),
         probes=Probes(failed={"s1": ("Container side failed startup probe", None)})),
    Case("a sidecar failing its startup probe is killed with the probe's grace, not the pod's",
         pod(MAIN, init=(SIDE_PROBED,), grace=500), (C("side", "s1"),),
         steps(KillContainer("side", "s1", 5, KillReason.PROBE_FAILED, "Container side failed startup probe"),
               StartContainer("main", 0)),
         probes=Probes(failed={"s1": ("Container side failed startup probe", 5)})),
    Case("a done pod's sidecars stop in reverse order and restart no more",
         DONE, (C("main", "m1", "exited"), C("side2", "s2"), C("side", "s1")),
         steps(KillContainer("side2", "s2", 7, KillReason.POD_DONE),
               KillContainer("side", "s1", 7, KillReason.POD_DONE))),
    Case("a pod failed under OnFailure keeps its sidecars", pod(MAIN, init=(SIDE,), policy="OnFailure"),
         (C("main", "m1", "exited", exit=1, finished=NOW - 60), C("side", "s1")),
         steps(StartContainer("main", 1, backoff_key=key(MAIN)))),
    # --- regular containers ---------------------------------------------------------------------------
    *(Case(f"restartPolicy {policy}, exit code {code}: {'restarted' if again else 'left'}",
           pod(MAIN, policy=policy), (C("main", "m1", "exited", exit=code),),
           steps(StartContainer("main", 1, backoff_key=key(MAIN))) if again else PodActions())
      for policy, code, again in (("Always", 0, True), ("Always", 1, True), ("OnFailure", 0, False),
                                  ("OnFailure", 2, True), ("Never", 0, False), ("Never", 1, False))),
    # --- a container's own restartPolicy and restartPolicyRules (ContainerRestartRules, on in 1.37) ----------
    Case("a container's own Never under the pod's Always: left, and the pod is done",
         pod(NEVER, policy="Always"), (C("main", "m1", "exited", exit=1),), PodActions()),
    Case("a container's own Always under the pod's Never: restarted", pod(ALWAYS, policy="Never"),
         (C("main", "m1", "exited", exit=0),), steps(StartContainer("main", 1, backoff_key=key(ALWAYS)))),
    Case("a Restart rule whose exit codes (In) match restarts a container whose own policy is Never",
         pod(RULED, policy="Never"), (C("main", "m1", "exited", exit=42),),
         steps(StartContainer("main", 1, backoff_key=key(RULED)))),
    Case("no rule matches: the container's own policy (Never) decides", pod(RULED, policy="Never"),
         (C("main", "m1", "exited", exit=1),), PodActions()),
    Case("a NotIn rule matches any other exit code", pod(NOT_ZERO, policy="Never"),
         (C("main", "m1", "exited", exit=3),), steps(StartContainer("main", 1, backoff_key=key(NOT_ZERO)))),
    Case("an init container's own OnFailure under the pod's Never: restarted, not a failed pod",
         pod(MAIN, init=(SETUP_ON_FAILURE,), policy="Never"), (C("setup", "i1", "exited", exit=1),),
         steps(StartContainer("setup", 1, backoff_key=key(SETUP_ON_FAILURE)))),
    Case("an init container's own Never under the pod's Always: the pod has failed",
         pod(MAIN, init=(spec("setup", restartPolicy="Never"),)), (C("setup", "i1", "exited", exit=1),),
         PodActions(init_failed=True)),
    Case("an exited container within its back-off waits: CrashLoopBackOff", P, (C("main", "m1", "exited", exit=1),),
         steps(waits("main")), backoffs=backoffs(MAIN)),
    Case("an exited container past its back-off restarts", P,
         (C("main", "m1", "exited", exit=1, finished=NOW - 60),),
         steps(StartContainer("main", 1, backoff_key=key(MAIN))), backoffs=backoffs(MAIN)),
    Case("each container on its own: one waits, the next starts", pod(MAIN, spec("web")),
         (C("main", "m1", "exited", exit=1),), steps(waits("main"), StartContainer("web", 0)), backoffs=backoffs(MAIN)),
    Case("a liveness failure kills with the probe's grace", P, (C("main", "m1"),),
         steps(KillContainer("main", "m1", 3, KillReason.PROBE_FAILED, LIVENESS)),
         probes=Probes(failed={"m1": (LIVENESS, 3)})),
    Case("a liveness failure without a probe grace kills with the pod's", pod(MAIN, grace=12), (C("main", "m1"),),
         steps(KillContainer("main", "m1", 12, KillReason.PROBE_FAILED, LIVENESS)),
         probes=Probes(failed={"m1": (LIVENESS, None)})),
    Case("a container created but never started (a sync that died half-way) is removed and made again", P,
         (C("main", "m1", "created"),), steps(StartContainer("main", 1, remove_first="m1"))),
    Case("a changed spec kills with the grace the container was started with", P,
         (C("main", "m1", changed=True, grace=45),),
         steps(KillContainer("main", "m1", 45, KillReason.SPEC_CHANGED,
                             "Container main definition changed, will be restarted"))),
    # --- ephemeral containers (kubectl debug) ---------------------------------------------------------
    Case("an ephemeral container added to a running pod starts, alone", pod(MAIN, ephemeral=(DEBUG,)),
         (C("main", "m1"),), steps(StartContainer("debug", 0))),
    Case("with a target: in the pid namespace of the target's container", pod(MAIN, ephemeral=(DEBUG_MAIN,)),
         (C("main", "m1"),), steps(StartContainer("debug", 0, target_id="m1"))),
    Case("the target's newest container, wherever it is: the runtime says if it can join it",
         pod(MAIN, ephemeral=(DEBUG_MAIN,)), (C("main", "m2", "exited", exit=1), C("main", "m1", "exited")),
         steps(StartContainer("debug", 0, target_id="m2"), waits("main"), RemoveContainers(("m1",))),
         backoffs=backoffs(MAIN)),
    Case("a target with no container yet: not made this pass, as the kubelet's config error",
         pod(MAIN, init=(SETUP,), ephemeral=(DEBUG_MAIN,)), (C("setup", "i1"),),
         steps(CannotStart("debug", "CreateContainerConfigError", "unable to find target container main"))),
    Case("started before the init containers, so a debugger can look at a stuck one",
         pod(MAIN, init=(SETUP,), ephemeral=(DEBUG,)), (C("setup", "i1", "exited", exit=1),),
         steps(StartContainer("debug", 0), waits("setup")), backoffs=backoffs(SETUP)),
    Case("a running ephemeral container is left, and its pod's containers too", pod(MAIN, ephemeral=(DEBUG,)),
         (C("debug", "d1"), C("main", "m1")), PodActions()),
    *(Case(f"an ephemeral container that exited {code} is never restarted, whatever the policy",
           pod(MAIN, ephemeral=(DEBUG,)), (C("debug", "d1", "exited", exit=code), C("main", "m1")), PodActions())
      for code in (0, 1)),
    Case("an ephemeral container of a dead sandbox is not run again in the new one",
         pod(MAIN, ephemeral=(DEBUG,)), (C("main", "m2", sandbox="s2"), C("debug", "d1", "exited", sandbox="s1"),
                                         C("main", "m1", "exited", sandbox="s1")),
         PodActions(), sandboxes=(("s2", True), ("s1", False))),
    Case("an ephemeral container created but never started is made again", pod(MAIN, ephemeral=(DEBUG,)),
         (C("debug", "d1", "created"), C("main", "m1")), steps(StartContainer("debug", 1, remove_first="d1"))),
    Case("a done pod starts no ephemeral container", pod(MAIN, policy="Never", ephemeral=(DEBUG,)),
         (C("main", "m1", "exited"),), PodActions()),
    # --- in-place resize: the allocation (the pod's resources) against what the container was given -----
    Case("allocated as given: nothing to do", pod(sized("main", res("500m", "64Mi"))), (C("main", "m1"),),
         PodActions(), actuated=given(("main", res("0.5", "67108864")))),
    Case("no record of what it was given: nothing to resize", pod(sized("main", res("1", "64Mi"))),
         (C("main", "m1"),), PodActions(), actuated=given()),
    Case("a cpu increase: UpdateContainerResources, the memory as given", pod(sized("main", res("1", "64Mi"))),
         (C("main", "m1"),), steps(ResizeContainer("main", "m1", "cpu", res("1", "64Mi"))),
         actuated=given(("main", res("500m", "64Mi")))),
    Case("a memory limit decrease is one (checked against the usage when done)",
         pod(sized("main", res("500m", "32Mi"))), (C("main", "m1"),),
         steps(ResizeContainer("main", "m1", "memory", res("500m", "32Mi"), decrease=True, limit_decrease=True)),
         actuated=given(("main", res("500m", "64Mi")))),
    Case("memory before cpu, each one's decreases before its increases",
         pod(sized("main", res("1", "128Mi")), sized("web", res("250m", "32Mi"))), (C("web", "w1"), C("main", "m1")),
         steps(ResizeContainer("web", "w1", "memory", res("500m", "32Mi"), decrease=True, limit_decrease=True),
               ResizeContainer("main", "m1", "memory", res("500m", "128Mi")),
               ResizeContainer("web", "w1", "cpu", res("250m", "32Mi"), decrease=True),
               ResizeContainer("main", "m1", "cpu", res("1", "128Mi"))),
         actuated=given(("main", res("500m", "64Mi")), ("web", res("500m", "64Mi")))),
    Case("a request alone changes: resized, the limit kept", pod(sized("main", Resources({"cpu": "200m"}, {}))),
         (C("main", "m1"),), steps(ResizeContainer("main", "m1", "cpu", Resources({"cpu": "200m"}, {}))),
         actuated=given(("main", Resources({"cpu": "100m"}, {})))),
    Case("resizePolicy RestartContainer for a changed resource: killed, then started again",
         pod(sized("main", res("500m", "128Mi"), resizePolicy=RESTART_MEMORY)), (C("main", "m1", grace=20),),
         resized_steps(KillContainer("main", "m1", 20, KillReason.RESIZED,
                                     "Container main resize requires restart")),
         actuated=given(("main", res("500m", "64Mi")))),
    Case("RestartContainer for memory, only the cpu changed: in place",
         pod(sized("main", res("1", "64Mi"), resizePolicy=RESTART_MEMORY)), (C("main", "m1"),),
         steps(ResizeContainer("main", "m1", "cpu", res("1", "64Mi"))), actuated=given(("main", res("500m", "64Mi")))),
    Case("an exited container is not resized: it starts again with its allocation",
         pod(sized("main", res("1", "64Mi"))), (C("main", "m1", "exited", finished=NOW - 60),),
         resized_steps(StartContainer("main", 1, backoff_key=key(sized("main", res("1", "64Mi"))))),
         actuated=given(("main", res("500m", "64Mi")))),
    Case("a running sidecar is resized too", pod(MAIN, init=(sized("side", res("1"), restartPolicy="Always"),)),
         (C("main", "m1"), C("side", "s1")),
         steps(ResizeContainer("side", "s1", "cpu", res("1"))), actuated=given(("side", res("500m")), ("main", res()))),
    Case("a running init container that runs once is resized while it runs (Pod InPlace Resize Init Container: "
         "InPlacePodVerticalScalingInitContainers), the regular ones not started yet",
         pod(MAIN, init=(sized("setup", res("1", "128Mi")),)), (C("setup", "i1"),),
         steps(ResizeContainer("setup", "i1", "memory", res("500m", "128Mi")),
               ResizeContainer("setup", "i1", "cpu", res("1", "128Mi"))),
         actuated=given(("setup", res("500m", "64Mi")), ("main", res()))),
    Case("a running init container whose resize requires a restart: killed, then started again",
         pod(MAIN, init=(sized("setup", res("500m", "128Mi"), resizePolicy=RESTART_MEMORY),)), (C("setup", "i1"),),
         resized_steps(KillContainer("setup", "i1", 30, KillReason.RESIZED,
                                     "Container setup resize requires restart")),
         actuated=given(("setup", res("500m", "64Mi")), ("main", res()))),
    Case("an init container that ran is not resized: the regular ones start",
         pod(MAIN, init=(sized("setup", res("1", "128Mi")),)), (C("setup", "i1", "exited"),),
         steps(StartContainer("main", 0)), actuated=given(("setup", res("500m", "64Mi")), ("main", res()))),
    Case("a pod-level limit raised: the pod's cgroup first, then the containers that have none of their own",
         pod(sized("main", Resources({"cpu": "100m"}, {})), resources={"limits": {"cpu": "2"}}), (C("main", "m1"),),
         steps(ResizePod(res("2")), ResizeContainer("main", "m1", "cpu", Resources({"cpu": "100m"}, {}))),
         actuated=given(("main", Resources({"cpu": "100m"}, {})), pod_level=res("1"))),
    Case("a pod-level limit lowered: the containers first, then the pod's cgroup",
         pod(sized("main", Resources({"cpu": "100m"}, {})), resources={"limits": {"cpu": "500m"}}),
         (C("main", "m1"),),
         steps(ResizeContainer("main", "m1", "cpu", Resources({"cpu": "100m"}, {}), decrease=True),
               ResizePod(res("500m"), decrease=True)),
         actuated=given(("main", Resources({"cpu": "100m"}, {})), pod_level=res("1"))),
    Case("a pod-level request alone changed: the pod's cgroup (its cpu shares), its containers' own kept (the PLR "
         "Pod InPlace Resize specs' pod-level cpu requests: PodResizeInProgress stayed)",
         pod(sized("main", res("100m")), resources={"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}),
         (C("main", "m1"),), steps(ResizePod(Resources({"cpu": "500m"}, {"cpu": "2"}))),
         actuated=given(("main", res("100m")), pod_level=Resources({"cpu": "200m"}, {"cpu": "2"}))),
    # --- RestartAllContainers (RestartAllContainersOnContainerExits, beta and on in 1.37) ---------------------
    Case("an exit its RestartAllContainers rule matches resets the pod: the regular containers, the init ones, "
         "then the one that exited; running ones killed",
         pod(SOURCE, spec("web"), init=(SETUP, SIDE), policy="Never"),
         (C("main", "m1", "exited", exit=42), C("web", "w1"), C("side", "s1"), C("setup", "i1", "exited")),
         steps(ResetContainer("web", "w1", kill=True), ResetContainer("setup", "i1"),
               ResetContainer("side", "s1", kill=True), ResetContainer("main", "m1"))),
    Case("every container of each name goes, an older run of the one that exited among the others",
         pod(SOURCE_ALWAYS, spec("web")),
         (C("main", "m2", "exited", exit=42, restart=1), C("web", "w1"), C("main", "m1", "exited", exit=1)),
         steps(ResetContainer("main", "m1"), ResetContainer("web", "w1", kill=True), ResetContainer("main", "m2"))),
    Case("an init container's exit by its rule resets the pod, the init containers before it too",
         pod(MAIN, init=(SIDE, SETUP, SOURCE_INIT), policy="Never"),
         (C("setup2", "i2", "exited", exit=42), C("setup", "i1", "exited"), C("side", "s1")),
         steps(ResetContainer("side", "s1", kill=True), ResetContainer("setup", "i1"),
               ResetContainer("setup2", "i2"))),
    Case("a sidecar's exit by its rule resets the pod",
         pod(MAIN, init=(SETUP, SOURCE_SIDE), policy="Never"),
         (C("main", "m1"), C("side2", "s2", "exited", exit=42), C("setup", "i1", "exited")),
         steps(ResetContainer("main", "m1", kill=True), ResetContainer("setup", "i1"),
               ResetContainer("side2", "s2"))),
    Case("an ephemeral container is left as it is", pod(SOURCE, ephemeral=(DEBUG,), policy="Never"),
         (C("debug", "d1"), C("main", "m1", "exited", exit=42)), steps(ResetContainer("main", "m1"))),
    Case("an exit no rule matches: the container's own policy (Never) decides, nothing is reset",
         pod(SOURCE, spec("web"), policy="Never"), (C("main", "m1", "exited", exit=1), C("web", "w1")), PodActions()),
    Case("reset: the pod runs again from its first init container, at the restart count its status shows",
         pod(SOURCE, init=(SETUP,), policy="Never"), (), steps(StartContainer("setup", 1)),
         restarts={"setup": 1, "main": 1}),
    Case("with containers in the runtime the restart count goes on from theirs, whatever the status shows",
         pod(ALWAYS, policy="Never"), (C("main", "m1", "exited", exit=0, restart=1),),
         steps(StartContainer("main", 2, backoff_key=key(ALWAYS))), restarts={"main": 7}),
    Case("an exit by the rule in a dead sandbox: the new one runs the pod anew",
         pod(SOURCE, policy="Never"), (C("main", "m1", "exited", exit=42, sandbox="s1"),),
         steps(StartContainer("main", 1)), sandboxes=(("s2", True), ("s1", False))),
    # --- dead containers ------------------------------------------------------------------------------
    Case("dead containers go but the newest dead one", P,
         (C("main", "m3"), C("main", "m2", "exited"), C("main", "m1", "exited")), steps(RemoveContainers(("m1",)))),
    Case("an exited current container is the newest dead one", pod(MAIN, policy="Never"),
         (C("main", "m3", "exited"), C("main", "m2", "exited"), C("main", "m1", "exited")),
         steps(RemoveContainers(("m2", "m1")))),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_compute_pod_actions(case: Case) -> None:
    state = runtime(case.pod, *case.containers, sandboxes=case.sandboxes)
    assert compute_pod_actions(case.pod, state, case.probes, case.backoffs, case.actuated,
                               case.restarts) == case.expected


def test_the_waits_are_the_containers_waiting_reasons() -> None:
    actions = compute_pod_actions(P, runtime(P, C("main", "m1", "exited", exit=1)), None, backoffs(MAIN))
    assert actions.waiting == {"main": ("CrashLoopBackOff", f"back-off 10s restarting failed container=main "
                                                            f"pod=p_ns({UID})")}


PROBE_KILL = KillContainer("main", "m1", 30, KillReason.PROBE_FAILED, LIVENESS)
SIDE_KILL = KillContainer("side", "s1", 30, KillReason.PROBE_FAILED, "Container side failed liveness probe")
KILLED = ("exited", 137, NOW - 60)  # how the killed container ended: state, exit code, when


@pytest.mark.parametrize(("name", "p", "kill", "ended", "expected"), [
    ("after a probe kill the restart policy decides: Always", P, PROBE_KILL, KILLED,
     ([StartContainer("main", 1, backoff_key=key(MAIN))], False)),
    ("OnFailure, and the container exited 0 on its SIGTERM: left", pod(MAIN, policy="OnFailure"), PROBE_KILL,
     ("exited", 0, NOW - 60), ([], False)),
    ("Never: left", pod(MAIN, policy="Never"), PROBE_KILL, KILLED, ([], False)),
    ("within its back-off, counted from the kill: waits", P, PROBE_KILL, ("exited", 137, EXITED_AT),
     ([waits("main")], False)),
    ("still running: left", P, PROBE_KILL, ("running", 0, 0), ([], False)),
    ("a changed spec restarts whatever the policy", pod(MAIN, policy="Never"),
     KillContainer("main", "m1", 30, KillReason.SPEC_CHANGED, "changed"), KILLED,
     ([StartContainer("main", 1, backoff_key=key(MAIN))], False)),
    ("a resize that requires a restart restarts whatever the policy", pod(MAIN, policy="Never"),
     KillContainer("main", "m1", 30, KillReason.RESIZED, "Container main resize requires restart"), KILLED,
     ([StartContainer("main", 1, backoff_key=key(MAIN))], False)),
    ("a sidecar before initialization: the next init container waits for its start", SIDECARS, SIDE_KILL, KILLED,
     ([StartContainer("side", 1, backoff_key=key(SIDE), halt_unless_started=True)], False)),
    ("a sidecar with a startup probe: the next one waits for its probe", pod(MAIN, init=(SIDE_PROBED, SETUP)),
     SIDE_KILL, KILLED, ([StartContainer("side", 1, backoff_key=key(SIDE_PROBED))], True)),
    ("a sidecar in its back-off: the next one waits", SIDECARS, SIDE_KILL, ("exited", 137, EXITED_AT),
     ([waits("side")], True)),
    ("a sidecar still running, not started: the next one waits", pod(MAIN, init=(SIDE_PROBED, SETUP)), SIDE_KILL,
     ("running", 0, 0), ([], True)),
    ("a finished pod's sidecar: nothing follows", SIDECARS, KillContainer("side", "s1", 30, KillReason.POD_DONE),
     KILLED, ([], False)),
])
def test_after_kill(name: str, p: Pod, kill: KillContainer, ended: tuple[str, int, float],
                    expected: tuple[list[Step], bool]) -> None:
    state = runtime(p, C(kill.name, kill.container_id))
    after = api_pb2.ContainerStatus()
    after.CopyFrom(state.statuses[kill.container_id])  # the runtime's status of it, once killed
    after.state, after.exit_code, after.finished_at = STATES[ended[0]], ended[1], int(ended[2] * 1e9)
    probes = Probes(not_started={"s1"}) if ended[0] == "running" else None
    assert after_kill(p, state, kill, after, probes, backoffs(MAIN, SIDE)) == expected
