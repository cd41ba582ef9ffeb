"""The event API against a real server: what arrives, from where, and how a restart resumes."""

import asyncio
import time

import pytest

from dcpflow.client import (
    DcpClient,
    Deletion,
    Expiration,
    JsonFileStore,
    MemoryStore,
    Mutation,
    Offset,
    StreamEnd,
)
from dcpflow.client.streams import OPEN
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.keys import vbucket_for_key

from .conftest import PASSWORD, USER, contents, engine_vbucket, flush_to_disk, keys_in, run, url, write


async def collect(client, **kw) -> list:
    return [ev async for ev in client.events(**kw)]


def test_from_beginning_until_now(server, writer):
    docs = write(writer, 300)
    writer.set(b"flagged", b"raw", flags=0xDEADBEEF, expiry=0)
    writer.delete(b"doc10")

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            logs = await c.failover_logs(range(64))
            events = await collect(c, end="now")
            return events, logs
    events, logs = run(go())
    muts = [e for e in events if isinstance(e, Mutation)]
    dels = [e for e in events if isinstance(e, Deletion)]
    ends = [e for e in events if isinstance(e, StreamEnd)]
    del docs[b"doc10"]  # its mutation and deletion are one key in one snapshot: only the deletion remains
    assert {e.key: e.value for e in muts} == {**docs, b"flagged": b"raw"}
    assert [e.key for e in dels] == [b"doc10"] and dels[0].delete_time > 0
    assert sorted(e.vbucket for e in ends) == list(range(64)) and all(e.reason == StreamEndReason.OK for e in ends)
    flagged = next(e for e in muts if e.key == b"flagged")
    assert flagged.flags == 0xDEADBEEF and flagged.datatype == 0 and flagged.collection_id == 0
    for e in muts + dels:
        assert e.vbucket == vbucket_for_key(e.key, 64)
        assert e.vbuuid == logs[e.vbucket][0][0]
        assert e.snapshot_start <= e.seqno <= e.snapshot_end and e.cas and e.rev_seqno >= 1
    by_vb: dict[int, list[int]] = {}
    for e in muts + dels:
        by_vb.setdefault(e.vbucket, []).append(e.seqno)
    assert all(s == sorted(s) and len(set(s)) == len(s) for s in by_vb.values())  # seqno order, no repeats
    # Every StreamEnd carries the committed offset: the vbucket's high seqno, a boundary.
    highs = {vb: max(s) for vb, s in by_vb.items()}
    assert all(e.offset.seqno == highs.get(e.vbucket, 0) and e.offset.is_boundary for e in ends)


def test_from_now_sees_only_new_changes_and_explicit_ends(server, writer):
    write(writer, 50, prefix="old")
    vb = 7
    keys = keys_in(vb, 6, prefix="new")

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            stream = c.events([vb], start="now")
            got = []
            loop = asyncio.get_running_loop()

            async def read():
                async for ev in stream:
                    got.append(ev)
                    if len(got) == 3:
                        return
            reader = asyncio.ensure_future(read())
            while stream.feed is None or stream.feed.streams[vb].state != OPEN:  # opened at "now"
                await asyncio.sleep(0.01)
            await loop.run_in_executor(None, lambda: [writer.set(k, b"v") for k in keys[:3]])
            await reader
            await stream.aclose()
            start = (await c.offsets_now([vb]))[vb]
            for k in keys[3:]:
                await loop.run_in_executor(None, writer.set, k, b"w")
            bounded = await collect(c, vbuckets=[vb], start={vb: start}, end={vb: start.seqno + 2})
            return got, bounded
    got, bounded = run(go())
    assert [e.key for e in got] == keys[:3]
    # A bounded stream ends after the snapshot that contains its end seqno (stream-request.md):
    # with one write per snapshot, exactly the two requested.
    assert [e.key for e in bounded if isinstance(e, Mutation)] == keys[3:5]
    assert isinstance(bounded[-1], StreamEnd) and bounded[-1].offset.seqno == got[-1].seqno + 2


def test_expirations_arrive_as_their_own_event(make_server):
    server = make_server(expiry_interval=0.2)
    with server.login() as w:
        w.set(b"short-lived", b"x", expiry=int(time.time()) + 1)
        w.set(b"kept", b"y")
    vb = vbucket_for_key(b"short-lived", server.config.num_vbuckets)
    written = engine_vbucket(server, vb, "high_seqno")
    deadline = time.monotonic() + 60  # the pager expires it within about 1.2 s, unless the machine is busy
    while engine_vbucket(server, vb, "high_seqno") == written:  # the expiration takes the next seqno
        assert time.monotonic() < deadline, "the expiry pager did not expire the document"
        time.sleep(0.05)
    flush_to_disk(server, vb)  # and the stream reads it from disk, below

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            return await collect(c, end="now")
    events = run(go())
    exp = [e for e in events if isinstance(e, Expiration)]
    assert [e.key for e in exp] == [b"short-lived"] and exp[0].event == "expiration" and exp[0].delete_time > 0
    assert [e.key for e in events if isinstance(e, Mutation)] == [b"kept"]  # the expired item's mutation was
    # de-duplicated away: one snapshot from disk holds the latest version of each key


