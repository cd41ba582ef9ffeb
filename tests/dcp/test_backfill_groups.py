"""Backfills of many small vbuckets open together (server/backfill.py `_open_group`): one trip to a worker
thread opens several scans with their first pages, stops at OPEN_GROUP_BYTES and queues the rest
again, and a trip nobody waits for any more closes what it opened."""

import asyncio
import threading
import time

import pytest

from dcpflow.dcp import backfills
from dcpflow.engine import Bucket, VBucketState
from dcpflow.engine.store import BackfillScan
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.server import backfill
from tests.resources import wait_for

from .client import DcpClient, items

VBS = 64
DOCS = 20


@pytest.fixture
def small_vbuckets(tmp_path):
    """A data dir of VBS vbuckets of DOCS documents each, all on disk (nothing in memory)."""
    data = tmp_path / "data"
    with Bucket("default", data, VBS, synchronous="OFF") as bucket:
        for vb in range(VBS):
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
            for i in range(DOCS):
                bucket.vbucket(vb).set(b"g%d-%d" % (vb, i), b"x" * (100 + vb))
    return data


def request_all(c: DcpClient) -> None:
    """Every vbucket's stream request in one write, as a client starting a full read does."""
    opaques = [c.next_opaque() for _ in range(VBS)]
    c.send(b"".join(dcp.DcpStreamRequest(vb, 0, DOCS, 0, 0, 0, 0, b"", opaques[vb]).encode() for vb in range(VBS)))
    return opaques


def read_all(c: DcpClient) -> dict[int, list]:
    """Messages per vbucket until every stream ended; the stream-request replies all succeeded."""
    per_vb: dict[int, list] = {vb: [] for vb in range(VBS)}
    ended = 0
    while ended < VBS:
        frame = c.recv_frame(time.monotonic() + 20)
        if frame.is_response:
            assert dcp.DcpStreamRequestResponse.from_frame(frame).status == 0
            continue
        msg = dcp.decode_dcp(frame)
        per_vb[msg.vbucket].append(msg)
        ended += isinstance(msg, dcp.DcpStreamEnd)
    return per_vb


def check_streams(per_vb: dict[int, list]) -> None:
    for vb, msgs in per_vb.items():
        assert isinstance(msgs[0], dcp.DcpSnapshotMarker) and (msgs[0].start_seqno, msgs[0].end_seqno) == (0, DOCS)
        assert [(m.by_seqno, m.key, m.value) for m in items(msgs)] == \
            [(i + 1, b"g%d-%d" % (vb, i), b"x" * (100 + vb)) for i in range(DOCS)]
        assert isinstance(msgs[-1], dcp.DcpStreamEnd) and msgs[-1].reason == 0


def trips(admin) -> int:
    return int(admin.stats("dcp")["eq_dcpq:test:backfill_open_trips"])


def test_small_backfills_open_together(make_server, small_vbuckets):
    srv = make_server(data_dir=small_vbuckets)
    admin = srv.login()
    c = DcpClient(srv.port).connect()
    request_all(c)
    check_streams(read_all(c))
    # streams that arrive together open together: a trip per 8 streams or fewer, not one each
    assert trips(admin) <= VBS // 8
    c.close()
    admin.close()


def test_a_trip_stops_at_its_byte_budget_and_the_rest_open_later(make_server, small_vbuckets, monkeypatch):
    monkeypatch.setattr(backfills, "OPEN_GROUP_BYTES", 1)  # every trip reads one vbucket, then stops
    srv = make_server(data_dir=small_vbuckets)
    admin = srv.login()
    c = DcpClient(srv.port).connect()
    request_all(c)
    check_streams(read_all(c))  # the streams queued again still get everything, once
    assert trips(admin) >= VBS
    c.close()
    admin.close()


def test_a_trip_abandoned_by_a_disconnect_closes_the_scans_it_opened(make_server, small_vbuckets, monkeypatch):
    opened = []
    real = backfill._open_scans
    entered, proceed = threading.Event(), threading.Event()

    def slow(store, work, budget):
        entered.set()
        proceed.wait(60)  # the consumer goes away meanwhile
        # no first pages: a scan that read its whole vbucket would close itself
        out = real(store, [w[:-1] + (False,) for w in work], budget)
        opened.extend(r[0] for r in out if isinstance(r, tuple))
        return out

    monkeypatch.setattr(backfill, "_open_scans", slow)
    srv = make_server(data_dir=small_vbuckets)
    c = DcpClient(srv.port).connect()
    request_all(c)
    assert entered.wait(60)  # a trip is on its worker thread
    c.close()
    deadline = time.monotonic() + 60
    while srv.call(lambda: [conn for conn in srv.server.connections if conn.dcp is not None]):
        assert time.monotonic() < deadline, "the server did not see the consumer go"
        time.sleep(0.02)
    proceed.set()  # the trip goes on, for nobody
    deadline = time.monotonic() + 60
    while not opened or not all(scan.closed for scan in opened):
        assert time.monotonic() < deadline, f"{sum(not s.closed for s in opened)} scans left open (read transactions)"
        time.sleep(0.05)


