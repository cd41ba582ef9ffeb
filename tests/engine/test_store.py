"""Store: batched writes, by-seqno scans (paged, de-duplicated, point-in-time), purge, rollback."""

import sqlite3

import pytest

from dcpflow.engine import DeleteSource, FailoverTable, Item, Store, VBucketStateRecord
from dcpflow.engine.store import SCHEMA_VERSION, StoreVersionError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "b" / "store.sqlite3", synchronous="NORMAL")
    s.save_vbucket_states([VBucketStateRecord(0, 1, FailoverTable([(1, 0)]).to_json()),
                           VBucketStateRecord(1, 1, FailoverTable([(2, 0)]).to_json())])
    yield s
    s.close()


class Writer:
    """Writes versions to a store the way the flusher does, tracking seqnos per vbucket."""

    def __init__(self, store):
        self.store = store
        self.high = {0: 0, 1: 0}

    def put(self, key, value=b"v", vb=0, deleted=False, delete_time=0, rev=1, cas=None):
        self.high[vb] += 1
        seqno = self.high[vb]
        return Item(key, value, cas=seqno * 10 if cas is None else cas, rev_seqno=rev, by_seqno=seqno,
                    deleted=deleted, delete_time=delete_time)

    def write(self, vb, *items, snap=None):
        """One flush batch; by default the items form one complete snapshot."""
        start, end = snap or (items[0].by_seqno, items[-1].by_seqno)
        rec = VBucketStateRecord(vb, 1, FailoverTable([(1, 0)]).to_json(), self.high[vb], start, end)
        self.store.write([(vb, list(items))], [rec], [(vb, start, end)])


def scan_keys(store, vb, start, end, page_size=1000):
    with store.scan(vb, start, end, page_size=page_size) as scan:
        return [(it.key, it.by_seqno, it.deleted) for it in scan]


def test_write_and_get_round_trip_every_field(store):
    item = Item(b"k", b"\x00value", flags=0xDEADBEEF, expiry=1_900_000_000, cas=(1 << 64) - 2,
                rev_seqno=(1 << 63) + 5, by_seqno=1, datatype=0x05)
    tomb = Item(b"t", b"", cas=3, rev_seqno=2, by_seqno=2, deleted=True, delete_time=123,
                delete_source=DeleteSource.TTL)
    store.write([(0, [item, tomb])])
    assert store.get(0, b"k") == item  # u64 CAS / rev above 2^63 survive the signed column
    assert store.get(0, b"t") == tomb
    assert store.get(1, b"k") is None
    assert store.count(0) == (1, 1)


def test_scan_returns_latest_version_per_key_in_seqno_order_including_tombstones(store):
    w = Writer(store)
    w.write(0, w.put(b"a"), w.put(b"b"), w.put(b"c"))
    w.write(0, w.put(b"a", b"v2"), w.put(b"b", deleted=True))
    w.write(1, w.put(b"other", vb=1))
    assert scan_keys(store, 0, 0, 100) == [(b"c", 3, False), (b"a", 4, False), (b"b", 5, True)]
    assert scan_keys(store, 0, 3, 4) == [(b"a", 4, False)]  # start is exclusive, end inclusive
    assert scan_keys(store, 1, 0, 100) == [(b"other", 1, False)]


def test_same_key_twice_in_one_batch_keeps_the_last(store):
    w = Writer(store)
    w.write(0, w.put(b"a", b"1"), w.put(b"a", b"2"))
    assert store.get(0, b"a").value == b"2"
    assert scan_keys(store, 0, 0, 10) == [(b"a", 2, False)]


def test_scan_is_paged_and_bounded(store):
    w = Writer(store)
    w.write(0, *[w.put(b"k%05d" % i) for i in range(5000)])
    with store.scan(0, 100, 4900, page_size=128) as scan:
        sizes = [len(p) for p in scan.pages()]
        assert scan.closed  # exhausted scans release their read transaction
    assert max(sizes) == 128 and sum(sizes) == 4800
    assert len(sizes) == 38


