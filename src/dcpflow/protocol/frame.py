"""Frames of the memcached binary protocol: the 24-byte header, flexible framing extras, an
incremental decoder and the encoder.

Reference: https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md
("Packet Structure", "Request header with flexible framing extras"). Magic 0x08 (used in the
page's text, missing from its magic table) and 0x18 carry framing extras: byte 2 is their length and byte 3 the key
length, so keys in such frames are at most 255 bytes.
"""

import array
import importlib
import os
import re
import struct
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import NamedTuple

from .errors import ProtocolError
from .status import Status

HEADER_LEN = 24
#: The largest document value the server accepts (DocumentSizeLimits.md).
MAX_VALUE_LEN = 20 * 1024 * 1024
#: Default body limit: a maximal value plus the largest framing extras, extras and key.
DEFAULT_MAX_BODY_LEN = MAX_VALUE_LEN + 0xFF + 0xFF + 0xFFFF
#: The largest frame (header and body) a server reads before it gives up on the connection:
#: memcached's `max_packet_size`, 30 MiB by default (DocumentSizeLimits.md,
#: https://github.com/couchbase/kv_engine/blob/master/docs/DocumentSizeLimits.md). A request between
#: the body limit and this one is read past and refused with E2BIG; above it the stream is abandoned.
MAX_PACKET_LEN = 30 * 1024 * 1024

HEADER = struct.Struct(">BBHBBHIIQ")
ALT_HEADER = struct.Struct(">BBBBBBHIIQ")
_U32 = struct.Struct(">I")


class Field(NamedTuple):
    """Where a big-endian field lies in a frame: `offset` bytes from the frame's start, `size` bytes."""

    offset: int
    size: int

    @property
    def stop(self) -> int:
        return self.offset + self.size

    def read(self, data, base: int = 0) -> int:
        """The field's big-endian value in `data`, whose frame starts `base` bytes in."""
        return int.from_bytes(data[base + self.offset:base + self.offset + self.size], "big")


_STRUCT_ITEM = re.compile(r"(\d*)([a-zA-Z?])")


def struct_fields(layout: struct.Struct, names: Sequence[str], base: int = 0) -> dict[str, Field]:
    """Where each field of a big-endian struct lies, `base` bytes into a frame: the struct's items
    in order, one name each (pad bytes `x` take none, `Ns` is one field of N bytes). A reader that
    addresses fields in place (the client's numpy columns) takes its offsets from the same struct
    the codec packs and unpacks, so the two cannot disagree."""
    fmt = layout.format
    if fmt[:1] not in (">", "!"):
        raise ValueError(f"struct {fmt!r} is not big-endian: its fields have no fixed wire offsets")
    out: dict[str, Field] = {}
    at, left = base, list(names)
    for count, code in _STRUCT_ITEM.findall(fmt[1:]):
        n = int(count) if count else 1
        size = struct.calcsize(">" + code)
        if code == "x":
            at += n
            continue
        for _ in range(1 if code in "sp" else n):
            if not left:
                raise ValueError(f"struct {fmt!r} has more fields than the names {list(names)}")
            width = n if code in "sp" else size
            out[left.pop(0)] = Field(at, width)
            at += width
    if left or at - base != layout.size:
        raise ValueError(f"struct {fmt!r} does not have one field per name of {list(names)}")
    return out


#: The header's fields in classic framing (magic 0x80/0x81/0x82/0x83), from HEADER.
HEADER_FIELDS = struct_fields(HEADER, ("magic", "opcode", "key_length", "extras_length", "datatype",
                                       "vbucket_or_status", "body_length", "opaque", "cas"))


class Magic(IntEnum):
    REQUEST = 0x80
    ALT_REQUEST = 0x08
    RESPONSE = 0x81
    ALT_RESPONSE = 0x18
    SERVER_REQUEST = 0x82
    SERVER_RESPONSE = 0x83


_ALT = frozenset({Magic.ALT_REQUEST, Magic.ALT_RESPONSE})
_REQUEST, _ALT_REQUEST = int(Magic.REQUEST), int(Magic.ALT_REQUEST)
_RESPONSES = frozenset({Magic.RESPONSE, Magic.ALT_RESPONSE, Magic.SERVER_RESPONSE})
_MAGICS = frozenset(int(m) for m in Magic)


