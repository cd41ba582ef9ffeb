"""The flusher: moves changes from each vbucket's persistence cursor to the store, in batches.

A flush has three steps so the slow one can leave the owner thread:

1. `collect(max_items)` (owner thread): read the persistence cursors of dirty vbuckets
   round-robin, up to about `max_items` items, and build a FlushBatch (items + the vbucket-state
   rows to write with them). Only one batch is in flight at a time.
2. `write(batch)` (any thread): one SQLite transaction. It touches no engine state - items are
   immutable - so an asyncio server may run it with `loop.run_in_executor`. A batch that leaves
   more to flush (`behind`) is written without backfill runs (store.py, "Runs"): then the disk
   writes each value once, and the idle flusher cuts the runs later.
3. `complete(batch)` (owner thread): advance each vbucket's persisted seqno and snapshot, let the
   checkpoint manager release what is now durable, and tell persistence listeners.
   If the write failed, `abort(batch)` rewinds the persistence cursors instead; nothing was lost
   because checkpoints above the persisted seqno are never released.

`flush(max_items)` does all three inline and returns quickly (bounded batch): an asyncio server
can simply call it from a periodic callback every `flush_interval` seconds.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .durability.items import Abort, Commit, Prepare, is_sync_item
from .item import Item
from .store import Store, VBucketStateRecord

if TYPE_CHECKING:
    from .vbucket import VBucket


@dataclass(slots=True)
class VBucketFlush:
    vb: "VBucket"
    items: list[Item]
    snap_start: int  # the snapshot the last item belongs to: the persisted snapshot
    snap_end: int
    ranges: list[tuple[int, int]] = field(default_factory=list)  # every snapshot the items belong to
    sync_items: list[Item] = field(default_factory=list)  # prepares, commits, aborts (durability/items.py)
    hps: int = 0  # the high prepared / completed seqnos once the batch is on disk
    hcs: int = 0
    mvs: int = 0  # with sync items: the highest seqno of a visible version in the batch (0: none)

    @property
    def high_seqno(self) -> int:
        return self.items[-1].by_seqno

    @property
    def stored(self) -> list[Item]:
        """The versions the items table takes: not the prepares and aborts."""
        if not self.sync_items:
            return self.items
        return [it for it in self.items if not is_sync_item(it)]


def _split_sync(entry: VBucketFlush) -> None:
    """The batch's prepares, commits and aborts, and the high prepared/completed seqnos they make."""
    for it in entry.items:
        cls = it.__class__
        if cls is Prepare:
            entry.sync_items.append(it)
            entry.hps = max(entry.hps, it.by_seqno)
        elif cls is Commit or cls is Abort:
            entry.sync_items.append(it)
            entry.hcs = max(entry.hcs, it.prepared_seqno)
        if cls is not Prepare and cls is not Abort:
            entry.mvs = it.by_seqno


@dataclass(slots=True)
class FlushBatch:
    entries: list[VBucketFlush]
    states: list[VBucketStateRecord] = field(default_factory=list)
    #: The batch is full and more is left to flush: the store defers its runs (Store.write).
    behind: bool = False

    @property
    def num_items(self) -> int:
        return sum(len(e.items) for e in self.entries)