def test_scan_is_a_point_in_time_snapshot_across_pages(store):
    w = Writer(store)
    w.write(0, *[w.put(b"k%d" % i) for i in range(10)])
    scan = store.scan(0, 0, 1000, page_size=4)
    first = scan.next_page()
    assert scan.disk_high_seqno == 10
    # the flusher commits while the backfill is between pages: move k8 and add k99
    w.write(0, w.put(b"k8", b"moved"), w.put(b"k99"))
    rest = [it for page in scan.pages() for it in page]
    got = [(it.key, it.by_seqno) for it in first + rest]
    assert got == [(b"k%d" % i, i + 1) for i in range(10)]
    assert scan_keys(store, 0, 0, 1000)[-2:] == [(b"k8", 11, False), (b"k99", 12, False)]


def test_load_items_streams_everything(store):
    w = Writer(store)
    w.write(0, *[w.put(b"k%d" % i) for i in range(2500)])
    assert sum(1 for _ in store.load_items(0, page_size=1000)) == 2500


def test_vbucket_state_round_trip(store):
    rec = VBucketStateRecord(3, 2, FailoverTable([(9, 7), (8, 0)]).to_json(), high_seqno=7, snap_start=5,
                             snap_end=9, purge_seqno=2, max_cas=(1 << 64) - 1, max_visible_seqno=7,
                             max_deleted_rev_seqno=4)
    store.save_vbucket_states([rec])
    assert store.load_vbucket_states()[3] == rec


def test_purge_removes_old_tombstones_and_advances_purge_seqno(store):
    w = Writer(store)
    w.write(0, w.put(b"live"), w.put(b"old1", deleted=True, delete_time=100, rev=7),
            w.put(b"old2", deleted=True, delete_time=200, rev=3),
            w.put(b"young", deleted=True, delete_time=900))
    result = store.purge_tombstones(0, deleted_before=500)
    assert sorted(result.purged) == [(b"old1", 2), (b"old2", 3)]
    assert result.purge_seqno == 3 and result.max_deleted_rev_seqno == 7
    assert scan_keys(store, 0, 0, 100) == [(b"live", 1, False), (b"young", 4, True)]
    rec = store.load_vbucket_states()[0]
    assert (rec.purge_seqno, rec.max_deleted_rev_seqno) == (3, 7)


def test_purge_seqno_never_goes_back(store):
    w = Writer(store)
    w.write(0, w.put(b"a", deleted=True, delete_time=1))
    assert store.purge_tombstones(0, 10).purge_seqno == 1
    w.write(0, w.put(b"b"))
    assert store.purge_tombstones(0, 10).purge_seqno == 1


def test_purge_with_interval_zero_purges_everything_deleted_up_to_now(store):
    w = Writer(store)
    w.write(0, w.put(b"a", deleted=True, delete_time=1000))
    assert store.purge_tombstones(0, 1000).purged == [(b"a", 1)]


def test_rollback_restores_versions_current_at_the_seqno(store):
    w = Writer(store)
    w.write(0, w.put(b"a", b"a1"), w.put(b"b", b"b1"), w.put(b"c", b"c1"))  # 1..3
    w.write(0, w.put(b"a", b"a2"), w.put(b"b", deleted=True), w.put(b"d", b"d1"), w.put(b"a", b"a3"))  # 4..7
    assert store.rollback(0, 3).seqno == 3
    assert scan_keys(store, 0, 0, 100) == [(b"a", 1, False), (b"b", 2, False), (b"c", 3, False)]
    assert store.get(0, b"a").value == b"a1"
    assert store.get(0, b"d") is None
    rec = store.load_vbucket_states()[0]
    assert (rec.high_seqno, rec.snap_start, rec.snap_end) == (3, 3, 3)
    assert store.history_count(0) == 0


