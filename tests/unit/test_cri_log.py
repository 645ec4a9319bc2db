"""The CRI log writer against the kubelet's reader: every entry parses by its rules
(pkg/kubelet/kuberuntime/logs parseCRILog) and joining the entries as `kubectl logs` does gives back
what the container wrote."""
from __future__ import annotations

import datetime
import os
import random
import re

from pyruntime.cri.crilog import MAX_LINE, CriLogWriter, timestamp

ENTRY = re.compile(rb"(\S+) (stdout|stderr) ([PF]) (.*)\n", re.S)


def parse(data: bytes) -> list[tuple[datetime.datetime, str, str, bytes]]:
    """The kubelet's parseCRILog over a whole file: each entry as (time, stream, tag, text); the text of
    an F entry keeps its '\\n', a P entry's loses it."""
    out = []
    for line in data.splitlines(keepends=True):
        m = ENTRY.fullmatch(line)
        assert m, f"not a CRI log entry: {line!r}"
        stamp, stream, tag, text = m.groups()
        assert re.fullmatch(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", stamp), stamp
        when = datetime.datetime.fromisoformat(stamp[:26].decode() + "+00:00")
        out.append((when, stream.decode(), tag.decode(), text if tag == b"P" else text + b"\n"))
    return out


def joined(entries, stream: str) -> bytes:
    return b"".join(text for _, s, _, text in entries if s == stream)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_lines_are_full_entries_with_nanosecond_utc_stamps(tmp_path):
    log = CriLogWriter(str(tmp_path / "pod" / "c.log"))  # the directory is made
    log.write("stdout", b"one\ntw")
    log.write("stderr", b"err\r\n")
    log.write("stdout", b"o\n\n")
    log.close()
    entries = parse(read(tmp_path / "pod" / "c.log"))
    assert [(s, t, x) for _, s, t, x in entries] == [
        ("stdout", "F", b"one\n"), ("stderr", "F", b"err\n"), ("stdout", "F", b"two\n"), ("stdout", "F", b"\n")]
    now = datetime.datetime.now(datetime.UTC)
    assert all(abs((now - when).total_seconds()) < 60 for when, *_ in entries)
    assert os.stat(tmp_path / "pod" / "c.log").st_mode & 0o777 == 0o640


def test_timestamp_is_fixed_width():
    assert timestamp(1_767_366_245_000_000_000) == "2026-01-02T15:04:05.000000000Z"
    assert timestamp(1_767_366_245_999_999_999) == "2026-01-02T15:04:05.999999999Z"


def test_long_lines_go_out_in_partial_pieces_of_containerds_size(tmp_path):
    path = tmp_path / "c.log"
    log = CriLogWriter(str(path))
    log.write("stdout", b"x" * MAX_LINE + b"\n")  # exactly the limit: one full entry
    log.write("stdout", b"y" * (2 * MAX_LINE + 5))
    log.write("stdout", b"z\n")
    log.close()
    entries = parse(read(path))
    assert [(t, len(x)) for _, _, t, x in entries] == [
        ("F", MAX_LINE + 1), ("P", MAX_LINE), ("P", MAX_LINE), ("F", 7)]


def test_a_last_line_without_newline_is_a_partial_entry_at_the_end(tmp_path):
    path = tmp_path / "c.log"
    log = CriLogWriter(str(path))
    log.write("stdout", b"done\nno newline")
    log.write("stderr", b"e")
    assert [t for _, _, t, _ in parse(read(path))] == ["F"]  # the fragment waits for its end
    log.flush("stdout")
    log.flush()
    log.flush()  # nothing left: nothing more written
    log.close()
    assert [(s, t, x) for _, s, t, x in parse(read(path))] == [
        ("stdout", "F", b"done\n"), ("stdout", "P", b"no newline"), ("stderr", "P", b"e")]


def test_any_output_reads_back_as_written(tmp_path):
    rng = random.Random(9)
    path = tmp_path / "c.log"
    log = CriLogWriter(str(path))
    written = {"stdout": bytearray(), "stderr": bytearray()}
    for _ in range(300):
        stream = rng.choice(["stdout", "stderr"])
        chunk = bytes(rng.choices(b"ab \t\n\x00\xff", k=rng.choice([1, 10, 500, 40000])))
        written[stream] += chunk
        log.write(stream, chunk)
    log.flush()
    log.close()
    entries = parse(read(path))
    for stream in written:
        assert joined(entries, stream) == bytes(written[stream])
    assert all(len(x.rstrip(b"\n")) <= MAX_LINE for *_, x in entries)


def test_reopen_continues_in_a_new_file_after_a_rename(tmp_path):
    path = tmp_path / "c.log"
    log = CriLogWriter(str(path))
    log.write("stdout", b"before\n")
    os.rename(path, tmp_path / "c.log.1")
    log.write("stdout", b"still old\n")
    log.reopen()
    log.write("stdout", b"after\n")
    log.close()
    assert joined(parse(read(tmp_path / "c.log.1")), "stdout") == b"before\nstill old\n"
    assert joined(parse(read(path)), "stdout") == b"after\n"


def test_reopen_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "d" / "c.log"
    log = CriLogWriter(str(path))
    os.rename(tmp_path / "d", tmp_path / "moved")
    (tmp_path / "d").write_text("a file where the directory was")
    try:
        log.reopen()
    except OSError:
        pass
    else:
        raise AssertionError("reopen should fail")
    log.write("stdout", b"kept\n")
    log.close()
    assert joined(parse(read(tmp_path / "moved" / "c.log")), "stdout") == b"kept\n"


def test_no_path_means_no_file(tmp_path):
    log = CriLogWriter("")
    log.write("stdout", b"x\n" + b"y" * (MAX_LINE * 2))
    log.flush()
    log.reopen()
    log.close()
    assert os.listdir(tmp_path) == []
