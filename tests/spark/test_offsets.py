"""Offsets JSON and the driver's planning: admission control, rollback detection, grouping (no Spark)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.client import Offset
from dcpflow.client.offsets import OffsetError
from dcpflow.protocol.failover import divergence
from dcpflow.spark import offsets as off
from dcpflow.spark.offsets import EARLIEST, SourceOffset
from tests.protocol.failover_model import histories

pending_maps = st.dictionaries(st.integers(0, 63), st.integers(0, 500), min_size=1, max_size=40)


@settings(deadline=None)
@given(pending_maps, st.one_of(st.none(), st.integers(1, 3000)), st.integers(0, 100))
def test_fair_share_is_bounded_and_max_min_fair(pending, budget, rotate):
    share = off.fair_share(pending, budget, rotate=rotate)
    assert set(share) == set(pending)
    assert all(0 <= share[v] <= pending[v] for v in pending)
    total = sum(pending.values())
    assert sum(share.values()) == (total if budget is None else min(budget, total))
    # Nobody cut short holds less than anyone else minus one: the budget is spread, not queued.
    for a in pending:
        if share[a] < pending[a]:
            assert all(share[b] <= share[a] + 1 for b in pending)


def test_fair_share_rotates_so_nobody_starves():
    pending = dict.fromkeys(range(10), 5)
    moved = set()
    for batch in range(10):
        share = off.fair_share(pending, 3, rotate=batch)
        assert sum(share.values()) == 3
        moved |= {v for v, n in share.items() if n}
    assert moved == set(range(10))


def test_fair_share_serves_rollback_rereads_first():
    share = off.fair_share(dict.fromkeys(range(8), 10), 3, first=[6, 7])
    assert share[6] == 1 and share[7] == 1


def state(seqnos, uuid=100):
    return SourceOffset({vb: Offset.at(uuid if s else 0, s) for vb, s in seqnos.items()}, batch=4)


def logs(vbs, uuid=100):
    return {vb: [(uuid, 0)] for vb in vbs}


def test_plan_reads_everything_without_a_limit_and_numbers_the_batch():
    start = state({0: 0, 1: 5, 2: 9})
    end = off.plan(start, {0: 3, 1: 8, 2: 9}, logs(range(3)))
    assert end.batch == 5 and not end.resets
    assert {vb: o.seqno for vb, o in end.vbuckets.items()} == {0: 3, 1: 8, 2: 9}
    assert end.vbuckets[0].vbuuid == 100  # a first read takes the current history's uuid
    assert [(r.vbucket, r.start.seqno, r.end_seqno) for r in off.ranges(start, end)] == [(0, 0, 3), (1, 5, 8)]


def test_plan_returns_start_when_nothing_is_new():
    start = state({0: 3, 1: 0})
    assert off.plan(start, {0: 3, 1: 0}, logs(range(2))) is start


@settings(deadline=None)
@given(st.dictionaries(st.integers(0, 15), st.tuples(st.integers(0, 100), st.integers(0, 100)), min_size=1),
       st.integers(1, 200))
def test_plan_respects_the_budget(vbs, budget):
    start = state({vb: min(a, b) for vb, (a, b) in vbs.items()})
    high = {vb: max(a, b) for vb, (a, b) in vbs.items()}
    end = off.plan(start, high, logs(vbs), budget)
    advance = sum(end.vbuckets[vb].seqno - start.vbuckets[vb].seqno for vb in vbs)
    assert advance == min(budget, sum(high[vb] - start.vbuckets[vb].seqno for vb in vbs))
    assert all(start.vbuckets[vb].seqno <= end.vbuckets[vb].seqno <= high[vb] for vb in vbs)


def test_plan_rereads_a_vbucket_whose_history_changed():
    start = state({0: 10, 1: 10, 2: 10})
    failover = {0: [(100, 0)], 1: [(555, 8), (100, 0)], 2: [(100, 0)]}
    end = off.plan(start, {0: 12, 1: 9, 2: 7}, failover)
    # vb 1: a new failover entry; vb 2: the high seqno went below what we read (history lost).
    assert end.resets == {1, 2}
    assert end.vbuckets[1] == Offset.at(555, 9) and end.vbuckets[2] == Offset.at(100, 7)
    work = {r.vbucket: r for r in off.ranges(start, end)}
    assert work[1].reset and work[1].start == EARLIEST and work[1].end_seqno == 9
    assert not work[0].reset and work[0].start.seqno == 10
    # As the next batch's start, resets mean nothing: vb 1 continues normally from 9.
    nxt = off.plan(end, {0: 12, 1: 11, 2: 7}, failover)
    assert not nxt.resets and [(r.vbucket, r.start.seqno) for r in off.ranges(end, nxt)] == [(1, 9)]


def test_plan_rollback_of_an_emptied_vbucket_still_sends_the_marker():
    start = state({0: 4})
    end = off.plan(start, {0: 0}, {0: [(7, 0)]})
    assert end.resets == {0} and end.vbuckets[0] == Offset.at(7, 0)
    assert [r.reset for r in off.ranges(start, end)] == [True]


def test_plan_fail_policy_raises_naming_the_vbucket():
    with pytest.raises(off.HistoryDiverged, match="vbucket 3"):
        off.plan(state({3: 5}), {3: 5}, {3: [(9, 2), (100, 0)]}, policy="fail")


def test_offsets_json_round_trip_and_errors():
    o = SourceOffset({0: Offset(1, 5, 4, 9), 7: Offset.at(2, 0)}, batch=12, resets=frozenset({7}))
    doc = json.loads(json.dumps(o.to_json()))
    # compact: the snapshot only when the offset is inside one
    assert doc["vbuckets"] == {"0": [1, 5, 4, 9], "7": [2, 0]}
    assert SourceOffset.from_json(doc) == o
    first = SourceOffset({3: Offset.at(1, 2)}, batch=1, origin={3: Offset.at(1, 0)})
    assert SourceOffset.from_json(json.dumps(first.to_json())) == first
    start = SourceOffset({3: Offset.at(1, 0)}, initial=True)
    assert SourceOffset.from_json(start.to_json()) == start
    with pytest.raises(off.OffsetError, match="origin vbucket 3: missing 'seqno'"):
        SourceOffset.from_json({"vbuckets": {}, "origin": {"3": {"vbuuid": 1}}})
    with pytest.raises(off.OffsetError, match="no 'vbuckets'"):
        SourceOffset.from_json({"0": 1})
    with pytest.raises(off.OffsetError, match="unknown field"):
        Offset.from_json({"vbuuid": 1, "seqno": 2, "extra": 3}, "vbucket 0")


def test_the_first_batch_reads_from_the_start_it_was_planned_from():
    """Spark re-asks initialOffset() to (re)run the first batch; after a driver restart with
    startingOffsets=latest that is a newer point. The end offset keeps the planned start."""
    initial = SourceOffset({0: Offset.at(100, 5), 1: Offset.at(100, 7)}, initial=True)
    end = off.plan(initial, {0: 9, 1: 7}, logs(range(2)))
    assert end.origin == initial.vbuckets and not end.initial
    planned = [(r.vbucket, r.start.seqno, r.end_seqno) for r in off.ranges(initial, end)]
    assert planned == [(0, 5, 9)]
    end = SourceOffset.from_json(json.loads(json.dumps(end.to_json())))  # through the offset log
    moved = SourceOffset({0: Offset.at(100, 12), 1: Offset.at(100, 8)}, initial=True)  # a new reader's
    assert [(r.vbucket, r.start.seqno, r.end_seqno) for r in off.ranges(moved, end)] == planned
    # Later batches start from a logged end offset: no origin, the start is the start.
    nxt = off.plan(end, {0: 11, 1: 7}, logs(range(2)))
    assert nxt.origin is None and "origin" not in nxt.to_json()
    assert [(r.vbucket, r.start.seqno, r.end_seqno) for r in off.ranges(end, nxt)] == [(0, 9, 11)]
    # Nothing to read yet: Spark keeps holding the initial offset itself.
    assert off.plan(initial, {0: 5, 1: 7}, logs(range(2))) is initial


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=0, max_size=80), st.integers(1, 8))
def test_group_partitions_all_work_into_balanced_groups(weights, n):
    work = [off.VbRange(vb, Offset.at(1, 0), w, 1) for vb, w in enumerate(weights)]
    groups = off.group(work, n)
    assert len(groups) == min(n, len(work))
    assert sorted(r.vbucket for g in groups for r in g) == list(range(len(work)))
    assert groups == off.group(list(reversed(work)), n)  # deterministic: replays plan the same tasks
    if groups:
        loads = [sum(max(r.weight, 1) for r in g) for g in groups]
        assert max(loads) - min(loads) <= max(max(w, 1) for w in weights)


def test_resolve_words_and_json():
    high, uuids = {0: 5, 1: 6}, {0: 10, 1: 11}
    assert off.resolve("earliest", [0, 1], high, uuids) == {0: EARLIEST, 1: EARLIEST}
    assert off.resolve("latest", [0, 1], high, uuids) == {0: Offset.at(10, 5), 1: Offset.at(11, 6)}
    spec = off.OffsetSpec({1: Offset.at(11, 2)})
    assert off.resolve(spec, [0, 1], high, uuids) == {0: EARLIEST, 1: Offset.at(11, 2)}


def test_vbucket_offsets_in_every_form_and_their_errors():
    """[vbuuid, seqno], [vbuuid, seqno, snapshot_start, snapshot_end] and the object form (what
    earlier checkpoints hold, and what users write in startingOffsets) mean the same."""
    big = (1 << 64) - 1
    assert Offset.from_json([big, 5], "vb 0") == Offset(big, 5, 5, 5)
    assert Offset.from_json([1, 5, 4, 9], "vb 0") == Offset(1, 5, 4, 9)
    assert Offset.from_json({"vbuuid": 1, "seqno": 5, "snapshot_start": 4, "snapshot_end": 9}, "vb 0") == \
        Offset(1, 5, 4, 9)
    assert Offset.from_json({"vbuuid": 1, "seqno": 5}, "vb 0") == Offset(1, 5, 5, 5)
    for o in (Offset(1, 5, 4, 9), Offset(1, 5, 5, 9), Offset(1, 5, 4, 5), Offset.at(3, 0)):
        assert Offset.from_json(json.loads(json.dumps(o.to_json())), "vb 0") == o
    for bad, message in (([1, 2, 3], r"expected \[vbuuid, seqno\]"), ([], "expected"), ("7", "expected"),
                         ([True, 5], "vbuuid must be an unsigned 64-bit integer"),
                         ([1, -5], "seqno must be an unsigned 64-bit integer"),
                         ([1, 1 << 64], "seqno must be"), ([1, 5.0], "seqno must be"),
                         ([1, 5, 6, 9], "snapshot_start <= seqno <= snapshot_end"),
                         ([1, 5, 1, 4], "snapshot_start <= seqno <= snapshot_end")):
        with pytest.raises(off.OffsetError, match=message):
            Offset.from_json(bad, "vbucket 4")


def test_an_offset_of_1024_vbuckets_stays_small():
    """Spark logs every end offset and reparses three per progress report: the compact form
    keeps the first batch's end offset of a whole bucket at ~32 bytes per vbucket (the object
    form, with an origin of 1024 earliest offsets, took ~170)."""
    uuid = 251679046518038
    end = SourceOffset({vb: Offset.at(uuid + vb, 900 + vb) for vb in range(1024)}, batch=1,
                       origin={vb: off.EARLIEST for vb in range(1024)})
    doc = end.to_json()
    assert doc["origin"] == {}  # reading from seqno 0 goes unsaid
    text = json.dumps(doc)
    assert len(text) < 34 * 1024
    assert SourceOffset.from_json(text) == end
    mixed = SourceOffset({1: Offset.at(5, 9), 2: Offset.at(5, 7)}, batch=1,
                         origin={1: off.EARLIEST, 2: Offset(5, 3, 1, 4)})
    assert mixed.to_json()["origin"] == {"2": [5, 3, 1, 4]}
    assert SourceOffset.from_json(json.dumps(mixed.to_json())) == mixed
    assert [r.start for r in off.ranges(SourceOffset(dict(mixed.vbuckets)), SourceOffset.from_json(mixed.to_json()))] \
        == [off.EARLIEST, Offset(5, 3, 1, 4)]


def test_ranges_survive_pickling_as_spark_ships_them():
    import pickle

    work = [off.VbRange(3, Offset(7, 5, 4, 9), 20, 8), off.VbRange(4, EARLIEST, 6, 8, reset=True)]
    assert pickle.loads(pickle.dumps(work)) == work


def test_lag_reads_progress_offsets_in_either_form():
    """The demo's and `dcpflow pipeline`'s lag: seqnos the server has beyond the batch's end, from
    a query's progress (compact offsets now, object offsets in progress from earlier versions)."""
    from dcpflow.spark.pipeline import lag_of

    end = SourceOffset({0: Offset.at(1, 10), 1: Offset(1, 4, 3, 6)}, batch=2).to_json()
    latest = SourceOffset({0: Offset.at(1, 15), 1: Offset.at(1, 4), 2: Offset.at(1, 3)}).to_json()
    assert lag_of({"sources": [{"endOffset": json.dumps(end), "latestOffset": json.dumps(latest)}]}) == 5 + 0 + 3
    old = {"vbuckets": {"0": {"vbuuid": 1, "seqno": 10}}}
    assert lag_of({"sources": [{"endOffset": old, "latestOffset": latest}]}) == 5 + 4 + 3
    assert lag_of({"sources": [{"endOffset": None, "latestOffset": latest}]}) is None
    assert lag_of({"sources": [{"endOffset": {"vbuckets": {"0": [1]}}, "latestOffset": latest}]}) is None


