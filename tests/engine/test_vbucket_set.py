"""VBucket.set, the hottest write path: what it leaves in the hash table and the open checkpoint,
its clocks, and its signature."""

import dataclasses
import time

import pytest

from dcpflow.engine.expiry import to_absolute
from dcpflow.engine.hlc import HLC
from dcpflow.engine.item import DeleteSource, Item
from dcpflow.engine.vbucket import VBucket, VBucketState


class Clocks:
    """One deterministic time for the vbucket (seconds), its HLC (ns) and its checkpoints."""

    def __init__(self):
        self.t = 1_700_000_000.0

    def wall(self) -> float:
        return self.t

    def ns(self) -> int:
        return int(self.t * 1e9)

    def mono(self) -> float:
        return self.t - 1_600_000_000.0


def make(clocks: Clocks, max_items: int = 10_000) -> VBucket:
    vb = VBucket(7, VBucketState.ACTIVE, hlc=HLC(clock=clocks.ns), clock=clocks.wall,
                 checkpoint_max_items=max_items, checkpoint_max_age=5.0)
    vb.checkpoint_manager._clock = clocks.mono
    vb.checkpoint_manager.checkpoints[-1].deadline = clocks.mono() + 5.0
    return vb


def test_the_item_set_builds_is_the_one_the_constructor_makes():
    """set builds its Item field by field, not through Item(...): every field of the dataclass must
    be set (a field added to Document and not to set would be missing here), and equal to what
    the constructor makes of the same arguments: a new key, a rewrite, a key over a tombstone,
    with flags, expiry, datatype and a CAS."""
    clocks = Clocks()
    vb = make(clocks)
    vb.max_deleted_rev_seqno = 40

    def stored(key: bytes, value: bytes, **kwargs) -> Item:
        item = vb.set(key, value, **kwargs)
        assert vb.ht[key] == item and vb.checkpoint_manager.open_checkpoint.items()[-1] is item
        return item

    made = [stored(b"new", b"v1")]
    made.append(stored(b"new", b"v2", flags=0xDEADBEEF, expiry=30, datatype=1, cas=made[0].cas))
    vb.set(b"gone", b"x")
    vb.delete(b"gone")
    made.append(stored(b"gone", b"back", expiry=int(clocks.t) + 100))
    expected = [(b"new", b"v1", 0, 0, 41, 1, 0), (b"new", b"v2", 0xDEADBEEF, to_absolute(30, clocks.t), 42, 2, 1),
                (b"gone", b"back", 0, int(clocks.t) + 100, 43, 5, 0)]
    for item, (key, value, flags, expiry, rev, seqno, datatype) in zip(made, expected, strict=True):
        assert type(item) is Item
        assert all(hasattr(item, f.name) for f in dataclasses.fields(Item))
        assert item == Item(key, value, flags, expiry, item.cas, rev, seqno, datatype)
        assert item.delete_source is DeleteSource.EXPLICIT and item.deleted is False
    assert made[0].cas < made[1].cas < made[2].cas


def test_heavy_rewrites_compact_the_open_checkpoint():
    """Rewrites of a few keys leave holes in the open checkpoint; past 64 (and past its number of
    items) they are dropped, so it never holds more than one version per key and 64 holes."""
    vb = make(Clocks())
    for i in range(300):
        vb.set(b"key-%d" % (i % 3), b"v%d" % i)
    cp = vb.checkpoint_manager.checkpoints[-1]
    assert cp._holes < 65
    assert [it.key for it in cp._items if it is not None] == [b"key-0", b"key-1", b"key-2"]
    assert [it.value for it in cp.items()] == [b"v297", b"v298", b"v299"]
    assert len(cp._seqnos) == len(cp._items) and cp._seqnos == sorted(cp._seqnos)
    assert all(it.by_seqno == seqno for it, seqno in zip(cp._items, cp._seqnos, strict=True) if it is not None)
    assert cp._index == {it.key: i for i, it in enumerate(cp._items) if it is not None}


def test_a_rewrite_keeps_the_checkpoint_index_s_first_key_object():
    """Equal keys from different requests are different objects; the checkpoint's index keeps the
    first one (the hash table keeps its own copy of the key's bytes, in its record)."""
    vb = make(Clocks())
    first = bytes(bytearray(b"doc-1"))
    vb.set(first, b"1")
    again = bytes(bytearray(b"doc-1"))
    assert again is not first
    item = vb.set(again, b"2")
    assert item.key == first and list(vb.ht) == [first]
    index = vb.checkpoint_manager.checkpoints[-1]._index
    assert next(k for k in index if k == first) is first


def test_the_default_clocks():
    """With the default clocks (time.time_ns for the HLC, time.monotonic for checkpoint age) the
    CAS is the wall clock's, and a checkpoint older than its max age rolls over before the next
    write."""
    vb = VBucket(3, VBucketState.ACTIVE, checkpoint_max_items=10_000, checkpoint_max_age=0.05)
    assert vb.hlc._clock is time.time_ns and vb.checkpoint_manager._clock is time.monotonic
    before = time.time_ns() & ~0xFFFF
    first = vb.set(b"a", b"1")
    after = time.time_ns()
    assert before <= first.cas <= after
    assert vb.set(b"a", b"2").cas > first.cas
    opened = vb.checkpoint_manager.open_checkpoint.id
    vb.set(b"b", b"1")
    assert vb.checkpoint_manager.open_checkpoint.id == opened  # younger than 50 ms: the same checkpoint
    deadline = time.monotonic() + 0.06
    while time.monotonic() < deadline:  # the checkpoint's age passes its limit
        time.sleep(0.01)
    vb.set(b"c", b"1")
    assert vb.checkpoint_manager.open_checkpoint.id == opened + 1


def test_bad_arguments_get_pythons_errors():
    vb = make(Clocks())
    with pytest.raises(TypeError, match="unexpected keyword argument 'flagz'"):
        vb.set(b"k", b"v", flagz=1)
    with pytest.raises(TypeError):
        vb.set(b"k")
    assert vb.set(b"k", value=b"v").value == b"v"
