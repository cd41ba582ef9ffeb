"""Arrow batches: the vectorized decoder checked frame by frame against the protocol's own decoder
(hypothesis), the key and value columns built compiled or not, and the batch API against a real
server - same rows as the event API, exact ranges, resumable end offsets, max_rows."""

import array
import types

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.client import SCHEMA, DcpClient, Deletion, Mutation, Offset, batches
from dcpflow.client.batches import BatchBuilder
from dcpflow.client.connection import Segment
from dcpflow.client.streams import Feed, FeedOptions, replay
from dcpflow.protocol.dcp import (
    STREAM_OPCODES,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpNoop,
    DcpSeqnoAdvanced,
    DcpSnapshotMarker,
    MarkerVersion,
    SnapshotFlag,
)
from dcpflow.protocol.frame import HEADER_LEN
from dcpflow.protocol.keys import make_key

from .conftest import PASSWORD, USER, run, url, write

U64 = (1 << 64) - 1


def signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


# -- the decoder alone (sans-I/O) ------------------------------------------------------------------

@st.composite
def traffic(draw):
    """Per vbucket: snapshots of mutations / deletions / expirations with rising seqnos, V1 or V2.2
    markers, sometimes a seqno-advanced; vbuckets interleaved; noops in between (the connection
    answers those; they are not stream frames)."""
    nvb = draw(st.integers(1, 4))
    per_vb = []
    for vb in range(nvb):
        msgs, seq = [], 0
        for _ in range(draw(st.integers(1, 4))):
            n = draw(st.integers(0, 5))
            start, end = seq + 1, seq + max(n, 1)
            version = draw(st.sampled_from([MarkerVersion.V1, MarkerVersion.V2_0, MarkerVersion.V2_2]))
            purge = 3 if version == MarkerVersion.V2_2 else 0
            msgs.append(DcpSnapshotMarker(vb, start, end, SnapshotFlag.DISK, version, purge_seqno=purge))
            for s in range(start, start + n):
                kind = draw(st.sampled_from(["m", "d", "x"]))
                key = draw(st.binary(min_size=1, max_size=20))
                cas = draw(st.integers(0, U64))
                rev = draw(st.integers(0, U64))
                if kind == "m":
                    value = draw(st.binary(max_size=40))
                    msgs.append(DcpMutation(vb, s, rev, draw(st.integers(0, 2**32 - 1)),
                                            draw(st.integers(0, 2**32 - 1)), 0, key, value, cas,
                                            draw(st.integers(0, 7))))
                elif kind == "d":
                    msgs.append(DcpDeletion(vb, s, rev, key, b"", cas, 0, delete_time=draw(st.integers(0, 2**32 - 1))))
                else:
                    msgs.append(DcpExpiration(vb, s, rev, key, draw(st.integers(0, 2**32 - 1)), b"", cas))
            if n == 0:
                msgs.append(DcpSeqnoAdvanced(vb, end))
            seq = end
        per_vb.append(msgs)
    order = draw(st.permutations([vb for vb, msgs in enumerate(per_vb) for _ in msgs]))
    out, pos = [], [0] * nvb
    for vb in order:
        out.append(per_vb[vb][pos[vb]])
        pos[vb] += 1
        if draw(st.integers(0, 9)) == 0:
            out.append(DcpNoop(7))
    return out, nvb, draw(st.booleans()), draw(st.integers(1, 5))


def segments_of(messages, collections: bool, pieces: int):
    """Encode (keys with a collection prefix if `collections`) and cut into segments the way the
    connection would hand them over: stream frames' offsets, noops skipped."""
    conn = types.SimpleNamespace(collections=collections)  # only the flag the decoder reads
    frames = []
    for m in messages:
        if collections and hasattr(m, "key"):
            m = m._replace(key=make_key(m.key, 0x1F if m.vbucket % 2 else 300))
        frames.append(m.encode())
    cut = sorted({round(i * len(frames) / pieces) for i in range(1, pieces)})
    segs, lo = [], 0
    for hi in cut + [len(frames)]:
        data = b"".join(frames[lo:hi])
        starts, pos, charged, end = array.array("q"), 0, 0, 0
        for f in frames[lo:hi]:
            if f[1] in STREAM_OPCODES:
                starts.append(pos)
                charged += len(f)
                end = pos + len(f)
            pos += len(f)
        if len(starts):
            segs.append(Segment(conn, data, starts, end, charged))
        lo = hi
    return segs


