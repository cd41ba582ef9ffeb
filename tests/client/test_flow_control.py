"""Flow control with a slow application: the client never holds more unacknowledged stream bytes
than the buffer plus one message (flow-control.md), however large the backlog, and everything
still arrives."""

import asyncio

import pytest

from dcpflow.client import DcpClient, Mutation, Offset

from .conftest import PASSWORD, USER, run, url, write

BUFFER = 16 * 1024
DOC = 400


@pytest.fixture
def backlog(server, writer):
    return write(writer, 1500, size=DOC)  # ~0.7 MB: ~45 windows


def test_slow_event_consumer_stays_within_the_window(server, backlog):
    biggest = max(len(k) + len(v) for k, v in backlog.items()) + 55 + 1  # mutation overhead + collection prefix

    async def go():
        async with await DcpClient.connect(url(server.port, buffer_size=BUFFER), USER, PASSWORD) as c:
            stream = c.events(end="now")
            got = {}
            async for ev in stream:
                if isinstance(ev, Mutation):
                    got[ev.key] = ev.value
                    if len(got) % 50 == 0:
                        await asyncio.sleep(0.01)  # the application is slow: the producer must wait
            conn_acks = stream.stats
            return got, stream.feed.outstanding(), conn_acks
    got, outstanding, stats = run(go())
    assert got == backlog
    assert 0 < outstanding <= BUFFER + biggest, f"held {outstanding} unacknowledged bytes, window {BUFFER}"
    assert stats["max_queued_bytes"] <= BUFFER + biggest


def test_batch_reader_bound_is_window_plus_one_batch(server, backlog):
    async def go():
        async with await DcpClient.connect(url(server.port, buffer_size=BUFFER), USER, PASSWORD) as c:
            highs = await c.high_seqnos()
            reader = c.batches({vb: Offset() for vb in highs}, highs, max_rows=100)
            rows = 0
            async for batch in reader:
                rows += batch.num_rows
                await asyncio.sleep(0.005)
            return rows, reader.feed.outstanding()
    rows, outstanding = run(go())
    assert rows == len(backlog)
    assert outstanding <= BUFFER + 100 * (DOC + 80)


def test_without_flow_control_reading_pauses_instead(server, backlog):
    """buffer_size=0 disables DCP flow control; the client then stops reading the socket once its
    queue passes the high-water mark, so memory stays bounded by TCP instead."""
    async def go():
        async with await DcpClient.connect(url(server.port, buffer_size=0), USER, PASSWORD) as c:
            stream = c.events(end="now")
            stream_feed_limit = None
            n = 0
            async for ev in stream:
                if stream_feed_limit is None and stream.feed is not None:
                    stream.feed._high_water = 32 * 1024
                    stream_feed_limit = stream.feed._high_water
                n += isinstance(ev, Mutation)
                if n % 100 == 0:
                    await asyncio.sleep(0.01)
            return n, stream.stats["max_queued_bytes"], stream_feed_limit
    n, queued, limit = run(go())
    assert n == len(backlog)
    total = sum(len(k) + len(v) + 56 for k, v in backlog.items())
    assert queued <= limit + 256 * 1024 < total  # at most one socket read (256 KiB) past the mark
