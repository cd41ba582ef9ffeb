"""Stream setup and teardown: add-stream.md, stream-request.md (with its failover log), failover-log.md,
close-stream.md and stream-end.md.
"""

import json
from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import (
    Frame,
    Magic,
    encode_frame,
)
from ..opcodes import Opcode
from ..rules import MAY, MUST, Shape
from ..status import Status
from .flags import STREAM_FLAGS_KNOWN, StreamEndReason, StreamFlag
from .layouts import _FAILOVER_ENTRY, _PAGES, _STREAM_REQ_EXTRAS, _U32, _U64, _encode

# ---------------------------------------------------------------------------------------------
# Stream setup


_NO_VALUE_REMOVED, _CACHE_TRANSFER = int(StreamFlag.NO_VALUE_REMOVED), int(StreamFlag.CACHE_TRANSFER)
_CACHE_TRANSFER_WITH = int(StreamFlag.CACHE_TRANSFER | StreamFlag.TAKEOVER | StreamFlag.ACTIVE_VB_ONLY)


def _stream_flag_problems(flags: int, what: str, page: str):
    flags = int(flags)  # plain ints: `int & IntFlag` runs enum's Python __rand__, per request
    if flags & _NO_VALUE_REMOVED:
        yield ProtocolError(f"{what} flag 0x08 (NoValue) is no longer used; use DCP_OPEN flag NoValue ({page})")
    unknown = flags & ~(STREAM_FLAGS_KNOWN | _NO_VALUE_REMOVED)
    if unknown:
        yield ProtocolError(f"{what} has unknown flag bits 0x{unknown:x} ({page})")
    if flags & _CACHE_TRANSFER and flags & ~_CACHE_TRANSFER_WITH:
        yield ProtocolError(f"{what} flag CacheTransfer may only be combined with TakeOver and ActiveVbOnly "
                            f"({page})")


class DcpAddStream(NamedTuple):
    """DCP_ADD_STREAM 0x51 (add-stream.md): sent to a consumer to make it stream a vbucket."""

    vbucket: int
    flags: int = 0
    opaque: int = 0

    opcode = Opcode.DCP_ADD_STREAM

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.flags))

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpAddStream":
        rules.check(frame)
        return cls(frame.vbucket, _U32.unpack(frame.extras)[0], frame.opaque)


class DcpAddStreamResponse(NamedTuple):
    """The reply to ADD_STREAM: the new stream's opaque in 4 bytes of extras (add-stream.md)."""

    stream_opaque: int
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.DCP_ADD_STREAM

    def encode(self) -> bytes:
        extras = _U32.pack(self.stream_opaque) if self.status == Status.SUCCESS else b""
        return encode_frame(Magic.RESPONSE, self.opcode, extras=extras, vbucket_or_status=self.status,
                            opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpAddStreamResponse":
        rules.check(frame)
        stream_opaque = _U32.unpack(frame.extras)[0] if len(frame.extras) == 4 else 0
        return cls(stream_opaque, frame.opaque, frame.status)


rules.register(Opcode.DCP_ADD_STREAM, Shape(_PAGES + "add-stream.md", extras=(4,)),
               Shape(_PAGES + "add-stream.md", extras=(4,)))


@rules.request_check(Opcode.DCP_ADD_STREAM)
def _add_stream_rules(frame: Frame):
    if len(frame.extras) == 4:
        yield from _stream_flag_problems(_U32.unpack(frame.extras)[0], "DCP_ADD_STREAM",
                                         "add-stream.md")


class DcpStreamRequest(NamedTuple):
    """DCP_STREAM_REQ 0x53 (stream-request.md): 48 bytes of extras and an optional JSON value."""

    vbucket: int
    start_seqno: int
    end_seqno: int = 0xFFFFFFFFFFFFFFFF
    vbucket_uuid: int = 0
    snap_start_seqno: int = 0
    snap_end_seqno: int = 0
    flags: int = 0
    value: bytes = b""
    opaque: int = 0
    reserved: int = 0

    opcode = Opcode.DCP_STREAM_REQ

    @property
    def json(self) -> dict:
        """The decoded JSON value (stream-request-value.md), {} when absent."""
        return json.loads(self.value) if self.value else {}

    def encode(self) -> bytes:
        extras = _STREAM_REQ_EXTRAS.pack(self.flags, self.reserved, self.start_seqno, self.end_seqno,
                                         self.vbucket_uuid, self.snap_start_seqno, self.snap_end_seqno)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, value=self.value,
                       datatype=0x01 if self.value else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpStreamRequest":
        rules.check(frame)
        flags, reserved, start, end, uuid, snap_start, snap_end = _STREAM_REQ_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, start, end, uuid, snap_start, snap_end, flags, frame.value, frame.opaque,
                   reserved)

    def seqno_problem(self) -> ProtocolError | None:
        """The ERANGE rule of stream-request.md as the code applies it: only start > end is refused (the
        page says start must be less than end; start == end is accepted and ends at once)."""
        if self.start_seqno > self.end_seqno:
            return ProtocolError(f"start seqno {self.start_seqno} is greater than end seqno {self.end_seqno}",
                                 Status.ERANGE)
        if not self.snap_start_seqno <= self.start_seqno <= self.snap_end_seqno:
            return ProtocolError(f"snapshot range must satisfy snap_start ({self.snap_start_seqno}) <= start "
                                 f"({self.start_seqno}) <= snap_end ({self.snap_end_seqno})", Status.ERANGE)
        return None


