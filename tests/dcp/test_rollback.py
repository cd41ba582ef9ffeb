"""The rollback decision of STREAM_REQ, branch by branch, against failover logs the server built
itself: an unclean restart (`kill -9` with unpersisted writes), vbucket state changes, and
tombstone purges (KV-Engine's rollback.md as its code decides; the rules are stated in
tests/engine/test_failover.py: the purge rule compares the start seqno, not the snapshot start, and
a request from 0 checks its UUID only with StrictVbUuid - erratum 36). End to end here: a real
restart and purges racing queued backfills; every branch of the decision, over failover logs the
engine builds, is checked without a socket in test_stream_request_rules.py (with a hypothesis
property)."""

import json
import time

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import StreamEndReason, StreamFlag
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import DcpClient, items, markers
from .conftest import engine_of, fill, keys_in, overfill, server_dropped, to_disk_only, vbucket

MAX = 0xFFFFFFFFFFFFFFFF


def seqno_stats(c, vb: int) -> dict[str, int]:
    stats = c.stats(f"vbucket-seqno {vb}")
    return {k.split(":", 1)[1]: int(v) for k, v in stats.items()}


def failover_log(c: DcpClient, vb: int) -> list[tuple[int, int]]:
    return list(dcp.FailoverLogResponse.from_frame(c.call_dcp(dcp.DcpGetFailoverLog(vb))).entries)


def connect(port: int) -> DcpClient:
    c = DcpClient(port)
    c.num_vbuckets = 8
    return c.connect("Administrator", "password")


def test_unclean_restart_branches(spawn_server, tmp_path):
    """kill -9 with unpersisted writes: the restarted vbucket starts a new branch at the persisted
    seqno, and consumers of the lost writes are rolled back exactly."""
    data = str(tmp_path / "data")
    srv = spawn_server("--data-dir", data, "--vbuckets", "8", "--flush-interval", "0.02")
    w = DcpClient(srv.port)
    w.num_vbuckets = 8
    w.login("Administrator", "password")
    fill(w, 0, 5, prefix="p")
    assert w.call(Opcode.SEQNO_PERSISTENCE, vbucket=0, extras=(5).to_bytes(8, "big")).status == Status.SUCCESS
    uuid1 = seqno_stats(w, 0)["uuid"]
    assert w.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
    fill(w, 0, 3, prefix="lost")  # seqnos 6..8, never persisted
    # a consumer receives all 8 items (the last memory snapshot ends at 8)
    c = connect(srv.port)
    assert c.stream_request(0, 0, 8, 0).status == Status.SUCCESS
    got = c.until_stream_end(0)
    assert [m.by_seqno for m in items(got)] == list(range(1, 9))
    last = markers(got)[-1]
    c.close()
    w.close()
    srv.kill9()

    srv = spawn_server("--data-dir", data, "--vbuckets", "8", "--flush-interval", "0.02")
    c = connect(srv.port)
    log = failover_log(c, 0)
    assert log[1:] == [(uuid1, 0)] and log[0][1] == 5  # new branch at the persisted seqno, newest first
    uuid2 = log[0][0]

    # 4b: the consumer holds a whole snapshot past the branch point: roll back to upper (5)
    resp = c.stream_request(0, 8, MAX, uuid1, last.start_seqno, 8)
    assert (resp.status, resp.rollback_seqno) == (Status.ROLLBACK, 5)
    # 4c: mid-snapshot [3, 8] at 7: roll back to the snapshot start
    resp = c.stream_request(0, 7, MAX, uuid1, 3, 8)
    assert (resp.status, resp.rollback_seqno) == (Status.ROLLBACK, 3)
    # 4a: nothing beyond the branch point: no rollback; start == snap_start counts as snap_end = start
    resp = c.stream_request(0, 5, MAX, uuid1, 5, 9)
    assert resp.status == Status.SUCCESS and list(resp.failover_log) == log
    assert c.close_stream(0) == Status.SUCCESS
    # 3: a uuid the log never had: roll back to 0
    resp = c.stream_request(0, 4, MAX, 0xBAD, 4, 4)
    assert (resp.status, resp.rollback_seqno) == (Status.ROLLBACK, 0)
    # the newest branch itself: fine up to the high seqno
    assert c.stream_request(0, 5, MAX, uuid2, 5, 5).status == Status.SUCCESS
    c.close()


