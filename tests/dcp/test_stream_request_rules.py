"""DCP_STREAM_REQ without a socket: the rules tests/dcp/test_stream_request.py and test_rollback.py
check over a server, asserted on what `DcpProducer.stream_request` returns (a Refusal, a
Rollback, or the Started stream and its failover log) and on the bytes the stream then sends.

KV-Engine's stream-request.md, stream-request-value.md and rollback.md (as its code decides; the
rules of the decision are stated in engine/failover.py). The frame-level checks (extras, flags,
the JSON value's shape) are the protocol's and run in `sansio.request`, which encodes and decodes
each request as a socket would carry it."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.filter import COLLECTIONS_MANIFEST_IS_AHEAD
from dcpflow.dcp.outcomes import WAKE
from dcpflow.dcp.producer import Rollback, Started
from dcpflow.engine import VBucketState
from dcpflow.protocol.dcp import DcpStreamRequest, OpenFlag, SnapshotFlag, StreamEndReason, StreamFlag
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import request as raw_request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .sansio import (
    MAX,
    drain,
    ends,
    engine_fixture,
    fill,
    frame,
    items,
    make_engine,
    markers,
    producer,
    request,
    to_disk_only,
)

engine = engine_fixture(8)


def ask(p, vb: int, *args, collections: bool = False, **kw):
    return p.stream_request(request(vb, *args, **kw), collections=collections)


def status(outcome) -> int:
    if isinstance(outcome, Refusal):
        return outcome.status
    return Status.ROLLBACK if isinstance(outcome, Rollback) else Status.SUCCESS


def collections_producer(engine, **controls):
    p = producer(engine)
    for key, value in {"enable_noop": "true", **controls}.items():
        assert not isinstance(p.control(key, value, now=100.0, collections=True), Refusal)
    return p


# -- the frame (protocol checks before the state machine sees it) ----------------------------

@pytest.mark.parametrize("extras_len", [0, 47, 49])
def test_extras_must_be_48_bytes(extras_len):
    with pytest.raises(ProtocolError) as e:
        DcpStreamRequest.from_frame(frame(raw_request(Opcode.DCP_STREAM_REQ, extras=bytes(extras_len))))
    assert e.value.status == Status.EINVAL


def test_key_is_refused():
    with pytest.raises(ProtocolError) as e:
        DcpStreamRequest.from_frame(frame(raw_request(Opcode.DCP_STREAM_REQ, key=b"k", extras=bytes(48))))
    assert e.value.status == Status.EINVAL


@pytest.mark.parametrize("flags", [StreamFlag.NO_VALUE_REMOVED, 0x200, 0x8000,
                                   StreamFlag.CACHE_TRANSFER | StreamFlag.DISK_ONLY])
def test_invalid_stream_flags(flags):
    with pytest.raises(ProtocolError) as e:
        request(0, flags=flags)
    assert e.value.status == Status.EINVAL


@pytest.mark.parametrize("value", [b"[1]", b"{"])
def test_value_must_be_a_json_object(value):
    with pytest.raises(ProtocolError) as e:
        request(0, value=value)
    assert e.value.status == Status.EINVAL


# -- the answer ----------------------------------------------------------------------------------

def test_ok_carries_the_failover_log_and_the_stream_sends_the_range(engine):
    fill(engine, 3, 2)
    p = producer(engine)
    out = ask(p, 3, 0, 2)
    assert isinstance(out, Started)
    assert out.failover_log == tuple(engine.vbucket(3).failover.entries)
    msgs = drain(p)
    assert [m.by_seqno for m in items(msgs)] == [1, 2]
    assert ends(msgs) == [(3, StreamEndReason.OK)]


@pytest.mark.parametrize("start,end,snap_start,snap_end", [
    (5, 4, 5, 5),  # start > end
    (3, 10, 4, 10),  # snap_start > start
    (3, 10, 0, 2),  # start > snap_end
])
def test_erange(engine, start, end, snap_start, snap_end):
    fill(engine, 0, 5)
    out = ask(producer(engine), 0, start, end, engine.vbucket(0).uuid, snap_start, snap_end)
    assert isinstance(out, Refusal) and out.status == Status.ERANGE


def test_start_beyond_high_seqno_on_the_same_branch_rolls_back(engine):
    """Told to roll back to the high seqno, not refused (the rollback check comes before the
    start > high seqno ERANGE; failure-scenarios.md)."""
    fill(engine, 0, 2)
    assert ask(producer(engine), 0, 5, MAX, engine.vbucket(0).uuid, 5, 5) == Rollback(2)


def test_start_equal_end_ends_at_once(engine):
    fill(engine, 0, 4)
    p = producer(engine)
    assert isinstance(ask(p, 0, 2, 2, engine.vbucket(0).uuid), Started)  # erratum 17
    msgs = drain(p)
    assert len(msgs) == 1 and msgs[0].reason == StreamEndReason.OK


def test_second_stream_on_a_vbucket_is_key_eexists(engine):
    p = producer(engine)
    assert isinstance(ask(p, 1), Started)
    out = ask(p, 1)
    assert out == Refusal(Status.KEY_EEXISTS, "a stream for vbucket 1 already exists on this connection")
    assert isinstance(ask(p, 2), Started)  # another vbucket is fine
    assert isinstance(ask(producer(engine, name="other"), 1), Started)  # another connection is fine


def test_stream_after_end_may_be_requested_again(engine):
    fill(engine, 0, 1)
    p = producer(engine)
    assert isinstance(ask(p, 0, 0, 1), Started)
    assert ends(drain(p)) == [(0, StreamEndReason.OK)]
    assert isinstance(ask(p, 0, 0, 1), Started)


def test_unknown_dead_and_replica_vbuckets(engine):
    engine.delete_vbucket(5)
    engine.set_vbucket_state(6, VBucketState.DEAD)
    engine.set_vbucket_state(7, VBucketState.REPLICA)
    p = producer(engine)
    for vb in (5, 6, 9):
        assert status(ask(p, vb)) == Status.NOT_MY_VBUCKET
    assert status(ask(p, 7, flags=StreamFlag.ACTIVE_VB_ONLY)) == Status.NOT_MY_VBUCKET
    assert isinstance(ask(p, 7), Started)  # replicas are streamable


# -- the flags -------------------------------------------------------------------------------------

def test_to_latest_ends_at_the_high_seqno_of_the_request(engine):
    fill(engine, 0, 3)
    p = producer(engine)
    out = ask(p, 0, 0, MAX, flags=StreamFlag.TO_LATEST)
    assert out.stream.end_seqno == 3
    fill(engine, 0, 2, prefix="later")
    msgs = drain(p)
    assert [m.by_seqno for m in items(msgs)] == [1, 2, 3]
    assert msgs[-1].reason == StreamEndReason.OK


def test_from_latest_starts_at_the_high_seqno(engine):
    fill(engine, 0, 3)
    p = producer(engine)
    out = ask(p, 0, 0, MAX, flags=StreamFlag.FROM_LATEST)
    assert (out.stream.start_seqno, out.stream.snap_start_seqno) == (3, 3)
    fill(engine, 0, 2, prefix="later")
    msgs = drain(p)
    assert [m.by_seqno for m in items(msgs)] == [4, 5]
    assert markers(msgs)[0].start_seqno == 3


def test_from_latest_replaces_a_zero_uuid(engine):
    fill(engine, 2, 3)
    out = ask(producer(engine), 2, 0, MAX, 0, flags=StreamFlag.FROM_LATEST)
    assert isinstance(out, Started) and out.stream.start_seqno == 3


def test_disk_only_backfills_and_ends(engine):
    fill(engine, 0, 4)
    engine.flush_all()
    p = producer(engine)
    assert isinstance(ask(p, 0, 0, MAX, flags=StreamFlag.DISK_ONLY), Started)
    msgs = drain(p)
    (m,) = markers(msgs)
    assert m.flags == SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT and (m.start_seqno, m.end_seqno) == (0, 4)
    assert [i.by_seqno for i in items(msgs)] == [1, 2, 3, 4]
    assert ends(msgs) == [(0, StreamEndReason.OK)]


def test_disk_only_forces_the_end_to_the_persisted_seqno(engine):
    """DiskOnly sets the end to the persisted seqno, whatever end was asked; the range checks
    apply to that end, so only the forced end decides ERANGE."""
    fill(engine, 0, 10)
    engine.flush_all()
    fill(engine, 0, 2, prefix="unpersisted")  # 11, 12: in memory only
    uuid = engine.vbucket(0).uuid
    p = producer(engine)
    assert ask(p, 0, 0, 5, flags=StreamFlag.DISK_ONLY).stream.end_seqno == 10
    msgs = drain(p)
    assert [i.by_seqno for i in items(msgs)] == list(range(1, 11))
    assert (markers(msgs)[0].end_seqno, msgs[-1].reason) == (10, StreamEndReason.OK)
    assert isinstance(ask(p, 0, 7, 6, uuid, 7, 7, flags=StreamFlag.DISK_ONLY), Started)  # 7 <= 10
    assert [i.by_seqno for i in items(drain(p))] == [8, 9, 10]
    assert status(ask(p, 0, 11, MAX, uuid, 11, 11, flags=StreamFlag.DISK_ONLY)) == Status.ERANGE
    assert isinstance(ask(p, 0, 11, MAX, uuid, 11, 11), Started)  # without DiskOnly: fine


def test_takeover_end_is_infinite(engine):
    out = ask(producer(engine), 4, 0, 0, flags=StreamFlag.TAKEOVER)
    assert out.stream.end_seqno == MAX and out.stream.takeover


def test_other_flags_combine_and_cache_transfer_is_ignored(engine):
    fill(engine, 0, 2)
    p = producer(engine)
    flags = StreamFlag.ACTIVE_VB_ONLY | StreamFlag.STRICT_VBUUID | StreamFlag.IGNORE_PURGED_TOMBSTONES
    assert isinstance(ask(p, 0, 0, 2, engine.vbucket(0).uuid, flags=flags), Started)
    assert len(items(drain(p))) == 2
    assert isinstance(ask(p, 0, 0, 2, flags=StreamFlag.CACHE_TRANSFER), Started)
    assert len(items(drain(p))) == 2


# -- the JSON value (stream-request-value.md) --------------------------------------------------

def value(**doc) -> bytes:
    return json.dumps(doc).encode()


def test_value_needs_collections(engine):
    assert ask(producer(engine), 0, value=value(uid="0")) == Refusal(
        Status.EINVAL, "a stream-request value needs HELLO Collections")


def test_noop_is_mandatory_for_collections_and_xattrs(engine):
    reason = "enable_noop is mandatory for streams with xattrs or collections"
    assert ask(producer(engine), 0, collections=True) == Refusal(Status.NOT_SUPPORTED, reason)
    p = producer(engine, OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS)
    assert ask(p, 0) == Refusal(Status.NOT_SUPPORTED, reason)
    p.control("enable_noop", "true", now=100.0, collections=False)
    assert isinstance(ask(p, 0), Started)


@pytest.mark.parametrize("doc,want", [
    ({"uid": 5}, Status.EINVAL),
    ({"uid": "0"}, Status.SUCCESS),
    ({"uid": "ff"}, COLLECTIONS_MANIFEST_IS_AHEAD),  # a manifest this vbucket has not applied
    ({"collections": "0"}, Status.EINVAL),
    ({"collections": ["0"]}, Status.SUCCESS),
    ({"collections": ["8"]}, Status.UNKNOWN_COLLECTION),
    ({"collections": ["zz"]}, Status.EINVAL),
    ({"scope": 0}, Status.EINVAL),
    ({"scope": "0"}, Status.SUCCESS),
    ({"scope": "9"}, Status.UNKNOWN_SCOPE),
    ({"collections": ["0"], "scope": "0"}, Status.EINVAL),
    ({"purge_seqno": 10}, Status.EINVAL),
    ({"purge_seqno": "ten"}, Status.EINVAL),
    ({"purge_seqno": "0"}, Status.SUCCESS),
    ({"cts": 1}, Status.EINVAL),
    ({"cts": {"free_memory": -1}}, Status.EINVAL),
    ({"cts": {"all_keys": "yes"}}, Status.EINVAL),
    ({"cts": {"free_memory": 100, "all_keys": True}}, Status.SUCCESS),
    ({"unknown_key": 1}, Status.SUCCESS),  # unknown keys are not an error
    ({"sid": 3}, Status.DCP_STREAM_ID_INVALID),  # stream-ids not enabled
])
def test_value_validation(engine, doc, want):
    p = collections_producer(engine)
    try:
        got = status(ask(p, 0, value=value(**doc), collections=True))
    except ProtocolError as e:  # the frame's own checks
        got = e.status
    assert got == want


def test_collection_stream_keys_are_prefixed(engine):
    keys = fill(engine, 0, 2)
    p = collections_producer(engine)
    assert isinstance(ask(p, 0, 0, 2, value=value(collections=["0"]), collections=True), Started)
    assert [m.key for m in items(drain(p))] == [b"\x00" + k for k in keys]  # LEB128 collection id 0


# -- stream-ids ------------------------------------------------------------------------------

def test_stream_ids(engine):
    fill(engine, 0, 3)
    p = collections_producer(engine, enable_stream_id="true")
    assert ask(p, 0, 0, 3, collections=True) == Refusal(
        Status.DCP_STREAM_ID_INVALID, "enable_stream_id is on: the value must carry 'sid'")
    with pytest.raises(ProtocolError) as e:
        ask(p, 0, value=value(sid=0), collections=True)
    assert e.value.status == Status.DCP_STREAM_ID_INVALID
    assert isinstance(ask(p, 0, 0, MAX, value=value(sid=7), collections=True), Started)
    assert isinstance(ask(p, 0, 0, 2, value=value(sid=8), collections=True), Started)  # same vbucket, new sid
    assert ask(p, 0, 0, 3, value=value(sid=7), collections=True) == Refusal(
        Status.KEY_EEXISTS, "a stream for vbucket 0 already exists on this connection with sid 7")
    msgs = drain(p)
    assert all(m.stream_id in (7, 8) for m in msgs)  # every stream message carries its sid
    assert [m.by_seqno for m in items(msgs) if m.stream_id == 7] == [1, 2, 3]
    assert [m.by_seqno for m in items(msgs) if m.stream_id == 8] == [1, 2]
    assert [m.stream_id for m in msgs if m.opcode == Opcode.DCP_STREAM_END] == [8]


def test_close_stream_with_stream_ids(engine):
    p = collections_producer(engine, enable_stream_id="true")
    assert isinstance(ask(p, 0, value=value(sid=4), collections=True), Started)
    assert p.close_stream(0, None) == Refusal(
        Status.DCP_STREAM_ID_INVALID, "enable_stream_id is on: CLOSE_STREAM must carry a stream-id frame")
    assert p.close_stream(0, 5) == Refusal(Status.KEY_ENOENT, "no stream for vbucket 0 with sid 5 on this connection")
    assert p.close_stream(0, 4) == (WAKE,)


def test_close_stream_sid_without_stream_ids(engine):
    p = producer(engine)
    assert isinstance(ask(p, 0), Started)
    assert status(p.close_stream(0, 4)) == Status.DCP_STREAM_ID_INVALID
    assert status(p.close_stream(1, None)) == Status.KEY_ENOENT
    assert p.close_stream(0, None) == (WAKE,)
    assert status(p.close_stream(0, None)) == Status.KEY_ENOENT


# -- the rollback decision over the server's own failover logs (test_rollback.py) ------------

def test_state_change_creates_a_branch(engine):
    fill(engine, 1, 4)
    old = engine.vbucket(1).uuid
    engine.set_vbucket_state(1, VBucketState.REPLICA)
    engine.set_vbucket_state(1, VBucketState.ACTIVE)
    fill(engine, 1, 2, prefix="new")
    log = engine.vbucket(1).failover.entries
    assert log[0].seqno == 4 and log[1].uuid == old
    p = producer(engine)
    assert isinstance(ask(p, 1, 4, 6, old, 4, 4), Started)  # the old branch up to 4 continues
    assert [m.by_seqno for m in items(drain(p))] == [5, 6]
    assert ask(p, 1, 4, MAX, old, 3, 5) == Rollback(3)  # 4c: a snapshot [3, 5] across the branch point


def test_branch_rules_after_a_failover(engine):
    """The cases of test_rollback.py's unclean restart, on a branch made by `failover`."""
    fill(engine, 0, 5)
    uuid1 = engine.vbucket(0).uuid
    engine.flush_all()
    engine.failover(0)  # a new branch at 5
    fill(engine, 0, 2, prefix="new")
    uuid2 = engine.vbucket(0).uuid
    p = producer(engine)
    assert ask(p, 0, 8, MAX, uuid1, 6, 8) == Rollback(5)  # 4b: a whole snapshot past the branch point
    assert ask(p, 0, 7, MAX, uuid1, 3, 8) == Rollback(3)  # 4c: mid-snapshot: the snapshot start
    out = ask(p, 0, 5, MAX, uuid1, 5, 9)  # 4a: start == snap_start counts as snap_end = start
    assert isinstance(out, Started) and out.failover_log == tuple(engine.vbucket(0).failover.entries)
    assert p.close_stream(0, None) == (WAKE,)
    assert ask(p, 0, 4, MAX, 0xBAD, 4, 4) == Rollback(0)  # 3: a uuid the log never had
    assert isinstance(ask(p, 0, 5, MAX, uuid2, 5, 5), Started)


