"""`pykubelet`: the node agent's command line, with the stock kubelet's flags and its KubeletConfiguration
file, and the start-up and shutdown order of its long-running parts.

Start-up: settings (a bad one stops here, naming it), the CRI runtime (waited for: the kubelet may start
before it) and the cgroup driver it uses, then with a kubeconfig the TLS bootstrap (with
--bootstrap-kubeconfig; pykubelet/certificates), and, off the start path, the Node registration (the node
status loop after it), the lease heartbeat, the Node's pod CIDR handed to the runtime, the pod informer;
then the pod workers (pykubelet/pods) over the pod sources (API pods and the static pods of
--pod-manifest-path, whose mirror pods it keeps), which run static pods before the API server answers;
without a kubeconfig, standalone mode: static pods only, no API client, statuses kept in memory and events
logged. In both, the HTTPS server (pykubelet/server) and, before the rest, the healthz server
(pykubelet/server/healthz.py).
SIGTERM or SIGINT stops every loop and the process exits 0; pods keep running (a kubelet restart must not
touch them).
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import click

from pykubelet import KUBELET_VERSION, config
from pynode_os.systemd import booted

log = logging.getLogger("pykubelet")
# What the kubelet's code imports lazily (tests/unit/test_preload.py checks the list): the parts main() wires up
# (imported there, so that --help and a bad flag answer at once) and the API client's resources and models.
PRELOAD = (
    "cryptography.hazmat.primitives.asymmetric.ec", "cryptography.hazmat.primitives.hashes",
    "cryptography.hazmat.primitives.serialization", "cryptography.x509", "cryptography.x509.oid", "grpc", "httpx2",
    "lightkube", "lightkube.core.decoders", "lightkube.core.exceptions", "lightkube.core.resource",
    "lightkube.core.selector", "lightkube.models.authentication_v1", "lightkube.models.authorization_v1",
    "lightkube.models.certificates_v1", "lightkube.models.core_v1", "lightkube.models.meta_v1",
    "lightkube.resources.authentication_v1", "lightkube.resources.authorization_v1",
    "lightkube.resources.certificates_v1", "lightkube.resources.coordination_v1", "lightkube.resources.core_v1",
    "lightkube.resources.node_v1", "lightkube.types", "msgspec", "pykubelet.api.client", "pykubelet.api.informer",
    "pykubelet.api.workqueue", "pykubelet.certificates.manager", "pykubelet.certificates.policy",
    "pykubelet.certificates.store", "pykubelet.dirs", "pykubelet.events", "pykubelet.eviction.manager",
    "pykubelet.eviction.policy", "pykubelet.health", "pykubelet.images.gc", "pykubelet.logs.rotation",
    "pykubelet.node.lease", "pykubelet.node.podcidr", "pykubelet.node.registration", "pykubelet.node.status",
    "pykubelet.pods.admission", "pykubelet.pods.criconfig", "pykubelet.pods.labels", "pykubelet.pods.podspec",
    "pykubelet.pods.sources", "pykubelet.pods.static", "pykubelet.pods.sysctls", "pykubelet.pods.workers",
    "pykubelet.runtime", "pykubelet.server.app", "pykubelet.server.healthz", "pykubelet.server.metrics",
    "pykubelet.volumes.manager", "yaml",
    "pykubelet.pods.slices", "jeepney", "jeepney.io.blocking",  # the systemd cgroup driver's slices, over D-Bus
    "pykubelet.node.shutdown",  # graceful node shutdown, over logind's D-Bus
)


def preload() -> None:
    """Imports what the kubelet's code imports lazily: loaded later, it would come from whatever code is
    installed by then, newer than the rest or gone (tests/unit/test_preload.py checks this list)."""
    for name in PRELOAD:
        importlib.import_module(name)


def wait_for_runtime(runtime, stop: threading.Event) -> bool:
    from pykubelet.runtime import CRIError

    delay = 0.2
    while not stop.is_set():
        try:
            v = runtime.version()
            log.info("container runtime %s %s (CRI %s) at %s", v.runtime_name, v.runtime_version,
                     v.runtime_api_version, runtime.endpoint)
            return True
        except CRIError as e:
            log.warning("waiting for the container runtime: %s", e)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
    return False


def cgroup_driver(runtime, configured: str, stop: threading.Event, tries: int = 3, wait: float = 2.0) -> str:
    """The cgroup driver the runtime uses (CRI RuntimeConfig), which the kubelet follows whatever its config
    says, as the stock kubelet's getCgroupDriverFromCRI: kubeadm writes cgroupDriver: systemd, and a runtime
    on a host without systemd uses cgroupfs. `configured` where the runtime has no RuntimeConfig
    (containerd 1.6). Raises CRIError when the runtime fails `tries` times, SystemExit when the driver is
    systemd on a host where systemd does not run."""
    from proto import api_pb2
    from pykubelet.runtime import CRIError, Unimplemented

    response = None
    for attempt in range(tries):
        try:
            response = runtime.runtime_config()
            break
        except Unimplemented:
            log.info("the container runtime has no RuntimeConfig: cgroupDriver %s from the kubelet's config",
                     configured)
            break
        except CRIError:
            if attempt == tries - 1 or stop.wait(wait):
                raise
    driver = configured
    if response is not None and response.HasField("linux"):  # unset, its driver would read as systemd
        driver = {api_pb2.SYSTEMD: "systemd", api_pb2.CGROUPFS: "cgroupfs"}[response.linux.cgroup_driver]
        if driver != configured:
            log.info("cgroup driver %s, as the container runtime says (the config's %s is not used)", driver,
                     configured)
    if driver == "systemd" and not booted():
        raise SystemExit("pykubelet: cgroupDriver: systemd: systemd is not running on this host (no "
                         "/run/systemd/system); use cgroupfs, in the runtime and the kubelet")
    return driver


def _wake_on(stop: threading.Event, wake: threading.Event) -> None:
    """Wakes a loop that waits on `wake` (the status loop, the pod CIDR's) once `stop` is set."""
    stop.wait()
    wake.set()


def _node_labels(node, settings: config.Settings) -> Callable[[], dict[str, str]]:
    """The node's labels as its Node object has them, from the node informer's watch (`node`): an admin or a
    test may label the node and bind a pod that needs the label right after, as the scheduler sees it; the
    kubelet's own (registration) labels standalone, or before the informer's first list."""
    from pykubelet.node.registration import labels

    def read() -> dict[str, str]:
        obj = None if node is None else node.get(settings.node_name)
        return labels(settings) if obj is None else dict(obj.metadata.labels or {})
    return read


def _runtime_class_known(client):
    def known(name: str) -> bool:
        if client is None:  # standalone: no RuntimeClass objects, so no runtime class is known
            return False
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.node_v1 import RuntimeClass
        try:
            client.get(RuntimeClass, name)
        except ApiError as e:
            if e.status.code == 404:
                return False
            raise
        return True
    return known


def _admission(client, runtime, settings: config.Settings, sources, node):
    from pykubelet.node.features import declared_features
    from pykubelet.node.status import node_allocatable
    from pykubelet.pods.admission import Admission, Cached
    from pykubelet.pods.labels import POD_UID
    from pykubelet.pods.sysctls import Allowlist
    from pykubelet.pods.workers import runnable

    return Admission(
        settings.node_name, pods=lambda: runnable(p.to_dict() for p in sources.objects()),
        on_node=lambda: {s.labels.get(POD_UID, "") for s in runtime.list_pod_sandbox()},
        allocatable=Cached(lambda: node_allocatable(settings)),
        labels=_node_labels(node, settings), runtime_class_known=_runtime_class_known(client),
        sysctls=Allowlist.for_node(settings.allowed_unsafe_sysctls),
        declared=declared_features(settings.feature_gates))


def _registered(register, client, settings: config.Settings, status) -> Callable[[threading.Event], None]:
    """The node status loop, after the Node's registration, which retries until the API server answers: as
    the kubelet's, off the start path, so that the pods run meanwhile (the API server may be one of them)."""
    def run(stop: threading.Event) -> None:
        if register(client, settings, status, stop):
            status.run(stop)
    return run


def _client(settings: config.Settings, stop: threading.Event, loops: list):
    """The API client, after the TLS bootstrap when there is a --bootstrap-kubeconfig (None: stopped while
    waiting for the certificate); with rotateCertificates, its transport reloads each new client
    certificate and the rotation loop joins `loops`."""
    from pykubelet.api.client import ReloadingTransport, make_client
    from pykubelet.certificates import manager, policy
    from pykubelet.certificates.store import FileStore
    from pykubelet.errors import KubeletError

    assert settings.kubeconfig is not None
    if settings.bootstrap_kubeconfig is not None:
        try:
            if not manager.bootstrap_client(settings.kubeconfig, settings.bootstrap_kubeconfig, settings.cert_dir,
                                            settings.node_name, stop):
                return None
        except KubeletError as e:  # denied, not approved in time, unreachable, a cert dir it can't write
            raise SystemExit(f"pykubelet: TLS bootstrap: {e}") from e
    if not settings.rotate_certificates:
        return make_client(settings.kubeconfig)
    store = FileStore(manager.CLIENT_STORE, settings.cert_dir)
    current = store.current()  # a rotated pair wins over the kubeconfig's own files, as in the kubelet
    transport = ReloadingTransport(settings.kubeconfig, store.current_path if current is not None else None)
    client = make_client(settings.kubeconfig, transport=transport)
    rotation = manager.CertificateManager(
        client, store, policy.CLIENT_SIGNER, lambda: policy.client_template(settings.node_name),
        lambda pair: transport.reload(store.current_path),
        current=current or manager.kubeconfig_pair(settings.kubeconfig))
    loops.append(("client-certificate", rotation.run))
    return client


def _serving_tls(settings: config.Settings, client, loops: list):
    """With serverTLSBootstrap, the HTTPS server's context from the kubelet-serving signer's certificate
    (the self-signed one or --tls-cert-file until the first is issued), and its rotation loop."""
    if not settings.server_tls_bootstrap:
        return None
    import datetime

    from pykubelet.certificates import manager, policy
    from pykubelet.certificates.store import FileStore
    from pykubelet.node.status import addresses
    from pykubelet.server.tls import ServingTLS

    def template() -> policy.Template | None:
        return policy.serving_template(settings.node_name, addresses(settings))

    store = FileStore(manager.SERVER_STORE, settings.cert_dir)
    current = store.current()
    wanted = template()
    usable = current is not None and wanted is not None and policy.unsatisfied(
        current.leaf, wanted, datetime.datetime.now(datetime.UTC)) is None
    tls = ServingTLS(settings, (current.path, current.path) if usable and current is not None else None)
    rotation = manager.CertificateManager(client, store, policy.SERVING_SIGNER, template,
                                          lambda pair: tls.load(pair.path, pair.path), current=current)
    loops.append(("serving-certificate", rotation.run))
    return tls


def run(settings: config.Settings, stop: threading.Event) -> None:
    """Runs the kubelet until `stop` is set."""
    from pykubelet.dirs import set_up_root
    from pykubelet.runtime import CRIRuntime

    os.umask(0o022)  # the modes of what it writes are its own, as pyruntime-cri's (pyruntime/cri/main.py)
    set_up_root(settings.root_dir)  # closed before anything is written below it
    runtime = CRIRuntime(settings.container_runtime_endpoint, settings.runtime_request_timeout)
    threads: list[threading.Thread] = []
    informers: list = []
    server = None
    from pykubelet.health import Heartbeats
    from pykubelet.server.healthz import Healthz

    heartbeats = Heartbeats()
    healthz = (Healthz(settings.healthz_bind_address, settings.healthz_port, heartbeats).start()
               if settings.healthz_port else None)
    try:
        if not wait_for_runtime(runtime, stop):
            return
        settings.cgroup_driver = cgroup_driver(runtime, settings.cgroup_driver, stop)
        from pykubelet.events import NORMAL, WARNING, EventRecorder, node_ref
        from pykubelet.images.gc import ImageGC
        from pykubelet.logs.rotation import LogRotator
        from pykubelet.pods.sources import PodSources
        from pykubelet.pods.static import MirrorPods, StaticPods
        from pykubelet.pods.workers import PodWorkers
        from pykubelet.server.metrics import Metrics

        client = api_pods = services = node = tls = None
        events = EventRecorder(None, settings.node_name)  # standalone: events are logged
        from pykubelet.eviction.manager import EvictionManager
        from pykubelet.node.shutdown import ShutdownManager

        evictions = EvictionManager(runtime, settings)
        shutdown = ShutdownManager(settings)
        loops: list[tuple[str, Callable[[threading.Event], None]]] = []
        if settings.kubeconfig is None:
            log.info("no --kubeconfig: standalone mode, static pods only")
            if settings.static_pod_path is None:
                log.warning("standalone mode without --pod-manifest-path: there is nothing to run")
        else:
            from pykubelet.api.informer import node_informer, pod_informer, service_informer
            from pykubelet.node.lease import NodeLease
            from pykubelet.node.podcidr import PodCIDR
            from pykubelet.node.registration import register
            from pykubelet.node.status import NodeStatus

            client = _client(settings, stop, loops)
            if client is None:
                return
            tls = _serving_tls(settings, client, loops)
            events = EventRecorder(client, settings.node_name)
            events.event(node_ref(settings.node_name), NORMAL, "Starting", "Starting kubelet.")
            status = NodeStatus(client, runtime, settings, events=events, pressure=evictions.conditions,
                                shutdown=shutdown.problem)
            evictions.on_change = shutdown.on_change = status.changed.set
            api_pods = pod_informer(client, settings.node_name)
            services = service_informer(client)
            node = node_informer(client, settings.node_name)
            pod_cidr = PodCIDR(node, runtime, settings.node_name)
            loops += [("lease", NodeLease(client, settings).run),
                      ("node-status", _registered(register, client, settings, status)), ("pod-cidr", pod_cidr.run)]
            informers.append(node.start())
            threads += [threading.Thread(target=_wake_on, args=(stop, wake), daemon=True)
                        for wake in (status.changed, pod_cidr.changed)]
        static = None
        if settings.static_pod_path is not None:
            static = StaticPods(settings.static_pod_path, settings.node_name, settings.file_check_frequency)
        sources = PodSources(api_pods, static)
        metrics = Metrics(runtime, settings.node_name)
        workers = PodWorkers(client, runtime, settings, sources, runtime_name=runtime.version().runtime_name,
                             events=events, admission=_admission(client, runtime, settings, sources, node),
                             services=services, on_started=metrics.pod_start_duration.observe, cgroups=True,
                             heartbeats=heartbeats)
        try:  # kubepods and the QoS cgroups with their limits, before any pod
            assert workers.cgroups is not None
            workers.cgroups.ensure_node()
            events.event(node_ref(settings.node_name), NORMAL, "NodeAllocatableEnforced",
                         "Updated Node Allocatable limit across pods")
        except OSError as e:  # a SystemdError stops the start: under systemd no pod's slice could be made
            log.error("node allocatable: %s", e)
            events.event(node_ref(settings.node_name), WARNING, "FailedNodeAllocatableEnforcement",
                         f"Failed to update Node Allocatable Limits: {e}")
        evictions.events = events
        evictions.bind(workers.reported_pods, workers.evict)
        shutdown.events = events
        shutdown.bind(workers.reported_pods, workers.kill)
        if workers.admission is not None:
            workers.admission.pressure = evictions.admit
            workers.admission.shutdown = shutdown.admit
        if shutdown.enabled:
            loops.append(("node-shutdown", shutdown.run))
        loops += [("pod-workers", workers.run), ("image-gc", ImageGC(runtime, settings, events).run),
                  ("eviction", evictions.run),
                  ("log-rotation", LogRotator(runtime, settings).run)]
        if client is not None:
            loops.append(("events", events.run))
            if static is not None and api_pods is not None:
                mirrors = MirrorPods(client, settings.node_name, static, api_pods, on_created=workers.resend_status)
                loops.append(("mirror-pods", mirrors.run))
        informers += [s.start() for s in sources.sources] + ([services.start()] if services is not None else [])
        for name, target in loops:
            threads.append(threading.Thread(target=target, args=(stop,), name=name, daemon=True))
        for t in threads:
            t.start()
        from pykubelet.server.app import KubeletServer

        server = KubeletServer(settings, runtime, client, pods=workers.pod, pod_list=workers.pods,
                               metrics=metrics, tls=tls, probes=workers.probes.tallies,
                               heartbeats=heartbeats).start()
        stop.wait()
    finally:
        if server is not None:
            server.stop()
        if healthz is not None:
            healthz.stop()
        for informer in informers:
            informer.stop()
        for t in threads:
            t.join(timeout=10)
        for informer in informers:
            informer.join(timeout=5)
        runtime.close()


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    """`Kubernetes vX.Y.Z`: what kubeadm's preflight parses of `kubelet --version`."""
    if value:
        click.echo(f"Kubernetes {KUBELET_VERSION}")
        ctx.exit()


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON); flags override it.")
@click.option("--kubeconfig", help="Kubeconfig of the API server; without it: standalone mode (static pods only).")
@click.option("--bootstrap-kubeconfig", help="Kubeconfig with a bootstrap token: without a valid client certificate "
              "in --kubeconfig, the kubelet asks for one with it (a CSR) and writes --kubeconfig.")
