"""Full eviction (engine/eviction.py): cold documents leave memory whole, a key filter answers most
misses without a store read, every operation on a key only on disk sees the disk version, counts
stay true, and warm-up loads no documents."""

import pytest

from dcpflow.engine import VBucketState
from dcpflow.engine.errors import EngineError
from dcpflow.engine.eviction import FULL_EVICTION, VALUE_ONLY
from dcpflow.engine.item import NOT_RESIDENT
from dcpflow.engine.memory import HT_ITEM_OVERHEAD
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.status import Status

MiB = 1024 * 1024


def full(make_bucket, **kwargs):
    bucket = make_bucket(eviction_policy=FULL_EVICTION, **kwargs)
    if not bucket.vbuckets:
        bucket.create_vbuckets(range(bucket.num_vbuckets), VBucketState.ACTIVE)
    return bucket


def vb_of(bucket, key: bytes):
    return bucket.vbucket(vbucket_for_key(key, bucket.num_vbuckets))


def evict_all(bucket) -> int:
    """Flush, then evict every document (EVICT_KEY on each entry); returns how many."""
    bucket.flush_all()
    n = 0
    for vb in bucket.vbuckets.values():
        for key in list(vb.ht):
            assert vb.evict_key(key) == "Ejected."
            n += 1
    return n


class StoreReads:
    """Counts the store reads of the vbuckets' fetches (`VBucket._fetch`, Store.read)."""

    def __init__(self, bucket):
        self.n = 0
        for vb in bucket.vbuckets.values():
            vb._fetch = self._counting(vb._fetch)

    def _counting(self, fetch):
        def counted(vbid, key):
            self.n += 1
            return fetch(vbid, key)
        return counted


def load(bucket, n: int, prefix: str = "k", **kwargs) -> dict[bytes, int]:
    cas = {}
    for i in range(n):
        key = f"{prefix}{i}".encode()
        cas[key] = vb_of(bucket, key).set(key, b'{"n": %d}' % i, **kwargs).cas
    return cas


def test_evicted_documents_leave_memory_whole_and_the_counts_stay(make_bucket):
    bucket = full(make_bucket)
    load(bucket, 200)
    meta_before = bucket.memory.meta
    assert evict_all(bucket) == 200
    assert all(len(vb.ht) == 0 for vb in bucket.vbuckets.values())
    assert bucket.memory.meta == meta_before - sum(len(f"k{i}") + HT_ITEM_OVERHEAD for i in range(200))
    assert bucket.memory.values == 0
    stats = bucket.stats()
    assert stats["curr_items"] == 200
    assert stats["ep_item_eviction_policy"] == "full_eviction"
    assert stats["vb_active_perc_mem_resident"] == 0
    assert stats["ep_num_non_resident"] == 200
    with pytest.raises(EngineError) as e:  # a version not persisted yet stays
        vb = vb_of(bucket, b"k1")
        vb.set(b"k1", b"new")
        vb.evict_key(b"k1")
    assert e.value.status == Status.KEY_EEXISTS


def test_a_miss_is_answered_by_the_filter_without_a_store_read(make_bucket):
    bucket = full(make_bucket)
    load(bucket, 2000)
    evict_all(bucket)
    reads = StoreReads(bucket)
    negatives = bucket.stats()["ep_bfilter_negatives"]  # the 2000 new keys' SETs were answered so too
    misses = 0
    for i in range(5000):
        key = f"absent{i}".encode()
        with pytest.raises(EngineError) as e:
            vb_of(bucket, key).get(key)
        assert e.value.status == Status.KEY_ENOENT
        misses += 1
    assert reads.n <= misses * 0.05  # a 1% false-positive filter: a few reads, not one per miss
    stats = bucket.stats()
    assert stats["ep_bfilter_negatives"] - negatives == misses - reads.n
    assert stats["ep_bfilter_false_positives"] == reads.n
    # an ADD of a new key needs no store read either (most of the time)
    before = reads.n
    for i in range(1000):
        key = f"new{i}".encode()
        vb_of(bucket, key).add(key, b"1")
    assert reads.n - before <= 50
    assert bucket.stats()["curr_items"] == 3000


def test_a_get_of_a_non_resident_document_fetches_it_back(make_bucket):
    bucket = full(make_bucket)
    load(bucket, 50, flags=7)
    evict_all(bucket)
    reads = StoreReads(bucket)
    vb = vb_of(bucket, b"k3")
    item = vb.get(b"k3")
    assert (item.value, item.flags) == (b'{"n": 3}', 7)
    assert reads.n == 1 and bucket.stats()["ep_bg_fetched"] == 1
    assert vb.ht.get(b"k3") == item  # resident again: the next read touches no store
    assert vb.get(b"k3") == item and reads.n == 1
    assert vb.get_meta(b"k4").by_seqno > 0  # GetMeta too


