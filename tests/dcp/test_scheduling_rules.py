"""Connection-level scheduling without a socket: `backfill_order` (sequential opens one vbucket's
backfill at a time, in request order; round-robin opens them together), `stats dcp` of a producer
connection, and what `release` lets go of. The backfills run as server/backfill.py runs them - the
groups dcp/backfills.py gives, a page at a time, send passes in between - but on this thread.
test_scheduling.py keeps round-robin and a disconnect end to end."""

from dcpflow.dcp.backfills import opened
from dcpflow.engine.store import EncodedPage
from dcpflow.protocol import dcp

from .sansio import decode, engine_fixture, fill, items, producer, request, to_disk_only

engine = engine_fixture(4)


def controls(p, **kv) -> None:
    for key, value in kv.items():
        assert p.control(key, value, now=100.0, collections=False).__class__ is tuple


class Backfills:
    """server/backfill.py's ConnectionBackfills on this thread: `step` opens what `groups` allows
    (`opened`, `backfill_begin`) and reads one page of every running scan; the highest number of
    backfills running at once is kept in `peak`."""

    def __init__(self, p, page_size: int = 50):
        self.p, self.page_size = p, page_size
        self.scans: dict = {}
        self.peak = 0

    def step(self, sequential: bool) -> None:
        q, store = self.p.backfills, self.p.engine.store
        for group in q.groups(0, sequential):
            for stream in group:
                rng = stream.backfill
                scan = store.scan(stream.vbid, rng.start - 1, min(rng.end, stream.end_seqno), page_size=self.page_size)
                assert opened(stream, scan.purge_seqno) is None
                stream.backfill_begin(scan.purge_seqno)
                q.drop_opening(stream)
                q.started(stream, scan)  # the handle: anything with cancel()
                self.scans[stream] = scan
        self.peak = max(self.peak, len(self.scans))
        for stream, scan in list(self.scans.items()):
            chunk = scan.next_rows()
            if chunk:
                if chunk.__class__ is EncodedPage:
                    stream.backfill_encoded(chunk)
                else:
                    stream.backfill_rows(chunk)
            if not chunk or scan.closed:
                stream.backfill_complete()
                q.finished(stream, scan)
                del self.scans[stream]
                if not scan.closed:
                    scan.close()
            self.p.wake(stream)


def run(p, sequential: bool, rounds: int = 1000) -> tuple[list, int]:
    """Send passes and backfill steps until nothing moves: (messages, most backfills at once)."""
    b = Backfills(p)
    out: list = []
    for _ in range(rounds):
        sp = p.send_pass()
        out += sp.out
        b.step(sequential)
        if not sp.out and not sp.more and not b.scans and not p.backfills.waiting:
            return decode(out), b.peak
    raise AssertionError("the connection did not settle")


def three_on_disk(engine, n: int, value: bytes = b'{"v":1}') -> None:
    for vb in (0, 1, 2):
        fill(engine, vb, n, value=value)
        to_disk_only(engine, vb)


def test_sequential_backfill_order(engine):
    three_on_disk(engine, 300, b"s" * 200)
    p = producer(engine)
    controls(p, backfill_order="sequential")
    for vb in (0, 1, 2):
        p.stream_request(request(vb, 0, 300), collections=False)
    msgs, peak = run(p, sequential=True)
    assert [m.vbucket for m in items(msgs)] == [0] * 300 + [1] * 300 + [2] * 300  # one at a time, in order
    assert peak == 1


def test_round_robin_delivers_everything(engine):
    three_on_disk(engine, 100)
    p = producer(engine)
    for vb in (0, 1, 2):
        p.stream_request(request(vb, 0, 100), collections=False)
    msgs, peak = run(p, sequential=False)
    for vb in (0, 1, 2):
        assert [m.by_seqno for m in items(msgs) if m.vbucket == vb] == list(range(1, 101))
    assert peak == 3  # opened together
    order = [m.vbucket for m in items(msgs)]
    assert order != sorted(order)  # and their pages interleave


def test_stats_dcp(engine):
    fill(engine, 0, 5)
    p = producer(engine, name="statme")
    controls(p, connection_buffer_size="100000", set_priority="high", enable_noop="true")
    p.stream_request(request(0), collections=False)
    sp = p.send_pass()
    assert [m.by_seqno for m in items(decode(sp.out))] == [1, 2, 3, 4, 5]
    stats = p.stats()
    s = "eq_dcpq:statme:"
    assert stats[s + "type"] == "producer"
    assert stats[s + "priority"] == "high"
    assert stats[s + "max_buffer_bytes"] == 100000
    assert stats[s + "unacked_bytes"] == sp.sent
    assert stats[s + "num_streams"] == 1
    assert stats[s + "noop_enabled"] == 1
    assert stats[s + "stream_0_state"] == "in-memory"
    assert stats[s + "stream_0_last_sent_seqno"] == 5
    assert stats[s + "stream_0_items_sent"] == 5


def test_release_lets_go_of_cursors_and_backfills(engine):
    fill(engine, 0, 2000, value=b"d" * 300)
    to_disk_only(engine, 0)
    p = producer(engine, name="leaver")
    controls(p, connection_buffer_size="1000")  # stalls the backfill almost at once
    for vb in (0, 1, 2):
        p.stream_request(request(vb), collections=False)
    b = Backfills(p)
    for _ in range(3):
        p.send_pass()
        b.step(sequential=False)
    cursors = lambda: sum(len(engine.vbucket(v).checkpoint_manager.cursors) for v in (0, 1, 2))  # noqa: E731
    assert cursors() == 3 + 3  # the persistence cursors and ours
    assert p.backfills.running  # vbucket 0's backfill is stalled by the window
    p.release()
    assert cursors() == 3 and not p.backfills.running and not p.backfills.waiting and not p.streams
    for scan in b.scans.values():
        scan.close()
    d = producer(engine, name="next")
    assert d.stream_request(request(0, 0, 2000), collections=False).__class__.__name__ == "Started"
    msgs, _ = run(d, sequential=False)
    assert len(items(msgs)) == 2000
    assert [m.reason for m in msgs if isinstance(m, dcp.DcpStreamEnd)] == [0]  # OK at its end seqno
