"""Connection-level scheduling end to end: round-robin backfills deliver everything, and a
disconnect releases cursors and backfills. The rules (backfill_order sequential and round-robin,
`stats dcp` of a producer, what a released connection lets go of) are checked without a socket in
test_scheduling_rules.py."""

from dcpflow.protocol.status import Status

from .client import items
from .conftest import fill, to_disk_only


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
    deadline = time.monotonic() + 60
    while cursors() != 3:
        assert time.monotonic() < deadline, "stream cursors were not released"
        time.sleep(0.02)
    d = clients(name="next")
    assert d.stream_request(0, 0, 2000).status == Status.SUCCESS
    assert len(items(d.until_stream_end(0))) == 2000