def test_a_stream_retired_before_its_continuation_starts_closes_its_scan(make_server, small_vbuckets, monkeypatch):
    """A stream whose scan the trip left open goes on in a task of its own; retired (here: closed)
    before that task took its first step, the scan is still closed, not left to the collector."""
    opened, closed = [], set()
    real_open, real_close, real_decide = backfill._open_scans, BackfillScan.close, backfill.opened

    def no_first_pages(store, work, budget):  # every stream goes on in _continue_backfill
        out = real_open(store, [w[:-1] + (False,) for w in work], budget)
        opened.extend(r[0] for r in out if isinstance(r, tuple))
        return out

    def close(scan):
        closed.add(id(scan))
        real_close(scan)

    def decide(stream, purge_seqno):  # dcp/backfills.opened, asked as each opened scan lands
        if stream.vbid == 3:  # a CLOSE_STREAM already in the loop's queue when the trip's result lands
            (producer,) = [conn.dcp for conn in srv.server.connections if conn.dcp is not None]
            asyncio.get_running_loop().call_soon(producer.end_stream, stream, StreamEndReason.CLOSED)
        return real_decide(stream, purge_seqno)

    monkeypatch.setattr(backfill, "_open_scans", no_first_pages)
    monkeypatch.setattr(BackfillScan, "close", close)
    monkeypatch.setattr(backfill, "opened", decide)
    srv = make_server(data_dir=small_vbuckets)
    c = DcpClient(srv.port).connect()
    request_all(c)
    deadline = time.monotonic() + 60
    ends = 0
    while ends < VBS - 1:  # every stream but vbucket 3's ends OK; that one was closed quietly
        frame = c.recv_frame(deadline)
        if not frame.is_response:
            ends += isinstance(dcp.decode_dcp(frame), dcp.DcpStreamEnd)
    # `opened` holds every scan, so only the server's own close can have closed one (not the collector)
    wait_for(lambda: all(id(scan) in closed for scan in opened), what="every opened scan closed")
    c.close()


@pytest.fixture
def big_and_small(tmp_path):
    """vbuckets 0-5: ~4.3 MB each on disk; 6-37: ~140 KB each."""
    data = tmp_path / "data"
    with Bucket("default", data, 64, synchronous="OFF") as bucket:
        for vb in range(38):
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
            for i in range(4200 if vb < 6 else 140):
                bucket.vbucket(vb).set(b"b%d-%d" % (vb, i), b"x" * 1000)
    return data


@pytest.mark.slow
def test_continuation_reads_count_the_budgets_of_trips_in_flight(make_server, big_and_small, monkeypatch):
    """Large backfills reading on while a trip of small ones is on the worker: what the trip brings
    back lands on top of what they read, so their reads must leave the trip's budget free. The
    connection's backfill bytes stay within dcp_backfill_byte_limit plus a page or so per reader."""
    go = threading.Event()
    state = {"buffered": 0, "peak": 0, "large_reads": 0}
    real_read, real_open, real_feed = backfill._read_page, backfill._open_scans, backfill.ConnectionBackfills._feed

    def read_page(scan, *a):
        if scan.vb < 6:
            state["large_reads"] += 1
            if state["large_reads"] > 6:  # the continuations wait until the small trip is out
                go.wait(10)
        return real_read(scan, *a)

    def open_scans(store, work, budget):
        if all(w[0] >= 6 for w in work):
            go.set()
            deadline = time.monotonic() + 5  # until the large backfills read all they may
            while state["buffered"] < backfills.BACKFILL_BYTE_LIMIT - (1 << 20) and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_open(store, work, budget)

    def feed(self, stream, scan, page):
        real_feed(self, stream, scan, page)
        state["buffered"] = self.queue.buffered()
        state["peak"] = max(state["peak"], state["buffered"])

    monkeypatch.setattr(backfill, "_read_page", read_page)
    monkeypatch.setattr(backfill, "_open_scans", open_scans)
    monkeypatch.setattr(backfill.ConnectionBackfills, "_feed", feed)
    srv = make_server(data_dir=big_and_small)
    c = DcpClient(srv.port).connect()
    c.controls(connection_buffer_size=1000)  # nothing is acknowledged: what is read stays queued
    c.send(b"".join(dcp.DcpStreamRequest(vb, 0, 4200, 0, 0, 0, 0, b"", c.next_opaque()).encode() for vb in range(6)))
    deadline = time.monotonic() + 60
    while state["large_reads"] < 6:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)
    c.send(b"".join(dcp.DcpStreamRequest(vb, 0, 140, 0, 0, 0, 0, b"", c.next_opaque()).encode()
                    for vb in range(6, 38)))
    time.sleep(4)
    assert state["peak"] <= backfills.BACKFILL_BYTE_LIMIT + 3 * backfills.BACKFILL_PAGE_BYTES
    c.close()