# -- one offset model, one divergence rule ------------------------------------------------------------

vb_offsets = st.builds(lambda v, a, b, c, uid: Offset(v, sorted((a, b, c))[1], min(a, b, c), max(a, b, c), uid),
                       st.integers(0, (1 << 64) - 1), st.integers(0, 1000), st.integers(0, 1000),
                       st.integers(0, 1000), st.one_of(st.none(), st.integers(0, 1 << 32)))
at_offsets = st.builds(Offset.at, st.integers(0, (1 << 64) - 1), st.integers(0, 1000))


@st.composite
def source_offsets(draw):
    vbuckets = draw(st.dictionaries(st.integers(0, 1023), st.one_of(at_offsets, vb_offsets), max_size=30))
    origin = None
    if draw(st.booleans()):
        origin = {vb: draw(st.one_of(st.just(EARLIEST), at_offsets, vb_offsets)) for vb in vbuckets}
    resets = frozenset(draw(st.sets(st.sampled_from(sorted(vbuckets))))) if vbuckets else frozenset()
    return SourceOffset(vbuckets, draw(st.integers(0, 10**6)), resets, draw(st.booleans()), origin)


@given(source_offsets())
def test_source_offsets_round_trip_in_the_clients_compact_form(o):
    doc = json.loads(json.dumps(o.to_json()))
    assert SourceOffset.from_json(doc) == o
    # each vbucket's offset is the client's JSON form; the origin leaves out what starts from 0
    assert doc["vbuckets"] == {str(vb): off_.to_json() for vb, off_ in sorted(o.vbuckets.items())}
    if o.origin is not None:
        assert doc["origin"] == {str(vb): s.to_json() for vb, s in sorted(o.origin.items()) if s != EARLIEST}
    # read back, each vbucket's offset is the client's own Offset (the source has no type of its own)
    assert all(v.__class__ is Offset for v in SourceOffset.from_json(doc).vbuckets.values())