class RequestFrameId(IntEnum):
    """Framing-extras ids in requests (magic 0x08): each object's first byte is id << 4 | length."""

    BARRIER = 0
    DURABILITY = 1
    DCP_STREAM_ID = 2
    OPEN_TRACING_UNUSED = 3
    IMPERSONATE = 4
    PRESERVE_TTL = 5
    IMPERSONATE_EXTRA_PRIVILEGE = 6
    IMPERSONATE_TOKEN = 7


class ResponseFrameId(IntEnum):
    """Framing-extras ids in responses (magic 0x18)."""

    SERVER_DURATION = 0
    READ_UNITS = 1
    WRITE_UNITS = 2
    THROTTLE_DURATION = 3


class Frame(NamedTuple):
    """One packet, split into its parts; fields not interpreted beyond the header.

    `vbucket_or_status` is header bytes 6-7: the vbucket of a request, the status of a response.
    """

    magic: int
    opcode: int
    datatype: int = 0
    vbucket_or_status: int = 0
    opaque: int = 0
    cas: int = 0
    framing: bytes = b""
    extras: bytes = b""
    key: bytes = b""
    value: bytes = b""

    @property
    def is_response(self) -> bool:
        return self.magic in _RESPONSES

    @property
    def vbucket(self) -> int:
        return self.vbucket_or_status

    @property
    def status(self) -> int:
        return self.vbucket_or_status

    @property
    def body_len(self) -> int:
        return len(self.framing) + len(self.extras) + len(self.key) + len(self.value)

    @property
    def wire_len(self) -> int:
        """The frame's size on the wire: header and body."""
        return HEADER_LEN + len(self.framing) + len(self.extras) + len(self.key) + len(self.value)

    @property
    def frame_infos(self) -> list[tuple[int, bytes]]:
        return decode_frame_infos(self.framing)

    @property
    def stream_id(self) -> int | None:
        """The DCP stream-id frame of a request (0x08), or None."""
        if not self.framing or self.magic != Magic.ALT_REQUEST:
            return None
        for fid, payload in decode_frame_infos(self.framing):
            if fid == RequestFrameId.DCP_STREAM_ID and len(payload) == 2:
                return parse_stream_id(payload)
        return None

    def encode(self) -> bytes:
        return encode_frame(self.magic, self.opcode, key=self.key, extras=self.extras, value=self.value,
                            vbucket_or_status=self.vbucket_or_status, opaque=self.opaque, cas=self.cas,
                            datatype=self.datatype, framing=self.framing)


def encode_frame(magic: int, opcode: int, *, key: bytes = b"", extras: bytes = b"", value: bytes = b"",
                 vbucket_or_status: int = 0, opaque: int = 0, cas: int = 0, datatype: int = 0,
                 framing: bytes = b"") -> bytes:
    """Encode one packet. With framing extras the magic must be 0x08/0x18 (use `request`/`response`
    to have it chosen for you)."""
    body_len = len(framing) + len(extras) + len(key) + len(value)
    if magic in _ALT:
        if len(framing) > 0xFF or len(key) > 0xFF:
            raise ValueError("with framing extras both framing and key must be at most 255 bytes")
        header = ALT_HEADER.pack(magic, opcode, len(framing), len(key), len(extras), datatype,
                                 vbucket_or_status, body_len, opaque, cas)
    else:
        if framing:
            raise ValueError(f"magic 0x{magic:02x} cannot carry framing extras; use 0x08/0x18")
        header = HEADER.pack(magic, opcode, len(key), len(extras), datatype, vbucket_or_status,
                             body_len, opaque, cas)
    return b"".join((header, framing, extras, key, value))


def request(opcode: int, *, key: bytes = b"", extras: bytes = b"", value: bytes = b"", vbucket: int = 0,
            opaque: int = 0, cas: int = 0, datatype: int = 0, framing: bytes = b"") -> bytes:
    """Encode a client request; magic 0x08 when there are framing extras, else 0x80."""
    magic = Magic.ALT_REQUEST if framing else Magic.REQUEST
    return encode_frame(magic, opcode, key=key, extras=extras, value=value, vbucket_or_status=vbucket,
                        opaque=opaque, cas=cas, datatype=datatype, framing=framing)