@settings(max_examples=150, deadline=None)
@given(traffic(), st.booleans())
def test_decoder_matches_the_protocol_decoder(case, together):
    """Each segment decoded on its own, or all of them in one batch (frames from several
    receive buffers in one set of columns)."""
    messages, nvb, collections, pieces = case
    feed = Feed(types.SimpleNamespace(agent="t", shared=None), {vb: Offset() for vb in range(nvb)}, {}, FeedOptions())
    for vs in feed.streams.values():
        vs.decoded.opened([(0x1234 + vs.vbucket, 0)])
        vs.consumed.opened([(0x1234 + vs.vbucket, 0)])
    builder = BatchBuilder(feed)
    steps, events = [], []
    segs = segments_of(messages, collections, pieces)
    groups = [segs] if together and segs else [[s] for s in segs]
    batches = [b for b in (builder.decode(g, steps, events) for g in groups) if b is not None]
    got = pa.Table.from_batches(batches, schema=SCHEMA).to_pylist() if batches else []
    expect, snap = [], {}
    for m in messages:
        if isinstance(m, DcpSnapshotMarker):
            snap[m.vbucket] = (m.start_seqno, m.end_seqno)
        elif isinstance(m, DcpMutation | DcpDeletion | DcpExpiration):
            event = {DcpMutation: "mutation", DcpDeletion: "deletion", DcpExpiration: "expiration"}[type(m)]
            mut = event == "mutation"
            expect.append({
                "vbucket": m.vbucket, "seqno": m.by_seqno, "vbuuid": 0x1234 + m.vbucket, "key": m.key,
                "value": m.value if mut else None, "event": event, "cas": signed(m.cas),
                "rev_seqno": signed(m.rev_seqno), "flags": m.flags if mut else 0,
                "expiry": m.expiration if mut else 0, "datatype": m.datatype,
                "snapshot_start": snap[m.vbucket][0], "snapshot_end": snap[m.vbucket][1],
                "collection_id": (0x1F if m.vbucket % 2 else 300) if collections else 0,
                "delete_time": 0 if mut else m.delete_time})
    assert got == expect
    # The trackers saw every frame: each vbucket's last snapshot is complete, so committed = its end.
    replay(feed.streams, steps)
    for vb, vs in feed.streams.items():
        last = max(m.end_seqno for m in messages if isinstance(m, DcpSnapshotMarker) and m.vbucket == vb)
        assert vs.consumed.committed == vs.decoded.committed
        assert vs.decoded.committed.seqno in (last, max((m.end_seqno for m in messages if isinstance(
            m, DcpSnapshotMarker) and m.vbucket == vb and m.end_seqno < last), default=0))
        if any(isinstance(m, DcpSnapshotMarker) and m.purge_seqno and m.vbucket == vb for m in messages):
            assert vs.decoded.purge_seqno == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=4), st.data())
def test_binary_column_is_the_same_compiled_or_not(bufs, data):
    """The column a batch gets: offsets + one copy (compiled), or views cast by Arrow, nulls alike."""
    u8s = [np.frombuffer(b, dtype=np.uint8) for b in bufs]
    rows = []
    for s, b in enumerate(bufs):
        for _ in range(data.draw(st.integers(0, 4))):
            p = data.draw(st.integers(0, len(b)))
            rows.append((s, p, data.draw(st.integers(0, len(b) - p)), data.draw(st.booleans())))
    sid, pos, lens = (np.array([r[i] for r in rows], dtype=np.int64) for i in range(3))
    valid = np.array([r[3] for r in rows], dtype=bool)
    expect = [bufs[s][p:p + n] if ok else None for s, p, n, ok in rows]
    for use in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not use:
                mp.setattr(batches, "_concat_c", None)
            col = batches.binary_column([pa.py_buffer(b) for b in bufs], u8s, sid, pos, lens, valid)
        col.validate(full=True)
        assert col.type == pa.binary() and col.to_pylist() == expect


