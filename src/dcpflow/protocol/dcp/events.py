"""set-vbucket-state.md (takeover) and system_event.md (collection and scope changes on a stream).
"""

from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import (
    Frame,
)
from ..opcodes import Opcode
from ..rules import MAY, Shape
from ..status import Status
from ..system_events import decode_event_value
from .layouts import _PAGES, _SYSTEM_EVENT_EXTRAS, _encode, _ok_response


class DcpSetVbucketState(NamedTuple):
    """DCP_SET_VBUCKET_STATE 0x5b (set-vbucket-state.md): takeover; 1-byte state, no value
    (KV-Engine's validator rejects any value; the JSON value the page mentions belongs to SET_VBUCKET
    0x3d). The consumer answers it."""

    vbucket: int
    state: int
    opaque: int = 0

    opcode = Opcode.DCP_SET_VBUCKET_STATE

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=bytes([self.state]))

    def response(self, status: int = Status.SUCCESS) -> bytes:
        return _ok_response(self.opcode, self.opaque, status)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSetVbucketState":
        rules.check(frame)
        return cls(frame.vbucket, frame.extras[0], frame.opaque)


rules.register(Opcode.DCP_SET_VBUCKET_STATE, Shape(_PAGES + "set-vbucket-state.md", extras=(1,)),
               Shape(_PAGES + "set-vbucket-state.md"))


@rules.request_check(Opcode.DCP_SET_VBUCKET_STATE)
def _set_vb_state_rules(frame: Frame):
    if len(frame.extras) == 1 and not 1 <= frame.extras[0] <= 4:
        yield ProtocolError(f"vbucket state {frame.extras[0]} is not 1 (active), 2 (replica), 3 (pending) "
                            f"or 4 (dead)")


class DcpSystemEvent(NamedTuple):
    """DCP_SYSTEM_EVENT 0x5f (system_event.md): 13-byte extras (seqno, event id, version)."""

    vbucket: int
    by_seqno: int
    event: int
    version: int
    key: bytes = b""
    value: bytes = b""
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_SYSTEM_EVENT

    def encode(self) -> bytes:
        extras = _SYSTEM_EVENT_EXTRAS.pack(self.by_seqno, self.event, self.version)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, key=self.key, value=self.value,
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSystemEvent":
        rules.check(frame)
        by_seqno, event, version = _SYSTEM_EVENT_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, by_seqno, event, version, frame.key, frame.value, frame.opaque,
                   frame.stream_id)

    def decode_value(self) -> dict:
        """The value's fields (system_events.py): the legacy structs of system_event.md (version 0
        and 1: scope id before collection id, as its struct says; its example swaps them) or the
        FlatBuffers table (version 2)."""
        return decode_event_value(self.event, self.version, self.value)


rules.register(Opcode.DCP_SYSTEM_EVENT, Shape(_PAGES + "system_event.md", extras=(13,), key=MAY, value=MAY))
