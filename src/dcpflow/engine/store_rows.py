"""The store's columns as the engine reads them (store.py writes them): SQLite integers are
signed 64-bit, so CAS and rev seqnos are stored wrapped (`_s64`) and read back unwrapped
(`_u64`); a row of `ITEM_COLUMNS` becomes an `Item`; a stored (cid, key) becomes the engine's key
of a document (`doc_key`). Kept apart from store.py so that compaction (store_compaction.py) and
the readers of backfill rows share one definition without importing the whole store."""

from collections.abc import Sequence

from .item import DeleteSource, Item

_SIGN = 1 << 63
_WRAP = 1 << 64
_SOURCES = (DeleteSource.EXPLICIT, DeleteSource.TTL)


def _s64(v: int) -> int:
    return v - _WRAP if v >= _SIGN else v


def _u64(v: int) -> int:
    return v + _WRAP if v < 0 else v


def _item(r: Sequence) -> Item:
    """Build an Item from a row in `_ITEM_COLS` order."""
    return Item(r[0], r[10], r[4], r[5], _u64(r[3]), _u64(r[2]), r[1], r[6], bool(r[7]), r[8], _SOURCES[r[9]],
                r[11])


def doc_key(cid: int, key: bytes):
    """The engine's key of a document (engine/collections.py): the key itself in the default
    collection, (cid, key) in any other."""
    return (cid, key) if cid else key


#: Column order of `BackfillScan.next_rows`.
ITEM_COLUMNS = ("key", "seqno", "rev_seqno", "cas", "flags", "expiry", "datatype", "deleted", "delete_time",
                "delete_source", "value", "cid")


item_from_row = _item