@click.option("--cert-dir", help="Where the client and serving certificates obtained by CSR go "
              "[/var/lib/kubelet/pki].")
@click.option("--container-runtime-endpoint", help="The CRI socket [unix:///run/containerd/containerd.sock].")
@click.option("--pod-manifest-path", help="Directory (or file) of static pod manifests.")
@click.option("--hostname-override", help="The node's name [the host name].")
@click.option("--node-ip", help="The node's InternalIP address.")
@click.option("--root-dir", help="The kubelet's state directory [/var/lib/kubelet].")
@click.option("--port", type=int, help="Port of the kubelet's HTTPS server [10250].")
@click.option("--tls-cert-file", help="Serving certificate of the HTTPS server.")
@click.option("--tls-private-key-file", help="Its private key.")
@click.option("--client-ca-file", help="CA bundle that client certificates are checked against.")
@click.option("--max-pods", type=int, help="Pods this node runs at most [110].")
@click.option("--allowed-unsafe-sysctls", help="Comma-separated unsafe sysctls (or prefixes ending in *) pods may "
              "set, besides the safe ones; namespaced ones only.")
@click.option("--node-labels", help="Labels the Node is registered with, key=value,...: in the kubernetes.io "
              "namespace only kubelet.kubernetes.io/, node.kubernetes.io/ and the well-known node labels.")
