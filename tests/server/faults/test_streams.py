"""Stream ends with a chosen reason through REST: STREAM_END(reason) is the last message of the
chosen streams (by vbucket and DCP connection name), the others go on; SLOW drops the stream's
checkpoint cursor as memory pressure does - a connection that opted into cursor dropping goes on
from disk, any other gets STREAM_END(SLOW); OK and CLOSED are refused. dcpflow's client reopens
after each reason and ends with the server's contents, nothing delivered twice."""

import asyncio
import time

import pytest

from dcpflow.client import DcpClient as AppClient
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason
from dcpflow.protocol.status import Status
from dcpflow.server.faults import END_REASONS
from dcpflow.server.faults import streams as fault_streams
from tests.client.conftest import contents, run, url, write
from tests.dcp.client import DcpClient, items, markers

from ..conftest import keys_in
from .helpers import PASSWORD, USER, Follower, Mirror, caught_up, high_seqnos, http_of, persisted, raw


def watcher(server, name: str, vbuckets, **controls) -> DcpClient:
    c = DcpClient(server.port)
    c.num_vbuckets = 64
    c.connect(name=name)
    if controls:
        c.controls(**controls)
    for vb in vbuckets:
        assert c.stream_request(vb).status == Status.SUCCESS
    return c


def open_streams(server) -> int:
    return server.call(lambda: len(fault_streams.open_streams(server.server)))


@pytest.mark.parametrize("reason", [r for r in END_REASONS if r != StreamEndReason.SLOW], ids=lambda r: r.name)
def test_the_chosen_streams_end_with_the_chosen_reason_and_the_others_go_on(server, reason):
    http = http_of(server)
    with watcher(server, "a", [1, 2]) as a, watcher(server, "b", [1]) as b:
        reply = http.post("/faults/buckets/default/streams/end", {"reason": reason.name.lower(), "name": "a",
                                                                  "vbuckets": "1"})
        assert reply.status == 200, reply
        assert reply.json == {"bucket": "default", "reason": reason.name,
                              "streams": [{"connection": "a", "vbucket": 1, "outcome": f"STREAM_END({reason.name})"}]}
        end = a.until_stream_end(1)[-1]
        assert (end.vbucket, end.reason) == (1, reason)
        with server.login() as w:
            k1, k2 = keys_in(1, 1, prefix="go")[0], keys_in(2, 1, prefix="go")[0]
            w.set(k1, b"x")
            w.set(k2, b"y")
        assert items(a.messages_until(lambda m: isinstance(m, dcp.DcpMutation)))[0].key == k2
        assert items(b.messages_until(lambda m: isinstance(m, dcp.DcpMutation)))[0].key == k1
        assert not [m for m in a.quiet(0.2) if isinstance(m, dcp.DcpMutation) and m.vbucket == 1]


def test_ok_and_closed_are_refused(server):
    http = http_of(server)
    for reason in ("OK", "closed", "1"):
        reply = http.post("/faults/buckets/default/streams/end", {"reason": reason})
        assert reply.status == 400 and "reason" in reply.json["errors"], reply
    assert http.post("/faults/buckets/default/streams/end", {"reason": "SLOWER"}).status == 400


def test_slow_without_cursor_dropping_ends_the_stream_slow(server):
    http = http_of(server)
    keys = keys_in(3, 3, prefix="slow")
    with server.login() as w:
        for k in keys:
            w.set(k, b"v")
    with watcher(server, "plain", [3]) as c:
        assert len(items(c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 3))) == 3
        reply = http.post("/faults/buckets/default/streams/end", {"reason": "SLOW"})
        assert reply.json["streams"] == [{"connection": "plain", "vbucket": 3,
                                          "outcome": "cursor dropped: STREAM_END(SLOW)"}]
        assert c.until_stream_end(3)[-1].reason == StreamEndReason.SLOW


