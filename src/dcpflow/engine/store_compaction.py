"""Compaction of the durable store: purging tombstones and trimming the history kept for
rollback and for the collections that keep history (what couchstore's compaction drops), and
measuring what the file holds besides the latest versions. A mixin of `Store` (store.py), whose
transaction (`_txn`) and read connections (`_readers`, `_point`) it uses."""

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from .store_rows import _s64, _u64, doc_key


@dataclass(frozen=True, slots=True)
class PurgeResult:
    purged: list[tuple]  # (doc_key, seqno) of each purged tombstone
    purge_seqno: int
    max_deleted_rev_seqno: int
    history_floor: int
    history_start: int = 0


@dataclass(frozen=True, slots=True)
class HistoryRetention:
    """What compaction keeps of the older versions of the collections that keep history (DCP
    change streams): those written in the last `seconds` and, of those, the newest `bytes` (0:
    no limit of that kind; both 0: none kept beyond the rollback history)."""

    cids: tuple[int, ...]
    seconds: float = 0
    bytes: int = 0
    now: float = 0

    @property
    def active(self) -> bool:
        return bool(self.cids) and bool(self.seconds or self.bytes)


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """What `Store.fragmentation` measured. `fraction` is the share of rows that are older versions
    (what compaction can drop), as couchstore's fragmentation is the share of the file that is not
    the latest data; free pages are reused by later writes (SQLite never shrinks a file by itself)."""

    items: int
    history: int
    file_bytes: int
    free_bytes: int

    @property
    def fraction(self) -> float:
        total = self.items + self.history
        return self.history / total if total else 0.0


