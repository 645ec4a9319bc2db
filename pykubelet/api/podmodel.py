"""A Pod as the kubelet acts on it: frozen records, parsed once where a pod comes in, with the API server's
defaults applied.

The pod workers read a pod's desired state from the informer's cache (an API pod, or a static pod, whose
manifest was checked by this parser when read) and parse it here once per change of it (PodWorkers.pod);
admission and eviction read the same records. Everything after reads fields, not dict keys, so a default
(restartPolicy Always, terminationGracePeriodSeconds 30, protocol TCP, a probe's periodSeconds 10, ...)
is written once, in this module, not at each reader. A field of the wrong type is a FieldError naming its
path (`spec.containers[0].ports[1].containerPort: must be an integer, got "80"`), raised before anything
is done for the pod.

What the kubelet sends back or hashes stays the object as it came: `Pod.raw` (the pod as a dict, for the
status manager's patches, the mirror pods, the server's /pods) and `Container.raw` (what
pods/labels.py's container_hash hashes, so the hash of a running container's spec is the one it was
started with, before and after an upgrade, and no container restarts for it). Volumes are a union of the
sources this node supports (UnsupportedSource for the rest, which the volume manager refuses as the
kubelet does a plugin it lacks), and a probe's or hook's action one of the actions it can run. The nested
objects the kubelet only passes on to one reader (an env var's valueFrom, a resourceFieldRef, affinity,
tolerations) are kept as their dicts, each read by its one module.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pykubelet.api.fields import Obj

RESTART_POLICIES = ("Always", "OnFailure", "Never")
RESTART_RULE_ACTIONS = ("Restart", "RestartAllContainers")
DNS_POLICIES = ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")
PROTOCOLS = ("TCP", "UDP", "SCTP")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")  # a label selector's
KEY_TYPES = ("RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519")  # a podCertificate's
DEFAULT_GRACE = 30
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"


def pull_policy(image: str) -> str:
    """The API server's default: Always for :latest or no tag (a digest counts as a tag), else IfNotPresent."""
    if "@" in image:
        return "IfNotPresent"
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


@dataclass(frozen=True)
class ObjectMeta:
    name: str
    namespace: str
    uid: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    resource_version: str = ""
    generation: int = 0  # a resize bumps it: the resize conditions' observedGeneration
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None


@dataclass(frozen=True)
class ContainerPort:
    container_port: int
    name: str = ""
    host_port: int = 0
    host_ip: str = ""
    protocol: str = "TCP"


@dataclass(frozen=True)
class Resources:
    """Requests and limits as the API writes their quantities ("100m", "64Mi"); requests default to the
    limits, as the API server's defaulting does."""
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)


RESIZE_RESOURCES = ("cpu", "memory")
RESIZE_RESTART_POLICIES = ("NotRequired", "RestartContainer")


@dataclass(frozen=True)
class ExecAction:
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class HTTPGetAction:
    port: int | str = 80  # a number or the name of a container port
    host: str = ""  # "": the pod's IP
    scheme: str = "HTTP"
    path: str = ""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TCPSocketAction:
    port: int | str = 0
    host: str = ""


@dataclass(frozen=True)
class GRPCAction:
    port: int = 0
    service: str = ""


@dataclass(frozen=True)
class SleepAction:
    seconds: int = 0


Action = ExecAction | HTTPGetAction | TCPSocketAction | GRPCAction  # what a probe runs (prober/handlers.py)
HookAction = Action | SleepAction  # what a lifecycle hook runs (pods/lifecycle.py)


@dataclass(frozen=True)
class Probe:
    action: Action
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace_period_seconds: int | None = None


@dataclass(frozen=True)
class VolumeMount:
    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str = ""
    sub_path_expr: str = ""
    mount_propagation: str = "None"


@dataclass(frozen=True)
class SecurityContext:
    """A container's securityContext, or the pod's fields of it (the pod's own are in PodSecurityContext)."""
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    privileged: bool = False
    allow_privilege_escalation: bool | None = None
    read_only_root_filesystem: bool = False
    capabilities_add: tuple[str, ...] = ()
    capabilities_drop: tuple[str, ...] = ()
    proc_mount: str = "Default"
    seccomp_profile: dict[str, Any] | None = None