def response(opcode: int, status: int = Status.SUCCESS, *, key: bytes = b"", extras: bytes = b"",
             value: bytes = b"", opaque: int = 0, cas: int = 0, datatype: int = 0,
             framing: bytes = b"") -> bytes:
    """Encode a response; magic 0x18 when there are framing extras, else 0x81."""
    magic = Magic.ALT_RESPONSE if framing else Magic.RESPONSE
    return encode_frame(magic, opcode, key=key, extras=extras, value=value, vbucket_or_status=status,
                        opaque=opaque, cas=cas, datatype=datatype, framing=framing)


# ---------------------------------------------------------------------------------------------
# Framing extras ("FrameInfo" objects)

def encode_frame_info(frame_id: int, payload: bytes = b"") -> bytes:
    """One FrameInfo: id and length nibbles, each escaped with 15 + next byte when above 14."""
    if not 0 <= frame_id <= 15 + 0xFF or len(payload) > 15 + 0xFF:
        raise ValueError(f"frame info id {frame_id} / length {len(payload)} cannot be encoded")
    id_nib, id_ext = (frame_id, b"") if frame_id < 15 else (15, bytes([frame_id - 15]))
    n = len(payload)
    len_nib, len_ext = (n, b"") if n < 15 else (15, bytes([n - 15]))
    return bytes([(id_nib << 4) | len_nib]) + id_ext + len_ext + payload


def decode_frame_infos(data: bytes) -> list[tuple[int, bytes]]:
    """All FrameInfo objects as (id, payload); raises ProtocolError if one runs past the end."""
    out = []
    pos, end = 0, len(data)
    while pos < end:
        first = data[pos]
        pos += 1
        fid, flen = first >> 4, first & 0x0F
        if fid == 15:
            if pos >= end:
                raise ProtocolError("framing extras end inside an escaped frame-info id")
            fid = 15 + data[pos]
            pos += 1
        if flen == 15:
            if pos >= end:
                raise ProtocolError("framing extras end inside an escaped frame-info length")
            flen = 15 + data[pos]
            pos += 1
        if pos + flen > end:
            raise ProtocolError(f"frame info {fid} declares {flen} bytes but only {end - pos} remain")
        out.append((fid, data[pos:pos + flen]))
        pos += flen
    return out


def stream_id_frame(stream_id: int) -> bytes:
    """The DCP stream-id FrameInfo (id 2, u16) a producer puts on every stream message."""
    return encode_frame_info(RequestFrameId.DCP_STREAM_ID, stream_id.to_bytes(2, "big"))


def parse_stream_id(payload: bytes) -> int | None:
    """The stream-id of a DCP_STREAM_ID frame info's payload (2 bytes, big-endian), None if it
    has another size."""
    return int.from_bytes(payload, "big") if len(payload) == 2 else None


def durability_frame(level: int, timeout_ms: int | None = None) -> bytes:
    payload = bytes([level]) if timeout_ms is None else bytes([level]) + timeout_ms.to_bytes(2, "big")
    return encode_frame_info(RequestFrameId.DURABILITY, payload)


def parse_durability(payload: bytes) -> tuple[int, int | None]:
    """(level, timeout in ms or None for the server's default) of a durability FrameInfo's payload
    (BinaryProtocol.md ID:1: level u8, then an optional u16 timeout), the inverse of
    `durability_frame`'s payload. The payload is one `check_request_frame_infos` accepted."""
    return payload[0], (int.from_bytes(payload[1:3], "big") if len(payload) == 3 else None)


def encode_server_duration(micros: float) -> int:
    """Response frame 0/3 encoding: (micros * 2) ^ (1 / 1.74), clamped to a u16."""
    return min(0xFFFF, round((micros * 2) ** (1.0 / 1.74)))


def decode_server_duration(encoded: int) -> float:
    return (encoded ** 1.74) / 2


