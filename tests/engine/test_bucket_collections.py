"""Scopes and collections in the engine: the bucket's manifest, the system events each active
vbucket takes for it, documents kept with their collection (keys, counts, high seqnos, maxTTL),
dropping (logically at once, physically later), history collections in the checkpoints, and all of
it across restarts, clean or not."""

import pytest

from dcpflow.engine import VBucketState
from dcpflow.engine.collections import SYSTEM_CID, ManifestError, SystemEvent
from dcpflow.engine.errors import EngineError
from dcpflow.protocol.dcp import SystemEventId
from dcpflow.protocol.status import Status


def events_of(vb) -> list[tuple]:
    """(seqno, event, collection or scope id) of the system events in the vbucket's checkpoints."""
    out = []
    for cp in vb.checkpoint_manager.checkpoints:
        for it in cp.items():
            if it.cid == SYSTEM_CID:
                ev = SystemEvent.of(it)
                out.append((it.by_seqno, ev.event, ev.collection.uid if ev.collection else ev.scope_id))
    return out


@pytest.fixture
def two(make_bucket, clock):
    """Vbuckets 0 and 1 active, 2 a replica; scope `app` with `orders` (maxTTL 60) and `events`
    (history)."""
    b = make_bucket(clock=clock)
    for vb, state in ((0, VBucketState.ACTIVE), (1, VBucketState.ACTIVE), (2, VBucketState.REPLICA)):
        b.set_vbucket_state(vb, state)
    b.change_manifest(lambda m: m.add_scope("app"))
    b.change_manifest(lambda m: m.add_collection("app", "orders", max_ttl=60))
    b.change_manifest(lambda m: m.add_collection("app", "events", history=True))
    return b


ORDERS, EVENTS = 8, 9


def test_each_change_is_a_system_event_in_every_active_vbucket(two):
    assert two.manifest.uid == 3
    for vbid in (0, 1):
        vb = two.vbucket(vbid)
        assert events_of(vb) == [(1, SystemEventId.CREATE_SCOPE, 8), (2, SystemEventId.BEGIN_COLLECTION, ORDERS),
                                 (3, SystemEventId.BEGIN_COLLECTION, EVENTS)]
        assert vb.high_seqno == 3 and vb.collections.uid == 3 and vb.num_items == 0
        assert sorted(vb.collections.collections) == [0, ORDERS, EVENTS]
    assert two.vbucket(2).high_seqno == 0  # a replica gets its events from its active
    with pytest.raises(ManifestError):
        two.change_manifest(lambda m: m.add_scope("app"))
    assert two.manifest.uid == 3 and two.vbucket(0).high_seqno == 3


def test_keys_are_kept_with_their_collection(two, clock):
    vb = two.vbucket(0)
    vb.set(b"k", b"default")
    vb.set((ORDERS, b"k"), b"an order")
    vb.set((EVENTS, b"k"), b"an event")
    vb.set(b"\x08k", b"not collection 8")  # a default key that looks like a prefixed one
    assert vb.get(b"k").value == b"default" and vb.get((ORDERS, b"k")).value == b"an order"
    assert vb.get((EVENTS, b"k")).value == b"an event" and vb.get(b"\x08k").cid == 0
    assert vb.get((ORDERS, b"k")).cid == ORDERS
    vb.replace((ORDERS, b"k"), b"order 2")
    vb.delete((EVENTS, b"k"))
    with pytest.raises(EngineError) as e:
        vb.get((EVENTS, b"k"))
    assert e.value.status == Status.KEY_ENOENT
    assert vb.get(b"k").value == b"default"
    with pytest.raises(EngineError):
        vb.add((ORDERS, b"k"), b"exists")
    vb.add((EVENTS, b"k"), b"again")
    assert vb.num_items == 4
    assert [vb.collection_items(c) for c in (0, ORDERS, EVENTS)] == [2, 1, 1]
    # high seqnos per collection: the default one's without a write of its own on its path
    assert vb.collection_high_seqno(ORDERS) == 8 and vb.collection_high_seqno(EVENTS) == 10
    assert vb.collection_high_seqno(0) == 7 and vb.high_seqno == 10
    vb.set(b"z", b"")
    assert vb.collection_high_seqno(0) == vb.high_seqno == 11
    # the checkpoint de-duplicates per collection (and not at all for `events`, which keeps history)
    keys = [(it.cid, it.key, it.by_seqno) for it in vb.checkpoint_manager.open_checkpoint.items()
            if it.cid != SYSTEM_CID]
    assert keys == [(0, b"k", 4), (EVENTS, b"k", 6), (0, b"\x08k", 7), (ORDERS, b"k", 8), (EVENTS, b"k", 9),
                    (EVENTS, b"k", 10), (0, b"z", 11)]


