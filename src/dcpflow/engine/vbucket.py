"""VBucket: one partition of a bucket - hash table, seqnos, HLC, checkpoints, failover log.

Memory-first: every document version lives in `ht` (the HashTable of compact records, hashtable.py); a write assigns the
next by-seqno and a CAS from the vbucket's HLC, replaces the key's entry in the hash table and
queues the version into the CheckpointManager. Nothing touches disk on the write path: the
flusher persists from the checkpoints later, in batches.

This module holds the vbucket's state, its state changes, the write path every change goes through
(`_queue`), the expiry pager, collections and the persistence hooks; each other part is a module
with one job, a mixin of VBucket using its slots:

* vb_kv.py - the client operations of an active vbucket (get/set/add/replace/delete/touch/...,
  the read-modify-write of sub-document commands), refused near the memory quota (memory.py);
* vb_items.py - the item table: warm-up's load, bulk removal, evicted values brought back;
* vb_locks.py - GET_LOCKED / UNLOCK_KEY, and the entry that blocks a key with a sync write;
* vb_with_meta.py - SetWithMeta / AddWithMeta / DelWithMeta and their conflict resolution;
* vb_replica.py - the replica application path (`snapshot_marker` + `apply_*`), what a DCP
  consumer (PassiveStream) calls on a replica or pending vbucket;
* vb_sync_writes.py - prepares, commits, aborts and the durability monitors (durability/).

Client operations are served only by active vbucket; replica and pending vbuckets take changes
only through the replica application path, which stores the metadata it is given unchanged.

Memory (memory.py): every change of the hash table is counted in the bucket's BucketMemory. An
entry's key counts as its bytes, in any collection.

Collections (collections.py, vb_collections.py): a key of the default collection is its bytes, a
key of any other collection is (collection id, bytes) - the `doc_key` every operation takes and
the hash table, the locks and the expiry heap are keyed by; the Item itself keeps the bytes and
its `cid`. Writes to other collections take the general path (their collection's maxTTL caps the
expiry; their counts and high seqno are kept in `collections`). The collections a vbucket has
change only through its system events (`apply_collection_changes`); dropping a collection
forgets its documents from memory at once, and the bucket purges them from the store later.
"""

import heapq
import time
from collections.abc import Callable, Iterable

from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.meta import WithMetaOption
from dcpflow.protocol.status import Status

from .checkpoint import CheckpointManager
from .collections import Change, event_item
from .conflict import ConflictResolutionMode
from .durability import ActiveDurabilityMonitor, PassiveDurabilityMonitor, Topology
from .durability.items import Prepare
from .errors import EngineError
from .eviction import FullEviction
from .expiry import to_absolute
from .failover import FailoverEntry, FailoverTable
from .hashtable import HashTable
from .hlc import HLC
from .item import DATATYPE_XATTR, NOT_RESIDENT, DeleteSource, Item, retain_system_xattrs
from .memory import HT_ITEM_OVERHEAD, BucketMemory
from .store import VBucketStateRecord
from .vb_collections import VBCollections
from .vb_items import ItemTable
from .vb_kv import ClientOps
from .vb_locks import SYNC_BLOCK, Locks
from .vb_replica import ReplicaApply
from .vb_sync_writes import SyncWrites
from .vb_with_meta import MAX_META_CAS, MAX_REV_SEQNO, WithMeta

_ACTIVE = VBucketState.ACTIVE
__all__ = ["MAX_META_CAS", "MAX_REV_SEQNO", "SYNC_BLOCK", "VBucket", "VBucketState", "WithMetaOption"]


