"""The durable store: one SQLite database per bucket, written only by the flusher in batches.

Why SQLite in WAL mode: it is in the standard library (the engine stays dependency-free), every
flush batch is one crash-safe transaction (a batch is either wholly on disk or not at all, so
"persisted seqno" is exact after `kill -9`; with synchronous=FULL also after power loss), and
B-tree indexes give us the two access paths the engine needs: by key (warm-up, GetMeta of an
evicted key, rollback) and by seqno (DCP backfill, purge). WAL lets backfill readers see a
consistent snapshot in their own read transaction while the flusher keeps committing.

Why one database per bucket rather than per vbucket: a flush batch spans many vbuckets and
should be one transaction with one fsync; 1024 files (x3 with -wal/-shm) would cost file handles
and make a batch 1024 commits. Every table is keyed by vbucket first, so per-vbucket work (scan,
purge, rollback, delete) is an index range.

Layout:
* `items` - the latest version of every key of every collection of every vbucket (tombstones
  included until purged), *clustered by seqno*: the rowid is `vb << 48 | seqno` (`id`), so a
  vbucket's items lie in seqno order in the table's own B-tree and a by-seqno range is one
  sequential walk with no index between (a flush that replaces a key moves its row to the
  vbucket's end, as couchstore appends to its by-seqno tree); plus a unique index (vb, cid, key):
  a key is unique within its collection (`cid`, 0 the default collection, 1 the collections
  system events of engine/collections.py), and one collection's rows are an index range (what a
  dropped collection's purge deletes). Only the latest version is kept, so a by-seqno scan is
  naturally de-duplicated, as a Couchbase disk snapshot is.
* `vbucket_state` - per vbucket: state, failover log (JSON), persisted high seqno, persisted
  snapshot start/end, purge seqno, max CAS, max visible seqno, max deleted rev seqno, and the
  rollback floor.
* `history` - versions the flusher overwrote, with the seqno that superseded them (moved there by
  a trigger as the flusher's upsert replaces them, see `_HISTORY_TRIGGER`). This is what
  makes rollback possible with latest-only items, and what a change stream's backfill reads for
  the collections that keep history (`scan(..., history=...)`; compaction keeps their versions for
  the bucket's history retention and records from which seqno on every version is still there,
  `history_start`) (the role couchstore's older file headers play):
  rolling back to R restores, for each key changed after R, the version current at R. Compaction
  trims history up to the *rollback floor*; rolling back below the floor is impossible, and then
  we do what Couchbase does when no older disk snapshot exists: reset the vbucket to seqno 0.
* `snapshots` - the snapshot ranges items were persisted in, so a rollback can tell whether the
  seqno it reached ends a snapshot (a consistent point) or lies inside one (de-duplication may
  have dropped versions a consistent state at that seqno would need).
* `meta` - bucket-level facts: number of vbuckets, conflict-resolution mode, clean-shutdown mark.
* `runs` - backfill's fast path for data at rest: a run is the concatenated stored messages of
  every row of one vbucket with lo < seqno <= hi (its rowid `vb << 48 | lo`), all of them plain
  mutations, as one blob (see "Runs" below).

Each plain mutation row (not deleted, no xattrs, value below ENCODED_VALUE_LIMIT) keeps its whole
DCP_MUTATION as the producer sends it to a consumer without collections, opaque 0, in the `dcp`
column - the value is the message's tail, so `value` is left empty (reads take it from `dcp`:
`_VALUE`). A backfill page of such rows is then one `group_concat` of that column over a seqno
range - no expression per row, the GIL released, on another core, no Python object per item - and
`stamp_mutations` (one C pass, also without the GIL) writes the stream's opaque and, for a
collection-aware stream, the key prefix. Rows without it (tombstones, xattrs, large values) are
found through a partial index and read as rows.

Runs: a backfill that reads a row per document spends more in SQLite per small document (the
B-tree walk, a record decode and an append per row) than the loopback socket costs for its bytes.
A run is a page of stored messages already concatenated, so a backfill reads ~256 KiB
in one query: the bytes kept twice (the row's `dcp` and the run) buy a read that copies blob pages.
The flusher cuts them as it writes (`_cut_runs`): a run ends when it reaches `run_bytes`, or just
before a row that is not a plain mutation; what is left over at the vbucket's end waits for more
writes or for `seal_runs` (the server calls it when the flusher is idle, a clean close does,
and opening a store seals what an earlier process left, up to DEFER_AT_OPEN_BYTES a
vbucket). While the flusher has a backlog it
writes without cutting runs (`write(cut_runs=False)`): the copy would double the bytes of every
flush just when writers wait for the disk (a load into a full memory quota), so those vbuckets'
runs are cut by `seal_runs` once the flusher is idle, a bounded number of vbuckets a call, and
backfills read their rows as encoded pages meanwhile. A run is a cache of the rows, never the
truth: the statement that builds one checks that every row in its range is encoded (`_BUILD_RUN`),
and triggers in the file drop a run when any row in its range changes, whoever changes it
(`_RUN_TRIGGERS`).

Schema version: the file's layout is numbered in SQLite's `user_version` header field
(SCHEMA_VERSION, 2 today), written in the transaction that creates the tables. An older layout is
converted by one step per version, at open, in one transaction with the new number: version 1 had
no collections, and `_MIGRATE_1_TO_2` gives items and history a `cid` column (0: the default
collection, where every document of version 1 was), makes the key unique per collection, adds the
history index by seqno and the vbucket's `history_start`. A new store is made the same way -
version 1's tables, then the step - so a migrated file and a new one have one layout (tested). A
store of a version this dcpflow does not know is refused with a StoreVersionError naming both
versions, and left unchanged. A file without a version (user_version 0) that is laid out exactly
as version 1 was written by dcpflow before the version was stamped, and is migrated as version 1;
the layouts of development builds before it (values apart from their messages, items not
clustered by seqno, no runs) were never released and are refused.

CAS and rev seqno are u64 on the wire but SQLite integers are signed 64-bit, so they are stored
two's-complement and converted back on read.

KV range scans read the store through `ScanReads` (store_scan_reads.py): a key range's metadata
from the key index, a seqno's key by rowid, and a document's version by seqno (history's copy
when the latest moved on).

Threading: all methods may be called from any thread; one lock serialises the writer
connection. Scans open their own connection (`BackfillScan`), so a backfill never blocks a flush.
"""

import functools
import heapq
import itertools
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dcpflow.protocol.dcp import encode_mutations_py, mutations_upto, stamp_mutations
from dcpflow.protocol.frame import compiled

from .item import Item
from .store_compaction import Compaction
from .store_rows import (
    _ITEM_COLS,
    ENCODED,
    FLUSH_DCP,
    FLUSH_SEQNO,
    ITEM_BY_KEY,
    ITEM_COLUMNS,
    MAX_STORED_SEQNO,
    SEQNO,
    SEQNO_BITS,
    VALUE,
    FlushRow,
    _item,
    _rowid,
    _s64,
    _u64,
    _value_of,
    doc_key,
)
from .store_scan_reads import ScanReads

