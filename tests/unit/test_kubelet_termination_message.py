"""The termination message as the kubelet reports it (getTerminationMessage, readLastStringFromContainerLogs):
the file mounted at terminationMessagePath, found through the container status's mounts; with
FallbackToLogsOnError and a failure, the end of the log when the file is empty; the runtime's own message
first. What the upstream specs "Container Runtime blackbox test ... should report termination message ..."
check."""
from __future__ import annotations

from pathlib import Path

from proto import api_pb2
from pykubelet.pods import terminationmessage as tm
from pykubelet.pods.labels import TERMINATION_MESSAGE_PATH, TERMINATION_MESSAGE_POLICY
from pykubelet.pods.runtimepod import observe
from tests.kit.fake_cri import FakeCRI

STAMP = "2026-12-06T21:00:00.000000000Z"


def status(tmp_path: Path, *, file: bytes | None = b"", policy: str = "File", code: int = 1,
           lines: list[str] | tuple[()] = (), message: str = "", reason: str = "Error") -> api_pb2.ContainerStatus:
    host = tmp_path / "msg"
    if file is not None:
        host.write_bytes(file)
    log = tmp_path / "0.log"
    log.write_text("".join(f"{STAMP} stdout F {line}\n" for line in lines))
    return api_pb2.ContainerStatus(
        state=api_pb2.CONTAINER_EXITED, exit_code=code, reason=reason, message=message, log_path=str(log),
        annotations={TERMINATION_MESSAGE_PATH: "/dev/termination-log", TERMINATION_MESSAGE_POLICY: policy},
        mounts=[api_pb2.Mount(container_path="/dev/termination-log", host_path=str(host))])


def message(s: api_pb2.ContainerStatus) -> str:
    return tm.message(s, tm.read_file_end, tm.read_log_end)


def test_the_file_is_the_message_whatever_the_policy(tmp_path: Path):
    assert message(status(tmp_path, file=b"DONE", code=0)) == "DONE"
    assert message(status(tmp_path, file=b"DONE", policy=tm.FALLBACK, lines=["log"])) == "DONE"
    assert message(status(tmp_path, file=b"x" * 5000 + b"END", code=0)) == ("x" * 5000 + "END")[-tm.MAX_FILE_BYTES:]


def test_the_log_only_with_fallback_an_empty_file_and_a_failure(tmp_path: Path):
    assert message(status(tmp_path, policy=tm.FALLBACK, lines=["DONE"])) == "DONE\n"
    assert message(status(tmp_path, file=None, policy=tm.FALLBACK, lines=["DONE"])) == "DONE\n"  # no file
    assert message(status(tmp_path, policy=tm.FALLBACK, code=0, lines=["DONE"])) == ""  # succeeded
    assert message(status(tmp_path, policy="File", lines=["DONE"])) == ""
    assert message(status(tmp_path, policy=tm.FALLBACK, lines=["DONE"], reason="ContainerCannotRun")) == ""


def test_the_logs_last_80_lines_and_2048_bytes(tmp_path: Path):
    lines = [f"line {i}" for i in range(100)]
    assert message(status(tmp_path, policy=tm.FALLBACK, lines=lines)) == "".join(f"{x}\n" for x in lines[-80:])
    long = ["y" * 1000, "z" * 1000, "w" * 1000]
    assert message(status(tmp_path, policy=tm.FALLBACK, lines=long)) == "y" * 45 + "\n" + "z" * 1000 + "\n" + \
        "w" * 1000 + "\n"  # the last 2048 bytes


def test_a_last_line_without_its_newline_is_there(tmp_path: Path):
    """`echo -n DONE; exit 1`: the runtime writes DONE as a P record that no F record ends."""
    s = status(tmp_path, policy=tm.FALLBACK)
    Path(s.log_path).write_text(f"{STAMP} stdout F first\n{STAMP} stderr P DO\n{STAMP} stderr P NE\n")
    assert message(s) == "first\nDONE"


def test_the_runtimes_message_comes_first(tmp_path: Path):
    assert message(status(tmp_path, file=b"DONE", message="OOM")) == "OOM: DONE"
    assert message(status(tmp_path, file=b"", message="OOM")) == "OOM"


def test_without_a_mount_or_a_path_there_is_no_file(tmp_path: Path):
    s = status(tmp_path, file=b"DONE")
    del s.mounts[:]
    assert message(s) == ""
    s = status(tmp_path, file=b"DONE", policy=tm.FALLBACK, lines=["from the log"])
    s.annotations[TERMINATION_MESSAGE_PATH] = ""
    assert message(s) == "from the log\n"


def test_observe_fills_in_an_exited_containers_message(tmp_path: Path):
    rt = FakeCRI()
    rt.add_sandbox("s", uid="u")
    host = tmp_path / "msg"
    host.write_bytes(b"DONE")
    for cid in ("done", "running"):
        s = rt.add_container(cid, cid, "s", annotations={TERMINATION_MESSAGE_PATH: "/dev/termination-log"})
        s.mounts.append(api_pb2.Mount(container_path="/dev/termination-log", host_path=str(host)))
    rt.exit("done", 0)
    state = observe(rt, "u")
    assert state.statuses["done"].message == "DONE" and state.statuses["running"].message == ""


def test_a_new_file_per_container_writable_by_anyone(tmp_path: Path):
    first, second = tm.new_file(tmp_path, "c"), tm.new_file(tmp_path, "c")
    assert first != second and first.parent == second.parent == tmp_path / "containers" / "c"
    assert (first.stat().st_mode & 0o777, first.read_bytes()) == (0o666, b"")
    assert tmp_path.joinpath("containers").stat().st_mode & 0o777 == 0o750
