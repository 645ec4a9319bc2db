"""pynode_os.systemd: slice naming (runc's ExpandSlice, the kubelet's ToSystemd), the systemd version, and what
runc does around a unit's start and stop, over a fake bus that records the calls."""
from __future__ import annotations

import pytest
from jeepney.low_level import HeaderFields

from pynode_os import systemd
from pynode_os.systemd import SystemdError
from tests.kit.fake_dbus import Connection
from tests.kit.fake_systemd import UNIT_EXISTS, FakeSystemd


@pytest.mark.parametrize(("name", "path"), [
    ("-.slice", "/"),
    ("system.slice", "/system.slice"),
    ("test-a.slice", "/test.slice/test-a.slice"),
    ("test-a-b.slice", "/test.slice/test-a.slice/test-a-b.slice"),
    ("kubepods-besteffort-pod1_2.slice",
     "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice"),
])
def test_expand_slice(name, path):
    assert systemd.expand_slice(name) == path


@pytest.mark.parametrize("name", ["", ".slice", "test.scope", "test", "test--a.slice", "-test.slice", "test-.slice",
                                  "a/b.slice", "/test.slice"])
def test_expand_slice_refuses_what_systemd_would(name):
    with pytest.raises(ValueError, match="invalid slice name"):
        systemd.expand_slice(name)


@pytest.mark.parametrize(("components", "path"), [
    ([], "/"),
    (["Burstable"], "/Burstable.slice"),
    (["Burstable", "pod-123"], "/Burstable.slice/Burstable-pod_123.slice"),
    (["kubepods", "besteffort", "pod6c1a4e95-6bb6-11e6"],
     "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod6c1a4e95_6bb6_11e6.slice"),
])
def test_cgroup_name_to_systemd_is_the_kubelets(components, path):
    assert systemd.cgroup_name_to_systemd(components) == path


@pytest.mark.parametrize(("text", "number"), [
    ('"219"', 219), ('"v245.4-1.fc32"', 245), ('"241-1"', 241), ('"v241-1"', 241), ('333.45"', 333),
    ("v321-0", 321), ("252.36-1~deb12u1", 252), ("NaN", -1), ("", -1), ("v", -1),
])
def test_version_number_as_runc_reads_it(text, number):
    assert systemd.version_number(text) == number


def test_booted_needs_the_run_directory(tmp_path):
    assert not systemd.booted(str(tmp_path / "absent"))
    (tmp_path / "system").mkdir()
    assert systemd.booted(str(tmp_path / "system"))


def test_start_unit_waits_for_the_job():
    bus = FakeSystemd()
    systemd.start_unit(bus, "a.scope", [("Delegate", ("b", True))])
    assert bus.calls == [("StartTransientUnit", "a.scope", "replace", [("Delegate", ("b", True))]),
                         ("wait", "/org/freedesktop/systemd1/job/1")]


def test_start_unit_resets_a_leftover_failed_unit_and_tries_once_more():
    bus = FakeSystemd()
    bus.failed.add("a.scope")
    systemd.start_unit(bus, "a.scope", [])
    assert bus.names() == ["StartTransientUnit", "ResetFailedUnit", "StartTransientUnit", "wait"]


def test_start_unit_of_a_unit_that_stays_fails_after_one_retry():
    bus = FakeSystemd()
    bus.units["a.scope"] = []
    with pytest.raises(SystemdError, match=r"start a\.scope") as e:
        systemd.start_unit(bus, "a.scope", [])
    assert e.value.name == UNIT_EXISTS
    assert bus.names() == ["StartTransientUnit", "ResetFailedUnit", "StartTransientUnit"]


def test_start_unit_of_an_existing_slice_the_caller_only_makes_sure_of():
    bus = FakeSystemd()
    bus.units["kubepods.slice"] = []
    systemd.start_unit(bus, "kubepods.slice", [], ignore_exists=True)
    assert bus.names() == ["StartTransientUnit"]


def test_a_failed_start_job_resets_the_unit_and_fails():
    bus = FakeSystemd(job_result="failed")
    with pytest.raises(SystemdError, match="job ended 'failed'"):
        systemd.start_unit(bus, "a.scope", [])
    assert bus.names() == ["StartTransientUnit", "wait", "ResetFailedUnit"]


