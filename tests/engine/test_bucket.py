"""Bucket: flushing, warm-up (clean and unclean), compaction, rollback, backfill, stats."""

import threading

import pytest

from dcpflow.engine import EngineError, VBucketState, rollback_decision
from dcpflow.protocol.status import Status


def fill(vb, n, prefix=b"k", value=b"v"):
    return [vb.set(prefix + b"%d" % i, value) for i in range(n)]


def test_flush_persists_and_advances_persisted_seqno(bucket):
    vb = bucket.vbucket(0)
    fill(vb, 10)
    assert vb.persisted_seqno == 0 and bucket.stats()["ep_queue_size"] == 10
    assert bucket.flush() == 10
    assert vb.persisted_seqno == 10 and bucket.store.count(0) == (10, 0)
    assert bucket.flush() == 0


def test_flush_batches_are_bounded_and_round_robin(make_bucket):
    b = make_bucket(checkpoint_max_items=5)
    vbs = [b.set_vbucket_state(i, VBucketState.ACTIVE) for i in range(2)]
    for vb in vbs:
        fill(vb, 20)
    assert b.flush(max_items=10) == 10
    assert b.flush(max_items=10) == 10
    assert {vb.persisted_seqno for vb in vbs} == {10}  # one batch each, fairly
    assert b.flush_all() == 20


def test_a_flush_batch_never_ends_inside_a_checkpoint(make_bucket):
    """A@1 is replaced by A@4 in the same checkpoint (de-duplication). A batch cut after B@2 would
    write B alone yet report seqno 2 persisted, so SEQNO_PERSISTENCE(1) would confirm A@1, which
    is on disk neither as itself nor as A@4: kill -9 then lost A. The persistence cursor takes
    whole checkpoints."""
    b = make_bucket(checkpoint_max_items=4, checkpoint_max_age=None)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    a1 = vb.set(b"A", b"first")
    for key in (b"B", b"C"):
        vb.set(key, b"v")
    vb.set(b"A", b"second")
    vb.set(b"D", b"v")
    vb.set(b"E", b"v")  # the checkpoint [1, 5] is full: E opens the next one
    assert b.flush(max_items=1) == 4  # the whole closed checkpoint: B, C, A@4, D
    assert vb.persisted_seqno == 5 and b.store.get(0, b"A").value == b"second"
    assert vb.persisted_seqno >= a1.by_seqno
    b.close(clean=False)
    vb = make_bucket().vbucket(0)
    assert vb.high_seqno == 5 and vb.get(b"A").value == b"second"


def test_persisted_checkpoints_are_released(make_bucket):
    b = make_bucket(checkpoint_max_items=10)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 95)
    assert len(vb.checkpoint_manager.checkpoints) == 10
    b.flush_all()
    assert len(vb.checkpoint_manager.checkpoints) == 1


def test_persistence_listener(bucket):
    seen = []
    bucket.add_persistence_listener(lambda vb, seqno: seen.append((vb, seqno)))
    fill(bucket.vbucket(0), 3)
    bucket.flush()
    assert seen == [(0, 3)]


def test_failed_write_is_retried_without_loss(bucket, monkeypatch):
    vb = bucket.vbucket(0)
    fill(vb, 5)
    real_write = bucket.store.write

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(bucket.store, "write", broken)
    with pytest.raises(OSError):
        bucket.flush()
    assert vb.persisted_seqno == 0 and bucket.flusher.in_flight is None
    monkeypatch.setattr(bucket.store, "write", real_write)
    assert bucket.flush() == 5 and bucket.store.count(0) == (5, 0)


def test_write_step_may_run_on_another_thread(bucket):
    vb = bucket.vbucket(0)
    fill(vb, 50)
    batch = bucket.flusher.collect(100)
    with pytest.raises(RuntimeError):
        bucket.compact()  # maintenance waits for the batch
    vb.set(b"during", b"flight")  # the owner keeps serving while the batch is written
    bucket.set_vbucket_state(1, VBucketState.REPLICA)  # state row deferred until complete
    worker = threading.Thread(target=bucket.flusher.write, args=(batch,))
    worker.start()
    worker.join()
    bucket.flusher.complete(batch)
    assert vb.persisted_seqno == 50
    assert 1 in bucket.store.load_vbucket_states()
    assert bucket.flush() == 1


