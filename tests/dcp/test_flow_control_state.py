"""Flow control without a socket (dcp/flow_control.py, dcp/send_pass.py): the producer charges
every message its wire size, stops at the window with at most one message beyond it, resumes on
an acknowledgement; the consumer acknowledges at a fifth of its buffer or after a deadline."""


from dcpflow.dcp.flow_control import ACK_SECONDS, BufferAcker, FlowControlWindow
from dcpflow.dcp.producer import DcpProducer
from dcpflow.dcp.send_pass import MAX_PASS_BYTES, TURN_MESSAGES
from dcpflow.engine.store import LARGE_VALUE
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import DcpStreamRequest, OpenFlag

# -- the producer's window --------------------------------------------------------------------------


def test_window_charges_and_acks():
    w = FlowControlWindow()
    assert not w.blocked  # off: never blocked
    w.charge(1000)
    assert w.unacked == 0  # off: nothing counts
    w.buffer_size = 100
    w.charge(60)
    assert (w.unacked, w.blocked) == (60, False)
    w.charge(60)
    assert (w.unacked, w.blocked) == (120, True)  # one message beyond the window at most
    w.ack(50)
    assert (w.unacked, w.total_acked, w.blocked) == (70, 50, False)
    w.ack(500)  # more than outstanding: clears it, no more
    assert (w.unacked, w.total_acked) == (0, 550)


# -- the send pass over real streams ------------------------------------------------------------------

def producer(engine, buffer_size: int, priority: str = "medium") -> DcpProducer:
    p = DcpProducer("t", OpenFlag.PRODUCER, engine, now=0.0, created=0.0)
    assert p.control("connection_buffer_size", str(buffer_size), now=0.0, collections=False) is not None
    p.control("set_priority", priority, now=0.0, collections=False)
    return p


def messages(out: list) -> list:
    d = dcp.DcpDecoder()
    d.feed(b"".join(bytes(x) for x in out))
    return list(d.messages())


def write(engine, vb: int, n: int, value: bytes = b"x" * 100) -> None:
    for i in range(n):
        engine.vbucket(vb).set(b"k%d-%d" % (vb, i), value)


def test_the_pass_stops_at_the_window_and_an_ack_resumes(engine):
    write(engine, 0, 50)
    p = producer(engine, 1000)
    p.stream_request(DcpStreamRequest(0, 0, 50, 0, 0, 0, 0), collections=False)
    first = p.send_pass()
    assert first.blocked and not first.more
    assert first.sent == p.window.unacked == sum(len(x) for x in first.out)
    assert 1000 <= first.sent < 1000 + 200  # the window plus less than one message
    got = messages(first.out)
    assert isinstance(got[0], dcp.DcpSnapshotMarker) and all(isinstance(m, dcp.DcpMutation) for m in got[1:])
    assert p.window.pauses == 1
    assert p.send_pass().sent == 0  # still blocked: nothing more
    p.buffer_ack(first.sent, 1.0)
    assert not p.window.blocked and p.noop.last_received == 1.0
    second = p.send_pass()
    assert second.sent and second.blocked
    seqnos = [m.by_seqno for m in messages(first.out) + messages(second.out) if isinstance(m, dcp.DcpMutation)]
    assert seqnos == list(range(1, len(seqnos) + 1))  # in order, nothing lost or repeated
    total = first.sent + second.sent
    while True:  # the consumer acks everything it gets: the stream completes
        p.buffer_ack(p.window.unacked, 2.0)
        step = p.send_pass()
        if not step.sent:
            break
        total += step.sent
        seqnos += [m.by_seqno for m in messages(step.out) if isinstance(m, dcp.DcpMutation)]
        if isinstance(messages(step.out)[-1], dcp.DcpStreamEnd):
            break
    assert seqnos == list(range(1, 51))
    assert p.bytes_sent == total and p.items_sent == 52  # marker + 50 mutations + STREAM_END


