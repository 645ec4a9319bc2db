"""`pyruntime-cri`: the daemon's start-up and shut-down, and the one place its parts are wired together.

Order matters. The launcher (the fork server that makes pause processes, supervisors, exec helpers and
pullers) is started first, as a process of its own: this one, with gRPC's threads, never forks. Then the
state on disk is recovered, so the first RPC already sees every pod and container, and only then does the
socket open. SIGTERM and SIGINT stop serving and leave pods and containers running: their supervisors and pause
processes outlive the daemon, and the next start finds them again.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import threading
from concurrent import futures
from importlib.metadata import version
from pathlib import Path
from typing import Any

import click
import grpc

from proto import api_pb2_grpc
from pynode_os.files import make_dirs
from pyruntime.cri import attach, config, jobs, ocispec, stats
from pyruntime.cri.containers import Containers
from pyruntime.cri.events import EventHub, SupervisorWatcher
from pyruntime.cri.images import ImageService
from pyruntime.cri.launcher import Launcher
from pyruntime.cri.model import Layout
from pyruntime.cri.network import DEFAULT_ENV, Network
from pyruntime.cri.pause_image import Pauses
from pyruntime.cri.sandbox import Sandboxes
from pyruntime.cri.service.image import ImageServicer
from pyruntime.cri.service.runtime import RuntimeServicer
from pyruntime.cri.store import RecordStore
from pyruntime.cri.streaming.backend import RuntimeStreamBackend
from pyruntime.cri.streaming.server import StreamingServer
from pyruntime.errors import FailedPreconditionError, PyRuntimeError
from pyruntime.images.store import ImageStore
from pyruntime.linux.syscalls import LinuxSyscalls, Syscalls
from pyruntime.runtime import Runtime
from pyruntime.settings import Settings, cni_plugin_env

log = logging.getLogger("pyruntime.cri")

GRPC_WORKERS = 64  # each GetContainerEvents subscriber holds one for as long as it listens
MESSAGE_MAX = 16 * 1024 * 1024  # ExecSync output and big lists (the kubelet's own limit)
STOP_GRACE = 5.0  # seconds in-flight RPCs get at shut-down
SOCKET_MODE = 0o660  # containerd's: root and the socket's group (root's) connect, whatever the umask
# What the daemon's code imports lazily, for the runtime CLI's lean start (tests/unit/test_preload.py checks it)
PRELOAD = (
    "pyruntime.container.control", "pyruntime.fieldreader", "pyruntime.linux.capabilities",
    "pyruntime.linux.cgroups.devicefilter", "pyruntime.linux.cgroups.resources", "pyruntime.linux.cgroups.v1",
    "pyruntime.linux.cgroups.v2", "pyruntime.linux.cgroups.systemd", "pyruntime.linux.seccomp.profile",
    "pyruntime.oci.spec", "jeepney", "jeepney.io.blocking",  # the systemd driver's D-Bus client
)


def _options(f: Any) -> Any:
    for option in reversed(config.OPTIONS):
        f = click.option(option.flag, option.key, default=None, multiple=option.multiple, help=option.help,
                         metavar=option.metavar or ("DIR" if option.multiple else None))(f)
    return click.option("--config", "config_path", default=None, metavar="FILE",
                        help="TOML file with any of the settings below (flags override it)")(f)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@_options
def main(config_path: str | None, **flags: Any) -> None:
    """The CRI v1 server (RuntimeService and ImageService) of pyruntime."""
    try:
        cfg = config.load(config_path, flags, on_host=True)
        serve(cfg)
    except PyRuntimeError as e:
        raise click.ClickException(str(e)) from e


def claim_socket(path: str) -> None:
    """Removes a socket left by a daemon that died; refuses when a live one answers on it."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except FileNotFoundError:
        return
    except ConnectionRefusedError:
        log.info("%s: removing the socket of a daemon that is gone", path)
        os.unlink(path)
        return
    finally:
        probe.close()
    raise FailedPreconditionError(f"--listen: {path}: another pyruntime-cri is serving on it")


def make_state_dirs(kernel: Syscalls, layout: Layout, socket_path: str) -> None:
    """The daemon's directories with containerd's modes, whatever the umask, and narrowed to them when an older
    version left them wider: the roots 0711 (a container's init in a user namespace of its own reaches its
    rootfs through them), the object directories below 0711 and 0700 (nobody lists the ids), the images
    0700 (layers and upper dirs hold setuid files and secrets of private images: CVE-2021-41103). The socket's
    directory is only made when missing: it may be the host's /run."""
    for path in (layout.root, layout.state, layout.runtime_root, os.path.join(layout.root, "sandboxes"),
                 os.path.join(layout.root, "containers"), os.path.join(layout.state, "sandboxes")):
        make_dirs(path, 0o711, chmod=kernel.chmod)
    for path in (layout.images, layout.cni_cache, os.path.join(layout.state, "containers")):
        make_dirs(path, 0o700, chmod=kernel.chmod)
    make_dirs(os.path.dirname(socket_path), 0o711, chmod=kernel.chmod, narrow=False)


def preload() -> None:
    """Imports what the daemon's code imports lazily (the runtime's, for the CLI's lean start): loaded later,
    it would come from whatever code is installed by then, newer than the rest or gone (tests/unit/
    test_preload.py lists what each process may import and checks this list)."""
    for name in PRELOAD:
        importlib.import_module(name)


