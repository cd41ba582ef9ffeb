"""The engine side of fault injection: `Bucket.failover` (clean: a new failover entry at the high
seqno, nothing lost; unclean: what was not persisted is lost, nothing more is written, the entry
goes where warm-up after kill -9 puts it), `Bucket.rollback(..., new_branch=True)` (an active
rolled back as an unclean restart would: a new entry where it now stands) and
`CheckpointManager.drop_cursor` (a cursor dropped on demand, as memory pressure drops it)."""

import pytest

from dcpflow.engine import CheckpointManager, CursorDropped, Item, VBucketState
from dcpflow.engine.errors import EngineError
from dcpflow.protocol.status import Status

MAX = 2**64 - 1


def fill(vb, n, prefix=b"k", value=b"v"):
    return [vb.set(prefix + b"%d" % i, value) for i in range(n)]


def decide(vb, start, uuid, snap=None):
    """The producer's decision for a consumer at `start` on branch `uuid`."""
    snap_start, snap_end = snap or (start, start)
    return vb.failover.rollback_decision(start_seqno=start, end_seqno=MAX, vb_uuid=uuid, snap_start_seqno=snap_start,
                                         snap_end_seqno=snap_end, high_seqno=vb.high_seqno, purge_seqno=vb.purge_seqno)


@pytest.fixture
def events(bucket):
    heard = []
    bucket.add_vbucket_listener(lambda vbid, event: heard.append((vbid, event)))
    return heard


def test_clean_failover_adds_an_entry_at_the_high_seqno_and_loses_nothing(bucket, events, make_bucket):
    vb = bucket.vbucket(0)
    fill(vb, 5)
    bucket.flush_all()
    fill(vb, 3, b"mem")  # high 8, persisted 5: a clean failover keeps these too
    old = vb.uuid
    entry = bucket.failover(0)
    assert (entry.seqno, vb.uuid) == (8, entry.uuid) and entry.uuid != old
    assert [e.seqno for e in vb.failover] == [8, 0]
    assert vb.high_seqno == 8 and vb.num_items == 8 and vb.persisted_seqno == 5
    assert events == [(0, "failover")]
    # A consumer anywhere on the old branch up to the failover point resumes without rolling back.
    assert decide(vb, 8, old).status == Status.SUCCESS
    assert decide(vb, 3, old).status == Status.SUCCESS
    vb.set(b"after", b"v")  # seqno 9, on the new branch
    bucket.close()
    again = make_bucket().vbucket(0)
    assert [(e.uuid, e.seqno) for e in again.failover] == [(entry.uuid, 8), (old, 0)]
    assert again.high_seqno == 9


def test_unclean_failover_loses_what_was_not_persisted_and_writes_nothing(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 4, value=b"old")
    b.flush_all()  # 1..4 on disk
    fill(vb, 2, value=b"new")  # k0, k1 again at 5, 6: memory only
    vb.set(b"extra", b"x")  # 7
    vb.delete(b"k2")  # 8
    persisted = []
    b.add_persistence_listener(lambda vbid, seqno: persisted.append(seqno))
    flushed = b.flusher.items_flushed
    old = vb.uuid
    entry = b.failover(0, unclean=True)
    assert entry.seqno == 4 and [e.seqno for e in vb.failover] == [4, 0]
    assert vb.high_seqno == vb.persisted_seqno == 4
    assert {k: v.value for k, v in vb.ht.items()} == {b"k0": b"old", b"k1": b"old", b"k2": b"old", b"k3": b"old"}
    assert b.flusher.items_flushed == flushed and persisted == []  # an unclean failover persists nothing
    d = decide(vb, 8, old)  # a consumer that saw the lost writes
    assert d.status == Status.ROLLBACK and d.rollback_seqno == 4
    assert decide(vb, 4, old).status == Status.SUCCESS
    # Writes continue on the new branch with the seqnos the lost ones had.
    assert vb.set(b"k0", b"newer").by_seqno == 5
    b.close()
    again = make_bucket().vbucket(0)
    assert again.ht[b"k0"].value == b"newer" and b"extra" not in again.ht and again.uuid == entry.uuid


def test_unclean_failover_with_everything_persisted_is_a_clean_one(bucket, events):
    vb = bucket.vbucket(0)
    fill(vb, 3)
    bucket.flush_all()
    entry = bucket.failover(0, unclean=True)
    assert entry.seqno == 3 and vb.high_seqno == 3 and vb.num_items == 3 and events == [(0, "failover")]