def check_request_frame_infos(framing: bytes) -> list[ProtocolError]:
    """Every rule the request FrameInfo objects break (BinaryProtocol.md, ID:0..ID:7)."""
    try:
        infos = decode_frame_infos(framing)
    except ProtocolError as e:
        return [e]
    problems: list[ProtocolError] = []
    for fid, payload in infos:
        n = len(payload)
        if fid in (RequestFrameId.BARRIER, RequestFrameId.PRESERVE_TTL) and n:
            problems.append(ProtocolError(f"frame info {RequestFrameId(fid).name} must be empty, has {n} bytes"))
        elif fid == RequestFrameId.DURABILITY:
            if n not in (1, 3):
                problems.append(ProtocolError(f"durability frame must be 1 or 3 bytes, has {n}"))
            elif not 1 <= payload[0] <= 3:
                problems.append(ProtocolError(f"durability level {payload[0]} is not 1..3",
                                              Status.DURABILITY_INVALID_LEVEL))
            elif n == 3 and int.from_bytes(payload[1:], "big") in (0, 0xFFFF):
                problems.append(ProtocolError("durability timeout 0 and 0xffff are reserved"))
        elif fid == RequestFrameId.DCP_STREAM_ID:
            if n != 2:
                problems.append(ProtocolError(f"DCP stream-id frame must be 2 bytes, has {n}"))
            elif payload == b"\x00\x00":
                problems.append(ProtocolError("DCP stream-id 0 is invalid", Status.DCP_STREAM_ID_INVALID))
        elif fid in (RequestFrameId.IMPERSONATE, RequestFrameId.IMPERSONATE_EXTRA_PRIVILEGE) and not n:
            problems.append(ProtocolError(f"frame info {RequestFrameId(fid).name} needs a name"))
        elif fid == RequestFrameId.IMPERSONATE_TOKEN and n != 2:
            problems.append(ProtocolError(f"impersonate-token frame must be 2 bytes, has {n}"))
        elif fid == RequestFrameId.OPEN_TRACING_UNUSED or fid > RequestFrameId.IMPERSONATE_TOKEN:
            problems.append(ProtocolError(f"unknown frame info id {fid}", Status.UNKNOWN_FRAME_INFO))
    return problems


# ---------------------------------------------------------------------------------------------
# Incremental decoder

def compiled(name: str, module: str = "dcpflow.protocol._speedups"):
    """The compiled twin `name` of a hot loop (a `_speedups.c`: this package's by default), or None
    when the extension was not built or DCPFLOW_PURE_PYTHON is set: the caller then runs its
    Python twin."""
    if os.environ.get("DCPFLOW_PURE_PYTHON"):
        return None
    try:
        speedups = importlib.import_module(module)
    except ImportError:
        return None
    return getattr(speedups, name, None)  # an extension built from older sources lacks it


#: FrameDecoder's compiled fast path, or None (see _speedups.c).
_split = compiled("split")

#: (magic, opcode, body length) of the header at an offset: all a receive loop needs to walk frames.
MAGIC_OPCODE_BODY = struct.Struct(">BB6xI").unpack_from
#: (magic, opcode, vbucket or status, body length, opaque) of the header at an offset.
_WALK_HEAD = struct.Struct(">BB4xHII").unpack_from


def header_error(magic: int, opcode: int, body_len: int, max_body: int) -> ProtocolError | None:
    """The fatal error of a header with these fields, if any: an unknown magic or a body over
    `max_body` means the byte stream cannot be framed any further."""
    if magic not in _MAGICS:
        return ProtocolError(f"invalid magic 0x{magic:02x} (expected 0x80, 0x81, 0x08, 0x18, 0x82 "
                             f"or 0x83): not a memcached binary protocol stream", fatal=True,
                             opcode=opcode, magic=magic)
    if body_len > max_body:
        return ProtocolError(f"body length {body_len} exceeds the limit of {max_body} bytes",
                             Status.E2BIG, fatal=True, opcode=opcode, magic=magic)
    return None


def frame_head(buf, pos: int, end: int, max_body: int = DEFAULT_MAX_BODY_LEN) -> tuple[int, int, int, int, int]:
    """The header at `pos` of the bytes buf[:end], as a receive loop walks frames: (magic,
    opcode, vbucket or status, opaque, the offset just past the frame). That offset lies past `end`
    while the frame is not whole: the loop waits for that many bytes from `pos`.

    With `walk_stream` this is the one header walker of every receive loop (the DCP client's
    connection, the cluster manager's relay): the run of stream messages goes by in one compiled
    call, and each frame it stops at is read here. A header that cannot start a frame (an
    unknown magic, a body over `max_body`) raises FrameDecoder's fatal ProtocolError; fewer than
    HEADER_LEN bytes from `pos` is a ValueError (the caller waits for a whole header first)."""
    if not 0 <= pos <= end - HEADER_LEN or end > len(buf):
        raise ValueError(f"frame_head: no whole header at {pos} of {end} bytes")
    magic, opcode, vbs, body, opaque = _WALK_HEAD(buf, pos)
    if body > max_body or magic not in _MAGICS:
        raise header_error(magic, opcode, body, max_body)
    return magic, opcode, vbs, opaque, pos + HEADER_LEN + body


