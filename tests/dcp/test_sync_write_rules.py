"""Sync writes over DCP without a socket: DcpProducer streams over an engine whose vbucket
holds prepares (prepare.md, commit.md, abort.md, seqno-acknowledged.md, snapshot-marker.md V2.0).
A stream that enabled sync writes gets DCP_PREPARE / DCP_COMMIT; any other only committed versions,
its snapshots ending at the max visible seqno; a named consumer's DCP_SEQNO_ACKNOWLEDGED completes
the write; a disk backfill's V2.0 marker carries the persisted high completed seqno and a sync
stream gets the in-flight prepares of its range. test_sync_writes.py keeps the paths through a
server end to end (durable SETs from a client, their replies, timeouts, unordered execution)."""

from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.outcomes import NOTHING
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import DurabilityLevel, MarkerVersion, SnapshotFlag
from dcpflow.protocol.status import Status

from .sansio import drain, engine_fixture, markers, producer, request, to_disk_only, written

engine = engine_fixture(2)


def controls(p, **kv) -> None:
    for key, value in kv.items():
        assert p.control(key, value, now=100.0, collections=False).__class__ is tuple


def seqno_of(m) -> int:
    for name in ("by_seqno", "commit_seqno", "abort_seqno"):
        if hasattr(m, name):
            return getattr(m, name)
    return 0


def test_a_named_replica_acks_the_prepare_and_plain_streams_see_only_the_commit(engine):
    vb = engine.vbucket(0)
    vb.set_topology(["active", "replica"])
    replica = producer(engine, name="replica-conn")
    controls(replica, enable_sync_writes="true", consumer_name="replica")
    replica.stream_request(request(0), collections=False)
    plain = producer(engine, name="plain-conn")
    plain.stream_request(request(0), collections=False)
    vb.set(b"k", b"old")  # seqno 1
    vb.prepare(b"k", b"new", level=DurabilityLevel.MAJORITY)  # seqno 2
    vb.set(b"other", b"x")  # seqno 3: other keys go on
    for p in (replica, plain):
        written(p, 0)
    msgs = drain(replica)
    (prepare,) = [m for m in msgs if isinstance(m, dcp.DcpPrepare)]
    assert (prepare.key, prepare.value, prepare.by_seqno, prepare.durability_level) == (b"k", b"new", 2, 1)
    assert list(vb.prepares) == [b"k"] and vb.get(b"k").value == b"old"
    assert replica.seqno_ack(0, 2, 101.0) == NOTHING  # the named replica acknowledges: committed at 4
    assert vb.get(b"k").value == b"new" and vb.hcs == 2
    for p in (replica, plain):
        written(p, 0)
    later = drain(replica)
    (commit,) = [m for m in later if isinstance(m, dcp.DcpCommit)]
    assert (commit.key, commit.prepared_seqno, commit.commit_seqno) == (b"k", 2, 4)
    seen = drain(plain)
    assert_plain_stream_sees_only_committed(seen, msgs, b"k", b"other")


def test_disk_backfill_markers_carry_the_hcs_and_send_in_flight_prepares_to_sync_streams(engine):
    vb = engine.vbucket(1)
    vb.set_topology(["active", "replica"])
    vb.prepare(b"a", b"a", level=DurabilityLevel.MAJORITY)  # 1
    vb.seqno_ack("replica", 1)  # commit 2
    vb.prepare(b"b", b"b", level=DurabilityLevel.MAJORITY)  # 3
    vb.seqno_ack("replica", 3)  # commit 4
    vb.set(b"c", b"c")  # 5
    vb.prepare(b"d", b"d", level=DurabilityLevel.MAJORITY)  # 6: nobody acknowledges it
    to_disk_only(engine, 1)
    assert vb.persisted_hcs == 3 and list(vb.prepares) == [b"d"]
    sync = producer(engine, name="bf-sync")
    controls(sync, enable_sync_writes="true", consumer_name="replica")
    sync.stream_request(request(1, 0, 6), collections=False)
    got = drain(sync)
    (disk,) = markers(got)
    assert disk.flags & SnapshotFlag.DISK and disk.version == MarkerVersion.V2_0
    assert (disk.end_seqno, disk.high_completed_seqno) == (6, 3)
    assert [(type(m).__name__, m.key, seqno_of(m)) for m in got if hasattr(m, "key")] == [
        ("DcpMutation", b"a", 2), ("DcpMutation", b"b", 4), ("DcpMutation", b"c", 5), ("DcpPrepare", b"d", 6)]
    plain = producer(engine, name="bf-plain")
    plain.stream_request(request(1, 0, 6), collections=False)
    got = drain(plain)
    assert [(m.key, m.by_seqno) for m in got if isinstance(m, dcp.DcpMutation)] == [(b"a", 2), (b"b", 4), (b"c", 5)]
    assert not any(isinstance(m, dcp.DcpPrepare) for m in got)
    assert sync.seqno_ack(1, 6, 101.0) == NOTHING  # the replica shows up: the held write commits at 7
    assert vb.get(b"d").value == b"d" and vb.high_seqno == 7