def test_stop_unit_waits_for_the_job_and_resets():
    bus = FakeSystemd()
    bus.units["a.scope"] = []
    systemd.stop_unit(bus, "a.scope")
    assert bus.names() == ["StopUnit", "wait", "ResetFailedUnit"]


def test_stopping_a_unit_systemd_has_removed_already_is_done():
    """A scope whose processes have all exited is stopped and collected by systemd before `delete` runs."""
    bus = FakeSystemd()
    systemd.stop_unit(bus, "gone.scope")
    assert bus.names() == ["StopUnit", "ResetFailedUnit"]


def test_slice_properties_are_runcs_for_a_slice():
    props = dict(systemd.slice_properties("kubepods.slice", "kubepods-burstable.slice"))
    assert props["Wants"] == ("as", ["kubepods.slice"])
    assert props["DefaultDependencies"] == ("b", False)
    assert all(props[k] == ("b", True) for k in ("MemoryAccounting", "CPUAccounting", "IOAccounting",
                                                 "TasksAccounting"))
    assert "Slice" not in props and "Delegate" not in props


def _job_removed(job: str, unit: str, result: str):
    from jeepney import DBusAddress, new_signal
    emitter = DBusAddress(systemd.SYSTEMD_PATH, interface=systemd.MANAGER_INTERFACE)
    return new_signal(emitter, "JobRemoved", "uoss", (1, job, unit, result))


def _connected(answer) -> tuple[systemd.DBusSystemd, Connection]:
    """A client through its own _connect (the JobRemoved match and Subscribe), on the fake connection."""
    from unittest import mock
    bus, conn = systemd.DBusSystemd(), Connection(answer)
    with mock.patch.object(systemd, "open_bus", lambda *_args, **_kw: conn):
        assert bus._connect() is conn
    assert [m.header.fields[HeaderFields.member] for m in conn.sent] == ["AddMatch", "Subscribe"]
    assert [r.header_fields["member"] for r in conn.filters] == ["JobRemoved"]
    conn.sent.clear()
    return bus, conn


def test_the_d_bus_client_starts_a_unit_and_waits_for_its_job_removed_signal():
    from jeepney import new_method_return
    bus, conn = _connected(lambda m: new_method_return(m, "o", ("/org/freedesktop/systemd1/job/7",)))
    conn.signals = [_job_removed("/org/freedesktop/systemd1/job/6", "other.scope", "failed"),
                    _job_removed("/org/freedesktop/systemd1/job/7", "a.scope", "done")]
    job = bus.start_transient_unit("a.scope", [("Delegate", ("b", True)), ("PIDs", ("au", [1]))])
    assert job == "/org/freedesktop/systemd1/job/7"
    (sent,) = conn.sent
    assert sent.header.fields[HeaderFields.member] == "StartTransientUnit"
    assert sent.body == ("a.scope", "replace", [("Delegate", ("b", True)), ("PIDs", ("au", [1]))], [])
    assert bus.wait_job(job, 1.0) == "done"
    with pytest.raises(TimeoutError):
        bus.wait_job("/org/freedesktop/systemd1/job/8", 0.01)
    bus.close()
    assert conn.closed


def test_the_d_bus_client_names_systemds_error():
    from jeepney import new_error, new_method_return
    bus, _conn = _connected(lambda m: new_error(m, UNIT_EXISTS, "s", ("Unit a.scope already exists.",))
                            if m.header.fields[HeaderFields.member] == "StartTransientUnit" else new_method_return(m))
    with pytest.raises(SystemdError, match="already exists") as e:
        bus.start_transient_unit("a.scope", [])
    assert e.value.name == UNIT_EXISTS


def test_the_d_bus_client_reads_the_version_once():
    from jeepney import new_method_return
    bus, conn = _connected(lambda m: new_method_return(m, "v", (("s", "252.36-1~deb12u1"),)))
    assert bus.version() == bus.version() == 252
    assert len(conn.sent) == 1