def test_purge_before_a_queued_backfill_opens_ends_with_rollback(make_server):
    """The purge rule is applied again when a backfill's scan opens, with the scan's purge seqno:
    tombstones above the start purged while the backfill waited (here behind another vbucket's,
    backfill_order sequential, held by flow control) end the stream with STREAM_END(Rollback) and
    no snapshot (stream-end.md, rollback.md "Wild Card 'Purge'"), unless the request said
    IgnorePurgedTombstones or its `purge_seqno` is still the server's."""
    srv = make_server(purge_interval=0.0)
    w = srv.login()
    fill(w, 0, 300, prefix="big", value=b"b" * 20_000)  # 6 MB: more than a backfill reads ahead
    for vb in (1, 2, 3):
        for k in fill(w, vb, 6)[:3]:
            assert w.delete(k, vbucket=vb).status == Status.SUCCESS  # tombstones at 7..9
        fill(w, vb, 1, prefix="after")  # 10
    for vb in (0, 1, 2, 3):
        to_disk_only(srv, vb)

    def compact(vb: int) -> None:
        srv.call(lambda: engine_of(srv).compact(vb, now=time.time() + 10))
        assert vbucket(srv, vb).purge_seqno == 9

    compact(3)  # before its request, which says it saw that purge
    c = DcpClient(srv.port)
    c.connect(features=(Feature.XERROR, Feature.COLLECTIONS))
    c.controls(enable_noop="true", connection_buffer_size=1000, backfill_order="sequential")
    assert c.stream_request(0, 0, 300).status == Status.SUCCESS  # never acked: holds the one backfill slot
    uuid = {vb: vbucket(srv, vb).uuid for vb in (1, 2, 3)}
    assert c.stream_request(1, 5, 10, uuid[1], 5, 5).status == Status.SUCCESS  # nothing purged yet
    assert c.stream_request(2, 5, 10, uuid[2], 5, 5, flags=StreamFlag.IGNORE_PURGED_TOMBSTONES).status == \
        Status.SUCCESS
    assert c.stream_request(3, 5, 10, uuid[3], 5, 5, value=json.dumps({"purge_seqno": "9"}).encode()).status == \
        Status.SUCCESS
    stats = w.stats("dcp")
    assert int(stats["eq_dcpq:test:num_backfills_running"]) == 1
    assert [int(stats[f"eq_dcpq:test:stream_{vb}_backfills"]) for vb in (1, 2, 3)] == [0, 0, 0]  # not opened
    compact(1)
    compact(2)
    c.buffer_ack(c.received_bytes)  # what arrived during the requests; the rest is acked as it comes
    msgs = []
    for _ in range(4):
        msgs += c.until_stream_end(ack=True, timeout=60)
    by_vb = {vb: [m for m in msgs if m.vbucket == vb] for vb in range(4)}
    assert by_vb[1] == [dcp.DcpStreamEnd(1, StreamEndReason.ROLLBACK, by_vb[1][0].opaque)]
    for vb in (2, 3):
        assert [(m.start_seqno, m.end_seqno) for m in markers(by_vb[vb])] == [(5, 10)]
        assert [m.by_seqno for m in items(by_vb[vb])] == [6, 10]
        assert by_vb[vb][-1].reason == StreamEndReason.OK
    assert len(items(by_vb[0])) == 300 and by_vb[0][-1].reason == StreamEndReason.OK
    c.close()
    w.close()


def test_purge_before_the_backfill_of_a_dropped_cursor_ends_with_rollback(make_server):
    """After a dropped cursor the stream backfills from what the consumer has (the last seqno it
    queued): tombstones above that purged before the scan opened end it with STREAM_END(Rollback),
    not with a disk snapshot that leaves them out."""
    srv = make_server(purge_interval=0.0, checkpoint_memory_quota=20_000, checkpoint_max_items=50)
    w = srv.login()
    fill(w, 5, 20, prefix="other", value=b"o" * 1000)
    to_disk_only(srv, 5)
    c = DcpClient(srv.port).connect()
    c.controls(supports_cursor_dropping="true", connection_buffer_size=200)
    assert c.stream_request(0).status == Status.SUCCESS
    fill(w, 0, 5, prefix="first")
    c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 5, ack=True)  # it has 1..5
    # vbucket 5's backfill fills the window and is not acked: vbucket 0's stream can neither send
    # nor act on its dropped cursor until the consumer acks
    assert c.stream_request(5, 0, 20).status == Status.SUCCESS
    c.messages_until(lambda m: isinstance(m, dcp.DcpSnapshotMarker) and m.vbucket == 5)
    overfill(srv, 0)  # seqnos 6..425
    assert server_dropped(srv, 0)
    for k in keys_in(0, 3, prefix="slow"):
        assert w.delete(k, vbucket=0).status == Status.SUCCESS  # tombstones at 426..428
    to_disk_only(srv, 0)
    srv.call(lambda: engine_of(srv).compact(0, now=time.time() + 10))
    assert vbucket(srv, 0).purge_seqno == 428
    c.buffer_ack(c.received_bytes)
    msgs = [m for m in c.until_stream_end(0, ack=True) if m.vbucket == 0]
    assert msgs == [dcp.DcpStreamEnd(0, StreamEndReason.ROLLBACK, msgs[-1].opaque)]  # no snapshot from 6
    c.close()
    w.close()
