"""Vbucket faults through REST, as a consumer meets them: a failover (a new failover entry; its
streams end STATE_CHANGED; clean: resuming needs no rollback, unclean: the writes that were not
persisted are gone and a consumer that saw them rolls back to the persisted seqno) and a
rollback to a seqno (everything above it gone from memory and disk, a new entry there, streams
end ROLLBACK, the next stream request is told to roll back). Checked on the wire with the test
DCP client and end to end with dcpflow's client, which must end with the server's contents."""

import asyncio

from dcpflow.client import DcpClient as AppClient
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.status import Status
from tests.client.conftest import contents, run, url, write
from tests.dcp.client import DcpClient, items

from ..conftest import keys_in
from .helpers import (
    PASSWORD,
    USER,
    Follower,
    Mirror,
    caught_up,
    high_seqnos,
    http_of,
    persisted,
    raw,
    vb_state,
    wait_persisted,
)

VB = 5


def test_clean_failover_ends_streams_and_the_consumer_resumes_without_rolling_back(server):
    http = http_of(server)
    keys = keys_in(VB, 6, prefix="cf")
    with server.login() as w:
        for k in keys[:4]:
            assert w.set(k, b"v").status == Status.SUCCESS
    before = vb_state(server, VB)
    with DcpClient(server.port) as c:
        c.num_vbuckets = 64
        c.connect(name="watcher")
        assert c.stream_request(VB, uuid=before["uuid"]).status == Status.SUCCESS
        assert len(items(c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 4))) == 4
        reply = http.post("/faults/buckets/default/failover", {"vbuckets": str(VB)})
        assert reply.status == 200, reply
        body = reply.json
        assert body["unclean"] is False and body["streams_ended"] == 1
        [done] = body["vbuckets"]
        assert (done["vbucket"], done["seqno"], done["lost"], done["high_seqno_before"]) == (VB, 4, 0, 4)
        assert c.until_stream_end(VB)[-1].reason == StreamEndReason.STATE_CHANGED
        after = vb_state(server, VB)
        assert after["log"] == [(done["uuid"], 4), *before["log"]] and after["high"] == 4
        resumed = c.stream_request(VB, start=4, uuid=before["uuid"])  # from the old branch: nothing lost
        assert resumed.status == Status.SUCCESS and resumed.failover_log[0] == (done["uuid"], 4)
        with server.login() as w:
            assert w.set(keys[4], b"after").status == Status.SUCCESS
        got = items(c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 5))
        assert [(m.key, m.value) for m in got] == [(keys[4], b"after")]
    assert server.server.mgmt.observer.failovers["default"] == 1


def test_unclean_failover_loses_the_unpersisted_writes_and_consumers_roll_back(server):
    http = http_of(server)
    keys = keys_in(VB, 8, prefix="uf")
    with server.login() as w:
        for k in keys[:3]:
            w.set(k, b"kept")
        persisted(w, VB, 3)
        assert http.post("/faults/buckets/default/persistence/pause").json["paused"] is True
        for k in keys[3:6]:
            w.set(k, b"doomed")  # 4..6: acknowledged, in memory only
    before = vb_state(server, VB)
    assert (before["high"], before["persisted"]) == (6, 3)
    with DcpClient(server.port) as c:
        c.num_vbuckets = 64
        c.connect(name="watcher")
        assert c.stream_request(VB, uuid=before["uuid"]).status == Status.SUCCESS
        c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 6)
        reply = http.post("/faults/buckets/default/failover", {"vbuckets": str(VB), "unclean": "true"})
        assert reply.status == 200, reply
        [done] = reply.json["vbuckets"]
        assert (done["seqno"], done["lost"]) == (3, 3)
        assert c.until_stream_end(VB)[-1].reason == StreamEndReason.STATE_CHANGED
        after = vb_state(server, VB)
        assert (after["high"], after["persisted"]) == (3, 3)  # nothing was written to disk for it
        again = c.stream_request(VB, start=6, uuid=before["uuid"])
        assert again.status == Status.ROLLBACK and again.rollback_seqno == 3
        assert c.stream_request(VB, start=3, uuid=before["uuid"]).status == Status.SUCCESS
        with server.login() as w:
            assert all(w.get(k).status == Status.KEY_ENOENT for k in keys[3:6])
            assert w.set(keys[6], b"new branch").status == Status.SUCCESS
        got = items(c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.key == keys[6]))
        assert [(m.by_seqno, m.value) for m in got] == [(4, b"new branch")]
    assert http.post("/faults/buckets/default/persistence/resume").json["paused"] is False


