"""Expiry: exptime conversion, expiry on access and by the pager (expirations with delete time)."""

import pytest

from dcpflow.engine import (
    DeleteSource,
    EngineError,
    Item,
    VBucketState,
    is_expired,
    run_expiry_pager,
    to_absolute,
)
from dcpflow.engine.expiry import RELATIVE_EXPIRY_LIMIT
from dcpflow.protocol.status import Status

NOW = 1_700_000_000


def test_to_absolute():
    assert to_absolute(0, NOW) == 0
    assert to_absolute(1, NOW) == NOW + 1
    assert RELATIVE_EXPIRY_LIMIT == 2_592_000
    assert to_absolute(2_592_000, NOW) == NOW + 2_592_000  # 30 days exactly is still relative
    assert to_absolute(2_592_001, NOW) == 2_592_001  # beyond: already absolute (long past: expires at once)
    assert to_absolute(NOW + 50, NOW) == NOW + 50
    with pytest.raises(ValueError):
        to_absolute(-1, NOW)


def test_is_expired():
    assert not is_expired(Item(b"k", b"", expiry=0), NOW)
    assert not is_expired(Item(b"k", b"", expiry=NOW + 1), NOW)
    assert is_expired(Item(b"k", b"", expiry=NOW), NOW)
    assert not is_expired(Item(b"k", b"", expiry=NOW - 5, deleted=True), NOW)


def last_queued(vb):
    return vb.checkpoint_manager.open_checkpoint.items()[-1]


def test_get_of_an_expired_document_makes_an_expiration(bucket, clock):
    vb = bucket.vbucket(0)
    live = vb.set(b"k", b"v", expiry=10)
    assert live.expiry == int(clock.now) + 10
    clock.advance(10)
    with pytest.raises(EngineError) as exc:
        vb.get(b"k")
    assert exc.value.status == Status.KEY_ENOENT
    tomb = vb.get_meta(b"k")
    assert tomb.deleted and tomb.delete_source == DeleteSource.TTL and tomb.is_expiration
    assert (tomb.by_seqno, tomb.rev_seqno, tomb.delete_time) == (2, 2, int(clock.now))
    assert tomb.cas > live.cas
    assert last_queued(vb) == tomb  # DCP will stream it as an Expiration


def test_get_meta_also_expires(bucket, clock):
    vb = bucket.vbucket(0)
    vb.set(b"k", b"v", expiry=1)
    clock.advance(2)
    assert vb.get_meta(b"k").is_expiration


def test_add_over_an_expired_document_succeeds(bucket, clock):
    vb = bucket.vbucket(0)
    vb.set(b"k", b"v", expiry=1)
    clock.advance(5)
    item = vb.add(b"k", b"new")
    assert item.by_seqno == 3 and item.rev_seqno == 3  # 2 was the expiration


def test_replace_touch_delete_of_expired_are_enoent(bucket, clock):
    vb = bucket.vbucket(0)
    for key in (b"a", b"b", b"c"):
        vb.set(key, b"v", expiry=1)
    clock.advance(1)
    for op, args in ((vb.replace, (b"a", b"v")), (vb.touch, (b"b", 5)), (vb.delete, (b"c",))):
        with pytest.raises(EngineError) as exc:
            op(*args)
        assert exc.value.status == Status.KEY_ENOENT


def test_pager_expires_due_documents_only(bucket, clock):
    vb = bucket.vbucket(0)
    vb.set(b"soon", b"v", expiry=5)
    vb.set(b"later", b"v", expiry=500)
    vb.set(b"never", b"v")
    vb.set(b"reset", b"v", expiry=5)
    vb.set(b"reset", b"v2")  # re-set without expiry: the old schedule must be ignored
    clock.advance(10)
    assert run_expiry_pager(bucket) == 1
    assert vb.get_meta(b"soon").is_expiration
    assert vb.get(b"later").value == b"v" and vb.get(b"reset").value == b"v2"
    assert run_expiry_pager(bucket) == 0
    clock.advance(1000)
    assert bucket.run_expiry_pager() == 1


def test_pager_limit(bucket, clock):
    vb = bucket.vbucket(0)
    for i in range(10):
        vb.set(b"k%d" % i, b"v", expiry=1)
    clock.advance(2)
    assert bucket.run_expiry_pager(limit=4) == 4
    assert bucket.run_expiry_pager() == 6


def test_pager_skips_replicas(bucket, clock):
    vb = bucket.vbucket(0)
    vb.set(b"k", b"v", expiry=1)
    bucket.set_vbucket_state(0, VBucketState.REPLICA)
    clock.advance(2)
    assert bucket.run_expiry_pager() == 0
    bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    assert bucket.run_expiry_pager() == 1


def test_expiry_schedule_survives_restart(make_bucket, clock):
    b = make_bucket(clock=clock)
    b.set_vbucket_state(0, VBucketState.ACTIVE).set(b"k", b"v", expiry=60)
    b.close()
    again = make_bucket(clock=clock)
    clock.advance(61)
    assert again.run_expiry_pager() == 1
    assert again.vbucket(0).get_meta(b"k").is_expiration
