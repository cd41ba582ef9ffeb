"""Every STREAM_END reason the producer can send (KV-Engine's stream-end.md), each caused by
the real event: end seqno, CLOSE_STREAM, vbucket state change, server shutdown, a failed disk
scan, a vbucket rollback, and lost privileges. Slow is not sent: only the streams of a connection
that opted in have droppable cursors, and they recover from disk (tested here too). FilterEmpty
cannot happen here: only the default collection exists and it cannot be dropped. The rules
themselves (which reason, what a stream drops, when nothing is sent) are also checked without a
socket in test_stream_rules.py."""

import os

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import DcpClient, items, markers
from .conftest import dropped_cursors, engine_of, fill, overfill, server_dropped, stalled_stream, to_disk_only, vbucket

MAX = 0xFFFFFFFFFFFFFFFF


def ends(msgs) -> list[tuple[int, int]]:
    return [(m.vbucket, m.reason) for m in msgs if isinstance(m, dcp.DcpStreamEnd)]


def test_close_stream_sends_stream_end_when_asked(server, clients):
    c = clients()
    c.controls(send_stream_end_on_client_close_stream="true")
    c.stream_request(0)
    assert c.close_stream(0) == Status.SUCCESS
    msgs = c.until_stream_end(0)
    assert ends(msgs) == [(0, StreamEndReason.CLOSED)]


def test_server_shutdown_ends_streams_as_disconnected(make_server):
    srv = make_server()
    c = DcpClient(srv.port).connect()
    c.stream_request(0)
    c.stream_request(1)
    srv.stop()
    msgs = c.quiet(2.0)
    assert sorted(ends(msgs)) == [(0, StreamEndReason.DISCONNECTED), (1, StreamEndReason.DISCONNECTED)]
    assert c.closed_by_server or c.is_closed(2)
    c.close()


def test_cursor_is_droppable_only_after_opt_in(make_server):
    """recommended-apis.md: `supports_cursor_dropping` is the client saying it tolerates a dropped
    cursor. A stream of a connection that never sent it, or requested before it was sent, keeps
    its cursor over the checkpoint quota and gets everything from memory, with no STREAM_END."""
    srv = make_server(checkpoint_memory_quota=20_000, checkpoint_max_items=50)
    plain = DcpClient(srv.port).connect(name="plain")
    plain.controls(connection_buffer_size=200)
    assert plain.stream_request(0).status == Status.SUCCESS
    late = DcpClient(srv.port).connect(name="late")
    late.controls(connection_buffer_size=200)
    assert late.stream_request(1).status == Status.SUCCESS  # before the opt-in: keeps its cursor
    late.controls(supports_cursor_dropping="true")
    assert late.stream_request(2).status == Status.SUCCESS  # after it: droppable
    for vb in (0, 1, 2):
        overfill(srv, vb)
    assert server_dropped(srv, 2)  # the quota was exceeded and the opted-in cursor went ...
    assert (dropped_cursors(srv, 0), dropped_cursors(srv, 1)) == (0, 0)  # ... the others stayed
    stats = srv.login().stats("dcp")
    assert (stats["eq_dcpq:plain:cursor_dropping"], stats["eq_dcpq:late:cursor_dropping"]) == ("0", "1")
    assert int(stats["eq_dcpq:late:stream_2_cursor_drops"]) == 1
    assert int(stats["eq_dcpq:late:stream_1_cursor_drops"]) == 0
    msgs = plain.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 420, ack=True)
    assert [m.by_seqno for m in items(msgs)] == list(range(1, 421)) and ends(msgs) == []
    assert all(m.flags & SnapshotFlag.MEMORY for m in markers(msgs))
    got = {1: [], 2: []}
    while len(got[1]) < 420 or len(got[2]) < 420:
        msg = late.messages_until(lambda m: True, ack=True)[0]
        assert not isinstance(msg, dcp.DcpStreamEnd), msg
        if isinstance(msg, dcp.DcpMutation):
            got[msg.vbucket].append(msg.by_seqno)
    assert got == {1: list(range(1, 421)), 2: list(range(1, 421))}
    plain.close()
    late.close()