class VBucket(ClientOps, ItemTable, FullEviction, Locks, WithMeta, ReplicaApply, SyncWrites):
    """See the module docstring. Owned by one thread (the bucket's owner)."""

    __slots__ = ("id", "state", "conflict_resolution", "failover", "hlc", "high_seqno", "purge_seqno",
                 "max_deleted_rev_seqno", "persisted_seqno", "persisted_snapshot", "snapshot_start",
                 "snapshot_end", "_clock", "_on_seqno", "_dirty", "checkpoint_manager", "ht", "num_items",
                 "num_deleted", "ops_create", "ops_update", "ops_delete", "_expiry_heap", "locks", "_mem", "_fetch",
                 "collections", "history_start", "prepares", "hps", "hcs", "persisted_hps", "persisted_hcs",
                 "persisted_mvs", "topology", "adm", "pdm", "recommitting", "_filter", "_disk_keys",
                 "evicted")

    def __init__(self, vbid: int, state: VBucketState = VBucketState.ACTIVE, *,
                 conflict_resolution: ConflictResolutionMode | str = ConflictResolutionMode.REV_SEQNO,
                 failover: FailoverTable | None = None, hlc: HLC | None = None, high_seqno: int = 0,
                 purge_seqno: int = 0, max_deleted_rev_seqno: int = 0, history_start: int = 0,
                 persisted_snapshot: tuple[int, int] | None = None, items: Iterable[Item] = (),
                 checkpoint_max_items: int = 10_000, checkpoint_max_age: float | None = 5.0,
                 checkpoint_memory_quota: int | None = None, checkpoint_max_bytes: float = float("inf"),
                 persistent: bool = True, clock: Callable[[], float] = time.time,
                 on_seqno: Callable[[int, int], None] | None = None,
                 dirty: dict[int, None] | None = None, memory: BucketMemory | None = None,
                 fetch: Callable[[int, bytes], Item | None] | None = None, hps: int = 0, hcs: int = 0,
                 prepares: Iterable[Prepare] = (), full_eviction: bool = False,
                 disk_keys: Callable[[int], Iterable] | None = None, key_rows: Iterable[list[tuple]] = (),
                 warmup_summary: list | None = None):
        self.id = vbid
        self.state = VBucketState(state)
        self.conflict_resolution = ConflictResolutionMode(conflict_resolution)
        self.failover = failover if failover is not None else FailoverTable()
        self.hlc = hlc if hlc is not None else HLC()
        self.high_seqno = high_seqno
        self.purge_seqno = purge_seqno
        self.max_deleted_rev_seqno = max_deleted_rev_seqno
        # every version of the collections that keep history is on disk from this seqno on
        # (compaction moves it past what the bucket's history retention let go)
        self.history_start = history_start
        self.persisted_seqno = high_seqno
        self.persisted_snapshot = persisted_snapshot or (high_seqno, high_seqno)
        # The snapshot the vbucket is in: a replica's last marker; an active is always complete.
        if self.state == VBucketState.ACTIVE or persisted_snapshot is None:
            self.snapshot_start = self.snapshot_end = high_seqno
        else:
            self.snapshot_start, self.snapshot_end = persisted_snapshot
        self._clock = clock
        self._on_seqno = on_seqno
        self._dirty = dirty  # where a write marks this vbucket as having something to flush
        self._mem = memory if memory is not None else BucketMemory()  # the bucket's (memory.py)
        self._fetch = fetch  # (vbid, key) -> the stored version: brings back an evicted value
        self.checkpoint_manager = CheckpointManager(
            high_seqno=high_seqno, max_items=checkpoint_max_items, max_age=checkpoint_max_age,
            max_bytes=checkpoint_max_bytes, memory_quota=checkpoint_memory_quota, account=self._mem,
            persistent=persistent)
        self.ht = HashTable()
        self.num_items = 0  # live documents
        self.num_deleted = 0  # tombstones held in memory
        self.ops_create = self.ops_update = self.ops_delete = 0
        self._expiry_heap: list[tuple[int, int, bytes]] = []
        # GET_LOCKED locks: key -> (lock CAS, unlock time). Memory only, like Couchbase's: a restart,
        # a state change or a rollback forgets them. Empty on nearly every vbucket, so a write pays
        # one truth test for them.
        self.locks: dict[bytes, tuple[int, float]] = {}
        self.collections = VBCollections()
        # full eviction (eviction.py): the key filter (None: value-only eviction), and where the
        # store's keys of a vbucket come from when it is rebuilt
        self._filter = None
        self._disk_keys = disk_keys
        self.evicted = 0  # entries the pager removed whole, and reloads (a read begun before is stale)
        self._load(items)
        if full_eviction and warmup_summary is not None:  # after `_load`: the collections its events describe
            self._load_summary(warmup_summary, disk_keys(vbid))
        elif full_eviction:
            self._load_keys(key_rows)
        # sync writes (durability/): the in-flight prepares by doc key, the high prepared and high
        # completed seqnos (in memory and as last flushed), and the side's monitor
        self.prepares: dict = {}
        # keys whose prepare an active adopted (promotion, warm-up): the old active may have
        # committed it, so reads answer SYNC_WRITE_RE_COMMIT_IN_PROGRESS until it is committed again
        self.recommitting: set = set()
        self.hps = self.persisted_hps = hps
        self.hcs = self.persisted_hcs = hcs
        self.persisted_mvs = high_seqno  # the max visible seqno of the last flush (vbucket_state)
        self.topology: Topology | None = None
        self.adm: ActiveDurabilityMonitor | None = None
        self.pdm: PassiveDurabilityMonitor | None = None
        for p in prepares:
            self.prepares[p.key if not p.cid else (p.cid, p.key)] = p
        self._start_monitor()

    def __repr__(self) -> str:
        return f"<VBucket {self.id} {self.state.name.lower()} high_seqno={self.high_seqno}>"




    @property
    def uuid(self) -> int:
        return self.failover.latest_uuid

    @property
    def max_visible_seqno(self) -> int:
        """The highest seqno of a version readers without sync writes see (not a prepare or an abort)."""
        return self.checkpoint_manager.max_visible_seqno(self.high_seqno)

    # -- state --------------------------------------------------------------------------------
    def set_state(self, state: VBucketState, *, by_takeover: bool = False) -> FailoverEntry | None:
        """Change state; returns the failover entry created, if any.

        Becoming active other than through a DCP takeover starts a new branch of history at the
        last complete snapshot's high seqno (mid-snapshot on a replica: the snapshot start). A
        replica that has the next snapshot's marker but none of its items is not mid-snapshot:
        the branch starts at its high seqno, which ends the previous snapshot (kv_engine resumes
        from the last closed snapshot when the open checkpoint has no items). A takeover keeps
        the log the new active received from the old one.
        """
        state = VBucketState(state)
        if state == self.state:
            return None
        entry = None
        if state == VBucketState.ACTIVE:
            if not by_takeover:
                complete = self.high_seqno >= self.snapshot_end or self.high_seqno < self.snapshot_start
                entry = self.failover.create_entry(self.high_seqno if complete else self.snapshot_start)
            self.checkpoint_manager.create_checkpoint()
        if VBucketState.ACTIVE in (state, self.state):
            self.snapshot_start = self.snapshot_end = self.high_seqno  # an active's snapshot is complete
        self.state = state
        self.locks.clear()  # locks belong to an active copy and are not handed over
        self._start_monitor()
        return entry

    def _check_active(self) -> None:
        if self.state == VBucketState.ACTIVE:
            return
        if self.state == VBucketState.PENDING:
            raise EngineError(Status.ETMPFAIL, f"vbucket {self.id} is pending; retry shortly")
        raise EngineError(Status.NOT_MY_VBUCKET,
                          f"vbucket {self.id} is {self.state.name.lower()}, not active")

    def _check_replica(self) -> None:
        if self.state not in (VBucketState.REPLICA, VBucketState.PENDING):
            raise EngineError(Status.NOT_MY_VBUCKET,
                              f"vbucket {self.id} is {self.state.name.lower()}; replication writes need "
                              "a replica or pending vbucket")

    # -- the write path -----------------------------------------------------------------------
    def _queue(self, item: Item, old: Item | None | bool = False) -> Item:
        """Queue a new version; `old` is the key's current hash-table entry when the caller has
        it already (False: look it up)."""
        self.checkpoint_manager.queue(item)  # first: it validates the seqno before anything changes
        key, cid = item.key, item.cid
        if cid:
            key = (cid, key)
        if old is False:
            old = self.ht.get(key)
            if old is None and self._filter is not None:
                old = self._fetch_evicted(key, True)
        if cid:
            colls = self.collections
            colls.note_other(item.by_seqno, self.high_seqno)
            colls.high[cid] = item.by_seqno
            delta = (not item.deleted) - (old is not None and not old.deleted)
            if delta:
                colls.items[cid] = colls.items.get(cid, 0) + delta
        mem = self._mem
        if old is None:
            mem.meta += len(item.key) + HT_ITEM_OVERHEAD
            mem.values += len(item.value)
            if not item.deleted:
                self.ops_create += 1
            if self._filter is not None:
                self._note_key(key)
        elif old.deleted:
            mem.values += len(item.value) - len(old.value)
            self.num_deleted -= 1
            if not item.deleted:
                self.ops_create += 1
        else:
            mem.values += len(item.value) - len(old.value)
            self.num_items -= 1
            self.ops_delete += item.deleted
            self.ops_update += not item.deleted
        if item.deleted:
            self.num_deleted += 1
        else:
            self.num_items += 1
            if item.expiry:
                heapq.heappush(self._expiry_heap, (item.expiry, item.by_seqno, key))
        self.ht[key] = item
        self.high_seqno = item.by_seqno
        locks = self.locks
        if locks and locks.get(key) is not SYNC_BLOCK:
            locks.pop(key, None)  # a new version (delete, expiry, replication) ends the lock
        if self._dirty is not None:
            self._dirty[self.id] = None
        if self._on_seqno is not None:
            self._on_seqno(self.id, item.by_seqno)
        return item

    def _next_rev(self, prev: Item | None) -> int:
        # A brand-new key continues above any purged tombstone's rev, so purging never lets an
        # old deletion win conflict resolution against a re-created document.
        return prev.rev_seqno + 1 if prev is not None else self.max_deleted_rev_seqno + 1

    def _mutate(self, key, value: bytes, flags: int, expiry: int, datatype: int) -> Item:
        prev = self._lookup(key, True)
        cid = 0
        if key.__class__ is tuple:
            cid, key = key
        return self._queue(Item(key, value, flags, expiry, self.hlc.next(), self._next_rev(prev),
                                self.high_seqno + 1, datatype, cid=cid), prev)

    def _tombstone(self, item: Item, now: float, source: DeleteSource) -> Item:
        if item.datatype & DATATYPE_XATTR and item.value is NOT_RESIDENT:
            item = self._resident(item)  # its system xattrs are kept
        value, datatype = retain_system_xattrs(item.value, item.datatype)
        return self._queue(Item(item.key, value, item.flags, 0, self.hlc.next(), item.rev_seqno + 1,
                                self.high_seqno + 1, datatype, True, int(now), source, item.cid))

    def _expiry(self, key, expiry: int, now: float) -> int:
        """The absolute expiry of a write (expiry.py), capped by its collection's maxTTL: with one,
        a document expires at the latest maxTTL seconds from now (Collections.md "maxTTL")."""
        expiry = to_absolute(expiry, now)
        if key.__class__ is tuple:
            ttl = self.collections.max_ttl(key[0])
            if ttl > 0:
                cap = int(now) + ttl
                if not expiry or expiry > cap:
                    expiry = cap
        return expiry

    def _live(self, key: bytes, now: float) -> Item | None:
        """The live document for `key`; an expired one is turned into an expiration first."""
        item = self._lookup(key, True)
        if item is None or item.deleted:
            return None
        if item.expiry and item.expiry <= now:
            self._tombstone(item, now, DeleteSource.TTL)
            return None
        return item

    def _enoent(self, key: bytes) -> EngineError:
        return EngineError(Status.KEY_ENOENT, f"key {key!r} not found in vbucket {self.id}")

    # -- expiry pager ---------------------------------------------------------------------------
    def expire_due(self, now: float | None = None, limit: int | None = None) -> int:
        """Turn due documents into expirations (active only); returns how many."""
        if self.state != VBucketState.ACTIVE:
            return 0
        now = self._clock() if now is None else now
        heap, ht = self._expiry_heap, self.ht
        done = 0
        while heap and heap[0][0] <= now and (limit is None or done < limit):
            _, seqno, key = heapq.heappop(heap)
            item = self._lookup(key, True)
            if item is None or item.deleted or item.by_seqno != seqno:
                continue  # superseded since it was scheduled
            if key in self.prepares:
                continue  # its prepare decides what comes next; a read expires it later if need be
            self._tombstone(item, now, DeleteSource.TTL)
            done += 1
        if len(heap) > 2 * self.num_items + 1024:  # drop entries of superseded versions
            full = self._filter is not None  # an evicted document's entry stays (eviction.py)
            self._expiry_heap = [e for e in heap if ((i := ht.get(e[2])) is None and full)
                                 or (i is not None and i.by_seqno == e[1])]
            heapq.heapify(self._expiry_heap)
        return done

    # -- collections (vb_collections.py) --------------------------------------------------------
    def apply_collection_changes(self, changes: list[Change], manifest_uid: int) -> list[Item]:
        """Queue a system event per change (collections.py) and follow it: the last event carries
        the new manifest uid, earlier ones the uid the vbucket had (system_event.md "Manifest
        ID"). A dropped collection's documents leave memory at once. Returns the events."""
        events = []
        colls = self.collections
        now = self._clock()
        for i, change in enumerate(changes):
            uid = manifest_uid if i == len(changes) - 1 else colls.uid
            item = event_item(change, uid, seqno=self.high_seqno + 1, cas=self.hlc.next(), now=int(now))
            self.checkpoint_manager.queue(item)
            colls.note_other(item.by_seqno, self.high_seqno)
            counted = colls.items.get(change.collection.uid, 0) if change.collection is not None else 0
            colls.apply(change, item.by_seqno)
            if change.collection is not None and change.collection.uid not in colls:
                live = self.num_items
                self.num_items, self.num_deleted = self._drop_from_memory(
                    {change.collection.uid}, self.num_items, self.num_deleted)
                if self._filter is not None:  # full eviction: its documents on disk go from the count too
                    self.num_items = live - counted
            self.high_seqno = item.by_seqno
            events.append(item)
        if changes:
            colls.uid = manifest_uid
            self.checkpoint_manager.history_cids = colls.history
            if self._dirty is not None:
                self._dirty[self.id] = None
            if self._on_seqno is not None:
                self._on_seqno(self.id, self.high_seqno)
        return events

    def collection_high_seqno(self, cid: int) -> int:
        return self.collections.high_seqno(cid, self.high_seqno)

    def collection_items(self, cid: int) -> int:
        return self.collections.count(cid, self.num_items)

    # -- persistence hooks (used by the flusher and the bucket) ---------------------------------
    def state_record(self) -> VBucketStateRecord:
        """The vbucket-state row as of the last flush (never ahead of what is on disk)."""
        snap_start, snap_end = self.persisted_snapshot
        return VBucketStateRecord(self.id, int(self.state), self.failover.to_json(), self.persisted_seqno,
                                  snap_start, snap_end, self.purge_seqno, self.hlc.max_cas,
                                  min(self.persisted_mvs, self.persisted_seqno), self.max_deleted_rev_seqno,
                                  hps=self.persisted_hps,
                                  hcs=self.persisted_hcs)

    def reset_to(self, seqno: int, items: Iterable[Item], *, purge_seqno: int,
                 snapshot: tuple[int, int] | None = None, rng=None, prepares: Iterable[Prepare] = (),
                 hps: int = 0, hcs: int = 0) -> None:
        """Reload after the store rolled back to `seqno` (0 = the vbucket was reset); `snapshot`
        is the persisted snapshot that seqno lies in (its end if it is a consistent point)."""
        self.forget_memory()
        self.evicted += 1
        self.ht = HashTable()
        self._expiry_heap = []
        self.locks.clear()
        self.collections = VBCollections()
        self._load(items)
        if self._filter is not None:
            self.rebuild_filter()
        self.high_seqno = self.persisted_seqno = seqno
        self.persisted_snapshot = snapshot or (seqno, seqno)
        self.snapshot_start, self.snapshot_end = self.persisted_snapshot
        self.purge_seqno = purge_seqno
        self.checkpoint_manager.reset(seqno)
        self.prepares = {(p.key if not p.cid else (p.cid, p.key)): p for p in prepares}
        self.hps = self.persisted_hps = hps
        self.hcs = self.persisted_hcs = hcs
        self.adm = self.pdm = None
        self._start_monitor()
        if seqno == 0:
            self.failover = FailoverTable(rng=rng)
        else:
            self.failover.prune(seqno)

    def stats(self) -> dict[str, int | str]:
        return {
            "state": self.state.name.lower(),
            "num_items": self.num_items,
            "num_tombstones": self.num_deleted,
            "high_seqno": self.high_seqno,
            "persisted_seqno": self.persisted_seqno,
            "uuid": self.uuid,
            "purge_seqno": self.purge_seqno,
            "max_cas": self.hlc.max_cas,
            "max_deleted_revid": self.max_deleted_rev_seqno,
            "ops_create": self.ops_create,
            "ops_update": self.ops_update,
            "ops_delete": self.ops_delete,
            "queue_size": max(0, self.high_seqno - self.persisted_seqno),
            "logical_clock_ticks": self.hlc.logical_ticks,
            "drift_ahead_threshold_exceeded": self.hlc.drift_ahead_exceeded,
            "drift_behind_threshold_exceeded": self.hlc.drift_behind_exceeded,
            "high_prepared_seqno": self.hps,
            "high_completed_seqno": self.hcs,
            "max_visible_seqno": self.max_visible_seqno,
            "sync_write_prepares": len(self.prepares),
        }
