"""FailoverTable rules and the rollback decision, branch by branch, as KV-Engine's code decides (its
rollback.md differs in the places the tests named `..._erratum_N` state), with the worked examples
of failure-scenarios.md and discussion.md (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/).

The decision: (1) start 0 needs no rollback unless StrictVbUuid with a non-zero UUID; (2) a start
below the purge seqno (start != 0) rolls back to 0 unless the client's purge seqno equals the
server's or IgnorePurgedTombstones is set; (3) a UUID not in the failover log rolls back to 0;
(4) otherwise the client's snapshot is compared with where its branch ended (the next newer entry's
seqno, else the high seqno), and it rolls back to that point or its snapshot start if it went past.
Before all that: start <= end and snapshot start <= start <= snapshot end, else ERANGE."""

import json
from random import Random

import pytest
from hypothesis import given, settings

from dcpflow.engine import FailoverTable, RollbackDecision, VBucketState, rollback_decision
from dcpflow.engine.failover import MAX_FAILOVER_ENTRIES
from dcpflow.protocol.failover import divergence
from dcpflow.protocol.status import Status
from tests.protocol.failover_model import histories


class ZeroThenRandom(Random):
    """An rng whose first draws are 0 and a duplicate, to prove both are rejected."""

    def __init__(self, first: list[int]):
        super().__init__(7)
        self._first = list(first)

    def getrandbits(self, k: int) -> int:
        if self._first:
            return self._first.pop(0)
        return super().getrandbits(k)


# -- FailoverTable ------------------------------------------------------------------------------

def test_new_table_has_one_entry_at_seqno_zero_with_48_bit_nonzero_uuid():
    table = FailoverTable()
    assert len(table) == 1
    assert table.latest.seqno == 0
    assert 0 < table.latest_uuid < 1 << 48


def test_uuid_is_never_zero_nor_a_duplicate():
    table = FailoverTable([(5, 0)], rng=ZeroThenRandom([0, 5, 0, 9]))
    entry = table.create_entry(10)
    assert entry.uuid == 9
    assert [e.uuid for e in table] == [9, 5]


def test_create_entry_pushes_newest_first():
    table = FailoverTable(rng=Random(1))
    first = table.latest
    second = table.create_entry(100)
    third = table.create_entry(250)
    assert table.entries == [third, second, first]
    assert [e.seqno for e in table] == [250, 100, 0]


def test_create_entry_drops_entries_above_the_new_seqno():
    table = FailoverTable([(3, 900), (2, 500), (1, 0)])
    entry = table.create_entry(600)
    assert table.entries == [entry, (2, 500), (1, 0)]


def test_create_entry_keeps_entries_at_the_same_seqno():
    table = FailoverTable([(2, 500), (1, 0)])
    table.create_entry(500)
    assert [e.seqno for e in table] == [500, 500, 0]


def test_log_is_capped_at_25_dropping_the_oldest():
    table = FailoverTable(rng=Random(3))
    oldest = table.latest
    for seqno in range(1, 40):
        table.create_entry(seqno)
    assert len(table) == MAX_FAILOVER_ENTRIES == 25
    assert oldest not in table.entries
    assert [e.seqno for e in table] == list(range(39, 14, -1))


def test_json_round_trip_preserves_order():
    table = FailoverTable([(30, 9), (20, 4), (10, 0)])
    assert json.loads(table.to_json()) == [{"id": 30, "seq": 9}, {"id": 20, "seq": 4}, {"id": 10, "seq": 0}]
    assert FailoverTable.from_json(table.to_json()).entries == table.entries


def test_prune_drops_newer_entries_but_never_empties():
    table = FailoverTable([(3, 900), (2, 500), (1, 0)])
    table.prune(700)
    assert table.entries == [(2, 500), (1, 0)]
    lone = FailoverTable([(3, 900)])
    lone.prune(100)
    assert len(lone) == 1 and lone.latest.seqno == 100 and lone.latest_uuid != 3


