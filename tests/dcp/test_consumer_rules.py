"""The consumer side without a socket: DcpConsumer and PassiveStream (dcp/consumer.py,
dcp/passive_stream.py) driven with the frames a producer sends, asserting the bytes they queue and
the outcomes they return (RollBack, ChangeState, Refusal, replies). tests/replication/test_consumer.py
checks the same rules end to end, over a server and a relay.

add-stream.md, stream-request.md, snapshot-marker.md, stream-end.md, set-vbucket-state.md;
rebalance.md ("Initial Stream Handshake", "VBucket Takeover"), failure-scenarios.md, rollback.md.
The last tests connect a DcpConsumer to a DcpProducer in memory (bytes relayed by
the test), so a replica follows an active and rolls back where it diverged."""

import pytest

from dcpflow.dcp import consumer as consumer_mod
from dcpflow.dcp.consumer import DcpConsumer
from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.outcomes import ChangeState, Close, Reply, RollBack, Send
from dcpflow.dcp.passive_stream import PassiveState
from dcpflow.dcp.producer import Rollback, Started
from dcpflow.engine import VBucketState
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason, StreamFlag
from dcpflow.protocol.frame import FrameDecoder, response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .sansio import MAX, decode, fill, frame, make_engine, producer, run_backfills

ADD = 0x77  # the ADD_STREAM's opaque (the cluster manager's)


@pytest.fixture
def replica(tmp_path):
    bucket = make_engine(tmp_path / "replica", 4, VBucketState.REPLICA)
    yield bucket
    bucket.close(clean=False)


@pytest.fixture
def active(tmp_path):
    bucket = make_engine(tmp_path / "active", 4)
    yield bucket
    bucket.close(clean=False)


class Shell:
    """What server/consumer.py does with the outcomes a DcpConsumer returns, minus the socket:
    `Send` data is collected in `out` (in order), `Close` sets `close_wanted`; the answer to the
    call (a Refusal, a RollBack, a ChangeState, a message's Reply bytes) is returned, None if none."""

    def __init__(self, state: DcpConsumer):
        self.state = state
        self.out: list[bytes] = []
        self.close_wanted = False

    def __getattr__(self, name):  # the state's attributes (streams, engine...) read through
        return getattr(self.state, name)

    @property
    def changing_state(self) -> bool:
        return self.state.changing_state

    @changing_state.setter
    def changing_state(self, value: bool) -> None:
        self.state.changing_state = value

    def _run(self, outcome):
        if outcome.__class__ is not tuple:
            return outcome  # a Refusal
        answer = None
        for action in outcome:
            if action.__class__ is Send:
                self.out.append(action.data)
            elif action.__class__ is Close:
                self.close_wanted = True
            elif action.__class__ is Reply:
                answer = action.data
            else:
                assert answer is None, outcome
                answer = action
        return answer

    def open(self):
        return self._run(self.state.open())

    def add_stream(self, req, add_opaque):
        return self._run(self.state.add_stream(req, add_opaque))

    def close_stream(self, vbid):
        return self._run(self.state.close_stream(vbid))

    def response(self, f, now):
        return self._run(self.state.response(f, now))

    def rolled_back(self, stream):
        return self._run(self.state.rolled_back(stream))

    def vbucket_changed(self, vbid, event):
        return self._run(self.state.vbucket_changed(vbid, event))

    def message(self, msg, opaque, collections):
        return self._run(self.state.message(msg, opaque, collections))


def consumer(engine, registry=None, name="replication:a", v7=True, consumer_name=None) -> Shell:
    c = Shell(DcpConsumer(name, 0, engine, "default", {} if registry is None else registry, now=100.0,
                                 created=0.0, consumer_name=consumer_name))
    c.open()
    for f in sent(c):  # the producer accepts every control (v7 status codes unless told otherwise)
        key = f.key.decode()
        ok = v7 or key != "v7_dcp_status_codes"
        c.response(frame(response(f.opcode, Status.SUCCESS if ok else Status.EINVAL, opaque=f.opaque)), 100.0)
    return c


def sent(c: Shell) -> list:
    """The frames the consumer queued since the last call."""
    d = FrameDecoder()
    d.feed(b"".join(c.out))
    c.out.clear()
    out = []
    while (f := d.next_frame()) is not None:
        out.append(f)
    return out