def test_a_collections_max_ttl_caps_every_expiry(two, clock):
    vb = two.vbucket(0)
    now = int(clock())
    assert vb.set((ORDERS, b"none"), b"").expiry == now + 60
    assert vb.set((ORDERS, b"later"), b"", expiry=3600).expiry == now + 60
    assert vb.set((ORDERS, b"sooner"), b"", expiry=10).expiry == now + 10
    assert vb.touch((ORDERS, b"sooner"), 0).expiry == now + 60
    assert vb.add((ORDERS, b"added"), b"").expiry == now + 60
    assert vb.set((EVENTS, b"free"), b"").expiry == 0 and vb.set(b"default", b"").expiry == 0
    two.change_manifest(lambda m: m.update_collection("app", "orders", max_ttl=0))
    assert vb.set((ORDERS, b"none"), b"").expiry == 0
    assert events_of(vb)[-1][1] == SystemEventId.MODIFY_COLLECTION
    clock.advance(61)
    assert vb.expire_due() == 3  # the capped ones expire with their collection's TTL ("none" was rewritten)
    assert vb.collection_items(ORDERS) == 1


def test_dropping_a_collection_forgets_it_at_once_and_purges_it_once_persisted(two):
    vb = two.vbucket(0)
    for i in range(5):
        vb.set((ORDERS, b"o%d" % i), b"x")
    vb.set(b"d", b"x")
    two.flush_all()
    assert two.store.count(0) == (6, 0)
    two.change_manifest(lambda m: m.drop_collection("app", "orders"))
    assert vb.num_items == 1 and vb.collection_items(ORDERS) == 0 and ORDERS not in vb.collections
    assert not any(k.__class__ is tuple and k[0] == ORDERS for k in vb.ht)
    assert events_of(vb)[-1][1:] == (SystemEventId.END_COLLECTION, ORDERS)
    assert two.dropped_collections == {ORDERS}
    assert two.store.count(0) == (6, 0)  # physically later
    assert two.purge_dropped_collections() == 0  # the drop event is not persisted yet
    two.flush_all()
    assert two.purge_dropped_collections() == 5
    assert two.store.count(0) == (1, 0) and two.dropped_collections == set()
    drop_row = two.store.get(0, b"\x00\x08", cid=SYSTEM_CID)  # collection 8's event key
    assert drop_row.deleted  # the drop event itself stays until tombstones are purged


def test_scopes_collections_and_documents_survive_a_clean_restart(make_bucket, clock):
    b = make_bucket(clock=clock)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    b.change_manifest(lambda m: m.add_scope("app"))
    b.change_manifest(lambda m: m.add_collection("app", "orders", max_ttl=60))
    b.change_manifest(lambda m: m.add_collection("app", "gone"))
    vb = b.vbucket(0)
    vb.set((8, b"a"), b"1")
    vb.set((9, b"g"), b"dropped later")
    vb.set(b"a", b"default")
    b.flush_all()
    b.change_manifest(lambda m: m.drop_collection("app", "gone"))  # dropped, not purged
    vb.set((8, b"b"), b"2")
    high, uid = vb.high_seqno, b.manifest.uid
    b.close()
    again = make_bucket(clock=clock)
    assert again.manifest == b.manifest and again.dropped_collections == {9}
    vb = again.vbucket(0)
    assert vb.high_seqno == high and vb.collections.uid == uid
    assert vb.get((8, b"a")).value == b"1" and vb.get((8, b"b")).value == b"2" and vb.get(b"a").cid == 0
    assert (9, b"g") not in vb.ht and vb.num_items == 3 and vb.collection_items(8) == 2
    assert vb.collection_high_seqno(8) == high and vb.collection_high_seqno(0) == 6
    assert vb.collections.max_ttl(8) == 60 and sorted(vb.collections.collections) == [0, 8]
    assert events_of(vb) == []  # nothing owed
    assert again.purge_dropped_collections() == 1 and again.dropped_collections == set()


