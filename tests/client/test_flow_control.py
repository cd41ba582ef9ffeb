"""Flow control with a slow application: the client never holds more unacknowledged stream bytes
than the buffer plus one message (flow-control.md), however large the backlog, and everything
still arrives."""

import asyncio

import pytest

from dcpflow.client import DcpClient, Mutation, Offset

from .conftest import PASSWORD, USER, keys_in, run, url, write

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


def test_a_slow_reader_whose_cursor_is_dropped_still_gets_everything(make_server):
    """The client tolerates cursor dropping (it says so with supports_cursor_dropping_vulcan): over
    the server's checkpoint quota its stalled cursor is dropped instead of pinning memory, the
    stream goes back to disk, and the reader still ends up with every document."""
    from tests.dcp.conftest import dropped_cursors, overfill, server_dropped

    srv = make_server(checkpoint_memory_quota=20_000, checkpoint_max_items=50)

    async def go():
        async with await DcpClient.connect(url(srv.port, buffer_size=2048), USER, PASSWORD) as c:
            loop = asyncio.get_running_loop()
            first_key = keys_in(0, 1, prefix="first")[0]
            with srv.login() as w:
                await loop.run_in_executor(None, lambda: w.set(first_key, b"x" * 500, vbucket=0))
            stream = c.events([0], start={0: Offset()})
            first = await stream.__anext__()  # the stream is open (a marker, then "first")
            await loop.run_in_executor(None, overfill, srv, 0)  # nothing is read meanwhile
            assert await loop.run_in_executor(None, server_dropped, srv, 0)
            got = {first.key: len(first.value)} if isinstance(first, Mutation) else {}
            async for ev in stream:
                if isinstance(ev, Mutation):
                    got[ev.key] = len(ev.value)
                    if len(got) == 421:
                        break
            await stream.aclose()
            return got
    got = run(go())
    assert len(got) == 421 and set(got.values()) == {500}
    assert dropped_cursors(srv, 0) >= 1
