"""SetWithMeta / AddWithMeta / DelWithMeta: every option and error (KV-Engine's set_with_meta.md and
del_with_meta.md, https://github.com/couchbase/kv_engine/tree/master/engines/ep/docs/protocol).
FORCE_WITH_META_OP only skips conflict resolution: since MB-67207 it no longer allows writes to
replica or pending vbuckets, although del_with_meta.md still says it does."""

import pytest

from dcpflow.engine import DeleteSource, EngineError, VBucketState
from dcpflow.engine import WithMetaOption as Opt
from dcpflow.engine.expiry import RELATIVE_EXPIRY_LIMIT
from dcpflow.engine.vbucket import MAX_META_CAS, MAX_REV_SEQNO
from dcpflow.protocol.status import Status

FORCE, ACCEPT, REGEN = Opt.FORCE_WITH_META_OP, Opt.FORCE_ACCEPT_WITH_META_OPS, Opt.REGENERATE_CAS
SKIP, EXPIRE = Opt.SKIP_CONFLICT_RESOLUTION, Opt.IS_EXPIRATION
REMOTE_CAS = 1_700_000_000 * 10**9 + (5 << 16)


def status_of(fn, *args, **kwargs) -> Status:
    with pytest.raises(EngineError) as exc:
        fn(*args, **kwargs)
    return exc.value.status


@pytest.fixture
def lww(make_bucket, clock):
    b = make_bucket(name="lww", conflict_resolution="lww", clock=clock)
    return b.set_vbucket_state(0, VBucketState.ACTIVE)


@pytest.fixture
def vb(bucket):
    return bucket.vbucket(0)


def test_set_with_meta_stores_the_given_metadata(vb):
    item = vb.set_with_meta(b"k", b"v", cas=REMOTE_CAS, rev_seqno=42, flags=7, expiry=2_000_000_000,
                            datatype=1)
    stored = vb.get(b"k")
    assert stored == item
    assert (stored.cas, stored.rev_seqno, stored.flags, stored.expiry, stored.datatype, stored.by_seqno) == (
        REMOTE_CAS, 42, 7, 2_000_000_000, 1, 1)


@pytest.mark.parametrize("expiry", [1, 86_400, RELATIVE_EXPIRY_LIMIT])
@pytest.mark.parametrize("fn", ["set_with_meta", "add_with_meta"])
def test_with_meta_expiry_is_absolute_even_when_small(vb, fn, expiry):
    """set_with_meta.md, Extras: "Expiration: Encoded as seconds since unix epoch. Does not support
    'relative' expiration." A value a plain SET's exptime would read as relative (30 days or
    less) is kept as given: a moment of 1970, so the document is already expired."""
    item = getattr(vb, fn)(b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, expiry=expiry)
    assert item.expiry == expiry
    assert status_of(vb.get, b"k") == Status.KEY_ENOENT
    assert vb.get_meta(b"k").deleted and vb.get_meta(b"k").delete_source == DeleteSource.TTL


def test_accepted_cas_keeps_local_cas_above_it(vb):
    far_future = REMOTE_CAS * 2
    vb.set_with_meta(b"k", b"v", cas=far_future, rev_seqno=1)
    assert vb.set(b"other", b"v").cas > far_future


def test_losing_conflict_resolution_is_key_eexists(vb):
    vb.set_with_meta(b"k", b"v1", cas=REMOTE_CAS, rev_seqno=10)
    assert status_of(vb.set_with_meta, b"k", b"v2", cas=REMOTE_CAS + 1, rev_seqno=9) == Status.KEY_EEXISTS
    assert status_of(vb.set_with_meta, b"k", b"v2", cas=REMOTE_CAS, rev_seqno=10) == Status.KEY_EEXISTS
    vb.set_with_meta(b"k", b"v3", cas=1, rev_seqno=11)  # rev-seqno bucket: rev decides first
    assert vb.get(b"k").value == b"v3"


def test_conflict_resolution_also_runs_against_tombstones(vb):
    vb.set(b"k", b"v")
    tomb = vb.delete(b"k")
    assert status_of(vb.set_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=tomb.rev_seqno - 1) == \
        Status.KEY_EEXISTS
    vb.set_with_meta(b"k", b"back", cas=REMOTE_CAS, rev_seqno=tomb.rev_seqno + 1)
    assert vb.get(b"k").value == b"back"


def test_xattr_tie_break_on_identical_metadata(vb):
    vb.set_with_meta(b"k", b"v", cas=REMOTE_CAS, rev_seqno=3, flags=1)
    vb.set_with_meta(b"k", b"\x00\x00\x00\x00v", cas=REMOTE_CAS, rev_seqno=3, flags=1, datatype=0x04)
    assert vb.get(b"k").datatype == 0x04


@pytest.mark.parametrize("skip", [FORCE, SKIP])
def test_force_with_meta_op_and_skip_cr_store_a_losing_version(vb, skip):
    vb.set_with_meta(b"k", b"new", cas=REMOTE_CAS, rev_seqno=10)
    vb.set_with_meta(b"k", b"old", cas=5, rev_seqno=1, options=skip)
    assert vb.get(b"k").value == b"old" and vb.get(b"k").rev_seqno == 1