def opcode_table(opcodes: Iterable[int]) -> bytes:
    """The 256-byte table `walk_stream` takes: 1 for each of `opcodes`, 0 for the rest."""
    table = bytearray(256)
    for op in opcodes:
        table[op] = 1
    return bytes(table)


def walk_stream_py(buf, pos: int, table: bytes, end: int | None = None) -> tuple[int, bytes]:
    """From `pos`, the run of complete request frames (magic 0x80) whose opcode has a non-zero
    entry in the 256-byte `table`, within `buf[:end]` (bytes, or a receive buffer filled in place;
    `end` defaults to its length): (the offset just past the run, the frames' start offsets as
    native int64 bytes). A DCP client's receive loop takes a busy stream's traffic this way and
    handles the frame the run stops at (a reply, a noop, an incomplete frame) itself. The
    specification of the compiled `walk_stream` (frame.walk_stream)."""
    if end is None:
        end = len(buf)
    if not 0 <= end <= len(buf) or not 0 <= pos <= end:
        raise ValueError("walk_stream: pos or end outside the buffer")
    starts = array.array("q")
    while end - pos >= HEADER_LEN:
        magic, op, body = MAGIC_OPCODE_BODY(buf, pos)
        if magic != 0x80 or not table[op] or body > end - pos - HEADER_LEN:
            break
        starts.append(pos)
        pos += HEADER_LEN + body
    return pos, starts.tobytes()


#: walk_stream_py, compiled when the extension was built.
walk_stream = compiled("walk_stream") or walk_stream_py


#: The framing extras of a stream message from a producer with `enable_stream_id`: one FrameInfo,
#: id 2 (DCP stream-id) of 2 bytes, so 3 bytes starting 0x22. `walk_sid_stream` takes only these.
SID_FRAMING = bytes([(RequestFrameId.DCP_STREAM_ID << 4) | 2])


def walk_sid_stream_py(buf, pos: int, table: bytes, end: int | None = None) -> tuple[int, bytes, bytes, bytes]:
    """`walk_stream` for a connection with stream-ids: from `pos`, the run of complete request
    frames with magic 0x08, an opcode with a non-zero entry in `table` and framing extras of
    exactly the stream-id FrameInfo, within buf[:end]: (the offset just past the run, the frames
    in classic framing joined (`unframe_stream_id`), their start offsets in it and their stream-ids,
    both as native int64 bytes). Each frame is 3 bytes shorter than on the wire. The
    specification of the compiled `walk_sid_stream`."""
    if end is None:
        end = len(buf)
    if not 0 <= end <= len(buf) or not 0 <= pos <= end:
        raise ValueError("walk_sid_stream: pos or end outside the buffer")
    out = bytearray()
    starts, sids = array.array("q"), array.array("q")
    while end - pos >= HEADER_LEN:
        body = int.from_bytes(buf[pos + 8:pos + 12], "big")
        if buf[pos] != Magic.ALT_REQUEST or not table[buf[pos + 1]] or buf[pos + 2] != 3 or \
                body > end - pos - HEADER_LEN or body < 3 + buf[pos + 3] + buf[pos + 4] or \
                buf[pos + HEADER_LEN] != SID_FRAMING[0]:
            break
        fend = pos + HEADER_LEN + body
        sid, frame = unframe_stream_id(buf, pos, fend)
        starts.append(len(out))
        sids.append(sid)
        out += frame
        pos = fend
    return pos, bytes(out), starts.tobytes(), sids.tobytes()


#: walk_sid_stream_py, compiled when the extension was built.
walk_sid_stream = compiled("walk_sid_stream") or walk_sid_stream_py

