"""Test tiers and the leak check.

tests/unit needs no root; tests/integration (and later tests/e2e) need root and real kernel objects,
and each such test is checked for leaks. The pytest process is a child subreaper, so an orphan that a
test leaves is reparented here, where the leak check sees it, instead of to a PID 1 that never reaps.
"""
from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterator

import pytest

from tests.leakcheck import Check, Snapshot, format_leaks, reap_orphans

PR_SET_CHILD_SUBREAPER = 36
ROOT_TIERS = ("integration", "e2e")
_session: Check = Check(Snapshot())
_session_checked = False  # root, and the check not turned off
# the Vagrant lab's tier brings up a VM under software emulation: only `make test-lab` runs it; the harness of
# `make conformance-k8s` brings up two clusters and runs ginkgo on each: only `make test-conformance-k8s` runs it
collect_ignore = ([] if os.environ.get("PYNODE_TEST_LAB") == "1" else ["lab"]) + \
    ([] if os.environ.get("PYNODE_TEST_CONFORMANCE_K8S") == "1" else ["e2e/test_conformance_k8s.py"])
_root_tests_selected = False


def _is_root_test(item: pytest.Item) -> bool:
    return any(f"/tests/{tier}/" in str(item.path) for tier in ROOT_TIERS)


def pytest_configure(config: pytest.Config) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    global _root_tests_selected
    _root_tests_selected = any(_is_root_test(item) for item in items)
    for item in items:
        if _is_root_test(item):
            item.add_marker(pytest.mark.root)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="needs root"))


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session, _session_checked
    _session_checked = os.geteuid() == 0 and os.environ.get("PYNODE_LEAKCHECK") != "0"
    _session = Check(Snapshot.take() if _session_checked else Snapshot())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    try:
        if not _session_checked or not _root_tests_selected:
            return  # a unit-only run makes no kernel objects; what changed meanwhile is someone else's
        reap_orphans()
        leaks = _session.leaks(Snapshot.take())
        if leaks:
            session.config.get_terminal_writer().line(f"SESSION LEAK CHECK FAILED: {format_leaks(leaks)}", red=True)
            session.exitstatus = 1
    finally:
        _session.clean_up()


@pytest.fixture(scope="session")
def session_leak_check() -> Check:
    """The session's check, for a fixture wider than a test (a module's runtime): what it leaves to
    Check.after runs once the session's check has looked."""
    return _session


@pytest.fixture(autouse=True)
def leak_check(request: pytest.FixtureRequest) -> Iterator[Check]:
    """Fails a root test that leaves a mount, netns, link, cgroup, state dir, process or iptables rule behind,
    and any other test that leaves a process (found here, not at the session's end where no test is named).
    A fixture that requests it may allow what legitimately stays and hand it the cleanup to run after it
    has looked (tests/leakcheck.py's Check)."""
    checked = os.environ.get("PYNODE_LEAKCHECK") != "0"
    take = Snapshot.take if _is_root_test(request.node) else Snapshot.processes
    check = Check(take() if checked else Snapshot())
    try:
        yield check
        if not checked:
            return
        leaks: dict = {}
        for _ in range(20):  # processes being killed and links being deleted settle within a second
            reap_orphans()
            leaks = check.leaks(take())
            if not leaks:
                return
            time.sleep(0.05)
        pytest.fail(f"leaked: {format_leaks(leaks)}", pytrace=False)
    finally:
        check.clean_up()