@dataclass(frozen=True)
class PodSecurityContext:
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    fs_group: int | None = None
    fs_group_change_policy: str = "Always"
    supplemental_groups: tuple[int, ...] = ()
    sysctls: tuple[tuple[str, str], ...] = ()
    seccomp_profile: dict[str, Any] | None = None


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str = ""
    value_from: dict[str, Any] | None = None  # read by pods/env.py


@dataclass(frozen=True)
class ContainerRestartRule:
    """A container's restartPolicyRules[] entry (ContainerRestartRules, beta and on in 1.37): `action` when
    the exit code is (operator In) or is not (NotIn) among `values`."""
    action: str  # Restart or RestartAllContainers
    operator: str = "In"
    values: tuple[int, ...] = ()

    def matches(self, exit_code: int) -> bool:
        return (exit_code in self.values) == (self.operator == "In")


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    raw: dict[str, Any] = field(repr=False, compare=False)  # the container as it came: what the hash hashes
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    working_dir: str = ""
    env: tuple[EnvVar, ...] = ()
    env_from: tuple[dict[str, Any], ...] = ()
    ports: tuple[ContainerPort, ...] = ()
    resources: Resources = Resources()
    volume_mounts: tuple[VolumeMount, ...] = ()
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None
    post_start: HookAction | None = None
    pre_stop: HookAction | None = None
    termination_message_path: str = DEFAULT_TERMINATION_MESSAGE_PATH
    termination_message_policy: str = "File"
    image_pull_policy: str = "IfNotPresent"
    security_context: SecurityContext = SecurityContext()
    # an init container's "Always": a sidecar; else a container's own policy over the pod's (ContainerRestartRules)
    restart_policy: str | None = None
    restart_policy_rules: tuple[ContainerRestartRule, ...] = ()
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    target_container_name: str = ""  # an ephemeral container's: whose pid namespace it joins (`kubectl debug --target`)
    # resizePolicy: resource -> NotRequired or RestartContainer; a resource not named is NotRequired
    resize_policy: dict[str, str] = field(default_factory=dict)

    @property
    def is_sidecar(self) -> bool:
        """An init container that keeps running beside the regular ones (restartPolicy: Always)."""
        return self.restart_policy == "Always"


@dataclass(frozen=True)
class DNSConfig:
    nameservers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[tuple[str, str | None], ...] = ()  # (name, value)


@dataclass(frozen=True)
class HostAlias:
    """An entry the kubelet adds to the pod's /etc/hosts (pods/hosts.py)."""
    ip: str
    hostnames: tuple[str, ...] = ()


DEFAULT_MODE = 0o644  # a volume file's mode when neither its item nor its source gives one
DEFAULT_TOKEN_SECONDS = 3600


@dataclass(frozen=True)
class EmptyDirSource:
    medium: str = ""  # "Memory": a tmpfs
    size_limit: str | None = None  # a quantity


@dataclass(frozen=True)
class HostPathSource:
    path: str
    type: str = ""  # "": no check


@dataclass(frozen=True)
class KeyToPath:
    key: str
    path: str
    mode: int | None = None  # None: the source's defaultMode


@dataclass(frozen=True)
class ConfigMapSource:
    """A configMap volume or projection; a secret's too (`kind` "secret", `name` its secretName)."""
    kind: str  # "configmap" or "secret", as the kubelet's messages name them
    name: str
    items: tuple[KeyToPath, ...] = ()  # none: every key, at its own name
    default_mode: int = DEFAULT_MODE
    optional: bool = False


@dataclass(frozen=True)
class DownwardAPIFile:
    """One file of a downwardAPI volume: `field_path` (a fieldRef) or `resource` (a resourceFieldRef's
    dict, read by pods/env.py); neither is the volume manager's error, as a pod's missing volume is."""
    path: str
    field_path: str | None = None
    resource: dict[str, Any] | None = None
    mode: int | None = None


