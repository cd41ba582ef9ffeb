"""The document version the engine stores, queues, persists and streams.

One `Item` is one version of one key (docs/Document.md): value bytes, datatype, flags, expiry,
CAS, rev seqno, by-seqno, and for tombstones the delete time and why it was deleted. Items are
never mutated after creation, so the hash table, the checkpoints, a flush batch in another
thread and a DCP stream can all hold the same object safely.
"""

from dataclasses import dataclass
from enum import IntEnum

DATATYPE_JSON = 0x01
DATATYPE_SNAPPY = 0x02
DATATYPE_XATTR = 0x04

#: Rough per-item bookkeeping cost, used only for checkpoint memory accounting (cursor dropping).
ITEM_OVERHEAD = 96


class DeleteSource(IntEnum):
    """Why a tombstone exists: DCP sends a Deletion for EXPLICIT and an Expiration for TTL."""

    EXPLICIT = 0
    TTL = 1


@dataclass(slots=True, eq=True)
class Item:
    key: bytes
    value: bytes
    flags: int = 0
    expiry: int = 0  # absolute unix seconds, 0 = never
    cas: int = 0
    rev_seqno: int = 1
    by_seqno: int = 0
    datatype: int = 0
    deleted: bool = False
    delete_time: int = 0  # unix seconds, tombstones only
    delete_source: DeleteSource = DeleteSource.EXPLICIT

    @property
    def is_expiration(self) -> bool:
        return self.deleted and self.delete_source == DeleteSource.TTL

    @property
    def meta_expiry(self) -> int:
        """The expiry a tombstone reports (GetMeta, conflict resolution): its delete time."""
        return self.delete_time if self.deleted else self.expiry

    @property
    def has_xattrs(self) -> bool:
        return bool(self.datatype & DATATYPE_XATTR)

    @property
    def size(self) -> int:
        return len(self.key) + len(self.value) + ITEM_OVERHEAD


def retain_system_xattrs(value: bytes, datatype: int) -> tuple[bytes, int]:
    """The (value, datatype) a deletion keeps: only system xattrs (keys starting with '_').

    A delete drops the body and user xattrs but keeps system xattrs (transactions metadata lives
    there). A Snappy-compressed value cannot be parsed without a codec, so nothing is kept.
    """
    if not datatype & DATATYPE_XATTR or datatype & DATATYPE_SNAPPY or len(value) < 4:
        return b"", 0
    total = int.from_bytes(value[:4], "big")
    end = min(4 + total, len(value))
    pos, kept = 4, []
    while pos + 4 <= end:
        pair_len = int.from_bytes(value[pos:pos + 4], "big")
        pair_end = pos + 4 + pair_len
        if value[pos + 4:pos + 5] == b"_":
            kept.append(value[pos:pair_end])
        pos = pair_end
    if not kept:
        return b"", 0
    blob = b"".join(kept)
    return len(blob).to_bytes(4, "big") + blob, DATATYPE_XATTR
