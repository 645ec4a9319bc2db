"""`pykubelet`: the node agent's command line, with the stock kubelet's flags and its KubeletConfiguration
file, and the start-up and shutdown order of its long-running parts.

Start-up: settings (a bad one stops here, naming it), the CRI runtime (waited for: the kubelet may start
before it), then with a kubeconfig the Node registration, the lease heartbeat, the node status loop,
the pod informer and the pod workers (pykubelet/pods); without one, standalone mode (static pods only).
SIGTERM or SIGINT stops every loop and the process exits 0; pods keep running (a kubelet restart must not
touch them).
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

import click

from pykubelet import config

log = logging.getLogger("pykubelet")


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


def _wake_on(stop: threading.Event, wake: threading.Event) -> None:
    """Wakes a loop that waits on `wake` (the status loop) once `stop` is set."""
    stop.wait()
    wake.set()


def run(settings: config.Settings, stop: threading.Event) -> None:
    """Runs the kubelet until `stop` is set."""
    from pykubelet.runtime import CRIRuntime

    runtime = CRIRuntime(settings.container_runtime_endpoint, settings.runtime_request_timeout)
    threads: list[threading.Thread] = []
    informers = []
    try:
        if not wait_for_runtime(runtime, stop):
            return
        events = None
        if settings.kubeconfig is None:
            log.info("no --kubeconfig: standalone mode, static pods only")
        else:
            from pykubelet.api.client import make_client
            from pykubelet.api.informer import pod_informer
            from pykubelet.events import EventRecorder
            from pykubelet.node.lease import NodeLease
            from pykubelet.node.registration import register
            from pykubelet.node.status import NodeStatus
            from pykubelet.pods.workers import PodWorkers

            client = make_client(settings.kubeconfig)
            status = NodeStatus(client, runtime, settings)
            if not register(client, settings, status, stop):
                return
            lease = NodeLease(client, settings)
            pods = pod_informer(client, settings.node_name)
            events = EventRecorder(client, settings.node_name)
            workers = PodWorkers(client, runtime, settings, pods, runtime_name=runtime.version().runtime_name,
                                 events=events)
            informers.append(pods.start())
            for name, target in (("lease", lease.run), ("node-status", status.run), ("pod-workers", workers.run),
                                 ("events", events.run)):
                threads.append(threading.Thread(target=target, args=(stop,), name=name, daemon=True))
            threads.append(threading.Thread(target=_wake_on, args=(stop, status.changed), daemon=True))
        from pykubelet.images.gc import ImageGC
        from pykubelet.logs.rotation import LogRotator

        threads += [threading.Thread(target=ImageGC(runtime, settings, events).run, args=(stop,), name="image-gc",
                                     daemon=True),
                    threading.Thread(target=LogRotator(runtime, settings).run, args=(stop,), name="log-rotation",
                                     daemon=True)]
        for t in threads:
            t.start()
        stop.wait()
    finally:
        for informer in informers:
            informer.stop()
        for t in threads:
            t.join(timeout=10)
        for informer in informers:
            informer.join(timeout=5)
        runtime.close()


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON); flags override it.")
@click.option("--kubeconfig", help="Kubeconfig of the API server; without it: standalone mode (static pods only).")
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
@click.option("-v", "--v", "v", type=int, help="Log verbosity (0: info, 1 and above: debug) [0].")
def main(config_file: Path | None, **flags) -> None:
    """pykubelet: a kubelet in Python, for a stock kube-apiserver and any CRI runtime."""
    try:
        settings = config.build(flags, config_file)
    except config.ConfigError as e:
        click.echo(f"pykubelet: {e}", err=True)
        sys.exit(2)
    logging.basicConfig(level=logging.DEBUG if settings.verbosity >= 1 else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("starting pykubelet for node %s", settings.node_name)
    log.debug("settings: %s", config.dump(settings))
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    run(settings, stop)
    log.info("stopped")