def test_dropped_cursor_with_support_switches_to_backfill(make_server):
    srv = make_server(checkpoint_memory_quota=20_000, checkpoint_max_items=50)
    c = DcpClient(srv.port).connect()
    c.controls(supports_cursor_dropping="true")
    stalled_stream(srv, c, 0)
    assert server_dropped(srv, 0)
    high = srv.call(lambda: engine_of(srv).vbucket(0).high_seqno)
    msgs = c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == high, ack=True)
    assert [m.by_seqno for m in items(msgs)] == list(range(1, high + 1))  # no gap, no repeat
    ms = markers(msgs)
    assert ms[0].flags & SnapshotFlag.MEMORY
    later_disk = [m for m in ms[1:] if m.flags & SnapshotFlag.DISK]
    assert later_disk and later_disk[0].flags & SnapshotFlag.CHECKPOINT
    # a backfill other than the first starts at its own first seqno (disk rule 2)
    before = [m for m in items(msgs) if m.by_seqno < later_disk[0].start_seqno]
    assert before and later_disk[0].start_seqno == before[-1].by_seqno + 1
    c.close()


def test_failed_backfill_ends_as_backfill_failed(make_server):
    srv = make_server()
    w = srv.login()
    fill(w, 0, 5)
    to_disk_only(srv, 0)
    path = engine_of(srv).store.path
    os.rename(path, str(path) + ".away")  # the data file vanishes under the server
    try:
        c = DcpClient(srv.port).connect()
        assert c.stream_request(0, 0, 5).status == Status.SUCCESS
        msgs = c.until_stream_end(0)
        assert ends(msgs) == [(0, StreamEndReason.BACKFILL_FAIL)]
        c.close()
    finally:
        if os.path.exists(path):  # the empty database SQLite created in its place
            os.remove(path)
        os.rename(str(path) + ".away", path)
    w.close()


def test_rollback_ends_the_stream(server, clients, writer):
    assert writer.call(Opcode.SET_VBUCKET, vbucket=10, extras=bytes([2])).status == Status.SUCCESS

    def replicate():
        vb = engine_of(server).vbucket(10)
        vb.snapshot_marker(1, 6)
        for s in range(1, 7):
            vb.apply_mutation(b"r%d" % s, b"v", by_seqno=s, cas=s, rev_seqno=1)
    server.call(replicate)
    c = clients()
    assert c.stream_request(10).status == Status.SUCCESS
    c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 6)
    assert writer.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS  # no flush batch in flight
    reached = server.call(lambda: engine_of(server).rollback(10, 3))
    assert reached <= 3
    assert ends(c.until_stream_end(10)) == [(10, StreamEndReason.ROLLBACK)]
    assert vbucket(server, 10).high_seqno == reached


def test_lost_privileges_end_the_streams(server, clients):
    c = clients()
    c.stream_request(0)
    c.stream_request(1)
    assert c.auth_scram("reader", "readpw").status == Status.SUCCESS  # no DcpProducer for this user
    msgs = c.quiet(1.0)
    assert sorted(ends(msgs)) == [(0, StreamEndReason.LOST_PRIVILEGES), (1, StreamEndReason.LOST_PRIVILEGES)]


def test_an_ended_stream_is_freed_without_the_cyclic_collector(server, clients, writer):
    # A stream that kept a reference to itself (its wake callback closed over it) was left for the
    # cyclic collector: with 1024 streams per read, a full collection (~90 ms with 1M documents
    # loaded) stalled the server's loop every few reads.
    import gc

    from dcpflow.dcp.active_stream import ActiveStream

    def alive() -> int:
        return server.call(lambda: sum(isinstance(o, ActiveStream) for o in gc.get_objects()))

    for vb in range(4):
        fill(writer, vb, 5)
    gc.collect()
    gc.disable()
    try:
        c = clients()
        for vb in range(4):
            c.stream_request(vb, end=5)
            assert ends(c.until_stream_end(vb)) == [(vb, StreamEndReason.OK)]
        assert alive() == 0  # ended and written: nothing holds them
        for vb in range(4):
            c.stream_request(vb)  # open streams, then the connection goes
        assert alive() == 4
        c.close()
        gone(alive)
        # backfilled streams too: the producer must not keep them once its connection is gone
        for vb in range(4):
            to_disk_only(server, vb)
        c = clients()
        for vb in range(4):
            c.stream_request(vb, end=5)
            msgs = c.until_stream_end(vb)
            assert markers(msgs)[0].flags & SnapshotFlag.DISK and len(items(msgs)) == 5  # a backfill
        c.close()
        gone(alive)
    finally:
        gc.enable()


def gone(alive) -> None:
    import time
    deadline = time.monotonic() + 60
    while alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert alive() == 0
