"""Offsets and the safe-point rules (offsets.py), sans-I/O: the committed offset only moves at a
complete snapshot, the position is always a valid stream-request offset, and the rollback point
follows building-a-simple-client.md."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.client import BEGINNING, Offset
from dcpflow.client.offsets import (
    U64_MAX,
    OffsetError,
    VbTracker,
    offsets_from_json,
    offsets_to_json,
    rollback_offset,
)
from dcpflow.protocol.failover import divergence
from tests.protocol.failover_model import histories

U = 0xAAAA


def test_offset_validation_and_json():
    assert Offset.at(7, 10) == Offset(7, 10, 10, 10)
    assert Offset.from_json({"vbuuid": 1, "seqno": 5, "snapshot_start": 3, "snapshot_end": 9}) == Offset(1, 5, 3, 9)
    assert Offset.from_json([1, 5, 3, 9]) == Offset(1, 5, 3, 9)
    assert Offset.from_json(Offset(1, 5, 3, 9).to_json()) == Offset(1, 5, 3, 9)
    with pytest.raises(ValueError, match="snapshot_start <= seqno <= snapshot_end"):
        Offset(1, 2, 3, 4).check()
    with pytest.raises(ValueError, match="lacks seqno"):
        Offset.from_json({"vbuuid": 1})
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        Offset(-1, 0, 0, 0).check()
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        Offset(1 << 64, 0, 0, 0).check()


def test_discussion_md_example_keeps_the_snapshot_range():
    """discussion.md: snapshot 1..4, items 2 and 3 received. Resuming must send snapshot {1,4} with
    start 3 (so the server can roll us back to 1), and nothing is committed yet."""
    tr = VbTracker(0)
    tr.opened([(U, 0)])
    tr.snapshot(1, 4)
    tr.item(2)
    tr.item(3)
    assert tr.position == Offset(U, 3, 1, 4)
    assert tr.committed == BEGINNING


def test_commit_points():
    tr = VbTracker(0)
    tr.opened([(U, 0)])
    tr.snapshot(0, 3)
    tr.item(1)
    tr.item(3)  # the item that ends the snapshot
    assert tr.committed == Offset(U, 3, 0, 3) and tr.position == tr.committed
    tr.snapshot(4, 8)
    tr.item(5)
    assert tr.committed == Offset(U, 3, 0, 3)
    tr.seqno_advanced(8)  # the rest of the snapshot was not for us
    assert tr.committed == Offset(U, 8, 4, 8)
    tr.snapshot(9, 12)
    tr.item(10)  # 11 and 12 never come (e.g. prepares): the next marker completes the snapshot
    tr.snapshot(13, 13)
    assert tr.committed == Offset(U, 12, 9, 12)
    tr.item(13)
    tr.snapshot(14, 20)
    tr.item(15)
    tr.stream_end_ok()  # STREAM_END OK follows the complete snapshot
    assert tr.committed == Offset(U, 20, 14, 20)


def test_a_new_marker_does_not_move_the_position_before_an_item_arrives():
    """Memory snapshot start = first item's seqno (snapshot-marker.md case 3): until an item of it
    arrives, resuming with that snapshot range would break snap_start <= start (ERANGE)."""
    tr = VbTracker(0, Offset.at(U, 100))
    tr.opened([(U, 0)])
    tr.snapshot(105, 110)
    assert tr.position == Offset.at(U, 100)
    tr.item(105)
    assert tr.position == Offset(U, 105, 105, 110)


def test_open_switches_to_the_newest_branch_and_rollback_resets():
    tr = VbTracker(3, Offset.at(0xA, 50))
    tr.opened([(0xB, 40), (0xA, 0)])
    assert tr.committed == Offset.at(0xA, 50)  # nothing new yet: the old offset stays as it was
    tr.snapshot(51, 52)
    tr.item(52)
    assert tr.committed == Offset(0xB, 52, 51, 52)
    tr.rolled_back(Offset.at(0xB, 45))
    assert tr.committed == tr.position == Offset.at(0xB, 45) and tr.marker is None


def test_rollback_point_is_a_consistent_boundary():
    """A de-duplicated snapshot 1..10 holds no consistent point below 10: a rollback to 6 must go
    back to the previous boundary (0 here), where the versions replaced inside it come back."""
    tr = VbTracker(0)
    tr.opened([(U, 0)])
    tr.snapshot(1, 10)
    tr.item(4)
    tr.item(10)
    assert tr.rollback_point(6) == 0 and tr.rollback_point(10) == 10
    for s in (11, 12, 13):  # one-item memory snapshots: every seqno is a boundary
        tr.snapshot(s, s)
        tr.item(s)
    assert tr.rollback_point(12) == 12 and tr.rollback_point(100) == 13
    tr.rolled_back(Offset.at(U, 11))
    assert list(tr.boundaries) == [0, 10, 11] and tr.rollback_point(12) == 11


def test_a_saved_offset_proves_its_end_and_the_point_before_its_snapshot():
    """After a restart only the saved offset is known: seqno is a boundary if it ends its snapshot,
    and snapshot_start - 1 is when the offset carries a real snapshot range (every snapshot before it
    was complete); nothing else."""
    at_end = VbTracker(0, Offset(U, 30, 21, 30))
    assert [at_end.rollback_point(r) for r in (10, 20, 29, 30, 99)] == [0, 20, 20, 30, 30]
    inside = VbTracker(0, Offset(U, 25, 21, 30))
    assert [inside.rollback_point(r) for r in (19, 20, 25, 29)] == [0, 20, 20, 20]
    # (s, s, s) is how a consumer at a boundary writes its offset (rollback.md): it proves s, not s - 1
    # (in a de-duplicated snapshot 41..50, 49 is not a consistent point)
    assert VbTracker(0, Offset.at(U, 50)).rollback_point(49) == 0
    assert list(VbTracker(0, Offset(U, 7, 0, 9)).boundaries) == [0]


def test_committed_snapshot_start_minus_one_is_always_consistent():
    """What a restart infers must hold for the offsets the tracker hands out."""
    tr = VbTracker(0)
    tr.opened([(U, 0)])
    tr.snapshot(0, 20)  # a disk snapshot from 0
    tr.item(20)
    tr.snapshot(21, 30)  # contiguous: 20 is the point it followed
    tr.item(30)
    assert tr.committed == Offset(U, 30, 21, 30)
    tr.opened([(U, 0)])
    tr.snapshot(30, 40)  # overlaps the requested start (dcpflow's first marker): 29 is not proven
    tr.item(40)
    assert tr.committed == Offset(U, 40, 31, 40)
    tr.snapshot(45, 50)  # a gap on the same stream: nothing of ours in 41..44
    tr.item(47)
    assert tr.position == Offset(U, 47, 45, 50) and tr.rollback_point(44) == 44
    tr.opened([(U, 0)])  # reopened from inside 45..50: the new marker may start where we resumed
    tr.snapshot(47, 55)
    tr.item(55)
    assert tr.committed == Offset(U, 55, 45, 55)  # 44, not 46
    for c in (Offset(U, 30, 21, 30), Offset(U, 40, 31, 40), Offset(U, 55, 45, 55)):
        restarted = VbTracker(0, c)
        assert restarted.rollback_point(c.snapshot_start - 1) == tr.rollback_point(c.snapshot_start - 1)


def test_rollback_offset_carries_the_snapshot_info_at_the_rollback_point():
    """rollback.md (consumer): resend with the snapshot info at the rollback point; its start - 1 is
    the boundary before it, so a restart from this offset still knows that boundary."""
    tr = VbTracker(0)
    tr.opened([(U, 0)])
    for start, end in ((0, 10), (11, 20), (21, 30)):
        tr.snapshot(start, end)
        tr.item(end)
    log = [(0xB, 25), (U, 0)]
    assert tr.rollback_offset(log, 25) == Offset(U, 20, 11, 20)
    assert tr.rollback_offset(log, 15) == Offset(U, 10, 0, 10)
    assert tr.rollback_offset(log, 5) == BEGINNING
    assert VbTracker(0, Offset(U, 20, 11, 20)).rollback_point(15) == 10


@pytest.mark.parametrize("log, seqno, expect", [
    ([(0xB, 95), (0xA, 0)], 95, Offset.at(0xB, 95)),
    ([(0xB, 95), (0xA, 0)], 90, Offset.at(0xA, 90)),
    ([(0xB, 95), (0xA, 0)], 0, BEGINNING),
    ([(0xB, 95)], 10, BEGINNING),  # no entry covers the rollback point: no common history
    ([], 10, BEGINNING),
])
def test_rollback_offset(log, seqno, expect):
    assert rollback_offset(log, seqno) == expect


def test_range_end():
    tr = VbTracker(0)
    tr.opened([(U, 0)])
    tr.snapshot(0, 10)
    tr.item(10)
    assert tr.range_end(10) == Offset(U, 10, 0, 10)  # the end closed the snapshot
    assert tr.range_end(7) == Offset(U, 7, 0, 10)  # inside it: keep the range for the rollback check
    tr.snapshot(20, 30)  # 11..19 were not ours
    tr.item(30)
    assert tr.range_end(15) == Offset.at(U, 15)
    assert tr.range_end(40) == Offset(U, 30, 20, 30)  # not reached: where we are
    assert tr.range_end(10) == Offset(U, 10, 0, 10)  # on the boundary 10: 9 is not claimed


def test_range_end_of_a_start_at_or_past_the_end_is_the_start():
    start = Offset(U, 30, 21, 30)
    tr = VbTracker(0, start)
    tr.opened([(U, 0)])
    tr.stream_end_ok()
    assert tr.range_end(25) == start
    tr.rolled_back(Offset(U, 28, 21, 28))
    assert tr.range_end(25) == Offset(U, 28, 21, 28)


@st.composite
def streams(draw):
    """A valid single-vbucket DCP sequence: snapshots with rising seqnos, items a rising subset of
    each snapshot (de-duplication and filtering can hide any of them), sometimes a SEQNO_ADVANCED
    to the snapshot end, and an optional STREAM_END OK."""
    seqno = draw(st.integers(0, 5))
    start = Offset.at(U, seqno)
    ops = []
    for _ in range(draw(st.integers(1, 8))):
        first = seqno + draw(st.integers(1, 3))
        end = first + draw(st.integers(0, 6))
        marker_start = seqno if draw(st.booleans()) else first  # disk: requested start; memory: first item
        ops.append(("snapshot", marker_start, end))
        items = sorted(draw(st.sets(st.integers(first, end), max_size=end - first + 1)))
        ops.extend(("item", s) for s in items)
        if draw(st.booleans()) and (not items or items[-1] < end):
            ops.append(("advanced", end))
        seqno = end
    if draw(st.booleans()):
        ops.append(("end",))
    return start, ops


@given(streams(), st.data())
def test_tracker_invariants(stream, data):
    start, ops = stream
    tr = VbTracker(0, start)
    tr.opened([(U, 0)])
    completed = start.seqno  # the end of the last snapshot known to be complete
    snap = None
    for op in ops:
        before = tr.committed
        if op[0] == "snapshot":
            if snap is not None:
                completed = snap[1]
            snap = op[1:]
            tr.snapshot(*snap)
        elif op[0] == "item":
            tr.item(op[1])
            if op[1] == snap[1]:
                completed, snap = snap[1], None
        elif op[0] == "advanced":
            tr.seqno_advanced(op[1])
            completed, snap = snap[1], None
        else:
            tr.stream_end_ok()
            if snap is not None:
                completed, snap = snap[1], None
        c, p = tr.committed, tr.position
        assert c.snapshot_start <= c.seqno <= c.snapshot_end and p.snapshot_start <= p.seqno <= p.snapshot_end
        assert c.seqno >= before.seqno, "the committed offset never moves back"
        assert c.seqno == completed, "committed exactly at the last complete snapshot"
        assert c == start or c.seqno == c.snapshot_end, "a committed offset is a snapshot boundary"
        assert p.seqno >= c.seqno


# -- the one JSON form ------------------------------------------------------------------------------

u64 = st.integers(0, U64_MAX)


@st.composite
def offsets(draw):
    a, b, c = sorted(draw(st.lists(st.one_of(u64, st.integers(0, 50)), min_size=3, max_size=3)))
    seqno = draw(st.sampled_from((a, b, c)))  # often at one end of its snapshot, as real offsets are
    start, end = (a, c) if draw(st.booleans()) else (seqno, seqno)
    return Offset(draw(u64), seqno, min(start, seqno), max(end, seqno), draw(st.one_of(st.none(), u64)))


@given(offsets())
def test_offset_json_round_trips_in_the_compact_form(o):
    doc = o.to_json()
    assert Offset.from_json(json.loads(json.dumps(doc))) == o
    assert doc[:2] == [o.vbuuid, o.seqno] and all(type(v) is int for v in doc)
    if o.manifest_uid is not None:
        assert doc == list(o)  # the manifest uid is fifth, after the whole snapshot
    elif o.snapshot_start == o.seqno == o.snapshot_end:
        assert len(doc) == 2  # the snapshot goes unsaid when it is just the seqno
    else:
        assert doc == list(o[:4])
    # the object form (earlier files, hand-written offsets) means the same and is never shorter
    obj = {k: v for k, v in o._asdict().items() if v is not None}
    assert Offset.from_json(json.loads(json.dumps(obj))) == o
    assert len(json.dumps(doc)) < len(json.dumps(obj))


@given(offsets(), st.sampled_from(("seqno", "snapshot_start", "snapshot_end", "vbuuid", "manifest_uid")),
       st.one_of(st.integers(-(1 << 70), -1), st.integers(U64_MAX + 1, 1 << 70), st.booleans(), st.floats(),
                 st.text(max_size=3)))
def test_offset_json_refuses_what_is_not_an_offset(o, field, bad):
    doc = {k: v for k, v in o._asdict().items() if v is not None} | {field: bad}
    compact = [*o[:4], 0 if o.manifest_uid is None else o.manifest_uid]
    compact[o._fields.index(field)] = bad
    for form in (doc, compact):
        with pytest.raises(OffsetError, match=f"vbucket 9: {field} must be an unsigned 64-bit integer"):
            Offset.from_json(form, "vbucket 9")


@given(offsets().filter(lambda o: o.snapshot_start < o.snapshot_end < U64_MAX))
def test_offset_json_keeps_the_snapshot_rule(o):
    vbuuid, seqno, start, end, _ = o
    for broken in ([vbuuid, start - 1, start, end] if start else None, [vbuuid, end + 1, start, end],
                   {"vbuuid": vbuuid, "seqno": seqno, "snapshot_start": end + 1}):
        if broken is not None:
            with pytest.raises(OffsetError, match=r"snapshot_start <= seqno <= snapshot_end does not hold"):
                Offset.from_json(broken)


@given(st.dictionaries(st.integers(0, 1023), offsets(), max_size=40))
def test_vbucket_maps_round_trip_in_vbucket_order(m):
    doc = offsets_to_json(m)
    assert list(doc) == [str(vb) for vb in sorted(m)] and all(doc[str(vb)] == o.to_json() for vb, o in m.items())
    assert offsets_from_json(json.loads(json.dumps(doc))) == m


def test_the_tracker_carries_the_manifest_uid_of_its_start():
    tr = VbTracker(0, Offset(U, 10, 10, 10, manifest_uid=7))
    tr.opened([(U, 0)])
    tr.snapshot(11, 14)
    tr.item(12)
    assert tr.position == Offset(U, 12, 11, 14, 7)
    tr.item(14)
    assert tr.committed == Offset(U, 14, 11, 14, 7) and tr.range_end(13) == Offset(U, 13, 11, 14, 7)
    tr.rolled_back(tr.rollback_offset([(U, 0)], 12))  # the manifest at the rollback point is not known
    assert tr.committed == Offset(U, 10, 0, 10) and tr.committed.manifest_uid is None


@settings(max_examples=200, deadline=None)
@given(histories())
def test_rollback_offset_resumes_where_the_producer_agrees(history):
    """After ROLLBACK(R) from the shared rule, the client's resume offset names the branch the
    producer's log holds R on, and the producer accepts it."""
    p, consumers = history
    for c in consumers:
        d = divergence(p.log, c.vbuuid, c.seqno, c.snapshot_start, c.snapshot_end, p.high)
        if d is None:
            continue
        o = rollback_offset(p.log, d.seqno)
        assert o.seqno == d.seqno and o.is_boundary
        assert divergence(p.log, o.vbuuid, o.seqno, o.snapshot_start, o.snapshot_end, p.high) is None