_ITEMS_TABLE = f"""
    id INTEGER PRIMARY KEY,
    vb INTEGER NOT NULL, key BLOB NOT NULL, seqno INTEGER NOT NULL CHECK (seqno BETWEEN 0 AND {MAX_STORED_SEQNO}),
    rev_seqno INTEGER NOT NULL, cas INTEGER NOT NULL, flags INTEGER NOT NULL, expiry INTEGER NOT NULL,
    datatype INTEGER NOT NULL, deleted INTEGER NOT NULL, delete_time INTEGER NOT NULL,
    delete_source INTEGER NOT NULL, value BLOB NOT NULL, dcp BLOB
"""
#: The tables of schema version 1 (with `_ITEM_INDEXES` and `_RUN_TRIGGERS`: `_SCHEMA_V1`).
_TABLES = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE vbucket_state (
    vb INTEGER PRIMARY KEY,
    state INTEGER NOT NULL,
    failover_log TEXT NOT NULL,
    high_seqno INTEGER NOT NULL,
    snap_start INTEGER NOT NULL,
    snap_end INTEGER NOT NULL,
    purge_seqno INTEGER NOT NULL,
    max_cas INTEGER NOT NULL,
    max_visible_seqno INTEGER NOT NULL,
    max_deleted_rev_seqno INTEGER NOT NULL,
    history_floor INTEGER NOT NULL DEFAULT 0
)""",
    f"CREATE TABLE items ({_ITEMS_TABLE})",
    """CREATE TABLE history (
    vb INTEGER NOT NULL, key BLOB NOT NULL, seqno INTEGER NOT NULL, rev_seqno INTEGER NOT NULL,
    cas INTEGER NOT NULL, flags INTEGER NOT NULL, expiry INTEGER NOT NULL, datatype INTEGER NOT NULL,
    deleted INTEGER NOT NULL, delete_time INTEGER NOT NULL, delete_source INTEGER NOT NULL,
    value BLOB NOT NULL, superseded_by INTEGER NOT NULL
)""",
    "CREATE UNIQUE INDEX history_by_key ON history (vb, key, seqno)",
    """CREATE TABLE snapshots (
    vb INTEGER NOT NULL, snap_start INTEGER NOT NULL, snap_end INTEGER NOT NULL,
    PRIMARY KEY (vb, snap_start, snap_end)
) WITHOUT ROWID""",
    "CREATE INDEX history_by_superseded ON history (vb, superseded_by)",
    """CREATE TABLE runs (
    id INTEGER PRIMARY KEY, hi INTEGER NOT NULL, count INTEGER NOT NULL, last INTEGER NOT NULL,
    data BLOB NOT NULL
)""",
)


def _vb_rowids(vb: int) -> tuple[int, int]:
    """A vbucket's first and last possible rowid: `id >= ? AND id <= ?` takes all its rows (or runs)."""
    return _rowid(vb, 0), _rowid(vb, MAX_STORED_SEQNO)


#: The by-key index, and the partial index through which a backfill finds the rows it must read as
#: rows (tombstones, xattrs, large values) in O(log n).
_ITEM_INDEXES = ("CREATE UNIQUE INDEX items_by_key ON items (vb, key)",
                 "CREATE INDEX items_unencoded_by_id ON items (id) WHERE dcp IS NULL")

#: The 12 columns `_row` binds (FlushRow's up to `value`), then the collection id: the items and
#: history tables have both.
_BASE_COLS = ", ".join(FlushRow._fields[:FlushRow._fields.index("value") + 1])
_COLS = _BASE_COLS + ", cid"


# Range queries by seqno take rowids: (_rowid(vb, start), _rowid(vb, end)].
_NEXT_UNENCODED = ("SELECT seqno FROM items INDEXED BY items_unencoded_by_id WHERE id > ? AND id <= ? "
                   "AND dcp IS NULL ORDER BY id LIMIT 1")
_NEXT_ROW = "SELECT seqno FROM items WHERE id > ? AND id <= ? ORDER BY id LIMIT 1"
_ROW_PAGE = f"SELECT {_ITEM_COLS}, dcp IS NOT NULL FROM items WHERE id > ? AND id <= ? ORDER BY id LIMIT ?"
#: A page of stored messages: one column, so SQLite only appends (no expression per row and no
#: subquery, which cost several times more per document), and a rowid range, so one walk of
#: adjacent table pages (a (vb, seqno) index would fetch each row apart). The rows come in seqno
#: order - which `stamp_mutations` checks rather than assumes.
_ENCODED_PAGE = ("SELECT CAST(group_concat(dcp, x'') AS BLOB), count(dcp), max(seqno) FROM items "
                 "WHERE id > ? AND id <= ?")