def test_clean_restart_keeps_everything(make_bucket, clock):
    b = make_bucket(clock=clock)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    rep = b.set_vbucket_state(1, VBucketState.REPLICA)
    fill(vb, 20)
    vb.delete(b"k3")
    vb.set(b"exp", b"v", expiry=1000, flags=3, datatype=1)
    b.flush_all()
    clock.advance(10)
    b.compact(now=clock.now + b.purge_interval)  # purges the tombstone: purge seqno 21
    vb.set(b"after", b"v")  # unflushed: a clean close flushes it
    rep.snapshot_marker(1, 1)
    rep.apply_mutation(b"r", b"v", by_seqno=1, cas=5, rev_seqno=1)
    snapshot = {k: v for k, v in vb.ht.items()}

    def durable_view(bucket):
        vbs = bucket.vbuckets
        return (bucket.failovers_stats(), {i: (v.high_seqno, v.uuid, v.purge_seqno, v.hlc.max_cas,
                                               v.max_deleted_rev_seqno) for i, v in vbs.items()})

    before = durable_view(b)
    b.close()

    again = make_bucket(clock=clock)
    assert again.clean_shutdown
    vb2 = again.vbucket(0)
    assert vb2.ht == snapshot
    assert durable_view(again) == before
    assert vb2.persisted_seqno == vb2.high_seqno
    assert vb2.purge_seqno == 21 and vb2.high_seqno == 23
    assert again.vbucket(1).state == VBucketState.REPLICA and again.vbucket(1).ht[b"r"].cas == 5
    assert vb2.set(b"more", b"v").by_seqno == 24


def test_unclean_close_loses_unflushed_writes_only(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 10)
    b.flush_all()
    vb.set(b"k1", b"changed")
    vb.delete(b"k2")
    vb.set(b"new", b"v")
    uuid = vb.uuid
    b.close(clean=False)
    again = make_bucket()
    assert not again.clean_shutdown
    vb2 = again.vbucket(0)
    assert vb2.high_seqno == 10 and vb2.persisted_seqno == 10
    assert vb2.get(b"k1").value == b"v" and vb2.get(b"k2").value == b"v"
    with pytest.raises(EngineError):
        vb2.get(b"new")
    assert [(e.seqno) for e in vb2.failover] == [10, 0] and vb2.failover.entries[1].uuid == uuid
    assert vb2.set(b"x", b"v").by_seqno == 11


def test_restart_is_clean_again_after_a_clean_close(make_bucket):
    b = make_bucket()
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    b.close(clean=False)
    b = make_bucket()
    assert not b.clean_shutdown and len(b.vbucket(0).failover) == 2
    b.close()
    b = make_bucket()
    assert b.clean_shutdown and len(b.vbucket(0).failover) == 2


def test_bucket_config_is_fixed_at_creation(make_bucket):
    make_bucket().close()
    with pytest.raises(ValueError, match="num_vbuckets"):
        make_bucket(num_vbuckets=8)
    with pytest.raises(ValueError, match="conflict_resolution"):
        make_bucket(conflict_resolution="lww")


def test_unset_settings_mean_as_created(make_bucket):
    """None (what `dcpflow server` passes unless told) opens an existing bucket as it was created,
    and creates a new one with 1024 vbuckets and seqno conflict resolution."""
    make_bucket("odd", num_vbuckets=16, conflict_resolution="lww").close()
    again = make_bucket("odd", num_vbuckets=None, conflict_resolution=None)
    assert again.num_vbuckets == 16 and again.conflict_resolution.value == "lww"
    again.close()
    fresh = make_bucket("fresh", num_vbuckets=None, conflict_resolution=None)
    assert fresh.num_vbuckets == 1024 and fresh.conflict_resolution.value == "seqno"


def test_context_manager_closes_cleanly(make_bucket, tmp_path):
    with make_bucket() as b:
        fill(b.set_vbucket_state(0, VBucketState.ACTIVE), 3)
    assert b.closed
    assert make_bucket().vbucket(0).high_seqno == 3


def test_closed_bucket_refuses_work(bucket):
    bucket.close()
    with pytest.raises(RuntimeError):
        bucket.flush()
    bucket.close()  # idempotent


# -- compaction / purge seqno --------------------------------------------------------------------

def test_compaction_purges_old_tombstones_and_advances_purge_seqno(make_bucket, clock):
    b = make_bucket(clock=clock, purge_interval=100)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 5)
    vb.delete(b"k1")  # seqno 6
    vb.delete(b"k2")  # seqno 7
    b.flush_all()
    clock.advance(50)
    vb.delete(b"k3")  # seqno 8, younger
    b.flush_all()
    assert b.compact()[0].purged == []  # nothing is 100 s old yet
    clock.advance(60)
    result = b.compact()[0]
    assert sorted(result.purged) == [(b"k1", 6), (b"k2", 7)]
    assert vb.purge_seqno == 7 and b.vbucket_seqno_stats(0)["vb_0:purge_seqno"] == 7
    assert b"k1" not in vb.ht and vb.ht[b"k3"].deleted and vb.num_deleted == 1
    with pytest.raises(EngineError):
        vb.get_meta(b"k1")