@dataclass(frozen=True)
class DownwardAPISource:
    items: tuple[DownwardAPIFile, ...] = ()
    default_mode: int = DEFAULT_MODE


@dataclass(frozen=True)
class ServiceAccountTokenProjection:
    path: str
    audience: str = ""
    expiration_seconds: int = DEFAULT_TOKEN_SECONDS


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector: every label of `match_labels` equal and every (key, operator, values) of
    `match_expressions` true; an empty one matches everything."""
    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class ClusterTrustBundleProjection:
    """The trust anchors of the ClusterTrustBundle `name`, or of every bundle of `signer_name` whose labels
    `label_selector` matches (None, as the API leaves it unset, matches none), as one PEM file at `path`."""
    path: str
    name: str | None = None
    signer_name: str | None = None
    label_selector: LabelSelector | None = None
    optional: bool = False


@dataclass(frozen=True)
class PodCertificateProjection:
    """A key the node makes for the pod and the chain `signer_name` issues for it (pykubelet/volumes/
    podcertificates.py), written at whichever of the three paths are set."""
    signer_name: str
    key_type: str
    max_expiration_seconds: int | None = None
    credential_bundle_path: str = ""
    key_path: str = ""
    certificate_chain_path: str = ""
    user_annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class UnsupportedProjection:
    kinds: tuple[str, ...]  # what the projection has, none of the above


Projection = (ConfigMapSource | DownwardAPISource | ServiceAccountTokenProjection | ClusterTrustBundleProjection
              | PodCertificateProjection | UnsupportedProjection)


@dataclass(frozen=True)
class ProjectedSource:
    sources: tuple[Projection, ...] = ()
    default_mode: int = DEFAULT_MODE


@dataclass(frozen=True)
class ImageSource:
    """An image volume: the image `reference`'s root, pulled as a container's image is, mounted read-only by
    the runtime (CRI Mount.image); nothing of it is on the kubelet's side of the node."""
    reference: str
    pull_policy: str


@dataclass(frozen=True)
class UnsupportedSource:
    """A volume kind this node has no plugin for (persistentVolumeClaim, nfs, ...): its pod waits with the
    volume manager's error, as the kubelet's does for a plugin it lacks."""


VolumeSource = (EmptyDirSource | HostPathSource | ConfigMapSource | DownwardAPISource | ProjectedSource
                | ImageSource | UnsupportedSource)


@dataclass(frozen=True)
class Volume:
    """One of the pod's volumes: `kind` names its source as the API does (emptyDir, hostPath, configMap,
    secret, downwardAPI, projected, image, or one this node does not support)."""
    name: str
    kind: str
    source: VolumeSource


@dataclass(frozen=True)
class PodSpec:
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    # added to a running pod through the ephemeralcontainers subresource (`kubectl debug`); started once, never
    # restarted, never part of the pod's phase or readiness
    ephemeral_containers: tuple[Container, ...] = ()
    volumes: tuple[Volume, ...] = ()
    restart_policy: str = "Always"
    termination_grace_period_seconds: int = DEFAULT_GRACE
    active_deadline_seconds: int | None = None
    dns_policy: str = "ClusterFirst"
    dns_config: DNSConfig | None = None
    node_name: str = ""
    service_account_name: str = ""
    host_network: bool = False
    host_pid: bool = False
    host_ipc: bool = False
    share_process_namespace: bool = False
    host_users: bool = True
    hostname: str = ""
    subdomain: str = ""
    hostname_override: str | None = None  # the pod's hostname whatever hostname and subdomain say
    set_hostname_as_fqdn: bool = False
    host_aliases: tuple[HostAlias, ...] = ()
    security_context: PodSecurityContext = PodSecurityContext()
    image_pull_secrets: tuple[str, ...] = ()
    priority: int = 0
    priority_class_name: str = ""
    enable_service_links: bool = True
    tolerations: tuple[dict[str, Any], ...] = ()  # read by eviction's policy
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, Any] = field(default_factory=dict)  # read by admission
    runtime_class_name: str = ""
    os_name: str | None = None
    overhead: dict[str, str] = field(default_factory=dict)
    resources: Resources | None = None  # pod-level resources (spec.resources): the pod's cgroup, not a container's
    # readinessGates' conditionTypes: the pod is Ready only once each of these conditions, which others set
    # through pods/status, is True as well
    readiness_gates: tuple[str, ...] = ()

    @property
    def all_containers(self) -> tuple[Container, ...]:
        """The init containers, then the regular ones."""
        return self.init_containers + self.containers