def test_a_manifest_uid_rides_along_offsets_and_ranges():
    import pickle

    start = SourceOffset({0: Offset(5, 10, 10, 10, manifest_uid=3)}, batch=2)
    assert start.to_json()["vbuckets"] == {"0": [5, 10, 10, 10, 3]}
    assert SourceOffset.from_json(json.dumps(start.to_json())) == start
    end = off.plan(start, {0: 15}, {0: [(5, 0)]})
    assert end.vbuckets[0] == Offset(5, 15, 15, 15, 3)
    work = off.ranges(start, end)
    assert pickle.loads(pickle.dumps(work)) == work and work[0].start.manifest_uid == 3


@settings(max_examples=300, deadline=None)
@given(histories())
def test_the_driver_rereads_whenever_the_server_would_roll_back(history):
    """Spark's offsets do not say which snapshot a read stopped in, so its check is conservative:
    whatever snapshot the consumer really read (the model knows), a rollback the server would ask
    for is a re-read the driver plans - and on the newest branch it re-reads nothing it need not."""
    p, consumers = history
    for c in consumers:
        spark = off.diverged(Offset.at(c.vbuuid, c.seqno), p.log, p.high)
        server = divergence(p.log, c.vbuuid, c.seqno, c.snapshot_start, c.snapshot_end, p.high)
        if server is not None and c.seqno > 0:
            assert spark
        if not spark and c.seqno > 0:
            assert c.common(p) >= c.snapshot_end  # safe for any snapshot the read may have stopped in
        if p.log[0][0] == c.vbuuid:
            assert spark == (c.common(p) < c.seqno)