def test_unflushed_tombstones_are_not_purged(make_bucket, clock):
    b = make_bucket(clock=clock, purge_interval=0)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set(b"a", b"v")
    vb.delete(b"a")
    assert b.compact()[0].purged == []
    assert vb.ht[b"a"].deleted and vb.purge_seqno == 0


def test_recreated_key_after_purge_continues_rev_seqno(make_bucket, clock):
    b = make_bucket(clock=clock, purge_interval=0)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    for _ in range(5):
        vb.set(b"a", b"v")
    vb.delete(b"a")  # rev 6
    b.flush_all()
    b.compact()
    assert b"a" not in vb.ht
    assert vb.set(b"a", b"back").rev_seqno == 7


def test_purge_seqno_drives_the_rollback_decision(make_bucket, clock):
    b = make_bucket(clock=clock, purge_interval=0)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 5)
    vb.delete(b"k0")
    b.flush_all()
    b.compact()
    kwargs = dict(end_seqno=100, vb_uuid=vb.uuid, high_seqno=vb.high_seqno, purge_seqno=vb.purge_seqno)
    d = vb.failover.rollback_decision(start_seqno=3, snap_start_seqno=3, snap_end_seqno=3, **kwargs)
    assert d.needs_rollback and d.rollback_seqno == 0
    d = rollback_decision(vb.failover.entries, start_seqno=6, snap_start_seqno=6, snap_end_seqno=6, **kwargs)
    assert d.status == Status.SUCCESS


# -- rollback -------------------------------------------------------------------------------------

def make_replica_with(b, n, vbid=0, per_snapshot=3):
    """A replica holding seqnos 1..n of keys k0..k3, received in snapshots of `per_snapshot`."""
    rep = b.set_vbucket_state(vbid, VBucketState.REPLICA)
    for s in range(1, n + 1):
        if (s - 1) % per_snapshot == 0:
            rep.snapshot_marker(s, min(s + per_snapshot - 1, n))
        rep.apply_mutation(b"k%d" % (s % 4), b"v%d" % s, by_seqno=s, cas=1000 + s, rev_seqno=s)
    return rep


def test_rollback_to_a_snapshot_end_restores_older_versions(make_bucket):
    b = make_bucket()
    rep = make_replica_with(b, 12)
    b.flush(max_items=5)  # part persisted, the rest only in memory: rollback flushes first
    dropped = []
    rep.checkpoint_manager.register_cursor("dcp", 0, on_drop=dropped.append)
    assert b.rollback(0, 9) == 9
    assert rep.high_seqno == rep.persisted_seqno == 9
    assert (rep.snapshot_start, rep.snapshot_end) == (9, 9)
    assert {k: v.value for k, v in rep.ht.items()} == {b"k1": b"v9", b"k2": b"v6", b"k3": b"v7", b"k0": b"v8"}
    assert [c.name for c in dropped] == ["dcp"]
    rep.snapshot_marker(10, 10)  # replication resumes from 9
    rep.apply_mutation(b"k9", b"v", by_seqno=10, cas=1, rev_seqno=1)
    b.close()
    assert make_bucket().vbucket(0).ht[b"k1"].value == b"v9"


def test_a_dropped_cursor_is_told_to_the_cursor_listeners_with_its_vbucket_and_name(make_bucket):
    """Bucket.add_cursor_listener: every cursor a vbucket's checkpoints drop - on demand here, as
    memory pressure does - reaches each listener as (vbid, cursor name), after the cursor's own
    on_drop; a removed listener hears nothing more (the DCP producer's shell listens so)."""
    b = make_bucket()
    heard, own = [], []
    b.add_cursor_listener(lambda vbid, name: heard.append((vbid, name)))
    removed = []
    b.add_cursor_listener(removed.append)
    b.remove_cursor_listener(removed.append)
    vb = b.set_vbucket_state(2, VBucketState.ACTIVE)
    vb.set(b"k", b"v")
    cm = vb.checkpoint_manager
    cursor = cm.register_cursor("dcp:x", 0, droppable=True, on_drop=lambda c: own.append(list(heard))).cursor
    cm.drop_cursor(cursor)
    assert heard == [(2, "dcp:x")] and own == [[]]  # the cursor's owner first, then the listeners
    assert removed == []
    b.close()


def test_rollback_inside_a_deduplicated_snapshot_reports_that_snapshot(make_bucket):
    b = make_bucket()
    rep = make_replica_with(b, 12, per_snapshot=12)  # one snapshot: memory de-duplicates it
    b.flush_all()
    assert b.store.count(0) == (4, 0)  # only the latest 4 versions ever reached disk
    assert b.rollback(0, 10) == 10
    # k1@9 and k2@10 survive; k3/k0 only had versions 11/12 on disk. Not a consistent point:
    assert {k: v.by_seqno for k, v in rep.ht.items()} == {b"k1": 9, b"k2": 10}
    assert (rep.snapshot_start, rep.snapshot_end, rep.high_seqno) == (1, 12, 10)
    d = rep.failover.rollback_decision(start_seqno=rep.high_seqno, end_seqno=2**64 - 1, vb_uuid=rep.uuid,
                                       snap_start_seqno=rep.snapshot_start, snap_end_seqno=rep.snapshot_end,
                                       high_seqno=12, purge_seqno=0)
    assert d.status == Status.SUCCESS  # a producer with the same history resumes it from 10


