"""Snapshot markers, stream ends and takeover without a socket: the rules tests/dcp/test_snapshots.py,
test_stream_end.py and test_takeover.py check over a server, asserted on the bytes a
DcpProducer's send passes return (decoded) and on what its entry points return, over the
real engine (checkpoints, flusher and store run by the test, on its own thread).

snapshot-marker.md "Implementation notes" as KV-Engine's code behaves (the first marker starts at
min(requested snapshot start, real start)); stream-end.md's reasons; rebalance.md's takeover."""

import pytest

from dcpflow.dcp.backfills import opened, read_whole
from dcpflow.dcp.outcomes import WAKE, Close, Send, SetVbucketState, Tolerated
from dcpflow.dcp.producer import Started
from dcpflow.engine import VBucketState
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import MarkerVersion, SnapshotFlag, StreamEndReason, StreamFlag
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .sansio import (
    MAX,
    drain,
    ends,
    engine_fixture,
    fill,
    items,
    markers,
    producer,
    request,
    to_disk_only,
    written,
)

MEM, DISK, CHK, ACK = SnapshotFlag.MEMORY, SnapshotFlag.DISK, SnapshotFlag.CHECKPOINT, SnapshotFlag.ACK


engine = engine_fixture(12)


def ask(p, vb: int, *args, collections: bool = False, **kw):
    out = p.stream_request(request(vb, *args, **kw), collections=collections)
    assert isinstance(out, Started), out
    return out.stream


def controls(p, collections: bool = False, **kv) -> None:
    for key, value in kv.items():
        p.control(key, value, now=100.0, collections=collections)


# -- markers: memory --------------------------------------------------------------------------

def test_memory_first_marker_starts_at_the_requested_start(engine):
    fill(engine, 0, 6)
    p = producer(engine)
    ask(p, 0, 3, MAX, engine.vbucket(0).uuid, 3, 3)
    first = markers(drain(p))[0]
    assert first.flags == MEM and (first.start_seqno, first.end_seqno) == (3, 6)  # not 4: rule 1


def test_first_marker_takes_the_requested_snapshot_start(engine):
    """Resuming inside a partial snapshot [2, 8] at 4: the first marker starts at min(snap_start, start)."""
    fill(engine, 0, 8)
    p = producer(engine)
    ask(p, 0, 4, MAX, engine.vbucket(0).uuid, 2, 8)
    msgs = drain(p)
    assert markers(msgs)[0].start_seqno == 2
    assert [m.by_seqno for m in items(msgs)] == [5, 6, 7, 8]


def test_memory_marker_without_checkpoint_flag_starts_at_its_first_item(engine):
    fill(engine, 0, 2)
    p = producer(engine)
    ask(p, 0)
    drain(p)
    vb = engine.vbucket(0)
    for k in (b"x", b"y", b"x"):  # x(3), y(4), x(5) while the stream is idle: x(3) is de-duplicated away
        vb.set(k, b"v")
    written(p, 0)
    msgs = drain(p)
    (later,) = markers(msgs)
    assert later.flags == MEM and later.start_seqno == 4  # rule 3: the first item that follows
    assert [(m.key, m.by_seqno) for m in items(msgs)] == [(b"y", 4), (b"x", 5)]


def test_checkpoint_marker_starts_at_the_checkpoint_snapshot_start(engine):
    fill(engine, 0, 2)
    p = producer(engine)
    ask(p, 0)
    assert [m.by_seqno for m in items(drain(p))] == [1, 2]
    vb = engine.vbucket(0)
    vb.checkpoint_manager.create_checkpoint()  # the next checkpoint starts at 3
    for k in (b"x", b"y", b"x"):  # 3, 4, 5: x(3) de-duplicated
        vb.set(k, b"v")
    written(p, 0)
    msgs = drain(p)
    (chk,) = markers(msgs)
    assert chk.flags == MEM | CHK and chk.start_seqno == 3  # rule 2: seqno 3 is never seen
    assert [m.by_seqno for m in items(msgs)] == [4, 5]


