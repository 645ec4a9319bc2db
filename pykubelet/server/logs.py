"""Containers' logs as `kubectl logs` gets them: the CRI log files the runtime writes (one line per write,
"TIMESTAMP STREAM P|F MSG", a P line being a piece of a longer line that a later F line ends) turned back
into the container's own output, with the options of the pods/log subresource (tailLines, sinceSeconds,
sinceTime, timestamps, limitBytes; follow).

The files are written by the runtime and rotated by the kubelet while being read: a reader holds no lock,
takes only complete lines (a line without its newline yet is left for the next read), and when following
notices a rotation (the path now names another file, or the file got shorter) by reading what is left of
the old file and then the new one from its start. Following ends when the caller says the container is
gone for good; when it restarted, the caller hands over the next attempt's file and following goes on.
A malformed line is passed through as is (as the kubelet does), never dropped.

Memory stays bounded whatever the file's size: the file is read CHUNK bytes at a time and written out as
it is read; tailLines finds where its last lines begin by reading backwards from the end in blocks, so a
request for the last ten lines of a huge log reads a few blocks; a line the container wrote without a
newline goes out piece by piece, as its P entries come.
"""
from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pykubelet.errors import InvalidArgumentError

POLL = 0.2  # seconds between looks at a followed file that has nothing new
CHUNK = 1 << 20  # bytes of the file read at a time
_HEAD = 128  # bytes of a CRI log line that hold its stamp, stream and tag


class LogOptionError(InvalidArgumentError):
    """A query parameter of a log request is invalid; the message names it."""


