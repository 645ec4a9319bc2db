"""The runtime's waits work on descriptors past FD_SETSIZE (1024).

A daemon holding many pods raises RLIMIT_NOFILE, and its children (the runtime CLI it runs, the
console proxy) inherit the limit and the open descriptors: select(2) refuses any fd >= 1024 with
ValueError, so a wait on such an fd failed instead of waiting. Each check runs in a child interpreter
that raises its soft limit within the hard one and fills the low descriptors, so the fd under test
lands above 1100.
"""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

FILL = ("import os, resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))\n"
        "null = os.open('/dev/null', os.O_RDONLY)\n"
        "while os.dup(null) < 1100: pass\n")


def _run(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", FILL + body], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


pytestmark = pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1200,
                                reason="the hard RLIMIT_NOFILE leaves no room past 1100 descriptors")


def test_wait_gone_waits_on_a_pidfd_past_fd_setsize():
    done = _run("import subprocess\n"
                "from pyruntime.container.control import wait_gone\n"
                "from pynode_os.proc import process_start_time\n"
                "p = subprocess.Popen(['sleep', '0.3'])\n"
                "start = process_start_time(p.pid)\n"
                "assert os.pidfd_open(p.pid) > 1100\n"
                "print(wait_gone(p.pid, start, 20), p.poll())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "0"]  # returned once the sleep had exited (a zombie), not at the timeout


def test_console_proxy_copies_a_pty_past_fd_setsize():
    done = _run("from pyruntime.container.console import proxy\n"
                "master, slave = os.openpty()\n"
                "high = os.dup(master)\n"
                "os.close(master)\n"
                "assert high > 1100\n"
                "os.write(slave, b'from the container\\n')\n"
                "os.close(slave)\n"
                "proxy(high)\n")
    assert done.returncode == 0, done.stderr
    assert "from the container" in done.stdout