def test_memory_dedup_and_history_across_checkpoints(engine):
    """Within a checkpoint a key appears once (latest version); across checkpoints each
    checkpoint's version."""
    vb = engine.vbucket(0)
    for k in (b"x", b"y", b"x", b"x"):
        vb.set(k, b"a")  # 1..4 in one checkpoint
    vb.checkpoint_manager.create_checkpoint()
    vb.set(b"x", b"b")  # 5 in the next checkpoint
    p = producer(engine)
    ask(p, 0, 0, 5)
    msgs = drain(p)
    assert [(m.key, m.by_seqno) for m in items(msgs)] == [(b"y", 2), (b"x", 4), (b"x", 5)]
    first, second = markers(msgs)
    assert (first.start_seqno, first.end_seqno, first.flags) == (0, 4, MEM | CHK)
    assert (second.start_seqno, second.end_seqno, second.flags) == (5, 5, MEM | CHK)
    assert ends(msgs) == [(0, StreamEndReason.OK)]


# -- markers: disk ----------------------------------------------------------------------------

def test_disk_snapshot_has_each_key_once(engine):
    vb = engine.vbucket(0)
    for k in (b"x", b"y", b"x"):
        vb.set(k, b"a")
    vb.checkpoint_manager.create_checkpoint()
    vb.set(b"x", b"b")  # 4
    to_disk_only(engine, 0)
    p = producer(engine)
    ask(p, 0, 0, 4)
    msgs = drain(p)
    (m,) = markers(msgs)
    assert (m.start_seqno, m.end_seqno, m.flags) == (0, 4, DISK | CHK)
    assert [(i.key, i.by_seqno, i.value) for i in items(msgs)] == [(b"y", 2, b"a"), (b"x", 4, b"b")]


def test_disk_first_marker_starts_at_the_requested_start(engine):
    fill(engine, 0, 6)
    to_disk_only(engine, 0)
    p = producer(engine)
    ask(p, 0, 2, 6, engine.vbucket(0).uuid, 2, 2)
    msgs = drain(p)
    (m,) = markers(msgs)
    assert (m.start_seqno, m.end_seqno, m.flags) == (2, 6, DISK | CHK)  # rule 1 (disk): not 3
    assert [i.by_seqno for i in items(msgs)] == [3, 4, 5, 6]


def test_backfill_then_memory(engine):
    fill(engine, 2, 6)
    to_disk_only(engine, 2)
    fill(engine, 2, 3, prefix="m")
    p = producer(engine)
    ask(p, 2, 0, 9)
    msgs = drain(p)
    disk, mem = markers(msgs)
    assert disk.flags == DISK | CHK and (disk.start_seqno, disk.end_seqno) == (0, 6)
    assert mem.flags & MEM and (mem.start_seqno, mem.end_seqno) == (7, 9)  # disk rule 2 / memory after disk
    assert [m.by_seqno for m in items(msgs)] == list(range(1, 10))


def test_disk_checkpoint_of_a_replica_starts_at_its_snapshot_start(engine):
    """A replica's checkpoint from a disk snapshot streams as Disk; its marker starts at the
    checkpoint's snapshot start even when the stream begins inside it (disk rule 3)."""
    engine.set_vbucket_state(9, VBucketState.REPLICA)
    vb = engine.vbucket(9)
    vb.snapshot_marker(1, 4, disk=True)
    for s in range(1, 5):
        vb.apply_mutation(b"r%d" % s, b"v", by_seqno=s, cas=s, rev_seqno=1)
    p = producer(engine)
    ask(p, 9, 2, 4, vb.uuid, 1, 4)
    msgs = drain(p)
    (m,) = markers(msgs)
    assert m.flags & DISK and not m.flags & MEM and (m.start_seqno, m.end_seqno) == (1, 4)
    assert [i.by_seqno for i in items(msgs)] == [3, 4]


# -- markers: versions ------------------------------------------------------------------------

def test_v1_by_default(engine):
    fill(engine, 0, 2)
    p = producer(engine)
    ask(p, 0, 0, 2)
    (m,) = markers(drain(p))
    assert m.version == MarkerVersion.V1


def disk_then_memory(engine, disk: int, memory: int, collections: bool = False, **ctl) -> list:
    """The markers of a stream over `disk` items only on disk and `memory` items after them."""
    fill(engine, 0, disk)
    to_disk_only(engine, 0)
    fill(engine, 0, memory, prefix="m")
    p = producer(engine)
    controls(p, collections=collections, **ctl)
    ask(p, 0, 0, disk + memory, collections=collections)
    return markers(drain(p))


def test_v2_0_with_sync_replication(engine):
    disk, mem = disk_then_memory(engine, 3, 2, enable_sync_writes="true", consumer_name="replica")
    assert disk.version == mem.version == MarkerVersion.V2_0
    assert (disk.max_visible_seqno, disk.high_completed_seqno) == (3, 0)  # no SyncWrite ever completed
    assert mem.max_visible_seqno == 5