@click.option("--register-with-taints", help="Taints the Node is registered with, key=value:Effect,...")
@click.option("--pod-infra-container-image", help="Accepted and ignored, as by the stock kubelet: the runtime "
              "chooses the sandbox image.")
@click.option("-v", "--v", "v", type=int,
              help="Log verbosity (0: info, 1 and above: debug, 6 and above: each API request too) [0].")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the Kubernetes version this kubelet implements, as the kubelet prints it, and exit.")
def main(config_file: Path | None, pod_infra_container_image: str | None, **flags) -> None:
    """pykubelet: a kubelet in Python, for a stock kube-apiserver and any CRI runtime."""
    try:
        settings = config.build(flags, config_file)
    except config.ConfigError as e:
        click.echo(f"pykubelet: {e}", err=True)
        sys.exit(2)
    preload()  # before anything is made: a module that can't load stops the start, not a pod's sync
    logging.basicConfig(level=logging.DEBUG if settings.verbosity >= 1 else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # a line per API request (the HTTP client's, at INFO) from -v 6 on, as client-go's round trippers: at the
    # default it would be most of the log
    logging.getLogger("httpx2").setLevel(logging.INFO if settings.verbosity >= 6 else logging.WARNING)
    log.info("starting pykubelet for node %s", settings.node_name)
    if settings.not_implemented:
        log.warning("--config %s: taken but not implemented by pykubelet: %s", config_file,
                    ", ".join(settings.not_implemented))
    if pod_infra_container_image is not None:
        log.info("--pod-infra-container-image %s: ignored, as by the stock kubelet: the container runtime "
                 "chooses the sandbox image", pod_infra_container_image)
    log.debug("settings: %s", config.dump(settings))
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    run(settings, stop)
    log.info("stopped")
