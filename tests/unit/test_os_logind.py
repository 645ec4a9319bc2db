"""pynode_os.logind's D-Bus client against a fake connection (the lab's systemd VM has the real logind:
tests/integration/test_node_shutdown.py): InhibitDelayMaxUSec read, the delay lock's fd taken and not
inherited, logind reloaded through systemd's KillUnit, PrepareForShutdown from any sender; and the drop-in
as the stock kubelet writes it."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pynode_os import logind
from tests.kit.fake_dbus import Connection


def _client(answer) -> tuple[logind.DBusLogind, Connection]:
    client = logind.DBusLogind.__new__(logind.DBusLogind)  # without a system bus
    conn = Connection(answer)
    client._conn, client._signals = conn, None
    return client, conn


def test_the_logind_client_reads_the_delay_takes_a_lock_and_reloads():
    from jeepney import new_method_return
    from jeepney.fds import FileDescriptor
    from jeepney.low_level import HeaderFields

    r, w = os.pipe()
    os.close(w)
    answers = {"Get": ("v", (("t", 30_000_000),)), "Inhibit": ("h", (FileDescriptor(r),)), "KillUnit": ("", ())}

    def answer(message):
        signature, body = answers[message.header.fields[HeaderFields.member]]
        return SimpleNamespace(header=new_method_return(message, signature).header, body=body)
    client, conn = _client(answer)
    assert client.inhibit_delay() == 30.0
    fd = client.inhibit(*("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay"))
    assert fd == r and not os.get_inheritable(fd)
    logind.release(fd)
    client.reload()
    inhibit, kill = conn.sent[1], conn.sent[2]
    assert inhibit.body == ("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay")
    assert inhibit.header.fields[HeaderFields.destination] == "org.freedesktop.login1"
    assert kill.body == ("systemd-logind.service", "all", 1)
    assert kill.header.fields[HeaderFields.member] == "KillUnit"


def test_the_logind_client_hands_out_prepare_for_shutdown_from_any_sender():
    from jeepney import DBusAddress, new_method_return, new_signal

    client, conn = _client(lambda m: new_method_return(m))
    client.watch_shutdown()
    (rule,) = conn.filters
    assert "sender" not in rule.header_fields and rule.header_fields["member"] == "PrepareForShutdown"
    emitter = DBusAddress(logind.LOGIND_PATH, interface=logind.LOGIND_INTERFACE)
    conn.signals = [new_signal(emitter, "PrepareForShutdown", "b", (True,)),
                    new_signal(emitter, "PrepareForShutdown", "b", (False,))]
    assert client.next_shutdown(1.0) is True
    assert client.next_shutdown(1.0) is False
    assert client.next_shutdown(0.01) is None


@pytest.mark.parametrize("seconds", [30, 30.4])
def test_the_drop_in_is_the_stock_kubelets(tmp_path, seconds):
    path = Path(logind.override_inhibit_delay(seconds, str(tmp_path / "logind.conf.d")))
    assert path == tmp_path / "logind.conf.d" / "99-kubelet.conf"
    assert path.read_text() == "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
