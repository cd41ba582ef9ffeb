"""Backfills of many small vbuckets open together (producer `_open_group`): one trip to a worker
thread opens several scans with their first pages, stops at OPEN_GROUP_BYTES and queues the rest
again, and a trip nobody waits for any more closes what it opened."""

import time

import pytest

from dcpflow.engine import Bucket, VBucketState
from dcpflow.protocol import dcp
from dcpflow.server import producer

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
    monkeypatch.setattr(producer, "OPEN_GROUP_BYTES", 1)  # every trip reads one vbucket, then stops
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
    real = producer._open_scans

    def slow(store, work, budget):
        time.sleep(0.5)  # the consumer goes away meanwhile
        # no first pages: a scan that read its whole vbucket would close itself
        out = real(store, [w[:-1] + (False,) for w in work], budget)
        opened.extend(r[0] for r in out if isinstance(r, tuple))
        return out

    monkeypatch.setattr(producer, "_open_scans", slow)
    srv = make_server(data_dir=small_vbuckets)
    c = DcpClient(srv.port).connect()
    request_all(c)
    time.sleep(0.2)
    c.close()
    deadline = time.monotonic() + 10
    while not opened or not all(scan.closed for scan in opened):
        assert time.monotonic() < deadline, f"{sum(not s.closed for s in opened)} scans left open (read transactions)"
        time.sleep(0.05)
