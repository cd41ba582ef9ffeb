"""CheckpointManager: the in-memory, de-duplicated, seqno-ordered queue of a vbucket's changes.

Reference: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/concepts.md
(point-in-time snapshots, de-duplication, cursor dropping). A stream reads memory while the
checkpoints still hold its next seqno; otherwise it backfills from disk up to the first seqno
memory holds, then switches to memory.

Every mutation of a vbucket is queued into the *open* checkpoint. Within the open checkpoint a
newer version of a key replaces the older one (the older slot becomes a hole), so a checkpoint
holds at most one version per key, in seqno order - a key of its collection: (cid, key) for any
collection but the default one. Two kinds are never de-duplicated: the collections system events
(engine/collections.py) and the documents of collections that keep history (`history_cids`, DCP
change streams): a checkpoint holding those says so (`Snapshot.history`), and whether one of their
keys came more than once (`Snapshot.duplicates`), which a change stream's snapshot marker carries
as its History and May Duplicate Keys flags (snapshot-marker.md). The open checkpoint is closed (and a new one
opened) when it holds `max_items` items, when it is older than `max_age` seconds, or on demand
(a replica closes one per snapshot marker). Closed checkpoints never change. Sync-write items
(durability/items.py) are queued too: prepares and aborts with `queue_sync`, never
de-duplicated and never replacing the key's version; a checkpoint holding any (or a commit) says
so (`Snapshot.sync`), with the highest seqno readers without sync writes see
(`Snapshot.visible_end`, the max visible seqno of its snapshot).

Consumers read through named **cursors**: the flusher's persistence cursor and one per DCP
stream. `register_cursor(name, start_seqno)` places a cursor so that its first read returns
start+1 onwards, or reports that memory no longer holds start+1 and the caller must backfill
[start+1, first_seqno-1] from disk first (the cursor is then parked at the oldest checkpoint, so
memory continues exactly where the backfill ends). `Cursor.next_batch(limit)` returns
`Snapshot`s - one per checkpoint read - so an ActiveStream can emit one snapshot marker per
`Snapshot` (type Memory/Disk from the checkpoint, plus the Checkpoint flag when
`checkpoint_start`), followed by its items:

    for snap in cursor.next_batch(limit):
        if snap.new_marker:
            send_marker(snap.start, snap.end, snap.type, snap.checkpoint_start)
        for item in snap.items: send(item)

A memory snapshot taken from the *open* checkpoint is always returned whole (every item up to
the newest), because de-duplication keeps rewriting the open checkpoint and only an atomic read
is a consistent point-in-time snapshot. A closed checkpoint, or a replica checkpoint whose end
was fixed by a snapshot marker, may be split by `limit`: later batches continue the same snapshot
with `new_marker=False` (send no marker for those). A replica snapshot whose items have not all
arrived is returned with `end` beyond the last item; the stream simply keeps sending as the
items arrive.

Memory stays bounded: a closed checkpoint with no cursor in it or before it (and, for a
persistent vbucket, fully persisted) is released, and the open checkpoint is closed once it holds
`max_bytes` (the bucket's checkpoint_max_size, memory.py) so that what it holds can be released.
When this vbucket's checkpoint memory exceeds `memory_quota`, droppable cursors that pin old
checkpoints are *dropped* (never the persistence cursor); the owner's `on_drop` callback is told
so it can fall back to a disk backfill, and the dropped cursor raises `CursorDropped` if read
again. Every manager of a bucket also counts its memory in the bucket's `BucketMemory`
(`account`), whose checkpoint quota the bucket enforces across vbuckets
(Bucket.recover_checkpoint_memory: `release_for_memory` here).

Single-threaded: the manager belongs to the engine's owner thread (see bucket.py).
"""

import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from .collections import SYSTEM_CID
from .durability.items import is_sync_item
from .item import ITEM_OVERHEAD, Item
from .memory import BucketMemory

_NEVER = float("inf")

PERSISTENCE_CURSOR = "persistence"


class CheckpointType(IntEnum):
    """Memory checkpoints hold point-in-time snapshots; Disk ones came from a disk snapshot."""

    MEMORY = 0
    DISK = 1


class CursorDropped(Exception):
    """Raised when reading a cursor the manager dropped to free memory: backfill instead."""


