"""The runtime's systemd cgroup driver: cgroupsPath's slice:prefix:name form, the properties a scope is started
and updated with (runc's for the same resources), and the driver's calls on a fake bus (tests.kit.fake_systemd)
with the scope's directory in a temporary tree."""
from __future__ import annotations

import os

import pytest

from pynode_os.systemd import USEC_INFINITY
from pyruntime.errors import FailedPreconditionError
from pyruntime.linux.cgroups import manager, systemd
from pyruntime.linux.cgroups.base import CgroupError
from pyruntime.linux.cgroups.resources import Cpu, Memory, Pids, Resources
from pyruntime.linux.cgroups.systemd import SystemdManager
from tests.kit.fake_systemd import FakeSystemd

CONTAINERD_PATH = "kubepods-besteffort-pod123.slice:cri-containerd:abc"
FILES = ("memory.max", "memory.low", "memory.swap.max", "cpu.max", "cpu.weight", "pids.max", "cpuset.cpus",
         "cgroup.procs")


@pytest.mark.parametrize(("path", "parsed"), [
    ("", ("system.slice", "pyruntime", "c1")),
    ("system.slice:docker:1234", ("system.slice", "docker", "1234")),
    (CONTAINERD_PATH, ("kubepods-besteffort-pod123.slice", "cri-containerd", "abc")),
    (":pyruntime-cri:abc", ("system.slice", "pyruntime-cri", "abc")),
])
def test_parse_path(path, parsed):
    assert systemd.parse_path(path, "c1") == parsed


@pytest.mark.parametrize(("path", "error"), [
    ("/kubepods/pod1/c1", 'expected cgroupsPath to be of format "slice:prefix:name"'),
    ("a.slice:b", 'expected cgroupsPath to be of format "slice:prefix:name"'),
    ("a--b.slice:p:n", "invalid slice name: a--b.slice"),
    ("a.scope:p:n", "invalid slice name: a.scope"),
    ("a.slice:p:../n", "no '/'"),
    ("a.slice:p:", "a name given"),
    ("a.slice:p:n.slice", "a container in a slice unit is not supported"),
])
def test_parse_path_refuses_with_the_field(path, error):
    with pytest.raises(ValueError, match=r"linux\.cgroupsPath") as e:
        systemd.parse_path(path, "c1")
    assert error in str(e.value)


def test_the_scope_and_its_cgroup_are_runcs(tmp_path):
    m = SystemdManager(CONTAINERD_PATH, "abc", bus=FakeSystemd(), mountpoint=str(tmp_path))
    assert m.unit == "cri-containerd-abc.scope"
    assert m.path == (f"{tmp_path}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/"
                      "cri-containerd-abc.scope")
    assert SystemdManager("", "c1", bus=FakeSystemd(), mountpoint=str(tmp_path)).path == \
        f"{tmp_path}/system.slice/pyruntime-c1.scope"


@pytest.mark.parametrize(("cpus", "bits"), [
    ("0", b"\x01"), ("1", b"\x02"), ("0-1", b"\x03"), ("0,1", b"\x03"), (",0,1,", b"\x03"), ("0-3", b"\x0f"),
    ("0,1,2-3", b"\x0f"), ("4-7", b"\xf0"), ("0-7", b"\xff"), ("0-15", b"\xff\xff"), ("16", b"\x00\x00\x01"),
    ("0-3,32-33", b"\x0f\x00\x00\x00\x03"), ("1, 2, 1-2", b"\x06"), ("    , 1   , 3  ,  5-7,\t", b"\xea"),
    ("128-130,1", bytes([2] + [0] * 15 + [7])),
])
def test_range_to_bits_is_runcs(cpus, bits):
    assert systemd.range_to_bits(cpus) == bits


@pytest.mark.parametrize("cpus", ["", ",", "-1", "1-", "3-1", "a"])
def test_range_to_bits_refuses(cpus):
    with pytest.raises(ValueError):
        systemd.range_to_bits(cpus)


def test_unit_properties_for_a_container_with_limits():
    """runc v1.3's properties for `runc --systemd-cgroup run` of this spec: Apply's (where, delegated, the pid,
    accounting, no default dependencies), then Set's (the resources), here in the one StartTransientUnit."""
    res = Resources(memory=Memory(limit=256 << 20, reservation=128 << 20, swap=512 << 20),
                    cpu=Cpu(shares=512, quota=50000, period=100000, cpus="0-1"), pids=Pids(limit=100))
    props, files = systemd.unit_properties("kubepods-burstable.slice", "abc", 4242, res, 252)
    assert props == [
        ("Description", ("s", "pyruntime container abc")),
        ("Slice", ("s", "kubepods-burstable.slice")),
        ("Delegate", ("b", True)),
        ("PIDs", ("au", [4242])),
        ("MemoryAccounting", ("b", True)),
        ("CPUAccounting", ("b", True)),
        ("IOAccounting", ("b", True)),
        ("TasksAccounting", ("b", True)),
        ("DefaultDependencies", ("b", False)),
        ("MemoryMax", ("t", 256 << 20)),
        ("MemoryLow", ("t", 128 << 20)),
        ("MemorySwapMax", ("t", 256 << 20)),
        ("CPUWeight", ("t", 20)),
        ("CPUQuotaPeriodUSec", ("t", 100000)),
        ("CPUQuotaPerSecUSec", ("t", 500000)),
        ("TasksMax", ("t", 100)),
        ("AllowedCPUs", ("ay", b"\x03")),
    ]
    assert files == res