_INSERT_HISTORY = (f"INSERT OR REPLACE INTO history ({_COLS}, superseded_by) "
                   "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
#: The writer's upsert keeps the key's row and moves it to its new seqno's rowid; the history
#: trigger below sees the version it replaces.
#: Its columns are FlushRow's, in order; the rowid is made of the row's vb and seqno.
_UPSERT_PARAMS = len(FlushRow._fields)  # parameters of one row of _UPSERT_ITEM
_UPSERT_VB, _UPSERT_SEQNO = FlushRow._fields.index("vb") + 1, FLUSH_SEQNO + 1  # their parameter numbers
_UPSERT_ITEM = (f"INSERT INTO items (id, {', '.join(FlushRow._fields)}) "
                f"VALUES (?{_UPSERT_VB} << {SEQNO_BITS} | ?{_UPSERT_SEQNO}, "
                + ",".join(f"?{i}" for i in range(1, _UPSERT_PARAMS + 1)) + ") "
                "ON CONFLICT (vb, cid, key) DO UPDATE SET id = excluded.id, " +
                ", ".join(f"{c} = excluded.{c}" for c in FlushRow._fields if c not in ("vb", "key", "cid")))
#: Rows per multi-row upsert statement (a power of two; a shorter chunk is split into powers of two,
#: so a handful of statements serve every batch). One statement runs in one sqlite3_step, so the
#: flusher thread gives up and takes back the GIL once per chunk instead of once per row: beside a
#: busy event loop, every taking back waited for the loop's turn to end.
UPSERT_CHUNK = 256


@functools.cache
def _upsert_items_sql(n: int) -> str:
    """_UPSERT_ITEM for `n` rows in one statement (_UPSERT_PARAMS parameters a row, numbered on)."""
    one = f"VALUES (?{_UPSERT_VB} << {SEQNO_BITS} | ?{_UPSERT_SEQNO}, " \
        + ",".join(f"?{i}" for i in range(1, _UPSERT_PARAMS + 1)) + ")"
    assert one in _UPSERT_ITEM
    values = ", ".join(f"(?{b + _UPSERT_VB} << {SEQNO_BITS} | ?{b + _UPSERT_SEQNO}, "
                       + ", ".join(f"?{b + i}" for i in range(1, _UPSERT_PARAMS + 1)) + ")"
                       for b in range(0, _UPSERT_PARAMS * n, _UPSERT_PARAMS))
    return _UPSERT_ITEM.replace(one, f"VALUES {values}")


def _upsert_items(db: sqlite3.Connection, rows: list[tuple], *, whole: bool = True) -> None:
    """_UPSERT_ITEM for the rows, in multi-row statements (UPSERT_CHUNK), removing them from `rows`;
    `whole=False` writes only full chunks and leaves the rest for the next call."""
    i, n = 0, len(rows)
    while n - i >= UPSERT_CHUNK or (whole and i < n):
        size = UPSERT_CHUNK
        while size > n - i:
            size >>= 1
        db.execute(_upsert_items_sql(size), list(itertools.chain.from_iterable(rows[i:i + size])))
        i += size
    del rows[:i]
#: History kept by SQLite itself: each version the flusher overwrites moves to `history` inside
#: the upsert's step, with the GIL released and no statement of its own. TEMP: it lives on the
#: writer connection only, so a store opened with keep_history=False has none, and the schema on
#: disk is unchanged. A rollback deletes before it re-inserts, so it never fires there.
_HISTORY_TRIGGER = (
    "CREATE TEMP TRIGGER IF NOT EXISTS items_to_history AFTER UPDATE OF seqno ON main.items BEGIN "
    f"INSERT OR REPLACE INTO history ({_COLS}, superseded_by) VALUES "
    f"({', '.join('OLD.' + c for c in _BASE_COLS.split(', ')[:-1])}, "
    f"{_value_of('OLD.')}, OLD.cid, NEW.seqno); END")
#: A run of the rows in (?1, ?2] (rowids; ?3 = its hi seqno), only if every row there is encoded.
_BUILD_RUN = ("INSERT OR REPLACE INTO runs (id, hi, count, last, data) "
              "SELECT ?1, ?3, count(*), max(seqno), CAST(group_concat(dcp, x'') AS BLOB) FROM items "
              "WHERE id > ?1 AND id <= ?2 HAVING count(*) > 0 AND count(*) = count(dcp)")


def _drop_run_at(row: str) -> str:
    """The statement that drops the run whose range (lo, hi] holds `row`'s seqno ("OLD" or "NEW"):
    runs never overlap, so it is the vbucket's last one with lo < seqno, if its hi reaches it."""
    return (f"DELETE FROM runs WHERE id = (SELECT max(id) FROM runs WHERE id < {row}.id "
            f"AND id >= {row}.vb << {SEQNO_BITS}) AND hi >= {row}.seqno;")


#: Any change to a row takes the run around it with it: a version moved to a newer seqno (the
#: flusher's upsert), a row deleted (purge, rollback) or inserted inside a run's range (a version a
#: rollback restores). In the file, not TEMP: every writer keeps runs true, an older dcpflow or a
#: repair by hand included.
_RUN_TRIGGERS = (
    f"CREATE TRIGGER items_update_drops_run AFTER UPDATE ON items BEGIN "
    f"{_drop_run_at('OLD')} {_drop_run_at('NEW')} END",
    f"CREATE TRIGGER items_delete_drops_run AFTER DELETE ON items BEGIN {_drop_run_at('OLD')} END",
    f"CREATE TRIGGER items_insert_drops_run AFTER INSERT ON items BEGIN {_drop_run_at('NEW')} END",
)

#: The version of the file's layout, in SQLite's `user_version` (module docstring, "Schema
#: version"), and what a store of that version holds.
SCHEMA_VERSION = 3
_SCHEMA_V1 = (*_TABLES, *_ITEM_INDEXES, *_RUN_TRIGGERS)
#: Version 1 -> 2: collections. Every row of version 1 is the default collection's (cid 0).
_MIGRATE_1_TO_2 = (
    "ALTER TABLE items ADD COLUMN cid INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE history ADD COLUMN cid INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE vbucket_state ADD COLUMN history_start INTEGER NOT NULL DEFAULT 0",
    "DROP INDEX items_by_key",
    "CREATE UNIQUE INDEX items_by_key ON items (vb, cid, key)",
    "DROP INDEX history_by_key",
    "CREATE UNIQUE INDEX history_by_key ON history (vb, cid, key, seqno)",
    "CREATE INDEX history_by_seqno ON history (vb, seqno)",
)
#: Version 2 -> 3: sync writes. The prepares of each vbucket (`completed`: the seqno of the commit or
#: abort that completed it, 0 while in flight; completed ones are kept for rollback until compaction
#: passes the rollback floor), and the vbucket's persisted high prepared / high completed seqnos.
_MIGRATE_2_TO_3 = (
    """CREATE TABLE prepares (
    vb INTEGER NOT NULL, seqno INTEGER NOT NULL, cid INTEGER NOT NULL, key BLOB NOT NULL, level INTEGER NOT NULL,
    rev_seqno INTEGER NOT NULL, cas INTEGER NOT NULL, flags INTEGER NOT NULL, expiry INTEGER NOT NULL,
    datatype INTEGER NOT NULL, deleted INTEGER NOT NULL, delete_time INTEGER NOT NULL, value BLOB NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (vb, seqno))""",
    "ALTER TABLE vbucket_state ADD COLUMN hps INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE vbucket_state ADD COLUMN hcs INTEGER NOT NULL DEFAULT 0",
)
#: The steps from version N to N + 1, by N.
_MIGRATIONS = {1: _MIGRATE_1_TO_2, 2: _MIGRATE_2_TO_3}


class StoreVersionError(ValueError):
    """The file is not a store of the schema version this dcpflow reads; it was left unchanged."""


def _layout(db: sqlite3.Connection) -> frozenset:
    """What a store's file holds, to compare with version 1's: each table's columns (name, type,
    NOT NULL, default, primary key), each index's columns and each trigger, by name."""
    out: set[tuple] = set()
    for kind, name, table in db.execute("SELECT type, name, tbl_name FROM main.sqlite_master "
                                        "WHERE name NOT LIKE 'sqlite%'"):
        out.add((kind, name, table))
        if kind == "table":
            out.update(("column", name, *c[1:]) for c in db.execute("SELECT * FROM pragma_table_info(?)", (name,)))
        elif kind == "index":
            out.add(("index columns", name, tuple(c[2] for c in db.execute(
                "SELECT * FROM pragma_index_info(?) ORDER BY seqno", (name,)))))
    return frozenset(out)


@functools.cache
def _layout_v1() -> frozenset:
    db = sqlite3.connect(":memory:")
    try:
        for sql in _SCHEMA_V1:
            db.execute(sql)
        return _layout(db)
    finally:
        db.close()


#: The run at a scan's position (?1, a rowid) and the next one before ?2 (the scan's last rowid): one
#: query, whose blob is read only when the run starts exactly there (the scan cuts a run that goes
#: past ?2 with `mutations_upto`).
_RUN_FROM = ("SELECT id, hi, count, last, CASE WHEN id = ?1 THEN data END "
             "FROM runs WHERE id >= ?1 AND id < ?2 ORDER BY id LIMIT 1")
_STATE_COLS = ("vb, state, failover_log, high_seqno, snap_start, snap_end, purge_seqno, max_cas, "
               "max_visible_seqno, max_deleted_rev_seqno, hps, hcs")
_UPSERT_STATE = (
    f"INSERT INTO vbucket_state ({_STATE_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (vb) DO UPDATE SET hps = excluded.hps, hcs = excluded.hcs, state = excluded.state, "
    "failover_log = excluded.failover_log, "
    "high_seqno = excluded.high_seqno, snap_start = excluded.snap_start, snap_end = excluded.snap_end, "
    "purge_seqno = MAX(purge_seqno, excluded.purge_seqno), max_cas = excluded.max_cas, "
    "max_visible_seqno = excluded.max_visible_seqno, max_deleted_rev_seqno = excluded.max_deleted_rev_seqno")

#: Values at least this big are queued by a stream as a separate `memoryview` entry after their
#: header (a *continuation*: the owner writes it with the entry before it, never splitting a
#: message), so they reach the socket without being copied into a message first.
LARGE_VALUE = 2048
#: Plain mutations with values below this are stored as their whole message (`dcp`) and backfill
#: as pages SQLite concatenates; bigger ones are read as rows and their values sent uncopied.
#: Below this size a row's Python work per document outweighs copying its value into a page; the
#: limit also keeps a page small whatever the sizes: a first page (ENCODED_PAGE_ITEMS messages,
#: before pages are sized by bytes) stays far below SQLite's 1 GB string limit.
ENCODED_VALUE_LIMIT = 8192

#: A run ends when it holds this many bytes of messages (`_cut_runs`); a piece before a row that is
#: not a plain mutation, or at the end of a vbucket when sealed, becomes a run from RUN_MIN_BYTES.
#: Each run read is a query, a stamp, a page queued and written and, with a worker thread reading
#: beside the loop, GIL hand-offs, so bigger runs cost less per document; but they cost where keys
#: are rewritten at random: a rewrite drops the run around the old version, and more rows with it
#: (a scattered 1% of rewritten keys already drops most small runs). 256 KiB sits between the two.
RUN_BYTES = 256 * 1024
RUN_MIN_BYTES = 8 * 1024
#: Opening a store cuts the runs an earlier process left unbuilt, unless a vbucket has more than
#: this after its last run (a backlog's deferred runs): those wait for the idle flusher.
DEFER_AT_OPEN_BYTES = 4 * RUN_BYTES

#: The writer connection's page cache. SQLite's default (2 MiB) holds little of the by-key and
#: history indexes a flush updates at random places, so a flush of rewrites would re-read the
#: same index pages from the file.
WRITER_CACHE_KIB = 64 * 1024
#: Backfill scans read the file through a memory map of up to this size (SQLite caps it at its
#: SQLITE_MAX_MMAP_SIZE, 2 GB in common builds): a page is then a pointer into the OS page cache,
#: not a pread() into the connection's own cache, which saves a copy of every page a scan reads.
#: The writer keeps pread, and so do point reads (`read`, full eviction's key walks: the `_point`
#: pool): the pages a map has touched count in the process's resident memory for as long as it is
#: open, so background fetches scattered over a file larger than the bucket's quota would have
#: grown the server's RSS with the file (1M documents: 518 MB of RssFile).
READER_MMAP_BYTES = 1 << 31


def _row(vb: int, it: Item) -> tuple:
    """The item's columns in `_BASE_COLS` order, as bound for the items and history tables (which
    add its `cid`).

    Blobs go to SQLite as bytearrays: Python 3.11's sqlite3 binds bytes only after a failed
    adapter lookup that raises and clears an AttributeError (with the GIL held, per blob); a
    bytearray is bound directly. Large values skip the copy - next to
    their size the lookup does not matter."""
    value = it.value
    return (vb, bytearray(it.key), it.by_seqno, _s64(it.rev_seqno), _s64(it.cas), it.flags, it.expiry, it.datatype,
            int(it.deleted), it.delete_time, int(it.delete_source),
            bytearray(value) if len(value) < LARGE_VALUE else value)


def _encoded_row(vb: int, it: Item) -> tuple:
    """The items table's row (`_UPSERT_ITEM`; a store_rows.FlushRow, as a plain tuple): `_row`, the
    `dcp` column and the collection id. A
    plain mutation of the default collection with a value below ENCODED_VALUE_LIMIT keeps its whole
    DCP_MUTATION there (opaque 0, no collection prefix) and an empty `value`; anything a backfill
    must shape, filter by collection or send without a copy has `dcp` NULL."""
    row = _row(vb, it)
    if len(it.key) + 1 > 0xFFFF:  # a collection-aware stream's key has a prefix byte
        return row + (None, it.cid)
    msg, encoded = encode_mutations_py((it,), 0, vb, 0, False, ENCODED_VALUE_LIMIT)  # 0: not a plain mutation
    return row[:11] + (bytearray(), bytearray(msg), it.cid) if encoded else row + (None, it.cid)


def _encoded_rows_py(vb: int, items: Iterable[Item]) -> list[tuple]:
    return [_encoded_row(vb, it) for it in items]


#: The flusher's rows, compiled (engine/_speedups.c; its twin is _encoded_rows_py): building them
#: holds the GIL, so their time per row is taken from the thread that serves requests.
_encoded_rows_c = compiled("encoded_rows", "dcpflow.engine._speedups")


def _encoded_rows(vb: int, items: Iterable[Item]) -> list[tuple]:
    if _encoded_rows_c is None:
        return _encoded_rows_py(vb, items)
    return _encoded_rows_c(vb, items, _encoded_row)


def _run_sizes(rows: list[tuple]) -> list[tuple[int, int | None]]:
    """(seqno, DCP message bytes or None) of encoded rows, in seqno order: what `_cut_runs` reads."""
    return sorted((r[FLUSH_SEQNO], None if r[FLUSH_DCP] is None else len(r[FLUSH_DCP])) for r in rows)


def _cut_runs(tail: "_Tail", rows: Iterable[tuple[int, int | None]], run_bytes: int,
              run_min: int) -> list[tuple[int, int]]:
    """Where runs end, for rows (seqno, message bytes, or None for a row that must be read as a
    row) that follow the vbucket's unfinished run `tail` in seqno order: the (lo, hi] ranges to
    build. `tail` moves on past them."""
    cuts = []
    lo, pending = tail.lo, tail.pending
    for seqno, size in rows:
        if size is None:  # a run ends before it (and is kept only if it is worth a query)
            if pending >= run_min:
                cuts.append((lo, seqno - 1))
            lo, pending = seqno, 0
        else:
            pending += size
            if pending >= run_bytes:
                cuts.append((lo, seqno))
                lo, pending = seqno, 0
        tail.top = seqno
    tail.lo, tail.pending = lo, pending
    return cuts


@dataclass(slots=True)
class _Tail:
    """A vbucket's rows after its last run: (lo, top], about `pending` bytes of stored messages
    since the last row that must be read as a row (an estimate: a newer version moves a row, and a
    purge removes one; the statement that builds a run counts for itself)."""

    lo: int = 0
    pending: int = 0
    top: int = 0

    def sealable(self, least: int) -> bool:
        """Are there rows after the last run, with at least `least` bytes of messages?"""
        return self.pending >= least and self.top > self.lo


@dataclass(slots=True)
class VBucketStateRecord:
    """The persisted state of one vbucket.

    `history_floor` and `history_start` (from which seqno on compaction kept every version of
    the collections with history) are managed by the store alone, and a write never lowers
    `purge_seqno` (only a rollback to 0 resets it).
    """

    vb: int
    state: int
    failover_log: str  # FailoverTable.to_json()
    high_seqno: int = 0  # the persisted seqno
    snap_start: int = 0
    snap_end: int = 0
    purge_seqno: int = 0
    max_cas: int = 0
    max_visible_seqno: int = 0
    max_deleted_rev_seqno: int = 0
    history_floor: int = 0
    history_start: int = 0
    hps: int = 0  # high prepared seqno (sync writes) as flushed
    hcs: int = 0  # high completed seqno

    def _params(self) -> tuple:
        return (self.vb, self.state, self.failover_log, self.high_seqno, self.snap_start, self.snap_end,
                self.purge_seqno, _s64(self.max_cas), self.max_visible_seqno,
                _s64(self.max_deleted_rev_seqno), self.hps, self.hcs)


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    return db


class Store(Compaction, ScanReads):
    """The bucket's database; see the module docstring."""

    def __init__(self, path: str | Path, *, synchronous: str = "FULL", keep_history: bool = True,
                 run_bytes: int = RUN_BYTES, run_min_bytes: int = RUN_MIN_BYTES):
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise ValueError(f"unknown synchronous mode {synchronous!r}")
        if not 0 < run_min_bytes <= run_bytes:
            raise ValueError(f"need 0 < run_min_bytes ({run_min_bytes}) <= run_bytes ({run_bytes})")
        self.run_bytes, self.run_min_bytes = run_bytes, run_min_bytes
        self._tails: dict[int, _Tail] = {}  # per vbucket, once known (`_tail`)
        self._deferred: set[int] = set()  # vbuckets written with cut_runs=False: no tail until sealed
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.synchronous = synchronous.upper()
        self._keep_history = keep_history
        self._lock = threading.RLock()
        self._db = _connect(self.path, self.synchronous)
        try:
            self._open_schema()
        except BaseException:
            self._db.close()
            raise
        self._db.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
        if keep_history:
            self._db.execute(_HISTORY_TRIGGER)
        self.seal_runs(every=True)  # what an earlier process left unsealed
        self._readers = _ReaderPool(self.path)
        self._point = _ReaderPool(self.path, mmap_bytes=0)

    @property
    def keep_history(self) -> bool:
        """Fixed when the store is opened: the history trigger exists on the writer connection or not."""
        return self._keep_history

    def _open_schema(self) -> None:
        """Create the schema in an empty file, or check the file's version and migrate an older
        one (module docstring, "Schema version"), in one transaction: a refused file is left as it
        was, and a crash while creating or migrating leaves the file as it was, not half a schema."""
        with self._txn() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == SCHEMA_VERSION:
                return
            if version not in _MIGRATIONS and version != 0:
                newer = " (a newer dcpflow wrote it: open it with that one)" if version > SCHEMA_VERSION else ""
                raise StoreVersionError(f"store {self.path} has schema version {version}; this dcpflow reads "
                                        f"schema versions 1 to {SCHEMA_VERSION}{newer}")
            if version == 0:
                layout = _layout(db)
                if not layout:
                    for sql in _SCHEMA_V1:
                        db.execute(sql)
                elif layout != _layout_v1():
                    raise StoreVersionError(
                        f"store {self.path} has no schema version and is not laid out as schema version 1, "
                        "the only one this dcpflow reads without a version: it was written by an unreleased "
                        "development build (or is not a dcpflow store); move it aside to start the bucket empty")
                version = 1
            while version < SCHEMA_VERSION:
                for sql in _MIGRATIONS[version]:
                    db.execute(sql)
                version += 1
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._readers.close()
        self._point.close()
        with self._lock:
            self._db.close()

    def _txn(self):
        # A transaction that fails leaves the tails ahead of the file: they are found again.
        return _Transaction(self._db, self._lock, self._tails.clear)

    # -- bucket meta ------------------------------------------------------------------------
    def get_meta(self, name: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def set_meta(self, name: str, value: str) -> None:
        with self._txn() as db:
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    # -- vbucket state ----------------------------------------------------------------------
    def load_vbucket_states(self) -> dict[int, VBucketStateRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_STATE_COLS}, history_floor, history_start FROM vbucket_state").fetchall()
        out = {}
        for r in rows:
            out[r[0]] = VBucketStateRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6], _u64(r[7]), r[8],
                                           _u64(r[9]), r[12], r[13], r[10], r[11])
        return out

    def save_vbucket_states(self, records: Iterable[VBucketStateRecord]) -> None:
        with self._txn() as db:
            db.executemany(_UPSERT_STATE, [r._params() for r in records])

    def clear(self) -> None:
        """Every vbucket's rows, states and runs, in one transaction (a bucket flush); meta stays."""
        with self._txn() as db:
            for table in ("runs", "items", "history", "snapshots", "vbucket_state", "prepares"):
                db.execute(f"DELETE FROM {table}")  # no WHERE: SQLite truncates the table
            self._tails.clear()
            self._deferred.clear()

    def delete_vbucket(self, vb: int) -> None:
        with self._txn() as db:
            self._forget_runs(db, vb)
            for table in ("items", "history", "snapshots", "vbucket_state", "prepares"):
                db.execute(f"DELETE FROM {table} WHERE vb = ?", (vb,))

    def purge_collections(self, pairs: Iterable[tuple[int, int]]) -> int:
        """Delete the rows of dropped collections, (vbucket, collection id) pairs - their items and
        older versions - in one transaction (the indexes by (vb, cid, key) hold a collection's
        rows together); returns how many items. The caller purges a vbucket's collection only once
        its drop event is persisted: nothing of the collection can be written after that."""
        n = 0
        with self._txn() as db:
            for vb, cid in pairs:
                n += db.execute("DELETE FROM items WHERE vb = ? AND cid = ?", (vb, cid)).rowcount
                db.execute("DELETE FROM history WHERE vb = ? AND cid = ?", (vb, cid))
        return n

    # -- runs (module docstring) --------------------------------------------------------------
    def _tail(self, db: sqlite3.Connection, vb: int) -> _Tail:
        """The vbucket's unfinished run; found the first time by reading the rows after its last
        run (a store opened again, a vbucket after a rollback), and runs cut where they end."""
        tail = self._tails.get(vb)
        if tail is None:
            row = db.execute("SELECT max(hi) FROM runs WHERE id >= ? AND id <= ?",
                             _vb_rowids(vb)).fetchone()
            tail = self._tails[vb] = _Tail(row[0] or 0)
            tail.top = tail.lo
            self._deferred.discard(vb)
            rows = db.execute("SELECT seqno, length(dcp) FROM items WHERE id > ? AND id <= ? ORDER BY id",
                              (_rowid(vb, tail.lo), _rowid(vb, MAX_STORED_SEQNO)))
            self._build_runs(db, vb, _cut_runs(tail, rows, self.run_bytes, self.run_min_bytes))
        return tail

    @staticmethod
    def _build_runs(db: sqlite3.Connection, vb: int, cuts: list[tuple[int, int]]) -> None:
        if cuts:
            db.executemany(_BUILD_RUN, [(_rowid(vb, lo), _rowid(vb, hi), hi) for lo, hi in cuts])

    def _extend_runs(self, db: sqlite3.Connection, vb: int, sizes: list[tuple[int, int | None]]) -> None:
        """After a batch's rows are written: cut the runs they complete (`sizes`: `_run_sizes`)."""
        known = vb in self._tails
        tail = self._tail(db, vb)  # a first look reads the rows just written too
        if known:
            self._build_runs(db, vb, _cut_runs(tail, sizes, self.run_bytes, self.run_min_bytes))

    def _forget_runs(self, db: sqlite3.Connection, vb: int) -> None:
        """All of a vbucket's runs and its tail, before all its rows go (in one statement, not a
        trigger's look-up per row)."""
        db.execute("DELETE FROM runs WHERE id >= ? AND id <= ?", _vb_rowids(vb))
        self._tails.pop(vb, None)
        self._deferred.discard(vb)

    def unsealed(self) -> bool:
        """Are there leftover rows `seal_runs` would make a run of, or vbuckets whose runs were
        deferred? (Cheap, from any thread.)"""
        least = self.run_min_bytes
        return bool(self._deferred) or any(t.sealable(least) for t in list(self._tails.values()))

    def deferred_runs(self) -> int:
        """Vbuckets whose runs wait for `seal_runs` (written with `cut_runs=False`)."""
        return len(self._deferred)

    def seal_runs(self, *, every: bool = False, max_vbuckets: int | None = None, deferred: bool = True) -> int:
        """Make a run of each vbucket's leftover rows of at least run_min_bytes, and cut the runs of
        the vbuckets whose runs were deferred (the flusher is idle); `every`: of every vbucket
        with persisted state, looking at its rows first if this store has not yet (at open: what
        an earlier process left - a vbucket with more than DEFER_AT_OPEN_BYTES of messages
        after its last run is marked deferred instead, so opening a store after a big load does
        not write them all). `max_vbuckets` bounds one call's transaction (the server's idle
        flusher calls again until nothing is left); `deferred=False` leaves the deferred
        vbuckets as they are (a clean close: runs are a cache, and a shutdown should not wait
        for a backlog's worth of them). Returns how many runs were built besides the deferred ones."""
        with self._lock:
            if every:
                vbs = [r[0] for r in self._db.execute("SELECT vb FROM vbucket_state")]
            else:
                vbs = [*(self._deferred if deferred else ()),
                       *(vb for vb, t in self._tails.items() if t.sealable(self.run_min_bytes))]
            vbs = vbs[:max_vbuckets]
            if not vbs:
                return 0
            built = 0
            with self._txn() as db:
                for vb in vbs:
                    if every and vb not in self._tails and self._defer_at_open(db, vb):
                        continue
                    tail = self._tail(db, vb)
                    if tail.sealable(self.run_min_bytes):
                        self._build_runs(db, vb, [(tail.lo, tail.top)])
                        tail.lo, tail.pending = tail.top, 0
                        built += 1
            return built

    def _defer_at_open(self, db: sqlite3.Connection, vb: int) -> bool:
        """Mark the vbucket deferred if its rows after its last run hold more than
        DEFER_AT_OPEN_BYTES of messages (length() reads a blob's size, not its pages)."""
        lo = db.execute("SELECT max(hi) FROM runs WHERE id >= ? AND id <= ?", _vb_rowids(vb)).fetchone()[0] or 0
        size = db.execute("SELECT total(length(dcp)) FROM items WHERE id > ? AND id <= ?",
                          (_rowid(vb, lo), _rowid(vb, MAX_STORED_SEQNO))).fetchone()[0]
        if size <= DEFER_AT_OPEN_BYTES:
            return False
        self._deferred.add(vb)
        return True

    def run_count(self, vb: int) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM runs WHERE id >= ? AND id <= ?",
                                    _vb_rowids(vb)).fetchone()[0]

    # -- the flusher's write ----------------------------------------------------------------
    def write(self, batches: Iterable[tuple[int, Sequence[Item]]],
              states: Iterable[VBucketStateRecord] = (),
              snapshot_ranges: Iterable[tuple[int, int, int]] = (),
              sync_batches: Iterable[tuple[int, Sequence[Item]]] = (), *, cut_runs: bool = True) -> None:
        """Persist items (seqno order per vbucket), state rows and the (vb, snap_start, snap_end)
        ranges the items belong to, in one transaction. `sync_batches` are the prepares, commits
        and aborts (durability/items.py) of the same batch, in seqno order: a prepare is stored in
        `prepares`, and marked completed by its commit or abort (a commit's version is among the
        items).

        `cut_runs=False` (the flusher has a backlog) leaves the batch's vbuckets without runs
        until `seal_runs`: a run copies its rows' messages, so cutting them as the rows are
        written doubles the bytes a flush writes, when the disk is what writes wait for. A
        vbucket stays deferred until sealed, whatever later batches say, so that no flush
        inherits the runs of a whole backlog."""
        with self._txn() as db:
            pending: list[tuple] = []  # rows not yet written: every vbucket's go into the same statements
            written = []
            for vb, items in batches:
                latest: dict = {}  # by doc_key
                older: list[Item] = []  # versions of this batch that a later one replaces
                for it in items:
                    key = it.key if not it.cid else (it.cid, it.key)
                    prev = latest.get(key)
                    if prev is not None:
                        older.append(prev)
                    latest[key] = it
                # Only the latest version of each key is upserted; the trigger files the version it
                # replaces on disk, superseded by the latest one's seqno. The rows (a copy of each
                # value, as a DCP message) are written a chunk at a time, not held for the whole batch.
                rows = _encoded_rows(vb, latest.values())
                written.append((vb, latest, older, _run_sizes(rows)))
                pending += rows
                _upsert_items(db, pending, whole=False)
            _upsert_items(db, pending)
            for vb, latest, older, sizes in written:
                if older and self._keep_history:
                    self._file_older_versions(db, vb, older, latest)
                if cut_runs and vb not in self._deferred:
                    self._extend_runs(db, vb, sizes)
                else:  # `_tail` finds the rows again when the vbucket is sealed
                    self._tails.pop(vb, None)
                    self._deferred.add(vb)
            for vb, items in sync_batches:
                self._write_sync(db, vb, items)
            db.executemany(_UPSERT_STATE, [r._params() for r in states])
            db.executemany("INSERT OR IGNORE INTO snapshots (vb, snap_start, snap_end) VALUES (?, ?, ?)",
                           list(snapshot_ranges))

    @staticmethod
    def _write_sync(db: sqlite3.Connection, vb: int, items: Sequence[Item]) -> None:
        for it in items:
            prepared = getattr(it, "prepared_seqno", None)
            if prepared is None:
                db.execute("INSERT OR REPLACE INTO prepares (vb, cid, key, seqno, level, rev_seqno, cas, flags, "
                           "expiry, datatype, deleted, delete_time, value) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           (vb, it.cid, it.key, it.by_seqno, it.level, _s64(it.rev_seqno), _s64(it.cas), it.flags,
                            it.expiry, it.datatype, int(it.deleted), it.delete_time, it.value))
            else:
                db.execute("UPDATE prepares SET completed = ? WHERE vb = ? AND seqno = ?", (it.by_seqno, vb, prepared))

    def load_prepares(self, vb: int) -> list[tuple]:
        """The vbucket's in-flight prepares as rows (cid, key, seqno, level, rev_seqno, cas, flags,
        expiry, datatype, deleted, delete_time, value), in seqno order; CAS and rev seqno unsigned."""
        with self._lock:
            rows = self._db.execute("SELECT cid, key, seqno, level, rev_seqno, cas, flags, expiry, datatype, deleted, "
                                    "delete_time, value FROM prepares WHERE vb = ? AND completed = 0 ORDER BY seqno",
                                    (vb,)).fetchall()
        return [(r[0], r[1], r[2], r[3], _u64(r[4]), _u64(r[5]), *r[6:]) for r in rows]

    @staticmethod
    def _file_older_versions(db: sqlite3.Connection, vb: int, older: list[Item], latest: dict) -> None:
        """A key with several versions in one batch: each version but the latest goes to history,
        superseded by the next; and the version on disk before the batch was superseded by the
        batch's first one, not by the latest one the trigger saw (a later rollback between the two
        must keep it)."""
        following: dict = {}  # doc_key -> seqno of the version after the one being filed
        first: dict = {}
        rows = []
        for it in reversed(older):
            key = doc_key(it.cid, it.key)
            nxt = following.get(key, latest[key].by_seqno)
            rows.append((*_row(vb, it), it.cid, nxt))
            following[key] = first[key] = it.by_seqno
        db.executemany(_INSERT_HISTORY, rows)
        db.executemany("UPDATE history SET superseded_by = ? WHERE vb = ? AND cid = ? AND key = ? "
                       "AND superseded_by = ? AND seqno < ?",
                       [(s, vb, latest[key].cid, latest[key].key, latest[key].by_seqno, s)
                        for key, s in first.items()])

    # -- reads ------------------------------------------------------------------------------
    def get(self, vb: int, key: bytes, cid: int = 0) -> Item | None:
        with self._lock:
            row = self._db.execute(ITEM_BY_KEY, (vb, cid, key)).fetchone()
        return _item(row) if row else None

    def read(self, vb: int, key) -> Item | None:
        """`get` on a pooled read connection, by the engine's key (bytes in the default collection,
        (cid, bytes) in another): for any thread, never waiting for a flush batch's transaction
        (WAL readers see the last commit). What a bg fetch of an evicted value uses."""
        cid, key = key if key.__class__ is tuple else (0, key)
        db = self._point.get()
        try:
            row = db.execute(ITEM_BY_KEY, (vb, cid, key)).fetchone()
        finally:
            self._point.put(db)
        return _item(row) if row else None

    def read_many(self, keys: Sequence[tuple]) -> list[Item | None]:
        """`read` of each (vb, key), on one pooled read connection: a batch of background fetches
        (server/bg_fetch.py). In the order given, None for a key the store does not have."""
        out: list[Item | None] = []
        db = self._point.get()
        try:
            for vb, key in keys:
                cid, key = key if key.__class__ is tuple else (0, key)
                row = db.execute(ITEM_BY_KEY, (vb, cid, key)).fetchone()
                out.append(_item(row) if row else None)
        finally:
            self._point.put(db)
        return out

    def load_key_rows(self, vb: int, page_size: int = 50_000) -> Iterator[list[tuple]]:
        """Full eviction's warm-up (engine/eviction.py): pages of (cid, key, seqno, deleted, expiry)
        of the vbucket's latest versions in seqno order, read by rowid range (a sequential walk of
        the table that decodes no value), on a pooled read connection."""
        lo, hi = _vb_rowids(vb)
        db = self._point.get()
        try:
            cur = db.execute("SELECT cid, key, seqno, deleted, expiry FROM items WHERE id >= ? AND id <= ?", (lo, hi))
            while page := cur.fetchmany(page_size):
                yield page
        finally:
            self._point.put(db)

    def keys(self, vb: int) -> list:
        """The engine's keys (doc_key) of every version the vbucket has on disk, tombstones
        included, read from the key index on a pooled read connection: what full eviction rebuilds
        a vbucket's key filter from."""
        db = self._point.get()
        try:
            rows = db.execute("SELECT cid, key FROM items WHERE vb = ?", (vb,)).fetchall()
        finally:
            self._point.put(db)
        return [(cid, key) if cid else key for cid, key in rows]

    def load_events(self, vb: int) -> list[Item]:
        """The vbucket's collection system events (cid 1), in seqno order: what full eviction's
        warm-up loads as items (the collections a vbucket has)."""
        db = self._point.get()
        try:
            rows = db.execute(f"SELECT {_ITEM_COLS} FROM items WHERE vb = ? AND cid = 1", (vb,)).fetchall()
        finally:
            self._point.put(db)
        return sorted((_item(r) for r in rows), key=lambda it: it.by_seqno)

    def load_items(self, vb: int, page_size: int = 10_000) -> Iterator[Item]:
        """Every stored version of a vbucket (warm-up), streamed in seqno order."""
        with self.scan(vb, 0, (1 << 63) - 1, page_size=page_size) as scan:
            yield from scan

    def scan(self, vb: int, start: int, end: int, *, page_size: int = 1000,
             history: frozenset[int] = frozenset()) -> "BackfillScan":
        """Items with start < seqno <= end, latest version per key, tombstones included; with
        `history` (collection ids), also every older version of those collections the store still
        has in that range (a change stream's backfill)."""
        return BackfillScan(self.path, vb, start, end, page_size, pool=self._readers, history=history)

    def count(self, vb: int) -> tuple[int, int]:
        """(live documents, tombstones) on disk for a vbucket, in every collection (system events,
        cid 1, are not documents)."""
        with self._lock:
            rows = self._db.execute("SELECT deleted, COUNT(*) FROM items WHERE vb = ? AND cid != 1 GROUP BY deleted",
                                    (vb,)).fetchall()
        counts = dict(rows)
        return counts.get(0, 0), counts.get(1, 0)

    def history_count(self, vb: int) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM history WHERE vb = ?", (vb,)).fetchone()[0]


    def rollback(self, vb: int, seqno: int) -> "RollbackResult":
        """Discard everything after `seqno`; returns the seqno actually reached and its snapshot.

        Reaches `seqno` exactly when it is at or above the rollback floor (history holds every
        version needed). Below the floor the disk cannot reconstruct that point, so the vbucket
        is reset to 0 (all items, history and purge seqno gone), like Couchbase when no older
        disk snapshot exists. Rolling back to or above the persisted high seqno changes nothing.

        The snapshot reported is (seqno, seqno) when `seqno` ends a persisted snapshot, else the
        persisted snapshot containing it: inside a snapshot, versions de-duplicated in memory
        were never persisted, so the state is only consistent at the snapshot's end and the
        consumer must say so in its next stream request. The caller must have flushed first.
        """
        with self._txn() as db:
            state = db.execute("SELECT high_seqno, history_floor, snap_start, snap_end FROM vbucket_state "
                               "WHERE vb = ?", (vb,)).fetchone()
            if state is None:
                return RollbackResult(0, 0, 0)
            high, floor, snap_start, snap_end = state
            if seqno >= high:
                return RollbackResult(high, snap_start, snap_end)
            if seqno < floor or seqno <= 0:
                self._forget_runs(db, vb)
                for table in ("items", "history", "snapshots", "prepares"):
                    db.execute(f"DELETE FROM {table} WHERE vb = ?", (vb,))
                db.execute("UPDATE vbucket_state SET high_seqno = 0, snap_start = 0, snap_end = 0, "
                           "purge_seqno = 0, max_visible_seqno = 0, history_floor = 0, hps = 0, hcs = 0 "
                           "WHERE vb = ?", (vb,))
                return RollbackResult(0, 0, 0)
            keys = db.execute("SELECT cid, key FROM items WHERE id > ? AND id <= ?",
                              (_rowid(vb, seqno), _rowid(vb, MAX_STORED_SEQNO))).fetchall()
            self._tails.pop(vb, None)  # the triggers drop the runs around what changes here
            for cid, key in keys:
                prev = db.execute(f"SELECT {', '.join(ITEM_COLUMNS)} FROM history WHERE vb = ? AND cid = ? "
                                  "AND key = ? AND seqno <= ? "
                                  "ORDER BY seqno DESC LIMIT 1", (vb, cid, key, seqno)).fetchone()
                db.execute("DELETE FROM items WHERE vb = ? AND cid = ? AND key = ?", (vb, cid, key))
                if prev is not None:  # with its encoded head, so backfills keep the fast path
                    db.execute(_UPSERT_ITEM, _encoded_row(vb, _item(prev)))
            db.execute("DELETE FROM history WHERE vb = ? AND superseded_by > ?", (vb, seqno))
            row = db.execute("SELECT snap_start, snap_end FROM snapshots WHERE vb = ? AND snap_start <= ? "
                             "ORDER BY snap_start DESC, snap_end DESC LIMIT 1", (vb, seqno)).fetchone()
            snap = row if row is not None and row[1] > seqno else (seqno, seqno)
            db.execute("DELETE FROM snapshots WHERE vb = ? AND snap_start > ?", (vb, seqno))
            # Prepares made after the seqno go; those completed after it are in flight again (the
            # stream that follows sends their commit or abort again). The high completed seqno is
            # that of the completed prepares left (compaction dropped only those completed below
            # the floor, whose seqnos the old value bounds there).
            db.execute("DELETE FROM prepares WHERE vb = ? AND seqno > ?", (vb, seqno))
            db.execute("UPDATE prepares SET completed = 0 WHERE vb = ? AND completed > ?", (vb, seqno))
            db.execute("UPDATE vbucket_state SET high_seqno = ?, snap_start = ?, snap_end = ?, max_visible_seqno = ?, "
                       "hps = MIN(hps, ?), hcs = MAX(COALESCE((SELECT MAX(seqno) FROM prepares WHERE vb = ? AND "
                       "completed > 0), 0), MIN(hcs, history_floor)) WHERE vb = ?",
                       (seqno, snap[0], snap[1], seqno, seqno, vb, vb))
            return RollbackResult(seqno, snap[0], snap[1])


