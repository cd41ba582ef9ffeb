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
    wait_for(lambda: not srv.call(lambda: [conn for conn in srv.server.connections if conn.dcp is not None]),
             what="the server seeing the consumer go")
    proceed.set()  # the trip goes on, for nobody
    wait_for(lambda: opened and all(scan.closed for scan in opened), what="every scan the trip opened closed")


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
    back lands on top of what they read, so their reads leave the trip's budget free
    (BackfillQueue.room counts the budgets of the trips in flight). A trip starts only while the
    connection's backfill bytes leave room for its whole budget; the continuations beside it may
    take what is left beyond the budget, no more.

    Step by step: the six large streams open (their first pages, ~13 MB, queued: below the limit
    less a trip's budget) and their continuations are held; the 32 small streams queue and go in
    one trip, held on its worker thread; the continuations read all they may (until each waits for
    room); then the trip returns and its pages land. Every continuation page read while the trip
    was out was read below dcp_backfill_byte_limit with the budget counted, and once the trip's
    pages landed the connection's backfill bytes are within the limit plus a page per reader: the
    continuation page that crossed the line and the trip's last first page."""
    limit, budget = backfills.BACKFILL_BYTE_LIMIT, backfills.OPEN_GROUP_BYTES
    large, small = range(6), range(6, 38)
    state: dict = {"peak": 0, "before": [], "pages": [], "small": []}
    held: list[int] = []  # large streams whose continuation waits at the gate
    gate = asyncio.Event()  # the large continuations read on once it is set (on the server's loop)
    hold_start = threading.Event()  # while set, queued backfills do not open (the small ones gather)
    trip_in, trip_go = threading.Event(), threading.Event()
    trip: dict = {}
    real_open, real_feed = backfill._open_scans, backfill.ConnectionBackfills._feed
    real_continue, real_start = backfill.ConnectionBackfills._continue_backfill, backfill.ConnectionBackfills.start

    async def continue_backfill(self, stream, rng, scan, started):
        if stream.vbid in large:
            held.append(stream.vbid)
            await gate.wait()
        await real_continue(self, stream, rng, scan, started)

    def start(self):
        if not hold_start.is_set():
            real_start(self)

    def open_scans(store, work, budget_):
        if all(w[0] in small for w in work):  # the trip of small ones: held on its worker thread
            trip.update(vbs=[w[0] for w in work], budget=budget_)
            trip_in.set()
            assert trip_go.wait(60), "the test never let the trip go"
            out = real_open(store, work, budget_)
            trip["returned"] = True
            return out
        return real_open(store, work, budget_)

    def feed(self, stream, scan, page_):
        if stream.vbid in large and trip_in.is_set() and not trip_go.is_set():
            # a continuation page read while the trip was out, and what counted when it was read:
            # a continuation feeds its page before the next one takes the read lock, nothing is
            # sent (no acks) and the trip is held, so the bytes are those its room check saw
            state["before"].append(self.queue.bytes())
            state["pages"].append(page_[2])
        if stream.vbid in small:
            state["small"].append(page_[2])
        real_feed(self, stream, scan, page_)
        state["peak"] = max(state["peak"], self.queue.buffered())

    monkeypatch.setattr(backfill.ConnectionBackfills, "_continue_backfill", continue_backfill)
    monkeypatch.setattr(backfill.ConnectionBackfills, "start", start)
    monkeypatch.setattr(backfill, "_open_scans", open_scans)
    monkeypatch.setattr(backfill.ConnectionBackfills, "_feed", feed)
    srv = make_server(data_dir=big_and_small)
    c = DcpClient(srv.port).connect()
    try:
        c.controls(connection_buffer_size=1000)  # nothing is acknowledged: what is read stays queued
        c.send(b"".join(dcp.DcpStreamRequest(vb, 0, 4200, 0, 0, 0, 0, b"", c.next_opaque()).encode() for vb in large))
        (shell,) = wait_for(lambda: srv.call(lambda: [conn.dcp for conn in srv.server.connections if conn.dcp]),
                            what="the producer")
        reader, queue = shell.backfills, shell.state.backfills  # ConnectionBackfills, BackfillQueue
        # every large stream opened (its first page queued) and holds at the gate; no trip in flight
        wait_for(lambda: srv.call(lambda: sorted(held) == list(large) and not reader._openers),
                 what="the large streams opened")
        first_pages = srv.call(queue.buffered)
        assert first_pages + budget <= limit  # so the small trip starts, with its whole budget

        hold_start.set()
        c.send(b"".join(dcp.DcpStreamRequest(vb, 0, 140, 0, 0, 0, 0, b"", c.next_opaque()).encode() for vb in small))
        wait_for(lambda: srv.call(lambda: sorted(s.vbid for s in queue.waiting) == list(small)),
                 what="the small streams queued")

        def release():
            hold_start.clear()
            reader.start()

        srv.call(release)
        assert trip_in.wait(60), "the small streams' trip did not start"
        assert trip["vbs"] == list(small) and trip["budget"] == budget

        srv.call(gate.set)  # the large continuations read on beside the trip

        def all_wait_for_room():
            tasks = [t for s, t in queue.running.items() if s.vbid in large and t is not None]
            waiting = [f for f in reader._space_waiters if not f.done()]
            return tasks and len(waiting) == len(tasks) and not reader.scheduler.read_lock.locked()

        wait_for(lambda: srv.call(all_wait_for_room), what="the continuations waiting for room")
        read, reserved = srv.call(lambda: (queue.buffered(), queue.trip_bytes))
        assert "returned" not in trip and reserved == budget  # the trip is still out
        assert state["pages"], "no continuation read while the trip was out"
        # each read while the trip was out started below the limit with the trip's budget counted,
        # and they read on until that line: the last one crossed it
        assert max(state["before"]) < limit, (state["before"], reserved, limit)
        assert read + reserved >= limit, (read, reserved, limit)

        trip_go.set()  # the trip reads its pages and they land
        wait_for(lambda: "returned" in trip and srv.call(lambda: not reader._openers and queue.trip_bytes == 0),
                 what="the trip's pages landed")
        assert sum(state["small"]) >= budget  # the trip brought back its whole budget
        # beyond the limit: the continuation page that crossed it, and the trip's last page
        assert state["peak"] <= limit + max(state["pages"]) + max(state["small"]), (state, limit)
    finally:
        trip_go.set()
        srv.call(gate.set)
        c.close()