def unframe_stream_id(buf, pos: int, fend: int) -> tuple[int | None, bytes]:
    """The request frame buf[pos:fend] in classic framing, and its DCP stream-id: a producer with
    `enable_stream_id` sends every stream message with magic 0x08 and a stream-id FrameInfo
    (stream-request-value.md, "sid"); this gives that message as the producer would have sent it
    without the feature (magic 0x80, a 2-byte key length, the framing extras gone, the body
    shorter by them), so a consumer's decoders read one layout. A classic frame comes back as it
    is, with stream-id None. Raises ProtocolError for a frame whose framing extras are malformed
    or name no stream-id (the consumer cannot tell which stream the message belongs to)."""
    magic = buf[pos]
    if magic == Magic.REQUEST:
        return None, bytes(buf[pos:fend])
    if magic != Magic.ALT_REQUEST:
        raise ProtocolError(f"unframe_stream_id: magic 0x{magic:02x} is not a request")
    _, opcode, flen, klen, elen, datatype, vbucket, body, opaque, cas = ALT_HEADER.unpack_from(buf, pos)
    if HEADER_LEN + body != fend - pos or flen + klen + elen > body:
        raise ProtocolError(f"opcode 0x{opcode:02x}: lengths (framing {flen}, key {klen}, extras {elen}) do not fit "
                            f"a body of {body} bytes")
    infos = decode_frame_infos(bytes(buf[pos + HEADER_LEN:pos + HEADER_LEN + flen]))
    sid = next((parse_stream_id(v) for fid, v in infos if fid == RequestFrameId.DCP_STREAM_ID and len(v) == 2), None)
    if sid is None:
        raise ProtocolError(f"opcode 0x{opcode:02x}: framing extras carry no DCP stream-id")
    head = HEADER.pack(Magic.REQUEST, opcode, klen, elen, datatype, vbucket, body - flen, opaque, cas)
    return sid, head + bytes(buf[pos + HEADER_LEN + flen:fend])