def test_start_zero_branches(engine):
    fill(engine, 2, 3)
    uuid = engine.vbucket(2).uuid
    p = producer(engine)
    assert isinstance(ask(p, 2, 0, 3, 0xBAD), Started)  # 1: no history check at 0 ...
    drain(p)
    assert ask(p, 2, 0, 3, 0xBAD, flags=StreamFlag.STRICT_VBUUID) == Rollback(0)  # ... unless StrictVbUuid
    for u in (0, uuid):
        assert isinstance(ask(p, 2, 0, 3, u, flags=StreamFlag.STRICT_VBUUID), Started)
        drain(p)
    assert ask(p, 2, 1, 3, 0, 1, 1) == Rollback(0)  # a non-zero start with uuid 0: unknown branch


def purged(engine, vb: int = 0) -> int:
    """Deletions at 7..9 purged by compaction: the vbucket's purge seqno."""
    keys = fill(engine, vb, 6)
    for k in keys[:3]:
        engine.vbucket(vb).delete(k)
    fill(engine, vb, 1, prefix="after")  # 10
    to_disk_only(engine, vb)
    engine.compact(vb, now=2**32)
    return engine.vbucket(vb).purge_seqno


def test_purge_seqno_branches(engine):
    assert purged(engine) == 9
    uuid = engine.vbucket(0).uuid
    p = collections_producer(engine)
    assert ask(p, 0, 5, MAX, uuid, 5, 5, collections=True) == Rollback(0)
    assert ask(p, 0, 5, MAX, uuid, 5, 5, value=value(purge_seqno="3"), collections=True) == Rollback(0)
    assert isinstance(ask(p, 0, 5, MAX, uuid, 5, 5, value=value(purge_seqno="9"), collections=True), Started)
    assert p.close_stream(0, None) == (WAKE,)
    assert isinstance(ask(p, 0, 5, MAX, uuid, 5, 5, flags=StreamFlag.IGNORE_PURGED_TOMBSTONES, collections=True),
                      Started)
    assert p.close_stream(0, None) == (WAKE,)
    assert isinstance(ask(p, 0, 9, MAX, uuid, 9, 9, collections=True), Started)  # start == purge seqno: fine
    assert p.close_stream(0, None) == (WAKE,)
    q = producer(engine)  # from 0 the purged tombstones are simply absent from the disk snapshot
    assert isinstance(ask(q, 0, 0, 10, uuid), Started)
    assert [m.by_seqno for m in items(drain(q))] == [4, 5, 6, 10]