class Compaction:
    """`Store`'s compaction and fragmentation (module docstring)."""

    __slots__ = ()

    def fragmentation(self) -> "Fragmentation":
        """What the file holds besides the latest versions (on a read connection: any thread, no
        wait for the writer): the rows of `items` and `history`, and the file's pages.

        On a connection without a memory map (the `_point` pool, store.py): the counts walk a
        whole table, and through a map every page they touched stayed in the server's resident
        memory while the connection idled in its pool - 600 MB of RSS beside a 512 MiB quota at
        1.4M documents, measured every 10 s by the server's fragmentation check."""
        db = self._point.get()
        try:
            items = db.execute("SELECT count(*) FROM items").fetchone()[0]
            history = db.execute("SELECT count(*) FROM history").fetchone()[0]
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
        finally:
            self._point.put(db)
        return Fragmentation(items, history, pages * page_size, free * page_size)

    def purge_tombstones(self, vb: int, deleted_before: int, *, history_floor: int = 0,
                         keep: "HistoryRetention | None" = None, keep_history: int | None = None) -> PurgeResult:
        """Compaction: purge tombstones deleted at or before `deleted_before` (unix seconds).

        The purge seqno advances to the highest purged seqno. The rollback floor moves up to at
        least the purge seqno (a purged tombstone's key can no longer be rolled back past it), to
        `history_floor`, and with `keep_history` so that at most that many of the vbucket's most
        recent older versions stay; history that only served seqnos below the floor is dropped - but
        the older versions of the collections `keep` names are kept for its retention instead:
        those written longer ago than its seconds, and the oldest beyond its bytes, go, and
        `history_start` moves past them (from there on every version is still here).
        """
        with self._txn() as db:
            return self._purge(db, vb, deleted_before, history_floor, keep, keep_history)

    def compact(self, plan: Iterable[tuple[int, int, int, "HistoryRetention | None", int | None]]
                ) -> dict[int, PurgeResult]:
        """`purge_tombstones` for each (vb, deleted_before, history_floor, keep, keep_history) of
        `plan`, in one transaction (one commit for a whole bucket, not one per vbucket)."""
        with self._txn() as db:
            return {vb: self._purge(db, vb, deleted_before, floor, keep, keep_history)
                    for vb, deleted_before, floor, keep, keep_history in plan}

    def _purge(self, db: sqlite3.Connection, vb: int, deleted_before: int, history_floor: int,
               keep: "HistoryRetention | None", keep_history: int | None) -> PurgeResult:
        state = db.execute("SELECT purge_seqno, max_deleted_rev_seqno, history_floor, history_start "
                           "FROM vbucket_state WHERE vb = ?", (vb,)).fetchone()
        if state is None:
            raise KeyError(f"vbucket {vb} has no persisted state")
        purge_seqno, max_rev, floor, history_start = state[0], _u64(state[1]), state[2], state[3]
        rows = db.execute("SELECT key, seqno, rev_seqno, cid FROM items WHERE vb = ? AND deleted = 1 "
                          "AND delete_time <= ?", (vb, deleted_before)).fetchall()
        if rows:
            db.executemany("DELETE FROM items WHERE vb = ? AND cid = ? AND key = ?",
                           [(vb, r[3], r[0]) for r in rows])
            purge_seqno = max(purge_seqno, max(r[1] for r in rows))
            max_rev = max(max_rev, max(_u64(r[2]) for r in rows))
        floor = max(floor, purge_seqno, history_floor)
        kept = keep.cids if keep is not None and keep.active else ()
        marks = ",".join("?" * len(kept))
        if keep_history is not None:  # (the collections kept for their retention are not counted)
            row = db.execute("SELECT superseded_by FROM history WHERE vb = ?"
                             + (f" AND cid NOT IN ({marks})" if kept else "")
                             + " ORDER BY superseded_by DESC LIMIT 1 OFFSET ?", (vb, *kept, keep_history)).fetchone()
            if row is not None:
                floor = max(floor, row[0])
        if kept:
            db.execute(f"DELETE FROM history WHERE vb = ? AND superseded_by <= ? AND cid NOT IN ({marks})",
                       (vb, floor, *kept))
            history_start = max(history_start, self._history_cut(db, vb, kept, keep))
            db.execute(f"DELETE FROM history WHERE vb = ? AND seqno < ? AND cid IN ({marks})",
                       (vb, history_start, *kept))
        else:
            db.execute("DELETE FROM history WHERE vb = ? AND superseded_by <= ?", (vb, floor))
        db.execute("DELETE FROM snapshots WHERE vb = ? AND snap_end < ?", (vb, floor))
        # completed prepares only a rollback below the floor could bring back
        db.execute("DELETE FROM prepares WHERE vb = ? AND completed > 0 AND completed <= ?", (vb, floor))
        db.execute("UPDATE vbucket_state SET purge_seqno = ?, max_deleted_rev_seqno = ?, "
                   "history_floor = ?, history_start = ? WHERE vb = ?",
                   (purge_seqno, _s64(max_rev), floor, history_start, vb))
        return PurgeResult([(doc_key(r[3], r[0]), r[1]) for r in rows], purge_seqno, max_rev, floor,
                           history_start)

    @staticmethod
    def _history_cut(db: sqlite3.Connection, vb: int, cids: tuple[int, ...], keep: "HistoryRetention") -> int:
        """The lowest seqno the retention keeps the older versions of `cids` from."""
        marks = ",".join("?" * len(cids))
        cut = 0
        if keep.seconds:
            row = db.execute(f"SELECT max(seqno) FROM history WHERE vb = ? AND cid IN ({marks}) AND cas < ?",
                             (vb, *cids, _s64(max(0, int((keep.now - keep.seconds) * 1e9))))).fetchone()
            cut = max(cut, (row[0] or 0) + 1 if row[0] is not None else 0)
        if keep.bytes:
            row = db.execute(
                f"SELECT max(seqno) FROM (SELECT seqno, sum(length(key) + length(value)) OVER (ORDER BY seqno DESC) "
                f"AS newer FROM history WHERE vb = ? AND cid IN ({marks})) WHERE newer > ?",
                (vb, *cids, keep.bytes)).fetchone()
            cut = max(cut, row[0] + 1 if row[0] is not None else 0)
        return cut
