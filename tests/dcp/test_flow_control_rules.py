"""Flow control without a socket: the rules tests/dcp/test_flow_control.py checks over a server
(flow-control.md, buffer-ack.md as KV-Engine's code behaves), asserted on the bytes a
DcpProducer's send passes return between the consumer's acknowledgements: every message
is charged its wire size, never more than the buffer plus one message is unacknowledged, nothing
more goes out until an ack, any ack size resumes it, and size 0 disables it. A hypothesis
property covers buffer sizes, value sizes (LARGE_VALUE ones are sent without copying), memory or
disk, and how much each ack returns."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.dcp.producer import Started
from dcpflow.protocol.dcp import DcpStreamEnd

from .sansio import decode, engine_fixture, fill, items, make_engine, producer, request, run_backfills, to_disk_only

engine = engine_fixture(4)


def window_pass(p) -> bytes:
    """What the connection sends until the window (or the work) stops it, backfills run between."""
    out = b""
    while True:
        sp = p.send_pass()
        out += b"".join(bytes(x) for x in sp.out)
        ran = run_backfills(p)
        if not sp.out and not sp.more and not ran:
            return out


def stream_under_window(p, buffer: int, biggest: int, ack_share: float) -> list:
    """Read everything a connection with a `buffer`-byte window sends, acknowledging `ack_share`
    of what is outstanding each time it stops; checks the window at every stop."""
    acked = received = 0
    msgs: list = []
    for _ in range(10_000):
        data = window_pass(p)
        received += len(data)
        msgs += decode([data])
        outstanding = received - acked
        assert outstanding <= buffer + biggest, outstanding  # at most one message beyond the window
        assert p.window.unacked == outstanding  # charged at its wire size
        if any(isinstance(m, DcpStreamEnd) for m in msgs):
            return msgs
        assert outstanding >= buffer, "the producer stopped below its window"
        assert window_pass(p) == b""  # and sends nothing more until an ack
        part = max(1, int(outstanding * ack_share))
        p.buffer_ack(part, 100.0)
        acked += part
    raise AssertionError("the stream did not end")


@pytest.mark.parametrize("backfill", [False, True])
@pytest.mark.parametrize("size", [300, 5000])  # 5000: values sent without copying (LARGE_VALUE)
def test_never_more_than_buffer_plus_one_message(engine, backfill, size):
    value = b"x" * size
    n = 100 if size < 1000 else 20
    fill(engine, 0, n, value=value)
    if backfill:
        to_disk_only(engine, 0)
    p = producer(engine)
    p.control("connection_buffer_size", "2000", now=100.0, collections=False)
    assert isinstance(p.stream_request(request(0, 0, n), collections=False), Started)
    msgs = stream_under_window(p, 2000, 24 + 31 + 8 + len(value) + 16, 0.5)
    assert [m.by_seqno for m in items(msgs)] == list(range(1, n + 1))
    assert all(m.value == value for m in items(msgs))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(buffer=st.integers(1, 5000), sizes=st.lists(st.integers(0, 9000), min_size=1, max_size=12),
       backfill=st.booleans(), ack_share=st.floats(0.01, 1.0))
def test_the_window_holds_for_any_buffer_values_and_acks(tmp_path_factory, buffer, sizes, backfill, ack_share):
    engine = make_engine(tmp_path_factory.mktemp("fc"), 1)
    try:
        vb = engine.vbucket(0)
        for i, size in enumerate(sizes):
            vb.set(b"k%d" % i, b"v" * size)
        if backfill:
            to_disk_only(engine, 0)
        p = producer(engine)
        p.control("connection_buffer_size", str(buffer), now=100.0, collections=False)
        assert isinstance(p.stream_request(request(0, 0, len(sizes)), collections=False), Started)
        biggest = 24 + 31 + 8 + 4 + max(sizes) + 16  # a mutation of this test (key, extras, header)
        msgs = stream_under_window(p, buffer, max(biggest, 24 + 44 + 8), ack_share)
        assert [m.by_seqno for m in items(msgs)] == list(range(1, len(sizes) + 1))
        assert [len(m.value) for m in items(msgs)] == sizes
    finally:
        engine.close(clean=False)


def test_stalls_without_ack_and_resumes_with_one(engine):
    fill(engine, 0, 50, value=b"y" * 100)
    p = producer(engine)
    p.control("connection_buffer_size", "500", now=100.0, collections=False)
    p.stream_request(request(0, 0, 50), collections=False)
    first = len(window_pass(p))
    assert 500 <= first < 500 + 200
    assert window_pass(p) == b""  # nothing more until acknowledged
    p.buffer_ack(first, 100.0)
    assert len(window_pass(p)) >= 500


def test_zero_disables_flow_control(engine):
    fill(engine, 0, 100, value=b"z" * 200)
    p = producer(engine)
    p.control("connection_buffer_size", "300", now=100.0, collections=False)
    p.control("connection_buffer_size", "0", now=100.0, collections=False)
    p.stream_request(request(0, 0, 100), collections=False)
    assert len(items(decode([window_pass(p)]))) == 100  # never acked


def test_buffer_size_is_enforced_across_streams(engine):
    for vb in range(4):
        fill(engine, vb, 30, value=b"w" * 100)
    p = producer(engine)
    p.control("connection_buffer_size", "1000", now=100.0, collections=False)
    for vb in range(4):
        p.stream_request(request(vb, 0, 30), collections=False)
    sent = len(window_pass(p))
    assert 1000 <= sent <= 1000 + 24 + 31 + 100 + 8