def test_unlimited_values_are_systemds_infinity():
    res = Resources(memory=Memory(limit=-1), cpu=Cpu(quota=-1, period=100000), pids=Pids(limit=-1))
    props = dict(systemd.resource_properties(res, 252)[0])
    assert props["MemoryMax"] == ("t", USEC_INFINITY)
    assert props["MemorySwapMax"] == ("t", USEC_INFINITY)  # unlimited memory with swap unset: both unlimited
    assert props["CPUQuotaPerSecUSec"] == ("t", USEC_INFINITY)
    assert props["TasksMax"] == ("t", USEC_INFINITY)


def test_a_fractional_cpu_quota_is_rounded_up_as_systemd_rounds_it_and_the_file_gets_the_same():
    res = Resources(cpu=Cpu(quota=12345, period=100000))
    props, files = systemd.resource_properties(res, 252)
    assert ("CPUQuotaPerSecUSec", ("t", 130000)) in props
    assert files.cpu is not None and files.cpu.quota == 13000


def test_older_systemd_gets_only_what_it_knows():
    res = Resources(cpu=Cpu(quota=50000, period=100000, cpus="0", idle=1))
    props = dict(systemd.resource_properties(res, 241)[0])
    assert "CPUQuotaPeriodUSec" not in props and "AllowedCPUs" not in props
    assert "CPUWeight" not in props  # cpu.idle through CPUWeight=0 only since 252 (the file still gets it)
    assert dict(systemd.resource_properties(res, 252)[0])["CPUWeight"] == ("t", 0)


def test_unified_keys_systemd_knows_become_properties():
    res = Resources(unified={"memory.high": "1000", "memory.min": "max", "pids.max": "5", "cpu.max": "max 50000",
                             "cpu.weight": "7", "cpuset.mems": "0", "io.weight": "10"})
    props = systemd.resource_properties(res, 252)[0]
    assert props == [("CPUQuotaPeriodUSec", ("t", 50000)), ("CPUQuotaPerSecUSec", ("t", USEC_INFINITY)),
                     ("CPUWeight", ("t", 7)), ("AllowedMemoryNodes", ("ay", b"\x01")),
                     ("MemoryHigh", ("t", 1000)), ("MemoryMin", ("t", USEC_INFINITY)), ("TasksMax", ("t", 5))]


def test_a_bad_unified_value_names_the_field():
    with pytest.raises(CgroupError, match=r"linux.resources.unified.memory.max: "):
        systemd.resource_properties(Resources(unified={"memory.max": "lots"}), 252)


@pytest.fixture
def scope(tmp_path):
    """A manager for CONTAINERD_PATH whose fake systemd makes the scope's directory, as systemd does."""
    holder: dict[str, SystemdManager] = {}

    def made(_name: str, _properties: list) -> None:
        path = holder["m"].path
        os.makedirs(path)
        for f in FILES:
            open(os.path.join(path, f), "w").close()
    bus = FakeSystemd(on_start=made)
    holder["m"] = SystemdManager(CONTAINERD_PATH, "abc", bus=bus, mountpoint=str(tmp_path))
    return holder["m"], bus


def test_create_makes_nothing_until_the_first_process(scope):
    """systemd makes a scope only around a process: create's set() waits for add(), whose pid the caller forks
    outside any cgroup (needs_pid)."""
    m, bus = scope
    assert m.create() is True
    m.set(Resources(memory=Memory(limit=1 << 20)))
    assert m.needs_pid() and bus.calls == [] and not m.exists()
    m.add(4242)
    assert bus.names() == ["StartTransientUnit", "wait"]
    name, props = bus.calls[0][1], dict(bus.calls[0][3])
    assert name == "cri-containerd-abc.scope"
    assert props["PIDs"] == ("au", [4242]) and props["MemoryMax"] == ("t", 1 << 20)
    assert props["Slice"] == ("s", "kubepods-besteffort-pod123.slice") and props["Delegate"] == ("b", True)
    assert m.read("memory.max") == str(1 << 20)  # then the files, as runc's fs2 after the properties
    assert not m.needs_pid()


