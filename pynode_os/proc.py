"""A process named for good: its pid and its start time.

Pids are reused, so a record that keeps the pid of a container's init, a pause, a supervisor or a daemon
also keeps the process's start time (field 22 of /proc/PID/stat, in clock ticks since boot, as runc's
state.json keeps init_process_start), and the process is the recorded one only while both match. A zombie
or a dead process counts as gone: it runs nothing, and its pid is about to be free.

/proc/PID/stat is read with os.open and os.read, not open(), whose buffered layers every runtime command
would pay. The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so
the fields are counted from the last ")".
"""
from __future__ import annotations

import os


def stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/PID/stat from the state (proc(5)'s field 3) on, so that field N is at N - 3;
    raises OSError when the process is gone."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 4096)  # the whole line: a name of 16 bytes at most, then numbers
    finally:
        os.close(fd)
    return data[data.rindex(b")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat; with the pid it names one process for good. None when the process is
    gone, a zombie or dead."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def process_alive(pid: int, start: int) -> bool:
    """Whether the process recorded as `pid` with start time `start` still runs (not another one that got
    its pid since)."""
    return pid > 0 and process_start_time(pid) == start