def test_a_name_made_again_under_a_new_id_is_followed_and_the_old_id_dropped():
    """The `collections` option's names, resolved by the driver at every plan: a name whose id
    changed since the start offset (dropped and made again) adds the new id to what the ranges
    read and drops the old one (a `drop` row per vbucket); the ranges read the ids the start knew
    too (a dropped one's last documents). The change makes a batch even when no seqno moved."""
    first = off.plan(SourceOffset({0: EARLIEST, 1: EARLIEST}, initial=True), {0: 4, 1: 2}, logs(range(2)),
                     collections={"shop.orders": 8, "shop.users": 9})
    assert first.collections == {"shop.orders": 8, "shop.users": 9} and not first.added and not first.dropped
    assert {r.cids for r in off.ranges(SourceOffset({0: EARLIEST, 1: EARLIEST}, initial=True), first)} == {(8, 9)}
    same = off.plan(first, {0: 4, 1: 2}, logs(range(2)), collections={"shop.orders": 8, "shop.users": 9})
    assert same is first  # nothing new
    again = off.plan(first, {0: 4, 1: 2}, logs(range(2)), collections={"shop.orders": 10, "shop.users": 9})
    assert again.batch == first.batch + 1 and again.added == {10} and again.dropped == {8: "shop.orders"}
    assert again.collections == {"shop.orders": 10, "shop.users": 9}
    work = off.ranges(first, again)
    assert [(r.vbucket, r.start.seqno, r.end_seqno, r.cids, r.dropped) for r in work] == [
        (0, 4, 4, (8, 9, 10), ((8, "shop.orders"),)), (1, 2, 2, (8, 9, 10), ((8, "shop.orders"),))]
    assert SourceOffset.from_json(json.dumps(again.to_json())) == again
    import pickle
    assert pickle.loads(pickle.dumps(work)) == work
    gone = off.plan(again, {0: 6, 1: 2}, logs(range(2)), collections={"shop.users": 9})  # orders dropped
    assert gone.dropped == {10: "shop.orders"} and not gone.added
    assert [(r.vbucket, r.start.seqno, r.end_seqno, r.cids) for r in off.ranges(again, gone)] == [
        (0, 4, 6, (9, 10)), (1, 2, 2, (9, 10))]
    with pytest.raises(OffsetError, match="must map names to ids"):
        SourceOffset.from_json({"vbuckets": {}, "collections": {"a.b": "8"}})
