"""Sync writes in the engine (engine/durability/): prepares per level, SYNC_WRITE_IN_PROGRESS,
commit on acks and persistence, abort at the timeout, durable deletes, HPS/HCS/MVS, warm-up with
in-flight prepares, the replica's acknowledgements and a promoted replica re-driving its prepares."""

import dataclasses

import pytest

from dcpflow.engine import EngineError, VBucketState
from dcpflow.engine.durability import Abort, Commit, Level, Outcome, Prepare
from dcpflow.engine.item import Item
from dcpflow.protocol.status import Status

MAJ, MAJ_PERSIST, PERSIST = Level.MAJORITY, Level.MAJORITY_AND_PERSIST_ON_MASTER, Level.PERSIST_TO_MAJORITY


@pytest.fixture
def active(make_bucket, clock):
    b = make_bucket(clock=clock, checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set_topology(["a", "b"])
    return b, vb


def fields(item) -> tuple:
    """A version's fields (the hash table answers an Item for a Commit: same fields, not the same class)."""
    return tuple(getattr(item, f.name) for f in dataclasses.fields(Item))


def queued(vb):
    return [it for cp in vb.checkpoint_manager.checkpoints for it in cp.items()]


def test_majority_commits_when_the_replica_acks_and_blocks_the_key_meanwhile(active):
    _, vb = active
    vb.set(b"k", b"old")
    outcomes = []
    p = vb.prepare(b"k", b"new", level=MAJ)
    vb.on_complete(p, outcomes.append)
    assert isinstance(p, Prepare) and p.by_seqno == 2 and vb.high_seqno == 2
    assert vb.get(b"k").value == b"old"  # readers see the committed version
    for write in (lambda: vb.set(b"k", b"x"), lambda: vb.replace(b"k", b"x"), lambda: vb.delete(b"k"),
                  lambda: vb.add(b"k", b"x"), lambda: vb.prepare(b"k", b"x", level=MAJ),
                  lambda: vb.get_locked(b"k", 5)):
        with pytest.raises(EngineError) as e:
            write()
        assert e.value.status == Status.SYNC_WRITE_IN_PROGRESS
    vb.set(b"other", b"v")  # other keys are not blocked
    assert vb.complete_sync_writes() == [] and outcomes == []
    assert vb.max_visible_seqno == 3 and vb.hps == 2 and vb.hcs == 0
    vb.seqno_ack("b", 1)  # below the prepare: not yet
    assert outcomes == []
    assert vb.seqno_ack("b", 2) == [(p, Outcome.COMMITTED)]
    assert outcomes == [Outcome.COMMITTED]
    got = vb.get(b"k")  # the hash table keeps the committed version's fields (an Item); the queue its Commit
    assert got.value == b"new" and got.by_seqno == 4
    commit = vb.checkpoint_manager.open_checkpoint.items()[-1]
    assert isinstance(commit, Commit) and commit.prepared_seqno == 2 and fields(commit) == fields(got)
    assert got.cas == p.cas and vb.hcs == 2 and vb.max_visible_seqno == 4
    vb.set(b"k", b"after")  # unblocked
    # the commit is de-duplicated by the later version like any version; the prepare never is
    assert [(type(i).__name__, i.by_seqno) for i in queued(vb)] == [("Prepare", 2), ("Item", 3), ("Item", 5)]


def test_an_ack_from_a_node_outside_the_chain_does_not_count(active):
    _, vb = active
    p = vb.prepare(b"k", b"v", level=MAJ)
    vb.seqno_ack("c", p.by_seqno)
    assert vb.prepares and vb.complete_sync_writes() == []


def test_durability_impossible_without_enough_nodes(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    for chain in (None, ["a", None], ["a", None, None], ["a", "b", None, None]):
        vb.set_topology(chain)
        with pytest.raises(EngineError) as e:
            vb.prepare(b"k", b"v", level=MAJ)
        assert e.value.status == Status.DURABILITY_IMPOSSIBLE
    assert vb.high_seqno == 0
    vb.set_topology(["a", "b", None])  # 2 of 3: a majority
    vb.prepare(b"k", b"v", level=MAJ)


def test_a_chain_of_one_commits_majority_at_once_and_persist_levels_after_the_flush(make_bucket):
    b = make_bucket(checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set_topology(["a"])
    p = vb.prepare(b"k", b"v", level=MAJ)
    assert vb.complete_sync_writes() == [(p, Outcome.COMMITTED)]
    for level in (MAJ_PERSIST, PERSIST):
        p = vb.prepare(b"k", b"v%d" % level, level=level)
        assert vb.complete_sync_writes() == []
        b.flush()  # the flusher completes what waited for it
        assert b"k" not in vb.prepares and vb.get(b"k").value == b"v%d" % level


def test_persist_levels_need_the_actives_persistence_and_persist_to_majority_the_replicas_ack(active):
    b, vb = active
    p = vb.prepare(b"k", b"v", level=MAJ_PERSIST)
    vb.seqno_ack("b", p.by_seqno)
    assert b"k" in vb.prepares  # the replica has it; the active has not persisted it
    b.flush()
    assert b"k" not in vb.prepares
    p = vb.prepare(b"j", b"v", level=PERSIST)
    b.flush()  # the active persisted; a majority of 2 needs the replica's (persisted) ack too
    assert b"j" in vb.prepares
    vb.seqno_ack("b", p.by_seqno)
    assert b"j" not in vb.prepares and vb.get(b"j").value == b"v"


def test_timeout_aborts_and_leaves_the_value(active, clock):
    _, vb = active
    vb.set(b"k", b"old")
    outcomes = []
    p = vb.prepare(b"k", b"new", level=MAJ, timeout=2.0)
    vb.on_complete(p, outcomes.append)
    assert vb.next_sync_deadline() == clock.now + 2.0
    clock.advance(1.9)
    assert vb.complete_sync_writes() == []
    clock.advance(0.2)
    assert vb.complete_sync_writes() == [(p, Outcome.ABORTED)] and outcomes == [Outcome.ABORTED]
    assert vb.get(b"k").value == b"old" and vb.hcs == p.by_seqno
    abort = queued(vb)[-1]
    assert isinstance(abort, Abort) and abort.prepared_seqno == p.by_seqno and abort.by_seqno == vb.high_seqno
    assert vb.max_visible_seqno == 1  # neither the prepare nor the abort is visible
    vb.set(b"k", b"again")


def test_durable_delete_and_add_and_replace_check_like_their_plain_writes(active):
    _, vb = active
    with pytest.raises(EngineError) as e:
        vb.prepare(b"k", level=MAJ, mode="delete")
    assert e.value.status == Status.KEY_ENOENT
    with pytest.raises(EngineError) as e:
        vb.prepare(b"k", b"v", level=MAJ, mode="replace")
    assert e.value.status == Status.KEY_ENOENT
    p = vb.prepare(b"k", b"v", level=MAJ, mode="add")
    with pytest.raises(EngineError) as e:
        vb.replace(b"k", b"x")  # a pending add blocks the key even though it has no document yet
    assert e.value.status == Status.SYNC_WRITE_IN_PROGRESS
    vb.seqno_ack("b", p.by_seqno)
    with pytest.raises(EngineError) as e:
        vb.prepare(b"k", b"v", level=MAJ, mode="add")
    assert e.value.status == Status.KEY_EEXISTS
    with pytest.raises(EngineError) as e:
        vb.prepare(b"k", b"v", level=MAJ, cas=12345)
    assert e.value.status == Status.KEY_EEXISTS
    d = vb.prepare(b"k", level=MAJ, mode="delete", cas=vb.get(b"k").cas)
    assert d.deleted and vb.get(b"k").value == b"v"
    vb.seqno_ack("b", d.by_seqno)
    with pytest.raises(EngineError) as e:
        vb.get(b"k")
    assert e.value.status == Status.KEY_ENOENT
    assert vb.get_meta(b"k").deleted and vb.num_items == 0


def test_in_flight_prepares_hps_and_hcs_survive_a_crash_and_are_driven_to_commit(make_bucket, tmp_path):
    b = make_bucket(checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set_topology(["a", "b"])
    done = vb.prepare(b"done", b"1", level=PERSIST)
    vb.prepare(b"gone", b"1", level=MAJ, timeout=0)
    vb.complete_sync_writes()  # gone aborts at once
    vb.seqno_ack("b", done.by_seqno)
    b.flush()  # done commits after the flush; the commit flushes next time
    b.flush()
    inflight = vb.prepare(b"k", b"pending", level=PERSIST)
    b.flush()
    high, hcs = vb.high_seqno, vb.hcs
    # done: prepare 1, commit 4; gone: prepare 2, abort 3; k: prepare 5 - visible up to 4
    assert (high, hcs, inflight.by_seqno) == (5, 2, 5)
    assert b.store.load_vbucket_states()[0].max_visible_seqno == 4
    stats = vb.stats()
    assert (stats["max_visible_seqno"], stats["high_prepared_seqno"], stats["high_completed_seqno"]) == (4, 5, 2)
    b.close(clean=False)
    again = make_bucket(checkpoint_max_age=None)
    vb2 = again.vbucket(0)
    assert vb2.high_seqno == high and vb2.hps == inflight.by_seqno and vb2.hcs == hcs
    assert list(vb2.prepares) == [b"k"] and vb2.prepares[b"k"].level == PERSIST
    with pytest.raises(EngineError) as e:
        vb2.set(b"k", b"x")
    assert e.value.status == Status.SYNC_WRITE_IN_PROGRESS
    assert vb2.get(b"done").value == b"1"
    with pytest.raises(EngineError):
        vb2.get(b"gone")
    with pytest.raises(EngineError) as e:
        vb2.get(b"k")  # warmed up in flight: maybe committed before the crash
    assert e.value.status == Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS
    vb2.set_topology(["a", "b"])
    vb2.seqno_ack("b", inflight.by_seqno)
    assert vb2.prepares == {}  # re-driven: no deadline, committed once the level is met
    assert vb2.get(b"k").value == b"pending"


def test_a_replica_acks_its_hps_at_snapshot_ends_and_persist_to_majority_after_persisting(make_bucket):
    b = make_bucket(checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    vb.snapshot_marker(1, 3)
    vb.apply_prepare(b"a", b"1", by_seqno=1, cas=10, rev_seqno=1, level=MAJ)
    vb.apply_prepare(b"p", b"1", by_seqno=2, cas=11, rev_seqno=1, level=PERSIST)
    assert vb.hps == 0  # the snapshot is not whole yet
    vb.apply_mutation(b"m", b"1", by_seqno=3, cas=12, rev_seqno=1)
    assert vb.hps == 1  # the PersistToMajority prepare waits for the disk
    with pytest.raises(EngineError):
        vb.get(b"a")  # replicas serve no reads
    b.flush()
    assert vb.hps == 2
    vb.snapshot_marker(4, 5)
    c = vb.apply_commit(b"a", prepared_seqno=1, commit_seqno=4)
    assert isinstance(c, Commit) and c.value == b"1" and fields(vb.ht[b"a"]) == fields(c)
    vb.apply_abort(b"p", prepared_seqno=2, abort_seqno=5)
    assert vb.hcs == 2 and vb.prepares == {} and b"p" not in vb.ht
    with pytest.raises(EngineError) as e:
        vb.snapshot_marker(6, 6)
        vb.apply_commit(b"a", prepared_seqno=1, commit_seqno=6)
    assert e.value.status == Status.EINVAL


def test_a_replica_takes_an_abort_of_a_prepare_it_never_received_but_no_commit(make_bucket):
    """A producer may have had no prepare to send for an abort (its backfill covered the prepare
    after it was completed): the abort is queued all the same, so the seqnos and the high
    completed seqno go on. A commit names a version the replica would need: without its prepare
    it is refused (the producer sends such a commit as a mutation instead)."""
    b = make_bucket(checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    vb.snapshot_marker(1, 2, disk=True)
    vb.apply_mutation(b"m", b"1", by_seqno=2, cas=12, rev_seqno=1)
    vb.snapshot_marker(3, 4)
    a = vb.apply_abort(b"gone", prepared_seqno=1, abort_seqno=3)
    assert isinstance(a, Abort) and a.by_seqno == 3 and a.prepared_seqno == 1
    assert (vb.high_seqno, vb.hcs, vb.prepares) == (3, 1, {}) and b"gone" not in vb.ht
    with pytest.raises(EngineError) as e:
        vb.apply_commit(b"other", prepared_seqno=2, commit_seqno=4)
    assert e.value.status == Status.EINVAL
    vb.apply_prepare(b"p", b"1", by_seqno=4, cas=13, rev_seqno=1, level=MAJ)
    vb.snapshot_marker(5, 5)
    with pytest.raises(EngineError) as e:  # it holds a prepare of that key: an abort must name it
        vb.apply_abort(b"p", prepared_seqno=3, abort_seqno=5)
    assert e.value.status == Status.EINVAL


def test_a_promoted_replica_drives_its_prepares_to_commit_never_to_abort(make_bucket, clock):
    b = make_bucket(clock=clock, checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    vb.snapshot_marker(1, 1)
    vb.apply_prepare(b"k", b"v", by_seqno=1, cas=10, rev_seqno=1, level=MAJ)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set_topology(["b", "c", None])
    with pytest.raises(EngineError) as e:
        vb.set(b"k", b"x")
    assert e.value.status == Status.SYNC_WRITE_IN_PROGRESS
    for read in (vb.get, vb.get_meta):  # the old active may have committed it: no stale read
        with pytest.raises(EngineError) as e:
            read(b"k")
        assert e.value.status == Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS
    clock.advance(3600)
    assert vb.complete_sync_writes() == []  # no deadline
    vb.seqno_ack("c", 1)
    assert vb.get(b"k").value == b"v" and vb.hcs == 1 and not vb.recommitting
    fresh = vb.prepare(b"k", b"w", level=MAJ)  # a sync write of its own is no re-commit: reads see v
    assert vb.get(b"k").value == b"v" and fresh.by_seqno == 3


def test_a_vbucket_leaving_active_tells_waiting_writers_their_outcome_is_unknown(active):
    b, vb = active
    outcomes = []
    vb.on_complete(vb.prepare(b"k", b"v", level=MAJ), outcomes.append)
    b.set_vbucket_state(0, VBucketState.REPLICA)
    assert outcomes == [Outcome.ABORTED]


def test_a_rollback_between_a_prepare_and_its_commit_brings_the_prepare_back(make_bucket):
    """A replica that flushed a prepare and its commit, then rolls back between the two (its
    active failed over), holds the prepare again: the new active's DCP_COMMIT finds it."""
    b = make_bucket(checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    vb.snapshot_marker(1, 2)
    vb.apply_prepare(b"k", b"v", by_seqno=1, cas=10, rev_seqno=1, level=MAJ)
    vb.apply_mutation(b"x", b"1", by_seqno=2, cas=11, rev_seqno=1)
    b.flush()
    vb.snapshot_marker(3, 3)
    vb.apply_commit(b"k", prepared_seqno=1, commit_seqno=3)
    b.flush()
    assert vb.prepares == {} and b.store.load_prepares(0) == []
    assert b.rollback(0, 2) == 2
    assert list(vb.prepares) == [b"k"] and b"k" not in vb.ht and vb.hcs == 0
    vb.snapshot_marker(3, 3)
    vb.apply_commit(b"k", prepared_seqno=1, commit_seqno=3)
    assert vb.ht[b"k"].value == b"v"