@dataclass(frozen=True, slots=True)
class RollbackResult:
    seqno: int  # the seqno reached (0 = the vbucket was reset)
    snap_start: int
    snap_end: int


class _Transaction:
    """`with store._txn() as db:` - BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error), under the lock."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock, on_rollback=None):
        self._db, self._lock, self._on_rollback = db, lock, on_rollback

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        return self._db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type:
                self._rolled_back()
                self._db.execute("ROLLBACK")
            else:
                try:
                    self._db.execute("COMMIT")
                except BaseException:
                    self._rolled_back()
                    raise
        finally:
            self._lock.release()

    def _rolled_back(self) -> None:
        if self._on_rollback is not None:
            self._on_rollback()


def _reader(path: Path, mmap_bytes: int = READER_MMAP_BYTES) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    if mmap_bytes:
        db.execute(f"PRAGMA mmap_size={mmap_bytes}")
    return db


class _ReaderPool:
    """Idle read connections for BackfillScans. Opening a SQLite connection and parsing the schema
    costs about as much as reading a few hundred items: a DCP client streaming 1024 vbuckets opens
    1024 scans, so they reuse connections (each scan still has its own read transaction)."""

    MAX_IDLE = 16

    def __init__(self, path: Path, mmap_bytes: int = READER_MMAP_BYTES):
        self.path = path
        self.mmap_bytes = mmap_bytes
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.closed = False

    def get(self) -> sqlite3.Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _reader(self.path, self.mmap_bytes)

    def put(self, db: sqlite3.Connection) -> None:
        with self._lock:
            if not self.closed and len(self._idle) < self.MAX_IDLE:
                self._idle.append(db)
                return
        db.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()


@dataclass(frozen=True, slots=True)
class EncodedPage:
    """`count` whole DCP_MUTATION messages in seqno order, the last one `last_seqno`."""

    data: bytes
    count: int
    last_seqno: int


class BackfillScan:
    """A paged, point-in-time read of one vbucket's items with start < seqno <= end.

    Opens its own connection and read transaction, so every page comes from the same disk
    snapshot even while the flusher commits, and memory stays at one page (keyset pagination on
    the by-seqno index), however many items the range holds. `disk_high_seqno`,
    `purge_seqno` and `max_visible_seqno` describe that snapshot (for the Disk snapshot marker).
    Close it (or use `with`) promptly: an open read transaction holds back WAL checkpointing.
    """

    def __init__(self, path: Path, vb: int, start: int, end: int, page_size: int, *,
                 pool: _ReaderPool | None = None, history: frozenset[int] = frozenset()):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.vb, self.start, self.end, self.page_size = vb, start, end, page_size
        self.page_bytes = 1 << 20  # values per page of rows, about (at least one row)
        self.min_run = 32  # seqnos of plain rows worth an encoded page of their own (next_chunk)
        # how many times page_size the next encoded page covers (next_chunk): a factor, not seqnos,
        # so a page size the backfill sets between pages takes effect on the next one
        self._widen = 1
        self._pool = pool
        self._db = pool.get() if pool is not None else _reader(path)
        self.closed = False
        try:
            self._db.execute("BEGIN")
            row = self._db.execute("SELECT high_seqno, purge_seqno, max_visible_seqno FROM vbucket_state "
                                   "WHERE vb = ?", (vb,)).fetchone()
        except BaseException:
            self._pool = None  # a connection in an unknown state is not reused
            self.close()
            raise
        self.disk_high_seqno, self.purge_seqno, self.max_visible_seqno = row if row else (0, 0, 0)
        self._pos = min(max(start, 0), MAX_STORED_SEQNO)
        self.history = tuple(sorted(history))  # collections whose older versions come too
        self._history_sql = (f"SELECT key, seqno, rev_seqno, cas, flags, expiry, datatype, deleted, delete_time, "
                             f"delete_source, value, cid, 0 FROM history INDEXED BY history_by_seqno WHERE vb = ? "
                             f"AND seqno > ? AND seqno <= ? AND cid IN ({','.join('?' * len(self.history))}) "
                             f"ORDER BY seqno LIMIT ?") if self.history else ""
        self._base = _rowid(vb, 0)  # the rowid of (vb, seqno) is base | seqno
        self._top = self._base | min(max(end, 0), MAX_STORED_SEQNO)  # the last rowid in range

    def next_page(self) -> list[Item]:
        """The next page (at most page_size items); [] when the range is exhausted."""
        return [_item(r) for r in self.next_rows()]

    def next_rows(self) -> list[tuple]:
        """The next page as raw rows, for a reader that encodes straight from them (a DCP
        backfill): columns in ITEM_COLUMNS order, CAS and rev seqno as stored (signed 64-bit,
        two's complement; `item_from_row` converts), and a 13th: whether the row has an encoded
        head. At most page_size rows and about page_bytes of values (at least one row). []
        when the range is exhausted. With `history`, older versions of those collections come
        among them, in seqno order."""
        if self.closed:
            return []
        return self._history_page() if self.history else self._row_page(None)

    def _history_page(self) -> list[tuple]:
        """The next page of latest versions and older ones of the history collections, merged by
        seqno (each read by its own index, a page of each at most)."""
        n, pos = self.page_size, self._pos
        end = self._top - self._base
        latest = self._db.execute(_ROW_PAGE, (self._base | pos, self._top, n)).fetchall()
        older = self._db.execute(self._history_sql, (self.vb, pos, end, *self.history, n)).fetchall()
        rows = list(heapq.merge(latest, older, key=lambda r: r[SEQNO]))[:n]
        if len(latest) < n and len(older) < n and len(rows) == len(latest) + len(older):
            self.close()  # both read to the range's end
        elif rows:
            self._pos = rows[-1][SEQNO]
        return rows

    def next_chunk(self, opaque: int, collections: bool) -> "EncodedPage | list[tuple]":
        """The next part of the range for a DCP stream that sends plain mutations unshaped, in
        seqno order: a run the flusher stored (store docstring) that starts here, as one
        EncodedPage (only its head when it goes past the range's end); else, up to where the
        next run starts, a run of at least `min_run` seqnos of rows with stored messages as one
        EncodedPage (about page_size messages), or a
        page of raw rows (`next_rows`) that ends where such a run begins: where tombstones or
        xattr documents are scattered among plain ones, the plain ones in between come as rows
        rather than as many tiny queries. Encoded pages are restamped with this opaque and key
        layout by `stamp_mutations`. [] when the range is exhausted. A scan with `history` reads
        rows only (`next_rows`).

        A page of rows' messages is a seqno range (the query has no LIMIT, which would cost a
        sorted subquery): page_size seqnos, widened up to 4x while de-duplication leaves them sparse."""
        if self.history:
            return self.next_rows()
        db, base, top = self._db, self._base, self._top
        end = top - base
        while not self.closed:
            pos = self._pos
            run = db.execute(_RUN_FROM, (base | pos, top)).fetchone()
            if run is not None and run[4] is not None:
                _, hi, count, last, data = run
                if hi > end:
                    # The run goes past the range, as when a backfill stops where the checkpoints
                    # begin: its head, measured on the stored messages, so the run's blob is still
                    # read in one query rather than as rows one by one.
                    nbytes, count, last = mutations_upto(data, end)
                    data, hi = memoryview(data)[:nbytes], end
                self._pos = hi
                if hi == end:
                    self.close()
                if not count:
                    return []  # no row between the position and the range's end
                return EncodedPage(stamp_mutations(data, opaque, collections), count, last)
            stop = end if run is None or run[0] == base | pos else run[0] - base  # rows up to the next run
            row = db.execute(_NEXT_UNENCODED, (base | pos, base | stop)).fetchone()
            upto = stop if row is None else row[0] - 1
            if upto > pos and (row is None or upto - pos >= self.min_run):
                span = self.page_size * self._widen
                hi = min(upto, pos + span)
                data, count, last = db.execute(_ENCODED_PAGE, (base | pos, base | hi)).fetchone()
                self._widen = min(4, self._widen * 2) if count * 2 < self.page_size and hi < upto else 1
                self._pos = hi
                if hi == end:
                    self.close()
                if count:
                    return EncodedPage(stamp_mutations(data, opaque, collections), count, last)
                # A gap in the seqnos (de-duplication, or a range ending far above the data): on
                # to the next row, not span by span.
                row = db.execute(_NEXT_ROW, (base | hi, top)).fetchone()
                if row is None:
                    self.close()
                    return []
                self._pos = max(hi, min(row[0] - 1, stop))  # not past the next run's start
                continue
            if row is None:
                self.close()
                return []
            return self._row_page(self.min_run, stop)
        return []

    def _row_page(self, stop_at_run: int | None, stop: int | None = None) -> list[tuple]:
        """Rows after the position up to seqno `stop` (the range's end if None): page_size at
        most, about page_bytes of values, and (with `stop_at_run`) ending before the first run of
        that many rows with encoded heads."""
        top = self._top if stop is None else self._base | stop
        cur = self._db.execute(_ROW_PAGE, (self._base | self._pos, top, self.page_size))
        rows: list[tuple] = []
        nbytes = streak = 0
        more = False
        for r in cur:
            if stop_at_run is not None and r[ENCODED]:
                streak += 1
                if streak >= stop_at_run:
                    del rows[len(rows) - (streak - 1):]  # the run's first rows: they come encoded
                    more = True
                    break
            else:
                streak = 0
            rows.append(r)
            nbytes += len(r[VALUE])
            if nbytes >= self.page_bytes:
                more = True
                break
        cur.close()
        if rows:
            self._pos = rows[-1][SEQNO]
        if not more and len(rows) < self.page_size:  # a short page: nothing more up to `top`
            if top == self._top:
                self.close()  # the last: the next call answers [] without a query
            else:
                self._pos = top - self._base
        return rows

    def pages(self) -> Iterator[list[Item]]:
        while page := self.next_page():
            yield page

    def __iter__(self) -> Iterator[Item]:
        for page in self.pages():
            yield from page

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            db, self._db = self._db, None
            try:
                if db.in_transaction:
                    db.execute("COMMIT")
            except BaseException:
                db.close()
                raise
            if self._pool is not None:
                self._pool.put(db)
            else:
                db.close()

    def __enter__(self) -> "BackfillScan":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