def test_malformed_control_frames_are_rejected_in_batches():
    """A marker the fast path declines still fails the batch with the protocol's words."""
    feed = Feed(types.SimpleNamespace(agent="t", shared=None), {0: Offset()}, {}, FeedOptions())
    bad = bytearray(DcpSnapshotMarker(0, 5, 4, SnapshotFlag.DISK, MarkerVersion.V2_2).encode())
    seg = Segment(types.SimpleNamespace(collections=False), bytes(bad), array.array("q", [0]), len(bad), len(bad))
    with pytest.raises(Exception, match="snapshot start 5 is greater than snapshot end 4"):
        BatchBuilder(feed).decode([seg], [], [])


def test_decoder_rejects_malformed_frames():
    feed = Feed(types.SimpleNamespace(agent="t", shared=None), {0: Offset()}, {}, FeedOptions())
    good = DcpMutation(0, 1, 1, 0, 0, 0, b"k", b"v").encode()
    bad = bytearray(good)
    bad[4] = 30  # extras length 30 is not a mutation
    seg = Segment(types.SimpleNamespace(collections=False), bytes(bad), array.array("q", [0]), len(bad), len(bad))
    with pytest.raises(Exception, match="malformed DCP opcode 0x57 for vbucket 0: extras 30"):
        BatchBuilder(feed).decode([seg], [], [])
    assert HEADER_LEN == 24


def test_schema_is_what_spark_maps():
    assert [(f.name, str(f.type)) for f in SCHEMA] == [
        ("vbucket", "int32"), ("seqno", "int64"), ("vbuuid", "int64"), ("key", "binary"), ("value", "binary"),
        ("event", "string"), ("cas", "int64"), ("rev_seqno", "int64"), ("flags", "int64"), ("expiry", "int64"),
        ("datatype", "int32"), ("snapshot_start", "int64"), ("snapshot_end", "int64"), ("collection_id", "int64"),
        ("delete_time", "int64")]


# -- against the server ------------------------------------------------------------------------------

async def read_all(c, ranges, end, **kw):
    reader = c.batches(ranges, end, **kw)
    batches = [b async for b in reader]
    table = pa.Table.from_batches(batches, schema=SCHEMA)
    return table, reader.offsets, batches


def test_batches_equal_events(server, writer):
    write(writer, 500, size=30)
    writer.delete(b"doc3")
    writer.set(b"bin", bytes(range(256)), flags=7)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            highs = await c.high_seqnos()
            table, offsets, _ = await read_all(c, {vb: Offset() for vb in range(64)}, highs)
            events = [e async for e in c.events(end=highs)]
            return table, offsets, events, highs
    table, offsets, events, highs = run(go())
    rows = table.to_pylist()
    docs_ev = [e for e in events if isinstance(e, Mutation | Deletion)]
    assert len(rows) == len(docs_ev) == 501
    as_rows = {(r["vbucket"], r["seqno"]): r for r in rows}
    for e in docs_ev:
        r = as_rows[(e.vbucket, e.seqno)]
        assert (r["key"], r["event"], r["cas"] & U64, r["vbuuid"] & U64, r["rev_seqno"], r["datatype"]) == \
            (e.key, e.event, e.cas, e.vbuuid, e.rev_seqno, e.datatype)
        assert r["value"] == (e.value if isinstance(e, Mutation) else None)
        assert (r["snapshot_start"], r["snapshot_end"]) == (e.snapshot_start, e.snapshot_end)
    assert next(r for r in rows if r["key"] == b"bin")["flags"] == 7
    assert {vb: o.seqno for vb, o in offsets.items()} == highs
    assert all(o.is_boundary for o in offsets.values())


