"""CheckpointManager: de-duplication, closing, cursors, snapshots, removal and cursor dropping."""

import pytest

from dcpflow.engine import CheckpointManager, CheckpointType, CursorDropped, Item


class Seq:
    """Feeds items with increasing seqnos into a manager."""

    def __init__(self, manager, start=0):
        self.m = manager
        self.seqno = start

    def put(self, key, value=b"v", seqno=None):
        self.seqno = self.seqno + 1 if seqno is None else seqno
        item = Item(key if isinstance(key, bytes) else key.encode(), value, by_seqno=self.seqno)
        self.m.queue(item)
        return item


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def mem(hold=False, **kw):
    """A manager without persistence; `hold` parks a cursor at 0 so nothing is released."""
    kw.setdefault("persistent", False)
    kw.setdefault("max_age", None)
    m = CheckpointManager(**kw)
    if hold:
        m.register_cursor("hold", 0)
    return m


def keys(snap):
    return [(it.key.decode(), it.by_seqno) for it in snap.items]


def read_all(cursor, limit=10**6):
    return [(s.start, s.end, s.checkpoint_start, s.new_marker, keys(s)) for s in cursor.next_batch(limit)]


# -- de-duplication and closing ------------------------------------------------------------------

def test_open_checkpoint_keeps_latest_version_of_each_key_in_seqno_order():
    m = mem()
    q = Seq(m)
    for k in "abacb":
        q.put(k)
    assert [(it.key, it.by_seqno) for it in m.open_checkpoint.items()] == [(b"a", 3), (b"c", 4), (b"b", 5)]
    assert m.num_items == 3 and m.high_seqno == 5


def test_no_deduplication_across_a_closed_checkpoint():
    m = mem(hold=True)
    q = Seq(m)
    q.put("a")
    m.create_checkpoint()
    q.put("a")
    assert [len(cp.items()) for cp in m.checkpoints] == [1, 1]


def test_heavy_deduplication_compacts_holes_and_reads_stay_correct():
    m = mem()
    q = Seq(m)
    c = m.register_cursor("c", 0).cursor
    for i in range(1000):
        q.put(f"k{i % 3}")
    assert len(m.open_checkpoint._items) < 200  # holes were compacted away
    assert read_all(c) == [(1, 1000, True, True, [("k1", 998), ("k2", 999), ("k0", 1000)])]


def test_closes_at_max_items_counting_unique_keys():
    m = mem(hold=True, max_items=3)
    q = Seq(m)
    for k in "aab":
        q.put(k)
    assert len(m.checkpoints) == 1  # a was de-duplicated: 2 items
    q.put("c")
    q.put("d")
    assert [len(cp.items()) for cp in m.checkpoints] == [3, 1]
    assert not m.checkpoints[0].is_open and m.open_checkpoint.items()[0].key == b"d"


def test_closes_after_max_age():
    clock = Clock()
    m = mem(hold=True, max_age=5.0, clock=clock)
    q = Seq(m)
    q.put("a")
    clock.now += 4.9
    q.put("b")
    assert len(m.checkpoints) == 1
    clock.now += 0.2
    q.put("c")
    assert [len(cp.items()) for cp in m.checkpoints] == [2, 1]


def test_close_on_demand_sets_snapshot_ranges():
    m = mem(hold=True)
    q = Seq(m)
    q.put("a")
    q.put("b")
    m.create_checkpoint()
    q.put("c")
    first, second = m.checkpoints
    assert (first.snap_start, first.snap_end, first.type) == (1, 2, CheckpointType.MEMORY)
    assert (second.snap_start, second.snap_end, second.first_seqno) == (3, 3, 3)


def test_queue_rejects_non_increasing_seqno():
    m = mem()
    Seq(m).put("a", seqno=5)
    with pytest.raises(ValueError):
        m.queue(Item(b"b", b"", by_seqno=5))


# -- cursors and snapshots ------------------------------------------------------------------------

def test_cursor_reads_one_snapshot_per_checkpoint_with_checkpoint_flag_at_boundaries():
    m = mem()
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    q.put("a")
    q.put("b")
    m.create_checkpoint()
    q.put("c")
    assert read_all(c) == [(1, 2, True, True, [("a", 1), ("b", 2)]), (3, 3, True, True, [("c", 3)])]
    assert read_all(c) == []
    q.put("d")
    # more of the same open checkpoint: a new snapshot, not a checkpoint boundary
    assert read_all(c) == [(4, 4, False, True, [("d", 4)])]


def test_snapshot_type_comes_from_the_checkpoint():
    m = mem()
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    m.create_checkpoint(1, 10, CheckpointType.DISK)
    q.put("a")
    m.create_checkpoint(11, 11, CheckpointType.MEMORY)
    q.put("b", seqno=11)
    assert [s.type for s in c.next_batch()] == [CheckpointType.DISK, CheckpointType.MEMORY]


