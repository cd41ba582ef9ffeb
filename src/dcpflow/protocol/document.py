"""One version of a document, as DCP carries it: the record the protocol's encoders read.

A DCP_MUTATION carries a document's key, value, datatype, flags, expiry, CAS, rev seqno and
by-seqno (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/mutation.md);
a DCP_DELETION or DCP_EXPIRATION carries the same for a tombstone, with its delete time
(deletion.md, expiration.md), and the collection it belongs to, whose id a collection-aware stream
sends as the key's LEB128 prefix (https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md).
`Document` holds exactly those fields. It is the protocol's type for
a run of documents to encode (`dcp.encode_mutations`): the compiled encoder reads its fields at the
offsets of this class's own slots, and reads any other object's through getattr, as the Python does.
The engine keeps its document versions as Documents.
"""

from dataclasses import dataclass
from enum import IntEnum

_XATTR = 0x04  # Datatype.XATTR, as an int: has_xattrs runs on hot paths


class DeleteSource(IntEnum):
    """Why a tombstone exists: DCP sends a Deletion for EXPLICIT and an Expiration for TTL."""

    EXPLICIT = 0
    TTL = 1


@dataclass(slots=True, eq=True)
class Document:
    """One version of one key (Document.md); never changed once made, so it can be shared."""

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
    cid: int = 0  # the collection id; 0 is the default collection

    @property
    def is_expiration(self) -> bool:
        return self.deleted and self.delete_source == DeleteSource.TTL

    @property
    def meta_expiry(self) -> int:
        """The expiry a tombstone reports (GetMeta, conflict resolution): its delete time."""
        return self.delete_time if self.deleted else self.expiry

    @property
    def has_xattrs(self) -> bool:
        return bool(self.datatype & _XATTR)