def test_replace_adopts_a_producer_log():
    table = FailoverTable([(1, 0)])
    table.replace([(9, 50), (8, 0)])
    assert table.entries == [(9, 50), (8, 0)]
    with pytest.raises(ValueError):
        table.replace([])


# -- when entries are created (through the bucket) -----------------------------------------------

def fill(vb, n, prefix=b"k"):
    for i in range(n):
        vb.set(prefix + str(i).encode(), b"v")


def test_created_vbucket_gets_one_entry_at_zero(make_bucket):
    b = make_bucket()
    for vbid, state in enumerate(VBucketState):
        vb = b.set_vbucket_state(vbid, state)
        assert [e.seqno for e in vb.failover] == [0]


def test_becoming_active_after_complete_snapshot_adds_entry_at_high_seqno(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    old_uuid = vb.uuid
    vb.snapshot_marker(1, 3)
    for s in (1, 2, 3):
        vb.apply_mutation(b"k%d" % s, b"v", by_seqno=s, cas=100 + s, rev_seqno=1)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    assert [e.seqno for e in vb.failover] == [3, 0]
    assert vb.failover.entries[1].uuid == old_uuid and vb.uuid != old_uuid


def test_becoming_active_mid_snapshot_adds_entry_at_snapshot_start(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    vb.snapshot_marker(1, 2)
    vb.apply_mutation(b"a", b"v", by_seqno=1, cas=11, rev_seqno=1)
    vb.apply_mutation(b"b", b"v", by_seqno=2, cas=12, rev_seqno=1)
    vb.snapshot_marker(3, 10)
    vb.apply_mutation(b"c", b"v", by_seqno=3, cas=13, rev_seqno=1)
    vb.apply_mutation(b"d", b"v", by_seqno=5, cas=15, rev_seqno=1)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    assert [e.seqno for e in vb.failover] == [3, 0]
    assert vb.high_seqno == 5
    assert vb.set(b"e", b"v").by_seqno == 6


def test_becoming_active_with_a_marker_but_none_of_its_items_adds_entry_at_high_seqno(make_bucket):
    """Marker [11, 20] arrived, none of its items: the last complete snapshot ends at 10. An entry at
    11 would let a consumer holding the old active's seqno 11 go on without a rollback once this
    vbucket writes its own seqno 11."""
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    old_uuid = vb.uuid
    vb.snapshot_marker(1, 10)
    for s in range(1, 11):
        vb.apply_mutation(b"k%d" % s, b"v", by_seqno=s, cas=100 + s, rev_seqno=1)
    vb.snapshot_marker(11, 20)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    assert [e.seqno for e in vb.failover] == [10, 0]
    vb.set(b"new", b"v")  # the new branch's seqno 11
    decision = vb.failover.rollback_decision(start_seqno=11, end_seqno=2**64 - 1, vb_uuid=old_uuid,
                                             snap_start_seqno=11, snap_end_seqno=20, high_seqno=vb.high_seqno,
                                             purge_seqno=0)
    assert decision.status == Status.ROLLBACK and decision.rollback_seqno == 10


def test_takeover_creates_no_entry(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    vb.failover.replace([(77, 0)])
    b.set_vbucket_state(0, VBucketState.PENDING)
    b.set_vbucket_state(0, VBucketState.ACTIVE, by_takeover=True)
    assert vb.failover.entries == [(77, 0)]


def test_pending_to_active_without_takeover_adds_entry(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.PENDING)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    assert len(vb.failover) == 2


def test_active_to_active_is_not_a_new_branch_but_active_replica_active_is(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 4)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    assert len(vb.failover) == 1
    b.set_vbucket_state(0, VBucketState.REPLICA)
    assert len(vb.failover) == 1
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    assert [e.seqno for e in vb.failover] == [4, 0]


def test_state_change_and_its_entry_are_durable_before_any_flush(make_bucket, tmp_path):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    entries = vb.failover.entries
    b.close(clean=False)
    again = make_bucket()
    vb2 = again.vbucket(0)
    assert vb2.state == VBucketState.ACTIVE
    # unclean warm-up of an active vbucket adds one more entry on top of the durable ones
    assert vb2.failover.entries[1:] == entries


def test_clean_warmup_adds_no_entry(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 3)
    entries = vb.failover.entries
    b.close()
    again = make_bucket()
    assert again.clean_shutdown
    assert again.vbucket(0).failover.entries == entries


def test_unclean_warmup_of_active_adds_entry_at_snapshot_end_when_complete(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 5)
    b.flush_all()
    fill(vb, 3, b"lost")
    b.close(clean=False)
    again = make_bucket()
    assert not again.clean_shutdown
    vb2 = again.vbucket(0)
    assert vb2.high_seqno == 5
    assert [e.seqno for e in vb2.failover] == [5, 0]


def test_unclean_warmup_of_active_adds_entry_at_snapshot_start_when_incomplete(make_bucket):
    """An active vbucket's flushes end its snapshots; one persisted mid-snapshot is a replica that
    was promoted before its next flush (a disk snapshot spans several checkpoints)."""
    b = make_bucket(checkpoint_max_items=2)
    vb = b.set_vbucket_state(0, VBucketState.REPLICA)
    vb.snapshot_marker(1, 10, disk=True)
    for seqno in range(1, 6):
        vb.apply_mutation(b"k%d" % seqno, b"v", by_seqno=seqno, cas=1000 + seqno, rev_seqno=1)
    b.flush_all()
    assert vb.persisted_snapshot == (1, 10) and vb.persisted_seqno == 5
    b.set_vbucket_state(0, VBucketState.ACTIVE)  # failover: an entry at the snapshot start
    b.close(clean=False)
    vb2 = make_bucket().vbucket(0)
    assert vb2.high_seqno == 5
    assert [e.seqno for e in vb2.failover] == [1, 1, 0]


def test_unclean_warmup_of_replica_adds_no_entry(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(1, VBucketState.REPLICA)
    vb.snapshot_marker(1, 1)
    vb.apply_mutation(b"x", b"v", by_seqno=1, cas=5, rev_seqno=1)
    b.flush_all()
    b.close(clean=False)
    assert len(make_bucket().vbucket(1).failover) == 1


def test_unclean_warmup_drops_entries_above_what_was_persisted(make_bucket):
    b = make_bucket()
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    fill(vb, 2)
    b.flush_all()
    fill(vb, 3, b"x")  # high 5, persisted 2
    b.set_vbucket_state(0, VBucketState.REPLICA)
    b.set_vbucket_state(0, VBucketState.ACTIVE)  # entry at 5, persisted with the state change
    assert [e.seqno for e in vb.failover] == [5, 0]
    b.close(clean=False)
    vb2 = make_bucket().vbucket(0)
    assert vb2.high_seqno == 2
    assert [e.seqno for e in vb2.failover] == [2, 0]  # the entry at 5 described lost history


# -- the rollback decision -------------------------------------------------------------------------

LOG = [(0xBBBB, 500), (0xAAAA, 0)]


def decide(entries=LOG, *, start, uuid=0xBBBB, snap_start=None, snap_end=None, end=2**64 - 1, high=1000,
           purge=0, **kw):
    return rollback_decision(entries, start_seqno=start, end_seqno=end, vb_uuid=uuid,
                             snap_start_seqno=start if snap_start is None else snap_start,
                             snap_end_seqno=start if snap_end is None else snap_end,
                             high_seqno=high, purge_seqno=purge, **kw)


def test_erange_when_start_above_end():
    d = decide(start=10, end=9)
    assert d.status == Status.ERANGE and "end seqno" in d.reason


def test_start_equal_to_end_is_accepted_erratum_17():
    """Only start > end is ERANGE; start == end is accepted (the page says start must be less)."""
    assert decide(start=10, end=10).status == Status.SUCCESS


@pytest.mark.parametrize("snap", [(11, 20), (1, 9)])
def test_erange_when_start_outside_snapshot(snap):
    d = decide(start=10, snap_start=snap[0], snap_end=snap[1])
    assert d.status == Status.ERANGE and "snapshot" in d.reason


def test_start_zero_with_uuid_zero_needs_no_rollback():
    assert decide(start=0, uuid=0).status == Status.SUCCESS
    assert decide(start=0, uuid=0, strict_vb_uuid=True).status == Status.SUCCESS


def test_start_zero_with_unknown_uuid_is_fine_without_strict_vbuuid_erratum_36():
    """A request from seqno 0 needs no history check unless it sets StrictVbUuid (0x20): rollback.md's
    case 1.b (start 0 with a non-zero UUID) applies only then."""
    assert decide(start=0, uuid=0x1234).status == Status.SUCCESS


def test_start_zero_with_strict_vbuuid_checks_history():
    d = decide(start=0, uuid=0x1234, strict_vb_uuid=True)
    assert d.status == Status.ROLLBACK and d.rollback_seqno == 0 and "not found" in d.reason
    assert decide(start=0, uuid=0xAAAA, strict_vb_uuid=True).status == Status.SUCCESS


def test_start_below_purge_seqno_rolls_back_to_zero():
    d = decide(start=100, purge=200)
    assert d.needs_rollback and d.rollback_seqno == 0 and "purge" in d.reason


def test_purge_rule_uses_start_not_snapshot_start_erratum_36():
    """The purge rule compares the request's start seqno with the purge seqno, not its snapshot start
    (as rollback.md's "Wild card purge" says): snap_start 50 < purge 100 but start 150 is not, so no
    rollback."""
    assert decide(start=150, snap_start=50, snap_end=150, purge=100).status == Status.SUCCESS


def test_start_equal_to_purge_seqno_is_fine():
    assert decide(start=200, purge=200).status == Status.SUCCESS


def test_purge_rule_skipped_when_client_purge_seqno_matches():
    assert decide(start=100, purge=200, client_purge_seqno=200).status == Status.SUCCESS
    assert decide(start=100, purge=200, client_purge_seqno=150).needs_rollback


def test_purge_rule_skipped_with_ignore_purged_tombstones():
    assert decide(start=100, purge=200, ignore_purged_tombstones=True).status == Status.SUCCESS


def test_purge_rule_skipped_when_caller_established_exemption():
    assert decide(start=100, purge=200, purge_check_exempt=True).status == Status.SUCCESS


def test_unknown_uuid_rolls_back_to_zero():
    d = decide(start=100, uuid=0xDEAD)
    assert d.needs_rollback and d.rollback_seqno == 0 and "no common history" in d.reason


def test_latest_uuid_with_snapshot_end_within_high_seqno_needs_no_rollback():
    assert decide(start=900, snap_start=800, snap_end=1000).status == Status.SUCCESS


def test_lagging_consumer_on_old_branch_needs_no_rollback():
    # upper = 500 (the next newer entry); snapshot [300, 400] is all before the branch point
    assert decide(start=400, uuid=0xAAAA, snap_start=300, snap_end=400).status == Status.SUCCESS


def test_start_equal_snap_start_means_consumer_has_nothing_of_that_snapshot():
    # snap_end 600 > upper 500, but start == snap_start so snap_end becomes 450
    assert decide(start=450, uuid=0xAAAA, snap_start=450, snap_end=600).status == Status.SUCCESS


def test_leading_consumer_with_complete_snapshot_rolls_back_to_upper():
    d = decide(start=700, uuid=0xAAAA, snap_start=650, snap_end=700)
    assert d.needs_rollback and d.rollback_seqno == 500


def test_snapshot_straddling_the_branch_point_rolls_back_to_snapshot_start():
    d = decide(start=550, uuid=0xAAAA, snap_start=450, snap_end=600)
    assert d.needs_rollback and d.rollback_seqno == 450


def test_consumer_ahead_on_latest_branch_is_told_to_roll_back_not_erange():
    d = decide(start=1200, snap_start=1200, snap_end=1200, high=1000)
    assert d.needs_rollback and d.rollback_seqno == 1000


def test_erange_when_start_beyond_high_seqno_without_rollback():
    # a log entry above the high seqno makes the history check pass; the high-seqno check must not
    d = decide([(0xBBBB, 2000), (0xAAAA, 0)], start=1500, uuid=0xAAAA, high=1000)
    assert d.status == Status.ERANGE and "high seqno" in d.reason


def test_failure_scenarios_worked_example():
    """failure-scenarios.md: B has (W, 1000); C became active at 900 with a new UUID Y. B must
    roll back to 900, then its request from (W, 900) is accepted."""
    w, y = 0x5757, 0x5959
    node_c = FailoverTable([(y, 900), (w, 0)])
    d = node_c.rollback_decision(start_seqno=1000, end_seqno=2**64 - 1, vb_uuid=w, snap_start_seqno=1000,
                                 snap_end_seqno=1000, high_seqno=900, purge_seqno=0)
    assert d.needs_rollback and d.rollback_seqno == 900
    d = node_c.rollback_decision(start_seqno=900, end_seqno=2**64 - 1, vb_uuid=w, snap_start_seqno=900,
                                 snap_end_seqno=900, high_seqno=900, purge_seqno=0)
    assert d.status == Status.SUCCESS


def test_discussion_md_worked_example():
    """discussion.md: log [(2222, 3), (1111, 0)], high 10. Resuming with the true snapshot {1, 4}
    at start 3 rolls back to 1; lying with {3, 3} does not (which is why snapshots matter)."""
    table = FailoverTable([(2222, 3), (1111, 0)])
    common = dict(end_seqno=2**64 - 1, vb_uuid=1111, high_seqno=10, purge_seqno=0)
    d = table.rollback_decision(start_seqno=3, snap_start_seqno=1, snap_end_seqno=4, **common)
    assert d.needs_rollback and d.rollback_seqno == 1
    assert d.reason == "consumer ahead of producer - producer upper at 3"
    d = table.rollback_decision(start_seqno=3, snap_start_seqno=3, snap_end_seqno=3, **common)
    assert d.status == Status.SUCCESS


def test_to_json_follows_every_change_after_being_read():
    """to_json keeps its text between calls (the flusher asks for every vbucket in every batch):
    each way of changing the log must show in the next call."""
    t = FailoverTable([(11, 0)])
    assert FailoverTable.from_json(t.to_json()).entries == [(11, 0)]
    t.create_entry(7)
    assert FailoverTable.from_json(t.to_json()).entries == t.entries and len(t.entries) == 2
    t.prune(3)
    assert FailoverTable.from_json(t.to_json()).entries == [(11, 0)]
    t.replace([(5, 9), (4, 2)])
    assert FailoverTable.from_json(t.to_json()).entries == [(5, 9), (4, 2)]
    t.prune(1)  # nothing at or below 1 is left: a fresh entry at 1
    assert [e.seqno for e in FailoverTable.from_json(t.to_json()).entries] == [1]


# -- the shared rule ----------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(histories())
def test_stream_requests_are_decided_by_the_shared_rule(history):
    """The server's decision, for requests its own rules (ranges, purge) let through, is the
    divergence rule every consumer shares (dcpflow.protocol.failover): a stream starts only where
    the producer still holds what the consumer relies on, and a rollback goes to shared history."""
    p, consumers = history
    table = FailoverTable(p.log)
    for c in consumers:
        d = table.rollback_decision(start_seqno=c.seqno, end_seqno=2**64 - 1, vb_uuid=c.vbuuid,
                                    snap_start_seqno=c.snapshot_start, snap_end_seqno=c.snapshot_end,
                                    high_seqno=p.high, purge_seqno=0)
        shared = divergence(p.log, c.vbuuid, c.seqno, c.snapshot_start, c.snapshot_end, p.high)
        if shared is None:
            assert d.status == Status.SUCCESS and c.common(p) >= c.needed
        else:
            assert d == RollbackDecision(Status.ROLLBACK, shared.seqno, shared.reason)
            assert d.rollback_seqno <= c.common(p)
