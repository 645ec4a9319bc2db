"""SPDY/3.1 framing, as the kubelet's streaming library (moby/spdystream) speaks it: the byte format of
the frames a client-go executor or port forwarder sends after the HTTP upgrade, and the zlib header
compression with the SPDY/3 dictionary.

No maintained Python library speaks SPDY any more, so this is the one hand-written codec of the
streaming server; it is small and sans-io (bytes in, frames out) so it is unit-tested against byte
vectors. The peer is untrusted: lengths are bounded (`MAX_FRAME`) and every malformed frame raises
`SpdyError`, which ends the connection rather than the daemon. Flow control (WINDOW_UPDATE) is parsed
and ignored, as spdystream does.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from pyruntime.errors import InvalidArgumentError

VERSION = 3

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02

# RST_STREAM status codes
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, CANCEL = 1, 2, 3, 5

MAX_FRAME = 1 << 24  # the 24-bit length field's own bound (16 MiB)
MAX_HEADER_BLOCK = 1 << 20  # a decompressed header block larger than this is an attack, not a request

# the dictionary's words in order, "_" standing for the one space inside a word ("200 OK")
_WORDS = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language "
    "accept-ranges age allow authorization cache-control connection content-base content-encoding "
    "content-language content-length content-location content-md5 content-range content-type date etag "
    "expect expires from host if-match if-modified-since if-none-match if-range if-unmodified-since "
    "last-modified location max-forwards pragma proxy-authenticate proxy-authorization range referer "
    "retry-after server te trailer transfer-encoding upgrade user-agent vary via warning www-authenticate "
    "method get status 200_OK version HTTP/1.1 url public set-cookie keep-alive origin"
)
_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)


def _dictionary() -> bytes:
    """The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00 2.6.10.1): length-prefixed
    words, then a run of common header values."""
    out = bytearray()
    for word in _WORDS.split():
        raw = word.replace("_", " ").encode()
        out += struct.pack(">I", len(raw)) + raw
    return bytes(out) + _TAIL.encode()


DICTIONARY = _dictionary()


class SpdyError(InvalidArgumentError):
    """The peer sent bytes that are not SPDY/3.1: the session ends (with GOAWAY where it still can)."""


Headers = dict[str, list[str]]


@dataclass
class Data:
    stream_id: int
    data: bytes
    flags: int = 0


@dataclass
class SynStream:
    stream_id: int
    headers: Headers
    flags: int = 0
    associated_id: int = 0
    priority: int = 0


@dataclass
class SynReply:
    stream_id: int
    headers: Headers
    flags: int = 0


@dataclass
class HeadersFrame:
    """HEADERS (type 8): more headers for an open stream."""
    stream_id: int
    headers: Headers
    flags: int = 0


@dataclass
class RstStream:
    stream_id: int
    status: int


@dataclass
class Settings:
    entries: list[tuple[int, int, int]] = field(default_factory=list)  # (flags, id, value)
    flags: int = 0


@dataclass
class Ping:
    id: int


@dataclass
class GoAway:
    last_good_stream_id: int
    status: int = 0


@dataclass
class WindowUpdate:
    stream_id: int
    delta: int


Frame = Data | SynStream | SynReply | HeadersFrame | RstStream | Settings | Ping | GoAway | WindowUpdate


def encode_header_block(headers: Headers) -> bytes:
    """The uncompressed name/value block: names lowercased, several values of one name joined by NUL."""
    out = bytearray(struct.pack(">I", len(headers)))
    for name, values in headers.items():
        n = name.lower().encode()
        v = b"\0".join(value.encode() for value in values)
        out += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
    return bytes(out)


def decode_header_block(block: bytes) -> Headers:
    def take(pos: int, what: str) -> tuple[bytes, int]:
        if pos + 4 > len(block):
            raise SpdyError(f"spdy header block: truncated {what}")
        (n,) = struct.unpack_from(">I", block, pos)
        if pos + 4 + n > len(block):
            raise SpdyError(f"spdy header block: {what} of {n} bytes overruns the block")
        return block[pos + 4:pos + 4 + n], pos + 4 + n

    if len(block) < 4:
        raise SpdyError("spdy header block: no pair count")
    (count,) = struct.unpack_from(">I", block, 0)
    pos = 4
    headers: Headers = {}
    for _ in range(count):
        raw_name, pos = take(pos, "header name")
        raw_value, pos = take(pos, "header value")
        try:
            name, value = raw_name.decode(), raw_value.decode()
        except UnicodeDecodeError as e:
            raise SpdyError(f"spdy header block: header {raw_name!r} is not UTF-8") from e
        if not name or name != name.lower():
            raise SpdyError(f"spdy header block: header name {name!r} is empty or not lower case")
        headers.setdefault(name, []).extend(value.split("\0"))
    return headers


class Framer:
    """One side of a SPDY session: encodes what it sends and decodes what it receives. Each direction
    has one zlib stream for the whole session (every header block continues it), so a Framer is bound
    to one connection and its encode() calls must be serialized by the caller."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)
        self._inflate = zlib.decompressobj(15, DICTIONARY)
        self._buf = bytearray()

    # sending
    def _compress(self, headers: Headers) -> bytes:
        block = encode_header_block(headers)
        return self._deflate.compress(block) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def encode(self, frame: Frame) -> bytes:
        if isinstance(frame, Data):
            if len(frame.data) >= MAX_FRAME:
                raise InvalidArgumentError(f"spdy data frame: {len(frame.data)} bytes is too long")
            return struct.pack(">II", frame.stream_id & 0x7FFFFFFF,
                               (frame.flags << 24) | len(frame.data)) + frame.data
        if isinstance(frame, SynStream):
            body = struct.pack(">IIBB", frame.stream_id & 0x7FFFFFFF, frame.associated_id & 0x7FFFFFFF,
                               (frame.priority & 7) << 5, 0) + self._compress(frame.headers)
            return _control(SYN_STREAM, frame.flags, body)
        if isinstance(frame, SynReply):
            return _control(SYN_REPLY, frame.flags,
                            struct.pack(">I", frame.stream_id & 0x7FFFFFFF) + self._compress(frame.headers))
        if isinstance(frame, HeadersFrame):
            return _control(HEADERS, frame.flags,
                            struct.pack(">I", frame.stream_id & 0x7FFFFFFF) + self._compress(frame.headers))
        if isinstance(frame, RstStream):
            return _control(RST_STREAM, 0, struct.pack(">II", frame.stream_id & 0x7FFFFFFF, frame.status))
        if isinstance(frame, Settings):
            body = struct.pack(">I", len(frame.entries)) + b"".join(
                struct.pack(">II", (flags << 24) | (sid & 0xFFFFFF), value) for flags, sid, value in frame.entries)
            return _control(SETTINGS, frame.flags, body)
        if isinstance(frame, Ping):
            return _control(PING, 0, struct.pack(">I", frame.id))
        if isinstance(frame, GoAway):
            return _control(GOAWAY, 0, struct.pack(">II", frame.last_good_stream_id & 0x7FFFFFFF, frame.status))
        if isinstance(frame, WindowUpdate):
            return _control(WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id & 0x7FFFFFFF,
                                                          frame.delta & 0x7FFFFFFF))
        raise InvalidArgumentError(f"spdy: cannot encode {frame!r}")

    # receiving
    def feed(self, data: bytes) -> list[Frame]:
        """Appends received bytes; returns every frame now complete (a partial one waits for more)."""
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= 8:
            word, flags_len = struct.unpack_from(">II", self._buf, 0)
            length = flags_len & 0xFFFFFF
            if len(self._buf) < 8 + length:
                break
            body = bytes(self._buf[8:8 + length])
            del self._buf[:8 + length]
            flags = flags_len >> 24
            if word & 0x80000000:
                version, kind = (word >> 16) & 0x7FFF, word & 0xFFFF
                if version != VERSION:
                    raise SpdyError(f"spdy: control frame of version {version}, expected {VERSION}")
                frame = self._control_frame(kind, flags, body)
                if frame is not None:
                    frames.append(frame)
            else:
                frames.append(Data(word & 0x7FFFFFFF, body, flags))
        return frames

    def _decompress(self, data: bytes) -> Headers:
        try:
            block = self._inflate.decompress(data, MAX_HEADER_BLOCK)
        except zlib.error as e:
            raise SpdyError(f"spdy: header block does not decompress: {e}") from e
        if self._inflate.unconsumed_tail:
            raise SpdyError(f"spdy: header block larger than {MAX_HEADER_BLOCK} bytes")
        return decode_header_block(block)

    def _control_frame(self, kind: int, flags: int, body: bytes) -> Frame | None:
        def need(n: int, name: str) -> None:
            if len(body) < n:
                raise SpdyError(f"spdy {name} frame: {len(body)} bytes, needs {n}")

        if kind == SYN_STREAM:
            need(10, "SYN_STREAM")
            sid, assoc, prio, _slot = struct.unpack_from(">IIBB", body, 0)
            return SynStream(sid & 0x7FFFFFFF, self._decompress(body[10:]), flags, assoc & 0x7FFFFFFF, prio >> 5)
        if kind in (SYN_REPLY, HEADERS):
            need(4, "SYN_REPLY/HEADERS")
            (sid,) = struct.unpack_from(">I", body, 0)
            cls = SynReply if kind == SYN_REPLY else HeadersFrame
            return cls(sid & 0x7FFFFFFF, self._decompress(body[4:]), flags)
        if kind == RST_STREAM:
            need(8, "RST_STREAM")
            sid, status = struct.unpack_from(">II", body, 0)
            return RstStream(sid & 0x7FFFFFFF, status)
        if kind == SETTINGS:
            need(4, "SETTINGS")
            (count,) = struct.unpack_from(">I", body, 0)
            if count > (len(body) - 4) // 8:
                raise SpdyError(f"spdy SETTINGS frame: {count} entries in {len(body)} bytes")
            entries = []
            for i in range(count):
                word, value = struct.unpack_from(">II", body, 4 + 8 * i)
                entries.append((word >> 24, word & 0xFFFFFF, value))
            return Settings(entries, flags)
        if kind == PING:
            need(4, "PING")
            return Ping(struct.unpack_from(">I", body, 0)[0])
        if kind == GOAWAY:
            need(4, "GOAWAY")
            (last,) = struct.unpack_from(">I", body, 0)
            status = struct.unpack_from(">I", body, 4)[0] if len(body) >= 8 else 0
            return GoAway(last & 0x7FFFFFFF, status)
        if kind == WINDOW_UPDATE:
            need(8, "WINDOW_UPDATE")
            sid, delta = struct.unpack_from(">II", body, 0)
            return WindowUpdate(sid & 0x7FFFFFFF, delta & 0x7FFFFFFF)
        return None  # unknown control frame types are ignored (SPDY/3 2.2.1)


def _control(kind: int, flags: int, body: bytes) -> bytes:
    if len(body) >= MAX_FRAME:
        raise InvalidArgumentError(f"spdy control frame type {kind}: {len(body)} bytes is too long")
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(body)) + body
