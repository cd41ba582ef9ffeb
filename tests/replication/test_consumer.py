"""DcpConsumer / PassiveStream over a real socket: the test plays ns_server and the producer
(add-stream.md, stream-request.md, snapshot-marker.md, set-vbucket-state.md, flow-control.md)."""

import time

import pytest

from dcpflow.dcp import consumer as consumer_mod
from dcpflow.dcp import flow_control
from dcpflow.engine import CheckpointType, DeleteSource
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason, StreamFlag, VBucketState
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.dcp.client import DcpClient, items
from tests.server.client import Closed
from tests.server.conftest import held_flush

from .conftest import engine_of, set_state
from .driver import MAX, ConsumerPeer

CAS = 1_700_000_000_123_456_789


def vb_of(srv, vb):
    return srv.call(lambda: engine_of(srv).vbucket(vb))


def wait_until(fn, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def mutation(vb, seqno, key, value=b'{"v":1}', *, opaque, cas=CAS, rev=1, flags=0, expiry=0, datatype=1):
    return dcp.DcpMutation(vb, seqno, rev, flags, expiry, 0, key, value, cas + seqno, datatype, opaque)


# -- open, controls, the stream request ---------------------------------------------------------------


def test_consumer_negotiates_controls_after_open(replica, peers):
    p = peers()
    p.settle(0.3)
    assert p.controls == {"connection_buffer_size": str(consumer_mod.DEFAULT_BUFFER_SIZE), "enable_noop": "true",
                          "set_noop_interval": "1", "set_priority": "high", "enable_expiry_opcode": "true",
                          "supports_cursor_dropping_vulcan": "true", "v7_dcp_status_codes": "true"}


def test_add_stream_sends_stream_request_from_the_replica_position(replica, peers):
    vb = vb_of(replica, 1)
    p = peers()
    add = p.add_stream(1, StreamFlag.ACTIVE_VB_ONLY | StreamFlag.STRICT_VBUUID)
    req = p.stream_req(1)
    assert (req.vbucket, req.start_seqno, req.end_seqno, req.vbucket_uuid) == (1, 0, MAX, vb.uuid)
    assert (req.snap_start_seqno, req.snap_end_seqno) == (0, 0)
    assert req.flags == StreamFlag.ACTIVE_VB_ONLY | StreamFlag.STRICT_VBUUID
    assert p.settle(0.2) == []  # no ADD_STREAM reply before the producer answered (rebalance.md)
    p.accept(req, [(0x1234, 0)])
    reply = p.add_stream_reply(add)
    # add-stream.md: the reply carries the ADD_STREAM's opaque; its extras, the stream's opaque
    assert reply.status == Status.SUCCESS and reply.opaque == add and reply.stream_opaque == req.opaque
    assert [tuple(e) for e in vb_of(replica, 1).failover.entries] == [(0x1234, 0)]


def test_add_stream_reply_bytes(replica, peers):
    p = peers()
    add = p.add_stream(2)
    req = p.stream_req(2)
    p.accept(req)
    frame = p.reply_to(Opcode.DCP_ADD_STREAM, add)
    raw = frame.encode()
    assert raw[0] == 0x81 and raw[1] == 0x51 and raw[4] == 4 and raw[8:12] == b"\0\0\0\4"
    assert raw[12:16] == add.to_bytes(4, "big") and raw[24:28] == req.opaque.to_bytes(4, "big")


def test_stream_request_resumes_mid_snapshot(replica, peers):
    p = peers()
    s = p.open_stream(0)
    p.push(dcp.DcpSnapshotMarker(0, 1, 6, SnapshotFlag.MEMORY, opaque=s),
           *[mutation(0, i, b"k%d" % i, opaque=s) for i in range(1, 4)])
    wait_until(lambda: vb_of(replica, 0).high_seqno == 3)
    p.send(dcp.DcpCloseStream(0, opaque=99).encode())
    assert p.reply_to(Opcode.DCP_CLOSE_STREAM, 99).status == Status.SUCCESS
    p.add_stream(0)
    req = p.stream_req(0)
    assert (req.start_seqno, req.snap_start_seqno, req.snap_end_seqno) == (3, 1, 6)
    assert req.vbucket_uuid == 0xABCDEF  # the producer's log, adopted at the first OK


# -- applying the stream ------------------------------------------------------------------------------


def test_replica_applies_metadata_unchanged(replica, peers):
    p = peers()
    s = p.open_stream(0)
    p.push(dcp.DcpSnapshotMarker(0, 1, 4, SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT, opaque=s),
           mutation(0, 1, b"a", b'{"a":1}', opaque=s, rev=7, flags=0xDEAD, expiry=2_000_000_000),
           mutation(0, 2, b"b", b"raw", opaque=s, rev=3, datatype=0),
           dcp.DcpDeletion(0, 3, 8, b"a", cas=CAS + 3, opaque=s, delete_time=1_700_000_001),
           dcp.DcpExpiration(0, 4, 4, b"b", 1_700_000_002, cas=CAS + 4, opaque=s))
    wait_until(lambda: vb_of(replica, 0).high_seqno == 4)
    vb = vb_of(replica, 0)
    a, b = vb.ht[b"a"], vb.ht[b"b"]
    assert (a.deleted, a.cas, a.rev_seqno, a.by_seqno, a.delete_time, a.delete_source) == \
        (True, CAS + 3, 8, 3, 1_700_000_001, DeleteSource.EXPLICIT)
    assert (b.deleted, b.cas, b.rev_seqno, b.delete_time, b.delete_source) == \
        (True, CAS + 4, 4, 1_700_000_002, DeleteSource.TTL)
    assert vb.state == VBucketState.REPLICA and vb.hlc.max_cas >= CAS + 4


def test_replica_contents_stream_out_identically(replica, peers):
    """What the replica stored, read back over DCP from this node: same key, value, CAS, rev,
    flags, expiry, seqno, datatype."""
    p = peers()
    s = p.open_stream(3)
    sent = [mutation(3, i, b"key%d" % i, b'{"n":%d}' % i, opaque=s, rev=i * 2, flags=i, expiry=2_000_000_000 + i)
            for i in range(1, 21)]
    p.push(dcp.DcpSnapshotMarker(3, 1, 20, SnapshotFlag.MEMORY | SnapshotFlag.CHECKPOINT, opaque=s), *sent)
    wait_until(lambda: vb_of(replica, 3).high_seqno == 20)
    with DcpClient(replica.port) as c:
        c.connect()
        assert c.stream_request(3, 0, 20).status == Status.SUCCESS
        got = items(c.until_stream_end(3))
    strip = [m._replace(opaque=0) for m in got]
    assert strip == [m._replace(opaque=0) for m in sent]


def test_replica_checkpoints_keep_the_marker_type(replica, peers):
    p = peers()
    s = p.open_stream(0)
    p.push(dcp.DcpSnapshotMarker(0, 1, 2, SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT, opaque=s),
           mutation(0, 1, b"a", opaque=s), mutation(0, 2, b"b", opaque=s),
           dcp.DcpSnapshotMarker(0, 3, 5, SnapshotFlag.MEMORY, opaque=s), mutation(0, 4, b"c", opaque=s))
    wait_until(lambda: vb_of(replica, 0).high_seqno == 4)
    cps = replica.call(lambda: [(cp.type, cp.snap_start, cp.snap_end) for cp in
                                engine_of(replica).vbucket(0).checkpoint_manager.checkpoints if cp.fixed_end])
    assert (CheckpointType.DISK, 1, 2) in cps and cps[-1] == (CheckpointType.MEMORY, 3, 5)
    vb = vb_of(replica, 0)
    assert (vb.snapshot_start, vb.snapshot_end) == (3, 5)


def test_disk_only_to_latest_and_other_flags_are_forwarded(replica, peers):
    p = peers()
    flags = StreamFlag.DISK_ONLY | StreamFlag.TO_LATEST | StreamFlag.FROM_LATEST | StreamFlag.IGNORE_PURGED_TOMBSTONES
    p.add_stream(2, flags)
    assert p.stream_req(2).flags == flags


# -- replies the consumer owes ------------------------------------------------------------------------


def test_noops_are_answered(replica, peers):
    p = peers()
    p.push(dcp.DcpNoop(0x77))
    reply = p.reply_to(Opcode.DCP_NOOP, 0x77)
    assert reply.status == Status.SUCCESS and not reply.extras and not reply.value


def test_marker_with_ack_flag_is_answered_when_its_snapshot_is_in(replica, peers):
    p = peers()
    s = p.open_stream(1)
    p.push(dcp.DcpSnapshotMarker(1, 1, 2, SnapshotFlag.MEMORY | SnapshotFlag.ACK, opaque=s),
           mutation(1, 1, b"a", opaque=s))
    assert [f for f in p.settle(0.3) if f.opcode == Opcode.DCP_SNAPSHOT_MARKER] == []
    p.push(mutation(1, 2, b"b", opaque=s))
    ack = p.reply_to(Opcode.DCP_SNAPSHOT_MARKER, s)
    assert ack.status == Status.SUCCESS
    p.push(dcp.DcpSnapshotMarker(1, 3, 3, SnapshotFlag.MEMORY, opaque=s), mutation(1, 3, b"c", opaque=s))
    assert [f for f in p.settle(0.3) if f.opcode == Opcode.DCP_SNAPSHOT_MARKER] == []  # no Ack, no reply


def test_buffer_acks_count_charged_bytes(replica, peers):
    p = peers()
    s = p.open_stream(2)
    value = b"x" * 300_000
    msgs = [dcp.DcpSnapshotMarker(2, 1, 8, SnapshotFlag.MEMORY, opaque=s)] + \
        [mutation(2, i, b"big%d" % i, value, opaque=s, datatype=0) for i in range(1, 9)]
    p.push(*msgs)
    threshold = consumer_mod.DEFAULT_BUFFER_SIZE * flow_control.ACK_RATIO
    sizes = [dcp.charged_size(m) for m in msgs]
    assert sum(sizes) >= threshold
    k = next(i for i in range(len(sizes)) if sum(sizes[:i + 1]) >= threshold)
    wait_until(lambda: (p.settle(0.05), p.acked)[1] > 0)
    assert p.acked == sum(sizes[:k + 1])  # one ack, once a fifth of the buffer was consumed
    p.push(dcp.DcpNoop(5))  # noops are not charged
    p.reply_to(Opcode.DCP_NOOP, 5)


def test_buffer_ack_after_the_timer(replica, peers, monkeypatch):
    monkeypatch.setattr(flow_control, "ACK_SECONDS", 0.2)
    p = peers()
    s = p.open_stream(2)
    msgs = [dcp.DcpSnapshotMarker(2, 1, 1, SnapshotFlag.MEMORY, opaque=s), mutation(2, 1, b"k", opaque=s)]
    p.push(*msgs)
    wait_until(lambda: (p.settle(0.05), p.acked)[1] > 0)
    assert p.acked == sum(dcp.charged_size(m) for m in msgs)


# -- ROLLBACK and refusals from the producer --------------------------------------------------------


def test_rollback_rolls_the_replica_back_from_disk_and_re_requests(replica, peers):
    p = peers()
    s = p.open_stream(0, failover_log=[(0xAAAA, 0)])
    p.push(dcp.DcpSnapshotMarker(0, 1, 5, SnapshotFlag.MEMORY, opaque=s),
           *[mutation(0, i, b"k%d" % i, opaque=s) for i in range(1, 6)],
           dcp.DcpSnapshotMarker(0, 6, 10, SnapshotFlag.MEMORY, opaque=s),
           *[mutation(0, i, b"k%d" % i, b'{"second":1}', opaque=s) for i in range(6, 11)])
    wait_until(lambda: vb_of(replica, 0).high_seqno == 10)
    p.send(dcp.DcpCloseStream(0, opaque=5).encode())
    p.reply_to(Opcode.DCP_CLOSE_STREAM, 5)
    add = p.add_stream(0)
    req = p.stream_req(0)
    assert (req.start_seqno, req.vbucket_uuid) == (10, 0xAAAA)
    p.rollback(req, 5)  # the new active branched at 5 (failure-scenarios.md)
    again = p.stream_req(0)
    assert again.opaque == req.opaque
    assert (again.start_seqno, again.snap_start_seqno, again.snap_end_seqno) == (5, 5, 5)
    vb = vb_of(replica, 0)
    assert vb.high_seqno == 5 and set(vb.ht) == {b"k%d" % i for i in range(1, 6)}
    assert all(vb.ht[b"k%d" % i].value == b'{"v":1}' for i in range(1, 6))
    p.accept(again, [(0xBBBB, 5), (0xAAAA, 0)])
    assert p.add_stream_reply(add).status == Status.SUCCESS
    assert [tuple(e) for e in vb_of(replica, 0).failover.entries] == [(0xBBBB, 5), (0xAAAA, 0)]


def test_strict_vbuuid_rollback_to_zero_asks_again_without_history(replica, peers):
    """A replica with no data whose UUID the producer does not know is told to roll back to 0 even at
    seqno 0 (StrictVbUuid); it then asks with UUID 0 ("no history") instead of looping."""
    p = peers()
    add = p.add_stream(1, StreamFlag.STRICT_VBUUID)
    first = p.stream_req(1)
    assert first.start_seqno == 0 and first.vbucket_uuid == vb_of(replica, 1).uuid != 0
    p.rollback(first, 0)
    second = p.stream_req(1)
    assert (second.start_seqno, second.vbucket_uuid, second.flags) == (0, 0, StreamFlag.STRICT_VBUUID)
    p.accept(second)
    assert p.add_stream_reply(add).status == Status.SUCCESS


def test_endless_rollbacks_give_up_with_the_rollback_status(replica, peers):
    p = peers()
    add = p.add_stream(2)
    for _ in range(consumer_mod.MAX_ROLLBACKS):
        p.rollback(p.stream_req(2), 0)
    p.rollback(p.stream_req(2), 0)
    assert p.add_stream_reply(add).status == Status.ROLLBACK


@pytest.mark.parametrize("status", [Status.NOT_MY_VBUCKET, Status.ERANGE, Status.EACCESS])
def test_producer_error_is_the_add_stream_status(replica, peers, status):
    p = peers()
    add = p.add_stream(1)
    p.refuse(p.stream_req(1), status)
    reply = p.add_stream_reply(add)
    assert reply.status == status and reply.stream_opaque == 0
    s = p.open_stream(1)  # and the vbucket may be added again
    assert s


# -- ADD_STREAM errors (add-stream.md "Errors") --------------------------------------------------------


def add_status(p: ConsumerPeer, vb: int, flags: int = 0) -> int:
    opaque = p.add_stream(vb, flags)
    return p.reply_to(Opcode.DCP_ADD_STREAM, opaque).status


def test_add_stream_key_eexists_for_an_existing_stream(replica, peers):
    p = peers()
    p.open_stream(0)
    assert add_status(p, 0) == Status.KEY_EEXISTS
    q = peers(name="replication:other")
    assert add_status(q, 0) == Status.KEY_EEXISTS  # one consumer per replica vbucket on a node
    q.add_stream(1)
    assert q.stream_req(1).vbucket == 1  # another vbucket is fine


@pytest.mark.parametrize("flags", [StreamFlag.NO_VALUE_REMOVED, 0x200, 0x10000,
                                   StreamFlag.CACHE_TRANSFER | StreamFlag.DISK_ONLY])
def test_add_stream_einval_for_bad_flags(replica, peers, flags):
    p = peers()
    assert add_status(p, 0, flags) == Status.EINVAL
    assert p.settle(0.2) == []  # no stream request went out


@pytest.mark.parametrize("shape", [dict(extras=b""), dict(extras=bytes(4), key=b"k"), dict(extras=bytes(4), value=b"v"),
                                   dict(extras=bytes(5))])
def test_add_stream_einval_when_malformed(replica, peers, shape):
    p = peers()
    p.send(request(Opcode.DCP_ADD_STREAM, opaque=9, **shape))
    assert p.reply_to(Opcode.DCP_ADD_STREAM, 9).status == Status.EINVAL


def test_add_stream_not_my_vbucket(replica, peers):
    set_state(replica, 2, VBucketState.DEAD)
    p = peers()
    assert add_status(p, 10) == Status.NOT_MY_VBUCKET  # active here
    assert add_status(p, 2) == Status.NOT_MY_VBUCKET  # dead
    assert add_status(p, 1000) == Status.NOT_MY_VBUCKET  # no such vbucket


def test_add_stream_pending_vbucket_is_accepted(replica, peers):
    set_state(replica, 2, VBucketState.PENDING)
    p = peers()
    assert p.open_stream(2)


def test_cache_transfer_is_not_supported(replica, peers):
    p = peers()
    assert add_status(p, 0, StreamFlag.CACHE_TRANSFER | StreamFlag.TAKEOVER) == Status.NOT_SUPPORTED


def test_add_stream_to_a_producer_disconnects(replica):
    with DcpClient(replica.port) as c:
        c.connect(user="Administrator", password="password")
        c.send(dcp.DcpAddStream(0, 0, 3).encode())
        with pytest.raises(Closed):
            c.recv()


def test_add_stream_without_dcp_open_is_einval(replica):
    with replica.login() as c:
        c.send(dcp.DcpAddStream(0, 0, 3).encode())
        assert c.recv().status == Status.EINVAL


def test_add_stream_needs_the_consumer_privilege(replica):
    with ConsumerPeer(replica.port) as p:
        p.login("dcp", "dcppw", "default")
        p.send(dcp.DcpAddStream(0, 0, 3).encode())
        assert p.recv().status == Status.EACCESS


# -- messages the consumer refuses ---------------------------------------------------------------------


def test_message_for_unknown_stream_or_wrong_opaque(replica, peers):
    p = peers()
    s = p.open_stream(0)
    p.push(mutation(1, 1, b"k", opaque=s))  # no stream for vbucket 1
    assert p.reply_to(Opcode.DCP_MUTATION, s).status == Status.DCP_STREAM_NOT_FOUND  # v7 codes were accepted
    p.push(dcp.DcpSnapshotMarker(0, 1, 1, opaque=s + 1))
    assert p.reply_to(Opcode.DCP_SNAPSHOT_MARKER, s + 1).status == Status.OPAQUE_NO_MATCH


def test_legacy_status_codes_without_v7(replica, peers):
    p = ConsumerPeer(replica.port)
    p.control_status["v7_dcp_status_codes"] = Status.EINVAL
    try:
        p.open_consumer()
        s = p.open_stream(0)
        p.push(mutation(1, 1, b"k", opaque=s))
        assert p.reply_to(Opcode.DCP_MUTATION, s).status == Status.KEY_ENOENT
        p.push(dcp.DcpSnapshotMarker(0, 1, 1, opaque=s + 1))
        assert p.reply_to(Opcode.DCP_SNAPSHOT_MARKER, s + 1).status == Status.KEY_EEXISTS
    finally:
        p.close()


def test_mutation_outside_the_snapshot_is_erange(replica, peers):
    p = peers()
    s = p.open_stream(0)
    p.push(mutation(0, 1, b"k", opaque=s))  # no marker yet
    assert p.reply_to(Opcode.DCP_MUTATION, s).status == Status.ERANGE
    p.push(dcp.DcpSnapshotMarker(0, 1, 2, opaque=s), mutation(0, 5, b"k", opaque=s))
    assert p.reply_to(Opcode.DCP_MUTATION, s).status == Status.ERANGE
    assert vb_of(replica, 0).high_seqno == 0


def test_malformed_stream_message_is_einval(replica, peers):
    p = peers()
    s = p.open_stream(0)
    p.send(request(Opcode.DCP_MUTATION, key=b"k", extras=bytes(30), opaque=s))
    assert p.reply_to(Opcode.DCP_MUTATION, s).status == Status.EINVAL


# -- stream end, close, takeover ----------------------------------------------------------------------


def test_stream_end_closes_the_stream(replica, peers):
    p = peers()
    s = p.open_stream(0)
    p.push(dcp.DcpStreamEnd(0, StreamEndReason.STATE_CHANGED, s))
    assert [f for f in p.settle(0.2) if f.is_response] == []  # STREAM_END gets no reply
    p.push(mutation(0, 1, b"k", opaque=s))
    assert p.reply_to(Opcode.DCP_MUTATION, s).status == Status.DCP_STREAM_NOT_FOUND
    assert p.open_stream(0)


def test_stream_end_slow_requests_again_with_a_new_opaque(replica, peers):
    p = peers()
    s = p.open_stream(1)
    p.push(dcp.DcpSnapshotMarker(1, 1, 1, opaque=s), mutation(1, 1, b"k", opaque=s),
           dcp.DcpStreamEnd(1, StreamEndReason.SLOW, s))
    req = p.stream_req(1)
    assert req.opaque != s and req.start_seqno == 1 and req.vbucket_uuid == 0xABCDEF


def test_a_failed_request_again_closes_the_connection_so_the_stream_is_added_again(replica, peers):
    """After STREAM_END(Slow) the consumer asks again by itself; if that request fails there is no
    ADD_STREAM to answer and the manager still counts the stream as running, so the consumer
    closes the connection (the manager then reconnects and adds its streams again). A failed
    request of an ADD_STREAM is answered instead, and the connection stays."""
    p = peers()
    add = p.add_stream(2)
    p.refuse(p.stream_req(2), Status.ETMPFAIL)
    assert p.add_stream_reply(add).status == Status.ETMPFAIL
    s = p.open_stream(1)
    p.push(dcp.DcpSnapshotMarker(1, 1, 1, opaque=s), mutation(1, 1, b"k", opaque=s),
           dcp.DcpStreamEnd(1, StreamEndReason.SLOW, s))
    p.refuse(p.stream_req(1), Status.ETMPFAIL)
    with pytest.raises(Closed):
        p.wait(lambda f: False, timeout=5)


def test_close_stream_on_the_consumer(replica, peers):
    p = peers()
    p.open_stream(0)
    p.send(dcp.DcpCloseStream(0, opaque=4).encode())
    assert p.reply_to(Opcode.DCP_CLOSE_STREAM, 4).status == Status.SUCCESS
    p.send(dcp.DcpCloseStream(0, opaque=6).encode())
    assert p.reply_to(Opcode.DCP_CLOSE_STREAM, 6).status == Status.KEY_ENOENT


def test_takeover_set_vbucket_state_pending_then_active(replica, peers):
    p = peers()
    s = p.open_stream(3, StreamFlag.TAKEOVER, failover_log=[(0xCAFE, 0)])
    p.push(dcp.DcpSnapshotMarker(3, 1, 2, SnapshotFlag.MEMORY | SnapshotFlag.ACK, opaque=s),
           mutation(3, 1, b"a", opaque=s), mutation(3, 2, b"b", opaque=s))
    assert p.reply_to(Opcode.DCP_SNAPSHOT_MARKER, s).status == Status.SUCCESS
    p.push(dcp.DcpSetVbucketState(3, VBucketState.PENDING, s))
    assert p.reply_to(Opcode.DCP_SET_VBUCKET_STATE, s).status == Status.SUCCESS
    assert vb_of(replica, 3).state == VBucketState.PENDING
    p.push(dcp.DcpSnapshotMarker(3, 3, 3, SnapshotFlag.MEMORY | SnapshotFlag.ACK, opaque=s),
           mutation(3, 3, b"c", opaque=s))  # written on the old active before it went dead
    p.reply_to(Opcode.DCP_SNAPSHOT_MARKER, s)
    p.push(dcp.DcpSetVbucketState(3, VBucketState.ACTIVE, s))
    assert p.reply_to(Opcode.DCP_SET_VBUCKET_STATE, s).status == Status.SUCCESS
    p.push(dcp.DcpStreamEnd(3, StreamEndReason.OK, s))
    vb = vb_of(replica, 3)
    assert vb.state == VBucketState.ACTIVE and vb.high_seqno == 3
    assert [tuple(e) for e in vb.failover.entries] == [(0xCAFE, 0)]  # takeover: no new failover entry
    with replica.login() as c:
        assert c.get(b"c", vbucket=3).value == b'{"v":1}'


def test_takeover_active_is_acknowledged_once_on_disk(replica, peers):
    """The ack of SET_VBUCKET_STATE(active) lets the old active go dead: with a flush batch in
    flight (it carries the older state row) the consumer answers only after the batch, with the
    new state written."""
    engine = engine_of(replica)
    p = peers()
    s = p.open_stream(3, StreamFlag.TAKEOVER, failover_log=[(0xCAFE, 0)])
    p.push(dcp.DcpSnapshotMarker(3, 1, 1, SnapshotFlag.MEMORY | SnapshotFlag.ACK, opaque=s),
           mutation(3, 1, b"a", opaque=s))
    assert p.reply_to(Opcode.DCP_SNAPSHOT_MARKER, s).status == Status.SUCCESS
    with held_flush(engine) as (entered, release):
        with replica.login() as w:
            w.set(b"x", b"v", vbucket=10)  # an active vbucket: a batch to hold
        assert entered.wait(10)
        p.push(dcp.DcpSetVbucketState(3, VBucketState.ACTIVE, s))
        with pytest.raises(TimeoutError):
            p.reply_to(Opcode.DCP_SET_VBUCKET_STATE, s, timeout=0.3)
        release.set()
        assert p.reply_to(Opcode.DCP_SET_VBUCKET_STATE, s).status == Status.SUCCESS
        assert replica.call(lambda: engine.store.load_vbucket_states()[3].state) == VBucketState.ACTIVE


def test_vbucket_made_active_by_the_manager_ends_the_stream(replica, peers):
    p = peers()
    s = p.open_stream(0)
    set_state(replica, 0, VBucketState.ACTIVE)  # failover promotes the replica
    p.push(dcp.DcpSnapshotMarker(0, 1, 1, opaque=s))
    assert p.reply_to(Opcode.DCP_SNAPSHOT_MARKER, s).status == Status.DCP_STREAM_NOT_FOUND


def test_dcp_stats_show_consumer_streams(replica, peers):
    p = peers(name="replication:stats")
    s = p.open_stream(1)
    p.push(dcp.DcpSnapshotMarker(1, 1, 1, opaque=s), mutation(1, 1, b"k", opaque=s))
    wait_until(lambda: vb_of(replica, 1).high_seqno == 1)
    with replica.login() as c:
        stats = c.stats("dcp")
    pre = "eq_dcpq:replication:stats:"
    assert stats[pre + "type"] == "consumer"
    assert stats[pre + "stream_1_last_received_seqno"] == "1"
    assert stats[pre + "stream_1_state"] == "reading"


def test_snappy_values_from_a_producer_are_stored_inflated(replica, peers):
    """A producer that compresses (force_value_compression) sends datatype Snappy: the replica
    keeps the inflated value and the rest of the datatype, as every other write path does."""
    from dcpflow.protocol import snappy
    p = peers()
    s = p.open_stream(1)
    doc = b'{"text":"' + b"z" * 300 + b'"}'
    p.push(dcp.DcpSnapshotMarker(1, 1, 1, SnapshotFlag.MEMORY | SnapshotFlag.CHECKPOINT, opaque=s),
           mutation(1, 1, b"zz", snappy.compress(doc), opaque=s, datatype=0x03))
    wait_until(lambda: vb_of(replica, 1).high_seqno == 1)
    item = vb_of(replica, 1).ht[b"zz"]
    assert item.value == doc and item.datatype == 0x01