def test_cas_on_a_non_resident_document_sees_the_disk_version(make_bucket):
    bucket = full(make_bucket)
    cas = load(bucket, 20)
    evict_all(bucket)
    vb = vb_of(bucket, b"k5")
    with pytest.raises(EngineError) as e:
        vb.set(b"k5", b"x", cas=cas[b"k5"] + 1)
    assert e.value.status == Status.KEY_EEXISTS
    vb.evict_key(b"k5")
    item = vb.set(b"k5", b"x", cas=cas[b"k5"])
    assert item.rev_seqno == 2  # the disk version's rev seqno + 1: an update, not a create
    assert vb.num_items == sum(1 for i in range(20) if vbucket_for_key(f"k{i}".encode(), 4) == vb.id)
    assert bucket.stats()["curr_items"] == 20
    vb6 = vb_of(bucket, b"k6")
    item = vb6.replace(b"k6", b"y", cas=cas[b"k6"])  # REPLACE of a key only on disk
    assert item.rev_seqno == 2
    assert bucket.stats()["ep_bg_meta_fetched"] >= 2


def test_add_of_a_key_only_on_disk_is_refused_and_a_deleted_one_is_not(make_bucket):
    bucket = full(make_bucket)
    load(bucket, 20)
    vb = vb_of(bucket, b"k8")
    vb.delete(b"k8")
    evict_all(bucket)
    with pytest.raises(EngineError) as e:
        vb_of(bucket, b"k7").add(b"k7", b"again")
    assert e.value.status == Status.KEY_EEXISTS
    item = vb.add(b"k8", b"back")  # its tombstone is on disk: an ADD over it creates, with its rev seqno + 1
    assert item.rev_seqno == 3
    assert bucket.stats()["curr_items"] == 20


def test_delete_touch_and_subdoc_reads_of_non_resident_documents(make_bucket):
    bucket = full(make_bucket)
    load(bucket, 20)
    evict_all(bucket)
    vb = vb_of(bucket, b"k2")
    tomb = vb.delete(b"k2")
    assert tomb.deleted and tomb.rev_seqno == 2
    assert bucket.stats()["curr_items"] == 19
    vb9 = vb_of(bucket, b"k9")
    assert vb9.touch(b"k9", 100).value == b'{"n": 9}'
    vb10 = vb_of(bucket, b"k10")
    current = vb10.current(b"k10")  # what sub-document commands read and then write over
    assert current is not None and not current.deleted
    vb10.write_version(b"k10", current, b'{"n": 10, "x": 1}', datatype=1)
    assert vb10.get(b"k10").value == b'{"n": 10, "x": 1}'
    assert bucket.stats()["curr_items"] == 19


def test_expiry_of_non_resident_documents(make_bucket, clock):
    bucket = full(make_bucket, clock=clock)
    load(bucket, 10, expiry=60)
    load(bucket, 10, prefix="keep")
    evict_all(bucket)
    clock.advance(120)
    with pytest.raises(EngineError) as e:  # a read of an expired one expires it
        vb_of(bucket, b"k0").get(b"k0")
    assert e.value.status == Status.KEY_ENOENT
    assert bucket.run_expiry_pager() == 9  # the expiry pager finds the others on disk
    assert bucket.stats()["curr_items"] == 10
    tomb = vb_of(bucket, b"k3").ht[b"k3"]
    assert tomb.deleted and tomb.delete_source.name == "TTL"


@pytest.mark.parametrize("clean", [True, False], ids=["stats-kept-at-shutdown", "after-a-crash"])
def test_warm_up_with_full_eviction_loads_no_documents(make_bucket, tmp_path, clock, clean):
    """A clean shutdown keeps the stats (a warm-up reads only the key index); after a crash the
    warm-up walks the rows for them: the same result either way."""
    bucket = full(make_bucket, clock=clock)
    load(bucket, 300)
    load(bucket, 5, prefix="ttl", expiry=60)
    vb_of(bucket, b"k1").delete(b"k1")
    bucket.flush_all()
    bucket.close(clean=clean)
    again = make_bucket(clock=clock)  # the stored policy
    assert again.eviction_policy == FULL_EVICTION
    assert all(len(vb.ht) == 0 for vb in again.vbuckets.values())
    assert again.memory.meta == 0 and again.memory.values == 0
    stats = again.stats()
    assert stats["curr_items"] == 304
    assert sum(vb.num_deleted for vb in again.vbuckets.values()) == 1
    reads = StoreReads(again)
    for i in range(300):
        key = f"k{i}".encode()
        if i == 1:
            with pytest.raises(EngineError):
                vb_of(again, key).get(key)
        else:
            assert vb_of(again, key).get(key).value == b'{"n": %d}' % i
    assert reads.n == 300
    for i in range(200):  # the filters were built at warm-up
        key = f"none{i}".encode()
        with pytest.raises(EngineError):
            vb_of(again, key).get(key)
    assert reads.n <= 310
    clock.advance(120)
    assert again.run_expiry_pager() == 5  # expiry times were loaded, not the documents
    assert again.stats()["curr_items"] == 299


