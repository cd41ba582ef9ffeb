"""The store's rows as named types the engine owns, and their columns as the engine reads them
(store.py writes them).

* `ItemRow` - a version as a read gives it back (the SELECTs' column lists are made from its
  field names); `BackfillRow` - the same with `encoded`, the row a DCP backfill reads
  (`BackfillScan.next_rows`).
* `FlushRow` - what the flusher binds to the items table (`_UPSERT_ITEM`, made from its names);
  the compiled flusher (engine/_speedups.c) builds the same tuples, held to this type by
  tests/engine/test_encoded_rows.py.

Rows travel as the plain tuples SQLite hands out (building a named tuple per row would cost a
backfill's time); readers take a field by the index constants below, made from the types'
field names, never by a number of their own. SQLite integers are signed 64-bit, so CAS and rev
seqnos are stored wrapped (`_s64`) and read back unwrapped (`_u64`); a row becomes an `Item`
(`item_from_row`); a stored (cid, key) becomes the engine's key of a document (`doc_key`). Kept
apart from store.py so that compaction (store_compaction.py) and the readers of backfill rows
share one definition without importing the whole store."""

from collections.abc import Sequence
from typing import NamedTuple

from dcpflow.protocol.dcp import MUTATION_HEAD

from .item import DeleteSource, Item

_SIGN = 1 << 63
_WRAP = 1 << 64
_SOURCES = (DeleteSource.EXPLICIT, DeleteSource.TTL)


class ItemRow(NamedTuple):
    """A version as the items and history tables give it back."""

    key: bytes
    seqno: int
    rev_seqno: int  # signed 64-bit as stored (_u64 reads it back)
    cas: int  # likewise
    flags: int
    expiry: int
    datatype: int
    deleted: int  # 0 or 1
    delete_time: int
    delete_source: int  # index into DeleteSource (EXPLICIT, TTL)
    value: bytes  # for an encoded row, the end of its stored message
    cid: int


#: An `ItemRow` and whether the row keeps its encoded DCP message (a backfill's raw rows).
BackfillRow = NamedTuple("BackfillRow", [*ItemRow.__annotations__.items(), ("encoded", int)])


class FlushRow(NamedTuple):
    """The items table's row as the flusher binds it (store._encoded_row, _speedups.c)."""

    vb: int
    key: bytearray
    seqno: int
    rev_seqno: int  # signed 64-bit (_s64)
    cas: int  # likewise
    flags: int
    expiry: int
    datatype: int
    deleted: int
    delete_time: int
    delete_source: int
    value: "bytearray | bytes"  # empty when `dcp` holds the whole message
    dcp: "bytearray | None"  # a plain mutation's DCP_MUTATION (opaque 0, no collection prefix)
    cid: int


#: Column order of a read (`ItemRow`), and the one the SELECTs list.
ITEM_COLUMNS = ItemRow._fields
#: The history table's read columns: the same, all plain columns there.
HISTORY_COLS = ", ".join(ITEM_COLUMNS)

#: The items table's rowid `id` is vb << SEQNO_BITS | seqno (store.py's module docstring): a 48-bit
#: seqno leaves room for the vbucket above it.
SEQNO_BITS = 48
MAX_STORED_SEQNO = (1 << SEQNO_BITS) - 1


def _rowid(vb: int, seqno: int) -> int:
    return vb << SEQNO_BITS | seqno


def _value_of(row: str = "") -> str:
    """A row's value (`row`: "" or "OLD." in a trigger): in `value`, or for an encoded row (whose
    `value` is empty) the end of its message."""
    return (f"CASE WHEN {row}dcp IS NULL THEN {row}value "
            f"ELSE substr({row}dcp, {MUTATION_HEAD.size + 1} + length({row}key)) END")


#: A read's columns of the items table (ItemRow), the value taken from an encoded row's message.
_ITEM_COLS = ", ".join(_value_of() if c == "value" else c for c in ITEM_COLUMNS)
#: A key's latest version (ItemRow): the point reads of GETs, bg fetches and range scans.
ITEM_BY_KEY = f"SELECT {_ITEM_COLS} FROM items WHERE vb = ? AND cid = ? AND key = ?"
#: Where each field of an ItemRow or BackfillRow is (the same places: BackfillRow only adds one).
(KEY, SEQNO, REV_SEQNO, CAS, FLAGS, EXPIRY, DATATYPE, DELETED, DELETE_TIME, DELETE_SOURCE, VALUE, CID,
 ENCODED) = (BackfillRow._fields.index(f) for f in (
    "key", "seqno", "rev_seqno", "cas", "flags", "expiry", "datatype", "deleted", "delete_time",
    "delete_source", "value", "cid", "encoded"))
#: Where the flusher's row keeps its message and its seqno.
FLUSH_SEQNO, FLUSH_DCP = FlushRow._fields.index("seqno"), FlushRow._fields.index("dcp")


def _s64(v: int) -> int:
    return v - _WRAP if v >= _SIGN else v


def _u64(v: int) -> int:
    return v + _WRAP if v < 0 else v


def _item(r: Sequence) -> Item:
    """Build an Item from an ItemRow (or a BackfillRow)."""
    return Item(r[KEY], r[VALUE], r[FLAGS], r[EXPIRY], _u64(r[CAS]), _u64(r[REV_SEQNO]), r[SEQNO], r[DATATYPE],
                bool(r[DELETED]), r[DELETE_TIME], _SOURCES[r[DELETE_SOURCE]], r[CID])


def doc_key(cid: int, key: bytes):
    """The engine's key of a document (engine/collections.py): the key itself in the default
    collection, (cid, key) in any other."""
    return (cid, key) if cid else key


item_from_row = _item
