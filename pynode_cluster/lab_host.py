"""The lab's control plane on the host (`make test-lab`: node VMs joined to a control plane on the machine that
runs them), as pid-file daemons the way `make cluster` runs its own (hosts.Daemons), from the lab's lab.json and
PKI (pynode_cluster.lab), with the same command lines as the control-plane VM's systemd units
(components.control_plane_argvs).

It runs in the host's network namespace, bound to the lab's control-plane address, which must be on one of the
host's interfaces (the VMs' network: its host side). etcd and the controller manager and scheduler's secure ports
listen on loopback only. Everything it makes is under STATE (etcd's data, kubeconfigs, logs, pid files); the
certificates stay in the lab's pki/, read where they are. `down` stops the daemons by pid and removes STATE,
which holds the cluster's objects (in etcd's data): nothing is left.
"""
from __future__ import annotations

import errno
import io
import json
import os
import shutil
import socket
import time
from pathlib import Path

from pynode_cluster import cluster, components, hosts
from pynode_cluster.lab import ETCD_PORTS, Lab, LabError, kubeconfig, node_objects
from pynode_cluster.pki import CONTROL_PLANE_USERS
from pynode_os.files import atomic_write

STATE = Path(os.environ.get("PYNODE_LAB_HOST_DIR", "/var/lib/pynode/lab-host"))
LOOPBACK_PORTS = (*ETCD_PORTS, 10257, 10259)  # etcd, the controller manager's and the scheduler's /healthz


def daemons() -> hosts.Daemons:
    return hosts.Daemons(STATE / "pids")


def running() -> bool:
    d = daemons()
    return any(d.process(name) for name in d.names())


def up(config: Path, ip: str | None = None, out=None, timeout: float = 120) -> int:
    """Starts the control plane of `config` (lab.json) unless it runs; 0 when it answers /readyz with the lab's
    Nodes and RBAC applied."""
    lab = Lab.load(config)
    if ip is not None and ip != lab.control_plane_ip:
        raise LabError(f"--ip {ip} is not {config}'s control_plane.ip {lab.control_plane_ip} (its certificates "
                       f"name that address): run `lab.py prepare --control-plane-ip {ip}` first")
    if running():
        print(f"the lab's control plane is already running (state in {STATE})", file=out)
        return 0
    if STATE.exists():
        raise LabError(f"{STATE} holds what is left of a control plane whose daemons are gone: `control-plane down`")
    _check_free(lab)
    started = time.monotonic()
    try:
        _up(lab, config.parent.resolve() / "pki", out, timeout)
    except BaseException as e:
        tails = "".join(f"\n--- {name} (last lines)\n{daemons().log(name, 1500)}" for name in daemons().names())
        down(out=io.StringIO())
        print(f"control plane start-up failed: {e}{tails}\nremoved what it had made", file=out)
        if isinstance(e, Exception):
            return 1
        raise
    print(f"control plane up in {time.monotonic() - started:.1f} s: {lab.server}\n"
          f"  kubectl --kubeconfig {STATE / 'admin.kubeconfig'} get nodes\n  logs: {STATE / 'logs'}", file=out)
    return 0


def _check_free(lab: Lab) -> None:
    """Each address:port the control plane binds is free (a clear message rather than a daemon's log)."""
    for address, port in [(lab.control_plane_ip, lab.apiserver_port), *(("127.0.0.1", p) for p in LOOPBACK_PORTS)]:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemons do: TIME_WAIT is no owner
            try:
                s.bind((address, port))
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    raise LabError(f"{address} is on no interface of this host: the lab's network (its host side) "
                                   "must be up first") from e
                raise LabError(f"{address}:{port} is taken ({e.strerror}): another control plane runs here?") from e


def _up(lab: Lab, pki: Path, out, timeout: float) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    logs = STATE / "logs"
    logs.mkdir(exist_ok=True)
    for stem, (user, _groups) in CONTROL_PLANE_USERS.items():  # naming the certs where prepare made them
        atomic_write(STATE / f"{stem}.kubeconfig", kubeconfig(lab, pki, stem, user), mode=0o600)
    argvs = components.control_plane_argvs(address=lab.control_plane_ip, port=lab.apiserver_port, pki=pki,
                                           etcd_dir=STATE / "etcd", etcd_ports=ETCD_PORTS, kubeconfigs=STATE,
                                           cluster_cidr=lab.cluster_cidr, service_cidr=lab.service_cidr,
                                           allocate_node_cidrs=False)  # lab.json's: node_objects below
    d = daemons()
    for name in components.CONTROL_PLANE:
        print(f"starting {name}", file=out)
        d.start(name, argvs[name], logs / f"{name}.log")
        if name == "kube-apiserver":
            hosts.wait_for("kube-apiserver /readyz",
                           lambda: components.apiserver_ready(lab.server, pki / "ca.crt", pki / "super-admin"),
                           timeout, failed=lambda: d.exited("etcd", "kube-apiserver"))
            cluster.kubectl("apply", "-f", "-", kubeconfig=STATE / "super-admin.kubeconfig",
                            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": node_objects(lab)}))


def down(out=None) -> int:
    """Stops the daemons (the apiserver before etcd, by pid) and removes STATE; 1 if something stayed."""
    if not STATE.exists():
        print("no lab control plane to remove", file=out)
        return 0
    d = daemons()
    for name in reversed(components.CONTROL_PLANE):
        d.stop(name, grace=15 if name == "kube-apiserver" else 10)
    for name in d.names():
        d.stop(name)
    shutil.rmtree(STATE, ignore_errors=True)
    if STATE.exists():
        print(f"control-plane down: {STATE} could not be removed", file=out)
        return 1
    print("lab control plane removed", file=out)
    return 0