def test_purge_before_the_backfill_opens_ends_with_rollback(engine):
    """The purge rule again when the scan opens (dcp/backfills.opened): tombstones above the
    start purged between the request and the scan end the stream with STREAM_END(Rollback) and
    no snapshot, unless IgnorePurgedTombstones or the request's `purge_seqno` is the server's."""
    for vb in (1, 2, 3):
        keys = fill(engine, vb, 6)
        for k in keys[:3]:
            engine.vbucket(vb).delete(k)
        fill(engine, vb, 1, prefix="after")
        to_disk_only(engine, vb)
    engine.compact(3, now=2**32)  # before its request, which says it saw that purge
    p = collections_producer(engine)
    uuid = {vb: engine.vbucket(vb).uuid for vb in (1, 2, 3)}
    assert isinstance(ask(p, 1, 5, 10, uuid[1], 5, 5, collections=True), Started)
    assert isinstance(ask(p, 2, 5, 10, uuid[2], 5, 5, flags=StreamFlag.IGNORE_PURGED_TOMBSTONES,
                          collections=True), Started)
    assert isinstance(ask(p, 3, 5, 10, uuid[3], 5, 5, value=value(purge_seqno="9"), collections=True), Started)
    engine.compact(1, now=2**32)
    engine.compact(2, now=2**32)
    msgs = drain(p)
    by_vb = {vb: [m for m in msgs if m.vbucket == vb] for vb in (1, 2, 3)}
    assert [(m.opcode, m.reason) for m in by_vb[1]] == [(Opcode.DCP_STREAM_END, StreamEndReason.ROLLBACK)]
    for vb in (2, 3):
        assert [(m.start_seqno, m.end_seqno) for m in markers(by_vb[vb])] == [(5, 10)]
        assert [m.by_seqno for m in items(by_vb[vb])] == [6, 10]
        assert by_vb[vb][-1].reason == StreamEndReason.OK