def stream_req(c: Shell) -> dcp.DcpStreamRequest:
    (f,) = sent(c)
    assert f.opcode == Opcode.DCP_STREAM_REQ
    return dcp.DcpStreamRequest.from_frame(f)


def answer(c, req, status=Status.SUCCESS, log=((0xABCDEF, 0),), rollback_seqno=0):
    reply = dcp.DcpStreamRequestResponse(status, tuple(log) if status == Status.SUCCESS else (),
                                         rollback_seqno=rollback_seqno, opaque=req.opaque).encode()
    return c.response(frame(reply), 101.0)


def add_reply(c) -> dcp.DcpAddStreamResponse:
    (f,) = sent(c)
    assert f.opcode == Opcode.DCP_ADD_STREAM
    return dcp.DcpAddStreamResponse.from_frame(f)


def open_stream(c, vb: int, flags: int = 0, log=((0xABCDEF, 0),)) -> int:
    assert c.add_stream(dcp.DcpAddStream(vb, flags), ADD) is None
    req = stream_req(c)
    assert answer(c, req, log=log) is None
    assert add_reply(c).status == Status.SUCCESS
    return req.opaque


def push(c, *msgs, collections: bool = False) -> list:
    """Stream messages from the producer, each through the protocol's decoder; their outcomes."""
    return [c.message(dcp.decode_dcp(frame(m.encode())), m.opaque, collections) for m in msgs]


def mutation(vb, seqno, key, value=b'{"v":1}', opaque=0):
    return dcp.DcpMutation(vb, seqno, 1, 0, 0, 0, key, value, cas=seqno, opaque=opaque)


# -- controls and ADD_STREAM ------------------------------------------------------------------

def test_consumer_negotiates_controls_after_open(replica):
    c = Shell(DcpConsumer("r", 0, replica, "default", {}, now=100.0, created=0.0))
    c.open()
    got = {f.key.decode(): f.value.decode() for f in sent(c)}
    assert got == {"connection_buffer_size": str(consumer_mod.DEFAULT_BUFFER_SIZE), "enable_noop": "true",
                   "set_noop_interval": "1", "set_priority": "high", "enable_expiry_opcode": "true",
                   "supports_cursor_dropping_vulcan": "true", "v7_dcp_status_codes": "true"}
    named = Shell(DcpConsumer("r", 0, replica, "default", {}, now=100.0, created=0.0, consumer_name="n1"))
    named.open()
    got = [(f.key, f.value) for f in sent(named)]
    assert got[-2:] == [(b"enable_sync_writes", b"true"), (b"consumer_name", b"n1")]


def test_add_stream_sends_stream_request_from_the_replica_position(replica):
    c = consumer(replica)
    vb = replica.vbucket(1)
    assert c.add_stream(dcp.DcpAddStream(1, StreamFlag.ACTIVE_VB_ONLY | StreamFlag.STRICT_VBUUID), ADD) is None
    req = stream_req(c)
    assert (req.vbucket, req.start_seqno, req.end_seqno, req.vbucket_uuid) == (1, 0, MAX, vb.uuid)
    assert (req.snap_start_seqno, req.snap_end_seqno) == (0, 0)
    assert req.flags == StreamFlag.ACTIVE_VB_ONLY | StreamFlag.STRICT_VBUUID
    assert c.out == []  # no ADD_STREAM reply before the producer answered (rebalance.md)
    assert answer(c, req, log=[(0x1234, 0)]) is None
    reply = add_reply(c)
    # add-stream.md: the reply carries the ADD_STREAM's opaque; its extras, the stream's opaque
    assert (reply.status, reply.opaque, reply.stream_opaque) == (Status.SUCCESS, ADD, req.opaque)
    assert [tuple(e) for e in vb.failover.entries] == [(0x1234, 0)]
    assert c.streams[1].state is PassiveState.READING


def test_stream_request_resumes_mid_snapshot(replica):
    c = consumer(replica)
    s = open_stream(c, 0)
    push(c, dcp.DcpSnapshotMarker(0, 1, 6, SnapshotFlag.MEMORY, opaque=s),
         *[mutation(0, i, b"k%d" % i, opaque=s) for i in range(1, 4)])
    assert replica.vbucket(0).high_seqno == 3
    assert c.close_stream(0) is None
    assert c.add_stream(dcp.DcpAddStream(0), ADD) is None
    req = stream_req(c)
    assert (req.start_seqno, req.snap_start_seqno, req.snap_end_seqno) == (3, 1, 6)
    assert req.vbucket_uuid == 0xABCDEF  # the producer's log, adopted at the first OK


