"""The replica application path a DCP consumer uses: markers, mutations, deletions, expirations."""

import pytest

from dcpflow.engine import CheckpointType, DeleteSource, EngineError, VBucketState
from dcpflow.protocol.status import Status

CAS = 1_700_000_000 * 10**9


@pytest.fixture
def replica(make_bucket, clock):
    b = make_bucket(clock=clock)
    return b.set_vbucket_state(0, VBucketState.REPLICA)


def status_of(fn, *args, **kwargs) -> Status:
    with pytest.raises(EngineError) as exc:
        fn(*args, **kwargs)
    return exc.value.status


def test_metadata_is_stored_unchanged(replica):
    replica.snapshot_marker(1, 3, disk=True)
    m = replica.apply_mutation(b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=9, flags=4, expiry=5, datatype=1)
    d = replica.apply_deletion(b"b", by_seqno=2, cas=CAS + 1, rev_seqno=3, delete_time=1234)
    e = replica.apply_expiration(b"c", by_seqno=3, cas=CAS + 2, rev_seqno=2, delete_time=1235)
    assert (m.cas, m.rev_seqno, m.by_seqno, m.flags, m.expiry, m.datatype) == (CAS, 9, 1, 4, 5, 1)
    assert d.deleted and d.delete_source == DeleteSource.EXPLICIT and d.delete_time == 1234
    assert e.is_expiration and e.delete_time == 1235
    assert replica.high_seqno == 3 and replica.ht[b"a"] == m
    assert replica.hlc.max_cas == CAS + 2


def test_metadata_without_room_for_local_writes_is_refused(replica):
    """A replica may be promoted and written locally, so its metadata must leave room too."""
    replica.snapshot_marker(1, 2)
    assert status_of(replica.apply_mutation, b"a", b"v", by_seqno=1, cas=(1 << 64) - 1, rev_seqno=1) == \
        Status.EINVAL
    assert status_of(replica.apply_deletion, b"a", by_seqno=1, cas=CAS, rev_seqno=1 << 48) == Status.EINVAL
    assert replica.high_seqno == 0 and replica.hlc.max_cas < CAS
    replica.apply_mutation(b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=(1 << 48) - 1)


def test_expired_documents_are_not_expired_on_a_replica(replica, clock):
    replica.snapshot_marker(1, 1)
    replica.apply_mutation(b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=1, expiry=int(clock.now) - 10)
    assert replica.expire_due() == 0 and not replica.ht[b"a"].deleted


def test_marker_creates_a_checkpoint_with_its_range_and_type(replica):
    replica.snapshot_marker(1, 10, disk=True)
    cp = replica.checkpoint_manager.open_checkpoint
    assert (cp.snap_start, cp.snap_end, cp.type, cp.fixed_end) == (1, 10, CheckpointType.DISK, True)
    replica.apply_mutation(b"a", b"v", by_seqno=4, cas=CAS, rev_seqno=1)
    replica.snapshot_marker(11, 12)
    assert replica.checkpoint_manager.open_checkpoint.type == CheckpointType.MEMORY


def test_mutation_needs_a_marker_and_a_seqno_inside_it(replica):
    assert status_of(replica.apply_mutation, b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=1) == Status.ERANGE
    replica.snapshot_marker(1, 5)
    replica.apply_mutation(b"a", b"v", by_seqno=2, cas=CAS, rev_seqno=1)
    assert status_of(replica.apply_mutation, b"b", b"v", by_seqno=2, cas=CAS, rev_seqno=1) == Status.ERANGE
    assert status_of(replica.apply_mutation, b"b", b"v", by_seqno=6, cas=CAS, rev_seqno=1) == Status.ERANGE
    assert status_of(replica.apply_deletion, b"b", by_seqno=1, cas=CAS, rev_seqno=1) == Status.ERANGE
    assert replica.high_seqno == 2


def test_bad_markers(replica):
    assert status_of(replica.snapshot_marker, 5, 4) == Status.EINVAL
    replica.snapshot_marker(1, 3)
    replica.apply_mutation(b"a", b"v", by_seqno=3, cas=CAS, rev_seqno=1)
    assert status_of(replica.snapshot_marker, 1, 2) == Status.ERANGE


def test_pending_vbuckets_accept_replication(replica, make_bucket):
    replica.state = VBucketState.PENDING
    replica.snapshot_marker(1, 1)
    assert replica.apply_mutation(b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=1).by_seqno == 1


@pytest.mark.parametrize("state", [VBucketState.ACTIVE, VBucketState.DEAD])
def test_active_and_dead_vbuckets_refuse_replication(bucket, state):
    vb = bucket.vbucket(0)
    bucket.set_vbucket_state(0, state)
    assert status_of(vb.snapshot_marker, 1, 1) == Status.NOT_MY_VBUCKET
    assert status_of(vb.apply_mutation, b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=1) == Status.NOT_MY_VBUCKET
    assert status_of(vb.apply_deletion, b"a", by_seqno=1, cas=CAS, rev_seqno=1) == Status.NOT_MY_VBUCKET


def test_replica_data_and_incomplete_snapshot_survive_restart(make_bucket, clock):
    b = make_bucket(name="r", clock=clock)
    replica = b.set_vbucket_state(0, VBucketState.REPLICA)
    replica.snapshot_marker(1, 5, disk=True)
    replica.apply_mutation(b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=5)
    replica.apply_deletion(b"b", by_seqno=2, cas=CAS + 1, rev_seqno=2, delete_time=99)
    b.close()
    again = make_bucket(name="r", clock=clock).vbucket(0)
    assert again.state == VBucketState.REPLICA and again.high_seqno == 2
    assert again.ht[b"a"].rev_seqno == 5 and again.ht[b"b"].delete_time == 99
    assert (again.snapshot_start, again.snapshot_end) == (1, 5)  # still mid-snapshot
    assert again.set_state(VBucketState.ACTIVE).seqno == 1  # so promotion branches at its start


def test_stream_from_a_replica_sees_marker_ranges(replica):
    reg = replica.checkpoint_manager.register_cursor("dcp", 0)
    replica.snapshot_marker(1, 4, disk=True)
    replica.apply_mutation(b"a", b"v", by_seqno=1, cas=CAS, rev_seqno=1)
    replica.apply_mutation(b"b", b"v", by_seqno=2, cas=CAS, rev_seqno=1)
    [snap] = reg.cursor.next_batch()
    assert (snap.start, snap.end, snap.type, snap.checkpoint_start) == (1, 4, CheckpointType.DISK, True)
    assert [it.by_seqno for it in snap.items] == [1, 2]