def test_rollback_to_a_seqno_between_two_versions(store):
    w = Writer(store)
    w.write(0, w.put(b"a", b"a1"), w.put(b"x"), w.put(b"a", b"a2"), w.put(b"y"), w.put(b"a", b"a3"))
    assert store.rollback(0, 4).seqno == 4
    assert store.get(0, b"a").value == b"a2"
    assert [k for k, _, _ in scan_keys(store, 0, 0, 100)] == [b"x", b"a", b"y"]


def test_versions_replaced_within_one_batch_keep_every_rollback_point(store):
    """A key on disk (a0), then three versions of it in one batch: each rollback below the batch's
    versions must still find the one current at that seqno - a0 too, after a first rollback into
    the batch (it was superseded by the batch's first version, not its last)."""
    w = Writer(store)
    w.write(0, w.put(b"a", b"a0"), w.put(b"x"))  # 1, 2
    w.write(0, w.put(b"a", b"a1"), w.put(b"y"), w.put(b"a", b"a2"), w.put(b"z"), w.put(b"a", b"a3"))  # 3..7
    assert store.history_count(0) == 3
    assert store.rollback(0, 5).seqno == 5 and store.get(0, b"a").value == b"a2"
    assert store.rollback(0, 3).seqno == 3 and store.get(0, b"a").value == b"a1"
    assert store.rollback(0, 2).seqno == 2 and store.get(0, b"a").value == b"a0"
    assert [k for k, _, _ in scan_keys(store, 0, 0, 100)] == [b"a", b"x"]


def test_rollback_reports_a_consistent_point_only_at_a_snapshot_end(store):
    w = Writer(store)
    w.write(0, w.put(b"a"), w.put(b"b"), w.put(b"c"))  # snapshot [1, 3]
    w.write(0, w.put(b"d"), w.put(b"e"), snap=(4, 9))  # first part of snapshot [4, 9]
    w.write(0, w.put(b"f"), w.put(b"g"), snap=(4, 9))
    result = store.rollback(0, 5)
    assert (result.seqno, result.snap_start, result.snap_end) == (5, 4, 9)
    result = store.rollback(0, 3)
    assert (result.seqno, result.snap_start, result.snap_end) == (3, 3, 3)
    rec = store.load_vbucket_states()[0]
    assert (rec.high_seqno, rec.snap_start, rec.snap_end) == (3, 3, 3)


def test_rollback_at_or_above_persisted_high_seqno_changes_nothing(store):
    w = Writer(store)
    w.write(0, w.put(b"a"), w.put(b"b"))
    assert store.rollback(0, 2).seqno == 2
    assert store.rollback(0, 5).seqno == 2
    assert store.count(0) == (2, 0)


def test_rollback_below_the_history_floor_resets_to_zero(store):
    w = Writer(store)
    w.write(0, w.put(b"a"), w.put(b"t", deleted=True, delete_time=1))
    w.write(0, w.put(b"a", b"again"), w.put(b"b"))
    result = store.purge_tombstones(0, 10)
    assert result.history_floor == 2  # the purged tombstone's seqno
    assert store.rollback(0, 3).seqno == 3  # at/above the floor: exact
    assert store.rollback(0, 1).seqno == 0  # below it: reset
    assert store.count(0) == (0, 0)
    rec = store.load_vbucket_states()[0]
    assert (rec.high_seqno, rec.purge_seqno) == (0, 0)


def test_compaction_history_floor_trims_history(store):
    w = Writer(store)
    for i in range(5):
        w.write(0, w.put(b"hot", b"%d" % i))
    assert store.history_count(0) == 4
    store.purge_tombstones(0, 0, history_floor=3)  # keep what rolling back to >= 3 needs
    assert store.history_count(0) == 2  # versions superseded at 4 and 5
    assert store.rollback(0, 3).seqno == 3 and store.get(0, b"hot").value == b"2"


def test_without_history_every_rollback_below_persisted_resets(tmp_path):
    s = Store(tmp_path / "nohist.sqlite3", synchronous="NORMAL", keep_history=False)
    s.save_vbucket_states([VBucketStateRecord(0, 1, "[]")])
    w = Writer(s)
    w.write(0, w.put(b"a"), w.put(b"a"))
    assert s.history_count(0) == 0
    s.close()


