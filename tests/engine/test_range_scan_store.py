"""Range-scan snapshots over documents that are not in memory (engine/range_scan.py) and the
store's reads for them (engine/store_scan_reads.py): under full eviction the snapshot holds the
store's live versions memory lacks (memory's own entries, tombstones included, win); a value is
read back by version (history's copy when the latest moved on); `seqno_exists` finds a version
that is only on disk."""

from dcpflow.engine import FailoverTable, Item, Store, VBucketStateRecord
from dcpflow.engine.item import NOT_RESIDENT
from dcpflow.engine.range_scan import range_snapshot, sample_snapshot, seqno_exists

from .test_full_eviction import evict_all, full, vb_of


def keys_of(bucket, vb, n: int, prefix: str = "k") -> list[bytes]:
    """n keys of vbucket `vb`."""
    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}{i:03}".encode()
        if vb_of(bucket, key) is vb:
            out.append(key)
        i += 1
    return out


def test_a_full_eviction_snapshot_holds_the_documents_only_on_disk(make_bucket):
    bucket = full(make_bucket)
    vb = bucket.vbucket(0)
    keys = keys_of(bucket, vb, 12)
    cas = {k: vb.set(k, b'{"k": "%s"}' % k, flags=7, datatype=1).cas for k in keys}
    evict_all(bucket)
    assert len(vb.ht) == 0
    snap = range_snapshot(vb, b"", b"\xff", store=bucket.store)
    assert [i.key for i in snap] == sorted(keys)
    assert all(i.value is NOT_RESIDENT and i.cas == cas[i.key] and i.flags == 7 and i.datatype == 1 for i in snap)
    assert range_snapshot(vb, b"", b"\xff") == []  # memory alone: what the scans returned before
    # memory's entries win over the store's: an update and a delete not flushed yet, a new key
    vb.set(keys[0], b"new")
    vb.delete(keys[1])
    new = keys_of(bucket, vb, 1, prefix="new")[0]
    vb.set(new, b"fresh")
    snap = {i.key: i for i in range_snapshot(vb, b"", b"\xff", store=bucket.store)}
    assert keys[1] not in snap and snap[keys[0]].value == b"new" and snap[new].value == b"fresh"
    assert set(snap) == set(keys) - {keys[1]} | {new}
    bounded = range_snapshot(vb, keys[2], keys[5], excl_start=True, excl_end=True, store=bucket.store)
    assert [i.key for i in bounded] == sorted(keys)[sorted(keys).index(keys[2]) + 1:sorted(keys).index(keys[5])]
    assert {i.key for i in sample_snapshot(vb, 100, seed=1, store=bucket.store)} == set(snap)


def test_documents_expired_on_disk_are_left_out(make_bucket, clock):
    bucket = full(make_bucket, clock=clock)
    vb = bucket.vbucket(0)
    soon, later = keys_of(bucket, vb, 2)
    vb.set(soon, b"x", expiry=int(clock.now) + 10)
    vb.set(later, b"y")
    evict_all(bucket)
    assert [i.key for i in range_snapshot(vb, b"", b"\xff", now=clock.now, store=bucket.store)] == sorted([soon, later])
    assert [i.key for i in range_snapshot(vb, b"", b"\xff", now=clock.now + 11, store=bucket.store)] == [later]


def test_seqno_exists_finds_a_version_only_on_disk(make_bucket):
    bucket = full(make_bucket)
    vb = bucket.vbucket(0)
    key = keys_of(bucket, vb, 1)[0]
    seqno = vb.set(key, b"v1").by_seqno
    evict_all(bucket)
    assert not any(i.by_seqno == seqno for i in vb.ht.values())  # what the check walked before
    assert bucket.store.key_of_seqno(0, seqno) == key
    assert seqno_exists(vb, seqno, bucket.store.key_of_seqno(0, seqno))
    vb.set(key, b"v2")  # memory's newer version supersedes the one on disk at once
    assert not seqno_exists(vb, seqno, bucket.store.key_of_seqno(0, seqno))
    bucket.flush_all()
    assert bucket.store.key_of_seqno(0, seqno) is None and not seqno_exists(vb, seqno, None)


def _store(path, **kwargs) -> Store:
    s = Store(path / "store.sqlite3", synchronous="NORMAL", **kwargs)
    s.save_vbucket_states([VBucketStateRecord(0, 1, FailoverTable([(1, 0)]).to_json())])
    return s


def _write(store: Store, *items: Item) -> None:
    rec = VBucketStateRecord(0, 1, FailoverTable([(1, 0)]).to_json(), items[-1].by_seqno, items[0].by_seqno,
                             items[-1].by_seqno)
    store.write([(0, list(items))], [rec], [(0, items[0].by_seqno, items[-1].by_seqno)])


def test_key_range_is_the_live_metadata_in_key_order(tmp_path):
    store = _store(tmp_path)
    try:
        _write(store, Item(b"b", b"vb" * 3000, 1, 0, 10, 1, 1, 0), Item(b"a", b"va", 2, 0, (1 << 64) - 5, 1, 2, 1),
               Item(b"c", b"", 0, 0, 30, 2, 3, 0, True, 99), Item(b"d", b"vd", 0, 0, 40, 1, 4, 0, cid=8))
        assert store.key_range(0, 0, b"", None) == [(b"a", 2, 1, (1 << 64) - 5, 2, 0, 1), (b"b", 1, 1, 10, 1, 0, 0)]
        assert [r[0] for r in store.key_range(0, 0, b"a", b"b", excl_start=True)] == [b"b"]
        assert [r[0] for r in store.key_range(0, 0, b"a", b"b", excl_end=True)] == [b"a"]
        assert [r[0] for r in store.key_range(0, 8, b"", b"\xff")] == [b"d"]
        assert store.key_of_seqno(0, 4) == (8, b"d") and store.key_of_seqno(0, 3) == b"c"
        assert store.key_of_seqno(0, 5) is None and store.key_of_seqno(1, 1) is None
    finally:
        store.close()


def test_read_versions_gives_the_version_asked_for_while_the_store_has_it(tmp_path):
    for keep_history in (True, False):
        store = _store(tmp_path / str(keep_history), keep_history=keep_history)
        try:
            _write(store, Item(b"a", b"one", by_seqno=1, cas=1), Item(b"b", b"bee", by_seqno=2, cas=2))
            _write(store, Item(b"a", b"two", by_seqno=3, cas=3), Item(b"b", b"", by_seqno=4, cas=4, deleted=True))
            got = store.read_versions([(0, b"a", 1), (0, b"a", 3), (0, b"b", 2), (0, b"nosuch", 5)])
            assert got[1].value == b"two" and got[3] is None
            if keep_history:  # the superseded versions, from history
                assert (got[0].value, got[0].by_seqno, got[2].value, got[2].deleted) == (b"one", 1, b"bee", False)
            else:  # gone: the latest as it is now, for the caller to judge
                assert (got[0].by_seqno, got[2].by_seqno, got[2].deleted) == (3, 4, True)
        finally:
            store.close()