rules.register(Opcode.DCP_STREAM_REQ, Shape(_PAGES + "stream-request.md", extras=(48,), value=MAY),
               Shape(_PAGES + "stream-request.md", value=MAY))


@rules.request_check(Opcode.DCP_STREAM_REQ)
def _stream_req_rules(frame: Frame):
    if len(frame.extras) == 48:
        flags = _U32.unpack_from(frame.extras)[0]
        yield from _stream_flag_problems(flags, "DCP_STREAM_REQ", "stream-request.md")
    if frame.value:
        try:
            doc = json.loads(frame.value)
        except (ValueError, RecursionError):
            yield ProtocolError("DCP_STREAM_REQ value is not valid JSON (stream-request-value.md)")
            return
        if not isinstance(doc, dict):
            yield ProtocolError("DCP_STREAM_REQ value must be a JSON object (stream-request-value.md)")
            return
        sid = doc.get("sid")
        # type(...) is int: JSON true/false are Python bools (an int subclass), and null is no id either
        if "sid" in doc and (type(sid) is not int or not 1 <= sid <= 0xFFFF):
            yield ProtocolError(f"stream id 'sid' must be 1..65535, got {sid!r}",
                                Status.DCP_STREAM_ID_INVALID)
        if "collections" in doc and "scope" in doc:
            yield ProtocolError("stream-request value may name 'collections' or 'scope', not both "
                                "(stream-request-value.md)")


def encode_failover_log(entries) -> bytes:
    """N x (u64 vbucket uuid, u64 seqno), newest entry first."""
    return b"".join(_FAILOVER_ENTRY.pack(uuid, seqno) for uuid, seqno in entries)


def decode_failover_log(value: bytes) -> list[tuple[int, int]]:
    if len(value) % 16:
        raise ProtocolError(f"failover log must be a multiple of 16 bytes; got {len(value)}")
    return list(_FAILOVER_ENTRY.iter_unpack(value))


