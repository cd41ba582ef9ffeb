"""Conflict resolution for *WithMeta writes, as pure functions (one place orders conflicts).

Reference: https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/protocol/set_with_meta.md
and del_with_meta.md, as KV-Engine's code behaves (the pages' pseudo-code differs in the tie-breaks).
The code compares tuples and the incoming version wins only if its tuple is strictly greater:

* rev-seqno ("seqno") buckets: mutations `(rev_seqno, cas, expiry, flags)`, deletions `(rev_seqno, cas)`
* LWW buckets: mutations `(cas, rev_seqno, expiry, flags)`, deletions `(cas, rev_seqno)`

An equal tuple loses (KEY_EEXISTS: the versions are identical) except that, for mutations in both
modes, an incoming version with xattrs beats an identical existing one without.

Erratum 51: the page's pseudo-code says the incoming item wins on flags when its flags are LESS;
the code (which we follow) wins when they are GREATER, as the tuple comparison implies.
"""

from enum import StrEnum
from typing import NamedTuple

from .item import DATATYPE_XATTR, Item


class ConflictResolutionMode(StrEnum):
    REV_SEQNO = "seqno"
    LWW = "lww"


class DocMeta(NamedTuple):
    """The metadata conflict resolution looks at."""

    cas: int
    rev_seqno: int
    expiry: int = 0
    flags: int = 0
    datatype: int = 0

    @classmethod
    def of(cls, item: Item) -> "DocMeta":
        """Metadata of a stored version; a tombstone reports its delete time as expiry."""
        return cls(item.cas, item.rev_seqno, item.meta_expiry, item.flags, item.datatype)


def _key(mode: ConflictResolutionMode, m: DocMeta, deletion: bool) -> tuple[int, ...]:
    if mode == ConflictResolutionMode.LWW:
        return (m.cas, m.rev_seqno) if deletion else (m.cas, m.rev_seqno, m.expiry, m.flags)
    return (m.rev_seqno, m.cas) if deletion else (m.rev_seqno, m.cas, m.expiry, m.flags)


def incoming_wins(mode: ConflictResolutionMode | str, incoming: DocMeta, existing: DocMeta, *,
                  deletion: bool = False) -> bool:
    """True if `incoming` should replace `existing` (else the write fails with KEY_EEXISTS)."""
    mode = ConflictResolutionMode(mode)
    new, old = _key(mode, incoming, deletion), _key(mode, existing, deletion)
    if new != old:
        return new > old
    if deletion:
        return False
    return bool(incoming.datatype & DATATYPE_XATTR) and not existing.datatype & DATATYPE_XATTR
