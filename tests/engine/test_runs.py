"""Runs (store.py): pages of stored messages the flusher keeps for backfills of data at rest.

A run must hold exactly the rows of its seqno range, all of them plain mutations, in order,
whatever happens to the rows after it was built (newer versions, tombstones, purges, rollbacks,
a store opened again); a backfill must read a run where one starts at its position (only its
head when the run goes past the range's end), and rows everywhere else."""

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.engine import Bucket, FailoverTable, Item, Store, VBucketState, VBucketStateRecord
from dcpflow.engine import store as store_module
from dcpflow.engine.item import DATATYPE_XATTR
from dcpflow.engine.store import ENCODED_VALUE_LIMIT, EncodedPage

from .test_encoded_backfill import JSON, check, frames, read_chunks, write, xattr_value

SEQNO_MASK = (1 << 48) - 1


def runs_of(path, vb: int | None = None) -> list[tuple]:
    """(vb, lo, hi, count, last) of every run, in order."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT id, hi, count, last FROM runs ORDER BY id").fetchall()
    finally:
        db.close()
    out = [(i >> 48, i & SEQNO_MASK, hi, count, last) for i, hi, count, last in rows]
    return [r for r in out if vb is None or r[0] == vb]


def assert_runs_hold_their_rows(path) -> int:
    """Every run is exactly the stored messages of the rows in its (lo, hi], all encoded, in seqno
    order, and a vbucket's runs do not overlap. Returns how many runs there are."""
    db = sqlite3.connect(path)
    try:
        runs = db.execute("SELECT id, hi, count, last, data FROM runs ORDER BY id").fetchall()
        prev: dict[int, int] = {}
        for rid, hi, count, last, data in runs:
            vb, lo = rid >> 48, rid & SEQNO_MASK
            assert lo < hi and lo >= prev.get(vb, 0), (vb, lo, hi, prev)
            prev[vb] = hi
            rows = db.execute("SELECT seqno, dcp FROM items WHERE vb = ? AND seqno > ? AND seqno <= ? ORDER BY seqno",
                              (vb, lo, hi)).fetchall()
            assert rows and all(r[1] is not None for r in rows), (vb, lo, hi, [r[0] for r in rows])
            assert (count, last) == (len(rows), rows[-1][0])
            assert data == b"".join(r[1] for r in rows)
    finally:
        db.close()
    return len(runs)


def plain(i: int, seqno: int, size: int = 100) -> Item:
    return Item(b"k%05d" % i, b"v" * size, i, 0, 1000 + seqno, 1, seqno)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.sqlite3", synchronous="OFF", run_bytes=2000, run_min_bytes=500)
    yield s
    s.close()


def message_size(store: Store, vb: int, seqno: int) -> int:
    db = sqlite3.connect(store.path)
    try:
        return db.execute("SELECT length(dcp) FROM items WHERE vb = ? AND seqno = ?", (vb, seqno)).fetchone()[0]
    finally:
        db.close()


