"""The launcher's children name themselves in ps (set_title), without root: in a forked child, comm and
cmdline say what it is, and the forking process keeps its own."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from pyruntime.cri.forkserver import set_title
from pyruntime.linux.syscalls import LinuxSyscalls


def test_a_child_names_itself_in_ps():
    own = Path("/proc/self/cmdline").read_bytes()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        set_title(LinuxSyscalls(), "pyruntime-supervisor abc123")
        os.write(w, b"x")
        signal.pause()
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"
        assert Path(f"/proc/{pid}/comm").read_text() == "pyruntime-super\n"
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"pyruntime-supervisor", b"abc123"]
        assert Path("/proc/self/cmdline").read_bytes() == own
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
