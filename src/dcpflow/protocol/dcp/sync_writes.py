"""Synchronous writes on a stream: prepare.md, seqno-acknowledged.md, commit.md and abort.md.
"""

from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import (
    Frame,
)
from ..opcodes import Opcode
from ..rules import MAY, MUST, MUST_NOT, Shape
from ..status import Status
from .flags import DurabilityLevel
from .layouts import _PAGES, _PREPARE_EXTRAS, _TWO_SEQNOS, _U64, _encode


class DcpPrepare(NamedTuple):
    """DCP_PREPARE 0x60 (prepare.md): 31-byte extras; CAS must be non-zero (the page's
    example has 0, KV-Engine's validator refuses it)."""

    vbucket: int
    by_seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    lock_time: int
    key: bytes
    value: bytes
    cas: int
    durability_level: int = DurabilityLevel.MAJORITY
    deleted: bool = False
    datatype: int = 0
    opaque: int = 0
    nru: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_PREPARE

    def encode(self) -> bytes:
        extras = _PREPARE_EXTRAS.pack(self.by_seqno, self.rev_seqno, self.flags, self.expiration,
                                      self.lock_time, self.nru, int(self.deleted), self.durability_level)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, key=self.key, value=self.value,
                       cas=self.cas, datatype=self.datatype, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpPrepare":
        rules.check(frame)
        by_seqno, rev, flags, exp, lock, nru, deleted, level = _PREPARE_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, by_seqno, rev, flags, exp, lock, frame.key, frame.value, frame.cas, level,
                   bool(deleted), frame.datatype, frame.opaque, nru, frame.stream_id)


rules.register(Opcode.DCP_PREPARE,
               Shape(_PAGES + "prepare.md", extras=(31,), key=MUST, value=MAY, cas=MUST))


@rules.request_check(Opcode.DCP_PREPARE)
def _prepare_rules(frame: Frame):
    if len(frame.extras) == 31 and not 1 <= frame.extras[30] <= 3:
        yield ProtocolError(f"DCP_PREPARE durability level {frame.extras[30]} is not 1..3",
                            Status.DURABILITY_INVALID_LEVEL)


class DcpSeqnoAcknowledged(NamedTuple):
    """DCP_SEQNO_ACKNOWLEDGED 0x61 (seqno-acknowledged.md): consumer -> producer, CAS 0."""

    vbucket: int
    prepared_seqno: int
    opaque: int = 0

    opcode = Opcode.DCP_SEQNO_ACKNOWLEDGED

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U64.pack(self.prepared_seqno))

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSeqnoAcknowledged":
        rules.check(frame)
        return cls(frame.vbucket, _U64.unpack(frame.extras)[0], frame.opaque)


rules.register(Opcode.DCP_SEQNO_ACKNOWLEDGED,
               Shape(_PAGES + "seqno-acknowledged.md", extras=(8,), cas=MUST_NOT))


class DcpCommit(NamedTuple):
    """DCP_COMMIT 0x62 (commit.md): prepared and commit seqnos; key; CAS 0."""

    vbucket: int
    prepared_seqno: int
    commit_seqno: int
    key: bytes
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_COMMIT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque,
                       extras=_TWO_SEQNOS.pack(self.prepared_seqno, self.commit_seqno), key=self.key,
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCommit":
        rules.check(frame)
        prepared, commit = _TWO_SEQNOS.unpack(frame.extras)
        return cls(frame.vbucket, prepared, commit, frame.key, frame.opaque, frame.stream_id)


class DcpAbort(NamedTuple):
    """DCP_ABORT 0x63 (abort.md): prepared and abort seqnos; key; CAS 0."""

    vbucket: int
    prepared_seqno: int
    abort_seqno: int
    key: bytes
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_ABORT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque,
                       extras=_TWO_SEQNOS.pack(self.prepared_seqno, self.abort_seqno), key=self.key,
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpAbort":
        rules.check(frame)
        prepared, abort = _TWO_SEQNOS.unpack(frame.extras)
        return cls(frame.vbucket, prepared, abort, frame.key, frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_COMMIT, Shape(_PAGES + "commit.md", extras=(16,), key=MUST, cas=MUST_NOT))
rules.register(Opcode.DCP_ABORT, Shape(_PAGES + "abort.md", extras=(16,), key=MUST, cas=MUST_NOT))


def sync_seqno(msg: "DcpPrepare | DcpCommit | DcpAbort") -> int:
    """The seqno a prepare, commit or abort occupies (commit.md, abort.md: not the prepared seqno)."""
    t = type(msg)
    return msg.by_seqno if t is DcpPrepare else msg.commit_seqno if t is DcpCommit else msg.abort_seqno