def test_rollback_prunes_failover_entries_above_the_seqno(make_bucket):
    b = make_bucket()
    rep = make_replica_with(b, 6)
    rep.failover.replace([(30, 8), (20, 4), (10, 0)])
    assert b.rollback(0, 5) == 5
    assert rep.failover.entries == [(20, 4), (10, 0)]


def test_rollback_below_what_history_can_serve_resets_to_zero(make_bucket, clock):
    b = make_bucket(clock=clock, purge_interval=0, rollback_history_seqnos=0)
    rep = make_replica_with(b, 8)
    b.flush_all()
    b.compact()  # trims history to the persisted high seqno
    old_uuid = rep.uuid
    assert b.rollback(0, 5) == 0
    assert rep.high_seqno == 0 and rep.ht == {} and rep.num_items == 0
    assert len(rep.failover) == 1 and rep.uuid != old_uuid and rep.failover.latest.seqno == 0
    assert b.store.count(0) == (0, 0)


def test_rollback_at_or_above_high_seqno_is_a_no_op(make_bucket):
    b = make_bucket()
    rep = make_replica_with(b, 3)
    assert b.rollback(0, 3) == 3 and b.rollback(0, 7) == 3 and rep.high_seqno == 3


# -- backfill through the store --------------------------------------------------------------------

def test_cursor_after_warmup_backfills_then_continues_from_memory(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 10)
    vb.set(b"k0", b"moved")  # seqno 11: the disk copy of k0 is now at 11
    b.close()
    b = make_bucket()
    vb = b.vbucket(0)
    vb.set(b"k5", b"newer")  # seqno 12, in memory
    reg = vb.checkpoint_manager.register_cursor("dcp", 2)
    assert reg.backfill_required and (reg.backfill_start, reg.backfill_end) == (3, 11)
    with b.store.scan(0, reg.backfill_start - 1, reg.backfill_end) as scan:
        disk = [(it.key, it.by_seqno) for it in scan]
    assert disk == [(b"k%d" % i, i + 1) for i in range(2, 10)] + [(b"k0", 11)]
    [snap] = reg.cursor.next_batch()
    assert snap.checkpoint_start and [(it.key, it.by_seqno) for it in snap.items] == [(b"k5", 12)]


# -- stats ----------------------------------------------------------------------------------------

def test_stats_groups(bucket):
    vb = bucket.vbucket(0)
    fill(vb, 3)
    bucket.flush()
    vb.set(b"x", b"v")
    bucket.set_vbucket_state(2, VBucketState.REPLICA)
    seq = bucket.vbucket_seqno_stats(0)
    assert seq["vb_0:high_seqno"] == 4 and seq["vb_0:last_persisted_seqno"] == 3
    assert seq["vb_0:uuid"] == vb.uuid and seq["vb_0:purge_seqno"] == 0
    assert (seq["vb_0:last_persisted_snap_start"], seq["vb_0:last_persisted_snap_end"]) == (1, 3)
    details = bucket.vbucket_details_stats()
    assert details["vb_0"] == "active" and details["vb_2"] == "replica"
    assert details["vb_0:num_items"] == 4 and details["vb_0:max_cas"] == vb.hlc.max_cas
    fo = bucket.failovers_stats(0)
    assert fo == {"vb_0:num_entries": 1, "vb_0:num_erroneous_entries_erased": 0,
                  "vb_0:0:id": vb.uuid, "vb_0:0:seq": 0}
    st = bucket.stats()
    assert (st["curr_items"], st["vb_active_num"], st["vb_replica_num"], st["ep_queue_size"]) == (4, 1, 1, 1)
    with pytest.raises(EngineError):
        bucket.vbucket_seqno_stats(3)


def test_delete_vbucket(bucket):
    fill(bucket.vbucket(0), 3)
    bucket.flush()
    bucket.delete_vbucket(0)
    assert bucket.get_vbucket(0) is None and bucket.store.count(0) == (0, 0)
    # nothing of it is left to mislead a re-created vbucket's rollback (its persisted snapshots)
    assert bucket.store._db.execute("SELECT COUNT(*) FROM snapshots WHERE vb = 0").fetchone()[0] == 0
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    assert vb.high_seqno == 0 and vb.ht == {}
