"""The one consumer-side stream position (dcp/position.py), without a socket: what a stream end, a
rollback to zero and a stored snapshot position mean, for the client's Feed and for the replica
consumer alike. The tracker's own rules (snapshots, items, rollback points) are
tests/client/test_offsets.py's; the consumer's use of these rules is test_consumer_rules.py's."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpflow.dcp import position
from dcpflow.dcp.position import (
    BEGINNING,
    FINISH,
    REOPEN,
    RESUMABLE_ENDS,
    Offset,
    VbTracker,
    after_rollback_to_zero,
    stored_position,
    stream_end,
    stream_request,
)
from dcpflow.protocol.dcp import DcpStreamRequest, StreamEndReason

U = 0xABCD
REASONS = [*StreamEndReason, 99]  # and one no page names


@pytest.mark.parametrize("reason", REASONS)
def test_a_replica_asks_again_only_after_slow_backfill_fail_or_rollback(reason):
    """The replica consumer (no cluster map of its own) reopens a stream only for the reasons any
    consumer reopens for; every other end is the end of its stream, for its manager to act on."""
    action = stream_end(reason, follows_map=False)
    assert action.action == (REOPEN if reason in RESUMABLE_ENDS else FINISH)
    assert not action.remap


@pytest.mark.parametrize("reason", REASONS)
def test_a_takeover_stream_never_asks_again(reason):
    assert stream_end(reason, follows_map=False, takeover=True).action == FINISH


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("closed_by_us", [False, True])
def test_both_consumers_agree_where_their_rules_meet(reason, closed_by_us):
    """OK finishes both; the resumable ends reopen both, with the same pause; the client reopens
    every other end as well (it follows the map), the replica finishes it."""
    client = stream_end(reason, closed_by_us=closed_by_us)
    replica = stream_end(reason, closed_by_us=closed_by_us, follows_map=False)
    if reason == StreamEndReason.OK or (reason == StreamEndReason.CLOSED and closed_by_us):
        assert client.action == replica.action == FINISH
    elif reason in RESUMABLE_ENDS:
        assert client == replica
        assert client.action == REOPEN
        assert (client.pause > 0) == (reason != StreamEndReason.ROLLBACK)
    else:
        assert (client.action, replica.action) == (REOPEN, FINISH)
        assert client.remap == (reason in (StreamEndReason.STATE_CHANGED, StreamEndReason.DISCONNECTED))


def test_a_marker_without_its_items_leaves_the_stored_position_at_the_previous_end():
    """snapshot_start > seqno would be refused with ERANGE: the position is the last boundary."""
    assert stored_position(U, 10, 11, 20) == Offset(U, 10, 10, 10)
    assert stored_position(U, 15, 11, 20) == Offset(U, 15, 11, 20)  # mid-snapshot: the range stays
    assert stored_position(U, 25, 11, 20) == Offset(U, 25, 11, 25)  # past its end: a boundary
    assert stored_position(U, 0, 0, 0) == Offset(U, 0, 0, 0)


@given(uuid=st.integers(0, 2**64 - 1), seqno=st.integers(0, 1000), a=st.integers(0, 1000), b=st.integers(0, 1000))
def test_a_stored_position_is_always_a_valid_request(uuid, seqno, a, b):
    pos = stored_position(uuid, seqno, min(a, b), max(a, b))
    assert pos.check() == pos
    assert pos.seqno == seqno and pos.vbuuid == uuid


def test_a_rollback_to_zero_forgets_the_history_as_the_client_does():
    """The replica's rule and the client's rollback_offset give the same position at seqno 0."""
    assert after_rollback_to_zero(Offset(U, 0, 0, 0)) == BEGINNING == position.rollback_offset([(U, 0)], 0)
    assert after_rollback_to_zero(Offset(U, 5, 5, 5)) == Offset(U, 5, 5, 5)
    tracker = VbTracker(0, Offset(U, 10, 10, 10))
    assert tracker.rollback_offset([(U, 0)], 3) == BEGINNING


def test_a_request_at_or_past_its_end_asks_for_start_equal_end():
    """Only the producer can tell a position on a lost branch (ROLLBACK); end < start is ERANGE."""
    req = stream_request(7, Offset(U, 50, 40, 60), 30, 0x10, b"{}", opaque=9)
    assert req == DcpStreamRequest(7, 50, 50, U, 40, 60, 0x10, b"{}", opaque=9)
    req = stream_request(7, Offset(U, 50, 40, 60), 80, 0)
    assert (req.start_seqno, req.end_seqno, req.vbucket_uuid, req.snap_start_seqno, req.snap_end_seqno) == \
        (50, 80, U, 40, 60)