class Flusher:
    """Persists the bucket's vbuckets; see the module docstring."""

    def __init__(self, store: Store, vbuckets: dict[int, "VBucket"], *,
                 on_persisted: Callable[[int, int], None] | None = None,
                 on_complete: Callable[[], None] | None = None):
        """`on_persisted(vb, seqno)` for each vbucket of a completed batch, then `on_complete()`."""
        self.store = store
        self._on_complete = on_complete
        self._vbuckets = vbuckets
        self._dirty: dict[int, None] = {}  # insertion-ordered set, rotated for fairness
        self._state_dirty: set[int] = set()
        self._on_persisted = on_persisted
        self.in_flight: FlushBatch | None = None
        self.items_flushed = 0
        self.batches_flushed = 0

    def mark_dirty(self, vbid: int) -> None:
        """A vbucket queued something. Assigning an existing key keeps its place in the dict, so no
        membership test is needed."""
        self._dirty[vbid] = None

    @property
    def dirty(self) -> dict[int, None]:
        """The dirty vbuckets: each vbucket adds its id on every write (`dirty[vbid] = None`, what
        `mark_dirty` does, without a call)."""
        return self._dirty

    def persist_state(self, vb: "VBucket") -> None:
        """Write a vbucket's state row now (state change); deferred while a batch is in flight,
        so an older row in that batch cannot overwrite it."""
        if self.in_flight is not None:
            self._state_dirty.add(vb.id)
        else:
            self.store.save_vbucket_states([vb.state_record()])

    def collect(self, max_items: int = 10_000, vbids: list[int] | None = None) -> FlushBatch | None:
        if self.in_flight is not None:
            raise RuntimeError("a flush batch is already in flight")
        entries: list[VBucketFlush] = []
        states: list[VBucketStateRecord] = []
        n = 0
        for vbid in list(self._dirty) if vbids is None else vbids:
            vb = self._vbuckets.get(vbid)
            self._dirty.pop(vbid, None)
            if vb is None or vb.checkpoint_manager.persistence_cursor is None:
                continue
            cursor = vb.checkpoint_manager.persistence_cursor
            snaps = cursor.next_batch(max(max_items - n, 1))
            if cursor.has_items():
                self._dirty[vbid] = None  # back of the queue
            if not snaps:
                continue
            items = [it for snap in snaps for it in snap.items]
            entry = VBucketFlush(vb, items, snaps[-1].start, snaps[-1].end, [(s.start, s.end) for s in snaps])
            entry.hps, entry.hcs = vb.persisted_hps, vb.persisted_hcs
            if any(s.sync for s in snaps):
                _split_sync(entry)
            entries.append(entry)
            record = vb.state_record()
            record.high_seqno = record.max_visible_seqno = entry.high_seqno
            record.snap_start, record.snap_end = entry.snap_start, entry.snap_end
            record.hps, record.hcs = entry.hps, entry.hcs
            if entry.sync_items:
                record.max_visible_seqno = entry.mvs or vb.persisted_mvs
            vb.persisted_mvs = record.max_visible_seqno
            states.append(record)
            n += len(items)
            if n >= max_items:
                break
        if not entries:
            return None
        self.in_flight = FlushBatch(entries, states, n >= max_items and bool(self._dirty))
        return self.in_flight

    def write(self, batch: FlushBatch) -> None:
        """The durable part; safe to run on another thread."""
        self.store.write(((e.vb.id, e.stored) for e in batch.entries), batch.states,
                         [(e.vb.id, start, end) for e in batch.entries for start, end in e.ranges],
                         [(e.vb.id, e.sync_items) for e in batch.entries if e.sync_items], cut_runs=not batch.behind)

    def complete(self, batch: FlushBatch) -> None:
        self._check(batch)
        self.in_flight = None
        for e in batch.entries:
            vb = e.vb
            vb.persisted_seqno = e.high_seqno
            vb.persisted_snapshot = (e.snap_start, e.snap_end)
            vb.checkpoint_manager.set_persisted(e.high_seqno)
            vb.persisted(e.high_seqno, e.hps, e.hcs)
            if vb.adm is not None and vb.adm.tracked:  # a level that waited for this persistence
                vb.complete_sync_writes()
        self.items_flushed += batch.num_items
        self.batches_flushed += 1
        self._write_deferred_states()
        if self._on_persisted is not None:
            for e in batch.entries:
                self._on_persisted(e.vb.id, e.high_seqno)
        if self._on_complete is not None:
            self._on_complete()

    def abort(self, batch: FlushBatch) -> None:
        """The write failed: rewind so the same items are flushed again."""
        self._check(batch)
        self.in_flight = None
        for e in batch.entries:
            manager = e.vb.checkpoint_manager
            if manager.persistence_cursor is not None:
                manager.reposition_cursor(manager.persistence_cursor, e.vb.persisted_seqno)
            self.mark_dirty(e.vb.id)
        self._write_deferred_states()

    def _check(self, batch: FlushBatch) -> None:
        if batch is not self.in_flight:
            raise RuntimeError("that batch is not the one in flight")

    def _write_deferred_states(self) -> None:
        if self._state_dirty:
            vbs = [self._vbuckets[v] for v in sorted(self._state_dirty) if v in self._vbuckets]
            self._state_dirty.clear()
            self.store.save_vbucket_states([vb.state_record() for vb in vbs])

    def flush(self, max_items: int = 10_000, vbids: list[int] | None = None) -> int:
        """Collect, write and complete one batch; returns the number of items persisted."""
        batch = self.collect(max_items, vbids)
        if batch is None:
            return 0
        try:
            self.write(batch)
        except BaseException:
            self.abort(batch)
            raise
        self.complete(batch)
        return batch.num_items

    def flush_all(self, max_items: int = 10_000) -> int:
        """Flush until nothing is left (clean shutdown, before a rollback)."""
        total = 0
        while n := self.flush(max_items):
            total += n
        return total

    def flush_vbucket(self, vbid: int, max_items: int = 10_000) -> int:
        total = 0
        while n := self.flush(max_items, [vbid]):
            total += n
        return total
