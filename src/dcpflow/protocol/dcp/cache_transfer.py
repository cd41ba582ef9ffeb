"""cache-transfer.md and cache-transfer-end.md (a takeover's warm cache), and flush.md.
"""

from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import (
    Frame,
)
from ..opcodes import Opcode
from ..rules import MUST, MUST_NOT, Shape
from .layouts import _CACHE_RECORD, _PAGES, _encode


class CacheTransferRecord(NamedTuple):
    """One item of a DCP_CACHE_TRANSFER batch (cache-transfer.md: the field table's 40-byte header;
    the page's example grid drops 4 bytes)."""

    cas: int
    by_seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    datatype: int
    cache_hint: int
    key: bytes
    value: bytes


class DcpCacheTransfer(NamedTuple):
    """DCP_CACHE_TRANSFER 0x66: batched 40-byte-header records in the value; CAS 0."""

    vbucket: int
    records: tuple[CacheTransferRecord, ...]
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_CACHE_TRANSFER

    def encode(self) -> bytes:
        parts = []
        for r in self.records:
            parts.append(_CACHE_RECORD.pack(r.cas, r.by_seqno, r.rev_seqno, len(r.value), r.flags,
                                            r.expiration, len(r.key), r.datatype, r.cache_hint))
            parts.append(r.key)
            parts.append(r.value)
        return _encode(self.opcode, self.vbucket, self.opaque, value=b"".join(parts), stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCacheTransfer":
        rules.check(frame)
        return cls(frame.vbucket, tuple(_cache_records(frame.value)), frame.opaque, frame.stream_id)


def _cache_records(value: bytes):
    pos, end = 0, len(value)
    while pos < end:
        if end - pos < 40:
            raise ProtocolError(f"cache-transfer record header needs 40 bytes; {end - pos} remain")
        cas, seq, rev, vlen, flags, exp, klen, dt, hint = _CACHE_RECORD.unpack_from(value, pos)
        pos += 40
        if klen < 2:
            raise ProtocolError(f"cache-transfer record key_len must be >= 2 (a collection-aware key); got "
                                f"{klen} (cache-transfer.md)")
        if pos + klen + vlen > end:
            raise ProtocolError(f"cache-transfer record declares key {klen} + value {vlen} bytes but only "
                                f"{end - pos} remain")
        key, val = value[pos:pos + klen], value[pos + klen:pos + klen + vlen]
        pos += klen + vlen
        yield CacheTransferRecord(cas, seq, rev, flags, exp, dt, hint, key, val)


class DcpCacheTransferEnd(NamedTuple):
    """DCP_CACHE_TRANSFER_END 0x67: the end of the cache-transfer phase."""

    vbucket: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_CACHE_TRANSFER_END

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCacheTransferEnd":
        rules.check(frame)
        return cls(frame.vbucket, frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_CACHE_TRANSFER,
               Shape(_PAGES + "cache-transfer.md", value=MUST, cas=MUST_NOT))
rules.register(Opcode.DCP_CACHE_TRANSFER_END, Shape(_PAGES + "cache-transfer-end.md"))


@rules.request_check(Opcode.DCP_CACHE_TRANSFER)
def _cache_transfer_rules(frame: Frame):
    try:
        for _ in _cache_records(frame.value):
            pass
    except ProtocolError as e:
        yield e


rules.register(Opcode.DCP_FLUSH, Shape(_PAGES + "flush.md"))