def test_cursor_registered_mid_checkpoint_starts_after_its_seqno():
    m = mem()
    q = Seq(m)
    for k in "abcd":
        q.put(k)
    reg = m.register_cursor("dcp", 2)
    assert not reg.backfill_required
    assert read_all(reg.cursor) == [(3, 4, False, True, [("c", 3), ("d", 4)])]


def test_cursor_registered_at_a_checkpoint_boundary_gets_the_checkpoint_flag():
    m = mem()
    q = Seq(m)
    q.put("a")
    q.put("b")
    m.create_checkpoint()
    q.put("c")
    reg = m.register_cursor("dcp", 2)
    assert read_all(reg.cursor) == [(3, 3, True, True, [("c", 3)])]


def test_deduplicated_older_version_is_not_seen_by_a_cursor_behind_it():
    m = mem()
    q = Seq(m)
    behind = m.register_cursor("behind", 0).cursor
    q.put("a")
    q.put("b")
    ahead = m.register_cursor("ahead", 2).cursor
    read_all(ahead)
    q.put("a")  # replaces a@1 in the open checkpoint
    assert read_all(behind) == [(1, 3, True, True, [("b", 2), ("a", 3)])]
    assert read_all(ahead) == [(3, 3, False, True, [("a", 3)])]


def test_open_checkpoint_is_read_whole_despite_limit():
    m = mem()
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    for i in range(10):
        q.put(f"k{i}")
    snaps = c.next_batch(limit=3)
    assert len(snaps) == 1 and len(snaps[0].items) == 10 and (snaps[0].start, snaps[0].end) == (1, 10)


def test_closed_checkpoint_is_split_by_limit_and_continued_without_a_new_marker():
    m = mem()
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    for i in range(5):
        q.put(f"k{i}")
    m.create_checkpoint()
    q.put("x")
    assert read_all(c, 2) == [(1, 5, True, True, [("k0", 1), ("k1", 2)])]
    assert read_all(c, 2) == [(1, 5, False, False, [("k2", 3), ("k3", 4)])]
    # finishes the split snapshot, then moves on to the next checkpoint in the same batch
    assert read_all(c, 2) == [(1, 5, False, False, [("k4", 5)]), (6, 6, True, True, [("x", 6)])]


def test_limit_stops_at_checkpoint_boundaries():
    m = mem(max_items=2)
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    for i in range(6):
        q.put(f"k{i}")
    batch = c.next_batch(limit=3)
    assert [len(s.items) for s in batch] == [2, 1]
    assert [len(s.items) for s in c.next_batch(limit=3)] == [1, 2]


def test_register_beyond_high_seqno_is_refused():
    m = mem()
    with pytest.raises(ValueError):
        m.register_cursor("dcp", 1)


def test_register_replaces_a_cursor_of_the_same_name():
    m = mem()
    q = Seq(m)
    q.put("a")
    m.register_cursor("dcp", 0)
    m.register_cursor("dcp", 1)
    assert list(m.cursors) == ["dcp"] and m.cursors["dcp"].seqno == 1


def test_backfill_required_when_memory_no_longer_has_start_plus_one():
    m = mem(max_items=2)
    q = Seq(m)
    for i in range(7):
        q.put(f"k{i}")  # checkpoints [1,2] [3,4] [5,6] are closed and, with no cursor, released
    assert m.first_seqno == 7
    reg = m.register_cursor("dcp", 3)
    assert reg.backfill_required and (reg.backfill_start, reg.backfill_end) == (4, 6)
    # after the backfill, memory continues exactly at first_seqno with a checkpoint marker
    assert read_all(reg.cursor) == [(7, 7, True, True, [("k6", 7)])]


def test_register_at_high_seqno_needs_no_backfill():
    m = mem(max_items=2)
    q = Seq(m)
    for i in range(7):
        q.put(f"k{i}")
    reg = m.register_cursor("dcp", 7)
    assert not reg.backfill_required and read_all(reg.cursor) == []
    q.put("n")
    assert read_all(reg.cursor) == [(8, 8, False, True, [("n", 8)])]


# -- memory bounding ------------------------------------------------------------------------------

def test_closed_checkpoints_are_released_once_no_cursor_is_in_or_before_them():
    m = mem(max_items=2)
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    for i in range(6):
        q.put(f"k{i}")
    assert len(m.checkpoints) == 3
    c.next_batch(limit=2)  # consumes [1,2], moves into [3,4]
    assert [cp.snap_start for cp in m.checkpoints] == [3, 5]
    c.next_batch()
    assert len(m.checkpoints) == 1
    mem_before = m.mem_usage
    c.close()
    assert m.mem_usage == mem_before == sum(cp.mem_usage for cp in m.checkpoints)


