"""The D-Bus clients of the OS floor (pynode_os/systemd.py, pynode_os/logind.py) over a real dbus-daemon and real
jeepney, on a bus of the test's own: what the calls, the signal filters and the file descriptor a lock is
carry is D-Bus's and jeepney's, not a fake's. The first clients passed their unit tests against fakes that
returned a filter's queue where jeepney returns a handle, and every unit start failed on the first real bus.

The bus's far side is a stand-in for systemd's Manager and logind's Manager (their names, paths and method
signatures, answering as they do: a job path, then JobRemoved; a pipe's end for a lock), since systemd and
logind themselves run only where systemd is PID 1: the lab's VM runs the clients against them
(tests/integration/test_systemd_cgroup.py, test_node_shutdown.py). PrepareForShutdown comes from dbus-send,
as Kubernetes' node e2e tests send it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynode_os import logind, systemd

pytestmark = pytest.mark.skipif(shutil.which("dbus-daemon") is None or shutil.which("dbus-send") is None,
                                reason="needs dbus-daemon and dbus-send (Debian's dbus package)")

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/><allow own="*"/><allow send_type="method_call"/><allow send_type="signal"/>
    <allow send_requested_reply="true"/><allow receive_type="method_call"/><allow receive_type="signal"/>
    <allow receive_requested_reply="true"/>
  </policy>
</busconfig>
"""


class Services(threading.Thread):
    """systemd's and logind's Managers on the bus, as far as the clients ask them."""

    def __init__(self, address: str) -> None:
        super().__init__(name="dbus-services", daemon=True)
        from jeepney import message_bus
        self.conn = systemd.open_bus(address, enable_fds=True)
        for name in (systemd.SYSTEMD_BUS_NAME, logind.LOGIND_BUS_NAME):
            systemd.reply(self.conn, message_bus.RequestName(name))
        self.calls: list[tuple[str, tuple]] = []
        self.jobs = 0
        self.stop = threading.Event()
        self.lock_read, self.lock_write = os.pipe()  # logind's lock: the client holds the read end

    def run(self) -> None:
        from jeepney.low_level import HeaderFields, MessageType
        while not self.stop.is_set():
            try:
                message = self.conn.receive(timeout=0.1)
            except TimeoutError:
                continue
            except OSError:
                return
            if message.header.message_type == MessageType.method_call:
                self.answer(message, message.header.fields[HeaderFields.member])

    def answer(self, message, member: str) -> None:
        from jeepney import DBusAddress, new_error, new_method_return, new_signal
        self.calls.append((member, message.body))
        if member in ("StartTransientUnit", "StopUnit"):
            self.jobs += 1
            job = f"/org/freedesktop/systemd1/job/{self.jobs}"
            self.conn.send(new_method_return(message, "o", (job,)))
            emitter = DBusAddress(systemd.SYSTEMD_PATH, interface=systemd.MANAGER_INTERFACE)
            self.conn.send(new_signal(emitter, "JobRemoved", "uoss", (self.jobs, job, message.body[0], "done")))
        elif member in ("Subscribe", "ResetFailedUnit"):
            self.conn.send(new_method_return(message))
        elif member == "Get" and message.body == (logind.LOGIND_INTERFACE, "InhibitDelayMaxUSec"):
            self.conn.send(new_method_return(message, "v", (("t", 5_000_000),)))
        elif member == "Inhibit":
            self.conn.send(new_method_return(message, "h", (self.lock_read,)))
        else:
            self.conn.send(new_error(message, "org.freedesktop.DBus.Error.UnknownMethod", "s", (member,)))


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[tuple[str, Services]]:
    socket = tmp_path / "bus.sock"
    config = tmp_path / "bus.conf"
    config.write_text(BUS_CONFIG.format(socket=socket))
    daemon = subprocess.Popen(["dbus-daemon", "--config-file", str(config), "--nofork", "--print-address"],
                              stdout=subprocess.PIPE, text=True)
    assert daemon.stdout is not None
    try:
        address = daemon.stdout.readline().strip()
        services = Services(address)
        services.start()
        try:
            yield address, services
        finally:
            services.stop.set()
            services.join(timeout=5)
            services.conn.close()
            os.close(services.lock_read)
            os.close(services.lock_write)
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
        daemon.stdout.close()


def test_a_unit_is_started_and_stopped_and_each_job_waited_for(bus) -> None:
    address, services = bus
    client = systemd.DBusSystemd(address)
    try:
        systemd.start_unit(client, "pynodetest-a.scope", [("Delegate", ("b", True)), ("PIDs", ("au", [1]))])
        systemd.stop_unit(client, "pynodetest-a.scope")
    finally:
        client.close()
    assert [(member, body[:1]) for member, body in services.calls] == [
        ("Subscribe", ()), ("StartTransientUnit", ("pynodetest-a.scope",)), ("StopUnit", ("pynodetest-a.scope",)),
        ("ResetFailedUnit", ("pynodetest-a.scope",))]  # as runc's stopUnit: systemd forgets a failed scope


def test_a_lock_comes_as_a_file_descriptor_and_prepare_for_shutdown_from_dbus_send(bus) -> None:
    address, services = bus
    client = logind.DBusLogind(address)
    try:
        assert client.inhibit_delay() == 5.0
        fd = client.inhibit("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay")
        assert os.fstat(fd).st_ino == os.fstat(services.lock_read).st_ino and not os.get_inheritable(fd)
        logind.release(fd)
        client.watch_shutdown()
        for value in ("true", "false"):
            subprocess.run(["dbus-send", f"--bus={address}", "--type=signal", logind.LOGIND_PATH,
                            f"{logind.LOGIND_INTERFACE}.PrepareForShutdown", f"boolean:{value}"], check=True,
                           timeout=10)
        assert client.next_shutdown(5.0) is True
        assert client.next_shutdown(5.0) is False
        assert client.next_shutdown(0.1) is None
    finally:
        client.close()