def test_ranges_are_exact_and_resume_from_the_returned_offsets(server, writer):
    write(writer, 400)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            highs = await c.high_seqnos()
            mid = {vb: h // 2 for vb, h in highs.items()}
            start = {vb: Offset() for vb in highs}
            first, off1, _ = await read_all(c, start, mid)
            again, _, _ = await read_all(c, start, mid)
            second, off2, _ = await read_all(c, off1, highs)
            return highs, mid, first, off1, again, second, off2
    highs, mid, first, off1, again, second, off2 = run(go())
    for t, lo, hi in ((first, {vb: 0 for vb in highs}, mid), (second, mid, highs)):
        got = {}
        for vb, s in zip(t.column("vbucket").to_pylist(), t.column("seqno").to_pylist(), strict=True):
            got.setdefault(vb, []).append(s)
        for vb in highs:
            assert got.get(vb, []) == list(range(lo[vb] + 1, hi[vb] + 1)), f"vbucket {vb}"
    # Same range, same rows (nothing was written in between).
    assert first.sort_by([("vbucket", "ascending"), ("seqno", "ascending")]).equals(
        again.sort_by([("vbucket", "ascending"), ("seqno", "ascending")]))
    # The end offset sits at the end seqno, with the range of the snapshot the last row came in.
    last_snap = {r["vbucket"]: (r["snapshot_start"], r["snapshot_end"]) for r in first.to_pylist()}
    for vb, o in off1.items():
        assert o.seqno == mid[vb] and o.snapshot_start <= o.seqno <= o.snapshot_end
        if mid[vb]:
            assert (o.snapshot_start, o.snapshot_end) == last_snap[vb]
    assert {vb: o.seqno for vb, o in off2.items()} == highs


def test_max_rows_and_empty_ranges(server, writer):
    write(writer, 300)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            highs = await c.high_seqnos()
            _, _, batches = await read_all(c, {vb: Offset() for vb in highs}, highs, max_rows=7)
            _, _, small = await read_all(c, {vb: Offset() for vb in highs}, highs, max_bytes=2000)
            uuid = (await c.failover_logs([0]))[0][0][0]  # a real branch: the server is asked even so
            empty = [b async for b in c.batches({0: Offset.at(uuid, highs[0])}, {0: highs[0]})]
            with pytest.raises(ValueError, match="max_rows"):
                c.batches({0: Offset()}, {0: 1}, max_rows=0)
            return batches, empty, small
    batches, empty, small = run(go())
    assert sum(b.num_rows for b in batches) == 300
    assert all(1 <= b.num_rows <= 7 for b in batches) and len(batches) >= 300 // 7
    wire = [sum(56 + len(k) + len(v) for k, v in zip(b.column("key").to_pylist(), b.column("value").to_pylist(),
                                                      strict=True)) for b in small]
    assert sum(b.num_rows for b in small) == 300 and max(wire) <= 2000 and len(small) >= sum(wire) // 2000
    assert empty == []


def test_unbounded_batches_flush(server, writer):
    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            import asyncio
            reader = c.batches(await c.offsets_now(), None, flush_interval=0.05)
            loop = asyncio.get_running_loop()
            write_task = loop.run_in_executor(None, write, writer, 20)
            sizes = []
            async for b in reader:
                sizes.append(b.num_rows)
                if sum(sizes) >= 20:
                    break
            await write_task
            await reader.aclose()
            return sizes, reader.offsets
    sizes, offsets = run(go())
    # Each write is its own snapshot; a batch counts as consumed once the next one is asked for,
    # so the offsets cover every batch but the last.
    assert sum(sizes) == 20 and sum(o.seqno for o in offsets.values()) == 20 - sizes[-1]


def test_batch_reading_does_not_import_pandas(server, writer):
    # pa.array(ndarray) imports pandas (~50 MB RSS) to ask whether the object is a pandas one; the
    # client's columns are built from buffers so a streaming process stays small (bench/client.py RSS).
    import subprocess
    import sys
    write(writer, 50, size=10)
    script = f"""
import asyncio, sys
from dcpflow.client import DcpClient, Offset
async def go():
    async with await DcpClient.connect({url(server.port)!r}, {USER!r}, {PASSWORD!r}) as c:
        highs = await c.high_seqnos()
        rows = 0
        async for b in c.batches({{vb: Offset() for vb in highs}}, highs):
            rows += b.num_rows
        return rows
rows = asyncio.run(go())
print(rows, "pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["50", "False"], out.stdout + out.stderr
