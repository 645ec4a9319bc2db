"""The init of a kubeadm node on one machine (kubeadm_node.py): what systemd is to a kubeadm host, for the two
units kubeadm deals with, the CRI runtime and `kubelet.service`, and the `systemctl` kubeadm calls to drive them.

kubeadm never starts the kubelet itself: it writes /var/lib/kubelet/config.yaml and kubeadm-flags.env and runs
`systemctl restart kubelet`, and the packaged unit (kubernetes/release's kubelet.service with its 10-kubeadm.conf
drop-in) runs `kubelet` with the drop-in's flags, `$KUBELET_KUBEADM_ARGS` read from kubeadm-flags.env at each
start, and Restart=always. A node of `make cluster KUBEADM=1` is a network and a mount namespace on this host, with
no systemd of its own, so this process plays it, inside the node's namespaces:
- each unit runs while it is wanted and is started again RESTART_SEC after it exits, a crash or a kill -9 alike;
- the kubelet unit is started only once config.yaml exists (the stock unit crash-loops until then: the same
  outcome without the noise), with the drop-in's command line read afresh each time;
- `systemctl` (the shim `main systemctl` in the node's PATH) reaches it over a unix socket with kubeadm's
  verbs: daemon-reload, start, stop, restart, status, is-active, is-enabled. Units it does not have (firewalld,
  systemd-resolved, which kubeadm asks about) answer as systemd answers for a unit that is not installed.

Whether a unit is wanted survives this process (the state file), as an enabled unit survives a reboot: `kubeadm
reset` stops the kubelet, and an init started again leaves it stopped. Only root reaches the socket (0600 in a
0700 directory): it starts processes as root.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pynode_cluster import hosts
from pynode_os.files import atomic_write

KUBELET_CONFIG = Path("/var/lib/kubelet/config.yaml")
KUBEADM_FLAGS = Path("/var/lib/kubelet/kubeadm-flags.env")
# 10-kubeadm.conf's KUBELET_KUBECONFIG_ARGS and KUBELET_CONFIG_ARGS
DROP_IN_ARGS = ("--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf", f"--config={KUBELET_CONFIG}")
RESTART_SEC = 2.0  # kubelet.service's is 10 s; a lab node comes back sooner
STOP_SEC = 30.0  # TimeoutStopSec: SIGTERM, then SIGKILL
UNITS = ("runtime", "kubelet")


def kubeadm_args(flags_file: Path | None = None) -> list[str]:
    """KUBELET_KUBEADM_ARGS of kubeadm-flags.env (an EnvironmentFile: NAME="value" lines), split as systemd
    splits `$VAR` in ExecStart: on whitespace, quotes honoured."""
    try:
        text = (flags_file or KUBEADM_FLAGS).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and name == "KUBELET_KUBEADM_ARGS":
            return shlex.split(shlex.split(value)[0]) if value.strip() else []
    return []


def kubelet_argv(kubelet: str) -> list[str] | None:
    """The unit's command line, or None while kubeadm has not written config.yaml."""
    if not KUBELET_CONFIG.exists():
        return None
    return [kubelet, *DROP_IN_ARGS, *kubeadm_args()]


