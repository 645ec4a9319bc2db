"""pynode_os.sysctl: the one table of namespaced sysctls, and sysctl names in their two forms."""
from __future__ import annotations

import pytest

from pynode_os.sysctl import IPC, NET, UTS, namespace_of, normalize, proc_path


@pytest.mark.parametrize(("name", "ns"), [
    ("kernel.sem", IPC), ("kernel.shmmax", IPC), ("kernel.shm_rmid_forced", IPC), ("kernel.msgmax", IPC),
    ("fs.mqueue.msg_max", IPC), ("net.core.somaxconn", NET), ("net.ipv4.conf.eth0/100.forwarding", NET),
    ("kernel.hostname", UTS), ("kernel.domainname", UTS),
    ("kernel.semx", ""), ("kernel.pid_max", ""), ("fs.mqueue", ""), ("vm.swappiness", ""), ("kernel.hostnamex", ""),
])
def test_namespace_of(name, ns):
    assert namespace_of(name) == ns


@pytest.mark.parametrize(("name", "dotted", "path"), [
    ("net.ipv4.ip_forward", "net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"),
    ("net/ipv4/ip_forward", "net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"),
    ("net/ipv4/conf/eth0.100/forwarding", "net.ipv4.conf.eth0/100.forwarding",
     "/proc/sys/net/ipv4/conf/eth0.100/forwarding"),
    ("net.ipv4.conf.eth0/100.forwarding", "net.ipv4.conf.eth0/100.forwarding",
     "/proc/sys/net/ipv4/conf/eth0.100/forwarding"),
])
def test_normalize_and_the_proc_path(name, dotted, path):
    assert normalize(name) == dotted and proc_path(name) == path
