"""The kubelet's liveness: the loops that must keep turning, each with the last time it turned.

The stock kubelet's /healthz fails its `syncloop` check when the sync loop has not turned within twice the
resync interval (at least five minutes): a kubelet that serves HTTP but no longer syncs pods is dead to
whoever probes it (systemd's watchdog scripts, kubeadm, monitoring). pykubelet has no single sync loop: pod
workers are threads of their own, woken by the PLEG and by the periodic resync. What must keep turning are
those two wakers; a worker stuck on one pod stalls that pod only, which the pod's status shows. Each loop
beats once a turn, and /healthz (here and on the authenticated server) answers as the stock kubelet does:
"ok", or 500 with the failed check named ("[-]syncloop failed: reason withheld").
"""
from __future__ import annotations

import threading
import time

MIN_WINDOW = 300.0  # seconds: the stock kubelet's floor for its sync loop's silence


class Heartbeats:
    """beat(name) from the loop; stale() lists the loops silent longer than their window."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._loops: dict[str, tuple[float, float]] = {}  # name -> (window, last beat)

    def watch(self, name: str, period: float) -> None:
        """From now on `name` must beat at least once per max(2 * period, MIN_WINDOW) seconds."""
        with self._lock:
            self._loops[name] = (max(2 * period, MIN_WINDOW), self._clock())

    def beat(self, name: str) -> None:
        with self._lock:
            if name in self._loops:
                self._loops[name] = (self._loops[name][0], self._clock())

    def stale(self) -> list[str]:
        now = self._clock()
        with self._lock:
            return sorted(name for name, (window, last) in self._loops.items() if now - last > window)

    def answer(self, verbose: bool = False) -> tuple[int, str]:
        """The status code and body of GET /healthz, in the format of the apiserver library's healthz handler
        the stock kubelet serves: the checks are `ping`, `log` (always ok here) and `syncloop`."""
        failed = "syncloop" if self.stale() else None
        if failed is None and not verbose:
            return 200, "ok"
        lines = ["[+]ping ok", "[+]log ok",
                 "[-]syncloop failed: reason withheld" if failed else "[+]syncloop ok",
                 "healthz check failed" if failed else "healthz check passed"]
        return (500 if failed else 200), "\n".join(lines) + "\n"
