"""The divergence rule (protocol/failover.py): worked examples from kv_engine's DCP docs, and
properties against a reference model of failover logs (failover_model.py)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol.failover import branch_end, branch_of, divergence

from .failover_model import histories

LOG = [(0xBBBB, 500), (0xAAAA, 0)]


def test_branch_end_is_where_the_next_newer_branch_began():
    assert branch_end(LOG, 0xBBBB, 1000) == 1000  # the newest branch: the high seqno
    assert branch_end(LOG, 0xAAAA, 1000) == 500
    assert branch_end(LOG, 0xDEAD, 1000) is None
    assert branch_end([], 0xAAAA, 1000) is None


def test_branch_of_is_the_newest_entry_at_or_below():
    assert [branch_of(LOG, s) for s in (0, 499, 500, 900)] == [0xAAAA, 0xAAAA, 0xBBBB, 0xBBBB]
    assert branch_of([(7, 95)], 10) is None and branch_of([], 10) is None
    assert branch_of([(3, 5), (2, 5), (1, 0)], 5) == 3  # two branches began at 5: the newer


def test_failure_scenarios_md():
    """B read (W, 1000); C became active at 900 with the new UUID Y: B rolls back to 900, then
    resumes there. (failure-scenarios.md)"""
    log = [(0x5959, 900), (0x5757, 0)]
    d = divergence(log, 0x5757, 1000, 1000, 1000, 900)
    assert d.seqno == 900 and d.upper == 900 and d.reason == "consumer ahead of producer - producer upper at 900"
    assert divergence(log, 0x5757, 900, 900, 900, 900) is None


def test_discussion_md_snapshots_matter():
    """Log [(2222, 3), (1111, 0)], high 10. Resuming at 3 with the true snapshot 1..4 rolls back to
    1; claiming the boundary 3..3 would not (the versions hidden in 1..4 would be lost)."""
    log = [(2222, 3), (1111, 0)]
    assert divergence(log, 1111, 3, 1, 4, 10).seqno == 1
    assert divergence(log, 1111, 3, 3, 3, 10) is None
    assert divergence(log, 1111, 1, 1, 4, 10) is None  # at the snapshot start it holds nothing of it


def test_seqno_zero_and_strict_vbuuid():
    assert divergence(LOG, 0x1234, 0, 0, 0, 1000) is None  # nothing held, nothing to lose
    d = divergence(LOG, 0x1234, 0, 0, 0, 1000, strict_vbuuid=True)
    assert d.seqno == 0 and d.upper is None and "no common history" in d.reason
    assert divergence(LOG, 0, 0, 0, 0, 1000, strict_vbuuid=True) is None
    assert divergence(LOG, 0xAAAA, 0, 0, 0, 1000, strict_vbuuid=True) is None


@settings(max_examples=400, deadline=None)
@given(histories())
def test_divergence_against_the_reference_model(history):
    """For every consumer: no rollback only when the producer still holds everything the consumer
    relies on; a rollback goes to a seqno both histories share, at or below the consumer's; and a
    consumer whose branch the log still names is not rolled back without cause."""
    p, consumers = history
    for c in consumers:
        common = c.common(p)
        d = divergence(p.log, c.vbuuid, c.seqno, c.snapshot_start, c.snapshot_end, p.high)
        if d is None:
            assert common >= c.needed, "no rollback, yet the histories differ where the consumer relies on them"
        else:
            assert d.seqno <= common and d.seqno <= c.seqno
            assert (d.upper is None) == (branch_end(p.log, c.vbuuid, p.high) is None)
            if d.upper is not None:
                assert d.upper <= common < c.needed, "rolled back, yet the histories agree"


@settings(max_examples=200, deadline=None)
@given(histories(), st.data())
def test_resuming_on_the_branch_of_the_rollback_point_is_accepted(history, data):
    """After a rollback to R the consumer resumes at R (or any consistent point below it) on the
    branch the log names for it: the producer accepts that position."""
    p, consumers = history
    for c in consumers:
        d = divergence(p.log, c.vbuuid, c.seqno, c.snapshot_start, c.snapshot_end, p.high)
        if d is None:
            continue
        point = data.draw(st.integers(0, d.seqno))
        uuid = branch_of(p.log, point)
        assert uuid is not None  # every history begins at 0
        assert divergence(p.log, uuid, point, point, point, p.high) is None