@pytest.mark.parametrize("make,want", [
    (lambda e: e.set_vbucket_state(2, VBucketState.DEAD), Status.NOT_MY_VBUCKET),
    (lambda e: e.set_vbucket_state(2, VBucketState.ACTIVE), Status.NOT_MY_VBUCKET),
    (lambda e: e.delete_vbucket(2), Status.NOT_MY_VBUCKET),
    (lambda e: e.set_vbucket_state(2, VBucketState.PENDING), None),  # pending is accepted
])
def test_add_stream_vbucket_state(replica, make, want):
    make(replica)
    c = consumer(replica)
    out = c.add_stream(dcp.DcpAddStream(2), ADD)
    assert (out.status if out is not None else None) == want
    assert bool(c.out) == (want is None)  # a stream request went out only if accepted


def test_cache_transfer_is_not_supported(replica):
    out = consumer(replica).add_stream(dcp.DcpAddStream(0, StreamFlag.CACHE_TRANSFER), ADD)
    assert isinstance(out, Refusal) and out.status == Status.NOT_SUPPORTED


def test_add_stream_key_eexists_for_an_existing_stream(replica):
    registry: dict = {}
    c = consumer(replica, registry)
    open_stream(c, 0)
    out = c.add_stream(dcp.DcpAddStream(0), ADD)
    assert out == Refusal(Status.KEY_EEXISTS, "a stream for vbucket 0 already exists on this connection")
    other = consumer(replica, registry, name="replication:other")
    out = other.add_stream(dcp.DcpAddStream(0), ADD)  # one consumer per replica vbucket on a node
    assert out.status == Status.KEY_EEXISTS and "replication:a" in out.reason
    assert other.add_stream(dcp.DcpAddStream(1), ADD) is None  # another vbucket is fine
    assert stream_req(other).vbucket == 1


@pytest.mark.parametrize("flags", [StreamFlag.NO_VALUE_REMOVED, 0x200, 0x10000,
                                   StreamFlag.CACHE_TRANSFER | StreamFlag.DISK_ONLY])
def test_add_stream_einval_for_bad_flags(flags):
    raw = dcp.DcpAddStream(0, flags).encode()
    with pytest.raises(Exception) as e:
        dcp.DcpAddStream.from_frame(frame(raw))
    assert e.value.status == Status.EINVAL


# -- the producer's answer: rollbacks and errors ----------------------------------------------

def test_rollback_is_returned_and_the_request_is_made_again(replica):
    c = consumer(replica)
    s = open_stream(c, 0, log=[(0xAAAA, 0)])
    push(c, dcp.DcpSnapshotMarker(0, 1, 5, SnapshotFlag.MEMORY, opaque=s),
         *[mutation(0, i, b"k%d" % i, opaque=s) for i in range(1, 6)],
         dcp.DcpSnapshotMarker(0, 6, 10, SnapshotFlag.MEMORY, opaque=s),
         *[mutation(0, i, b"k%d" % i, b'{"second":1}', opaque=s) for i in range(6, 11)])
    assert c.close_stream(0) is None
    assert c.add_stream(dcp.DcpAddStream(0), ADD) is None
    req = stream_req(c)
    assert (req.start_seqno, req.vbucket_uuid) == (10, 0xAAAA)
    order = answer(c, req, Status.ROLLBACK, rollback_seqno=5)  # the new active branched at 5
    assert order == RollBack(c.streams[0], 5) and order.stream.state is PassiveState.ROLLING_BACK
    assert c.out == []  # the ADD_STREAM waits for the end of the handshake
    replica.flush_all()
    assert replica.rollback(0, 5) == 5  # what the shell does, then:
    c.rolled_back(order.stream)
    again = stream_req(c)
    assert again.opaque == req.opaque
    assert (again.start_seqno, again.snap_start_seqno, again.snap_end_seqno) == (5, 5, 5)
    vb = replica.vbucket(0)
    assert set(vb.ht) == {b"k%d" % i for i in range(1, 6)} and all(i.value == b'{"v":1}' for i in vb.ht.values())
    assert answer(c, again, log=[(0xBBBB, 5), (0xAAAA, 0)]) is None
    assert add_reply(c).status == Status.SUCCESS
    assert [tuple(e) for e in replica.vbucket(0).failover.entries] == [(0xBBBB, 5), (0xAAAA, 0)]


