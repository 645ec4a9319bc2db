"""The lab tier (make test-lab) prints what it measured."""
from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.lab.test_lab import TIMES
    if TIMES:
        terminalreporter.section("lab times")
        for step, seconds in TIMES.items():
            terminalreporter.line(f"{step}: {seconds:.0f} s")