@dataclass(slots=True)
class Snapshot:
    """Items a cursor read from one checkpoint, with the snapshot range they belong to."""

    start: int
    end: int
    type: CheckpointType
    checkpoint_start: bool  # the cursor entered a new checkpoint: the marker gets the Checkpoint flag
    new_marker: bool  # False: continues a snapshot whose marker an earlier batch already produced
    items: list[Item] = field(default_factory=list)
    checkpoint_snap_start: int = 0  # the checkpoint's own snapshot start (Disk markers start there)
    history: bool = False  # holds versions of a collection that keeps history (not de-duplicated)
    duplicates: bool = False  # ... and one of their keys more than once
    others: bool = False  # holds items of other collections than the default one, or system events
    sync: bool = False  # holds sync-write items (durability/items.py): prepares, commits, aborts
    visible_end: int = 0  # with `sync`: the highest seqno up to `end` that is not a prepare or abort

    @property
    def max_visible_seqno(self) -> int:
        return self.visible_end if self.sync else self.end


class Checkpoint:
    """One checkpoint: items in seqno order, de-duplicated by key while open."""

    __slots__ = ("id", "type", "first_seqno", "snap_start", "snap_end", "fixed_end", "continuation",
                 "is_open", "created", "deadline", "num_items", "mem_usage", "high_seqno", "_items",
                 "_seqnos", "_index", "_holes", "history", "duplicates", "_history_keys", "others", "sync")

    def __init__(self, cid: int, ctype: CheckpointType, first_seqno: int, snap_start: int,
                 snap_end: int, *, fixed_end: bool, continuation: bool = False, created: float = 0.0):
        self.id = cid
        self.type = ctype
        self.first_seqno = first_seqno  # lowest seqno this checkpoint can hold (high seqno + 1 at creation)
        self.snap_start = snap_start
        self.snap_end = snap_end
        self.fixed_end = fixed_end  # end set by a snapshot marker (replica) instead of growing
        self.continuation = continuation  # same snapshot as the previous checkpoint (split for size)
        self.is_open = True
        self.created = created
        self.deadline = _NEVER  # when a growing checkpoint is old enough to close (set by its manager)
        self.num_items = 0
        self.mem_usage = 0
        self.high_seqno = first_seqno - 1
        self._items: list[Item | None] = []
        self._seqnos: list[int] = []
        self._index: dict[bytes, int] | None = {}
        self._holes = 0
        self.history = self.duplicates = self.others = self.sync = False
        self._history_keys: set | None = None

    def __repr__(self) -> str:
        state = "open" if self.is_open else "closed"
        return (f"<Checkpoint {self.id} {self.type.name} {state} [{self.snap_start},{self.snap_end}] "
                f"items={self.num_items}>")

    def _compact(self) -> None:
        """Drop holes left by de-duplication (cursors hold seqnos, not indexes, so none move)."""
        self._items = [it for it in self._items if it is not None]
        self._seqnos = [it.by_seqno for it in self._items]
        if self._index is not None:
            self._index = {(it.key if not it.cid else (it.cid, it.key)): i for i, it in enumerate(self._items)
                           if it.cid != SYSTEM_CID}
        self._holes = 0

    def close(self) -> None:
        self.is_open = False
        self._index = None  # de-duplication only happens in the open checkpoint

    def read(self, after: int, upto: int, limit: int | None) -> list[Item]:
        """Items with after < seqno <= upto in seqno order, at most `limit` (None = all)."""
        items, seqnos = self._items, self._seqnos
        i = bisect_right(seqnos, after)
        j = bisect_right(seqnos, upto, i)
        if limit is None:
            return [it for it in items[i:j] if it is not None]
        out: list[Item] = []
        while i < j and len(out) < limit:  # slices, not a step per item: de-dup leaves None holes
            k = min(j, i + limit - len(out))
            out += [it for it in items[i:k] if it is not None]
            i = k
        return out

    def has_items_after(self, seqno: int) -> bool:
        items = self._items
        return any(items[i] is not None for i in range(bisect_right(self._seqnos, seqno), len(items)))

    def items(self) -> list[Item]:
        return [it for it in self._items if it is not None]

    def visible_upto(self, seqno: int) -> int:
        """The highest seqno <= `seqno` of an item that is not a prepare or an abort (0: none)."""
        items = self._items
        for i in range(bisect_right(self._seqnos, seqno) - 1, -1, -1):
            it = items[i]
            if it is not None and not is_sync_item(it):
                return it.by_seqno
        return 0