def test_strict_vbuuid_rollback_to_zero_asks_again_without_history(replica):
    c = consumer(replica)
    assert c.add_stream(dcp.DcpAddStream(1, StreamFlag.STRICT_VBUUID), ADD) is None
    first = stream_req(c)
    assert first.start_seqno == 0 and first.vbucket_uuid == replica.vbucket(1).uuid != 0
    order = answer(c, first, Status.ROLLBACK, rollback_seqno=0)
    c.rolled_back(order.stream)
    second = stream_req(c)
    assert (second.start_seqno, second.vbucket_uuid, second.flags) == (0, 0, StreamFlag.STRICT_VBUUID)
    answer(c, second)
    assert add_reply(c).status == Status.SUCCESS


def test_endless_rollbacks_give_up_with_the_rollback_status(replica):
    c = consumer(replica)
    assert c.add_stream(dcp.DcpAddStream(2), ADD) is None
    for _ in range(consumer_mod.MAX_ROLLBACKS):
        order = answer(c, stream_req(c), Status.ROLLBACK, rollback_seqno=0)
        assert isinstance(order, RollBack)
        c.rolled_back(order.stream)
    assert answer(c, stream_req(c), Status.ROLLBACK, rollback_seqno=0) is None
    assert add_reply(c).status == Status.ROLLBACK
    assert 2 not in c.streams


@pytest.mark.parametrize("status", [Status.NOT_MY_VBUCKET, Status.ERANGE, Status.EACCESS])
def test_producer_error_is_the_add_stream_status(replica, status):
    c = consumer(replica)
    assert c.add_stream(dcp.DcpAddStream(1), ADD) is None
    answer(c, stream_req(c), status)
    reply = add_reply(c)
    assert reply.status == status and reply.stream_opaque == 0
    assert not c.close_wanted
    assert open_stream(c, 1)  # and the vbucket may be added again


def test_a_failed_request_again_asks_to_close_the_connection(replica):
    """After STREAM_END(Slow) the consumer asks again by itself; if that fails there is no
    ADD_STREAM to answer, so it asks the shell to close the connection."""
    c = consumer(replica)
    s = open_stream(c, 1)
    push(c, dcp.DcpSnapshotMarker(1, 1, 1, opaque=s), mutation(1, 1, b"k", opaque=s),
         dcp.DcpStreamEnd(1, StreamEndReason.SLOW, s))
    req = stream_req(c)
    assert req.opaque != s and req.start_seqno == 1 and req.vbucket_uuid == 0xABCDEF  # a new opaque
    answer(c, req, Status.ETMPFAIL)
    assert c.close_wanted and sent(c) == []


# -- stream messages -------------------------------------------------------------------------

def test_replica_applies_metadata_unchanged(replica):
    c = consumer(replica)
    s = open_stream(c, 0)
    m = dcp.DcpMutation(0, 1, 7, 0xCAFE, 99, 0, b"key", b"value", cas=0x1234, opaque=s)
    assert push(c, dcp.DcpSnapshotMarker(0, 1, 1, opaque=s), m) == [None, None]
    item = replica.vbucket(0).ht[b"key"]
    assert (item.by_seqno, item.rev_seqno, item.flags, item.expiry, item.cas, item.value) == \
        (1, 7, 0xCAFE, 99, 0x1234, b"value")


def test_marker_with_ack_flag_is_answered_when_its_snapshot_is_in(replica):
    c = consumer(replica)
    s = open_stream(c, 0)
    out = push(c, dcp.DcpSnapshotMarker(0, 1, 2, SnapshotFlag.MEMORY | SnapshotFlag.ACK, opaque=s),
               mutation(0, 1, b"a", opaque=s), mutation(0, 2, b"b", opaque=s))
    assert out[:2] == [None, None]
    ack = frame(out[2])
    assert (ack.opcode, ack.status, ack.opaque) == (Opcode.DCP_SNAPSHOT_MARKER, Status.SUCCESS, s)
    assert c.streams[0].acks_sent == 1