# -- the rollback decision as a property ------------------------------------------------------

@st.composite
def histories(draw):
    """A vbucket's history: branches made by failovers at increasing seqnos, with writes between."""
    writes = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))  # writes on each branch
    return writes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=histories(), data=st.data())
def test_rollback_decision_properties(tmp_path_factory, writes, data):
    """For any failover log the server built and any request on one of its branches (or an
    unknown one): a rollback never goes forward (seqno <= start and <= the high seqno), and
    asking again from where it said - on the current branch, as a consumer that rolled back does -
    is accepted, so a consumer converges in one round."""
    engine = make_engine(tmp_path_factory.mktemp("rb"), 1)
    try:
        vb = engine.vbucket(0)
        for i, n in enumerate(writes):
            if i:
                engine.failover(0)
            fill(engine, 0, n, prefix=f"b{i}-")
        high = vb.high_seqno
        uuids = [e.uuid for e in vb.failover.entries] + [0xBAD]
        uuid = data.draw(st.sampled_from(uuids), "uuid")
        snap_start = data.draw(st.integers(0, high + 3), "snap_start")
        start = data.draw(st.integers(snap_start, high + 4), "start")
        snap_end = data.draw(st.integers(start, high + 5), "snap_end")
        strict = data.draw(st.booleans(), "strict")
        p = producer(engine)
        out = ask(p, 0, start, MAX, uuid, snap_start, snap_end, flags=StreamFlag.STRICT_VBUUID if strict else 0)
        if isinstance(out, Rollback):
            assert out.seqno <= start and out.seqno <= high
            again = ask(producer(engine, name="again"), 0, out.seqno, MAX, vb.uuid, out.seqno, out.seqno)
            assert isinstance(again, Started), again
        elif isinstance(out, Refusal):
            assert out.status == Status.ERANGE and start > high
        else:
            assert isinstance(out, Started) and start <= high
            if start and not (uuid == vb.uuid and snap_end <= high):
                assert uuid in uuids[:-1]  # an unknown branch never streams from a non-zero start
    finally:
        engine.close(clean=False)