def test_rollback_to_a_seqno_ends_streams_with_rollback_and_the_next_request_rolls_back(server):
    http = http_of(server)
    keys = keys_in(VB, 10, prefix="rb")
    with server.login() as w:
        for k in keys[:5]:
            w.set(k, b"first")
        persisted(w, VB, 5)  # 5 ends a persisted snapshot
        for k in keys[:5]:
            w.set(k, b"second")  # 6..10
        persisted(w, VB, 10)
    before = vb_state(server, VB)
    with DcpClient(server.port) as c:
        c.num_vbuckets = 64
        c.connect(name="watcher")
        assert c.stream_request(VB, uuid=before["uuid"]).status == Status.SUCCESS
        c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 10)
        reply = http.post("/faults/buckets/default/rollback", b'{"vbucket": 5, "seqno": 5}',
                          headers={"Content-Type": "application/json"})
        assert reply.status == 200, reply
        body = reply.json
        assert (body["reached"], body["entry_seqno"], body["lost"], body["streams_ended"]) == (5, 5, 5, 1)
        assert c.until_stream_end(VB)[-1].reason == StreamEndReason.ROLLBACK
        again = c.stream_request(VB, start=10, uuid=before["uuid"])
        assert again.status == Status.ROLLBACK and again.rollback_seqno == 5
        fresh = c.stream_request(VB, start=5, uuid=before["uuid"], end=5)
        assert fresh.status == Status.SUCCESS and fresh.failover_log[0] == (body["uuid"], 5)
        with server.login() as w:
            assert {w.get(k).value for k in keys[:5]} == {b"first"}  # the older versions are back
    after = vb_state(server, VB)
    assert (after["high"], after["persisted"]) == (5, 5)
    assert server.server.mgmt.observer.rollbacks["default"] == 1


def test_the_client_ends_with_the_servers_contents_after_failovers_and_a_rollback(server):
    """dcpflow's client reads every vbucket through a clean failover of all of them, an unclean
    failover with unpersisted writes, and a rollback: it sees the stream ends, rolls back what it
    must, and ends with exactly what the server holds."""
    http = http_of(server)
    universe = [f"doc{i}".encode() for i in range(120)] + [f"late{i}".encode() for i in range(30)]
    with raw(server.port) as w:
        write(w, 80)
        wait_persisted(w, universe[:80])

    async def go():
        loop = asyncio.get_running_loop()

        def post(path, form):
            reply = http.post(path, form)
            assert reply.status == 200, reply
            return reply.json

        async with await AppClient.connect(url(server.port), USER, PASSWORD) as c:
            stream = c.events()
            mirror = Mirror()
            f = Follower(stream, mirror)
            await f.until(lambda: len(mirror.ids) >= 80)
            clean = await loop.run_in_executor(None, post, "/faults/buckets/default/failover", {"vbuckets": "all"})
            assert len(clean["vbuckets"]) == 64
            with raw(server.port) as w:
                await loop.run_in_executor(None, post, "/faults/buckets/default/persistence/pause", {})
                doomed = await loop.run_in_executor(None, write, w, 40, "doc", 80)  # never persisted
                highs = high_seqnos(w)
            await f.until(caught_up(stream, highs))
            assert all(k in mirror.state() for k in doomed)
            unclean = await loop.run_in_executor(None, post, "/faults/buckets/default/failover",
                                                 {"vbuckets": "all", "unclean": "1"})
            assert sum(v["lost"] for v in unclean["vbuckets"]) == 40
            lost = {v["vbucket"] for v in unclean["vbuckets"] if v["lost"]}
            await f.until(lambda: {rb.vbucket for rb in mirror.rollbacks} >= lost)  # each told to roll back
            await loop.run_in_executor(None, post, "/faults/buckets/default/persistence/resume", {})
            with raw(server.port) as w:
                await loop.run_in_executor(None, write, w, 30, "late")
                highs = high_seqnos(w)
            target = max(highs, key=lambda v: highs[v])
            before = sum(rb.vbucket == target for rb in mirror.rollbacks)
            await f.until(caught_up(stream, highs))
            rolled = await loop.run_in_executor(None, post, "/faults/buckets/default/rollback",
                                                {"vbucket": str(target), "seqno": str(highs[target] - 1)})
            await f.until(lambda: sum(rb.vbucket == target for rb in mirror.rollbacks) > before)
            with raw(server.port) as w:
                highs = high_seqnos(w)
            await f.until(caught_up(stream, highs))
            return mirror, await f.stop(), unclean, rolled

    mirror, stats, unclean, rolled = run(go(), timeout=120)
    with raw(server.port) as r:
        truth = contents(r, universe)
    assert mirror.state() == truth
    assert not any(k.startswith(b"doc") and int(k[3:]) >= 80 for k in truth)  # the unpersisted writes are gone
    entries = {v["vbucket"]: v["seqno"] for v in unclean["vbuckets"] if v["lost"]}
    rolled_back = {rb.vbucket for rb in mirror.rollbacks}
    assert rolled_back >= set(entries) and rolled["vbucket"] in rolled_back
    for rb in mirror.rollbacks:
        if rb.vbucket in entries and rb.vbucket != rolled["vbucket"]:
            assert rb.seqno == entries[rb.vbucket]
    assert stats["stream_end_state_changed"] >= 128 and stats["stream_end_rollback"] >= 1
