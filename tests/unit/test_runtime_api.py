"""The pure parts of the runtime library: settings from the edge, signals, the state record's format,
and the refusal to fork from a threaded process."""
from __future__ import annotations

import threading

import pytest

from pyruntime.container.create import require_single_thread
from pyruntime.errors import FailedPreconditionError, InternalError, InvalidArgumentError, PyRuntimeError
from pyruntime.linux.syscalls import LinuxSyscalls
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


def test_forking_is_refused_while_another_thread_runs():
    require_single_thread("create c1")  # a pytest process is single-threaded
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        with pytest.raises(FailedPreconditionError, match="create c1: refusing to fork from a process with 2 threads"):
            require_single_thread("create c1")
    finally:
        stop.set()
        worker.join()