def test_without_flow_control_nothing_is_outstanding(engine):
    write(engine, 1, 20)
    p = producer(engine, 0)
    p.stream_request(DcpStreamRequest(1, 0, 20, 0, 0, 0, 0), collections=False)
    step = p.send_pass()
    assert not step.blocked and step.sent > 20 * 100
    assert p.window.unacked == 0 and p.window.pauses == 0
    assert isinstance(messages(step.out)[-1], dcp.DcpStreamEnd)


def test_a_large_value_is_never_split_from_its_header(engine):
    write(engine, 2, 3, value=b"v" * (LARGE_VALUE * 2))
    p = producer(engine, 10)  # a tiny window: one message per pass
    p.stream_request(DcpStreamRequest(2, 0, 3, 0, 0, 0, 0), collections=False)
    sizes = []
    while True:
        step = p.send_pass()
        if not step.sent:
            break
        got = messages(step.out)
        assert len(got) == 1 and sum(len(x) for x in step.out) == step.sent  # whole messages only
        if isinstance(got[0], dcp.DcpMutation):
            assert step.views and len(step.out) == 2  # header, then the value uncopied
            assert got[0].value == b"v" * (LARGE_VALUE * 2)
        sizes.append(step.sent)
        p.buffer_ack(step.sent, 0.0)
    assert len(sizes) == 5  # marker, three mutations, STREAM_END


def test_the_batch_of_set_priority_bounds_a_pass(engine):
    write(engine, 3, 300, value=b"y" * 10)
    p = producer(engine, 0, priority="low")  # 100 messages per pass
    p.stream_request(DcpStreamRequest(3, 0, 300, 0, 0, 0, 0), collections=False)
    step = p.send_pass()
    assert step.more and not step.blocked
    assert 100 <= step.messages < 100 + 300  # stops once the batch is reached (runs count whole)


def test_streams_take_turns_and_a_pass_stops_at_its_bytes(engine):
    for vb in (0, 1):
        write(engine, vb, 400, value=b"z" * LARGE_VALUE)
    p = producer(engine, 0, priority="high")
    for vb in (0, 1):
        p.stream_request(DcpStreamRequest(vb, 0, 400, 0, 0, 0, 0), collections=False)
    step = p.send_pass()
    vbs = [m.vbucket for m in messages(step.out)]
    # vbucket 0 had everything queued, but its turn ends after TURN_MESSAGES: vbucket 1's follows
    assert vbs[:TURN_MESSAGES] == [0] * TURN_MESSAGES and vbs[TURN_MESSAGES] == 1
    assert vbs.count(0) < 402
    assert step.more and not step.blocked  # MAX_PASS_BYTES, not the batch, ended this pass
    # the budget is checked between turns: two turns of ~2 KiB messages pass 1 MiB
    assert step.sent >= MAX_PASS_BYTES and step.messages == 2 * TURN_MESSAGES


# -- the consumer's acknowledgements --------------------------------------------------------------------

def test_the_consumer_acks_at_a_fifth_of_its_buffer():
    a = BufferAcker(1000)
    assert a.threshold == 200
    assert not a.consumed(150, 10.0)
    assert a.deadline == 10.0 + ACK_SECONDS  # the first unacknowledged bytes start the clock
    assert not a.consumed(40, 11.0) and a.deadline == 10.0 + ACK_SECONDS
    assert a.consumed(10, 12.0)  # 200: due now
    assert a.take() == 200
    assert (a.unacked, a.total_acked, a.bytes_received, a.deadline) == (0, 200, 200, None)
    assert a.take() == 0  # nothing more to acknowledge


def test_the_deadline_restarts_after_an_ack():
    a = BufferAcker(10_000)
    a.consumed(100, 0.0)
    assert a.take() == 100  # the timer fired
    assert a.deadline is None
    a.consumed(1, 7.0)
    assert a.deadline == 7.0 + ACK_SECONDS
