"""The pure parts of the runtime library: settings from the edge, signals, the state record's format,
and the refusal to fork from a threaded process."""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pynode_os.proc import process_start_time
from pyruntime.container.create import require_single_thread
from pyruntime.container.store import FIFO
from pyruntime.errors import FailedPreconditionError, InternalError, InvalidArgumentError, PyRuntimeError
from pyruntime.linux import cgroups
from pyruntime.linux.syscalls import FakeSyscalls, LinuxSyscalls
from pyruntime.oci.default import default_spec
from pyruntime.oci.spec import parse
from pyruntime.oci.state import RECORD_VERSION, ContainerState
from pyruntime.runtime import Runtime, parse_signal
from pyruntime.settings import Settings


def test_settings_layers_defaults_then_environment_then_explicit_values():
    env = {"PYRUNTIME_IMAGE_ROOT": "/srv/images", "PYRUNTIME_SNAPSHOTTER": "copy", "PYRUNTIME_DEBUG": "1",
           "PYRUNTIME_REGISTRY_CONFIG": "/srv/certs.d"}
    s = Settings.from_env(env, root="/run/x", image_root=None)
    assert (s.root, s.image_root, s.hosts_dir, s.snapshotter, s.debug) == ("/run/x", "/srv/images", "/srv/certs.d",
                                                                           "copy", True)
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env(env, snapshotter="overlay").snapshotter == "overlay"


def test_settings_are_immutable_and_checked():
    s = Settings()
    with pytest.raises(AttributeError):
        s.root = "/elsewhere"
    assert s.replace(root="/elsewhere").root == "/elsewhere" and s.root == "/run/pyruntime"
    with pytest.raises(InvalidArgumentError, match="snapshotter"):
        Settings(snapshotter="zfs")
    with pytest.raises(InvalidArgumentError, match="log_format"):
        Settings.from_env({}, log_format="xml")
    with pytest.raises(TypeError, match="rooot"):
        Settings.from_env({}, rooot="/x")


@pytest.mark.parametrize(("given", "number"), [(9, 9), ("KILL", 9), ("sigterm", 15), ("0", 0), (0, 0), ("10", 10)])
def test_signals(given, number):
    assert parse_signal(given) == number


@pytest.mark.parametrize("given", ["NOPE", -1, 10_000, "99999"])
def test_bad_signals_are_invalid_arguments(given):
    with pytest.raises(InvalidArgumentError):
        parse_signal(given)


def test_state_record_keeps_the_sections_later_commands_need_in_typed_form():
    config = default_spec()
    config["hooks"] = {"poststop": [{"path": "/bin/true", "args": ["true"]}],
                       "prestart": [{"path": "/bin/false"}]}
    config["linux"]["namespaces"] = [ns if ns["type"] != "network" else {"type": "network", "path": "/proc/1/ns/net"}
                                     for ns in config["linux"]["namespaces"]]
    config["linux"]["resources"] = {"pids": {"limit": 10}}
    spec = parse(config, "/bundle")
    st = ContainerState.of_spec("c1", spec, bundle="/bundle", created="now", owner="root", creator_pid=1,
                                creator_start=2)
    again = ContainerState.from_json(st.to_json())
    assert again == st
    assert again.namespaces["network"] == "/proc/1/ns/net" and again.namespaces["pid"] is None
    assert [h.path for h in again.hooks_of("poststop")] == ["/bin/true"]
    assert again.hooks_of("poststart") == () and "prestart" not in again.hooks  # ran during create only
    assert again.process_spec() == spec.process
    pids = again.resources_spec().pids
    assert pids is not None and pids.limit == 10


@pytest.mark.parametrize(("raw", "message"), [
    ({"id": "c1", "bundle": "/b", "rootfs": "/r", "config": {}}, "record version None"),
    ({"version": RECORD_VERSION, "id": "c1"}, "missing bundle, rootfs"),
    ({"version": RECORD_VERSION, "id": "c1", "bundle": "/b", "rootfs": "/r", "pid": [1, 2], "bogus": 1}, None),
    ([1], "must be a JSON object"),
])
def test_unreadable_state_records_are_refused_by_name(raw, message):
    if message is None:
        ContainerState.from_json(raw)  # unknown keys are ignored; types are the writer's
        return
    with pytest.raises(ValueError, match=message):
        ContainerState.from_json(raw)