def test_only_an_active_vbucket_fails_over_and_never_mid_batch(make_bucket):
    b = make_bucket()
    b.set_vbucket_state(1, VBucketState.REPLICA)
    with pytest.raises(EngineError) as e:
        b.failover(1)
    assert e.value.status == Status.NOT_MY_VBUCKET and "replica" in str(e.value)
    with pytest.raises(EngineError):
        b.failover(2)  # does not exist
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 2)
    b.flusher.collect()
    with pytest.raises(RuntimeError):
        b.failover(0)


def test_rollback_with_a_new_branch_tells_consumers_of_the_lost_writes_to_roll_back(bucket, events, make_bucket):
    vb = bucket.vbucket(0)
    fill(vb, 6)
    bucket.flush_all()
    fill(vb, 2, b"late")  # 7, 8
    vb.checkpoint_manager.create_checkpoint()  # 8 ends a snapshot
    fill(vb, 2, b"later")  # 9, 10: memory only
    old = vb.uuid
    assert bucket.rollback(0, 8, new_branch=True) == 8  # above the persisted seqno: 7, 8 are kept
    assert events == [(0, "rollback")]
    assert vb.high_seqno == 8 and vb.num_items == 8 and set(vb.ht) >= {b"late0", b"late1"}
    assert [e.seqno for e in vb.failover] == [8, 0] and vb.uuid != old
    assert (vb.snapshot_start, vb.snapshot_end) == (8, 8)  # an active's snapshot is complete
    d = decide(vb, 10, old)
    assert d.status == Status.ROLLBACK and d.rollback_seqno == 8
    flushed = bucket.flusher.items_flushed
    assert bucket.rollback(0, 6, new_branch=True) == 6  # at or below the persisted seqno: from disk alone
    assert [e.seqno for e in vb.failover] == [6, 0] and vb.high_seqno == 6
    assert bucket.flusher.items_flushed == flushed
    bucket.close()
    assert make_bucket().vbucket(0).uuid == vb.uuid


def test_a_new_branch_inside_a_persisted_snapshot_starts_at_the_snapshot_start(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 4)  # one checkpoint, one snapshot 1..4 on disk
    b.flush_all()
    vb.set(b"k9", b"v")  # 5, so the rollback has something to discard
    assert b.rollback(0, 2, new_branch=True) == 2
    assert vb.failover.latest.seqno == 1  # warm-up's rule: 2 is inside the persisted snapshot 1..4
    assert (vb.snapshot_start, vb.snapshot_end, vb.high_seqno) == (2, 2, 2)


def test_a_branch_rolled_back_to_zero_keeps_its_fresh_log(make_bucket, clock):
    b = make_bucket(clock=clock, purge_interval=0, rollback_history_seqnos=0)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 3)
    vb.set(b"k0", b"again")
    b.flush_all()
    b.compact()  # no history below the persisted seqno: any rollback resets the vbucket
    old = vb.uuid
    assert b.rollback(0, 2, new_branch=True) == 0
    assert len(vb.failover) == 1 and vb.uuid != old and vb.failover.latest.seqno == 0


def test_drop_cursor_does_what_memory_pressure_does():
    dropped = []
    m = CheckpointManager(max_items=2, max_age=None)
    slow = m.register_cursor("slow", 0, on_drop=dropped.append).cursor
    for seqno, key in enumerate((b"a", b"b", b"c", b"d", b"e"), start=1):
        m.queue(Item(key, b"v", by_seqno=seqno))
    m.persistence_cursor.next_batch()
    m.set_persisted(5)
    held = len(m.checkpoints)
    assert held == 3  # persisted, but the slow cursor has not read them
    m.drop_cursor(slow)
    assert dropped == [slow] and slow.dropped and "slow" not in m.cursors
    assert len(m.checkpoints) < held  # what only it held is released
    assert m.num_dropped_cursors == 1
    with pytest.raises(CursorDropped):
        slow.next_batch()
    with pytest.raises(ValueError):
        m.drop_cursor(slow)  # once
    with pytest.raises(ValueError):
        m.drop_cursor(m.persistence_cursor)
    assert m.register_cursor("slow", 0).backfill_required  # its owner backfills from disk