@pytest.mark.parametrize("v7,unknown,mismatch", [
    (True, Status.DCP_STREAM_NOT_FOUND, Status.OPAQUE_NO_MATCH),
    (False, Status.KEY_ENOENT, Status.KEY_EEXISTS),
])
def test_message_for_unknown_stream_or_wrong_opaque(replica, v7, unknown, mismatch):
    c = consumer(replica, v7=v7)
    s = open_stream(c, 0)
    (out,) = push(c, mutation(1, 1, b"k", opaque=s))  # no stream for vbucket 1
    assert frame(out).status == unknown
    (out,) = push(c, dcp.DcpSnapshotMarker(0, 1, 1, opaque=s + 1))
    assert (frame(out).status, frame(out).opaque) == (mismatch, s + 1)


def test_mutation_outside_the_snapshot_is_erange(replica):
    c = consumer(replica)
    s = open_stream(c, 0)
    (out,) = push(c, mutation(0, 1, b"k", opaque=s))  # no marker yet
    assert isinstance(out, Refusal) and out.status == Status.ERANGE
    out = push(c, dcp.DcpSnapshotMarker(0, 1, 2, opaque=s), mutation(0, 5, b"k", opaque=s))
    assert out[1].status == Status.ERANGE
    assert replica.vbucket(0).high_seqno == 0


def test_stream_end_closes_the_stream(replica):
    c = consumer(replica)
    s = open_stream(c, 0)
    assert push(c, dcp.DcpStreamEnd(0, StreamEndReason.STATE_CHANGED, s)) == [None]  # no reply
    assert c.out == []
    (out,) = push(c, mutation(0, 1, b"k", opaque=s))
    assert frame(out).status == Status.DCP_STREAM_NOT_FOUND
    assert open_stream(c, 0)


@pytest.mark.parametrize("reason", [StreamEndReason.SLOW, StreamEndReason.BACKFILL_FAIL, StreamEndReason.ROLLBACK])
def test_stream_ends_that_ask_again(replica, reason):
    c = consumer(replica)
    s = open_stream(c, 1)
    push(c, dcp.DcpSnapshotMarker(1, 1, 1, opaque=s), mutation(1, 1, b"k", opaque=s), dcp.DcpStreamEnd(1, reason, s))
    req = stream_req(c)
    assert req.opaque != s and req.start_seqno == 1
    (out,) = push(c, mutation(1, 2, b"k", opaque=s))  # the old opaque is no longer the stream's
    assert frame(out).status == Status.OPAQUE_NO_MATCH


def test_a_takeover_stream_does_not_ask_again(replica):
    c = consumer(replica)
    s = open_stream(c, 1, StreamFlag.TAKEOVER)
    push(c, dcp.DcpStreamEnd(1, StreamEndReason.SLOW, s))
    assert c.out == [] and 1 not in c.streams


def test_close_stream_on_the_consumer(replica):
    c = consumer(replica)
    open_stream(c, 0)
    assert c.close_stream(0) is None
    assert c.close_stream(0) == Refusal(Status.KEY_ENOENT, "no stream for vbucket 0 on this connection")


def test_takeover_set_vbucket_state_pending_then_active(replica):
    c = consumer(replica)
    s = open_stream(c, 0, StreamFlag.TAKEOVER)
    for state in (VBucketState.PENDING, VBucketState.ACTIVE):
        msg = dcp.DcpSetVbucketState(0, int(state), s)
        (change,) = push(c, msg)
        assert isinstance(change, ChangeState) and change.stream is c.streams[0]
        assert replica.vbucket(0).state != state  # the shell runs it once no flush is in flight
        reply = frame(c.change_state(change.stream, change.msg))
        assert (reply.opcode, reply.status, reply.opaque) == (Opcode.DCP_SET_VBUCKET_STATE, Status.SUCCESS, s)
        assert replica.vbucket(0).state == state


def test_vbucket_made_active_by_the_manager_ends_the_stream(replica):
    c = consumer(replica)
    open_stream(c, 3)
    replica.set_vbucket_state(3, VBucketState.ACTIVE)
    c.vbucket_changed(3, "state")
    assert 3 not in c.streams
    c2 = consumer(replica, name="x")
    open_stream(c2, 2)
    c2.changing_state = True  # a change the consumer makes itself (takeover, rollback) does not count
    c2.vbucket_changed(2, "state")
    assert 2 in c2.streams