def test_the_pager_removes_whole_entries_under_the_quota_and_every_document_reads_back(make_bucket):
    bucket = full(make_bucket, memory_quota=4 * MiB)
    n = 0
    while n < 30_000:
        key = f"doc{n}".encode()
        try:
            vb_of(bucket, key).set(key, b"x" * 200)
        except EngineError as e:
            assert e.status == Status.ETMPFAIL
            bucket.flush_all()
            bucket.evict()
            continue
        n += 1
    bucket.flush_all()
    while bucket.pager.wanted():
        bucket.evict()
    resident = sum(len(vb.ht) for vb in bucket.vbuckets.values())
    assert resident < n // 2  # 30,000 entries would not fit 4 MiB with the metadata they carry
    assert bucket.memory.used <= bucket.memory.high_wat
    assert bucket.stats()["curr_items"] == n
    for i in range(n):
        key = f"doc{i}".encode()
        assert vb_of(bucket, key).get(key).value == b"x" * 200
        if bucket.pager.wanted():
            bucket.evict()


def test_the_filter_grows_past_its_size_and_keeps_every_key(make_bucket):
    bucket = full(make_bucket, num_vbuckets=1)
    vb = bucket.vbucket(0)
    first = vb._filter.capacity
    load(bucket, first + 500)
    assert vb._filter.capacity > first
    evict_all(bucket)
    for i in range(first + 500):
        assert f"k{i}".encode() in vb._filter


def test_switching_policies_on_a_live_bucket(make_bucket):
    bucket = make_bucket()
    bucket.create_vbuckets(range(4), VBucketState.ACTIVE)
    assert bucket.eviction_policy == VALUE_ONLY and bucket.stats()["ep_bfilter_enabled"] == 0
    load(bucket, 100)
    bucket.set_eviction_policy(FULL_EVICTION)
    evict_all(bucket)
    assert bucket.stats()["curr_items"] == 100
    bucket.set_eviction_policy(VALUE_ONLY)  # every key's metadata comes back, values stay on disk
    assert sum(len(vb.ht) for vb in bucket.vbuckets.values()) == 100
    assert all(i.value is NOT_RESIDENT for vb in bucket.vbuckets.values() for i in vb.ht.values())
    assert vb_of(bucket, b"k4").get(b"k4").value == b'{"n": 4}'
    bucket.close()
    assert make_bucket().eviction_policy == VALUE_ONLY
    with pytest.raises(ValueError):
        make_bucket(eviction_policy="nruEviction")


def test_dropping_a_collection_uncounts_its_documents_on_disk(make_bucket):
    bucket = full(make_bucket, num_vbuckets=1)
    manifest = bucket.change_manifest(lambda m: m.add_collection("_default", "orders"))
    cid = manifest.collection("_default", "orders").uid
    vb = bucket.vbucket(0)
    for i in range(20):
        vb.set((cid, b"o%d" % i), b"{}")
        vb.set(b"d%d" % i, b"{}")
    evict_all(bucket)
    assert vb.num_items == 40 and vb.collection_items(cid) == 20
    bucket.change_manifest(lambda m: m.drop_collection("_default", "orders"))
    assert vb.num_items == 20 and bucket.stats()["curr_items"] == 20


def test_a_read_off_the_owner_thread_is_not_kept_if_the_key_was_evicted_again_meanwhile(make_bucket):
    """The server reads a non-resident document on a worker (`get(fetch=False)`, then `restore`):
    a read that began before the key was written and evicted again is stale and not kept."""
    bucket = full(make_bucket, num_vbuckets=1)
    vb = bucket.vbucket(0)
    vb.set(b"k", b"v1")
    evict_all(bucket)
    with pytest.raises(EngineError) as e:
        vb.get(b"absent", fetch=False)  # the filter answers, no stand-in
    assert e.value.status == Status.KEY_ENOENT
    stand_in = vb.get(b"k", fetch=False)
    assert stand_in.value is NOT_RESIDENT and b"k" not in vb.ht
    evicted = vb.evicted
    stale = bucket.store.read(0, b"k")  # the worker's read...
    vb.set(b"k", b"v2")  # ...while the key is written, persisted and evicted again
    evict_all(bucket)
    assert vb.restore(b"k", stale, evicted) is stale and b"k" not in vb.ht  # not kept
    assert vb.get(b"k").value == b"v2"
    evict_all(bucket)
    evicted = vb.evicted
    vb.restore(b"k", bucket.store.read(0, b"k"), evicted)  # a current read is kept
    assert vb.ht[b"k"].value == b"v2"