class Cursor:
    """A named reader position: `seqno` is the last seqno it has read."""

    __slots__ = ("name", "manager", "checkpoint", "seqno", "droppable", "on_drop", "dropped",
                 "_snap_start", "_snap_end")

    def __init__(self, name: str, manager: "CheckpointManager", checkpoint: Checkpoint, seqno: int, *,
                 droppable: bool, on_drop: Callable[["Cursor"], None] | None):
        self.name = name
        self.manager = manager
        self.checkpoint = checkpoint
        self.seqno = seqno
        self.droppable = droppable
        self.on_drop = on_drop
        self.dropped = False
        self._snap_start = 0
        self._snap_end: int | None = None  # set while a split snapshot is only partly delivered

    def __repr__(self) -> str:
        return f"<Cursor {self.name!r} seqno={self.seqno} checkpoint={self.checkpoint.id}>"

    def next_batch(self, limit: int = 1000) -> list[Snapshot]:
        """Read onwards: up to about `limit` items, one `Snapshot` per checkpoint touched.

        Stops at `limit` except inside the open checkpoint of an active vbucket, which is
        always read to its newest item (bounded by the checkpoint's max items) so the snapshot
        is point-in-time consistent, and except for the persistence cursor, which never stops
        inside a checkpoint (see `_read`). Returns [] when there is nothing new.
        """
        return self.manager._read(self, limit)

    def has_items(self) -> bool:
        if self.dropped:
            return False
        return self.seqno < self.manager.high_seqno

    def close(self) -> None:
        self.manager.remove_cursor(self)


@dataclass(frozen=True, slots=True)
class CursorRegistration:
    """Result of `register_cursor`: when `backfill_required`, read [backfill_start,
    backfill_end] from disk first (clamp to the stream's end), then read the cursor."""

    cursor: Cursor
    backfill_required: bool
    backfill_start: int = 0
    backfill_end: int = 0