def test_events_lost_in_a_crash_are_made_again_at_warm_up(make_bucket, clock):
    b = make_bucket(clock=clock)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    b.flush_all()
    b.change_manifest(lambda m: m.add_scope("app"))
    b.change_manifest(lambda m: m.add_collection("app", "c"))
    b.close(clean=False)  # the manifest is in the store, the events were never flushed
    again = make_bucket(clock=clock)
    vb = again.vbucket(0)
    assert again.manifest.uid == 2 and 8 in vb.collections
    assert [e[1:] for e in events_of(vb)] == [(SystemEventId.CREATE_SCOPE, 8), (SystemEventId.BEGIN_COLLECTION, 8)]
    assert vb.collections.uid == 2


def test_a_new_vbucket_and_a_bucket_flush_get_the_whole_manifest(two):
    two.set_vbucket_state(3, VBucketState.ACTIVE)
    assert [e[1:] for e in events_of(two.vbucket(3))] == [
        (SystemEventId.CREATE_SCOPE, 8), (SystemEventId.BEGIN_COLLECTION, ORDERS),
        (SystemEventId.BEGIN_COLLECTION, EVENTS)]
    two.set_vbucket_state(2, VBucketState.ACTIVE)  # a replica promoted
    assert len(events_of(two.vbucket(2))) == 3
    two.vbucket(0).set((ORDERS, b"x"), b"")
    two.reset()
    assert two.vbucket(0).num_items == 0 and two.vbucket(0).high_seqno == 3 and ORDERS in two.vbucket(0).collections


def test_a_history_collection_keeps_every_version_in_the_checkpoint(two):
    vb = two.vbucket(0)
    for i in range(3):
        vb.set((EVENTS, b"e"), b"v%d" % i)
        vb.set((ORDERS, b"o"), b"v%d" % i)
    cp = vb.checkpoint_manager.open_checkpoint
    assert [(it.cid, it.value) for it in cp.items() if it.cid in (ORDERS, EVENTS)] == [
        (EVENTS, b"v0"), (EVENTS, b"v1"), (EVENTS, b"v2"), (ORDERS, b"v2")]
    cursor = vb.checkpoint_manager.register_cursor("t", 0).cursor
    snap, = cursor.next_batch()
    assert snap.history and snap.duplicates
    vb.checkpoint_manager.create_checkpoint()
    vb.set((EVENTS, b"once"), b"")
    snap, = cursor.next_batch()
    assert snap.history and not snap.duplicates
    vb.checkpoint_manager.create_checkpoint()
    vb.set((ORDERS, b"o"), b"")
    snap, = cursor.next_batch()
    assert not snap.history


def test_rollback_keeps_the_collections_a_vbucket_had(two):
    vb = two.vbucket(0)
    vb.set((ORDERS, b"a"), b"1")
    two.flush_all()
    at = vb.high_seqno
    vb.set((ORDERS, b"b"), b"2")
    two.flush_all()
    assert two.rollback(0, at) == at
    vb = two.vbucket(0)
    assert ORDERS in vb.collections and vb.get((ORDERS, b"a")).value == b"1" and (ORDERS, b"b") not in vb.ht
    assert vb.collection_items(ORDERS) == 1


def test_history_retention_by_age_purges_older_versions_and_moves_history_start(make_bucket, clock):
    b = make_bucket(clock=clock, hlc_clock=lambda: int(clock() * 1e9))
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    b.change_manifest(lambda m: m.add_scope("app"))
    b.change_manifest(lambda m: m.add_collection("app", "events", history=True))  # id 8
    vb = b.vbucket(0)
    for i in range(3):
        vb.set((8, b"e"), b"old%d" % i)  # seqnos 3, 4, 5
        b.flush_all()
    clock.advance(100)
    vb.set((8, b"e"), b"new")  # 6
    b.flush_all()
    with b.store.scan(0, 0, 6, history=frozenset({8})) as scan:
        assert [(i.by_seqno, i.value) for i in scan if i.cid == 8] == [(3, b"old0"), (4, b"old1"), (5, b"old2"),
                                                                       (6, b"new")]
    b.history_retention_seconds = 50
    b.compact()
    assert vb.history_start == 6  # old0..old2 were written 100 s ago
    with b.store.scan(0, 0, 6, history=frozenset({8})) as scan:
        assert [(i.by_seqno, i.value) for i in scan if i.cid == 8] == [(6, b"new")]
    b.close()
    assert make_bucket(clock=clock).vbucket(0).history_start == 6  # kept across a restart
