"""Connection-level scheduling: backfill_order (sequential finishes one vbucket's backfill before
the next), set_priority, and `stats dcp`."""

from dcpflow.protocol import dcp
from dcpflow.protocol.status import Status

from .client import items
from .conftest import fill, to_disk_only


def test_sequential_backfill_order(server, clients, writer):
    for vb in (0, 1, 2):
        fill(writer, vb, 300, value=b"s" * 200)
        to_disk_only(server, vb)
    c = clients()
    c.controls(backfill_order="sequential")
    for vb in (0, 1, 2):
        assert c.stream_request(vb, 0, 300).status == Status.SUCCESS
    msgs = []
    for _ in range(3):
        msgs += c.until_stream_end()
    order = [m.vbucket for m in items(msgs)]
    assert order == [0] * 300 + [1] * 300 + [2] * 300  # one vbucket at a time, in request order


def test_round_robin_delivers_everything(server, clients, writer):
    for vb in (0, 1, 2):
        fill(writer, vb, 100)
        to_disk_only(server, vb)
    c = clients()
    for vb in (0, 1, 2):
        assert c.stream_request(vb, 0, 100).status == Status.SUCCESS
    msgs = []
    for _ in range(3):
        msgs += c.until_stream_end()
    for vb in (0, 1, 2):
        assert [m.by_seqno for m in items(msgs) if m.vbucket == vb] == list(range(1, 101))


def test_stats_dcp(server, clients, writer):
    fill(writer, 0, 5)
    c = clients(name="statme")
    c.controls(connection_buffer_size=100000, set_priority="high", enable_noop="true")
    assert c.stream_request(0).status == Status.SUCCESS
    c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 5)
    stats = writer.stats("dcp")
    p = "eq_dcpq:statme:"
    assert stats[p + "type"] == "producer"
    assert stats[p + "priority"] == "high"
    assert int(stats[p + "max_buffer_bytes"]) == 100000
    assert int(stats[p + "unacked_bytes"]) == c.received_bytes
    assert int(stats[p + "num_streams"]) == 1
    assert int(stats[p + "noop_enabled"]) == 1
    assert stats[p + "stream_0_state"] == "in-memory"
    assert int(stats[p + "stream_0_last_sent_seqno"]) == 5
    assert int(stats[p + "stream_0_items_sent"]) == 5


def test_disconnect_releases_cursors_and_backfills(server, clients, writer):
    import time

    from .conftest import engine_of
    fill(writer, 0, 2000, value=b"d" * 300)
    to_disk_only(server, 0)
    c = clients(name="leaver")
    c.controls(connection_buffer_size=1000)  # stalls the backfill almost at once
    for vb in (0, 1, 2):
        assert c.stream_request(vb).status == Status.SUCCESS
    c.quiet(0.3)
    cursors = lambda: server.call(lambda: sum(len(engine_of(server).vbucket(v).checkpoint_manager.cursors)  # noqa: E731
                                              for v in (0, 1, 2)))
    assert cursors() == 3 + 3  # the persistence cursors and ours
    c.close()
    deadline = time.monotonic() + 5
    while cursors() != 3:
        assert time.monotonic() < deadline, "stream cursors were not released"
        time.sleep(0.02)
    d = clients(name="next")
    assert d.stream_request(0, 0, 2000).status == Status.SUCCESS
    assert len(items(d.until_stream_end(0))) == 2000
