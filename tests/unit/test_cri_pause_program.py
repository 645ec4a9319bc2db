"""The pause program (pause.py's machine code in a static ELF) does what the Python pause did, without root:
it keeps the argv and the comm the launcher gives it, reaps the children a pod's pid 1 inherits, exits 0 on
SIGTERM, and is a few KiB where a forked CPython is megabytes."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pyruntime.cri.pause import PROGRAM, WAITED, install_program, program_image


def test_program_image_is_an_elf_for_x86_64_only():
    image = program_image("x86_64")
    assert image is not None and image[:4] == b"\x7fELF" and len(image) < 256
    assert program_image("mips") is None


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the pause program exists for x86-64 only")
def test_the_program_reaps_and_exits_on_sigterm(tmp_path):
    program = install_program(str(tmp_path / "state"))
    assert program == str(tmp_path / "state" / PROGRAM) and os.access(program, os.X_OK)
    pid = os.fork()
    if pid == 0:  # as become_pause leaves it: the signals blocked, then a child that exits before the exec
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
            if os.fork() == 0:
                time.sleep(0.2)
                os._exit(3)
            os.execv(program, [PROGRAM, "sandbox-id"])
        finally:
            os._exit(1)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/comm").read_text().strip() != PROGRAM:
            assert time.monotonic() < deadline, "the program never ran"
            time.sleep(0.02)
        assert Path(f"/proc/{pid}/cmdline").read_bytes() == f"{PROGRAM}\0sandbox-id\0".encode()
        while _children(pid):  # its child exited: reaped, not a zombie
            assert time.monotonic() < deadline, "the pause program left its child a zombie"
            time.sleep(0.02)
        rollup = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
        assert int(rollup["Rss"].split()[0]) <= 64  # KiB
        os.kill(pid, signal.SIGTERM)
        assert os.waitpid(pid, 0)[1] == 0
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
