"""The engine's compiled twins (engine/_speedups.c) against their specifications.

VBucket.set against VBucket._set_py:

Two vbuckets with the same deterministic clocks get the same random run of operations; one
writes with `set` (the compiled twin, which hands its uncommon cases to _set_py), the other with
`_set_py` itself. After every step both must have returned the same thing (or raised the same
error) and hold the same state: hash table, seqnos, HLC, counters, every checkpoint's items,
index, holes and memory accounting, cursors dropped, listeners called.

The flusher's rows (store._encoded_rows) against store._encoded_rows_py: the same rows, with the
same types, or the same error, for any items."""

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dcpflow.engine import store as store_mod
from dcpflow.engine.errors import EngineError
from dcpflow.engine.hlc import HLC
from dcpflow.engine.item import DeleteSource, Item
from dcpflow.engine.vbucket import VBucket, VBucketState
from dcpflow.protocol import dcp as dcpproto

compiled_set = VBucket.set if VBucket.set is not VBucket._set_py else None
needs_compiled = pytest.mark.skipif(compiled_set is None, reason="the compiled engine twin is not built")


def test_the_compiled_set_is_built():
    """CI builds it: a missing build must not pass unnoticed as a slower server."""
    if os.environ.get("DCPFLOW_PURE_PYTHON"):
        assert compiled_set is None
    else:
        assert compiled_set is not None, "dcpflow.engine._speedups did not build: pip install -e . needs gcc"


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


def make(clocks: Clocks, max_items: int, quota: int | None) -> tuple[VBucket, list]:
    calls: list = []
    dirty: dict = {}
    vb = VBucket(7, VBucketState.ACTIVE, hlc=HLC(clock=clocks.ns), clock=clocks.wall,
                 checkpoint_max_items=max_items, checkpoint_max_age=5.0, checkpoint_memory_quota=quota,
                 on_seqno=lambda vbid, seqno: calls.append(("seqno", vbid, seqno)),
                 dirty=dirty)
    vb.checkpoint_manager._clock = clocks.mono
    vb.checkpoint_manager.checkpoints[-1].deadline = clocks.mono() + 5.0
    return vb, calls


def state(vb: VBucket, calls: list) -> dict:
    cm = vb.checkpoint_manager
    return {
        "vb": {name: getattr(vb, name) for name in VBucket.__slots__
               if name not in ("_clock", "_on_seqno", "checkpoint_manager", "hlc", "failover")},
        "hlc": (vb.hlc.max_cas, vb.hlc.logical_ticks),
        "manager": (cm.high_seqno, cm.mem_usage, cm.num_dropped_cursors, sorted(cm.cursors)),
        "checkpoints": [(cp.id, cp.is_open, cp.snap_start, cp.snap_end, cp.high_seqno, cp.num_items, cp.mem_usage,
                         cp._holes, cp._items, cp._seqnos, cp._index) for cp in cm.checkpoints],
        "calls": list(calls),
    }


keys = st.sampled_from([b"a", b"b", b"c", b"doc-1", b"doc-2", b"k" * 40])
values = st.binary(max_size=40)
writes = st.tuples(st.just("set"), keys, values, st.integers(0, 3), st.sampled_from([0, 0, 1, 4, 5]),
                   st.sampled_from([0, 0, 0, 30, 2]), st.sampled_from(["none", "none", "current", "wrong"]))
others = st.one_of(
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("tick"), st.sampled_from([0.000001, 0.5, 3.0, 6.0])),
    st.tuples(st.just("clock_back"), st.just(1.0)),  # the HLC's logical counter takes over
    st.tuples(st.just("lock"), keys),
    st.tuples(st.just("checkpoint"), st.just(None)),
    st.tuples(st.just("cursor"), st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("persist"), st.just(None)),
    st.tuples(st.just("state"), st.sampled_from([VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.PENDING])),
)
runs = st.lists(st.one_of(writes, writes, writes, others), max_size=120)


def step(vb: VBucket, clocks: Clocks, op: tuple, compiled: bool):
    kind = op[0]
    if kind == "set":
        _, key, value, flags, datatype, expiry, cas_kind = op
        cas = 0
        if cas_kind != "none":
            current = vb.ht.get(key)
            cas = (current.cas if current is not None else 1) + (0 if cas_kind == "current" else 1)
        kwargs = {"flags": flags, "datatype": datatype}
        if expiry:
            kwargs["expiry"] = expiry
        if cas:
            kwargs["cas"] = cas
        return (vb.set if compiled else vb._set_py)(key, value, **kwargs)
    if kind == "delete":
        return vb.delete(op[1])
    if kind == "tick":
        clocks.t += op[1]
        return None
    if kind == "clock_back":
        clocks.t -= op[1]
        return None
    if kind == "lock":
        return vb.get_locked(op[1], 15)
    if kind == "checkpoint":
        return vb.checkpoint_manager.create_checkpoint().id
    if kind == "cursor":
        cm = vb.checkpoint_manager
        return cm.register_cursor(op[1], max(cm.first_seqno - 1, 0)).backfill_required
    if kind == "persist":
        cm = vb.checkpoint_manager
        cursor = cm.persistence_cursor
        batch = cursor.next_batch(10**6)
        vb._dirty.clear()  # as the flusher's collect does
        if batch:
            cm.persisted_seqno = cursor.seqno
            cm._remove_unreferenced()
        return [len(snap.items) for snap in batch]
    if kind == "state":
        entry = vb.set_state(op[1])  # failover UUIDs are random: compare where the entry starts
        return None if entry is None else entry.seqno
    raise AssertionError(kind)