def test_force_accept_is_refused_on_rev_seqno_buckets(vb):
    assert status_of(vb.set_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=ACCEPT) == \
        Status.EINVAL
    assert status_of(vb.del_with_meta, b"k", cas=REMOTE_CAS, rev_seqno=1, options=ACCEPT) == Status.EINVAL


def test_lww_buckets_require_force_accept(lww):
    assert status_of(lww.set_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1) == Status.EINVAL
    assert status_of(lww.del_with_meta, b"k", cas=REMOTE_CAS, rev_seqno=1) == Status.EINVAL
    assert lww.set_with_meta(b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=ACCEPT).cas == REMOTE_CAS


def test_lww_bucket_accepts_regenerate_cas_without_force_accept(lww):
    item = lww.set_with_meta(b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=REGEN | SKIP)
    assert item.cas != REMOTE_CAS


def test_lww_conflict_resolution_orders_by_cas(lww):
    lww.set_with_meta(b"k", b"v1", cas=REMOTE_CAS, rev_seqno=10, options=ACCEPT)
    assert status_of(lww.set_with_meta, b"k", b"v2", cas=REMOTE_CAS - 1, rev_seqno=99, options=ACCEPT) == \
        Status.KEY_EEXISTS
    lww.set_with_meta(b"k", b"v3", cas=REMOTE_CAS + 1, rev_seqno=1, options=ACCEPT)
    assert lww.get(b"k").value == b"v3"


def test_regenerate_cas_requires_skipped_conflict_resolution(vb):
    assert status_of(vb.set_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=REGEN) == \
        Status.EINVAL
    assert status_of(vb.del_with_meta, b"k", cas=REMOTE_CAS, rev_seqno=1, options=REGEN) == Status.EINVAL


@pytest.mark.parametrize("skip", [FORCE, SKIP])
def test_regenerate_cas_makes_a_local_cas(vb, skip):
    before = vb.set(b"x", b"v").cas
    item = vb.set_with_meta(b"k", b"v", cas=REMOTE_CAS * 3, rev_seqno=7, options=REGEN | skip)
    assert item.cas != REMOTE_CAS * 3 and item.cas > before and item.rev_seqno == 7
    tomb = vb.del_with_meta(b"k", cas=REMOTE_CAS * 3, rev_seqno=8, options=REGEN | skip)
    assert tomb.cas > item.cas and tomb.cas != REMOTE_CAS * 3


def test_is_expiration_only_on_delete(vb):
    assert status_of(vb.set_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=EXPIRE) == \
        Status.EINVAL
    assert status_of(vb.add_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=EXPIRE) == \
        Status.EINVAL
    tomb = vb.del_with_meta(b"k", cas=REMOTE_CAS, rev_seqno=1, options=EXPIRE)
    assert tomb.is_expiration and tomb.delete_source == DeleteSource.TTL


def test_unknown_option_bits_are_einval(vb):
    assert status_of(vb.set_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=0x20) == Status.EINVAL


def test_cas_zero_is_einval_unless_regenerated(vb):
    assert status_of(vb.set_with_meta, b"k", b"v", cas=0, rev_seqno=1) == Status.EINVAL
    assert vb.set_with_meta(b"k", b"v", cas=0, rev_seqno=1, options=REGEN | SKIP).cas != 0


@pytest.mark.parametrize("fn", ["set_with_meta", "add_with_meta", "del_with_meta"])
def test_metadata_without_room_for_local_writes_is_einval(vb, fn):
    """A CAS near 2^64 (2^64-1 is a locked document's CAS) or a rev seqno beyond 48 bits would
    overflow the u64 fields on the key's next local write; it is refused and changes nothing."""
    op = getattr(vb, fn)
    value = () if fn == "del_with_meta" else (b"v",)
    assert status_of(op, b"k", *value, cas=(1 << 64) - 1, rev_seqno=1) == Status.EINVAL
    assert status_of(op, b"k", *value, cas=MAX_META_CAS + 1, rev_seqno=1) == Status.EINVAL
    assert status_of(op, b"k", *value, cas=REMOTE_CAS, rev_seqno=MAX_REV_SEQNO + 1) == Status.EINVAL
    assert vb.high_seqno == 0 and vb.hlc.max_cas < REMOTE_CAS
    op(b"k", *value, cas=MAX_META_CAS, rev_seqno=MAX_REV_SEQNO)  # the limits themselves are accepted
    vb.set(b"k", b"local")  # and leave room for local writes of the key
    assert vb.get(b"k").rev_seqno == MAX_REV_SEQNO + 1 and vb.get(b"k").cas == MAX_META_CAS + 1


def test_a_regenerated_cas_ignores_the_given_one(vb):
    assert vb.set_with_meta(b"k", b"v", cas=(1 << 64) - 1, rev_seqno=1, options=REGEN | SKIP).cas < MAX_META_CAS