def test_update_sets_the_properties_then_the_files(scope):
    m, bus = scope
    m.add(1)
    bus.calls.clear()
    m.set(Resources(cpu=Cpu(quota=20000, period=100000), pids=Pids(limit=10)))
    assert bus.calls == [("SetUnitProperties", "cri-containerd-abc.scope", True,
                          [("CPUQuotaPeriodUSec", ("t", 100000)), ("CPUQuotaPerSecUSec", ("t", 200000)),
                           ("TasksMax", ("t", 10))])]
    assert m.read("cpu.max") == "20000 100000" and m.read("pids.max") == "10"


def test_a_process_joins_an_existing_scope_through_its_file(scope):
    """`exec` into the container: the scope is there, the process is moved as with cgroupfs."""
    m, bus = scope
    m.add(1)
    bus.calls.clear()
    m.add(2)
    assert bus.calls == [] and m.read("cgroup.procs") == "2"


def test_destroy_stops_the_unit_and_waits(scope):
    m, bus = scope
    m.add(1)
    for f in FILES:
        os.unlink(os.path.join(m.path, f))
    m.destroy()
    assert bus.names()[-3:] == ["StopUnit", "wait", "ResetFailedUnit"]
    assert not m.exists()
    m.destroy()  # gone already: still done


def test_a_failed_start_is_a_cgroup_error_naming_the_unit(tmp_path):
    m = SystemdManager(CONTAINERD_PATH, "abc", bus=FakeSystemd(job_result="failed"), mountpoint=str(tmp_path))
    with pytest.raises(CgroupError, match=r"systemd unit cri-containerd-abc\.scope: start cri-containerd-abc\.scope"):
        m.add(1)


def test_the_factory_gives_the_systemd_driver_only_when_asked(tmp_path):
    from pyruntime.linux.syscalls import FakeSyscalls
    assert isinstance(manager(CONTAINERD_PATH, "abc", FakeSyscalls(), systemd=True), SystemdManager)
    with pytest.raises(ValueError, match="slice:prefix:name"):
        manager("/kubepods/abc", "abc", FakeSyscalls(), systemd=True)


def test_require_systemd_refuses_a_host_without_it(monkeypatch):
    monkeypatch.setattr(systemd, "booted", lambda: False)
    with pytest.raises(FailedPreconditionError, match="systemd is not running"):
        systemd.require_systemd("v2")
    monkeypatch.setattr(systemd, "booted", lambda: True)
    with pytest.raises(FailedPreconditionError, match="needs a cgroup v2"):
        systemd.require_systemd("v1")
    systemd.require_systemd("v2")


def test_the_d_bus_messages_marshal():
    """The property shapes above are what jeepney can put on the wire as a(sv)."""
    from pynode_os.systemd import manager_call
    props, _ = systemd.unit_properties("a.slice", "n", 1, Resources(cpu=Cpu(cpus="0-3")), 252)
    manager_call("StartTransientUnit", "ssa(sv)a(sa(sv))", ("p-n.scope", "replace", props, [])).serialise(serial=1)
    manager_call("SetUnitProperties", "sba(sv)", ("p-n.scope", True, props)).serialise(serial=2)


def _spec(cgroups_path: str, annotations: dict | None = None):
    from pyruntime.oci import spec as specmod
    from pyruntime.oci.default import default_spec
    c = default_spec()
    c["linux"]["cgroupsPath"] = cgroups_path
    c["annotations"] = annotations or {}
    return specmod.parse(c, "/bundle")


def test_validation_takes_the_systemd_form_only_with_the_driver():
    from pyruntime.linux.syscalls import FakeSyscalls
    from pyruntime.oci.spec import SpecError
    from pyruntime.oci.validate import validate
    validate(_spec(CONTAINERD_PATH), "systemd", FakeSyscalls())
    validate(_spec(CONTAINERD_PATH), "v2", FakeSyscalls())  # a cgroupfs driver takes it as a directory name, as runc
    with pytest.raises(SpecError, match=r'^linux\.cgroupsPath: expected cgroupsPath to be of format "slice:prefix'):
        validate(_spec("/kubepods/c1"), "systemd", FakeSyscalls())
    with pytest.raises(SpecError, match=r"^annotations\.org\.systemd\.property\.CPUWeight: unit properties"):
        validate(_spec(CONTAINERD_PATH, {"org.systemd.property.CPUWeight": "10"}), "systemd", FakeSyscalls())


def test_the_first_process_of_a_scope_is_forked_outside_any_cgroup(monkeypatch, tmp_path):
    """create's fork for the systemd driver: plainly, not into a cgroup2 directory that does not exist yet, and
    with a stage 1 (not cloned) for end_stage1 to add() once systemd made the scope around it."""
    from pyruntime.container import create
    from pyruntime.linux.syscalls import FakeSyscalls
    m = SystemdManager(CONTAINERD_PATH, "abc", bus=FakeSystemd(), mountpoint=str(tmp_path))
    monkeypatch.setattr(create.os, "fork", lambda: 4242)
    assert create.fork_in_cgroup(FakeSyscalls(), m, namespaces=0x20000000) == (4242, False, False)