class FrameDecoder:
    """Feed it bytes as they arrive; iterate it for complete frames.

    Sans-I/O: no sockets, no clocks. A fatal ProtocolError (bad magic, oversize body) poisons the
    decoder: the stream cannot be resynchronised and the connection should be closed. A non-fatal
    one (a header whose lengths contradict each other inside a sound body) is raised after the bad
    frame was consumed, so the caller can answer EINVAL and keep iterating.

    A server decoder passes `max_packet_len` and `strict` (kv_engine's framing rules): a request
    whose body is over `max_body_len` but whose frame is at most `max_packet_len` is not fatal - its
    body is skipped as it arrives (never buffered) and a non-fatal E2BIG carries its opcode and
    opaque; and with `strict` a header whose extras and key run past its body is fatal, since
    kv_engine disconnects such a client rather than trust the rest of its stream.

    Bytes are accumulated without quadratic copying: while a frame larger than what is buffered is
    pending, chunks are collected in a list and joined once the frame is complete; and bytes fed
    while unread frames are buffered wait in a list (`_tail`) that `frames()` joins once, rather
    than each `feed` copying the whole backlog (a client pipelining faster than the server runs
    its requests made that quadratic).

    A request loop takes frames in lists instead: `peek(limit)` returns the next frames without
    consuming them, and `consume(n)` marks the first n as done, so that a loop that stops early
    (a request must wait) leaves the rest buffered, and one that runs them all pays for neither a
    generator step nor a consumed-offset update per frame.
    """

    __slots__ = ("max_body_len", "max_packet_len", "strict", "_buf", "_pos", "_tail", "_tail_len", "_chunks",
                 "_chunk_len", "_need", "_broken", "_skip", "_ends")

    def __init__(self, max_body_len: int = DEFAULT_MAX_BODY_LEN, *, max_packet_len: int | None = None,
                 strict: bool = False):
        self.max_body_len = max_body_len
        self.max_packet_len = max_packet_len
        self.strict = strict
        self._skip = 0  # bytes still to discard of a refused oversize request (see the class docstring)
        self._buf = b""
        self._pos = 0
        self._tail: list[bytes] = []
        self._tail_len = 0
        self._chunks: list[bytes] | None = None
        self._chunk_len = 0
        self._need = 0
        self._broken: ProtocolError | None = None
        self._ends: list[int] | None = None  # offset past each frame the last peek() left buffered

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        if self._chunks is not None:
            return self._chunk_len
        return len(self._buf) - self._pos + self._tail_len

    def feed(self, data: bytes) -> None:
        if self._skip and data:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        if not data:
            return
        if self._chunks is not None:
            self._chunks.append(bytes(data))
            self._chunk_len += len(data)
            if self._chunk_len >= self._need:
                self._buf = b"".join(self._chunks)
                self._pos = 0
                self._chunks = None
            return
        if self._pos >= len(self._buf) and not self._tail:
            self._buf = bytes(data)
            self._pos = 0
        else:
            self._tail.append(bytes(data))
            self._tail_len += len(data)

    def _absorb(self, pos: int) -> bytes:
        """Join the buffer from `pos` and the bytes fed since into one buffer (returned, at 0)."""
        self._buf = b"".join([self._buf[pos:], *self._tail])
        self._pos = 0
        self._tail.clear()
        self._tail_len = 0
        return self._buf

    def _wait_for(self, pos: int, need: int) -> None:
        """Park the partial frame at `pos` until `need` bytes of it have arrived."""
        rest = self._buf[pos:]
        self._buf, self._pos = b"", 0
        if need > len(rest) + 65536:
            self._chunks, self._chunk_len, self._need = [rest], len(rest), need
        else:
            self._buf = rest

    def peek(self, limit: int) -> list[Frame]:
        """Up to `limit` complete frames from the next one on, in order, still buffered: `consume`
        says how many of them are done. [] when no whole frame is buffered. Raises what `frames()`
        raises, for the frame it concerns (consumed, as there).

        The compiled splitter takes the run of well-formed frames; anything else (no compiled
        splitter, a malformed or incomplete frame next, a body collected in chunks) goes through
        `frames()` one frame at a time, that frame already consumed."""
        if self._broken is None and self._chunks is None:
            if self._tail:
                self._absorb(self._pos)
            max_body = self.max_body_len
            if _split is not None and max_body.__class__ is int and 0 <= max_body < 1 << 64:
                frames, ends = _split(self._buf, self._pos, max_body, Frame, limit)
                if frames:
                    self._ends = ends
                    return frames
        self._ends = None
        for frame in self._frames(1):
            return [frame]
        return []

    def consume(self, n: int) -> None:
        """The first `n` (>= 1) frames of the last `peek` are done: the next starts after them."""
        ends = self._ends
        if ends is not None:
            self._pos = ends[n - 1]

    def __iter__(self):
        return self._frames(64)

    def frames(self):
        """Yield every complete Frame now buffered."""
        return self._frames(64)

    def _frames(self, batch: int):
        """frames(), taking up to `batch` frames at a time from the compiled splitter (next_frame
        wants one: a bigger batch would split frames only to drop them)."""
        if self._broken is not None:
            raise self._broken
        if self._chunks is not None:
            return
        buf, pos = self._buf, self._pos
        if self._tail:
            buf, pos = self._absorb(pos), 0
        end = len(buf)
        unpack, alt, new = HEADER.unpack_from, _ALT, tuple.__new__  # tuple.__new__: Frame(...) is a Python call
        max_body = self.max_body_len
        split = _split if max_body.__class__ is int and 0 <= max_body < 1 << 64 else None  # (else as Python does)
        while True:
            if split is not None:  # the compiled splitter takes the well-formed frames...
                frames, ends = split(buf, pos, max_body, Frame, batch)
                for frame, frame_end in zip(frames, ends, strict=True):
                    self._pos = frame_end
                    yield frame
                    if self._buf is not buf:  # fed while suspended: feed() rebased the buffer
                        return
                if frames:
                    pos = frame_end
                    continue
            # ...and this loop the rest: the end of the bytes, an incomplete frame, an error.
            if end - pos < HEADER_LEN:
                if not self._tail:
                    break
                buf, pos = self._absorb(pos), 0  # bytes fed while this generator was suspended
                end = len(buf)
                continue
            magic, opcode, key_len, ext_len, datatype, vbs, body_len, opaque, cas = unpack(buf, pos)
            if body_len > max_body or magic not in _MAGICS:
                refusable = self._refusable(magic, body_len)
                if refusable and pos + HEADER_LEN + body_len > end and self._tail:
                    buf, pos = self._absorb(pos), 0
                    end = len(buf)
                    continue
                raise self._bad_header(refusable, magic, opcode, opaque, body_len, pos, end)
            frame_end = pos + HEADER_LEN + body_len
            if frame_end > end:
                if self._tail:
                    buf, pos = self._absorb(pos), 0
                    end = len(buf)
                    continue
                self._wait_for(pos, HEADER_LEN + body_len)
                return
            if magic in alt:
                fr_len, key_len = key_len >> 8, key_len & 0xFF
            else:
                fr_len = 0
            start = pos + HEADER_LEN
            k = start + fr_len + ext_len
            v = k + key_len
            self._pos = frame_end
            if v > frame_end:
                pos = frame_end
                error = ProtocolError(
                    f"framing extras ({fr_len}) + extras ({ext_len}) + key ({key_len}) = {v - start} bytes "
                    f"exceed the total body length {body_len}", fatal=self.strict, opcode=opcode, opaque=opaque,
                    magic=magic)
                if self.strict:
                    self._poison(error)
                raise error
            yield new(Frame, (magic, opcode, datatype, vbs, opaque, cas,
                              buf[start:start + fr_len] if fr_len else b"", buf[start + fr_len:k],
                              buf[k:v], buf[v:frame_end]))
            if self._buf is not buf:  # fed while suspended: feed() rebased the buffer, stop here
                return
            pos = frame_end
        self._pos = pos

    def _bad_header(self, refusable: bool, magic: int, opcode: int, opaque: int, body_len: int, pos: int,
                    end: int) -> ProtocolError:
        """The error of a header whose body is over the limit, or whose magic is unknown: a
        refusable request is read past (E2BIG, decoding goes on after it); anything else poisons
        the decoder (a fatal error: nothing after it can be framed)."""
        max_body = self.max_body_len
        if refusable:
            self._pass_over(pos + HEADER_LEN + body_len, end)
            return ProtocolError(f"body length {body_len} exceeds the limit of {max_body} bytes (a document value "
                                 f"is at most {MAX_VALUE_LEN} bytes)", Status.E2BIG, opcode=opcode, opaque=opaque,
                                 magic=magic)
        error = header_error(magic, opcode, body_len, max_body)
        if self.max_packet_len is not None and magic in _MAGICS and HEADER_LEN + body_len > self.max_packet_len:
            error = ProtocolError(f"a frame of {HEADER_LEN + body_len} bytes exceeds the maximum packet size "
                                  f"of {self.max_packet_len} bytes", Status.E2BIG, fatal=True,
                                  opcode=opcode, opaque=opaque, magic=magic)
        self._poison(error)
        return error

    def _refusable(self, magic: int, body_len: int) -> bool:
        """An oversize request that a server reads past and refuses (E2BIG) rather than disconnect."""
        limit = self.max_packet_len
        return limit is not None and magic in (_REQUEST, _ALT_REQUEST) and HEADER_LEN + body_len <= limit

    def _pass_over(self, frame_end: int, end: int) -> None:
        """Consume a refused frame ending at `frame_end` of the buffer (`end` bytes of it held):
        what is held is dropped, what has not arrived yet is discarded by `feed`."""
        if frame_end <= end:
            self._pos = frame_end
        else:
            self._skip = frame_end - end
            self._buf, self._pos = b"", 0

    def _poison(self, error: ProtocolError) -> None:
        self._broken = error
        self._buf, self._pos = b"", 0
        self._tail.clear()
        self._tail_len = 0

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None if more bytes are needed."""
        for frame in self._frames(1):
            return frame
        return None


def decode_all(data: bytes, max_body_len: int = DEFAULT_MAX_BODY_LEN) -> list[Frame]:
    """Decode a buffer that holds only whole frames; raises ProtocolError on leftovers."""
    dec = FrameDecoder(max_body_len)
    dec.feed(data)
    frames = list(dec.frames())
    if dec.buffered:
        n = dec.buffered
        if n >= HEADER_LEN:
            (body_len,) = _U32.unpack_from(data, len(data) - n + 8)
            why = (f"the header says {body_len} body bytes, only {n - HEADER_LEN} present (total body length "
                   f"too large, or the frame is cut short)")
        else:
            why = f"fewer than a {HEADER_LEN}-byte header"
            if frames:
                why += f" (is the total body length {frames[-1].body_len} of the frame before them too small?)"
        raise ProtocolError(f"{n} trailing bytes do not make a whole frame: {why}")
    return frames