def test_delete_vbucket_removes_only_that_vbucket(store):
    w = Writer(store)
    w.write(0, w.put(b"a"))
    w.write(1, w.put(b"b", vb=1))
    store.delete_vbucket(0)
    assert store.get(0, b"a") is None and 0 not in store.load_vbucket_states()
    assert store.get(1, b"b") is not None


def test_failed_write_leaves_nothing_behind(store):
    w = Writer(store)
    good = w.put(b"a")
    bad = Item(b"bad", b"", by_seqno=None, deleted=True)  # type: ignore[arg-type]  # seqno NOT NULL
    with pytest.raises(sqlite3.IntegrityError):
        store.write([(0, [good]), (1, [bad])])  # vbucket 0's row is written when 1's fails
    assert store.get(0, b"a") is None  # the whole batch rolled back
    store.write([(0, [good])])
    assert store.get(0, b"a") == good


def test_meta_values(store):
    assert store.get_meta("x") is None
    store.set_meta("x", "1")
    assert store.get_meta("x") == "1"


def test_a_short_page_ends_the_scan_without_another_query(store):
    w = Writer(store)
    w.write(0, *[w.put(b"k%d" % i) for i in range(10)])
    scan = store.scan(0, 0, 1000, page_size=64)
    assert len(scan.next_rows()) == 10
    assert scan.closed  # the read transaction is released with the last page
    assert scan.next_rows() == []


def test_scans_reuse_read_connections_and_each_keeps_its_own_snapshot(store):
    w = Writer(store)
    w.write(0, *[w.put(b"k%d" % i) for i in range(10)])
    first = store.scan(0, 0, 1000, page_size=4)
    first.next_rows()
    conn = first._db
    first.close()
    second = store.scan(0, 0, 1000, page_size=4)
    assert second._db is conn  # taken from the pool, not a new connection
    w.write(0, w.put(b"k99"))  # committed after the second scan began: not in its snapshot
    third = store.scan(0, 0, 1000, page_size=100)
    got2 = [r[0] for page in iter(second.next_rows, []) for r in page]
    assert b"k99" not in got2 and len(got2) == 10
    assert b"k99" in [r[0] for r in third.next_rows()]
    store.close()
    assert second.closed and third.closed


def test_pooled_scans_read_through_a_memory_map_that_follows_the_file(store):
    """Scans read the file through a memory map (READER_MMAP_BYTES). A pooled connection must still
    see every row after the file has grown (written, checkpointed out of the WAL) since it mapped
    it, and what a checkpoint moved into the file must read the same as from the WAL."""
    w = Writer(store)
    w.write(0, *[w.put(b"a%d" % i, b"x" * 300) for i in range(50)])
    scan = store.scan(0, 0, 1 << 40)
    conn = scan._db
    assert conn.execute("PRAGMA mmap_size").fetchone()[0] > 0
    before = [r[0] for page in iter(scan.next_rows, []) for r in page]
    assert scan.closed
    size = store.path.stat().st_size
    w.write(0, *[w.put(b"b%d" % i, b"y" * 3000) for i in range(500)])  # a few MB more
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert store.path.stat().st_size > size + (1 << 20)
    again = store.scan(0, 0, 1 << 40)
    assert again._db is conn
    rows = [r for page in iter(again.next_rows, []) for r in page]
    assert [r[0] for r in rows] == before + [b"b%d" % i for i in range(500)]
    assert all(r[10] == b"y" * 3000 for r in rows[50:])