def test_add_with_meta_on_live_document_is_eexists_even_when_forced(vb):
    vb.set(b"k", b"v")
    for options in (0, FORCE, SKIP):
        assert status_of(vb.add_with_meta, b"k", b"v", cas=REMOTE_CAS * 2, rev_seqno=99, options=options) == \
            Status.KEY_EEXISTS


def test_add_with_meta_over_a_tombstone_runs_conflict_resolution(vb):
    vb.set(b"k", b"v")
    tomb = vb.delete(b"k")
    assert status_of(vb.add_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=tomb.rev_seqno - 1) == \
        Status.KEY_EEXISTS
    assert vb.add_with_meta(b"k", b"w", cas=REMOTE_CAS, rev_seqno=tomb.rev_seqno + 1).value == b"w"
    assert vb.add_with_meta(b"fresh", b"v", cas=REMOTE_CAS, rev_seqno=1).by_seqno == vb.high_seqno


def test_del_with_meta_stores_a_tombstone_with_given_metadata(vb, clock):
    vb.set_with_meta(b"k", b"v", cas=REMOTE_CAS, rev_seqno=3)
    tomb = vb.del_with_meta(b"k", cas=REMOTE_CAS + 1, rev_seqno=4, flags=6, delete_time=1_600_000_000)
    assert tomb.deleted and (tomb.cas, tomb.rev_seqno, tomb.flags, tomb.delete_time) == (
        REMOTE_CAS + 1, 4, 6, 1_600_000_000)
    assert tomb.delete_source == DeleteSource.EXPLICIT
    assert status_of(vb.get, b"k") == Status.KEY_ENOENT
    assert vb.del_with_meta(b"k", cas=REMOTE_CAS + 2, rev_seqno=5).delete_time == int(clock.now)


def test_del_with_meta_of_an_unknown_key_creates_a_tombstone(vb):
    tomb = vb.del_with_meta(b"never-seen", cas=REMOTE_CAS, rev_seqno=12)
    assert vb.get_meta(b"never-seen") == tomb and tomb.deleted and vb.num_deleted == 1


def test_del_with_meta_conflict_resolution_ignores_flags_and_expiry(vb):
    vb.set_with_meta(b"k", b"v", cas=REMOTE_CAS, rev_seqno=3, flags=1)
    assert status_of(vb.del_with_meta, b"k", cas=REMOTE_CAS, rev_seqno=3, flags=99) == Status.KEY_EEXISTS
    assert status_of(vb.del_with_meta, b"k", cas=REMOTE_CAS - 1, rev_seqno=3) == Status.KEY_EEXISTS
    assert vb.del_with_meta(b"k", cas=REMOTE_CAS + 1, rev_seqno=3).deleted


def test_del_with_meta_may_carry_an_xattr_value(vb):
    blob = b"\x00\x00\x00\x0b\x00\x00\x00\x07_s\x00{}\x00"
    tomb = vb.del_with_meta(b"k", cas=REMOTE_CAS, rev_seqno=1, value=blob, datatype=0x04)
    assert tomb.value == blob and tomb.datatype == 0x04


def test_header_cas_checks_the_existing_document(vb):
    live = vb.set(b"k", b"v")
    assert status_of(vb.set_with_meta, b"k", b"v", cas=REMOTE_CAS * 2, rev_seqno=9,
                     check_cas=live.cas + 1) == Status.KEY_EEXISTS
    assert status_of(vb.set_with_meta, b"nope", b"v", cas=REMOTE_CAS, rev_seqno=9, check_cas=live.cas) == \
        Status.KEY_ENOENT
    assert status_of(vb.del_with_meta, b"nope", cas=REMOTE_CAS, rev_seqno=9, check_cas=live.cas) == \
        Status.KEY_ENOENT
    assert vb.set_with_meta(b"k", b"w", cas=REMOTE_CAS * 2, rev_seqno=9, check_cas=live.cas).value == b"w"


@pytest.mark.parametrize(("state", "status"), [(VBucketState.REPLICA, Status.NOT_MY_VBUCKET),
                                               (VBucketState.DEAD, Status.NOT_MY_VBUCKET),
                                               (VBucketState.PENDING, Status.ETMPFAIL)])
def test_with_meta_writes_only_to_active_even_when_forced_mb_67207(bucket, state, status):
    vb = bucket.vbucket(0)
    bucket.set_vbucket_state(0, state)
    for options in (0, FORCE):
        assert status_of(vb.set_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=options) == status
        assert status_of(vb.add_with_meta, b"k", b"v", cas=REMOTE_CAS, rev_seqno=1, options=options) == status
        assert status_of(vb.del_with_meta, b"k", cas=REMOTE_CAS, rev_seqno=1, options=options) == status
    assert vb.high_seqno == 0


def test_failed_with_meta_changes_nothing(vb):
    vb.set_with_meta(b"k", b"v", cas=REMOTE_CAS, rev_seqno=10)
    high, max_cas = vb.high_seqno, vb.hlc.max_cas
    status_of(vb.set_with_meta, b"k", b"x", cas=REMOTE_CAS * 4, rev_seqno=1)
    assert vb.high_seqno == high and vb.hlc.max_cas == max_cas and vb.get(b"k").value == b"v"
