"""GET_LOCKED / UNLOCK_KEY in the engine (BinaryProtocol.md#0x94-get-locked, #0x95-unlock-key):
the lock's CAS, what a locked document refuses, how a lock ends, and that it is memory only."""

import pytest

from dcpflow.engine import EngineError, VBucketState
from dcpflow.protocol.status import Status


def status_of(fn, *args, **kwargs) -> Status:
    with pytest.raises(EngineError) as exc:
        fn(*args, **kwargs)
    return exc.value.status


@pytest.fixture
def vb(bucket):
    vb = bucket.vbucket(0)
    vb.set(b"k", b"v1", flags=7)
    return vb


def test_locking_gives_a_new_cas_without_a_new_version(vb):
    before = vb.get(b"k")
    high = vb.high_seqno
    locked = vb.get_locked(b"k", 15)
    assert locked.cas > before.cas
    assert (locked.value, locked.flags, locked.by_seqno, locked.rev_seqno) == (b"v1", 7, before.by_seqno, 1)
    assert vb.high_seqno == high  # nothing queued: DCP sees no change
    assert vb.get(b"k").cas == locked.cas == vb.lock_cas(b"k")


def test_a_locked_document_refuses_mutations_without_the_lock_cas(vb):
    locked = vb.get_locked(b"k", 15)
    assert status_of(vb.set, b"k", b"x") == Status.LOCKED
    assert status_of(vb.set, b"k", b"x", cas=locked.cas - 1) == Status.LOCKED
    assert status_of(vb.replace, b"k", b"x") == Status.LOCKED
    assert status_of(vb.delete, b"k") == Status.LOCKED
    assert status_of(vb.touch, b"k", 100) == Status.LOCKED  # no CAS to give
    assert status_of(vb.get_and_touch, b"k", 100) == Status.LOCKED
    assert status_of(vb.add, b"k", b"x") == Status.KEY_EEXISTS
    assert status_of(vb.get_locked, b"k", 15) == Status.LOCKED
    assert vb.get(b"k").value == b"v1"


def test_a_mutation_with_the_lock_cas_succeeds_and_unlocks(vb):
    locked = vb.get_locked(b"k", 15)
    item = vb.replace(b"k", b"v2", cas=locked.cas)
    assert item.cas != locked.cas and vb.lock_cas(b"k") is None
    vb.set(b"k", b"v3")  # no lock any more
    locked = vb.get_locked(b"k", 15)
    vb.delete(b"k", cas=locked.cas)
    assert vb.lock_cas(b"k") is None and status_of(vb.get, b"k") == Status.KEY_ENOENT


def test_the_lock_expires(vb, clock):
    vb.get_locked(b"k", 5)
    clock.advance(4.9)
    assert status_of(vb.set, b"k", b"x") == Status.LOCKED
    clock.advance(0.1)
    vb.set(b"k", b"x")
    assert vb.locks == {}


def test_unlock_decision_tree(vb):
    assert status_of(vb.unlock, b"missing", 1) == Status.KEY_ENOENT
    assert status_of(vb.unlock, b"k", vb.get(b"k").cas) == Status.NOT_LOCKED
    locked = vb.get_locked(b"k", 15)
    assert status_of(vb.unlock, b"k", locked.cas + 1) == Status.LOCKED
    vb.unlock(b"k", locked.cas)
    assert vb.lock_cas(b"k") is None
    assert vb.get(b"k").cas == locked.cas  # the lock's CAS stays the document's
    vb.set(b"k", b"v2")


def test_get_locked_needs_a_live_active_document(vb, clock):
    assert status_of(vb.get_locked, b"missing", 15) == Status.KEY_ENOENT
    vb.set(b"gone", b"x", expiry=10)
    clock.advance(11)
    assert status_of(vb.get_locked, b"gone", 15) == Status.KEY_ENOENT
    vb.set_state(VBucketState.REPLICA)
    assert status_of(vb.get_locked, b"k", 15) == Status.NOT_MY_VBUCKET


def test_expiry_of_a_locked_document_ends_the_lock(vb, clock):
    vb.set(b"e", b"x", expiry=10)
    vb.get_locked(b"e", 30)
    clock.advance(11)
    assert status_of(vb.get, b"e") == Status.KEY_ENOENT
    assert b"e" not in vb.locks
    vb.add(b"e", b"again")


def test_a_state_change_forgets_locks(vb):
    vb.get_locked(b"k", 15)
    vb.set_state(VBucketState.REPLICA)
    vb.set_state(VBucketState.ACTIVE)
    assert vb.locks == {}
    vb.set(b"k", b"x")


def test_locks_and_the_lock_cas_are_not_persisted(make_bucket, clock):
    bucket = make_bucket(clock=clock)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    stored = vb.set(b"k", b"v1")
    bucket.flush_all()
    vb.get_locked(b"k", 15)
    bucket.close()
    again = make_bucket(clock=clock)
    vb = again.vbucket(0)
    assert vb.locks == {} and vb.get(b"k").cas == stored.cas
    vb.set(b"k", b"v2")
