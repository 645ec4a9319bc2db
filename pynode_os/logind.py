"""systemd-logind's shutdown inhibitor locks and its PrepareForShutdown signal, for the kubelet's graceful node
shutdown (pykubelet/node/shutdown.py), as the stock kubelet's nodeshutdown/systemd package asks logind for them.

A "delay" lock (Inhibit("shutdown", ..., "delay")) is a file descriptor: while a process holds it open, logind
announces a shutdown with PrepareForShutdown(true) and then waits, up to its InhibitDelayMaxSec, for the fd to
be closed before it lets systemd go on; PrepareForShutdown(false) says a shutdown was cancelled. logind caps
the wait at InhibitDelayMaxSec (5 s by default), so a kubelet that needs longer raises it with a drop-in of
its own (/etc/systemd/logind.conf.d/99-kubelet.conf, the stock kubelet's name, so that either kubelet finds
the other's) and a SIGHUP to systemd-logind, sent through systemd's KillUnit.

The calls go over the same jeepney helpers as the cgroup drivers' (pynode_os/systemd.py), on a connection of
their own that carries file descriptors. `Logind` is the interface the kubelet's manager calls, so that its
unit tests hand in a fake.
"""
from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod

from pynode_os.files import atomic_write, make_dirs
from pynode_os.systemd import SystemdError, manager_call, open_bus, reply

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOGIND_BUS_NAME = "org.freedesktop.login1"
LOGIND_PATH = "/org/freedesktop/login1"
LOGIND_INTERFACE = "org.freedesktop.login1.Manager"
LOGIND_UNIT = "systemd-logind.service"
SIGHUP = 1
CONF_DIR = "/etc/systemd/logind.conf.d"
KUBELET_CONF = "99-kubelet.conf"


class Logind(ABC):
    """The logind calls of a graceful node shutdown; each raises SystemdError."""

    @abstractmethod
    def inhibit_delay(self) -> float:
        """InhibitDelayMaxUSec, in seconds: how long logind waits for a delay lock's holder."""

    @abstractmethod
    def inhibit(self, what: str, who: str, why: str, mode: str) -> int:
        """Inhibit(what, who, why, mode): the lock's file descriptor, the caller's to close."""

    @abstractmethod
    def reload(self) -> None:
        """Makes logind read its configuration again (SIGHUP to systemd-logind.service, through systemd)."""

    @abstractmethod
    def watch_shutdown(self) -> None:
        """Subscribes to PrepareForShutdown; next_shutdown() then hands out each one."""

    @abstractmethod
    def next_shutdown(self, timeout: float) -> bool | None:
        """The next PrepareForShutdown's argument (True: a shutdown starts, False: it was cancelled), None if
        none came within `timeout` seconds. Raises SystemdError once the connection is gone."""

    @abstractmethod
    def close(self) -> None: ...


def release(fd: int) -> None:
    """Closes an inhibitor lock's file descriptor: logind's shutdown goes on once no delay lock is left."""
    os.close(fd)


def override_text(seconds: float) -> str:
    """The drop-in that raises logind's InhibitDelayMaxSec to `seconds`, as the stock kubelet writes it."""
    return f"# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={seconds:.0f}\n"


def override_inhibit_delay(seconds: float, directory: str = CONF_DIR) -> str:
    """Writes the kubelet's logind drop-in (in effect after reload()); returns its path."""
    make_dirs(directory, 0o755, chmod=os.chmod, narrow=False)  # logind's directory, maybe made by the admin
    path = os.path.join(directory, KUBELET_CONF)
    atomic_write(path, override_text(seconds).encode(), mode=0o644)
    return path


class DBusLogind(Logind):
    """logind on the system bus, through jeepney. The connection is opened when it is made: a kubelet that
    cannot reach logind learns it at once, and says why."""

    def __init__(self, address: str = "SYSTEM") -> None:
        self._conn: Any = open_bus(address, enable_fds=True)
        self._signals: Any = None  # jeepney's filter queue (a deque) of PrepareForShutdown signals

    def _logind(self) -> Any:
        from jeepney import DBusAddress
        return DBusAddress(LOGIND_PATH, LOGIND_BUS_NAME, LOGIND_INTERFACE)

    def inhibit_delay(self) -> float:
        from jeepney import Properties
        (value,) = reply(self._conn, Properties(self._logind()).get("InhibitDelayMaxUSec"))
        signature, usec = value
        if signature != "t":
            raise SystemdError(f"InhibitDelayMaxUSec from logind is not a uint64 as expected: {signature}")
        return usec / 1e6

    def inhibit(self, what: str, who: str, why: str, mode: str) -> int:
        from jeepney import new_method_call
        (fd,) = reply(self._conn, new_method_call(self._logind(), "Inhibit", "ssss", (what, who, why, mode)))
        raw = fd.to_raw_fd()
        os.set_inheritable(raw, False)  # received without MSG_CMSG_CLOEXEC: a child must not hold the lock
        return raw

    def reload(self) -> None:
        reply(self._conn, manager_call("KillUnit", "ssi", (LOGIND_UNIT, "all", SIGHUP)))

    def watch_shutdown(self) -> None:
        """The match names no sender, as the stock kubelet's: a PrepareForShutdown sent by anyone on the bus
        with logind's path and interface counts (Kubernetes' e2e tests emit it with dbus-send)."""
        from collections import deque

        from jeepney import MatchRule, message_bus
        rule = MatchRule(type="signal", interface=LOGIND_INTERFACE, member="PrepareForShutdown", path=LOGIND_PATH)
        self._signals = self._conn.filter(rule, queue=deque()).queue  # the handle stays in the connection's filters
        reply(self._conn, message_bus.AddMatch(rule))

    def next_shutdown(self, timeout: float) -> bool | None:
        deadline = time.monotonic() + timeout
        while True:
            if self._signals:
                signal = self._signals.popleft()
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:  # jeepney pops the signal it waited for off the queue and returns it
                    signal = self._conn.recv_until_filtered(self._signals, timeout=left)
                except TimeoutError:
                    return None
                except (OSError, ValueError) as e:
                    raise SystemdError(f"the D-Bus system bus: {e}") from e
            if signal.body and isinstance(signal.body[0], bool):
                return signal.body[0]

    def close(self) -> None:
        self._conn.close()