def test_an_unreadable_record_is_an_internal_error_that_list_reports_and_skips(tmp_path):
    rt = Runtime(Settings(root=str(tmp_path)))
    rt.store.reserve("bad", LinuxSyscalls())
    (tmp_path / "bad" / "state.json").write_text("{not json")
    with pytest.raises(InternalError, match=r"container 'bad': unreadable state .*delete --force"):
        rt.state("bad")
    seen: list[tuple[str, PyRuntimeError]] = []
    assert rt.list(on_error=lambda cid, e: seen.append((cid, e))) == []
    assert [cid for cid, _ in seen] == ["bad"] and isinstance(seen[0][1], InternalError)
    rt.delete("bad", force=True)
    assert not (tmp_path / "bad").exists()


def test_registry_credentials_come_from_the_environment_and_stay_out_of_repr():
    s = Settings.from_env({"PYRUNTIME_REGISTRY_CREDS": "me:secret"})
    assert s.registry_creds == "me:secret" and "secret" not in repr(s)


@contextmanager
def _another_thread() -> Iterator[None]:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()


def test_forking_is_refused_while_another_thread_runs():
    require_single_thread("create c1")  # a pytest process is single-threaded
    with _another_thread(), pytest.raises(FailedPreconditionError,
                                          match="create c1: refusing to fork from a process with 2 threads"):
        require_single_thread("create c1")


class _Past(Exception):
    """Raised where create and exec go on to their first step towards a fork: the cgroup."""


class _NoForkKernel(FakeSyscalls):
    def fork_into_cgroup(self, cgroup_fd: int, namespaces: int = 0) -> int:
        raise _Past("fork_into_cgroup")


@pytest.fixture
def no_fork(monkeypatch):
    """A recording kernel, with the container's cgroup and every fork raising _Past instead of touching the
    host: the refusal has to come before either, and a call that went past it fails the test harmlessly."""
    def past(*_args, **_kwargs):
        raise _Past("the container's cgroup")
    monkeypatch.setattr(cgroups, "manager", past)
    monkeypatch.setattr(os, "fork", past)
    return _NoForkKernel()


def _bundle(tmp_path) -> str:
    config = default_spec()
    config["process"]["terminal"] = False
    (tmp_path / "bundle" / "rootfs").mkdir(parents=True)
    (tmp_path / "bundle" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "bundle")


def test_create_refuses_to_fork_while_another_thread_runs_before_it_makes_anything(tmp_path, no_fork):
    rt = Runtime(Settings(root=str(tmp_path / "root")), kernel=no_fork)
    bundle = _bundle(tmp_path)
    with _another_thread(), pytest.raises(FailedPreconditionError,
                                          match=r"^create c1: refusing to fork from a process with 2 threads"):
        rt.create("c1", bundle)
    assert no_fork.calls == [] and not (tmp_path / "root").exists()


def test_exec_refuses_to_fork_while_another_thread_runs_before_it_makes_anything(tmp_path, no_fork):
    rt = Runtime(Settings(root=str(tmp_path / "root")), kernel=no_fork)
    rt.store.reserve("c1", no_fork)
    me = os.getpid()  # a live init for status_of: this process, with its start time
    rt.store.save(ContainerState("c1", bundle=_bundle(tmp_path), rootfs="rootfs", pid=me,
                                 pid_start=process_start_time(me) or 0))
    (tmp_path / "root" / "c1" / FIFO).touch()  # created, not started
    no_fork.calls.clear()
    process = {"args": ["true"], "cwd": "/"}
    with _another_thread(), pytest.raises(FailedPreconditionError,
                                          match=r"^exec in c1: refusing to fork from a process with 2 threads"):
        rt.exec("c1", process)
    assert no_fork.calls == []
