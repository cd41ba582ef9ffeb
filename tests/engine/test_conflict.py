"""Conflict resolution tie-breaks in both modes (KV-Engine's set_with_meta.md and del_with_meta.md,
https://github.com/couchbase/kv_engine/tree/master/engines/ep/docs/protocol, read as KV-Engine's
code behaves: the incoming version wins when its tuple is strictly greater - (rev seqno, CAS,
expiry, flags) in rev-seqno mode, (CAS, rev seqno, expiry, flags) in LWW mode, without expiry and
flags for deletions - and, on equal tuples, when it has xattrs and the existing version has none)."""

import pytest

from dcpflow.engine import ConflictResolutionMode, DocMeta, incoming_wins

REV, LWW = ConflictResolutionMode.REV_SEQNO, ConflictResolutionMode.LWW
XATTR = 0x04
BASE = DocMeta(cas=1000, rev_seqno=10, expiry=500, flags=7, datatype=0)


def wins(mode, deletion=False, existing=BASE, **changes):
    return incoming_wins(mode, existing._replace(**changes), existing, deletion=deletion)


@pytest.mark.parametrize("mode", [REV, LWW])
@pytest.mark.parametrize("field", ["cas", "rev_seqno", "expiry", "flags"])
def test_each_field_decides_when_all_earlier_ones_are_equal(mode, field):
    assert wins(mode, **{field: getattr(BASE, field) + 1})
    assert not wins(mode, **{field: getattr(BASE, field) - 1})


def test_rev_seqno_mode_orders_rev_before_cas():
    assert wins(REV, rev_seqno=11, cas=1)
    assert not wins(REV, rev_seqno=9, cas=10**9)


def test_lww_mode_orders_cas_before_rev():
    assert wins(LWW, cas=1001, rev_seqno=1)
    assert not wins(LWW, cas=999, rev_seqno=10**6)


@pytest.mark.parametrize("mode", [REV, LWW])
def test_expiry_is_compared_before_flags(mode):
    assert wins(mode, expiry=501, flags=0)
    assert not wins(mode, expiry=499, flags=2**32 - 1)


@pytest.mark.parametrize("mode", [REV, LWW])
def test_erratum_51_greater_flags_win_not_smaller(mode):
    """Erratum 51: set_with_meta.md's pseudo-code says incoming wins when its flags are LESS;
    the code compares tuples and incoming wins when its flags are GREATER."""
    assert wins(mode, flags=8)
    assert not wins(mode, flags=6)


@pytest.mark.parametrize("mode", [REV, LWW])
def test_identical_metadata_loses(mode):
    assert not wins(mode)


@pytest.mark.parametrize("mode", [REV, LWW])
def test_identical_mutation_with_xattrs_beats_one_without_in_both_modes(mode):
    assert wins(mode, datatype=XATTR)
    assert wins(mode, datatype=XATTR | 0x01)


@pytest.mark.parametrize("mode", [REV, LWW])
def test_xattr_tie_break_needs_existing_without_xattrs(mode):
    with_x = BASE._replace(datatype=XATTR)
    assert not wins(mode, existing=with_x)  # both have xattrs
    assert not wins(mode, existing=with_x, datatype=0)  # only the existing one has


@pytest.mark.parametrize("mode", [REV, LWW])
def test_xattr_tie_break_only_on_a_full_tie(mode):
    assert not wins(mode, datatype=XATTR, flags=6)


@pytest.mark.parametrize("mode", [REV, LWW])
def test_deletion_compares_only_cas_and_rev(mode):
    assert not wins(mode, deletion=True, expiry=10**6, flags=99)
    assert wins(mode, deletion=True, cas=1001)
    assert wins(mode, deletion=True, rev_seqno=11)
    assert not wins(mode, deletion=True, cas=999)
    assert not wins(mode, deletion=True, rev_seqno=9)


@pytest.mark.parametrize("mode", [REV, LWW])
def test_deletion_has_no_xattr_tie_break(mode):
    assert not wins(mode, deletion=True, datatype=XATTR)


def test_deletion_order_differs_by_mode():
    assert wins(REV, deletion=True, rev_seqno=11, cas=1)
    assert not wins(LWW, deletion=True, rev_seqno=11, cas=1)
    assert wins(LWW, deletion=True, cas=1001, rev_seqno=1)
    assert not wins(REV, deletion=True, cas=1001, rev_seqno=1)


def test_mode_accepts_bucket_config_strings():
    assert incoming_wins("lww", BASE._replace(cas=2000), BASE)
    assert incoming_wins("seqno", BASE._replace(rev_seqno=11), BASE)
    with pytest.raises(ValueError):
        incoming_wins("custom", BASE, BASE)
