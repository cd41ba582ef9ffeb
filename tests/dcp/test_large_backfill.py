"""A vbucket with a million items backfills page by page: the producer never holds more than its
read-ahead limit of encoded messages, whatever the vbucket's size, and the consumer gets every
item once, in seqno order."""

import time

import pytest

from dcpflow.dcp.backfills import BACKFILL_PAGE_BYTES, BACKFILL_QUEUE_BYTES
from dcpflow.engine import Bucket, VBucketState
from dcpflow.protocol import dcp

from .client import DcpClient

N = 1_000_000


@pytest.mark.slow
def test_million_item_backfill_is_bounded(make_server, tmp_path):
    data = tmp_path / "data"
    with Bucket("default", data, 64, synchronous="OFF", flush_batch_items=100_000) as bucket:
        bucket.set_vbucket_state(0, VBucketState.ACTIVE)
        vb = bucket.vbucket(0)
        for i in range(N):
            vb.set(b"m%07d" % i, b"0123456789abcdef")
            if i % 200_000 == 199_999:
                bucket.flush_all()
    srv = make_server(data_dir=data)
    admin = srv.login()  # stats over its own connection: the DCP one is busy streaming
    c = DcpClient(srv.port).connect()
    buffer = 1 << 20
    c.controls(connection_buffer_size=buffer)
    assert c.stream_request(0, 0, N).status == 0
    # hold the consumer still: the backfill fills its read-ahead and stops reading the disk
    time.sleep(1.0)
    stats = admin.stats("dcp")
    prefix = "eq_dcpq:test:stream_0_"
    queued = int(stats[prefix + "ready_queue_bytes"])
    read = int(stats[prefix + "backfill_items"])
    assert queued <= BACKFILL_QUEUE_BYTES + BACKFILL_PAGE_BYTES
    assert read < N // 10  # far from all of it
    # now drain everything, acknowledging as we go
    expect = 1
    acked_at = 0
    while True:
        frame = c.recv_frame()
        msg = dcp.decode_dcp(frame)
        if isinstance(msg, dcp.DcpMutation):
            assert msg.by_seqno == expect
            expect += 1
        elif isinstance(msg, dcp.DcpStreamEnd):
            break
        if c.received_bytes - acked_at >= buffer // 4:
            c.buffer_ack(c.received_bytes - acked_at)
            acked_at = c.received_bytes
            if expect % 100_000 < 300:
                peak = int(admin.stats("dcp").get(prefix + "ready_queue_peak_bytes", 0))
                assert peak <= BACKFILL_QUEUE_BYTES + BACKFILL_PAGE_BYTES
    assert expect == N + 1
    c.close()
    admin.close()


@pytest.mark.slow
def test_backfills_of_a_connection_share_one_byte_limit(make_server, tmp_path):
    """Many vbuckets backfilling for a consumer that does not read: together they stop at about
    dcp_backfill_byte_limit (20 MiB), not at 4 MiB per stream."""
    from dcpflow.dcp.backfills import BACKFILL_BYTE_LIMIT, ENCODED_PAGE_ITEMS, OPEN_GROUP_BYTES, OPEN_TRIPS
    data = tmp_path / "data"
    value = b"v" * 1000
    with Bucket("default", data, 64, synchronous="OFF") as bucket:
        for vb in range(32):
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
            for i in range(1200):
                bucket.vbucket(vb).set(b"v%d-%d" % (vb, i), value)
    srv = make_server(data_dir=data)
    admin = srv.login()
    c = DcpClient(srv.port).connect()
    c.controls(connection_buffer_size=1)
    for vb in range(32):
        assert c.stream_request(vb, 0, 1200).status == 0

    def queued() -> int:
        return sum(int(v) for k, v in admin.stats("dcp").items() if k.endswith("_ready_queue_bytes"))

    # it does read up to about the limit: in about a second, unless the machine is busy
    deadline = time.monotonic() + 60
    while queued() < BACKFILL_BYTE_LIMIT - OPEN_GROUP_BYTES:
        assert time.monotonic() < deadline, f"only {queued()} bytes read ahead"
        time.sleep(0.05)
    time.sleep(1.0)  # and no further, however long it is left
    now = queued()
    assert now < 32 * 1200 * 1000  # not everything was read
    # one (first, so fixed-size) page beyond the limit per trip that opens scans, at most: a trip
    # reads first pages up to its share of the room (the trips in flight count as queued) and may
    # go over it by the last page it reads; OPEN_TRIPS of them are in flight at once
    assert now <= BACKFILL_BYTE_LIMIT + OPEN_TRIPS * ENCODED_PAGE_ITEMS * 1100
    c.close()
    admin.close()