class CheckpointManager:
    """The checkpoints and cursors of one vbucket."""

    __slots__ = ("max_items", "max_age", "max_bytes", "memory_quota", "account", "persistent", "_clock", "_next_id",
                 "checkpoints", "cursors", "high_seqno", "mem_usage", "num_dropped_cursors", "persisted_seqno",
                 "persistence_cursor", "history_cids", "on_drop")

    def __init__(self, *, high_seqno: int = 0, max_items: int = 10_000, max_age: float | None = 5.0,
                 max_bytes: float = _NEVER, memory_quota: int | None = None, account: BucketMemory | None = None,
                 persistent: bool = True, clock: Callable[[], float] = time.monotonic):
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.max_items = max_items
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.memory_quota = memory_quota
        self.account = account if account is not None else BucketMemory()
        self.persistent = persistent
        self._clock = clock
        self._next_id = 1
        self.checkpoints: list[Checkpoint] = []
        self.cursors: dict[str, Cursor] = {}
        self.high_seqno = high_seqno
        self.mem_usage = 0
        self.num_dropped_cursors = 0
        self.persisted_seqno = high_seqno  # closed checkpoints above this are kept for the flusher
        self.history_cids: frozenset[int] = frozenset()  # collections whose versions are all kept
        # told of every cursor dropped here, after the cursor's own `on_drop` (the bucket sets it:
        # its cursor listeners, bucket_listeners.py)
        self.on_drop: Callable[[Cursor], None] | None = None
        self._open(CheckpointType.MEMORY, high_seqno + 1, high_seqno + 1, high_seqno, fixed_end=False)
        self.persistence_cursor: Cursor | None = None
        if persistent:
            self.persistence_cursor = self.register_cursor(PERSISTENCE_CURSOR, high_seqno,
                                                           droppable=False).cursor

    # -- checkpoints ------------------------------------------------------------------------
    @property
    def open_checkpoint(self) -> Checkpoint:
        return self.checkpoints[-1]

    @property
    def first_seqno(self) -> int:
        """Lowest seqno memory can serve; anything below must come from disk."""
        return self.checkpoints[0].first_seqno

    @property
    def num_items(self) -> int:
        return sum(cp.num_items for cp in self.checkpoints)

    def _open(self, ctype: CheckpointType, first_seqno: int, snap_start: int, snap_end: int, *,
              fixed_end: bool, continuation: bool = False) -> Checkpoint:
        cp = Checkpoint(self._next_id, ctype, first_seqno, snap_start, snap_end, fixed_end=fixed_end,
                        continuation=continuation, created=self._clock())
        if not fixed_end and self.max_age is not None:
            cp.deadline = cp.created + self.max_age
        self._next_id += 1
        self.checkpoints.append(cp)
        return cp

    def create_checkpoint(self, snap_start: int | None = None, snap_end: int | None = None,
                          ctype: CheckpointType = CheckpointType.MEMORY) -> Checkpoint:
        """Close the open checkpoint and open a new one.

        With no range (active vbucket, or closing on demand) the new checkpoint is a Memory one
        whose snapshot end grows with each item. With a range (a replica's snapshot marker) the
        end is fixed and `ctype` says whether it came from a memory or a disk snapshot.
        """
        old = self.open_checkpoint
        old.close()
        first = self.high_seqno + 1
        if snap_start is None:
            cp = self._open(CheckpointType.MEMORY, first, first, first - 1, fixed_end=False)
        else:
            if snap_end is None or snap_start > snap_end:
                raise ValueError(f"bad snapshot range [{snap_start}, {snap_end}]")
            cp = self._open(ctype, first, snap_start, snap_end, fixed_end=True)
        for cursor in self.cursors.values():
            if cursor.checkpoint is old:
                self._advance_if_exhausted(cursor)
        self._remove_unreferenced()
        return cp

    def queue(self, item: Item) -> None:
        """Queue a new version (its by_seqno above everything queued so far) into the open
        checkpoint, replacing the key's older version there (it becomes a hole).

        Every write passes here, so the checkpoint's side is done inline rather than by a method
        of Checkpoint, and memory is accounted as Item.size (key + value + ITEM_OVERHEAD)."""
        seqno = item.by_seqno
        if seqno <= self.high_seqno:
            raise ValueError(f"seqno {seqno} is not above the high seqno {self.high_seqno}")
        cp = self.checkpoints[-1]
        n = cp.num_items
        if n and (n >= self.max_items or cp.mem_usage >= self.max_bytes or self._clock() >= cp.deadline):
            cp = self._roll_over(cp)
            n = cp.num_items
        key = item.key
        if item.cid:
            key = self._other_key(cp, item)
        items = cp._items
        if key is None:
            pos = None
        else:
            index = cp._index
            pos = index.get(key)
            index[key] = len(items)
        items.append(item)
        cp._seqnos.append(seqno)
        cp.high_seqno = self.high_seqno = seqno
        if not cp.fixed_end:
            cp.snap_end = seqno
        if pos is None:
            cp.num_items = n + 1
            size = len(item.key) + len(item.value) + ITEM_OVERHEAD
        else:  # de-duplicate: the older version's slot becomes a hole (same key, so only values differ)
            size = len(item.value) - len(items[pos].value)
            items[pos] = None
            holes = cp._holes = cp._holes + 1
            if holes > 64 and holes > n:
                cp._compact()
        cp.mem_usage += size
        self.mem_usage += size
        account = self.account
        account.checkpoint += size
        if account.checkpoint >= account.recovery_at:
            account.checkpoint_grew()
        if self.memory_quota is not None and self.mem_usage > self.memory_quota:
            self._drop_cursors()

    def queue_sync(self, item: Item) -> None:
        """Queue a prepare or an abort: never de-duplicated, and never replacing the key's version
        (durability/items.py); the checkpoint is marked as holding sync-write items."""
        seqno = item.by_seqno
        if seqno <= self.high_seqno:
            raise ValueError(f"seqno {seqno} is not above the high seqno {self.high_seqno}")
        cp = self.checkpoints[-1]
        if cp.num_items and (cp.num_items >= self.max_items or self._clock() >= cp.deadline):
            cp = self._roll_over(cp)
        cp._items.append(item)
        cp._seqnos.append(seqno)
        cp.high_seqno = self.high_seqno = seqno
        if not cp.fixed_end:
            cp.snap_end = seqno
        cp.num_items += 1
        cp.sync = True
        size = item.size
        cp.mem_usage += size
        self.mem_usage += size
        if self.memory_quota is not None and self.mem_usage > self.memory_quota:
            self._drop_cursors()

    def mark_sync(self) -> None:
        """The item just queued was a commit: its checkpoint holds sync-write items."""
        self.checkpoints[-1].sync = True

    def max_visible_seqno(self, high_seqno: int) -> int:
        """The highest seqno memory holds of an item that is not a prepare or an abort; with none
        in memory, `high_seqno` (what was flushed before the oldest checkpoint)."""
        for cp in reversed(self.checkpoints):
            if not cp.num_items:
                continue
            if not cp.sync:
                return cp.high_seqno
            seen = cp.visible_upto(cp.high_seqno)
            if seen:
                return seen
        return min(high_seqno, self.checkpoints[0].first_seqno - 1)

    def _other_key(self, cp: Checkpoint, item: Item):
        """The de-duplication key of an item of another collection than the default one, or None
        when it is kept whatever follows (a system event, a version of a collection with history)."""
        cp.others = True
        cid = item.cid
        if cid == SYSTEM_CID:
            return None
        key = (cid, item.key)
        if cid not in self.history_cids:
            return key
        cp.history = True
        seen = cp._history_keys
        if seen is None:
            seen = cp._history_keys = set()
        if key in seen:
            cp.duplicates = True
        else:
            seen.add(key)
        return None

    def _roll_over(self, cp: Checkpoint) -> Checkpoint:
        """Close a full (or old) checkpoint; a replica's continues the same snapshot."""
        if cp.fixed_end:
            cp.close()
            new = self._open(cp.type, self.high_seqno + 1, cp.snap_start, cp.snap_end, fixed_end=True,
                             continuation=True)
            for cursor in self.cursors.values():
                if cursor.checkpoint is cp:
                    self._advance_if_exhausted(cursor)
            self._remove_unreferenced()
            return new
        return self.create_checkpoint()

    def reset(self, high_seqno: int) -> None:
        """Forget everything (after a rollback): one empty checkpoint at `high_seqno`.

        The persistence cursor is kept and repositioned; other cursors are dropped and their
        owners told (their streams must be re-established anyway).
        """
        for cursor in list(self.cursors.values()):
            if cursor is not self.persistence_cursor:
                self._drop(cursor)
        self.checkpoints.clear()
        self.account.checkpoint -= self.mem_usage
        self.mem_usage = 0
        self.high_seqno = high_seqno
        self.persisted_seqno = high_seqno
        cp = self._open(CheckpointType.MEMORY, high_seqno + 1, high_seqno + 1, high_seqno, fixed_end=False)
        if self.persistence_cursor is not None:
            self.persistence_cursor.checkpoint = cp
            self.persistence_cursor.seqno = high_seqno
            self.persistence_cursor._snap_end = None

    def set_persisted(self, seqno: int) -> None:
        """The flusher made everything up to `seqno` durable; release what nobody needs."""
        self.persisted_seqno = max(self.persisted_seqno, seqno)
        self._remove_unreferenced()

    def _remove_unreferenced(self) -> None:
        """Release closed checkpoints that no cursor is in or before (and that are persisted)."""
        cps = self.checkpoints
        if len(cps) == 1:
            return
        lowest = min((c.checkpoint.id for c in self.cursors.values()), default=None)
        removed = freed = 0
        for cp in cps[:-1]:
            if (lowest is not None and cp.id >= lowest) or (
                    self.persistent and cp.high_seqno > self.persisted_seqno):
                break
            removed += 1
            freed += cp.mem_usage
        if removed:
            del cps[:removed]
            self.mem_usage -= freed
            self.account.checkpoint -= freed

    # -- cursors ----------------------------------------------------------------------------
    def register_cursor(self, name: str, start_seqno: int, *, droppable: bool = True,
                        on_drop: Callable[[Cursor], None] | None = None) -> CursorRegistration:
        """Place cursor `name` (replacing any of that name) to read from start_seqno + 1."""
        if start_seqno > self.high_seqno:
            raise ValueError(f"start seqno {start_seqno} is above the high seqno {self.high_seqno}")
        if name in self.cursors:
            self.remove_cursor(name)
        first = self.first_seqno
        if start_seqno + 1 >= first:
            cp = next(c for c in reversed(self.checkpoints) if c.first_seqno <= start_seqno + 1)
            cursor = Cursor(name, self, cp, start_seqno, droppable=droppable, on_drop=on_drop)
            reg = CursorRegistration(cursor, False)
        else:
            cursor = Cursor(name, self, self.checkpoints[0], first - 1, droppable=droppable, on_drop=on_drop)
            reg = CursorRegistration(cursor, True, start_seqno + 1, first - 1)
        self.cursors[name] = cursor
        self._advance_if_exhausted(cursor)
        return reg

    def remove_cursor(self, cursor: "Cursor | str") -> None:
        name = cursor if isinstance(cursor, str) else cursor.name
        removed = self.cursors.pop(name, None)
        if removed is self.persistence_cursor and removed is not None:
            self.persistence_cursor = None
        self._remove_unreferenced()

    def reposition_cursor(self, cursor: Cursor, seqno: int) -> None:
        """Move a cursor back to `seqno` (the flusher after a failed write); must still be in memory."""
        if seqno + 1 < self.first_seqno:
            raise ValueError(f"seqno {seqno} is no longer in memory (first seqno {self.first_seqno})")
        cursor.checkpoint = next(c for c in reversed(self.checkpoints) if c.first_seqno <= seqno + 1)
        cursor.seqno = seqno
        cursor._snap_end = None

    def drop_cursor(self, cursor: Cursor) -> None:
        """Drop one cursor as memory pressure does (`_drop_cursors`): its owner is told through
        `on_drop`, reading it raises CursorDropped, and the checkpoints only it held are released.
        For fault injection (a consumer made "slow" on demand). The persistence cursor is never
        dropped: the flusher would lose its place."""
        if cursor is self.persistence_cursor:
            raise ValueError("the persistence cursor cannot be dropped")
        if cursor.dropped or self.cursors.get(cursor.name) is not cursor:
            raise ValueError(f"cursor {cursor.name!r} is not registered here")
        self._drop(cursor)
        self._remove_unreferenced()

    def _drop(self, cursor: Cursor) -> None:
        self.cursors.pop(cursor.name, None)
        cursor.dropped = True
        self.num_dropped_cursors += 1
        self.account.num_cursors_dropped += 1
        if cursor.on_drop is not None:
            cursor.on_drop(cursor)
        if self.on_drop is not None:
            self.on_drop(cursor)

    def _drop_cursors(self) -> None:
        """Over this vbucket's quota: drop droppable cursors pinning the oldest checkpoints."""
        self.release_for_memory(lambda: self.mem_usage > self.memory_quota)

    def release_open_if_read(self) -> int:
        """Close the open checkpoint and release it when every cursor has read all of it and (for a
        persistent vbucket) it is on disk: what an idle vbucket's open checkpoint holds would
        otherwise stay until its next write, and with many vbuckets those open checkpoints alone
        can fill the checkpoint quota (kv_engine's checkpoint remover expels such items too). Only
        a growing (Memory, not fixed-range) checkpoint; returns the bytes released."""
        cp = self.open_checkpoint
        if not cp.num_items or cp.fixed_end:
            return 0
        top = self.high_seqno
        if (self.persistent and self.persisted_seqno < top) or any(c.seqno < top for c in self.cursors.values()):
            return 0
        before = self.mem_usage
        self.create_checkpoint()
        return before - self.mem_usage

    def close_open_if_full(self) -> bool:
        """Close the open checkpoint if it holds `max_bytes` or more. A write closes it, but the
        write after the one that filled it: that write may never come to this vbucket, or be the
        one refused for memory, and until then a cursor in it cannot be dropped. kv_engine's
        checkpoint memory recovery does this first (CheckpointManager::maybeCreateNewCheckpoint)."""
        cp = self.checkpoints[-1]
        if not cp.num_items or cp.mem_usage < self.max_bytes:
            return False
        self._roll_over(cp)
        return True

    def _close_open_for_cursors(self, undroppable: bool) -> bool:
        """Close the open checkpoint, whatever its size, when a DCP cursor `release_for_memory` may
        drop has not read all of it and the flusher has: the cursor, then in a closed checkpoint,
        pins something dropping it releases (memory.py, "Checkpoint sizes fit the quota")."""
        cp = self.checkpoints[-1]
        top = self.high_seqno
        pc = self.persistence_cursor
        if not cp.num_items or (pc is not None and pc.seqno < top):
            return False
        if not any(c is not pc and (c.droppable or undroppable) and c.checkpoint is cp and c.seqno < top
                   for c in self.cursors.values()):
            return False
        self._roll_over(cp)
        return True

    @property
    def has_dcp_cursors(self) -> bool:
        """Whether a cursor other than the persistence cursor is registered: without one,
        `release_for_memory` has nothing to drop or close for."""
        return len(self.cursors) > (self.persistence_cursor is not None)

    def release_for_memory(self, wanted: Callable[[], bool], *, undroppable: bool = False,
                           close_open: bool = False) -> int:
        """Drop cursors that pin old checkpoints, the one pinning the oldest first, while `wanted()`;
        only droppable ones unless `undroppable` (then any but the persistence cursor: their owners
        end their streams). A cursor in the open checkpoint, or one no older than the persistence
        cursor's, pins nothing that dropping it would release - unless `close_open`, which first
        closes the open checkpoint such a cursor has not finished reading. Returns the cursors dropped."""
        if close_open and wanted():
            self._close_open_for_cursors(undroppable)
        limit = self.persistence_cursor.checkpoint.id if self.persistence_cursor else None
        open_cp = self.open_checkpoint
        candidates = sorted((c for c in self.cursors.values()
                             if (c.droppable or undroppable) and c is not self.persistence_cursor
                             and c.checkpoint is not open_cp and (limit is None or c.checkpoint.id < limit)),
                            key=lambda c: c.checkpoint.id)
        dropped = 0
        for cursor in candidates:
            if not wanted():
                break
            self._drop(cursor)
            self._remove_unreferenced()
            dropped += 1
        return dropped

    def _advance_if_exhausted(self, cursor: Cursor) -> bool:
        """Move a cursor that has read all of a closed checkpoint into the next one."""
        moved = False
        cps = self.checkpoints
        while not cursor.checkpoint.is_open and not cursor.checkpoint.has_items_after(cursor.seqno):
            idx = cps.index(cursor.checkpoint)
            nxt = cps[idx + 1]
            if not nxt.continuation:
                cursor._snap_end = None
            cursor.checkpoint = nxt
            moved = True
        return moved

    def _read(self, cursor: Cursor, limit: int) -> list[Snapshot]:
        if cursor.dropped:
            raise CursorDropped(f"cursor {cursor.name!r} was dropped; backfill from disk")
        out: list[Snapshot] = []
        total = 0
        moved = False
        while True:
            cp = cursor.checkpoint
            if cursor._snap_end is not None:
                start, end, new_marker, ckpt_start = cursor._snap_start, cursor._snap_end, False, False
            else:
                ckpt_start = cursor.seqno < cp.first_seqno
                start = cp.snap_start if ckpt_start else cursor.seqno + 1
                end, new_marker = cp.snap_end, True
            # The persistence cursor takes whole checkpoints (as kv_engine's flusher does): cut inside
            # one, a de-duplicated version before the cut (A@1, replaced by A@3 after it) would be
            # neither on disk nor superseded there, yet the persisted seqno would claim it. Every
            # checkpoint holds at most max_items, so a batch overshoots its limit by at most that.
            splittable = (cp.fixed_end or not cp.is_open) and cursor is not self.persistence_cursor
            items = cp.read(cursor.seqno, end, max(limit - total, 1) if splittable else None)
            if items:
                cursor.seqno = items[-1].by_seqno
                snap = Snapshot(start, end, cp.type, ckpt_start, new_marker, items, cp.snap_start, cp.history,
                                cp.duplicates, cp.others)
                if cp.sync:
                    snap.sync = True
                    snap.visible_end = cp.visible_upto(end)
                out.append(snap)
                total += len(items)
                if cursor.seqno >= end:
                    cursor._snap_end = None
                else:
                    cursor._snap_start, cursor._snap_end = start, end
            if not self._advance_if_exhausted(cursor):
                break
            moved = True
            if total >= limit:
                break
        if moved:
            self._remove_unreferenced()
        return out

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {
            "num_checkpoints": len(self.checkpoints),
            "num_checkpoint_items": self.num_items,
            "open_checkpoint_id": self.open_checkpoint.id,
            "num_cursors": len(self.cursors),
            "num_dropped_cursors": self.num_dropped_cursors,
            "mem_usage": self.mem_usage,
            "first_seqno": self.first_seqno,
        }