def test_sync_writes_without_consumer_name_stays_v1(engine):
    fill(engine, 0, 1)
    p = producer(engine)
    controls(p, enable_sync_writes="true")
    ask(p, 0, 0, 1)
    (m,) = markers(drain(p))
    assert m.version == MarkerVersion.V1


def test_v2_2_for_disk_snapshots_only(engine):
    disk, mem = disk_then_memory(engine, 3, 2, True, enable_noop="true", max_marker_version="2.2")
    assert disk.version == MarkerVersion.V2_2 and disk.purge_seqno == engine.vbucket(0).purge_seqno
    assert (disk.start_seqno, disk.end_seqno, disk.max_visible_seqno) == (0, 3, 3)
    assert mem.version == MarkerVersion.V1


def test_v2_2_with_sync_replication_memory_is_v2_0(engine):
    disk, mem = disk_then_memory(engine, 3, 1, True, enable_noop="true", max_marker_version="2.2",
                                 enable_sync_writes="true", consumer_name="r")
    assert (disk.version, mem.version) == (MarkerVersion.V2_2, MarkerVersion.V2_0)


# -- stream ends (stream-end.md) --------------------------------------------------------------

def test_close_stream_sends_stream_end_when_asked(engine):
    p = producer(engine)
    controls(p, send_stream_end_on_client_close_stream="true")
    ask(p, 0)
    assert p.close_stream(0, None) == (WAKE,)
    assert ends(drain(p)) == [(0, StreamEndReason.CLOSED)]


def test_close_stream_is_silent_by_default(engine):
    p = producer(engine)
    ask(p, 0)
    assert p.close_stream(0, None) == (WAKE,)
    fill(engine, 0, 3)
    written(p, 0)
    assert drain(p) == []


def test_state_change_ends_the_streams_of_that_vbucket(engine):
    p = producer(engine)
    ask(p, 5)
    ask(p, 6)
    engine.set_vbucket_state(5, VBucketState.REPLICA)
    p.vbucket_changed(5, "state")  # what the shell does on the engine's notification
    assert ends(drain(p)) == [(5, StreamEndReason.STATE_CHANGED)]
    assert p.close_stream(6, None) == (WAKE,)  # the other stream is untouched


def test_rollback_ends_the_stream(engine):
    fill(engine, 4, 3)
    p = producer(engine)
    ask(p, 4)
    drain(p)
    p.vbucket_changed(4, "rollback")
    assert ends(drain(p)) == [(4, StreamEndReason.ROLLBACK)]


def test_shutdown_ends_streams_as_disconnected(engine):
    p = producer(engine)
    ask(p, 0)
    ask(p, 1)
    out = dcp.DcpDecoder()
    out.feed(b"".join(a.data for a in p.shutdown() if isinstance(a, Send)))  # what the shell writes
    assert sorted(ends(out.messages())) == [(0, StreamEndReason.DISCONNECTED), (1, StreamEndReason.DISCONNECTED)]
    assert not p.streams


def test_lost_privileges_end_the_streams(engine):
    p = producer(engine)
    ask(p, 0)
    ask(p, 1)
    p.lost_privileges()
    assert sorted(ends(drain(p))) == [(0, StreamEndReason.LOST_PRIVILEGES), (1, StreamEndReason.LOST_PRIVILEGES)]


def test_an_ending_stream_drops_what_it_queued_but_ok_keeps_it(engine):
    """kv_engine clears the ready queue for any end but OK: a state change loses the queued items."""
    fill(engine, 0, 3)
    p = producer(engine)
    stream = ask(p, 0)
    stream.fill(1 << 20)
    assert stream.ready
    p.end_stream(stream, StreamEndReason.STATE_CHANGED)
    msgs = drain(p)
    assert [m.opcode for m in msgs] == [Opcode.DCP_STREAM_END]


