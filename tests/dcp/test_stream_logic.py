"""ActiveStream without sockets (dcp/active_stream.py over a real VBucket): the fast encoders produce
exactly the protocol's message bytes, and for any interleaving of writes, deletes, checkpoint
closes and reads of any size, the stream's output is a valid DCP stream that reproduces the
vbucket (hypothesis)."""

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.dcp.active_stream import ActiveStream
from dcpflow.dcp.stream_types import Frames, StreamOptions
from dcpflow.engine.errors import EngineError
from dcpflow.engine.item import DeleteSource, Item
from dcpflow.engine.vbucket import VBucket
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason

items_st = st.builds(
    Item, key=st.binary(min_size=1, max_size=20), value=st.binary(max_size=50), flags=st.integers(0, 2**32 - 1),
    expiry=st.integers(0, 2**32 - 1), cas=st.integers(1, 2**64 - 1), rev_seqno=st.integers(1, 2**64 - 1),
    by_seqno=st.integers(1, 2**63), datatype=st.sampled_from([0, 1]), deleted=st.booleans(),
    delete_time=st.integers(0, 2**32 - 1), delete_source=st.sampled_from(list(DeleteSource)))


@settings(deadline=None)
@given(item=items_st, collections=st.booleans(), delete_times=st.booleans(), opaque=st.integers(0, 2**32 - 1),
       vbid=st.integers(0, 1023))
def test_fast_encoding_is_the_protocol_encoding(item, collections, delete_times, opaque, vbid):
    vb = VBucket(vbid, persistent=False)
    opts = StreamOptions(collections=collections, delete_times=delete_times)
    s = ActiveStream(vb, name="t", opaque=opaque, start_seqno=0, end_seqno=2**64 - 1, snap_start_seqno=0,
                     options=opts)
    s._queue_item(item)
    key = b"\x00" + item.key if collections else item.key
    if not item.deleted:
        want = dcp.DcpMutation(vbid, item.by_seqno, item.rev_seqno, item.flags, item.expiry, 0, key, item.value,
                               item.cas, item.datatype, opaque).encode()
    else:
        want = dcp.DcpDeletion(vbid, item.by_seqno, item.rev_seqno, key, b"", item.cas, 0, opaque,
                               item.delete_time if delete_times else None).encode()
    assert s.pop() == want


