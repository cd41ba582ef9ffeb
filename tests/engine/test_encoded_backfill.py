"""Backfill pages SQLite encodes (`BackfillScan.next_chunk`, store.py): byte for byte the messages
the protocol's own encoder builds, in seqno order, with tombstones, xattr documents and large
values handed over as rows instead; and `Frames.split`, which the producer uses to stop at its flow-control
window without splitting a message."""

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.dcp.stream_types import Frames
from dcpflow.engine import FailoverTable, Item, Store, VBucketStateRecord
from dcpflow.engine.item import DATATYPE_XATTR
from dcpflow.engine.store import _ENCODED_PAGE, ENCODED_VALUE_LIMIT, LARGE_VALUE, EncodedPage
from dcpflow.protocol.dcp import DcpMutation
from dcpflow.protocol.frame import FrameDecoder

JSON = 0x01


def xattr_value(body: bytes) -> bytes:
    pair = b"_sync\x00{}\x00"
    blob = len(pair).to_bytes(4, "big") + pair
    return len(blob).to_bytes(4, "big") + blob + body


def expected(row: tuple, vb: int, opaque: int, collections: bool) -> bytes:
    """The message the protocol's encoder builds for a plain mutation row (ITEM_COLUMNS order)."""
    key, seqno, rev, cas, flags, expiry, datatype = row[:7]
    key = b"\x00" + key if collections else key
    return DcpMutation(vb, seqno, rev & (2**64 - 1), flags, expiry, 0, key, row[10], cas & (2**64 - 1), datatype,
                       opaque).encode()


def read_chunks(store: Store, vb: int, start: int, end: int, page_size: int, opaque: int, collections: bool,
                min_run: int = 1, page_bytes: int = 1 << 20):
    with store.scan(vb, start, end, page_size=page_size) as scan:
        scan.min_run, scan.page_bytes = min_run, page_bytes
        chunks = []
        while chunk := scan.next_chunk(opaque, collections):
            chunks.append(chunk)
            assert len(chunks) < 10_000
        assert scan.closed
    return chunks


def all_rows(store: Store, vb: int, start: int, end: int) -> list[tuple]:
    with store.scan(vb, start, end, page_size=100_000) as scan:
        scan.page_bytes = 1 << 40
        return scan.next_rows()


def is_plain(r: tuple) -> bool:
    return not r[7] and not r[6] & DATATYPE_XATTR and len(r[10]) < ENCODED_VALUE_LIMIT and r[11] == 0


def check(store: Store, vb: int, start: int, end: int, page_size: int, opaque: int, collections: bool,
          min_run: int = 1, page_bytes: int = 1 << 20, runs: bool = False) -> int:
    """Every row of (start, end] comes exactly once, in order: plain mutations encoded as the
    protocol encodes them, everything else as its row (with min_run 1; a larger min_run lets
    short runs of plain rows come as rows too). Returns how many came encoded."""
    rows = all_rows(store, vb, start, end)
    assert all(len(r) == 13 and bool(r[12]) == is_plain(r) for r in rows)  # 13th: has an encoded head
    got: list[tuple] = []
    encoded = 0
    for chunk in read_chunks(store, vb, start, end, page_size, opaque, collections, min_run, page_bytes):
        if isinstance(chunk, EncodedPage):
            # page_size seqnos, widened where they are sparse; or a run the flusher stored
            assert 1 <= chunk.count <= (1 << 40 if runs else 4 * page_size)
            part = rows[len(got):len(got) + chunk.count]
            assert all(map(is_plain, part))
            assert chunk.data == b"".join(expected(r, vb, opaque, collections) for r in part)
            assert chunk.last_seqno == part[-1][1]
            got += part
            encoded += chunk.count
        else:
            assert 1 <= len(chunk) <= page_size
            assert len(chunk) == 1 or sum(len(r[10]) for r in chunk[:-1]) < page_bytes
            if min_run == 1:
                assert not any(map(is_plain, chunk))  # only what must be shaped, or sent without a copy
            got += chunk
    assert got == rows
    return encoded


#: Run sizes that no test here reaches: the pages SQLite concatenates from rows, without runs.
NO_RUNS = {"run_bytes": 1 << 40, "run_min_bytes": 1 << 40}


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "b" / "store.sqlite3", synchronous="OFF", **NO_RUNS)
    yield s
    s.close()


def write(store: Store, vb: int, items: list[Item]) -> None:
    rec = VBucketStateRecord(vb, 1, FailoverTable([(1, 0)]).to_json(), items[-1].by_seqno, items[0].by_seqno,
                             items[-1].by_seqno)
    store.write([(vb, items)], [rec], [(vb, items[0].by_seqno, items[-1].by_seqno)])