def test_a_dropped_cursor_without_opt_in_ends_slow_and_with_it_backfills(engine):
    """A stream whose cursor was dropped backfills from where it stands when its connection sent
    supports_cursor_dropping; one without it ends with SLOW (the safety net)."""
    for vb, opt_in in ((0, True), (1, False)):
        fill(engine, vb, 4)
        to_disk_only(engine, vb)
        fill(engine, vb, 2, prefix="m")
        p = producer(engine, name=f"drop{opt_in}")
        if opt_in:
            controls(p, supports_cursor_dropping="true")
        stream = ask(p, vb, 0, MAX)
        first = drain(p)
        assert [m.by_seqno for m in items(first)] == list(range(1, 7))
        fill(engine, vb, 2, prefix="late")
        to_disk_only(engine, vb)  # 7, 8 only on disk once the stream lets go of them
        engine.vbucket(vb).checkpoint_manager.drop_cursor(stream.cursor)
        msgs = drain(p)
        if opt_in:
            later = markers(msgs)
            assert later[0].flags & DISK and later[0].flags & CHK and later[0].start_seqno == 7  # disk rule 2
            assert ends(msgs) == []
            assert [m.by_seqno for m in items(msgs)] == [7, 8]  # no gap, no repeat
        else:
            assert ends(msgs) == [(vb, StreamEndReason.SLOW)]
        p.release()


def test_a_dropped_cursor_wakes_only_the_stream_that_read_with_it(engine):
    """The engine's notice of a dropped cursor, handed in as (vbid, cursor name), answers WAKE and
    marks that stream for the next send pass; another connection's cursor, another vbucket or a
    cursor no stream holds answers nothing."""
    fill(engine, 0, 3)
    p, other = producer(engine, name="mine"), producer(engine, name="other")
    controls(p, supports_cursor_dropping="true")
    stream, theirs = ask(p, 0, 0, MAX), ask(other, 0, 0, MAX)
    drain(p)
    drain(other)
    assert p.cursor_dropped(0, theirs.name) == () and p.cursor_dropped(1, stream.name) == ()
    assert p.cursor_dropped(0, "dcp:nobody") == ()
    assert not p.registry.pending
    assert p.cursor_dropped(0, stream.name) == (WAKE,)
    assert stream in p.registry.pending
    p.release()
    other.release()


def test_a_failed_backfill_read_ends_the_stream_with_backfill_fail(engine):
    """The shell reports a backfill read that raised (server/backfill.py); the producer decides:
    the stream ends with BACKFILL_FAIL (stream-end.md), its backfill unqueued; a stream already
    ended is left as it is."""
    fill(engine, 5, 4)
    to_disk_only(engine, 5)
    p = producer(engine, name="bf")
    stream = ask(p, 5, 0, MAX)
    assert stream.backfill is not None
    assert p.backfill_failed(stream) == (WAKE,)
    assert stream.dead and stream.backfill is None
    assert ends(drain(p, backfill=False)) == [(5, StreamEndReason.BACKFILL_FAIL)]
    assert p.backfill_failed(stream) == ()
    p.release()


def test_the_state_machines_take_no_callbacks():
    """One way to answer (issue 44): the producer, consumer and stream state machines return
    outcome values; none of their constructors takes a callable to call back into its shell."""
    import inspect

    from dcpflow.dcp.active_stream import ActiveStream
    from dcpflow.dcp.consumer import DcpConsumer
    from dcpflow.dcp.passive_stream import PassiveStream
    from dcpflow.dcp.producer import DcpProducer
    for cls in (DcpProducer, DcpConsumer, ActiveStream, PassiveStream):
        for param in inspect.signature(cls.__init__).parameters.values():
            callback = "Callable" in str(param.annotation) or param.name.endswith(("listener", "callback")) \
                or param.name.startswith("on_") or param.name in ("schedule", "wake", "set_vbucket_state")
            assert not callback, f"{cls.__name__}({param.name}) is a callback into the shell"


# -- takeover (rebalance.md) ------------------------------------------------------------------

