"""Rollback mitigation's rule, without sockets (hold.HoldGate): events are held until every
copy persisted them, released in order, dropped above a rollback point, and the offsets saved are
those of released events only."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.client.events import Mutation, Rollback, SnapshotMarker, StreamEnd
from dcpflow.client.hold import HoldGate, event_size
from dcpflow.client.mitigation import persisted_from
from dcpflow.client.offsets import Offset
from dcpflow.protocol.kv import ObserveSeqnoResponse

UUID = 0xAB


def mut(seqno, vb=0, uuid=UUID, start=None, end=None, value=b"v"):
    return Mutation(vb, seqno, b"k%d" % seqno, value, 1, 1, 0, 0, 0, uuid, start or seqno, end or seqno)


def marker(start, end, vb=0):
    return SnapshotMarker(vb, start, end, 0)


def seqnos(events):
    return [e.seqno for e in events if type(e) is Mutation]


def gate(max_bytes=1 << 20, vbs=(0,), markers=False):
    return HoldGate({vb: Offset() for vb in vbs}, max_bytes, markers)


def test_nothing_is_released_before_it_is_persisted_everywhere():
    g = gate()
    assert g.add(marker(1, 3)) == []
    assert [list(g.add(mut(s, start=1, end=3))) for s in (1, 2, 3)] == [[], [], []]
    assert g.waiting() == {0: UUID}
    assert seqnos(g.persisted(0, 2)) == [1, 2]
    assert g.offsets()[0].seqno == 0  # 2 is inside snapshot 1..3: no boundary released yet
    assert seqnos(g.persisted(0, 3)) == [3]
    assert g.offsets()[0] == Offset(UUID, 3, 1, 3)
    assert g.empty and g.waiting() == {}


def test_a_rollback_drops_the_held_events_above_its_point_and_is_not_shown():
    g = gate()
    g.add(marker(1, 2))
    g.add(mut(1, start=1, end=2))
    g.add(mut(2, start=1, end=2))
    g.add(marker(3, 5))
    for s in (3, 4, 5):
        g.add(mut(s, start=3, end=5))
    assert seqnos(g.persisted(0, 2)) == [1, 2]
    # the active died with 3..5 unpersisted: the new active rolls us back to 2
    out = g.add(Rollback(0, 2, Offset(0xCD, 2, 1, 2)))
    assert out == [] and g.stats["dropped"] == 3 and g.stats["rollbacks_hidden"] == 1
    assert g.empty
    assert g.offsets()[0] == Offset(0xCD, 2, 1, 2)
    # the new branch's 3..4 arrive; the old persisted seqno (2) does not release them
    g.add(marker(3, 4))
    g.add(mut(3, uuid=0xCD, start=3, end=4))
    g.add(mut(4, uuid=0xCD, start=3, end=4))
    assert g.waiting() == {0: 0xCD}
    assert [e.value for e in g.persisted(0, 4)] == [b"v", b"v"]
    assert g.offsets()[0] == Offset(0xCD, 4, 3, 4)


def test_a_rollback_below_what_was_released_reaches_the_application():
    g = gate()
    g.add(mut(1))
    g.add(mut(2))
    assert seqnos(g.persisted(0, 2)) == [1, 2]
    rb = Rollback(0, 1, Offset(0xCD, 1, 1, 1))
    assert g.add(rb) == [rb]
    assert g.offsets()[0] == Offset(0xCD, 1, 1, 1)


def test_the_persisted_seqno_before_a_rollback_does_not_release_the_new_branch():
    g = gate()
    g.add(mut(1))
    g.persisted(0, 1)
    g.persisted(0, 9)  # the old branch had persisted further than we had read
    g.add(Rollback(0, 1, Offset(0xCD, 1, 1, 1)))
    assert not g.add(mut(2, uuid=0xCD))
    assert seqnos(g.persisted(0, 2)) == [2]


def test_markers_and_stream_ends_wait_behind_the_events_before_them():
    g = gate(markers=True)
    assert g.add(marker(1, 1)) == [marker(1, 1)]  # nothing before it: it goes at once
    g.add(mut(1))
    g.add(marker(2, 2))
    g.add(mut(2))
    g.add(StreamEnd(0, 0, Offset()))
    out = g.persisted(0, 1)
    assert [type(e).__name__ for e in out] == ["Mutation", "SnapshotMarker"]
    out = g.persisted(0, 2)
    assert [type(e).__name__ for e in out] == ["Mutation", "StreamEnd"]
    assert g.offsets()[0] == Offset(UUID, 2, 2, 2)


def test_vbuckets_are_released_independently():
    g = gate(vbs=(0, 1))
    g.add(mut(1, vb=0))
    g.add(mut(1, vb=1))
    assert [(e.vbucket, e.seqno) for e in g.persisted(1, 1)] == [(1, 1)]
    assert g.waiting() == {0: UUID}


def test_the_held_bytes_are_counted_and_full_stops_the_reader():
    big = b"x" * 1000
    g = gate(max_bytes=3 * event_size(mut(1, value=big)))
    for s in (1, 2):
        g.add(mut(s, value=big))
        assert not g.full
    g.add(mut(3, value=big))
    assert g.full and g.stats["held_max_bytes"] == g.bytes
    g.persisted(0, 1)
    assert not g.full
    g.persisted(0, 3)
    assert g.bytes == 0


def test_observe_reply_after_a_failover_counts_only_the_kept_part_of_the_branch():
    same = ObserveSeqnoResponse(0, UUID, 40, 50)
    assert persisted_from(same, UUID) == 40
    assert persisted_from(same, 0x99) == 0
    failed_over = ObserveSeqnoResponse(0, 0xCD, 40, 50, UUID, 30)
    assert persisted_from(failed_over, UUID) == 30
    assert persisted_from(ObserveSeqnoResponse(0, 0xCD, 20, 50, UUID, 30), UUID) == 20


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(1, 3)),
    st.tuples(st.just("persist"), st.integers(0, 3)),
    st.tuples(st.just("rollback"), st.integers(0, 6)),
), max_size=40))
def test_delivered_events_are_persisted_in_order_and_never_above_a_later_rollback(script):
    """A model: writes arrive, persistence moves, rollbacks cut the history. Every released event
    was persisted when released, seqnos released per branch increase, and no released event lies
    above a rollback that came after it unless the gate showed that rollback."""
    g = gate()
    high = persisted = 0
    uuid = UUID
    delivered: list = []
    cuts: list = []  # (rollback point, the newest branch it cut): what lies above on that branch is gone
    for op, n in script:
        if op == "write":
            for _ in range(n):
                high += 1
                delivered += g.add(mut(high, uuid=uuid))
        elif op == "persist":
            persisted = min(high, persisted + n)
            out = g.persisted(0, persisted)
            assert all(e.seqno <= persisted for e in out if type(e) is Mutation)
            delivered += out
        else:
            point = min(high, persisted + max(0, n - 3))  # may lie above persisted (a lucky replica)
            cuts.append((point, uuid))
            uuid += 1
            delivered += g.add(Rollback(0, point, Offset(uuid, point, point, point)))
            shown = delivered[-1] if delivered and type(delivered[-1]) is Rollback else None
            above = [e for e in delivered if type(e) is Mutation and e.seqno > point]
            assert not above or shown is not None
            if shown is not None:
                delivered = [e for e in delivered if type(e) is not Mutation or e.seqno <= point]
            high = point
    last = 0
    for e in delivered:
        if type(e) is Mutation:
            assert e.seqno > last
            last = e.seqno
        else:
            last = e.seqno
    gone = [e for e in delivered if type(e) is Mutation and any(e.vbuuid <= u and e.seqno > p for p, u in cuts)]
    assert gone == []


WINDOW, BOUND = 64 * 1024, 48 * 1024  # the flow-control window and max_held_bytes of the bounded reads


def connect_bounded(port: int):
    from dcpflow.client import DcpClient

    from .conftest import PASSWORD, USER, url
    return DcpClient.connect(url(port), USER, PASSWORD, buffer_size=WINDOW, mitigate_rollbacks=True,
                             persistence_poll_interval=0.01, max_held_bytes=BOUND)


def assert_bounded(stream, docs: dict) -> None:
    """What the read keeps is within the bound (plus one event), what the connection holds
    unacknowledged within the window, and the producer was held back: far from all of `docs` came."""
    gate = stream.gate
    biggest = max(event_size(mut(1, value=v)) for v in docs.values()) + 64
    assert gate.bytes + gate.out_bytes <= BOUND + biggest
    assert gate.stats["held_max_bytes"] <= BOUND + biggest
    assert stream.feed.outstanding() <= WINDOW + 2048
    received = sum(conn.charged_total for conn in stream.feed._conns.values())
    assert received <= BOUND + 2 * WINDOW < sum(len(v) for v in docs.values())


async def wait_polls(stream, n: int) -> None:
    """Until the poller has had `n` more periods (whether or not anything was held)."""
    import asyncio
    polls = stream.gate.stats["polls"]
    while stream.gate.stats["polls"] < polls + n:
        await asyncio.sleep(0.01)


def test_held_events_are_bounded_and_flow_control_holds_the_producer(server, writer):
    """Persistence paused, far more data written than the client may hold: the gate fills to its
    bound and stops; the connection never has more than its window unacknowledged, so the producer
    waits; nothing is delivered; after persistence resumes everything arrives once, in order."""
    import asyncio

    from tests.server.faults.helpers import http_of

    from .conftest import run, write

    http = http_of(server)
    assert http.post("/faults/buckets/default/persistence/pause").status == 200
    docs = write(writer, 600, size=1000)

    async def go():
        async with await connect_bounded(server.port) as c:
            stream = c.events(start="beginning", end="now")
            got = []

            async def read():
                async for ev in stream:
                    got.append(ev)
            task = asyncio.ensure_future(read())
            while not (stream.gate is not None and stream.gate.full):
                assert not task.done(), task.exception()
                await asyncio.sleep(0.01)
            await wait_polls(stream, 20)  # the poller keeps looking; nothing moves
            assert got == []
            assert_bounded(stream, docs)
            resumed = await asyncio.to_thread(http.post, "/faults/buckets/default/persistence/resume")
            assert resumed.status == 200
            await task
            return got

    got = run(go(), 120)
    keys = [ev.key for ev in got if type(ev) is Mutation]
    assert sorted(keys) == sorted(docs) and len(keys) == len(set(keys))


def test_closing_a_read_that_holds_events_ends_its_iteration(server, writer):
    """aclose() from another task while events are held (persistence paused): the application's
    `async for` ends, nothing held is delivered, and the offsets are still the released ones."""
    import asyncio

    from dcpflow.client import DcpClient
    from tests.server.faults.helpers import http_of

    from .conftest import PASSWORD, USER, run, url, write

    http = http_of(server)
    assert http.post("/faults/buckets/default/persistence/pause").status == 200
    try:
        write(writer, 50)

        async def go():
            async with await DcpClient.connect(url(server.port), USER, PASSWORD, mitigate_rollbacks=True,
                                               persistence_poll_interval=0.01) as c:
                stream = c.events(start="beginning")
                got = []

                async def read():
                    async for ev in stream:
                        got.append(ev)
                task = asyncio.ensure_future(read())
                while not (stream.gate is not None and stream.gate.stats["released"] == 0
                           and stream.gate.bytes and stream.gate.stats["polls"] > 5):
                    await asyncio.sleep(0.01)
                await stream.aclose()
                await asyncio.wait_for(task, 10)
                return got, stream.offsets

        got, offsets = run(go(), 60)
        assert got == [] and all(o.seqno == 0 for o in offsets.values())
    finally:
        assert http.post("/faults/buckets/default/persistence/resume").status == 200


def test_released_events_the_application_has_not_taken_count_against_the_bound(server, writer):
    """Everything persisted, an application that takes one event and then stops: the events
    released but not taken count with the held ones, so the reader stops at the bound and the
    producer at its window (they are not piled up in memory)."""
    from tests.server.faults.helpers import high_seqnos
    from tests.server.faults.helpers import persisted as wait_persisted

    from .conftest import run, write

    docs = write(writer, 600, size=1000)
    for vb, high in high_seqnos(writer).items():
        if high:
            wait_persisted(writer, vb, high)

    async def go():
        async with await connect_bounded(server.port) as c:
            stream = c.events(start="beginning", end="now")
            it = stream.__aiter__()
            first = await it.__anext__()
            await wait_polls(stream, 20)
            assert_bounded(stream, docs)
            rest = [ev async for ev in it]
            return [first, *rest]

    got = run(go(), 120)
    keys = [ev.key for ev in got if type(ev) is Mutation]
    assert sorted(keys) == sorted(docs)