@dataclass
class LogOptions:
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None  # the last N lines (a line split into P pieces counts once)
    since: float | None = None  # epoch seconds: lines stamped before it are left out
    timestamps: bool = False
    limit_bytes: int | None = None

    @classmethod
    def from_query(cls, query: dict[str, list[str]], now: float | None = None) -> LogOptions:
        """The options of a /containerLogs query (the pods/log parameters the API server forwards)."""
        def one(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None

        def flag(name: str) -> bool:
            value = one(name)
            if value is None or value == "":
                return value == ""
            if value.lower() not in ("true", "false", "1", "0"):
                raise LogOptionError(f"{name}: expected true or false, got {value!r}")
            return value.lower() in ("true", "1")

        def count(name: str, low: int) -> int | None:
            value = one(name)
            if value is None:
                return None
            try:
                n = int(value)
            except ValueError:
                raise LogOptionError(f"{name}: expected an integer, got {value!r}") from None
            if n < low:
                raise LogOptionError(f"{name}: must be at least {low}, got {n}")
            return n

        opts = cls(follow=flag("follow"), previous=flag("previous"), tail_lines=count("tailLines", 0),
                   timestamps=flag("timestamps"), limit_bytes=count("limitBytes", 1))
        since_seconds, since_time = count("sinceSeconds", 1), one("sinceTime")
        if since_seconds is not None and since_time is not None:
            raise LogOptionError("sinceSeconds and sinceTime: at most one of them")
        if since_seconds is not None:
            opts.since = (time.time() if now is None else now) - since_seconds
        elif since_time is not None:
            try:
                opts.since = parse_time(since_time)
            except ValueError:
                raise LogOptionError(f"sinceTime: expected an RFC 3339 time, got {since_time!r}") from None
        return opts


def parse_time(stamp: str) -> float:
    """RFC 3339 with any number of fraction digits (the runtime writes nanoseconds) -> epoch seconds."""
    main, _, rest = stamp.partition(".")
    if rest:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        fraction, zone = rest[:digits], rest[digits:]
        stamp = f"{main}.{(fraction + '000000')[:6]}{zone}"
    if stamp.endswith(("Z", "z")):
        stamp = stamp[:-1] + "+00:00"
    t = datetime.datetime.fromisoformat(stamp)
    if t.tzinfo is None:
        raise ValueError(f"{stamp!r}: no time zone")
    return t.timestamp()


@dataclass
class Line:
    """A piece of the container's output: a whole line, or the piece a P entry holds, stamped with the time
    of its line's first piece."""
    stamp: bytes
    time: float | None  # None: the stamp did not parse (a malformed line, passed through)
    data: bytes  # with the newline when it ends a line
    head: bool = True  # False: a later piece of a line whose start went out already

    def render(self, timestamps: bool) -> bytes:
        return self.stamp + b" " + self.data if timestamps and self.stamp and self.head else self.data


class Joiner:
    """Turns CRI log lines (each with its newline) into the container's output as the kubelet's ReadLogs
    does: a P piece goes out at once, without a newline, and the F piece that ends its line adds the
    newline. So a prompt shows while the container waits, and what a container wrote last without a
    newline (the runtime logs it as a P entry when the stream ends, as containerd does) is not lost; a
    timestamp goes only before a line's first piece."""

    def __init__(self) -> None:
        self._line: tuple[bytes, float | None] | None = None  # the stamp and time of a line begun by P pieces

    def feed(self, raw: bytes) -> Line:
        parts = raw.rstrip(b"\n").split(b" ", 3)
        if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
            return Line(b"", None, raw)
        stamp, tags = parts[0], parts[2].split(b":")
        msg = parts[3] if len(parts) == 4 else b""
        try:
            when: float | None = parse_time(stamp.decode())
        except (ValueError, UnicodeDecodeError):
            return Line(b"", None, raw)
        head = self._line is None
        if self._line is None:
            self._line = (stamp, when)
        stamp, when = self._line
        if tags[0] == b"P":
            return Line(stamp, when, msg, head)
        self._line = None
        return Line(stamp, when, msg + b"\n", head)


def read_lines(chunks: Iterable[bytes], joiner: Joiner) -> Iterator[Line]:
    return (joiner.feed(raw) for raw in chunks)


def select(lines: Iterable[Line], since: float | None) -> Iterator[Line]:
    """The lines stamped `since` or later (all without it; a malformed line always)."""
    if since is None:
        yield from lines
    else:
        yield from (line for line in lines if line.time is None or line.time >= since)


def _ends_a_line(head: bytes) -> bool:
    """Whether the CRI log line that begins with `head` ends a line of the container's (an F line, or a
    malformed one, which stands alone) rather than being a P piece of one."""
    parts = head.split(b"\n", 1)[0].split(b" ", 3)
    return len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or parts[2].split(b":")[0] != b"P"


def tail_offset(f: BinaryIO, lines: int) -> int:
    """Where the last `lines` lines of the container's output begin in the CRI log `f`, found by reading
    blocks backwards from its end (a line whose last piece the runtime has not written yet counts, as it is
    served; a CRI line without its newline yet does not)."""
    f.seek(0, os.SEEK_END)
    pos = f.tell()
    end: int | None = None  # just past the last newline: where the complete part ends
    record_end = 0  # the end of the CRI line whose start is looked for
    ended = 0
    right = b""  # the first bytes of the block read before (right of this one)
    while pos > 0:
        size = min(CHUNK, pos)
        pos -= size
        f.seek(pos)
        block = f.read(size)
        data = block + right
        i = len(block)
        while (k := block.rfind(b"\n", 0, i)) >= 0:
            i = k
            if end is None:
                end = record_end = pos + k + 1
                continue
            if _ends_a_line(data[k + 1:k + 1 + _HEAD]) or record_end == end:  # the last line may be unfinished
                ended += 1
                if ended > lines:
                    return record_end
            record_end = pos + k + 1
        right = data[:_HEAD]
    if end is None:
        return 0
    if (_ends_a_line(right) or record_end == end) and ended + 1 > lines:
        return record_end
    return 0


class Limited:
    """The response's writer, stopping after limit_bytes: `write` returns False once nothing more goes."""

    def __init__(self, write: Callable[[bytes], None], limit: int | None) -> None:
        self._write, self.left = write, limit

    def write(self, data: bytes) -> bool:
        if self.left is not None:
            data = data[:self.left]
            self.left -= len(data)
        if data:
            self._write(data)
        return self.left is None or self.left > 0


class Follower:
    """A log file read line by line as it grows, across rotations (see the module's docstring)."""

    def __init__(self, path: Path, *, tail_lines: int | None = None) -> None:
        """`tail_lines`: start that many lines before the end rather than at the start."""
        self.path = path
        self._file = open(path, "rb")  # noqa: SIM115 (kept open across calls; closed by close())
        self._file.seek(tail_offset(self._file, tail_lines) if tail_lines is not None else 0)
        self._partial = b""

    def close(self) -> None:
        self._file.close()

    def read(self) -> Iterator[bytes]:
        """The complete lines written since the last call, CHUNK bytes of the file at a time (the old file's
        rest first after a rotation)."""
        while data := self._file.read(CHUNK):
            yield from self._lines(data)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # rotated away and not yet reopened by the runtime: the next call looks again
        mine = os.fstat(self._file.fileno())
        if (st.st_ino, st.st_dev) != (mine.st_ino, mine.st_dev) or st.st_size < self._file.tell():
            self._file.close()
            self._file = open(self.path, "rb")  # noqa: SIM115 (see __init__)
            self._partial = b""
            while data := self._file.read(CHUNK):
                yield from self._lines(data)

    def _lines(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        data = self._partial + data
        end = data.rfind(b"\n") + 1
        self._partial = data[end:]
        return data[:end].splitlines(keepends=True)


def write_logs(path: Path, opts: LogOptions, write: Callable[[bytes], None], *,
               next_path: Callable[[], Path | None] | None = None, gone: Callable[[], bool] = lambda: False,
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Writes the log at `path` as `opts` asks. Following, `next_path()` is asked each POLL while nothing
    comes: a path (the container's next attempt: go on with it), None (the container still runs: wait)
    or raises StopIteration (the container is gone for good: stop). `gone()` says the client left."""
    out = Limited(write, opts.limit_bytes)
    joiner = Joiner()
    follower = Follower(path, tail_lines=opts.tail_lines)
    try:
        for line in select(read_lines(follower.read(), joiner), opts.since):
            if not out.write(line.render(opts.timestamps)):
                return
        if not opts.follow:
            return

        def drain() -> int:
            """1: lines came, 0: nothing new, -1: limitBytes reached."""
            came = 0

            def counted() -> Iterator[bytes]:
                nonlocal came
                for raw in follower.read():
                    came = 1
                    yield raw
            for line in select(read_lines(counted(), joiner), opts.since):
                if not out.write(line.render(opts.timestamps)):
                    return -1
            return came

        while True:
            got = drain()
            if got < 0:
                return
            if got or gone() or next_path is None:
                if got:
                    continue
                return
            try:
                following = next_path()
                ended = False
            except StopIteration:
                following, ended = None, True
            if ended or (following is not None and following != follower.path):
                if drain() < 0 or ended:  # first what the container wrote just before it ended
                    return
                assert following is not None
                follower.close()
                follower, joiner = Follower(following), Joiner()
                continue
            sleep(POLL)
    finally:
        follower.close()
