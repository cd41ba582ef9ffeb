"""The client and sync writes: committed data only by default; with `sync_writes=True` the
prepares, commits and aborts too, and offsets that stay at a safe point while a prepare is open."""

import json
import struct

from dcpflow.client import DcpClient, Mutation
from dcpflow.client.events import Commit, Prepare
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.frame import durability_frame, request
from dcpflow.protocol.kv import SetVbucket
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.dcp.client import DcpClient as RawDcpClient

from .conftest import PASSWORD, USER, flush_to_disk, keys_in, run, url


def set_topology(server, vb: int, chain: list) -> None:
    with server.login() as c:
        c.send(SetVbucket(vb, int(VBucketState.ACTIVE), json.dumps({"topology": [chain]}).encode(), opaque=5).encode())
        assert c.recv().status == Status.SUCCESS


def durable_set(c, key: bytes, value: bytes, vb: int) -> int:
    opaque = c.next_opaque()
    c.send(request(Opcode.SET, key=key, extras=struct.pack(">II", 0, 0), value=value, vbucket=vb, opaque=opaque,
                   framing=durability_frame(1, 60_000)))
    return opaque


def one_committed_one_open(server, w, vb: int, done: bytes, open_: bytes) -> int:
    """A durable write of `done` on a chain of one (prepare 1, commit 2), then one of `open_` that no
    replica acknowledges (prepare 3 stays open; chain self + peer); the open one's opaque."""
    set_topology(server, vb, ["self"])
    durable_set(w, done, b'{"v":1}', vb)
    assert w.recv().status == Status.SUCCESS
    set_topology(server, vb, ["self", "peer"])
    return durable_set(w, open_, b'{"v":2}', vb)


def test_committed_only_by_default_and_prepares_with_the_option(server):
    vb = 3
    done, open_ = keys_in(vb, 2, prefix="cs")
    with server.login() as w:
        held = one_committed_one_open(server, w, vb, done, open_)

        async def read(**kw):
            async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
                stream = c.events(vbuckets=[vb], end={vb: 3}, **kw)
                events = [e async for e in stream if hasattr(e, "seqno")]
                return events, stream.offsets[vb], stream.positions[vb]
        plain, plain_offset, _ = run(read())
        assert [(type(e).__name__, e.key, e.seqno) for e in plain] == [("Mutation", done, 2)]
        assert isinstance(plain[0], Mutation) and plain[0].value == b'{"v":1}'
        sync, sync_offset, sync_position = run(read(sync_writes=True))
        assert [(type(e).__name__, e.key, e.seqno) for e in sync] == [
            ("Prepare", done, 1), ("Commit", done, 2), ("Prepare", open_, 3)]
        assert isinstance(sync[0], Prepare) and sync[0].value == b'{"v":1}' and sync[0].durability_level == 1
        assert isinstance(sync[1], Commit) and sync[1].prepared_seqno == 1
        # A plain read's snapshot ends at the max visible seqno (2). The sync read consumed the
        # prepare at 3 (the end of the one snapshot holding 1..3), but its offset stays at the last
        # safe point before the open prepare: the start, as no snapshot ended before it.
        assert plain_offset.seqno == 2
        assert sync_position.seqno == 3 and sync_offset.seqno == 0
        with RawDcpClient(server.port) as peer:  # the missing replica acknowledges: the write commits
            peer.connect(user="Administrator", password="password", name="peer")
            peer.controls(enable_sync_writes="true", consumer_name="peer")
            peer.send(dcp.DcpSeqnoAcknowledged(vb, 3, 0).encode())
            reply = w.recv()
        assert (reply.opaque, reply.status) == (held, Status.SUCCESS)
        sync, sync_offset = run(_read_to(server, vb, 4))
        assert [(type(e).__name__, e.seqno) for e in sync][-1] == ("Commit", 4) and sync_offset.seqno == 4


