"""Takeover streams (KV-Engine's rebalance.md, as its code behaves): once caught up the
markers carry the Ack flag; after the consumer acknowledged them the producer sends
SET_VBUCKET_STATE(pending), waits, marks its own vbucket dead, drains what was written
meanwhile, sends SET_VBUCKET_STATE(active), waits, and ends with STREAM_END(OK). End to end here;
each step and the replies tolerated or not are checked without a socket in test_stream_rules.py."""

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason, StreamFlag, VBucketState
from dcpflow.protocol.status import Status

from .client import items
from .conftest import fill, vbucket

MAX = 0xFFFFFFFFFFFFFFFF


def test_takeover_handshake(server, clients, writer):
    fill(writer, 3, 5)
    other = clients(name="bystander")
    assert other.stream_request(3).status == Status.SUCCESS
    c = clients(name="takeover")
    assert c.stream_request(3, 0, 10, flags=StreamFlag.TAKEOVER).status == Status.SUCCESS
    log = []
    acked_markers = 0
    while True:
        m = c.next_message()
        log.append(m)
        if isinstance(m, dcp.DcpSnapshotMarker) and m.flags & SnapshotFlag.ACK:
            # acknowledge once the snapshot's items are in
            while True:
                item = c.next_message()
                log.append(item)
                if item.by_seqno >= m.end_seqno:
                    break
            c.send(m.response())
            acked_markers += 1
        elif isinstance(m, dcp.DcpSetVbucketState):
            if m.state == VBucketState.PENDING:
                # before answering, the vbucket is still active and takes writes
                assert vbucket(server, 3).state == VBucketState.ACTIVE
                fill(writer, 3, 2, prefix="late")  # 6, 7: must still reach the new owner
            c.send(m.response())
        elif isinstance(m, dcp.DcpStreamEnd):
            break
    states = [m.state for m in log if isinstance(m, dcp.DcpSetVbucketState)]
    assert states == [VBucketState.PENDING, VBucketState.ACTIVE]
    assert log[-1].reason == StreamEndReason.OK
    assert [m.by_seqno for m in items(log)] == list(range(1, 8))
    pending_at = next(i for i, m in enumerate(log) if isinstance(m, dcp.DcpSetVbucketState))
    assert [m.by_seqno for m in items(log[pending_at:])] == [6, 7]  # drained after the switch
    assert acked_markers >= 1
    assert vbucket(server, 3).state == VBucketState.DEAD
    assert writer.set(b"after", b"v", vbucket=3).status == Status.NOT_MY_VBUCKET
    # other streams of the vbucket end when it changes state
    ended = other.messages_until(lambda m: isinstance(m, dcp.DcpStreamEnd))
    assert ended[-1].reason == StreamEndReason.STATE_CHANGED


def test_consumer_error_reply_disconnects(server, clients, writer):
    fill(writer, 5, 1)
    c = clients()
    c.stream_request(5, 0, MAX, flags=StreamFlag.TAKEOVER)
    msgs = c.quiet(0.5)
    target = next(m for m in msgs if isinstance(m, (dcp.DcpSnapshotMarker, dcp.DcpSetVbucketState)))
    c.send(target.response(Status.EINVAL))  # an error other than the tolerated ones
    assert c.is_closed(3)