def test_seqno_ack_needs_sync_writes_and_a_consumer_name(engine):
    p = producer(engine, name="no-sync")
    refused = p.seqno_ack(0, 1, 101.0)
    assert isinstance(refused, Refusal) and refused.status == Status.EINVAL
    controls(p, enable_sync_writes="true")
    assert p.seqno_ack(0, 1, 101.0).status == Status.EINVAL  # a consumer name too
    controls(p, consumer_name="r")
    assert p.seqno_ack(0, 1, 101.0) == NOTHING



def test_a_prepare_completed_before_the_backfill_is_planned_reaches_a_sync_stream_as_its_commit(engine):
    """A sync-write stream whose backfill covers a prepare that was completed, by a commit still in
    memory, before the backfill was planned: the backfill does not send that prepare (it is no
    longer in flight), so the commit must not go out as a DCP_COMMIT naming it - a replica would
    refuse it (it holds no such prepare) and lose the write. It goes out as the mutation the
    commit made (ActiveStream._prepare_was_sent)."""
    vb = engine.vbucket(1)
    vb.set_topology(["active", "acker"])
    vb.prepare(b"d", b"d", level=DurabilityLevel.MAJORITY)  # 1
    vb.set(b"e", b"e")  # 2
    to_disk_only(engine, 1)  # seqnos 1-2 now only on disk
    acker = producer(engine, name="pc-acker")
    controls(acker, enable_sync_writes="true", consumer_name="acker")
    acker.stream_request(request(1, 2, uuid=vb.failover.latest.uuid), collections=False)
    assert acker.seqno_ack(1, 1, 101.0) == NOTHING  # committed at 3, in memory
    written(acker, 1)
    assert [m.commit_seqno for m in drain(acker) if isinstance(m, dcp.DcpCommit)] == [3]  # its cursor is past 2
    engine.flush_all()
    assert vb.checkpoint_manager.first_seqno > 2  # the checkpoint of seqnos 1-2 is released
    sync = producer(engine, name="pc-sync")
    controls(sync, enable_sync_writes="true", consumer_name="pc-sync")
    sync.stream_request(request(1, 0, 3), collections=False)
    got = drain(sync)
    disk = markers(got)[0]
    assert disk.flags & SnapshotFlag.DISK and disk.end_seqno == 2  # the prepare's seqno was backfilled
    assert [(type(m).__name__, m.key, seqno_of(m)) for m in got if hasattr(m, "key")] == [
        ("DcpMutation", b"e", 2), ("DcpMutation", b"d", 3)]


def assert_plain_stream_sees_only_committed(seen: list, msgs: list, key: bytes, other: bytes) -> None:
    """What a plain stream (`seen`) and a sync-write stream (`msgs`) show of: `key` written at 1,
    prepared at 2, `other` written at 3, the prepare committed at 4. The plain stream sees only
    mutations, its markers ending at versions it receives; the sync stream's markers are V2.0 with
    the max visible seqno (the end-to-end twin in test_sync_writes.py checks the same)."""
    items = [(m.key, m.value, m.by_seqno) for m in seen if isinstance(m, dcp.DcpMutation)]
    assert items == [(key, b"old", 1), (other, b"x", 3), (key, b"new", 4)] or \
        items == [(other, b"x", 3), (key, b"new", 4)]  # the first may be de-duplicated by the commit
    assert not any(isinstance(m, dcp.DcpPrepare | dcp.DcpCommit | dcp.DcpAbort) for m in seen)
    for m in markers(seen):  # a plain stream's snapshots end at a version it receives
        assert m.end_seqno in (1, 3, 4) and m.version == MarkerVersion.V1
    for m in markers(msgs):
        assert m.version == MarkerVersion.V2_0
        assert m.max_visible_seqno == (1 if m.end_seqno == 2 else m.end_seqno)