def outcome(vb: VBucket, clocks: Clocks, op: tuple, compiled: bool):
    try:
        return ("ok", step(vb, clocks, op, compiled))
    except (EngineError, ValueError) as e:
        return ("error", type(e).__name__, str(e))


@needs_compiled
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs, max_items=st.sampled_from([3, 10, 10_000]), quota=st.sampled_from([None, None, 600]))
@example(run=[("set", b"a", b"1", 0, 0, 0, "none"), ("delete", b"a"), ("set", b"a", b"2", 0, 0, 0, "none")],
         max_items=10, quota=None)  # a tombstone rewritten: the deleted count goes down again
def test_compiled_set_equals_its_specification(run, max_items, quota):
    sides = []
    for compiled in (True, False):
        clocks = Clocks()
        vb, calls = make(clocks, max_items, quota)
        sides.append((vb, calls, clocks, compiled))
    for op in run:
        results = [outcome(vb, clocks, op, compiled) for vb, _, clocks, compiled in sides]
        assert results[0] == results[1], op
        assert state(sides[0][0], sides[0][1]) == state(sides[1][0], sides[1][1]), op


@needs_compiled
def test_heavy_rewrites_compact_the_open_checkpoint_the_same_way():
    """65+ rewrites of a few keys in one checkpoint make the compiled path call _compact."""
    sides = []
    for compiled in (True, False):
        clocks = Clocks()
        vb, calls = make(clocks, 10_000, None)
        for i in range(300):
            (vb.set if compiled else vb._set_py)(b"key-%d" % (i % 3), b"v%d" % i)
        sides.append(state(vb, calls))
        assert vb.checkpoint_manager.checkpoints[-1]._holes < 65
    assert sides[0] == sides[1]


@needs_compiled
def test_the_compiled_compaction_runs_without_the_python_one(monkeypatch):
    """A checkpoint of Items compacts in C (Checkpoint._compact is its specification, compared
    above); the Python runs only for objects of another shape."""
    from dcpflow.engine.checkpoint import Checkpoint

    def refuse(self):
        raise AssertionError("the Python _compact ran")

    vb, _ = make(Clocks(), 10_000, None)
    monkeypatch.setattr(Checkpoint, "_compact", refuse)
    for i in range(300):
        vb.set(b"key-%d" % (i % 3), b"v%d" % i)
    cp = vb.checkpoint_manager.checkpoints[-1]
    assert cp._holes < 65
    assert [it.key for it in cp._items if it is not None] == [b"key-0", b"key-1", b"key-2"]


@needs_compiled
def test_a_rewrite_keeps_one_key_object_for_the_hash_table_index_and_item():
    """Equal keys from different requests are different objects; the compiled set keeps the first
    one, so the hash table's and the checkpoint index's lookups match by identity."""
    vb, _ = make(Clocks(), 10_000, None)
    first = bytes(bytearray(b"doc-1"))
    vb.set(first, b"1")
    again = bytes(bytearray(b"doc-1"))
    assert again is not first
    item = vb.set(again, b"2")
    assert item.key is first
    assert next(k for k in vb.ht if k == first) is first
    index = vb.checkpoint_manager.checkpoints[-1]._index
    assert next(k for k in index if k == first) is first


@needs_compiled
def test_the_default_clocks_are_read_without_a_call():
    """With the default clocks (time.time_ns for the HLC, time.monotonic for checkpoint age) the
    compiled path reads them itself: the CAS is the wall clock's, and a checkpoint older than its
    max age still rolls over before the next write."""
    import time

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
    time.sleep(0.06)
    vb.set(b"c", b"1")
    assert vb.checkpoint_manager.open_checkpoint.id == opened + 1


@needs_compiled
def test_versions_of_bytes_and_ints_are_not_tracked_by_the_cyclic_gc():
    """The compiled set untracks the Item it makes when every field is bytes or an int (nothing in
    it can lead back to it); the Python twin's Items stay tracked, and so does anything else."""
    import gc

    vb, _ = make(Clocks(), 10_000, None)
    assert not gc.is_tracked(vb.set(b"k", b"v", flags=5, datatype=1))
    assert gc.is_tracked(vb._set_py(b"k", b"w"))
    assert gc.is_tracked(vb.set(b"k", bytearray(b"x")))  # not bytes: left to the collector