def test_runs_are_cut_at_run_bytes_and_a_backfill_reads_them(store):
    write(store, 5, [plain(i, i + 1) for i in range(100)])  # 100 messages of 161 bytes
    size = message_size(store, 5, 1)
    per_run = -(-2000 // size)  # a run ends at the message that reaches run_bytes
    full = 100 // per_run
    assert runs_of(store.path, 5) == [(5, i * per_run, (i + 1) * per_run, per_run, (i + 1) * per_run)
                                      for i in range(full)]
    assert assert_runs_hold_their_rows(store.path) == full
    # the rest waits for more writes, or for a seal
    assert store.seal_runs() == 1
    assert runs_of(store.path, 5)[-1] == (5, full * per_run, 100, 100 - full * per_run, 100)
    chunks = read_chunks(store, 5, 0, 100, 2048, 9, False)
    assert [c.count for c in chunks] == [r[3] for r in runs_of(store.path, 5)]
    assert all(isinstance(c, EncodedPage) for c in chunks)
    assert check(store, 5, 0, 100, 2048, 9, True, runs=True) == 100


def test_a_run_ends_before_a_row_a_backfill_must_shape(store):
    items = [plain(i, i + 1) for i in range(30)]
    items[7] = Item(b"k00007", b"", by_seqno=8, deleted=True)  # 7 messages before it: over run_min
    items[9] = Item(b"k00009", xattr_value(b"{}"), by_seqno=10, datatype=DATATYPE_XATTR | JSON)  # 1 before it
    items[20] = Item(b"k00020", b"L" * ENCODED_VALUE_LIMIT, by_seqno=21)
    write(store, 0, items)
    assert [(lo, hi) for _, lo, hi, *_ in runs_of(store.path, 0)] == [(0, 7), (10, 20)]
    store.seal_runs()
    assert [(lo, hi) for _, lo, hi, *_ in runs_of(store.path, 0)] == [(0, 7), (10, 20), (21, 30)]
    assert_runs_hold_their_rows(store.path)
    for start in range(0, 31, 3):  # starts inside runs and at their edges, ends likewise
        for end in range(start, 31, 4):
            check(store, 0, start, end, 4, 3, False, runs=True)
            check(store, 0, start, end, 4, 3, True, min_run=3, runs=True)


def _statements(store: Store, vb: int, start: int, end: int) -> tuple[list, list[str]]:
    """The chunks of a backfill of (start, end] and the SQL its scan ran."""
    ran: list[str] = []
    with store.scan(vb, start, end, page_size=2048) as scan:
        db = scan._db  # back in the reader pool once the scan closes
        db.set_trace_callback(ran.append)
        chunks = []
        try:
            while chunk := scan.next_chunk(1, True):
                chunks.append(chunk)
        finally:
            db.set_trace_callback(None)
    return chunks, [q for q in ran if q not in ("BEGIN", "COMMIT")]


def test_a_run_is_read_where_it_starts_at_the_position_and_cut_at_the_range_end(store):
    write(store, 1, [plain(i, i + 1) for i in range(40)])
    store.seal_runs()
    runs = runs_of(store.path, 1)
    first = runs[0]
    # from inside the first run: its rest as rows' messages, then the runs after it whole
    chunks = read_chunks(store, 1, 3, 40, 2048, 1, False)
    assert chunks[0].last_seqno == first[2] and chunks[0].count == first[2] - 3
    rest = 40 - runs[-1][2]  # under run_min_bytes: not sealed, read from rows
    assert rest > 0 and [c.count for c in chunks[1:]] == [r[3] for r in runs[1:]] + [rest]
    # ending inside a run (a backfill that stops where the checkpoints begin): that run's head, in
    # one query, and not the rows one by one
    for vb_run in (first, runs[1]):
        for end in range(vb_run[1] + 1, vb_run[2]):
            chunks, ran = _statements(store, 1, vb_run[1], end)
            assert [type(c) for c in chunks] == [EncodedPage] and chunks[0].count == end - vb_run[1]
            assert chunks[0].last_seqno == end and len(ran) == 1 and "FROM runs" in ran[0]
            check(store, 1, vb_run[1], end, 2048, 1, True, runs=True)
    # a range with no row before its end inside a run: nothing, and the scan closes
    write(store, 1, [plain(i, 41 + i) for i in range(2)])  # seqnos 41, 42: k0 and k1 move, leaving holes
    assert read_chunks(store, 1, 0, 2, 2048, 1, True) == []


def test_a_newer_version_or_a_tombstone_drops_the_run_around_the_old_one(store):
    write(store, 2, [plain(i, i + 1) for i in range(60)])
    store.seal_runs()
    before = runs_of(store.path, 2)
    assert len(before) >= 3
    victim = before[1]
    key = victim[1] + 1 - 1  # the key number of the run's first row (seqno lo + 1)
    write(store, 2, [plain(key, 61)])
    after = runs_of(store.path, 2)
    assert victim not in after and [r for r in before if r != victim] == after[:len(before) - 1]
    write(store, 2, [Item(b"k%05d" % before[0][1], b"", by_seqno=62, deleted=True)])  # key of seqno 1
    assert before[0] not in runs_of(store.path, 2)
    assert_runs_hold_their_rows(store.path)
    check(store, 2, 0, 62, 7, 1, True, runs=True)


def test_rollback_drops_the_runs_above_and_around_what_it_restores(store):
    write(store, 4, [plain(i, i + 1) for i in range(60)])
    store.seal_runs()
    runs = runs_of(store.path, 4)
    write(store, 4, [plain(3, 61)] + [plain(i, 62 + i) for i in range(100, 140)])  # k3 leaves run 0
    assert store.rollback(4, 60).seqno == 60  # k3 comes back at seqno 4, runs above 60 go
    assert_runs_hold_their_rows(store.path)
    left = runs_of(store.path, 4)
    assert runs[0] not in left and all(r[2] <= 60 for r in left)
    check(store, 4, 0, 200, 16, 2, False, runs=True)
    write(store, 4, [plain(i, 61 + i) for i in range(200, 260)])  # the vbucket goes on from 60
    store.seal_runs()
    assert assert_runs_hold_their_rows(store.path) > len(left)
    check(store, 4, 0, 200, 16, 2, False, runs=True)


def test_purge_and_reset_keep_runs_true(store):
    write(store, 6, [plain(i, i + 1) for i in range(30)]
          + [Item(b"k%05d" % i, b"", by_seqno=31 + i, deleted=True, delete_time=1) for i in range(5)])
    store.seal_runs()
    n = len(runs_of(store.path, 6))
    store.purge_tombstones(6, 10)
    assert_runs_hold_their_rows(store.path)
    assert len(runs_of(store.path, 6)) <= n
    assert store.rollback(6, 0).seqno == 0  # below the purge seqno: the vbucket is reset
    assert runs_of(store.path, 6) == []
    write(store, 6, [plain(i, i + 1) for i in range(30)])
    store.seal_runs()
    assert assert_runs_hold_their_rows(store.path) >= 1
    store.delete_vbucket(6)
    assert runs_of(store.path, 6) == []


def test_opening_a_store_seals_what_was_left(tmp_path):
    path = tmp_path / "store.sqlite3"
    s = Store(path, synchronous="OFF", run_bytes=2000, run_min_bytes=500)
    write(s, 0, [plain(i, i + 1) for i in range(25)])
    left = runs_of(path, 0)
    s.close()
    s = Store(path, synchronous="OFF", run_bytes=2000, run_min_bytes=500)
    try:
        assert runs_of(path, 0)[:len(left)] == left and runs_of(path, 0)[-1][2] == 25
        assert assert_runs_hold_their_rows(path) >= 2
        write(s, 0, [plain(i, 26 + i) for i in range(25)])  # and it goes on from there
        s.seal_runs()
        assert runs_of(path, 0)[-1][2] == 50
        assert_runs_hold_their_rows(path)
        check(s, 0, 0, 50, 8, 1, True, runs=True)
    finally:
        s.close()


def test_a_clean_bucket_close_seals_its_runs(tmp_path):
    with Bucket("default", tmp_path / "data", 4, synchronous="OFF") as bucket:
        bucket.set_vbucket_state(0, VBucketState.ACTIVE)
        for i in range(200):
            bucket.vbucket(0).set(b"key-%d" % i, b"x" * 100)
    runs = runs_of(tmp_path / "data" / "default" / "store.sqlite3", 0)
    assert runs and runs[-1][2] == 200


def test_run_sizes_are_checked(tmp_path):
    with pytest.raises(ValueError, match="run_min_bytes"):
        Store(tmp_path / "s.sqlite3", run_bytes=100, run_min_bytes=200)


steps = st.lists(st.one_of(
    st.tuples(st.just("batch"), st.lists(st.tuples(
        st.sampled_from(["set", "set", "set", "set", "json", "delete", "xattr", "large"]),
        st.integers(0, 15), st.integers(0, 300)), min_size=1, max_size=25)),
    st.tuples(st.just("seal"), st.none()),
    st.tuples(st.just("reopen"), st.none()),
    st.tuples(st.just("rollback"), st.floats(0, 1)),
    st.tuples(st.just("purge"), st.none()),
), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps, run_bytes=st.sampled_from([200, 700, 3000]), vb=st.sampled_from([0, 1, 1023]),
       start=st.integers(0, 40), span=st.integers(0, 300), page_size=st.integers(1, 9))
def test_runs_stay_true_through_any_history(tmp_path_factory, steps, run_bytes, vb, start, span, page_size):
    path = tmp_path_factory.mktemp("runs") / "store.sqlite3"

    def open_store() -> Store:
        return Store(path, synchronous="OFF", run_bytes=run_bytes, run_min_bytes=run_bytes // 4)

    store = open_store()
    try:
        seqno = 0
        for step, arg in steps:
            if step == "batch":
                items = []
                for kind, k, size in arg:
                    seqno += 1
                    key = b"key-%d" % k
                    if kind == "delete":
                        items.append(Item(key, b"", by_seqno=seqno, rev_seqno=seqno, deleted=True, delete_time=5))
                    elif kind == "xattr":
                        items.append(Item(key, xattr_value(b"x" * size), by_seqno=seqno,
                                          datatype=DATATYPE_XATTR | JSON))
                    elif kind == "large":
                        items.append(Item(key, b"L" * ENCODED_VALUE_LIMIT, by_seqno=seqno))
                    else:
                        datatype = JSON if kind == "json" else 0
                        items.append(Item(key, b"v" * size, 7, 0, seqno * 3, seqno, seqno, datatype))
                write(store, vb, items)
            elif step == "seal":
                store.seal_runs()
            elif step == "reopen":
                store.close()
                store = open_store()
            elif step == "rollback":
                seqno = store.rollback(vb, int(seqno * arg)).seqno
            elif seqno:  # a vbucket with persisted state
                store.purge_tombstones(vb, 10)
            assert_runs_hold_their_rows(path)
        check(store, vb, start, start + span, page_size, 11, True, runs=True)
        check(store, vb, start, start + span, page_size, 11, False, min_run=3, page_bytes=300, runs=True)
    finally:
        store.close()


def test_a_run_is_built_only_over_rows_that_are_all_encoded(store):
    """The statement checks for itself: a range holding a tombstone gets no run whatever asks."""
    write(store, 3, [plain(0, 1), Item(b"gone", b"", by_seqno=2, deleted=True), plain(2, 3)])
    with store._txn() as db:
        store._build_runs(db, 3, [(0, 3)])
        store._build_runs(db, 3, [(2, 3)])
    assert [(lo, hi, count) for _, lo, hi, count, _ in runs_of(store.path, 3)] == [(2, 3, 1)]
    assert_runs_hold_their_rows(store.path)


def test_a_failed_write_leaves_no_tail_ahead_of_the_file(store):
    """The flusher retries a batch whose transaction failed: its runs are cut as if the first try
    never happened (the in-memory tails are found again from the file)."""
    items = [plain(i, i + 1) for i in range(40)]
    with pytest.raises(sqlite3.Error):
        store.write([(0, items)], [], [(0, 1)])  # a bad snapshot row: the transaction rolls back
    assert runs_of(store.path, 0) == []
    write(store, 0, items)
    store.seal_runs()
    fresh = Store(store.path.parent / "fresh.sqlite3", synchronous="OFF", run_bytes=2000, run_min_bytes=500)
    try:
        write(fresh, 0, items)
        fresh.seal_runs()
        assert runs_of(store.path, 0) == runs_of(fresh.path, 0)
    finally:
        fresh.close()


def test_a_scan_that_starts_in_a_gap_still_reads_the_next_run(store):
    """An empty seqno range before a run (versions moved away) is skipped up to the run's start,
    not past it: the run is read whole."""
    write(store, 0, [plain(i, i) for i in range(1, 16)])  # runs cut at 2000 bytes: (0, 13]
    write(store, 0, [plain(1, 16)] + [plain(i, 16 + i) for i in range(2, 14)])  # seqnos 1..13 move away
    store.seal_runs()
    runs = runs_of(store.path, 0)
    assert runs and runs[0][1] > 0
    lo = runs[0][1]
    chunks = read_chunks(store, 0, 0, 40, 2, 1, False)
    assert [c.count for c in chunks if c.last_seqno > lo][:1] == [runs[0][3]]
    check(store, 0, 0, 40, 2, 1, False, runs=True)


def test_runs_stay_true_when_another_writer_changes_rows(store):
    """The triggers live in the file: a writer that knows nothing of runs (an older dcpflow, a
    repair by hand) cannot leave a run serving a version that is gone."""
    write(store, 0, [plain(i, i + 1) for i in range(40)])
    store.seal_runs()
    assert runs_of(store.path, 0)
    db = sqlite3.connect(store.path)
    # the row keeps its value in `value` instead of its message (read as a row), and one goes
    db.execute("UPDATE items SET value = substr(dcp, 56 + length(key)), dcp = NULL WHERE vb = 0 AND seqno = 5")
    db.execute("DELETE FROM items WHERE vb = 0 AND seqno = 20")
    db.commit()
    db.close()
    assert_runs_hold_their_rows(store.path)
    seqnos = []
    for chunk in read_chunks(store, 0, 0, 200, 8, 1, False):
        if isinstance(chunk, EncodedPage):
            seqnos += [int.from_bytes(f.extras[:8], "big") for f in frames(chunk.data)]
        else:
            seqnos += [r[1] for r in chunk]
    assert seqnos == [s for s in range(1, 41) if s != 20]


def test_a_flusher_behind_defers_runs_and_the_idle_seal_cuts_them_in_pieces(store):
    """With a backlog the flusher writes rows without runs (Store.write cut_runs=False: a run would
    write every message a second time). The vbucket stays deferred until sealed - a later batch that
    cuts runs must not inherit the whole backlog's - backfills read its rows meanwhile, and
    `seal_runs` cuts the runs at run_bytes, `max_vbuckets` vbuckets a call."""
    for vb in (1, 2, 3):
        store.write([(vb, [plain(i, i + 1) for i in range(60)])], cut_runs=False)
    assert runs_of(store.path) == [] and store.unsealed() and store.deferred_runs() == 3
    write(store, 1, [plain(i, i + 1) for i in range(60, 100)])  # caught up: still no runs for vbucket 1
    assert runs_of(store.path) == []
    assert check(store, 1, 0, 100, 16, 7, False) == 100  # read as encoded pages
    per_run = -(-2000 // message_size(store, 1, 1))
    assert store.seal_runs(max_vbuckets=2) == 2  # two deferred vbuckets cut, their leftovers sealed
    assert store.deferred_runs() == 1 and store.unsealed()
    store.seal_runs(max_vbuckets=2)
    assert store.deferred_runs() == 0 and not store.unsealed()
    full = 100 // per_run
    assert [r[1:3] for r in runs_of(store.path, 1)] == [(i * per_run, (i + 1) * per_run) for i in range(full)] \
        + [(full * per_run, 100)]
    assert [r[2] for r in runs_of(store.path, 2)][-1] == 60
    assert assert_runs_hold_their_rows(store.path) == len(runs_of(store.path))
    assert check(store, 1, 0, 100, 16, 7, False, runs=True) == 100
    write(store, 2, [plain(i, 61 + i) for i in range(60)])  # sealed: the flusher cuts runs as it writes again
    assert runs_of(store.path, 2)[-1][2] > 60


def test_a_full_flush_batch_with_more_to_write_is_behind(make_bucket):
    bucket = make_bucket(flush_batch_items=50, checkpoint_max_items=25)  # a batch ends with a checkpoint
    bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    for i in range(120):
        bucket.vbucket(0).set(b"key-%d" % i, b"x" * 100)
    behind = []
    while batch := bucket.flusher.collect(50):
        behind.append(batch.behind)
        bucket.flusher.write(batch)
        bucket.flusher.complete(batch)
    assert behind == [True, True, False]
    assert bucket.store.deferred_runs() == 1 and runs_of(bucket.store.path) == []
    bucket.close()  # a clean close leaves deferred runs for later: a shutdown waits for no backlog of them
    assert runs_of(bucket.store.path) == []
    store = Store(bucket.store.path, synchronous="OFF")  # opening seals what is small enough
    store.close()
    runs = runs_of(bucket.store.path, 0)
    assert runs and runs[-1][2] == 120


def test_opening_a_store_defers_the_runs_of_a_big_backlog(tmp_path, monkeypatch):
    """After a big load written without runs, opening the store marks those vbuckets deferred
    (for the idle flusher) instead of writing every run before it serves."""
    path = tmp_path / "store.sqlite3"
    s = Store(path, synchronous="OFF", run_bytes=2000, run_min_bytes=500)
    for vb, n in ((0, 60), (1, 5)):
        items = [plain(i, i + 1) for i in range(n)]
        state = VBucketStateRecord(vb, 1, FailoverTable([(1, 0)]).to_json(), n, 1, n)
        s.write([(vb, items)], [state], [(vb, 1, n)], cut_runs=False)
    s.close()
    monkeypatch.setattr(store_module, "DEFER_AT_OPEN_BYTES", 4000)
    s = Store(path, synchronous="OFF", run_bytes=2000, run_min_bytes=500)
    try:
        assert runs_of(path, 0) == [] and runs_of(path, 1) != [] and s.deferred_runs() == 1
        s.seal_runs()
        assert runs_of(path, 0)[-1][2] == 60 and s.deferred_runs() == 0
        assert assert_runs_hold_their_rows(path) == len(runs_of(path))
    finally:
        s.close()