ops_st = st.lists(st.one_of(
    st.tuples(st.just("set"), st.integers(0, 5), st.binary(max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("read"), st.integers(1, 400)),
), max_size=60)


def raw(entries) -> bytes:
    """A ready queue's bytes (Frames entries hold several messages)."""
    return b"".join(e.data if isinstance(e, Frames) else e for e in entries)


def decode(chunks: list) -> list:
    d = dcp.DcpDecoder()
    d.feed(raw(chunks))
    return list(d.messages())


@settings(max_examples=150, deadline=None)
@given(ops=ops_st, max_items=st.integers(1, 5))
def test_stream_output_reproduces_the_vbucket(ops, max_items):
    vb = VBucket(0, persistent=False, checkpoint_max_items=max_items)
    stream = ActiveStream(vb, name="t", opaque=9, start_seqno=0, end_seqno=2**64 - 1, snap_start_seqno=0)
    stream.start()
    out: list[bytes] = []

    def drain(budget: int) -> None:
        stream.fill(budget, max_items=3)
        while (data := stream.pop()) is not None:
            out.append(data)

    for op in ops:
        if op[0] == "set":
            vb.set(b"k%d" % op[1], op[2])
        elif op[0] == "delete":
            with contextlib.suppress(EngineError):  # not there: nothing happens
                vb.delete(b"k%d" % op[1])
        elif op[0] == "checkpoint":
            vb.checkpoint_manager.create_checkpoint()
        else:
            drain(op[1])
    for _ in range(1000):  # read everything that is left
        before = len(out)
        drain(1 << 20)
        if len(out) == before:
            break
    msgs = decode(out)
    state: dict[bytes, bytes | None] = {}
    last = 0
    markers = [m for m in msgs if isinstance(m, dcp.DcpSnapshotMarker)]
    if markers:
        assert markers[0].start_seqno == 0  # rule 1: the first marker starts at the requested start
    marker, snap_keys, first_item = None, set(), False
    for m in msgs:
        if isinstance(m, dcp.DcpSnapshotMarker):
            assert m.start_seqno <= m.end_seqno and m.opaque == 9
            assert m.flags & SnapshotFlag.MEMORY and not m.flags & SnapshotFlag.DISK
            marker, snap_keys, first_item = m, set(), True
            continue
        assert marker is not None and m.by_seqno > last  # after a marker, strictly increasing
        assert marker.start_seqno <= m.by_seqno <= marker.end_seqno
        if first_item and marker is not markers[0] and not marker.flags & SnapshotFlag.CHECKPOINT:
            assert marker.start_seqno == m.by_seqno  # rule 3: starts at its first item
        first_item = False
        assert m.key not in snap_keys  # de-duplicated within a snapshot
        snap_keys.add(m.key)
        last = m.by_seqno
        state[m.key] = m.value if isinstance(m, dcp.DcpMutation) else None
    expected = {k: (None if it.deleted else it.value) for k, it in vb.ht.items()}
    assert state == expected
    assert last == vb.high_seqno or not msgs


def test_end_seqno_inside_a_snapshot_clamps_the_marker():
    vb = VBucket(0, persistent=False)
    for i in range(6):
        vb.set(b"k%d" % i, b"v")
    s = ActiveStream(vb, name="t", opaque=1, start_seqno=0, end_seqno=4, snap_start_seqno=0)
    s.start()
    s.fill(1 << 20)
    msgs = decode(list(s.ready))
    assert (msgs[0].start_seqno, msgs[0].end_seqno) == (0, 4)
    assert [m.by_seqno for m in msgs[1:-1]] == [1, 2, 3, 4]
    assert msgs[-1].reason == StreamEndReason.OK and s.dead


def test_backfill_failed_ends_the_stream():
    vb = VBucket(0, persistent=False)
    s = ActiveStream(vb, name="t", opaque=1, start_seqno=0, end_seqno=10, snap_start_seqno=0, flags=0x02)
    s.start()
    assert s.backfill is not None
    s.set_dead(StreamEndReason.BACKFILL_FAIL)  # what DcpProducer.backfill_failed does to it
    (end,) = decode(list(s.ready))
    assert end.reason == StreamEndReason.BACKFILL_FAIL and s.dead and s.backfill is None


def test_close_without_stream_end_control_sends_nothing():
    vb = VBucket(0, persistent=False)
    s = ActiveStream(vb, name="t", opaque=1, start_seqno=0, end_seqno=10, snap_start_seqno=0)
    s.start()
    vb.set(b"a", b"1")
    s.fill(1 << 20)
    assert s.ready
    s.set_dead(StreamEndReason.CLOSED)
    assert not s.ready and s.dead and "t" not in vb.checkpoint_manager.cursors


def as_row(it: Item) -> tuple:
    signed = lambda v: v - (1 << 64) if v >= 1 << 63 else v  # noqa: E731  (as the store keeps u64s)
    return (it.key, it.by_seqno, signed(it.rev_seqno), signed(it.cas), it.flags, it.expiry, it.datatype,
            int(it.deleted), it.delete_time, int(it.delete_source), it.value, it.cid)


def seqno_ordered(page: list[Item], big: bool) -> list[Item]:
    """One item per seqno, in order; with `big`, values a hundred times longer (past LARGE_VALUE)."""
    page = sorted({it.by_seqno: it for it in page}.values(), key=lambda it: it.by_seqno)
    if big:
        page = [Item(it.key, it.value * 100, it.flags, it.expiry, it.cas, it.rev_seqno, it.by_seqno, it.datatype,
                     it.deleted, it.delete_time, it.delete_source) for it in page]
    return page


def plain_stream(end: int, collections: bool, delete_times: bool) -> ActiveStream:
    return ActiveStream(VBucket(3, persistent=False), name="t", opaque=5, start_seqno=0, end_seqno=end,
                        snap_start_seqno=0, options=StreamOptions(collections=collections, delete_times=delete_times))


@settings(deadline=None)  # a property of bytes, not of time: a busy machine took one example past 200 ms
@given(page=st.lists(items_st, max_size=12), collections=st.booleans(), delete_times=st.booleans(),
       big=st.booleans(), end=st.integers(1, 2**63))
def test_backfill_rows_encode_like_items(page, collections, delete_times, big, end):
    """The row fast path of a backfill sends exactly what the Item path sends."""
    page = seqno_ordered(page, big)
    out = []
    for use_rows in (True, False):
        s = plain_stream(end, collections, delete_times)
        if use_rows:
            s.backfill_rows([as_row(it) for it in page])
        else:
            s.backfill_page(page)
        out.append((raw(s.ready), s.ready_bytes, s.last_sent_seqno, s.items_sent, s.last_read_seqno))
    assert out[0] == out[1]


@settings(deadline=None)
@given(page=st.lists(items_st, max_size=12), collections=st.booleans(), delete_times=st.booleans(),
       big=st.booleans())
def test_in_memory_runs_encode_like_single_items(page, collections, delete_times, big):
    """The in-memory hot loop (runs of plain mutations joined into one Frames entry) sends exactly
    what encoding each item on its own sends, and accounts the same bytes and items."""
    page = seqno_ordered(page, big)
    out = []
    for batched in (True, False):
        s = plain_stream(2**63, collections, delete_times)
        if batched:
            s._queue_items(page)
            assert sum(e.count if isinstance(e, Frames) else 1 for e in s.ready
                       if not isinstance(e, memoryview)) == len(page)
        else:
            for it in page:
                s._queue_item(it)
        out.append((raw(s.ready), s.ready_bytes, s.items_sent, s.last_sent_seqno if page else None))
    assert out[0] == out[1]