@pytest.mark.parametrize("n", [1, 2, 3, 127, 128, 129, 300, 1000])
def test_a_batch_of_any_size_is_written_whole(tmp_path, n):
    """Every row of a flush batch of any size lands, each in its own vbucket, with every field, as
    do the state rows and snapshot ranges."""
    s = Store(tmp_path / "store.sqlite3", synchronous="OFF")
    try:
        per_vb: dict[int, list[Item]] = {}
        for i in range(n):
            vb = i % 7
            seqno = len(per_vb.setdefault(vb, [])) + 1
            per_vb[vb].append(Item(b"key-%d" % i, b"v%d" % i * (i % 5), flags=i, cas=(1 << 64) - 2 - i,
                                   rev_seqno=i + 1, by_seqno=seqno, deleted=i % 11 == 0, delete_time=i))
        states = [VBucketStateRecord(vb, 1, FailoverTable([(vb + 1, 0)]).to_json(), len(items), 1, len(items))
                  for vb, items in per_vb.items()]
        s.write(list(per_vb.items()), states, [(vb, 1, len(items)) for vb, items in per_vb.items()])
        for vb, items in per_vb.items():
            assert [s.get(vb, it.key) for it in items] == items
            assert s.count(vb) == (sum(not it.deleted for it in items), sum(it.deleted for it in items))
        loaded = s.load_vbucket_states()
        assert {vb: (r.high_seqno, r.snap_end) for vb, r in loaded.items()} == \
            {vb: (len(items), len(items)) for vb, items in per_vb.items()}
        with s._lock:
            assert s._db.execute("SELECT count(*) FROM snapshots").fetchone()[0] == len(per_vb)
    finally:
        s.close()


# -- the schema version (store.py docstring, "Schema version") ----------------------------------