def test_offsets_are_saved_on_time_while_the_stream_is_idle(server, writer, tmp_path):
    """save_interval holds when nothing new arrives: an idle reader killed after the interval
    loses nothing it had consumed (docs/client.md)."""
    store = JsonFileStore(tmp_path / "offsets.json")
    write(writer, 20)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            stream = c.events(start="beginning", state=store, save_interval=0.2)
            seen = 0
            it = stream.__aiter__()
            while seen < 20:
                if isinstance(await it.__anext__(), Mutation):
                    seen += 1
            waiter = asyncio.ensure_future(it.__anext__())  # idle: nothing more will come
            deadline = time.monotonic() + 30  # saved within 0.2 s, unless the machine is busy
            while (saved := store.load()) is None or saved.offsets != stream.offsets:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            waiter.cancel()
            return saved, dict(stream.offsets)
    saved, offsets = run(go())
    assert saved is not None and saved.offsets == offsets
    assert sum(o.seqno for o in offsets.values()) == 20


def test_resume_after_restart_no_loss_duplicates_only_within_a_snapshot(server, writer, tmp_path):
    """Consume part of the changes, stop, start a new client from the saved offsets: every change
    arrives, and the only repeats are seqnos after the saved (committed) offset that the first run
    had already consumed - the rest of a snapshot it did not finish (offsets.py)."""
    store = JsonFileStore(tmp_path / "offsets.json")
    write(writer, 400, size=50)

    async def first():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            stream = c.events(start="saved", state=store)
            seen = []
            async for ev in stream:
                if isinstance(ev, Mutation):
                    seen.append(ev)
                if len(seen) == 150:
                    break
            committed = dict(stream.offsets)
            positions = dict(stream.positions)
            await stream.save()
            await stream.aclose()
            return seen, committed, positions

    seen1, committed, positions = run(first())
    assert store.load().offsets == committed
    assert any(committed[vb] != positions[vb] for vb in committed)  # we did stop inside a snapshot
    # More changes while the client is away, some to keys already read.
    write(writer, 100, start=350, size=50)
    writer.delete(b"doc1")

    async def second():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            return [ev async for ev in c.events(start="saved", state=store, end="now")]
    seen2 = [e for e in run(second()) if isinstance(e, Mutation | Deletion)]
    # No loss: applying both runs in order gives exactly what the server holds.
    mirror: dict[bytes, bytes] = {}
    for e in seen1 + seen2:
        if isinstance(e, Mutation):
            mirror[e.key] = e.value
        else:
            mirror.pop(e.key, None)
    assert mirror == contents(writer, [f"doc{i}".encode() for i in range(450)])
    # Duplicates only within (committed, position] of the first run.
    first_ids = {(e.vbucket, e.seqno) for e in seen1}
    for e in seen2:
        if (e.vbucket, e.seqno) in first_ids:
            assert committed[e.vbucket].seqno < e.seqno <= positions[e.vbucket].seqno
    assert len({(e.vbucket, e.seqno) for e in seen2}) == len(seen2)
    # The second run saved its end: a third run has nothing to read.

    async def third():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            return [ev async for ev in c.events(start="saved", state=store, end="now") if not isinstance(ev,
                                                                                                         StreamEnd)]
    assert run(third()) == []


def test_consumed_means_asked_for_the_next(server, writer):
    """Breaking out of the loop leaves the current event unconsumed: its offset is not committed."""
    keys = keys_in(3, 2)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            store = MemoryStore()
            start = await c.offsets_now([3])
            stream = c.events([3], start=start, state=store)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, writer.set, keys[0], b"a")
            async for ev in stream:
                assert ev.key == keys[0]
                before = stream.offsets[3]
                break
            after_break = stream.offsets[3]
            await stream.aclose()
            return before, after_break, start[3]
    before, after, start = run(go())
    assert before == after == start and start.seqno == 0


def test_bad_start_arguments(server):
    async def go(**kw):
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            async for _ in c.events(**kw):
                pass
    with pytest.raises(ValueError, match="start must be"):
        run(go(start="yesterday"))
    with pytest.raises(ValueError, match="needs a state store"):
        run(go(start="saved"))
    with pytest.raises(ValueError, match="vbucket 0: offset"):
        run(go(start={0: Offset(1, 5, 6, 9)}))
    with pytest.raises(ValueError, match="end must be"):
        run(go(end="later"))


def test_closing_the_client_ends_a_waiting_read(server, writer):
    write(writer, 5)

    async def go():
        c = await DcpClient.connect(url(server.port), USER, PASSWORD)
        got = []

        async def read():
            async for ev in c.events():  # unbounded: waits for more after the 5
                got.append(ev)
        task = asyncio.ensure_future(read())
        while len(got) < 5:
            await asyncio.sleep(0.01)
        await c.close()
        await asyncio.wait_for(task, 5)
        return got
    assert len(run(go())) == 5