# -- a consumer and a producer connected in memory --------------------------------------------

def relay(prod, cons, *, rounds: int = 50) -> list[tuple[int, int]]:
    """Carry bytes between a DcpProducer and a DcpConsumer until neither has more:
    the consumer's STREAM_REQs are answered by the producer's `stream_request`, the producer's
    send passes (and backfills) are applied by the consumer, its RollBack orders carried out on
    its engine. Returns the rollbacks: (asked, reached)."""
    rollbacks = []
    for _ in range(rounds):
        moved = False
        for f in sent(cons):
            moved = True
            if f.opcode == Opcode.DCP_STREAM_REQ:
                out = prod.stream_request(dcp.DcpStreamRequest.from_frame(f), collections=False)
                if isinstance(out, Started):
                    reply = dcp.DcpStreamRequestResponse(Status.SUCCESS, out.failover_log, opaque=f.opaque)
                elif isinstance(out, Rollback):
                    reply = dcp.DcpStreamRequestResponse(Status.ROLLBACK, rollback_seqno=out.seqno, opaque=f.opaque)
                else:
                    reply = dcp.DcpStreamRequestResponse(out.status, opaque=f.opaque)
                order = cons.response(frame(reply.encode()), 101.0)
                if order is not None:
                    cons.engine.flush_all()
                    rollbacks.append((order.seqno, cons.engine.rollback(order.stream.vbid, order.seqno)))
                    cons.rolled_back(order.stream)
        run_backfills(prod)
        passes = prod.send_pass()
        for msg in decode(passes.out):
            moved = True
            reply = cons.message(msg, msg.opaque, False)
            assert not isinstance(reply, Refusal), reply
        if not moved:
            return rollbacks
    raise AssertionError("the relay did not settle")


def test_replica_follows_the_active_in_memory(active, replica):
    fill(active, 0, 5)
    p = producer(active, name="replication:a")
    c = consumer(replica)
    assert c.add_stream(dcp.DcpAddStream(0), ADD) is None
    relay(p, c)
    assert replica.vbucket(0).high_seqno == 5
    assert [tuple(e) for e in replica.vbucket(0).failover.entries] == \
        [tuple(e) for e in active.vbucket(0).failover.entries]
    fill(active, 0, 3, prefix="more")
    for s in p.registry.by_vb[0]:
        p.wake(s)
    relay(p, c)
    assert replica.vbucket(0).high_seqno == 8
    assert {k: v.value for k, v in replica.vbucket(0).ht.items()} == \
        {k: v.value for k, v in active.vbucket(0).ht.items()}


def test_a_replica_ahead_on_an_old_branch_rolls_back_and_converges(active, replica):
    """The replica holds 1..8 of branch A (snapshots [0, 5], [6, 8]); the active lost 6..8 and
    started branch B at 5, then wrote on.
    The producer's decision (roll back to 5), the consumer's RollBack order and its new request
    bring the replica to the active's contents."""
    fill(active, 0, 5)
    active.vbucket(0).checkpoint_manager.create_checkpoint()  # snapshots [0, 5] and [6, 8]
    fill(active, 0, 3, prefix="a")
    p = producer(active, name="replication:a")
    c = consumer(replica)
    assert c.add_stream(dcp.DcpAddStream(0), ADD) is None
    relay(p, c)
    assert replica.vbucket(0).high_seqno == 8
    assert c.close_stream(0) is None
    p.release()
    active.flush_all()
    active.rollback(0, 5, new_branch=True)  # the active lost 6..8 and starts branch B at 5
    fill(active, 0, 2, prefix="b")
    p = producer(active, name="replication:b")
    assert c.add_stream(dcp.DcpAddStream(0), ADD) is None
    assert relay(p, c) == [(5, 5)]
    assert c.streams[0].state is PassiveState.READING and c.streams[0].rollbacks == 0
    assert replica.vbucket(0).high_seqno == active.vbucket(0).high_seqno == 7
    assert {k: v.value for k, v in replica.vbucket(0).ht.items()} == \
        {k: v.value for k, v in active.vbucket(0).ht.items()}