def user_version(path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def set_user_version(path, version: int) -> None:
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {version}")
    db.close()


def file_state(path) -> tuple:
    """The file's version, schema text and rows of every table: what a refused open must not change."""
    db = sqlite3.connect(path)
    try:
        schema = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
        tables = [name for kind, name, _ in schema if kind == "table"]
        rows = {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}
        return db.execute("PRAGMA user_version").fetchone()[0], schema, rows
    finally:
        db.close()


def a_store_with_a_document(path) -> None:
    s = Store(path, synchronous="NORMAL")
    s.save_vbucket_states([VBucketStateRecord(0, 1, FailoverTable([(1, 0)]).to_json(), 1, 1, 1)])
    s.write([(0, [Item(b"k", b"v", cas=7, by_seqno=1)])])
    s.close()


def test_a_new_store_is_schema_version_3(tmp_path):
    assert SCHEMA_VERSION == 3
    s = Store(tmp_path / "s.sqlite3", synchronous="NORMAL")
    s.close()
    assert user_version(tmp_path / "s.sqlite3") == SCHEMA_VERSION
    again = Store(tmp_path / "s.sqlite3", synchronous="NORMAL")
    again.close()
    assert user_version(tmp_path / "s.sqlite3") == SCHEMA_VERSION


@pytest.mark.parametrize("version", [4, 7, -1])
def test_a_store_of_another_version_is_refused_and_left_unchanged(tmp_path, version):
    path = tmp_path / "s.sqlite3"
    a_store_with_a_document(path)
    set_user_version(path, version)
    before = file_state(path)
    with pytest.raises(StoreVersionError, match=rf"has schema version {version}; this dcpflow reads schema "
                                                rf"versions 1 to 3") as e:
        Store(path, synchronous="NORMAL")
    assert ("a newer dcpflow wrote it" in str(e.value)) == (version > SCHEMA_VERSION)
    assert isinstance(e.value, ValueError)  # `dcpflow server` reports it as "cannot start: ..."
    assert file_state(path) == before


def test_an_empty_file_of_a_newer_version_gets_no_tables(tmp_path):
    path = tmp_path / "s.sqlite3"
    set_user_version(path, 4)
    with pytest.raises(StoreVersionError, match="schema version 4"):
        Store(path, synchronous="NORMAL")
    assert file_state(path) == (4, [], {})


def a_version_1_store(path, *, stamp: int = 1) -> None:
    """A store as dcpflow wrote it before collections (schema version 1), by SQL alone: one
    document in vbucket 0 with an older version in history, a tombstone, and the vbucket's state."""
    from dcpflow.engine import store as store_module
    db = sqlite3.connect(path)
    for sql in store_module._SCHEMA_V1:
        db.execute(sql)
    cols = "vb, key, seqno, rev_seqno, cas, flags, expiry, datatype, deleted, delete_time, delete_source, value"
    db.execute(f"INSERT INTO items (id, {cols}, dcp) VALUES (3, 0, x'6b', 3, 2, 30, 0, 0, 0, 0, 0, 0, x'7632', NULL)")
    db.execute(f"INSERT INTO items (id, {cols}, dcp) VALUES (2, 0, x'64', 2, 2, 20, 0, 0, 0, 1, 99, 0, x'', NULL)")
    db.execute(f"INSERT INTO history ({cols}, superseded_by) VALUES (0, x'6b', 1, 1, 10, 0, 0, 0, 0, 0, 0, "
               "x'7631', 3)")
    db.execute("INSERT INTO vbucket_state (vb, state, failover_log, high_seqno, snap_start, snap_end, purge_seqno, "
               "max_cas, max_visible_seqno, max_deleted_rev_seqno) VALUES (0, 1, ?, 3, 3, 3, 0, 30, 3, 0)",
               (FailoverTable([(1, 0)]).to_json(),))
    db.execute(f"PRAGMA user_version = {stamp}")
    db.commit()
    db.close()


@pytest.mark.parametrize("stamp", [1, 0], ids=["version 1", "unversioned, laid out as version 1"])
def test_a_version_1_store_is_migrated_in_one_step_and_keeps_its_data(tmp_path, stamp):
    """Version 1 had no collections: its documents are the default collection's, its history
    still rolls back, and the file is laid out as a new store is (migrated through every version)."""
    path = tmp_path / "s.sqlite3"
    a_version_1_store(path, stamp=stamp)
    s = Store(path, synchronous="NORMAL")
    try:
        assert user_version(path) == SCHEMA_VERSION == 3
        got = s.get(0, b"k")
        assert (got.value, got.cas, got.by_seqno, got.cid) == (b"v2", 30, 3, 0)
        assert s.get(0, b"k", cid=8) is None
        assert [(i.key, i.deleted, i.cid) for i in s.load_items(0)] == [(b"d", True, 0), (b"k", False, 0)]
        assert s.load_vbucket_states()[0].high_seqno == 3
        # a named collection's key beside the default collection's same key
        s.write([(0, [Item(b"k", b"in 8", cas=40, by_seqno=4, cid=8)])],
                [VBucketStateRecord(0, 1, FailoverTable([(1, 0)]).to_json(), 4, 4, 4)], [(0, 4, 4)])
        assert (s.get(0, b"k").value, s.get(0, b"k", cid=8).value) == (b"v2", b"in 8")
        assert s.rollback(0, 2).seqno == 2  # the migrated history row restores k@1
        assert (s.get(0, b"k").value, s.get(0, b"k", cid=8)) == (b"v1", None)
    finally:
        s.close()
    fresh = tmp_path / "fresh.sqlite3"
    Store(fresh, synchronous="NORMAL").close()
    from dcpflow.engine.store import _layout
    layouts = []
    for p in (path, fresh):
        db = sqlite3.connect(p)
        layouts.append(_layout(db))
        db.close()
    assert layouts[0] == layouts[1]


def test_a_migration_that_fails_leaves_the_file_as_it_was(tmp_path):
    """The step runs in one transaction with the new version number: a failure in its middle (here
    an index of the name the step creates already there) changes nothing."""
    path = tmp_path / "s.sqlite3"
    a_version_1_store(path)
    db = sqlite3.connect(path)
    db.execute("CREATE INDEX history_by_seqno ON history (seqno)")
    db.commit()
    db.close()
    before = file_state(path)
    with pytest.raises(sqlite3.OperationalError, match="history_by_seqno already exists"):
        Store(path, synchronous="NORMAL")
    assert file_state(path) == before


def _unclustered(db) -> None:
    """items with rowids in insertion order and a (vb, seqno) index, as before clustering by seqno."""
    db.execute("DROP TABLE items")
    db.execute("""CREATE TABLE items (
        vb INTEGER NOT NULL, key BLOB NOT NULL, seqno INTEGER NOT NULL, rev_seqno INTEGER NOT NULL,
        cas INTEGER NOT NULL, flags INTEGER NOT NULL, expiry INTEGER NOT NULL, datatype INTEGER NOT NULL,
        deleted INTEGER NOT NULL, delete_time INTEGER NOT NULL, delete_source INTEGER NOT NULL,
        value BLOB NOT NULL, dcp BLOB)""")
    db.execute("CREATE UNIQUE INDEX items_by_key ON items (vb, key)")
    db.execute("CREATE UNIQUE INDEX items_by_seqno ON items (vb, seqno)")


def _without_messages(db) -> None:
    """no `dcp` column (nor the partial index on it), as before whole messages were stored."""
    db.execute("DROP INDEX items_unencoded_by_id")
    db.execute("ALTER TABLE items DROP COLUMN dcp")


@pytest.mark.parametrize("older", [
    pytest.param(lambda db: db.execute("DROP TABLE runs"), id="no runs"),
    pytest.param(lambda db: db.execute("DROP TRIGGER items_insert_drops_run"), id="runs without their triggers"),
    pytest.param(_without_messages, id="values apart from messages"),
    pytest.param(lambda db: db.execute("ALTER TABLE items ADD COLUMN dcp_h1 BLOB"), id="head in three columns"),
    pytest.param(_unclustered, id="items not clustered by seqno"),
    pytest.param(lambda db: db.execute("CREATE TABLE other (x)"), id="a table of someone else's"),
])
def test_an_unversioned_store_of_an_unreleased_layout_is_refused_and_left_unchanged(tmp_path, older):
    path = tmp_path / "s.sqlite3"
    a_store_with_a_document(path)
    db = sqlite3.connect(path)
    older(db)
    db.execute("PRAGMA user_version = 0")
    db.commit()
    db.close()
    before = file_state(path)
    with pytest.raises(StoreVersionError, match="has no schema version and is not laid out as schema version 1, "
                                                "the only one this dcpflow reads"):
        Store(path, synchronous="NORMAL")
    assert file_state(path) == before


def _dump(s: Store) -> dict[str, list]:
    with s._lock:
        return {table: s._db.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()
                for table in ("items", "history", "runs", "snapshots")}


def test_multi_row_upserts_write_exactly_what_one_row_at_a_time_does(tmp_path, monkeypatch):
    """The flusher's upsert takes up to UPSERT_CHUNK rows per statement (chunks of every vbucket,
    split in powers of two): over batches of odd sizes, overwrites (the history trigger), versions
    replaced within a batch, tombstones and runs, the file holds what one statement per row wrote."""
    from dcpflow.engine import store as store_module

    def fill(path, chunk: int) -> dict[str, list]:
        monkeypatch.setattr(store_module, "UPSERT_CHUNK", chunk)
        s = Store(path, synchronous="OFF", run_bytes=4096, run_min_bytes=512)
        seqnos: dict[int, int] = {}
        try:
            for batch in range(6):
                per_vb: dict[int, list[Item]] = {}
                for i in range(batch * 97 + 131):
                    key = b"k%04d" % (i * 7 % 311)
                    vb = i % 5
                    seqnos[vb] = seqnos.get(vb, 0) + 1
                    per_vb.setdefault(vb, []).append(Item(key, b"x" * (i % 300), cas=seqnos[vb] + 1000,
                                                          rev_seqno=batch + 1, by_seqno=seqnos[vb],
                                                          deleted=i % 13 == 0, delete_time=i))
                s.write(list(per_vb.items()),
                        [VBucketStateRecord(vb, 1, "[]", seqnos[vb], 1, seqnos[vb]) for vb in per_vb],
                        [(vb, 1, seqnos[vb]) for vb in per_vb])
            return _dump(s)
        finally:
            s.close()

    chunked = fill(tmp_path / "chunked.sqlite3", store_module.UPSERT_CHUNK)
    one_by_one = fill(tmp_path / "single.sqlite3", 1)
    assert chunked["history"] and chunked["runs"]
    assert chunked == one_by_one
    assert store_module._upsert_items_sql.cache_info().currsize <= 9  # 256, 128, ... 1


def test_compaction_can_keep_only_the_newest_history(store):
    w = Writer(store)
    for i in range(10):
        w.write(0, w.put(b"hot", b"%d" % i), w.put(b"warm%d" % (i % 2)))
    assert store.history_count(0) == 17  # hot 9, warm0 and warm1 4 each
    result = store.compact([(0, 0, 0, None, 4)])[0]
    assert store.history_count(0) == 4  # the four newest versions superseded
    frag = store.fragmentation()
    assert (frag.items, frag.history) == (3, 4) and frag.fraction == 4 / 7 and frag.file_bytes > 0
    assert store.rollback(0, result.history_floor - 1).seqno == 0  # below the floor: reset, as a compacted
    # couchstore file does; at or above it a rollback is exact (test_rollback_below_the_history_floor_...)


def _mapped_bytes(path) -> int | None:
    """Resident bytes of this process's mappings of `path` (Linux /proc/self/smaps), None elsewhere."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    total, mine = 0, False
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            mine = len(head) >= 6 and head[5] == str(path)
        elif mine and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


def test_measuring_fragmentation_leaves_no_page_of_the_file_mapped(store):
    """The fragmentation check counts every row, every 10 s while a server writes: through a
    memory-mapped reader the pages it walked stayed resident (and counted in the server's RSS) as
    long as the connection idled in its pool. It reads through a connection without a map."""
    if _mapped_bytes(store.path) is None:
        pytest.skip("needs /proc/self/smaps")
    w = Writer(store)
    for part in range(4):
        w.write(0, *[w.put(b"k%d-%d" % (part, i), b"v" * 2000) for i in range(500)])
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert store.fragmentation().items == 2000
    assert _mapped_bytes(store.path) == 0


def test_a_backfills_rows_are_backfill_rows_read_by_name(store):
    """store_rows.BackfillRow is the layout of `next_rows` (the SELECT is made from its names):
    each field read by its name - or by its index constant, as the DCP backfill reads it - is
    the written version's, for an encoded plain mutation, a tombstone and a large value alike."""
    from dcpflow.engine import store_rows
    from dcpflow.engine.store_rows import BackfillRow

    w = Writer(store)
    plain = Item(b"plain", b"value", flags=7, expiry=9, cas=(1 << 63) + 5, rev_seqno=(1 << 63) + 1, by_seqno=1,
                 datatype=1)
    gone = Item(b"gone", b"", cas=20, rev_seqno=2, by_seqno=2, deleted=True, delete_time=1234,
                delete_source=DeleteSource.TTL)
    large = Item(b"large", b"x" * 9000, cas=30, rev_seqno=3, by_seqno=3)
    w.high[0] = 3
    w.write(0, plain, gone, large)
    rows = [BackfillRow._make(r) for r in store.scan(0, 0, 100).next_rows()]
    assert [r.key for r in rows] == [b"plain", b"gone", b"large"]
    for row, it in zip(rows, (plain, gone, large), strict=True):
        assert (row.seqno, row.flags, row.expiry, row.datatype, row.value, row.cid) == \
            (it.by_seqno, it.flags, it.expiry, it.datatype, it.value, it.cid)
        assert (store_rows._u64(row.cas), store_rows._u64(row.rev_seqno)) == (it.cas, it.rev_seqno)
        assert (bool(row.deleted), row.delete_time, row.delete_source) == \
            (it.deleted, it.delete_time, int(it.delete_source))
        assert store_rows.item_from_row(row) == it
        for name in BackfillRow._fields:
            assert row[getattr(store_rows, name.upper())] == getattr(row, name)
    assert [r.encoded for r in rows] == [1, 0, 0]  # only the plain mutation keeps its message
