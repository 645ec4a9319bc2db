"""Resources.from_spec: what a valid config becomes, and that each bad field is named in the error."""
from __future__ import annotations

import pytest

from pyruntime.linux.cgroups.resources import Cpu, DeviceRule, HugepageLimit, Memory, Pids, Resources, ThrottleDevice

FULL = {
    "memory": {"limit": 536870912, "reservation": 268435456, "swap": 1073741824, "kernel": -1, "kernelTCP": -1,
               "swappiness": 0, "disableOOMKiller": False},
    "cpu": {"shares": 1024, "quota": 1000000, "burst": 1000000, "period": 500000, "realtimeRuntime": 950000,
            "realtimePeriod": 1000000, "cpus": "2-3", "mems": "0-7", "idle": 0},
    "pids": {"limit": 32771},
    "blockIO": {"weight": 10, "leafWeight": 10, "weightDevice": [{"major": 8, "minor": 0, "weight": 500}],
                "throttleReadBpsDevice": [{"major": 8, "minor": 0, "rate": 600}]},
    "hugepageLimits": [{"pageSize": "2MB", "limit": 209715200}],
    "devices": [{"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 10, "minor": 229,
                                                     "access": "rw"}],
    "unified": {"memory.high": "1G"},
    "network": {"classID": 1},
}


def test_full_spec_parses():
    r = Resources.from_spec(FULL)
    assert r.memory == Memory(limit=536870912, reservation=268435456, swap=1073741824, kernel=-1, kernel_tcp=-1,
                              swappiness=0, disable_oom_killer=False)
    assert r.cpu == Cpu(shares=1024, quota=1000000, burst=1000000, period=500000, realtime_runtime=950000,
                        realtime_period=1000000, cpus="2-3", mems="0-7", idle=0)
    assert r.pids == Pids(32771)
    assert r.block_io is not None
    assert r.block_io.weight == 10 and r.block_io.throttle_read_bps_device == (ThrottleDevice(8, 0, 600),)
    assert r.hugepage_limits == (HugepageLimit("2MB", 209715200),)
    assert r.devices == (DeviceRule(False), DeviceRule(True, "c", 10, 229, "rw"))
    assert r.devices[0].v1_entry() == "a *:* rwm"
    assert r.devices[1].v1_entry() == "c 10:229 rw"
    assert r.unified == {"memory.high": "1G"}


def test_empty_and_missing():
    assert Resources.from_spec({}) == Resources()
    assert Resources.from_spec(None) == Resources()
    assert Resources.from_spec({"memory": {}}).memory == Memory()


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"memory": {"limit": "abc"}}, 'linux.resources.memory.limit: must be an integer, got "abc"'),
        ({"memory": {"limit": True}}, "linux.resources.memory.limit: must be an integer, got true"),
        ({"memory": {"swappiness": 101}}, "linux.resources.memory.swappiness: 101 is out of range [0, 100]"),
        ({"memory": {"disableOOMKiller": 1}}, "linux.resources.memory.disableOOMKiller: must be a boolean"),
        ({"memory": []}, "linux.resources.memory: must be an object"),
        ({"cpu": {"shares": -1}}, "linux.resources.cpu.shares: -1 is out of range [0, "),
        ({"cpu": {"cpus": "3-1"}}, "linux.resources.cpu.cpus: has a range"),
        ({"cpu": {"mems": "0,a"}}, "linux.resources.cpu.mems: must be a list like"),
        ({"cpu": {"quota": 1000, "burst": 2000}}, "linux.resources.cpu.burst: must not be larger than quota"),
        ({"cpu": {"idle": 2}}, "linux.resources.cpu.idle: 2 is out of range [0, 1]"),
        ({"pids": {"limit": 1.5}}, "linux.resources.pids.limit: must be an integer, got 1.5"),
        ({"blockIO": {"weight": 70000}}, "linux.resources.blockIO.weight: 70000 is out of range [0, 65535]"),
        (
            {"blockIO": {"weightDevice": [{"major": 8, "minor": 0}]}},
            "linux.resources.blockIO.weightDevice[0]: needs weight or leafWeight",
        ),
        (
            {"blockIO": {"throttleWriteIOPSDevice": [{"major": 8, "minor": 0}]}},
            "linux.resources.blockIO.throttleWriteIOPSDevice[0].rate: required",
        ),
        ({"hugepageLimits": [{"pageSize": "2M", "limit": 1}]}, "linux.resources.hugepageLimits[0].pageSize: must look"),
        ({"hugepageLimits": [{"pageSize": "../x/1GB", "limit": 1}]}, "linux.resources.hugepageLimits[0].pageSize"),
        ({"hugepageLimits": {"pageSize": "2MB"}}, "linux.resources.hugepageLimits: must be an array"),
        (
            {"devices": [{"allow": True}, {"allow": True, "type": "x"}]},
            'linux.resources.devices[1].type: unknown device type "x"',
        ),
        ({"devices": [{"type": "c"}]}, "linux.resources.devices[0].allow: required"),
        ({"devices": [{"allow": True, "access": "rwx"}]}, "linux.resources.devices[0].access: must be a combination"),
        ({"unified": {"../memory.max": "1"}}, 'linux.resources.unified["../memory.max"]: must be a cgroup file name'),
        ({"unified": {"cgroup.procs/": "1"}}, 'linux.resources.unified["cgroup.procs/"]: must be a cgroup file name'),
        ({"unified": {"memory.high": 5}}, 'linux.resources.unified["memory.high"]: must be a string, got 5'),
    ],
)
def test_bad_field_is_named(spec, message):
    with pytest.raises(ValueError) as info:
        Resources.from_spec(spec)
    assert str(info.value).startswith(message), str(info.value)


def test_top_level_must_be_object():
    with pytest.raises(ValueError, match=r"^linux.resources: must be an object"):
        Resources.from_spec([1])


def test_merge_for_update():
    current = Resources.from_spec({"memory": {"limit": 100, "swap": 200}, "cpu": {"shares": 512, "cpus": "0"},
                                   "devices": [{"allow": False}], "unified": {"a.b": "1"}})
    update = Resources.from_spec({"memory": {"limit": 150}, "pids": {"limit": 10}, "unified": {"c.d": "2"}})
    merged = current.merge(update)
    assert merged.memory == Memory(limit=150, swap=200)
    assert merged.cpu == current.cpu
    assert merged.pids == Pids(10)
    assert merged.devices == current.devices
    assert merged.unified == {"a.b": "1", "c.d": "2"}
    hp = Resources.from_spec({"hugepageLimits": [{"pageSize": "1GB", "limit": 0}]})
    assert Resources.from_spec({"hugepageLimits": [{"pageSize": "2MB", "limit": 1}]}).merge(hp).hugepage_limits == \
        hp.hugepage_limits