op = st.tuples(
    st.sampled_from(["set", "set", "set", "json", "delete", "xattr", "mid", "large"]),
    st.integers(0, 12),  # key number: a small key space, so versions replace each other (seqno gaps)
    st.binary(max_size=40),
    st.integers(0, 2**32 - 1),  # flags
    st.integers(0, 2**32 - 1),  # expiry
    st.integers(0, 2**64 - 1),  # cas
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(op, min_size=1, max_size=15), min_size=1, max_size=4),
       page_size=st.integers(1, 7), opaque=st.integers(0, 2**32 - 1), collections=st.booleans(),
       start=st.integers(0, 30), span=st.integers(0, 70), vb=st.integers(0, 1023),
       run_bytes=st.sampled_from([None, 60, 200, 1000]))
def test_chunks_are_the_protocols_messages_in_seqno_order(tmp_path_factory, batches, page_size, opaque, collections,
                                                           start, span, vb, run_bytes):
    runs = NO_RUNS if run_bytes is None else {"run_bytes": run_bytes, "run_min_bytes": run_bytes // 3}
    store = Store(tmp_path_factory.mktemp("s") / "store.sqlite3", synchronous="OFF", **runs)
    try:
        seqno = 0
        for batch in batches:
            items = []
            for kind, k, body, flags, expiry, cas in batch:
                seqno += 1
                key = b"key-%d" % k
                if kind == "delete":
                    items.append(Item(key, b"", cas=cas, rev_seqno=seqno, by_seqno=seqno, deleted=True,
                                      delete_time=7))
                elif kind == "xattr":
                    items.append(Item(key, xattr_value(body), flags, expiry, cas, seqno, seqno,
                                      DATATYPE_XATTR | JSON))
                elif kind == "mid":  # sent uncopied from memory, but stored and backfilled as a message
                    items.append(Item(key, body.ljust(LARGE_VALUE, b"M"), flags, expiry, cas, seqno, seqno))
                elif kind == "large":  # stored as a row
                    items.append(Item(key, body.ljust(ENCODED_VALUE_LIMIT, b"L"), flags, expiry, cas, seqno,
                                      seqno))
                else:
                    items.append(Item(key, body, flags, expiry, cas, seqno, seqno, JSON if kind == "json" else 0))
            write(store, vb, items)
        check(store, vb, start, start + span, page_size, opaque, collections, runs=True)
        check(store, vb, start, start + span, page_size, opaque, collections, min_run=3, page_bytes=100, runs=True)
    finally:
        store.close()


def test_plain_vbucket_comes_as_pages_of_page_size(store):
    write(store, 3, [Item(b"k%04d" % i, b"v" * (i % 50), i, 0, 1000 + i, 1, i + 1) for i in range(1000)])
    assert check(store, 3, 0, 1000, 128, 0xDEADBEEF, True) == 1000
    chunks = read_chunks(store, 3, 0, 1000, 128, 1, False)
    assert [c.count for c in chunks] == [128] * 7 + [104]
    assert [f.opaque for c in chunks for f in frames(c.data)] == [1] * 1000


def test_a_page_size_set_between_pages_sizes_the_next_page(store):
    """The backfill sizes a scan's next page by the bytes of the last one (dcp/backfills.py
    next_page_size): a page size lowered after the first page takes effect on the second, not
    four times over (the widening for sparse seqnos is relative to the page size in force)."""
    write(store, 3, [Item(b"k%04d" % i, b"v" * 100, by_seqno=i + 1) for i in range(2000)])
    with store.scan(3, 0, 2000, page_size=512) as scan:
        assert scan.next_chunk(1, False).count == 512
        scan.page_size = 100
        assert [scan.next_chunk(1, False).count for _ in range(3)] == [100, 100, 100]
        scan.page_size = 200
        assert scan.next_chunk(1, False).count == 200


def test_the_range_end_is_respected(store):
    write(store, 0, [Item(b"k%d" % i, b"v", by_seqno=i + 1) for i in range(20)])
    chunks = read_chunks(store, 0, 4, 11, 1000, 9, False)
    assert [(c.count, c.last_seqno) for c in chunks] == [(7, 11)]


def test_a_gap_in_the_seqnos_costs_one_query_not_one_per_page(store):
    """De-duplication (or a range that ends far above the data) leaves seqnos with no row: the
    scan goes on to the next row, not page by page across the gap (a range to 2**48 would never
    end)."""
    write(store, 0, [Item(b"a", b"1", by_seqno=1), Item(b"b", b"2", by_seqno=2), Item(b"c", b"3", by_seqno=10**12)])
    chunks = read_chunks(store, 0, 0, (1 << 48) - 1, 4, 1, False)
    assert [(c.count, c.last_seqno) for c in chunks] == [(2, 2), (1, 10**12)]
    assert read_chunks(store, 0, 2, (1 << 48) - 1, 4, 1, False)[0].last_seqno == 10**12
    assert read_chunks(store, 0, 10**12, (1 << 48) - 1, 4, 1, False) == []


def frames(data: bytes) -> list:
    d = FrameDecoder()
    d.feed(data)
    out = []
    while (f := d.next_frame()) is not None:
        out.append(f)
    assert not d.buffered
    return out


def test_rows_are_clustered_by_seqno_and_move_when_replaced(store):
    """The rowid is vb << 48 | seqno: a by-seqno range is a rowid range, and replacing a key
    moves its row to the new seqno (the old rowid is gone)."""
    write(store, 3, [Item(b"a", b"1", by_seqno=1), Item(b"b", b"1", by_seqno=2)])
    write(store, 3, [Item(b"a", b"2", by_seqno=3)])
    db = sqlite3.connect(store.path)
    rows = db.execute("SELECT id, key, seqno FROM items ORDER BY id").fetchall()
    plan = " ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + _ENCODED_PAGE, (0, 1)))
    db.close()
    assert rows == [(3 << 48 | 2, b"b", 2), (3 << 48 | 3, b"a", 3)]
    assert "INTEGER PRIMARY KEY" in plan, plan
    assert [r[0] for r in all_rows(store, 3, 1, 3)] == [b"b", b"a"]


def test_seqnos_beyond_48_bits_are_refused(store):
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        write(store, 0, [Item(b"a", b"1", by_seqno=1 << 48)])
    write(store, 0, [Item(b"a", b"1", by_seqno=(1 << 48) - 1)])
    assert [r[1] for r in all_rows(store, 0, 0, 1 << 63)] == [(1 << 48) - 1]


def test_rollback_restores_rows_with_their_encoded_heads(store):
    write(store, 0, [Item(b"a", b"1", cas=2**64 - 5, by_seqno=1), Item(b"b", b"1", by_seqno=2)])
    write(store, 0, [Item(b"a", b"2", by_seqno=3)])
    assert store.rollback(0, 2).seqno == 2
    assert [r[0] for r in all_rows(store, 0, 0, 10)] == [b"a", b"b"]
    assert check(store, 0, 0, 10, 10, 1, True) == 2  # a came back from history, encoded


@pytest.mark.parametrize("every", [2, 10, 100])
def test_scattered_tombstones_do_not_cost_a_query_per_item(store, every):
    """Plain rows between tombstones come as rows while their runs are short: a handful of
    chunks, not one per item (the review found 100,000 calls for 100,000 items)."""
    n = 6000
    write(store, 0, [Item(b"k%d" % i, b"", by_seqno=i + 1, deleted=True) if i % every == 0 else
                     Item(b"k%d" % i, b"v" * 100, by_seqno=i + 1) for i in range(n)])
    check(store, 0, 0, n, 2048, 7, True, min_run=32)
    chunks = read_chunks(store, 0, 0, n, 2048, 7, True, min_run=32)
    # dense tombstones: pages of rows; sparse ones: a row chunk and an encoded run per tombstone
    assert len(chunks) <= 2 * n // 2048 + (2 * n // every if every >= 32 else 0) + 2


def test_a_page_of_rows_is_bounded_by_bytes(store):
    big = b"B" * (64 * 1024)
    write(store, 0, [Item(b"k%d" % i, big, by_seqno=i + 1) for i in range(100)])
    chunks = read_chunks(store, 0, 0, 100, 2048, 1, False, page_bytes=1 << 20)
    assert [len(c) for c in chunks] == [16] * 6 + [4]  # 1 MiB of values a page, not 2048 rows
    check(store, 0, 0, 100, 2048, 1, False, page_bytes=1 << 20)


def messages(sizes: list[int]) -> bytes:
    return b"".join(DcpMutation(0, i + 1, 1, 0, 0, 0, b"k", b"x" * n, opaque=1).encode() for i, n in enumerate(sizes))


@given(st.lists(st.integers(0, 60), min_size=1, max_size=8), st.data())
def test_split_takes_the_shortest_prefix_of_whole_messages(sizes, data):
    blob = messages(sizes)
    lengths = [24 + 31 + 1 + n for n in sizes]
    nbytes = data.draw(st.integers(1, len(blob) + 10))
    head, rest = Frames(blob, len(sizes)).split(nbytes)
    n = next((i + 1 for i in range(len(sizes)) if sum(lengths[:i + 1]) >= nbytes), len(sizes))
    assert bytes(head.data) == blob[:sum(lengths[:n])] and head.count == n
    if n == len(sizes):
        assert rest is None
    else:
        assert bytes(rest.data) == blob[sum(lengths[:n]):] and rest.count == len(sizes) - n
