"""The lab tier (make test-lab: one node VM) prints what it measured; the whole lab in VMs (make test-lab-full:
three of them, not for CI) is collected only when asked for."""
from __future__ import annotations

import os

import pytest

collect_ignore = [] if os.environ.get("PYNODE_TEST_LAB_FULL") == "1" else ["test_lab_full.py"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.lab.labkit import TIMES
    if TIMES:
        terminalreporter.section("lab times")
        for step, seconds in TIMES.items():
            terminalreporter.line(f"{step}: {seconds:.0f} s")