def test_takeover_handshake(engine):
    fill(engine, 3, 5)
    bystander = producer(engine, name="bystander")
    ask(bystander, 3)
    drain(bystander)

    def set_state(vbid, state):
        engine.set_vbucket_state(vbid, state)
        bystander.vbucket_changed(vbid, "state")
        p.vbucket_changed(vbid, "state")

    p = producer(engine, name="takeover")
    stream = ask(p, 3, 0, 10, flags=StreamFlag.TAKEOVER)
    log = drain(p)
    sv = [m for m in log if isinstance(m, dcp.DcpSetVbucketState)]
    assert [m.state for m in sv] == [VBucketState.PENDING]  # caught up, nothing to ack: pending at once
    assert engine.vbucket(3).state == VBucketState.ACTIVE  # until the consumer answers it takes writes
    fill(engine, 3, 2, prefix="late")  # 6, 7: must still reach the new owner
    actions = p.reply(Status.SUCCESS, Opcode.DCP_SET_VBUCKET_STATE, stream.opaque, 101.0)
    assert reply_kind(actions) == "accepted"
    assert actions == (SetVbucketState(3, VBucketState.DEAD), WAKE)  # the shell runs them, in order
    set_state(*actions[0])
    assert engine.vbucket(3).state == VBucketState.DEAD
    more = drain(p)
    (acked,) = markers(more)
    assert acked.flags & ACK and [m.by_seqno for m in items(more)] == [6, 7]  # drained after the switch
    assert not [m for m in more if isinstance(m, dcp.DcpSetVbucketState)]  # waits for the marker's ack
    p.reply(Status.SUCCESS, Opcode.DCP_SNAPSHOT_MARKER, stream.opaque, 102.0)
    more2 = drain(p)
    assert [m.state for m in more2 if isinstance(m, dcp.DcpSetVbucketState)] == [VBucketState.ACTIVE]
    assert ends(more2) == []  # still waiting for that answer
    p.reply(Status.SUCCESS, Opcode.DCP_SET_VBUCKET_STATE, stream.opaque, 103.0)
    assert ends(drain(p)) == [(3, StreamEndReason.OK)]
    assert [m.by_seqno for m in items(log + more)] == list(range(1, 8))
    assert ends(drain(bystander)) == [(3, StreamEndReason.STATE_CHANGED)]  # other streams end


def reply_kind(actions: tuple) -> str:
    """What a reply from the consumer meant: the connection closes, the error is tolerated (logged), or
    the reply was accepted."""
    if any(isinstance(a, Close) for a in actions):
        return "disconnect"
    return "tolerated" if any(isinstance(a, Tolerated) for a in actions) else "accepted"


def test_consumer_error_reply_disconnects_and_tolerated_ones_do_not(engine):
    p = producer(engine)
    stream = ask(p, 5, 0, MAX, flags=StreamFlag.TAKEOVER)
    drain(p)
    op = Opcode.DCP_SET_VBUCKET_STATE
    assert reply_kind(p.reply(Status.EINVAL, op, stream.opaque, 101.0)) == "disconnect"
    for status in (Status.NOT_MY_VBUCKET, Status.DCP_STREAM_NOT_FOUND, Status.OPAQUE_NO_MATCH, Status.KEY_EEXISTS,
                   Status.KEY_ENOENT):
        assert reply_kind(p.reply(status, op, stream.opaque, 101.0)) == "tolerated"
    controls(p, v7_dcp_status_codes="true")
    for status in (Status.KEY_EEXISTS, Status.KEY_ENOENT):  # no longer tolerated with v7 status codes
        assert reply_kind(p.reply(status, op, stream.opaque, 101.0)) == "disconnect"
    assert reply_kind(p.reply(Status.DCP_STREAM_NOT_FOUND, op, stream.opaque, 101.0)) == "tolerated"


# -- backfill decisions the server's shell asks dcp/backfills.py for ----------------------------

def test_a_backfill_purged_under_ends_with_rollback_else_goes_on(engine):
    """`opened`: a scan that opens above the purge seqno goes on; one whose range lost
    tombstones to a purge since the request ends the stream with ROLLBACK (rollback.md)."""
    keys = fill(engine, 1, 6)
    for k in keys[:3]:
        engine.vbucket(1).delete(k)
    fill(engine, 1, 1, prefix="after")
    to_disk_only(engine, 1)
    p = producer(engine)
    stream = ask(p, 1, 5, 10, engine.vbucket(1).uuid, 5, 5)
    assert stream.backfill is not None and stream.backfill.start == 6
    assert opened(stream, 5) is None  # nothing above what the consumer has was purged
    assert opened(stream, 9) is StreamEndReason.ROLLBACK


@pytest.mark.parametrize("page_read,chunks,scan_closed,whole", [
    (True, 3, True, True),  # the scan closed itself after a short page: that was the range
    (True, 0, False, True),  # nothing in the range
    (True, 3, False, False),  # more to read: a task reads on
    (False, 0, False, False),  # no room for a first page: the task reads it later
])
def test_a_first_page_is_the_whole_backfill_or_the_scan_reads_on(page_read, chunks, scan_closed, whole):
    assert read_whole(page_read, chunks, scan_closed) is whole
