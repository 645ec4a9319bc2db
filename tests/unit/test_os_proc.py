"""pynode_os.proc: a pid with its start time names one process, and a zombie or a gone one names none."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from pynode_os.proc import process_alive, process_start_time, stat_fields


def test_fields_are_counted_after_the_last_parenthesis_of_the_name(tmp_path: Path) -> None:
    odd = tmp_path / "a) (b c"  # the name in /proc/PID/stat (field 2) holds parentheses and spaces
    shutil.copy(shutil.which("sleep") or "/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "10"])
    try:
        fields = stat_fields(child.pid)
        assert fields[0] in (b"R", b"S") and int(fields[1]) == os.getpid()  # state, then the parent's pid
        start = process_start_time(child.pid)
        assert start == int(fields[19]) and process_alive(child.pid, start)
        assert not process_alive(child.pid, start + 1)  # another process that got the pid since
    finally:
        child.kill()
        child.wait()


def test_a_zombie_and_a_gone_process_have_no_start_time() -> None:
    child = subprocess.Popen(["true"])
    while stat_fields(child.pid)[0] != b"Z":  # exited, not yet reaped
        time.sleep(0.01)
    assert process_start_time(child.pid) is None
    child.wait()
    assert process_start_time(child.pid) is None and not process_alive(0, 0)