def test_persistent_manager_keeps_unpersisted_checkpoints_even_without_cursors():
    m = CheckpointManager(max_items=2, max_age=None)
    q = Seq(m)
    for i in range(5):
        q.put(f"k{i}")
    p = m.persistence_cursor
    p.next_batch(limit=4)  # the flusher read [1,2] and [3,4] but has not committed yet
    assert len(m.checkpoints) == 3
    m.set_persisted(2)
    assert [cp.snap_start for cp in m.checkpoints] == [3, 5]
    m.set_persisted(4)
    assert [cp.snap_start for cp in m.checkpoints] == [5]


def test_reposition_cursor_replays_unpersisted_items():
    m = CheckpointManager(max_items=2, max_age=None)
    q = Seq(m)
    for i in range(5):
        q.put(f"k{i}")
    p = m.persistence_cursor
    first = [it.by_seqno for s in p.next_batch(limit=4) for it in s.items]
    m.reposition_cursor(p, 0)
    assert [it.by_seqno for s in p.next_batch(limit=4) for it in s.items] == first == [1, 2, 3, 4]


def test_cursor_dropping_frees_memory_and_tells_the_owner():
    dropped = []
    m = CheckpointManager(max_items=2, max_age=None, memory_quota=2000)
    q = Seq(m)
    slow = m.register_cursor("slow", 0, on_drop=dropped.append).cursor
    p = m.persistence_cursor
    for i in range(4):
        q.put(f"k{i}", b"x" * 100)
        p.next_batch()
        m.set_persisted(q.seqno)
    assert not dropped
    for i in range(4, 12):
        q.put(f"k{i}", b"x" * 100)
        p.next_batch()
        m.set_persisted(q.seqno)
    assert dropped == [slow] and slow.dropped and "slow" not in m.cursors
    assert m.mem_usage <= 2000
    with pytest.raises(CursorDropped):
        slow.next_batch()
    # the owner falls back to backfill by registering again
    reg = m.register_cursor("slow", 0)
    assert reg.backfill_required


def test_persistence_cursor_is_never_dropped():
    m = CheckpointManager(max_items=2, max_age=None, memory_quota=10)
    q = Seq(m)
    for i in range(10):
        q.put(f"k{i}", b"x" * 100)
    assert m.persistence_cursor is not None and not m.persistence_cursor.dropped
    assert len(m.checkpoints) == 5  # nothing persisted, nothing released


def test_reset_drops_stream_cursors_and_restarts_at_seqno():
    dropped = []
    m = CheckpointManager(max_age=None)
    q = Seq(m)
    for k in "abc":
        q.put(k)
    m.register_cursor("dcp", 0, on_drop=dropped.append)
    m.reset(1)
    assert [c.name for c in dropped] == ["dcp"]
    assert m.high_seqno == 1 and m.num_items == 0 and m.persistence_cursor.seqno == 1
    Seq(m, 1).put("z")
    assert [it.by_seqno for s in m.persistence_cursor.next_batch() for it in s.items] == [2]


# -- replica checkpoints ----------------------------------------------------------------------------

def test_replica_snapshot_end_is_fixed_and_delivery_continues_as_items_arrive():
    m = mem()
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    m.create_checkpoint(1, 5, CheckpointType.DISK)
    q.put("a")
    q.put("b")
    assert read_all(c) == [(1, 5, True, True, [("a", 1), ("b", 2)])]
    q.put("c")
    assert read_all(c) == [(1, 5, False, False, [("c", 3)])]  # same snapshot, no new marker
    m.create_checkpoint(6, 8, CheckpointType.MEMORY)
    q.put("d", seqno=6)
    assert read_all(c) == [(6, 8, True, True, [("d", 6)])]


def test_oversized_replica_snapshot_rolls_into_continuation_checkpoints():
    m = mem(max_items=2)
    q = Seq(m)
    c = m.register_cursor("dcp", 0).cursor
    m.create_checkpoint(1, 5, CheckpointType.DISK)
    for k in "abcde":
        q.put(k)
    assert len(m.checkpoints) >= 3
    snaps = c.next_batch()
    assert [s.new_marker for s in snaps] == [True, False, False]
    assert all((s.start, s.end) == (1, 5) for s in snaps)
    assert [it.key for s in snaps for it in s.items] == [b"a", b"b", b"c", b"d", b"e"]


def test_replica_marker_start_below_high_seqno_does_not_hide_earlier_items():
    """A first marker may start at the consumer's snapshot start (min rule), below what the
    replica already holds; a cursor registered inside that range must still see every seqno."""
    m = mem(hold=True)
    q = Seq(m)
    m.create_checkpoint(1, 3, CheckpointType.MEMORY)
    for k in "abc":
        q.put(k)
    m.create_checkpoint(2, 6, CheckpointType.DISK)  # starts at 2 although 3 is already held
    q.put("d")
    reg = m.register_cursor("dcp", 1)
    assert not reg.backfill_required
    got = [it.by_seqno for s in reg.cursor.next_batch() for it in s.items]
    assert got == [2, 3, 4]