def test_slow_with_cursor_dropping_goes_back_to_disk_and_loses_nothing(make_server):
    """A consumer that lags (flow control holds its window, its cursor pins old checkpoints) has
    its cursor dropped: once it has read what was queued, the rest comes from disk as a Disk
    snapshot, then from memory - every item once, in order, and the stream never ends."""
    server = make_server(checkpoint_max_items=5)
    http = http_of(server)
    vb = 7
    keys = keys_in(vb, 60, prefix="lag")
    value = b"v" * 20_000
    with watcher(server, "lagging", [vb], supports_cursor_dropping="true", connection_buffer_size=65536) as c:
        with server.login() as w:
            for k in keys:
                assert w.set(k, value).status == Status.SUCCESS
            persisted(w, vb, 60)  # everything is on disk: only the lagging cursor holds the checkpoints
        reply = http.post("/faults/buckets/default/streams/end", {"reason": "slow", "vbuckets": str(vb)})
        assert reply.json["streams"] == [{"connection": "lagging", "vbucket": vb,
                                          "outcome": "cursor dropped: the stream goes on from disk"}]
        got = c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 60, ack=True, timeout=60)
        assert [m.by_seqno for m in items(got)] == list(range(1, 61))
        assert not [m for m in got if isinstance(m, dcp.DcpStreamEnd)]
        disk = [m for m in markers(got) if m.flags & SnapshotFlag.DISK]
        assert disk and disk[0].start_seqno > 1  # the backfill starts where the queued messages ended
        stats = c.stats("dcp")
        assert stats[f"eq_dcpq:lagging:stream_{vb}_cursor_drops"] == "1"


def test_the_client_reopens_after_every_reason_and_ends_with_the_servers_contents(server):
    http = http_of(server)
    universe = [f"doc{i}".encode() for i in range(60)] + [f"r{n}-{i}".encode() for n in range(8) for i in range(8)]
    with raw(server.port) as w:
        write(w, 60)
    reasons = [r for r in END_REASONS]

    async def go():
        loop = asyncio.get_running_loop()
        ended = {}
        async with await AppClient.connect(url(server.port), USER, PASSWORD) as c:
            stream = c.events()
            mirror = Mirror()
            f = Follower(stream, mirror)
            for n, reason in enumerate(reasons):
                await f.until(lambda: open_streams(server) == 64)  # every stream is open again
                reply = await loop.run_in_executor(None, http.post, "/faults/buckets/default/streams/end",
                                                   {"reason": reason.name})
                assert reply.status == 200, reply
                ended[reason] = len(reply.json["streams"])
                with raw(server.port) as w:
                    await loop.run_in_executor(None, write, w, 8, f"r{n}-")
                    highs = high_seqnos(w)
                await f.until(caught_up(stream, highs))
            return mirror, await f.stop(), ended

    mirror, stats, ended = run(go(), timeout=120)
    with raw(server.port) as r:
        truth = contents(r, universe)
    assert mirror.state() == truth and len(truth) == 60 + 8 * len(reasons)
    assert len(mirror.ids) == len(set(mirror.ids))  # nothing delivered twice
    assert all(n == 64 for n in ended.values())
    for reason in reasons:
        expected = 0 if reason == StreamEndReason.SLOW else 64  # the client opts into cursor dropping
        assert stats.get(f"stream_end_{reason.name.lower()}", 0) == expected, (reason, stats)


def test_streams_of_other_buckets_and_connections_are_left_alone(server):
    http = http_of(server)
    assert http.post("/pools/default/buckets", {"name": "other", "ramQuotaMB": "100", "numVBuckets": "4"}).status == 202
    with watcher(server, "mine", [0]) as mine:
        other = DcpClient(server.port)
        other.num_vbuckets = 4
        other.connect(bucket="other", name="mine")  # the same name on another bucket
        assert other.stream_request(0).status == Status.SUCCESS
        with other:
            reply = http.post("/faults/buckets/default/streams/end", {"reason": "STATE_CHANGED", "name": "mine",
                                                                      "vbuckets": "all"})
            assert [s["connection"] for s in reply.json["streams"]] == ["mine"]
            assert mine.until_stream_end(0)[-1].reason == StreamEndReason.STATE_CHANGED
            assert not [m for m in other.quiet(0.2) if isinstance(m, dcp.DcpStreamEnd)]
            assert http.post("/faults/buckets/default/streams/end", {"reason": "SLOW", "name": "nobody"}).json[
                "streams"] == []
    deadline = time.monotonic() + 60
    while open_streams(server):  # the connections closed
        assert time.monotonic() < deadline
        time.sleep(0.01)
