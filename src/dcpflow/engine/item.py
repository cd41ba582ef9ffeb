"""The document version the engine stores, queues, persists and streams.

One `Item` is one version of one key (docs/Document.md): value bytes, datatype, flags, expiry,
CAS, rev seqno, by-seqno, and for tombstones the delete time and why it was deleted. Items are
never mutated after creation, so the hash table, the checkpoints, a flush batch in another
thread and a DCP stream can all hold the same object safely.
"""

from dcpflow.protocol.datatype import (
    DATATYPE_JSON,
    DATATYPE_SNAPPY,
    DATATYPE_XATTR,
    pack_xattr_section,
    xattr_pair_spans,
)
from dcpflow.protocol.document import DeleteSource, Document

__all__ = ["DATATYPE_JSON", "DATATYPE_SNAPPY", "DATATYPE_XATTR", "ITEM_OVERHEAD", "NOT_RESIDENT", "DeleteSource",
           "Item", "retain_system_xattrs"]

#: What a version queued in a checkpoint costs besides its key's and value's bytes, for checkpoint
#: memory accounting (memory.py: the quota, its marks, cursor dropping): the Item (12 slots and
#: its object head, 128 bytes), the headers of its key and value bytes, its CAS int, the
#: checkpoint's slots for it (items and seqnos lists, the seqno int, the de-duplication index).
#: Measured with tracemalloc over 100k queued SETs of 15-byte keys: 283 (tests/engine/
#: test_memory.py holds the count within 10% of what is spent). It was 96, so a backlog for the
#: flusher took 1.45x the memory counted for it, which the interpreter's allocator then kept: at
#: 512 MiB of quota a load's checkpoints left 146 MB of empty pools beside the item table.
ITEM_OVERHEAD = 280


class _NotResident(bytes):
    """The value of a hash-table entry whose value was evicted (memory.py): empty bytes, so memory
    accounting counts nothing for it, told apart by identity (`item.value is NOT_RESIDENT`). Only
    the hash table holds such entries; every read of a value fetches it back first (vb_items.py)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_RESIDENT"


NOT_RESIDENT = _NotResident()


class Item(Document):
    """A document version of the engine: the protocol's `Document` (its fields and slots, so the
    DCP encoders read it as the protocol's own record) with the engine's memory accounting."""

    __slots__ = ()

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
    kept = [value[start:end] for start, end in xattr_pair_spans(value) if value[start + 4:start + 5] == b"_"]
    if not kept:
        return b"", 0
    return pack_xattr_section(b"".join(kept)), DATATYPE_XATTR