@dataclass(frozen=True)
class ContainerStatus:
    """What the kubelet reads back of a container's status it reported: whether it was ready and started
    (a restarted kubelet's probes start from there)."""
    name: str
    container_id: str = ""  # RUNTIME://ID
    ready: bool = False
    started: bool = False


@dataclass(frozen=True)
class PodStatus:
    """What the kubelet reads back of a pod's status: its phase (a finished pod is not started again), its
    IP and its containers' readiness; the rest it only writes."""
    phase: str = "Pending"
    pod_ip: str = ""
    reason: str = ""
    container_statuses: tuple[ContainerStatus, ...] = ()  # regular and init containers'


@dataclass(frozen=True)
class Pod:
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus
    raw: dict[str, Any] = field(repr=False, compare=False)  # the pod as it came, for what is sent back

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def key(self) -> str:
        """"namespace/name", the informer's key."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def container(self, name: str) -> Container:
        """Container `name`, regular, init or ephemeral (the API keeps their names apart)."""
        return next(c for c in self.spec.all_containers + self.spec.ephemeral_containers if c.name == name)

    def is_init(self, name: str) -> bool:
        return any(c.name == name for c in self.spec.init_containers)

    def is_ephemeral(self, name: str) -> bool:
        return any(c.name == name for c in self.spec.ephemeral_containers)

    def field_path(self, name: str) -> str:
        """Where container `name` is in the pod, as events name it (`spec.initContainers{setup}`)."""
        kind = ("initContainers" if self.is_init(name) else
                "ephemeralContainers" if self.is_ephemeral(name) else "containers")
        return f"spec.{kind}{{{name}}}"


# --- parsing -----------------------------------------------------------------------------------------


def parse_pod(raw: Any) -> Pod:
    """The Pod of `raw` (the API's JSON of a Pod, as a dict), defaults applied; FieldError names the field
    that is missing or of the wrong type."""
    doc = Obj(raw, "")
    status = doc.obj("status")
    return Pod(metadata=_meta(doc.obj("metadata", required=True)), spec=_spec(doc.obj("spec", required=True)),
               status=PodStatus() if status is None else _status(status),
               raw=raw)


def _status(s: Obj) -> PodStatus:
    return PodStatus(phase=s.str("phase", "Pending"), pod_ip=s.str("podIP", ""), reason=s.str("reason", ""),
                     container_statuses=tuple(
                         ContainerStatus(name=c.str("name", ""), container_id=c.str("containerID", ""),
                                         ready=c.bool("ready"), started=c.bool("started"))
                         for c in s.objs("containerStatuses") + s.objs("initContainerStatuses")))


def _meta(m: Obj) -> ObjectMeta:
    return ObjectMeta(name=m.str("name", required=True), namespace=m.str("namespace", "default"),
                      uid=m.str("uid", required=True), labels=m.str_map("labels"),
                      annotations=m.str_map("annotations"), resource_version=m.str("resourceVersion", ""),
                      generation=m.int("generation", 0, lo=0),
                      deletion_timestamp=m.str("deletionTimestamp"),
                      deletion_grace_period_seconds=m.int("deletionGracePeriodSeconds", lo=0))


def _spec(s: Obj) -> PodSpec:
    dns = s.obj("dnsConfig")
    sc = s.obj("securityContext")
    return PodSpec(
        containers=tuple(_container(c) for c in s.objs("containers")),
        init_containers=tuple(_container(c) for c in s.objs("initContainers")),
        ephemeral_containers=tuple(replace(_container(c), target_container_name=c.str("targetContainerName", ""))
                                   for c in s.objs("ephemeralContainers")),
        volumes=tuple(_volume(v) for v in s.objs("volumes")),
        restart_policy=s.choice("restartPolicy", RESTART_POLICIES, "restart policy", "Always"),
        termination_grace_period_seconds=s.int("terminationGracePeriodSeconds", DEFAULT_GRACE, lo=0),
        active_deadline_seconds=s.int("activeDeadlineSeconds", lo=1),
        dns_policy=s.choice("dnsPolicy", DNS_POLICIES, "DNS policy", "ClusterFirst"),
        dns_config=None if dns is None else DNSConfig(
            nameservers=dns.strings("nameservers"), searches=dns.strings("searches"),
            options=tuple((o.str("name", required=True), o.str("value")) for o in dns.objs("options"))),
        node_name=s.str("nodeName", ""), service_account_name=s.str("serviceAccountName", ""),
        host_network=s.bool("hostNetwork"), host_pid=s.bool("hostPID"), host_ipc=s.bool("hostIPC"),
        share_process_namespace=s.bool("shareProcessNamespace"), host_users=s.bool("hostUsers", True),
        hostname=s.str("hostname", ""), subdomain=s.str("subdomain", ""),
        hostname_override=s.str("hostnameOverride"), set_hostname_as_fqdn=s.bool("setHostnameAsFQDN"),
        host_aliases=tuple(HostAlias(a.str("ip", required=True), a.strings("hostnames"))
                           for a in s.objs("hostAliases")),
        security_context=PodSecurityContext() if sc is None else _pod_security(sc),
        image_pull_secrets=tuple(r.str("name", "") for r in s.objs("imagePullSecrets")),
        priority=s.int("priority", 0), priority_class_name=s.str("priorityClassName", ""),
        enable_service_links=s.bool("enableServiceLinks", True),
        tolerations=tuple(t.raw for t in s.objs("tolerations")), node_selector=s.str_map("nodeSelector"),
        affinity=s.get("affinity", dict, {}), runtime_class_name=s.str("runtimeClassName", ""),
        os_name=None if (os_ := s.obj("os")) is None else os_.str("name", required=True),
        overhead=s.quantities("overhead"),
        resources=None if (res := s.obj("resources")) is None else _resources(res),
        readiness_gates=tuple(g.str("conditionType", required=True) for g in s.objs("readinessGates")))


def _resources(res: Obj) -> Resources:
    limits = res.quantities("limits")
    return Resources(requests={**limits, **res.quantities("requests")}, limits=limits)


def _pod_security(sc: Obj) -> PodSecurityContext:
    return PodSecurityContext(
        run_as_user=sc.int("runAsUser", lo=0), run_as_group=sc.int("runAsGroup", lo=0),
        run_as_non_root=sc.bool("runAsNonRoot", None), fs_group=sc.int("fsGroup", lo=0),
        fs_group_change_policy=sc.choice("fsGroupChangePolicy", ("Always", "OnRootMismatch"),
                                         "fsGroupChangePolicy", "Always"),
        supplemental_groups=sc.ints("supplementalGroups"),
        sysctls=tuple((o.str("name", required=True), o.str("value", "")) for o in sc.objs("sysctls")),
        seccomp_profile=_seccomp(sc))


def _seccomp(sc: Obj) -> dict[str, Any] | None:
    profile = sc.obj("seccompProfile")
    if profile is None:
        return None
    profile.choice("type", ("RuntimeDefault", "Unconfined", "Localhost"), "seccomp profile type")
    return profile.raw


def _security(sc: Obj) -> SecurityContext:
    caps = sc.obj("capabilities")
    return SecurityContext(
        run_as_user=sc.int("runAsUser", lo=0), run_as_group=sc.int("runAsGroup", lo=0),
        run_as_non_root=sc.bool("runAsNonRoot", None), privileged=sc.bool("privileged"),
        allow_privilege_escalation=sc.bool("allowPrivilegeEscalation", None),
        read_only_root_filesystem=sc.bool("readOnlyRootFilesystem"),
        capabilities_add=() if caps is None else caps.strings("add"),
        capabilities_drop=() if caps is None else caps.strings("drop"),
        proc_mount=sc.choice("procMount", ("Default", "Unmasked"), "procMount", "Default"),
        seccomp_profile=_seccomp(sc))


def _container(c: Obj) -> Container:
    image = c.str("image", required=True)
    res = c.obj("resources")
    sc = c.obj("securityContext")
    return Container(
        name=c.str("name", required=True), image=image, raw=c.raw,
        command=c.strings("command"), args=c.strings("args"), working_dir=c.str("workingDir", ""),
        env=tuple(EnvVar(e.str("name", required=True), e.str("value", ""),
                         None if (vf := e.obj("valueFrom")) is None else vf.raw) for e in c.objs("env")),
        env_from=tuple(e.raw for e in c.objs("envFrom")),
        ports=tuple(ContainerPort(container_port=p.int("containerPort", required=True, lo=1, hi=65535),
                                  name=p.str("name", ""), host_port=p.int("hostPort", 0, lo=0, hi=65535),
                                  host_ip=p.str("hostIP", ""),
                                  protocol=p.choice("protocol", PROTOCOLS, "protocol", "TCP"))
                    for p in c.objs("ports")),
        resources=Resources() if res is None else _resources(res),
        resize_policy=dict(_resize_policy(p) for p in c.objs("resizePolicy")),
        volume_mounts=tuple(VolumeMount(name=m.str("name", required=True), mount_path=m.str("mountPath", required=True),
                                        read_only=m.bool("readOnly"), sub_path=m.str("subPath", ""),
                                        sub_path_expr=m.str("subPathExpr", ""),
                                        mount_propagation=m.choice("mountPropagation",
                                                                   ("None", "HostToContainer", "Bidirectional"),
                                                                   "mount propagation", "None"))
                            for m in c.objs("volumeMounts")),
        liveness_probe=_probe(c.obj("livenessProbe")), readiness_probe=_probe(c.obj("readinessProbe")),
        startup_probe=_probe(c.obj("startupProbe")),
        post_start=_hook(lc.obj("postStart")) if (lc := c.obj("lifecycle")) is not None else None,
        pre_stop=_hook(lc.obj("preStop")) if lc is not None else None,
        termination_message_path=c.str("terminationMessagePath", DEFAULT_TERMINATION_MESSAGE_PATH),
        termination_message_policy=c.choice("terminationMessagePolicy", ("File", "FallbackToLogsOnError"),
                                            "termination message policy", "File"),
        image_pull_policy=c.choice("imagePullPolicy", PULL_POLICIES, "image pull policy", pull_policy(image)),
        security_context=SecurityContext() if sc is None else _security(sc),
        restart_policy=c.choice("restartPolicy", RESTART_POLICIES, "container restart policy"),
        restart_policy_rules=tuple(_restart_rule(r) for r in c.objs("restartPolicyRules")),
        stdin=c.bool("stdin"), stdin_once=c.bool("stdinOnce"), tty=c.bool("tty"))


def _restart_rule(r: Obj) -> ContainerRestartRule:
    r.str("action", required=True)
    codes = r.obj("exitCodes", required=True)  # the API requires it: a rule matches on exit codes only
    return ContainerRestartRule(r.choice("action", RESTART_RULE_ACTIONS, "container restart rule action", ""),
                                codes.choice("operator", ("In", "NotIn"), "exit codes operator", "In"),
                                codes.ints("values"))


def _resize_policy(p: Obj) -> tuple[str, str]:
    p.str("resourceName", required=True)
    p.str("restartPolicy", required=True)
    return (p.choice("resourceName", RESIZE_RESOURCES, "resize policy resource", ""),
            p.choice("restartPolicy", RESIZE_RESTART_POLICIES, "resize restart policy", ""))


PROBE_ACTIONS = ("exec", "httpGet", "tcpSocket", "grpc")
HOOK_ACTIONS = ("exec", "httpGet", "tcpSocket", "sleep")


def _action(o: Obj, known: tuple[str, ...]) -> HookAction:
    """The one action of a probe or hook (`known`: the kinds it may have)."""
    kinds = [k for k in known if o.raw.get(k) is not None]
    if len(kinds) != 1:
        raise o.error(f"must have exactly one of {', '.join(known)}, got {len(kinds)}")
    a = o.obj(kinds[0], required=True)
    if kinds[0] == "exec":
        return ExecAction(command=a.strings("command"))
    if kinds[0] == "httpGet":
        return HTTPGetAction(port=a.get("port", (int, str), 80), host=a.str("host", ""),
                             scheme=a.choice("scheme", ("HTTP", "HTTPS"), "scheme", "HTTP"), path=a.str("path", ""),
                             headers=tuple((h.str("name", required=True), h.str("value", ""))
                                           for h in a.objs("httpHeaders")))
    if kinds[0] == "tcpSocket":
        return TCPSocketAction(port=a.get("port", (int, str), 0), host=a.str("host", ""))
    if kinds[0] == "grpc":
        return GRPCAction(port=a.int("port", 0), service=a.str("service", ""))
    return SleepAction(seconds=a.int("seconds", 0, lo=0))


def _hook(h: Obj | None) -> HookAction | None:
    return None if h is None else _action(h, HOOK_ACTIONS)


def _probe(p: Obj | None) -> Probe | None:
    if p is None:
        return None
    action = _action(p, PROBE_ACTIONS)
    assert not isinstance(action, SleepAction)  # not among PROBE_ACTIONS
    return Probe(action=action,
                 initial_delay_seconds=p.int("initialDelaySeconds", 0, lo=0),
                 # 0 is the default, as the API server's defaulting reads it
                 period_seconds=p.int("periodSeconds", 0, lo=0) or 10,
                 timeout_seconds=p.int("timeoutSeconds", 0, lo=0) or 1,
                 success_threshold=p.int("successThreshold", 0, lo=0) or 1,
                 failure_threshold=p.int("failureThreshold", 0, lo=0) or 3,
                 termination_grace_period_seconds=p.int("terminationGracePeriodSeconds", lo=0))


def _volume(v: Obj) -> Volume:
    name = v.str("name", required=True)
    kinds = [k for k, value in v.raw.items() if k != "name" and value is not None]
    if not kinds:  # the API server's default source
        return Volume(name=name, kind="emptyDir", source=EmptyDirSource())
    if len(kinds) > 1:
        raise v.error(f"must have exactly one volume source, got {', '.join(kinds)}")
    kind = kinds[0]
    source = v.obj(kind, required=True)
    return Volume(name=name, kind=kind, source=_source(kind, source))


def _source(kind: str, s: Obj) -> VolumeSource:
    if kind == "emptyDir":
        limit = s.get("sizeLimit", (str, int), None)
        return EmptyDirSource(medium=s.str("medium", ""), size_limit=None if limit is None else str(limit))
    if kind == "hostPath":
        return HostPathSource(path=s.str("path", required=True), type=s.str("type", ""))
    if kind in ("configMap", "secret"):
        return _keyed(kind, s, s.int("defaultMode", DEFAULT_MODE, lo=0, hi=0o777))
    if kind == "downwardAPI":
        return _downward(s, s.int("defaultMode", DEFAULT_MODE, lo=0, hi=0o777))
    if kind == "projected":
        mode = s.int("defaultMode", DEFAULT_MODE, lo=0, hi=0o777)
        return ProjectedSource(sources=tuple(_projection(p, mode) for p in s.objs("sources")), default_mode=mode)
    if kind == "image":
        reference = s.str("reference", required=True)
        return ImageSource(reference, s.choice("pullPolicy", PULL_POLICIES, "image pull policy",
                                               pull_policy(reference)))
    return UnsupportedSource()


def _keyed(kind: str, s: Obj, default_mode: int) -> ConfigMapSource:
    return ConfigMapSource(
        kind="configmap" if kind == "configMap" else "secret",
        name=s.str("name" if kind == "configMap" else "secretName", ""),
        items=tuple(KeyToPath(key=i.str("key", required=True), path=i.str("path", required=True),
                              mode=i.int("mode", lo=0, hi=0o777)) for i in s.objs("items")),
        default_mode=default_mode, optional=s.bool("optional"))


def _downward(s: Obj, default_mode: int) -> DownwardAPISource:
    files = []
    for item in s.objs("items"):
        ref = item.obj("fieldRef")
        files.append(DownwardAPIFile(path=item.str("path", required=True),
                                     field_path=None if ref is None else ref.str("fieldPath", required=True),
                                     resource=item.get("resourceFieldRef", dict),
                                     mode=item.int("mode", lo=0, hi=0o777)))
    return DownwardAPISource(items=tuple(files), default_mode=default_mode)


def _projection(p: Obj, default_mode: int) -> Projection:
    """One source of a projected volume; its items' modes default to the volume's defaultMode."""
    if (cm := p.obj("configMap")) is not None:
        return _keyed("configMap", cm, default_mode)
    if (secret := p.obj("secret")) is not None:  # a projection names its secret `name`, not `secretName`
        return replace(_keyed("configMap", secret, default_mode), kind="secret")
    if (downward := p.obj("downwardAPI")) is not None:
        return _downward(downward, default_mode)
    if (token := p.obj("serviceAccountToken")) is not None:
        return ServiceAccountTokenProjection(
            path=token.str("path", required=True), audience=token.str("audience", ""),
            expiration_seconds=token.int("expirationSeconds", 0, lo=0) or DEFAULT_TOKEN_SECONDS)
    if (bundle := p.obj("clusterTrustBundle")) is not None:
        return _trust_bundle(bundle)
    if (cert := p.obj("podCertificate")) is not None:
        annotations = cert.get("userAnnotations", dict, {})
        for key, value in annotations.items():
            cert.check_type(value, f"{cert.name('userAnnotations')}.{key}", str)
        return PodCertificateProjection(
            signer_name=cert.str("signerName", required=True),
            key_type=cert.choice("keyType", KEY_TYPES, "key type", required=True),
            max_expiration_seconds=cert.int("maxExpirationSeconds", lo=1),
            credential_bundle_path=cert.str("credentialBundlePath", ""), key_path=cert.str("keyPath", ""),
            certificate_chain_path=cert.str("certificateChainPath", ""),
            user_annotations=tuple(sorted(annotations.items())))
    return UnsupportedProjection(kinds=tuple(sorted(p.raw)))



def _trust_bundle(b: Obj) -> ClusterTrustBundleProjection:
    name, signer = b.str("name"), b.str("signerName")
    if (name is None) == (signer is None):
        raise b.error("must set exactly one of name and signerName")
    selector = b.obj("labelSelector")
    return ClusterTrustBundleProjection(
        path=b.str("path", required=True), name=name, signer_name=signer, optional=b.bool("optional"),
        label_selector=None if selector is None else _label_selector(selector))


def _label_selector(s: Obj) -> LabelSelector:
    labels = s.get("matchLabels", dict, {})
    for key, value in labels.items():
        s.check_type(value, f"{s.name('matchLabels')}.{key}", str)
    expressions = []
    for e in s.objs("matchExpressions"):
        op = e.choice("operator", SELECTOR_OPERATORS, "label selector operator", required=True)
        values = e.strings("values")
        if (op in ("In", "NotIn")) != bool(values):
            raise e.error_type(f"{e.name('values')}: {op} needs {'some' if op in ('In', 'NotIn') else 'none'}")
        expressions.append((e.str("key", required=True), op, values))
    return LabelSelector(match_labels=tuple(sorted(labels.items())), match_expressions=tuple(expressions))