@dataclass
class Init:
    """The units of one node, kept as wanted by `reconcile` (every 0.2 s) and changed by `command`. The units'
    processes are recorded as hosts.Daemons (pid and start time): an init started again adopts the ones still
    running instead of starting them twice."""
    dir: Path  # the socket, the state file, the units' pid files
    logs: Path  # the units' logs: NAME.log
    runtime_argv: list[str]
    kubelet: str  # the kubelet binary (`kubelet` on a kubeadm host; pykubelet or the stock one here)
    wanted: dict[str, bool] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)  # the units started (or adopted) and not stopped since
    exited_at: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        try:
            saved = json.loads(self.state.read_text())
        except (OSError, ValueError):
            saved = {}
        self.wanted = {name: bool(saved.get(name, True)) for name in UNITS}
        self.daemons = hosts.Daemons(self.dir / "units")
        self.running = {name for name in UNITS if self.active(name)}

    @property
    def sock(self) -> Path:
        return self.dir / "init.sock"

    @property
    def state(self) -> Path:
        return self.dir / "units.json"

    def _save(self) -> None:
        atomic_write(self.state, json.dumps(self.wanted).encode(), mode=0o600)

    def active(self, name: str) -> bool:
        return self.daemons.process(name) is not None

    def reconcile(self) -> None:
        with contextlib.suppress(ChildProcessError):  # our units' exits: reaped, so that they read as ended
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        with self.lock:
            now = time.monotonic()
            for name in UNITS:
                if not self.wanted[name] or self.active(name):
                    continue
                if name in self.running:  # it ran and exited: started again RESTART_SEC later
                    self.running.discard(name)
                    self.exited_at[name] = now
                if now - self.exited_at.get(name, -RESTART_SEC) >= RESTART_SEC:
                    self._start(name)

    def _start(self, name: str) -> None:
        argv = self.runtime_argv if name == "runtime" else kubelet_argv(self.kubelet)
        if argv is not None:
            self.daemons.start(name, argv, self.logs / f"{name}.log")
            self.running.add(name)

    def _stop(self, name: str) -> None:
        self.running.discard(name)
        self.exited_at.pop(name, None)  # a stop is not a crash: a start after it is not held back
        self.daemons.stop(name, grace=STOP_SEC)

    def command(self, verb: str, unit: str) -> tuple[int, str]:
        """One systemctl call: its exit status and output, as systemd's for these verbs."""
        name = unit.removesuffix(".service")
        if verb == "daemon-reload":
            return 0, ""
        if name not in UNITS:
            if verb == "is-active":
                return 3, "inactive\n"
            return 4, f"Unit {name}.service could not be found.\n"
        with self.lock:
            if verb in ("start", "restart"):
                if verb == "restart":
                    self._stop(name)
                self.wanted[name] = True
                self._save()
                if not self.active(name):
                    self._start(name)
                return 0, ""
            if verb == "stop":
                self.wanted[name] = False
                self._save()
                self._stop(name)
                return 0, ""
            if verb == "is-enabled":
                return 0, "enabled\n"
            if verb in ("is-active", "status"):
                proc = self.daemons.process(name)
                state = "active" if proc else "activating" if self.wanted[name] else "inactive"
                rc = 0 if proc else 3
                if verb == "is-active":
                    return rc, state + "\n"
                pid = f"\n   Main PID: {proc.pid}" if proc else ""
                return rc, f"* {name}.service\n     Loaded: loaded (pynode node init)\n     Active: {state}{pid}\n"
        return 1, f"Unknown command verb {verb}.\n"

    def serve(self, stop: threading.Event) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sock.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.sock))
        os.chmod(self.sock, 0o600)
        server.listen(8)
        server.settimeout(0.2)
        threading.Thread(target=self._accept, args=(server, stop), daemon=True).start()
        while not stop.is_set():
            self.reconcile()
            stop.wait(0.2)
        server.close()
        with self.lock:  # the kubelet first, as at a shutdown: nothing restarts what the runtime stops
            for name in reversed(UNITS):
                self._stop(name)

    def _accept(self, server: socket.socket, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(10)  # a caller that sends nothing does not hold the socket
                try:
                    request = json.loads(conn.makefile().readline())
                    rc, out = self.command(request["verb"], request.get("unit", ""))
                except (ValueError, KeyError, OSError) as e:
                    rc, out = 1, f"bad request: {e}\n"
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"rc": rc, "out": out}).encode() + b"\n")


def systemctl(sock: Path, args: list[str]) -> int:
    """The `systemctl` shim: the verb and unit go to the node's init, its answer comes back."""
    words = [a for a in args if not a.startswith("-")]
    if not words:
        print("systemctl (pynode node init): a verb is needed", file=sys.stderr)
        return 1
    verb, unit = words[0], (words[1] if len(words) > 1 else "")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(sock))
        except OSError as e:
            print(f"System has not been booted with pynode's node init ({sock}: {e.strerror})", file=sys.stderr)
            return 1
        conn.sendall(json.dumps({"verb": verb, "unit": unit}).encode() + b"\n")
        answer = json.loads(conn.makefile().readline() or '{"rc": 1, "out": "no answer\\n"}')
    sys.stdout.write(answer["out"])
    return int(answer["rc"])


def main(argv: list[str]) -> int:
    """`run DIR LOGS KUBELET -- RUNTIME_ARGV...`: the init; `systemctl SOCKET ARGS...`: the shim."""
    if argv[:1] == ["systemctl"] and len(argv) >= 2:
        return systemctl(Path(argv[1]), argv[2:])
    if argv[:1] == ["run"] and len(argv) >= 6 and argv[4] == "--":
        init = Init(Path(argv[1]), Path(argv[2]), argv[5:], argv[3])
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        init.serve(stop)
        return 0
    print("usage: nodeinit run DIR LOGS KUBELET -- RUNTIME_ARGV... | nodeinit systemctl SOCKET ARGS...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