@needs_compiled
def test_objects_of_an_unexpected_shape_go_to_the_python_path():
    """A vbucket subclass, a missing slot or a foreign hash table: the Python twin decides."""

    class Special(VBucket):
        __slots__ = ()

    clocks = Clocks()
    vb = Special(1, hlc=HLC(clock=clocks.ns), clock=clocks.wall)
    assert vb.set(b"k", b"v").by_seqno == 1
    plain, _ = make(clocks, 10, None)
    del plain.locks
    with pytest.raises(AttributeError):
        plain.set(b"k", b"v")


@needs_compiled
def test_bad_arguments_get_pythons_errors():
    vb, _ = make(Clocks(), 10, None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'flagz'"):
        vb.set(b"k", b"v", flagz=1)
    with pytest.raises(TypeError):
        vb.set(b"k")
    assert vb.set(b"k", value=b"v").value == b"v"  # positional/keyword mixes go to the Python twin



# -- the flusher's rows -------------------------------------------------------------------------

needs_rows = pytest.mark.skipif(store_mod._encoded_rows_c is None, reason="the compiled engine twin is not built")
u64s = st.one_of(st.integers(0, 5), st.integers(0, (1 << 64) - 1), st.sampled_from([(1 << 63) - 1, 1 << 63]))
wide = st.one_of(u64s, st.integers(-3, -1), st.just(1 << 64), st.integers(0, (1 << 32) + 2))
values_around_large = st.one_of(st.binary(max_size=64),  # LARGE_VALUE and ENCODED_VALUE_LIMIT
                                st.sampled_from([2047, 2048, 2049, 8191, 8192, 8193]).map(bytes))
items = st.builds(
    Item, key=st.binary(min_size=1, max_size=300), value=values_around_large,
    flags=wide, expiry=wide, cas=wide, rev_seqno=wide, by_seqno=wide, datatype=st.one_of(st.integers(0, 7), wide),
    deleted=st.booleans(), delete_time=st.integers(0, 1 << 40),
    delete_source=st.sampled_from([DeleteSource.EXPLICIT, DeleteSource.TTL]))


def _row_outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - the twins must fail alike, whatever the error
        return ("error", type(e).__name__, str(e))


@needs_rows
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vb=st.one_of(st.integers(0, 1023), st.just(70000)), batch=st.lists(items, max_size=8))
def test_compiled_rows_equal_their_specification(vb, batch):
    compiled = _row_outcome(store_mod._encoded_rows, vb, batch)
    python = _row_outcome(store_mod._encoded_rows_py, vb, batch)
    assert compiled == python
    if compiled[0] == "ok":  # the same types too: SQLite binds a bytearray and bytes differently
        for c_row, py_row in zip(compiled[1], python[1], strict=True):
            assert [type(v) for v in c_row] == [type(v) for v in py_row]


@needs_rows
def test_rows_of_a_plain_mutation_carry_its_dcp_message():
    it = Item(b"key", b"value", 0x01020304, 0, 0x1122334455667788, 9, 42, 1)
    (row,) = store_mod._encoded_rows(3, [it])
    assert row[12] == dcpproto.DcpMutation(3, 42, 9, 0x01020304, 0, 0, b"key", b"value", 0x1122334455667788, 1,
                                           0).encode()
    assert row[:12] == (3, bytearray(b"key"), 42, 9, 0x1122334455667788, 0x01020304, 0, 1, 0, 0, 0,
                        bytearray())  # the value lives in the message
    deleted = Item(b"key", b"", cas=1, by_seqno=43, deleted=True)
    assert store_mod._encoded_rows(3, [deleted])[0][11:] == (bytearray(), None)


@needs_rows
@pytest.mark.parametrize("field, value", [
    ("flags", 1 << 32), ("expiry", 1 << 32), ("datatype", 256), ("datatype", -1), ("cas", 1 << 64), ("cas", -1),
    ("rev_seqno", 1 << 64), ("by_seqno", 1 << 63), ("key", b"k" * 65535), ("vb", 1 << 16)])
def test_one_field_out_of_range_fails_alike(field, value):
    """A plain mutation with one field that does not fit its column or the DCP head."""
    vb = value if field == "vb" else 5
    fields = {"key": b"key", "value": b"v", "flags": 1, "expiry": 2, "cas": 3, "rev_seqno": 4, "by_seqno": 5,
              "datatype": 0}
    if field != "vb":
        fields[field] = value
    batch = [Item(**fields)]
    assert _row_outcome(store_mod._encoded_rows, vb, batch) == _row_outcome(store_mod._encoded_rows_py, vb, batch)
