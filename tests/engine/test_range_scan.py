"""Range-scan snapshots and the registry of open scans (engine/range_scan.py)."""

import pytest

from dcpflow.engine.errors import EngineError
from dcpflow.engine.range_scan import RangeScans, range_snapshot, sample_snapshot
from dcpflow.engine.vbucket import VBucket
from dcpflow.protocol.status import Status


def vbucket_with(keys, clock=lambda: 1000.0) -> VBucket:
    vb = VBucket(0, clock=clock, persistent=False)
    for k in keys:
        vb.set(k, b"v" + k)
    return vb


def test_range_bounds_and_order():
    vb = vbucket_with([b"b", b"a", b"c", b"ab", b"d"])
    vb.delete(b"d")
    assert [i.key for i in range_snapshot(vb, b"a", b"c")] == [b"a", b"ab", b"b", b"c"]
    assert [i.key for i in range_snapshot(vb, b"a", b"c", excl_start=True, excl_end=True)] == [b"ab", b"b"]
    assert [i.key for i in range_snapshot(vb, b"", b"\xff")] == [b"a", b"ab", b"b", b"c"]  # no tombstone
    assert range_snapshot(vb, b"x", b"z") == []


def test_expired_documents_are_left_out():
    now = [1000.0]
    vb = vbucket_with([b"a"], clock=lambda: now[0])
    vb.set(b"soon", b"x", expiry=10)
    assert [i.key for i in range_snapshot(vb, b"", b"\xff", now=1005.0)] == [b"a", b"soon"]
    assert [i.key for i in range_snapshot(vb, b"", b"\xff", now=1011.0)] == [b"a"]


def test_the_snapshot_does_not_see_later_writes():
    vb = vbucket_with([b"a", b"b"])
    snap = range_snapshot(vb, b"a", b"z")
    vb.set(b"c", b"new")
    vb.set(b"a", b"changed")
    vb.delete(b"b")
    assert [(i.key, i.value) for i in snap] == [(b"a", b"va"), (b"b", b"vb")]


def test_sampling_is_seeded_and_whole_when_small():
    vb = vbucket_with([f"k{i:03}".encode() for i in range(400)])
    small = sample_snapshot(vb, 1000, seed=1)
    assert len(small) == 400
    a, b = sample_snapshot(vb, 40, seed=7), sample_snapshot(vb, 40, seed=7)
    assert [i.key for i in a] == [i.key for i in b] and 15 < len(a) < 80
    assert [i.key for i in sample_snapshot(vb, 40, seed=8)] != [i.key for i in a]


def test_continue_limits():
    vb = vbucket_with([f"k{i}".encode() for i in range(10)])
    scans = RangeScans()
    scan = scans.add(0, range_snapshot(vb, b"", b"\xff"), key_only=True, include_xattrs=False)
    assert len(list(scan.take(item_limit=3))) == 3
    one = list(scan.take(byte_limit=1, size=lambda item: len(item.value)))
    assert len(one) == 1  # at least one, whatever the byte limit
    assert len(list(scan.take())) == 6 and scan.done


def test_registry_bounds_lifetime_and_lookup():
    now = [0.0]
    scans = RangeScans(max_lifetime=60, max_scans=2, clock=lambda: now[0])
    first = scans.add(3, [], key_only=True, include_xattrs=False)
    scans.add(3, [], key_only=True, include_xattrs=False)
    with pytest.raises(EngineError) as e:
        scans.add(3, [], key_only=True, include_xattrs=False)
    assert e.value.status == Status.EBUSY
    assert scans.get(first.id, 3) is first
    with pytest.raises(EngineError) as e:
        scans.get(first.id, 4)  # another vbucket's id is unknown here
    assert e.value.status == Status.KEY_ENOENT
    now[0] = 61
    with pytest.raises(EngineError):
        scans.get(first.id, 3)  # expired
    assert len(scans) == 0
