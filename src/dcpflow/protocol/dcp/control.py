"""Connection-level DCP messages: open-connection.md, control.md, no-op.md and buffer-ack.md (flow
control).
"""

import json
from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import (
    Frame,
)
from ..opcodes import Opcode
from ..rules import MAY, MUST, Shape
from ..status import Status
from .flags import OPEN_FLAGS_KNOWN, OPEN_FLAGS_REJECTED, OpenFlag, spell_flags
from .layouts import _OPEN_EXTRAS, _PAGES, _U32, _encode, _ok_response

# ---------------------------------------------------------------------------------------------
# Connection-level messages


class DcpOpen(NamedTuple):
    """DCP_OPEN 0x50 (open-connection.md): name in the key, flags in the extras, optional JSON."""

    name: bytes
    flags: int = OpenFlag.PRODUCER
    value: bytes = b""
    opaque: int = 0
    reserved: int = 0

    opcode = Opcode.DCP_OPEN

    @property
    def is_producer(self) -> bool:
        return bool(self.flags & OpenFlag.PRODUCER)

    @property
    def consumer_name(self) -> str | None:
        if not self.value:
            return None
        doc = json.loads(self.value)
        return doc.get("consumer_name") if isinstance(doc, dict) else None

    def encode(self) -> bytes:
        return _encode(self.opcode, 0, self.opaque, extras=_OPEN_EXTRAS.pack(self.reserved, self.flags),
                       key=self.name, value=self.value, datatype=0x01 if self.value else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpOpen":
        rules.check(frame)
        reserved, flags = _OPEN_EXTRAS.unpack(frame.extras)
        return cls(frame.key, flags, frame.value, frame.opaque, reserved)


rules.register(Opcode.DCP_OPEN, Shape(_PAGES + "open-connection.md", extras=(8,), key=MUST, value=MAY),
               Shape(_PAGES + "open-connection.md"))


@rules.request_check(Opcode.DCP_OPEN)
def _open_rules(frame: Frame):
    if len(frame.extras) != 8:
        return
    _, flags = _OPEN_EXTRAS.unpack(frame.extras)
    page = "(open-connection.md)"
    if flags & OPEN_FLAGS_REJECTED:
        yield ProtocolError(f"DCP_OPEN flags {spell_flags(flags & OPEN_FLAGS_REJECTED, OpenFlag)} "
                            f"are invalid {page}")
    unknown = flags & ~(OPEN_FLAGS_KNOWN | OPEN_FLAGS_REJECTED)
    if unknown:
        yield ProtocolError(f"DCP_OPEN has unknown flag bits 0x{unknown:x} {page}")
    if flags & OpenFlag.NO_VALUE and flags & OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE:
        yield ProtocolError(f"DCP_OPEN flags NoValue and NoValueWithUnderlyingDatatype are mutually "
                            f"exclusive {page}")
    if flags & OpenFlag.INCLUDE_DELETED_USER_XATTRS and not flags & OpenFlag.INCLUDE_XATTRS:
        yield ProtocolError(f"DCP_OPEN flag IncludeDeletedUserXattrs requires IncludeXattrs {page}")
    if flags & OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL and not flags & OpenFlag.PRODUCER:
        yield ProtocolError(f"DCP_OPEN flag SkipDeletesInInitialBackfill is for producers only {page}")
    if frame.value:
        if not frame.datatype & 0x01:
            yield ProtocolError(f"DCP_OPEN value must be JSON and flagged with datatype JSON {page}")
        try:
            doc = json.loads(frame.value)
        except (ValueError, RecursionError):
            yield ProtocolError(f"DCP_OPEN value is not valid JSON {page}")
            return
        if not isinstance(doc, dict) or set(doc) - {"consumer_name"}:
            yield ProtocolError(f"DCP_OPEN value may only hold 'consumer_name' {page}")
        elif flags & OpenFlag.PRODUCER and "consumer_name" in doc:
            yield ProtocolError(f"DCP_OPEN 'consumer_name' is only for opening a consumer {page}")


class DcpControl(NamedTuple):
    """DCP_CONTROL 0x5e (control.md): key and value are plain strings. The keys a producer accepts
    are dcpflow.dcp.controls's table."""

    key: bytes
    value: bytes
    opaque: int = 0

    opcode = Opcode.DCP_CONTROL

    def encode(self) -> bytes:
        return _encode(self.opcode, 0, self.opaque, key=self.key, value=self.value)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpControl":
        rules.check(frame)
        return cls(frame.key, frame.value, frame.opaque)


rules.register(Opcode.DCP_CONTROL, Shape(_PAGES + "control.md", key=MUST, value=MUST),
               Shape(_PAGES + "control.md"))


class DcpNoop(NamedTuple):
    """DCP_NOOP 0x5c (no-op.md): the producer's keep-alive; the consumer must answer it."""

    opaque: int = 0

    opcode = Opcode.DCP_NOOP

    def encode(self) -> bytes:
        return _encode(self.opcode, 0, self.opaque)

    def response(self, status: int = Status.SUCCESS) -> bytes:
        return _ok_response(self.opcode, self.opaque, status)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpNoop":
        rules.check(frame)
        return cls(frame.opaque)


rules.register(Opcode.DCP_NOOP, Shape(_PAGES + "no-op.md"), Shape(_PAGES + "no-op.md"))


class DcpBufferAck(NamedTuple):
    """DCP_BUFFER_ACKNOWLEDGEMENT 0x5d (buffer-ack.md): bytes freed by the consumer. No reply."""

    bytes_acked: int
    opaque: int = 0
    vbucket: int = 0

    opcode = Opcode.DCP_BUFFER_ACKNOWLEDGEMENT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.bytes_acked))

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpBufferAck":
        rules.check(frame)
        return cls(_U32.unpack(frame.extras)[0], frame.opaque, frame.vbucket)


rules.register(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, Shape(_PAGES + "buffer-ack.md", extras=(4,)))