async def _read_to(server, vb: int, end: int):
    async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
        stream = c.events(vbuckets=[vb], end={vb: end}, sync_writes=True)
        events = [e async for e in stream if hasattr(e, "seqno")]
        return events, stream.offsets[vb]


def test_arrow_batches_hold_committed_versions_only(server):
    """The batch reader (and the Spark source built on it) reads committed data: a prepare, open or
    completed, and an abort make no row; a commit is the row of the version it made."""
    from dcpflow.client import Offset
    vb = 5
    done, open_ = keys_in(vb, 2, prefix="ab")
    set_topology(server, vb, ["self"])
    with server.login() as w:
        durable_set(w, done, b'{"v":1}', vb)
        assert w.recv().status == Status.SUCCESS  # prepare 1, commit 2
        set_topology(server, vb, ["self", "peer"])
        durable_set(w, open_, b'{"v":2}', vb)  # prepare 3, open

        async def go():
            async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
                rows = []
                async for batch in c.batches({vb: Offset()}, end={vb: 3}):
                    rows += batch.select(["key", "value", "event", "seqno"]).to_pylist()
                return rows
        assert run(go()) == [{"key": done, "value": b'{"v":1}', "event": "mutation", "seqno": 2}]


def test_arrow_batches_with_sync_writes_hold_prepares_commits_and_aborts_in_stream_order(server):
    """With sync_writes=True the batch reader (the Spark source's syncWrites) adds a row per
    prepare (its value and metadata, null for a durable delete), commit and abort (key and seqno),
    where their messages came among the documents; a committed sync write is its commit row."""
    from dcpflow.client import Offset
    vb = 6
    a, b, c_, d, gone = keys_in(vb, 5, prefix="sy")
    set_topology(server, vb, ["self"])
    with server.login() as w:
        assert w.set(gone, b"soon", vbucket=vb).status == Status.SUCCESS  # 1
        flush_to_disk(server, vb)  # on disk only: its delete below replaces it there (no row at 1)
        durable_set(w, a, b'{"v":1}', vb)
        assert w.recv().status == Status.SUCCESS  # prepare 2, commit 3
        assert w.set(b, b"plain", vbucket=vb).status == Status.SUCCESS  # 4
        opaque = w.next_opaque()
        w.send(request(Opcode.DELETE, key=w.key(gone), vbucket=vb, opaque=opaque,
                       framing=durability_frame(1, 60_000)))
        assert w.recv().status == Status.SUCCESS  # a durable delete: prepare 5, commit 6
        set_topology(server, vb, ["self", "peer"])
        opaque = w.next_opaque()
        w.send(request(Opcode.SET, key=w.key(c_), extras=struct.pack(">II", 0, 0), value=b"x", vbucket=vb,
                       opaque=opaque, framing=durability_frame(1, 300)))
        assert w.recv().status == Status.SYNC_WRITE_AMBIGUOUS  # prepare 7, aborted at 8 (nobody acks)
        assert w.set(d, b"after", vbucket=vb).status == Status.SUCCESS  # 9

        async def go(**kw):
            async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
                rows = []
                async for batch in c.batches({vb: Offset()}, end={vb: 9}, **kw):
                    rows += batch.select(["key", "value", "event", "seqno", "snapshot_end"]).to_pylist()
                return rows
        rows = run(go(sync_writes=True))
        assert [(r["event"], r["key"], r["seqno"], r["value"]) for r in rows] == [
            ("prepare", a, 2, b'{"v":1}'), ("commit", a, 3, None),
            ("mutation", b, 4, b"plain"), ("prepare", gone, 5, None), ("commit", gone, 6, None),
            ("prepare", c_, 7, b"x"), ("abort", c_, 8, None), ("mutation", d, 9, b"after")]
        assert all(r["snapshot_end"] >= r["seqno"] for r in rows)
        plain = run(go())
        assert [(r["event"], r["key"], r["seqno"]) for r in plain] == [
            ("mutation", a, 3), ("mutation", b, 4), ("deletion", gone, 6), ("mutation", d, 9)]
