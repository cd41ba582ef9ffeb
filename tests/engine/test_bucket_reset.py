"""Bucket.create_vbuckets (a new bucket's vbuckets in one transaction) and Bucket.reset (the
bucket flush: every vbucket emptied with a new failover log)."""

import pytest

from dcpflow.engine import EngineError, VBucketState
from dcpflow.protocol.status import Status


def test_create_vbuckets_persists_every_state_and_refuses_bad_ids(make_bucket):
    b = make_bucket()
    b.create_vbuckets(range(3), VBucketState.ACTIVE)
    assert {v: vb.state for v, vb in b.vbuckets.items()} == dict.fromkeys(range(3), VBucketState.ACTIVE)
    assert all(len(vb.failover.entries) == 1 and vb.failover.entries[0].seqno == 0 for vb in b.vbuckets.values())
    with pytest.raises(EngineError) as e:
        b.create_vbuckets([2], VBucketState.REPLICA)
    assert e.value.status == Status.KEY_EEXISTS
    with pytest.raises(EngineError) as e:
        b.create_vbuckets([4], VBucketState.REPLICA)
    assert e.value.status == Status.EINVAL
    uuids = {v: vb.uuid for v, vb in b.vbuckets.items()}
    b.close()
    again = make_bucket()
    assert {v: vb.uuid for v, vb in again.vbuckets.items()} == uuids


def test_reset_empties_every_vbucket_with_a_new_history(make_bucket):
    b = make_bucket()
    b.create_vbuckets(range(4), VBucketState.ACTIVE)
    b.set_vbucket_state(3, VBucketState.REPLICA)
    keys = [k for k in (f"k{i}".encode() for i in range(20)) if b.vbucket_for_key(k) != 3]  # actives only
    for key in keys:
        b.vbucket(b.vbucket_for_key(key)).set(key, b"v")
    b.flush_all()
    before = {v: vb.uuid for v, vb in b.vbuckets.items()}
    written = b.stats()["curr_items"]
    heard = []
    b.add_vbucket_listener(lambda vbid, event: heard.append((vbid, event)))
    assert b.reset() == written > 0
    assert sorted(heard) == [(v, "deleted") for v in range(4)]
    assert b.stats()["curr_items"] == 0 and all(vb.high_seqno == 0 for vb in b.vbuckets.values())
    assert b.vbucket(3).state == VBucketState.REPLICA  # states are kept
    assert all(b.vbucket(v).uuid != before[v] for v in range(4))
    assert b.vbucket(b.vbucket_for_key(keys[0])).set(keys[0], b"new").by_seqno == 1
    b.close()
    again = make_bucket()
    assert {v: vb.uuid for v, vb in again.vbuckets.items()} == {v: b.vbuckets[v].uuid for v in range(4)}
    assert again.stats()["curr_items"] == 1


def test_reset_refuses_while_a_flush_batch_is_in_flight(make_bucket):
    b = make_bucket()
    b.create_vbuckets(range(4), VBucketState.ACTIVE)
    b.vbucket(b.vbucket_for_key(b"x")).set(b"x", b"v")
    batch = b.flusher.collect()
    with pytest.raises(RuntimeError):
        b.reset()
    b.flusher.write(batch)
    b.flusher.complete(batch)
    assert b.reset() == 1