def serve(cfg: config.Config) -> None:
    preload()  # before anything is made: a module that can't load stops the start, not a pod's stop
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Modes are the daemon's to choose, not the shell's it was started from: under a hardened umask (077, 027)
    # the pod files its containers read as any user (resolv.conf, hosts, hostname) came out 0600 or 0640.
    # What must be closed is closed by explicit modes; the launcher and its children inherit this one.
    os.umask(0o022)
    layout = Layout(cfg.root, cfg.state)
    make_state_dirs(LinuxSyscalls(), layout, cfg.socket_path)
    claim_socket(cfg.socket_path)
    settings = cfg.runtime_settings(layout.runtime_root, layout.images)
    launcher = Launcher.spawn(settings, layout)
    try:
        _serve(cfg, layout, settings, launcher)
    finally:
        launcher.close()


def _serve(cfg: config.Config, layout: Layout, settings: Settings, launcher: Any) -> None:
    kernel = LinuxSyscalls()
    # glibc gives each thread that allocates an arena of its own, and every gRPC pool thread keeps its
    # arena's pages (bench/README.md, bench.cri's memory); the GIL serialises them anyway
    kernel.malloc_arenas(1)  # before the first thread
    runtime = Runtime(settings, kernel=kernel)
    images = ImageStore(settings.image_root, hosts_dir=Path(settings.hosts_dir), snapshotter=settings.snapshotter,
                        kernel=kernel)  # what the launcher's puller opens too
    registry_auths = cfg.pull_credentials()
    image_service = ImageService(images, pinned=[cfg.sandbox_image] if cfg.sandbox_image else [],
                                 registry_auths=registry_auths,
                                 pull=lambda ref, auth: launcher.pull_image(ref, auth, cfg.pull_progress_timeout))
    network = Network(cfg.cni_conf_dir, list(cfg.cni_bin_dirs), layout.cni_cache, kernel=kernel,
                      env=DEFAULT_ENV | cni_plugin_env())
    store = RecordStore(layout)
    events = EventHub()
    containers = Containers(
        store, layout, launcher=launcher, runtime=runtime, images=images, events=events,
        container_spec=ocispec.container_spec, linux_resources=ocispec.linux_resources,
        reopen_log=attach.reopen_log, job_types=(jobs.ContainerJob, jobs.ExecJob),
        kernel=kernel, cgroup_driver=cfg.cgroup_driver)
    pauses = Pauses(cfg.sandbox_image, launcher=launcher, runtime=runtime, images=image_service, layout=layout,
                    kernel=kernel, cgroup_driver=cfg.cgroup_driver)
    sandboxes = Sandboxes(store, layout, containers, launcher=pauses, pause_job=jobs.PauseJob,
                          release_pause=pauses.release, network=network)
    watcher = SupervisorWatcher(containers.supervisor_exited)
    containers.watch = watcher.watch

    store.recover()
    sandboxes.recover()
    watcher.start()
    containers.recover()
    log.info("recovered %d pod sandboxes and %d containers", len(store.sandboxes()), len(store.containers()))

    streaming = _streaming_server(cfg, launcher, layout, store, kernel)
    streaming.start()
    info = {"root": layout.root, "state": layout.state, "cniConfDir": cfg.cni_conf_dir,
            "cniBinDirs": list(cfg.cni_bin_dirs), "cgroupDriver": cfg.cgroup_driver,
            "streamAddress": cfg.stream_address}
    servicer = RuntimeServicer(store, sandboxes, containers, events, network=network, streaming=streaming,
                               stats=stats, runtime=runtime, layout=layout, cgroup_driver=cfg.cgroup_driver,
                               version=version("pynode"), info=info)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="cri"),
                         options=[("grpc.max_receive_message_length", MESSAGE_MAX),
                                  ("grpc.max_send_message_length", MESSAGE_MAX)])
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(servicer, server)
    api_pb2_grpc.add_ImageServiceServicer_to_server(ImageServicer(image_service), server)
    try:
        server.add_insecure_port(f"unix://{cfg.socket_path}")
    except RuntimeError as e:  # grpc's only word for a failed bind
        raise FailedPreconditionError(f"--listen: unix://{cfg.socket_path}: can't listen: {e}") from e
    # bound, not listening until start(): a connect before the chmod is refused, so the umask's mode never serves
    kernel.chmod(cfg.socket_path, SOCKET_MODE)

    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.set())
    launcher.wait_ready()
    server.start()
    log.info("serving CRI v1 on unix://%s", cfg.socket_path)
    try:
        while not stopping.wait(3600):
            pass
    finally:
        log.info("stopping; pods and containers keep running")
        events.close()
        server.stop(STOP_GRACE).wait()
        streaming.stop()
        watcher.stop()
        try:
            os.unlink(cfg.socket_path)
        except FileNotFoundError:
            pass


def _streaming_server(cfg: config.Config, launcher: Any, layout: Layout, store: Any, kernel: Any) -> Any:
    """cri-streaming's server over its backend: exec through the launcher, attach through the supervisors'
    sockets, port-forward into the pod's pinned netns (None: a hostNetwork pod)."""
    backend = RuntimeStreamBackend(launcher, layout, lambda sandbox_id: store.sandbox(sandbox_id).namespaces.get("net"),
                                   kernel)
    return StreamingServer(cfg.stream_address, backend, idle_timeout=config.parse_duration(cfg.stream_idle_timeout))



if __name__ == "__main__":
    main()
