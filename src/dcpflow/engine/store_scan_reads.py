"""The store's reads for KV range scans (engine/range_scan.py), on its pooled point-read
connections (WAL readers: they never wait for a flush batch's transaction):

* `key_range` - the metadata of the live latest versions of a key range, in key order, without
  their values: an index range of `items_by_key (vb, cid, key)`, each row's columns before its
  value read from the row's first page (a value's overflow pages are never touched). What a scan's
  snapshot takes of the documents memory lacks under full eviction.
* `key_of_seqno` - the key whose latest version has a seqno, if one has (kv_engine's
  `seqno_exists`: "the by-seqno index has an item with this sequence number"): the items table's
  rowid is the vbucket and seqno, so it is one point lookup.
* `read_versions` - the version of a key with a given seqno, for the values a continue sends of
  documents that were not resident: the latest version if it is that one, else the history
  table's copy of it (kept while the store keeps history, until compaction trims it), else the
  latest version as it is now (or None), for the caller to judge.

A mixin of `Store` (store.py), whose `_point` pool it uses.
"""

from collections.abc import Sequence

from .item import Item
from .store_rows import HISTORY_COLS, ITEM_BY_KEY, SEQNO, _item, _rowid, _u64, doc_key

_IN_HISTORY = f"SELECT {HISTORY_COLS} FROM history WHERE vb = ? AND cid = ? AND key = ? AND seqno = ?"
#: A range's metadata: every column before `value` (so no value is read).
_META = "SELECT key, seqno, rev_seqno, cas, flags, expiry, datatype FROM items WHERE vb = ? AND cid = ? AND key "


class ScanReads:
    """Range scans' reads of the store (module docstring)."""

    def key_range(self, vb: int, cid: int, start: bytes, end: bytes | None, *, excl_start: bool = False,
                  excl_end: bool = False) -> list[tuple]:
        """(key, seqno, rev_seqno, cas, flags, expiry, datatype) of every live (not deleted) latest
        version of collection `cid` of vbucket `vb` from `start` to `end` (None: no end; each bound
        inclusive unless its `excl_` is set), in key order (SQLite compares blobs as Python
        compares bytes). Expired ones are the caller's to leave out (it knows the time)."""
        sql = _META + (">" if excl_start else ">=") + " ?"
        args: list = [vb, cid, start]
        if end is not None:
            sql += " AND key " + ("<" if excl_end else "<=") + " ?"
            args.append(end)
        sql += " AND deleted = 0 ORDER BY key"
        db = self._point.get()
        try:
            rows = db.execute(sql, args).fetchall()
        finally:
            self._point.put(db)
        return [(key, seqno, _u64(rev), _u64(cas), flags, expiry, datatype)
                for key, seqno, rev, cas, flags, expiry, datatype in rows]

    def key_of_seqno(self, vb: int, seqno: int):
        """The engine's key (doc_key) of the version with `seqno` if it is the latest version of its
        key on disk (a tombstone counts, as it does in kv_engine's by-seqno index), else None."""
        db = self._point.get()
        try:
            row = db.execute("SELECT cid, key FROM items WHERE id = ?", (_rowid(vb, seqno),)).fetchone()
        finally:
            self._point.put(db)
        return None if row is None else doc_key(row[0], row[1])

    def read_versions(self, wanted: Sequence[tuple]) -> list[Item | None]:
        """For each (vb, key, seqno) (the engine's key: bytes, or (cid, bytes)), in the order given:
        the version with that seqno (the latest, or history's copy), else the latest version as it
        is now, else None."""
        out: list[Item | None] = []
        db = self._point.get()
        try:
            for vb, key, seqno in wanted:
                cid, key = key if key.__class__ is tuple else (0, key)
                row = db.execute(ITEM_BY_KEY, (vb, cid, key)).fetchone()
                if row is None or row[SEQNO] != seqno:
                    older = db.execute(_IN_HISTORY, (vb, cid, key, seqno)).fetchone()
                    row = older if older is not None else row
                out.append(None if row is None else _item(row))
        finally:
            self._point.put(db)
        return out