class DcpStreamRequestResponse(NamedTuple):
    """The reply to STREAM_REQ: OK with the failover log, or ROLLBACK (0x23) with only a u64 seqno
    (not the failover log rollback.md mentions), or another error status."""

    status: int = Status.SUCCESS
    failover_log: tuple[tuple[int, int], ...] = ()
    rollback_seqno: int | None = None
    opaque: int = 0
    value: bytes = b""

    opcode = Opcode.DCP_STREAM_REQ

    def encode(self) -> bytes:
        if self.status == Status.SUCCESS:
            value = encode_failover_log(self.failover_log)
        elif self.status == Status.ROLLBACK:
            value = _U64.pack(self.rollback_seqno or 0)
        else:
            value = self.value
        return encode_frame(Magic.RESPONSE, self.opcode, value=value, vbucket_or_status=self.status,
                            opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpStreamRequestResponse":
        rules.check(frame)
        if frame.status == Status.SUCCESS:
            return cls(frame.status, tuple(decode_failover_log(frame.value)), None, frame.opaque)
        if frame.status == Status.ROLLBACK:
            return cls(frame.status, (), _U64.unpack(frame.value)[0], frame.opaque)
        return cls(frame.status, (), None, frame.opaque, frame.value)


@rules.response_check(Opcode.DCP_STREAM_REQ, Opcode.DCP_GET_FAILOVER_LOG, Opcode.GET_FAILOVER_LOG)
def _failover_log_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS and len(frame.value) % 16:
        yield ProtocolError(f"failover log value must be N x 16 bytes; got {len(frame.value)} "
                            f"(failover-log.md)")
    if frame.status == Status.SUCCESS and len(frame.value) >= 32:
        seqnos = [s for _, s in _FAILOVER_ENTRY.iter_unpack(frame.value[: len(frame.value) // 16 * 16])]
        if any(a < b for a, b in zip(seqnos, seqnos[1:], strict=False)):
            yield ProtocolError(f"failover log is not newest-first: seqnos {seqnos} increase")
    if frame.status == Status.ROLLBACK and frame.opcode == Opcode.DCP_STREAM_REQ and len(frame.value) != 8:
        yield ProtocolError(f"ROLLBACK response must carry exactly a u64 rollback seqno; got "
                            f"{len(frame.value)} bytes")


class DcpGetFailoverLog(NamedTuple):
    """DCP_GET_FAILOVER_LOG 0x54 (failover-log.md)."""

    vbucket: int
    opaque: int = 0

    opcode = Opcode.DCP_GET_FAILOVER_LOG

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpGetFailoverLog":
        rules.check(frame)
        return cls(frame.vbucket, frame.opaque)


class FailoverLogResponse(NamedTuple):
    """Reply to DCP_GET_FAILOVER_LOG (and GET_FAILOVER_LOG 0x96): entries newest first."""

    entries: tuple[tuple[int, int], ...]
    opaque: int = 0
    status: int = Status.SUCCESS
    opcode: int = Opcode.DCP_GET_FAILOVER_LOG

    def encode(self) -> bytes:
        value = encode_failover_log(self.entries) if self.status == Status.SUCCESS else b""
        return encode_frame(Magic.RESPONSE, self.opcode, value=value, vbucket_or_status=self.status,
                            opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "FailoverLogResponse":
        rules.check(frame)
        entries = tuple(decode_failover_log(frame.value)) if frame.status == Status.SUCCESS else ()
        return cls(entries, frame.opaque, frame.status, frame.opcode)


rules.register(Opcode.DCP_GET_FAILOVER_LOG, Shape(_PAGES + "failover-log.md"),
               Shape(_PAGES + "failover-log.md", value=MUST))
rules.register(Opcode.GET_FAILOVER_LOG, Shape("docs/BinaryProtocol.md#0x96"),
               Shape("docs/BinaryProtocol.md#0x96", value=MUST))


class DcpCloseStream(NamedTuple):
    """DCP_CLOSE_STREAM 0x52 (close-stream.md)."""

    vbucket: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_CLOSE_STREAM

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCloseStream":
        rules.check(frame)
        return cls(frame.vbucket, frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_CLOSE_STREAM, Shape(_PAGES + "close-stream.md"), Shape(_PAGES + "close-stream.md"))


# ---------------------------------------------------------------------------------------------
# Stream messages (producer -> consumer)


class DcpStreamEnd(NamedTuple):
    """DCP_STREAM_END 0x55 (stream-end.md): u32 reason in the extras."""

    vbucket: int
    reason: int = StreamEndReason.OK
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_STREAM_END

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.reason),
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpStreamEnd":
        rules.check(frame)
        return cls(frame.vbucket, _U32.unpack(frame.extras)[0], frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_STREAM_END, Shape(_PAGES + "stream-end.md", extras=(4,)))
