"""VBucket: one partition of a bucket - hash table, seqnos, HLC, checkpoints, failover log.

Memory-first: every document version lives in `ht` (a dict, the HashTable); a write assigns the
next by-seqno and a CAS from the vbucket's HLC, replaces the key's entry in the hash table and
queues the version into the CheckpointManager. Nothing touches disk on the write path: the
flusher persists from the checkpoints later, in batches.

Client operations (get/set/add/replace/delete/touch/get_and_touch/get_meta and the *WithMeta
family) are served only by active vbuckets: a pending vbucket answers ETMPFAIL (it is about to
become active, retry), replica and dead ones NOT_MY_VBUCKET. Replica and pending vbuckets take
changes only through the replica application path (`snapshot_marker` + `apply_*`), which stores
the metadata it is given unchanged - that is what a DCP consumer (PassiveStream) calls.

Expiry times passed to client operations are what the client sent (<= 30 days is relative, see
expiry.py); WithMeta and replica operations carry absolute times.

Memory (memory.py): every change of the hash table is counted in the bucket's BucketMemory, and a
front-end write that would store a value (set, add, replace, touch, *WithMeta) is refused with
ETMPFAIL or ENOMEM near the quota; deletions and replica writes are not. An entry whose value the
pager evicted holds NOT_RESIDENT: `get` fetches the value back from the store through `fetch`
(synchronously, or the caller does it off the owner thread and hands it to `restore`), and every
other operation that reads a value (touch, GAT, GET_LOCKED, a tombstone keeping system xattrs,
`writable`) fetches it first. An entry's key counts as its bytes, in any collection.

Collections (collections.py, vb_collections.py): a key of the default collection is its bytes, a
key of any other collection is (collection id, bytes) - the `doc_key` every operation takes and
the hash table, the locks and the expiry heap are keyed by; the Item itself keeps the bytes and
its `cid`. Writes to other collections take the general path (their collection's maxTTL caps the
expiry; their counts and high seqno are kept in `collections`). The collections a vbucket has
change only through its system events (`apply_collection_changes`); dropping a collection
forgets its documents from memory at once, and the bucket purges them from the store later.

Sync writes (durability/): `prepare` queues a prepare that takes a seqno but not the hash table,
and blocks its key (a SYNC_BLOCK entry in `locks`, which every write path already consults) until
the active's monitor commits it (`seqno_ack`, the flusher, `complete_sync_writes`) or aborts it at
its deadline; the commit is the key's new version at a seqno of its own. A replica applies
prepares, commits and aborts (`apply_prepare` / `apply_commit` / `apply_abort`) and its passive
monitor moves the high prepared seqno (`hps`) it acknowledges. Becoming active adopts the
prepares held, without deadlines. `hps`, `hcs` and the prepares persist through the flusher.
"""

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Iterable

from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.meta import WITH_META_OPTIONS_KNOWN, WithMetaOption
from dcpflow.protocol.status import Status

from .checkpoint import CheckpointManager, CheckpointType
from .collections import SYSTEM_CID, Change, SystemEvent, event_item
from .conflict import ConflictResolutionMode, DocMeta, incoming_wins
from .durability import DEFAULT_TIMEOUT, ActiveDurabilityMonitor, Outcome, PassiveDurabilityMonitor, Topology
from .durability.items import Abort, Commit, Prepare, make_abort, make_commit, make_prepare
from .durability.requirements import Level
from .errors import EngineError
from .expiry import to_absolute
from .failover import FailoverEntry, FailoverTable
from .hlc import HLC
from .item import DATATYPE_XATTR, NOT_RESIDENT, DeleteSource, Item, retain_system_xattrs
from .memory import HT_ITEM_OVERHEAD, BucketMemory
from .store import PurgeResult, VBucketStateRecord
from .vb_collections import VBCollections

_ALL_OPTIONS = WITH_META_OPTIONS_KNOWN
#: Metadata taken from elsewhere (*WithMeta, a DCP producer) must leave room for what local writes
#: add to it: a rev seqno is incremented by every later write of the key, and a CAS taken in
#: becomes the floor of the vbucket's clock. 48 bits of rev seqno and a CAS at least 2^32 below
#: 2^64 can never run out; larger values would overflow the u64 fields (and the store) later.
MAX_REV_SEQNO = (1 << 48) - 1
MAX_META_CAS = (1 << 64) - (1 << 32)
_SKIP_CR = WithMetaOption.FORCE_WITH_META_OP | WithMetaOption.SKIP_CONFLICT_RESOLUTION
_ACTIVE = VBucketState.ACTIVE
_new_item = object.__new__  # VBucket.set builds its Item field by field
_EXPLICIT = DeleteSource.EXPLICIT
#: The `locks` entry of a key with a sync write in progress: every write path that honours
#: GET_LOCKED's locks already looks there (and only when the dict is not empty), so refusing
#: other writes to such a key (SYNC_WRITE_IN_PROGRESS) costs a write without one nothing.
SYNC_BLOCK = (None, math.inf)
_LEVELS = (Level.MAJORITY, Level.MAJORITY_AND_PERSIST_ON_MASTER, Level.PERSIST_TO_MAJORITY)


class VBucket:
    """See the module docstring. Owned by one thread (the bucket's owner)."""

    __slots__ = ("id", "state", "conflict_resolution", "failover", "hlc", "high_seqno", "purge_seqno",
                 "max_deleted_rev_seqno", "persisted_seqno", "persisted_snapshot", "snapshot_start",
                 "snapshot_end", "_clock", "_on_seqno", "_dirty", "checkpoint_manager", "ht", "num_items",
                 "num_deleted", "ops_create", "ops_update", "ops_delete", "_expiry_heap", "locks", "_mem", "_fetch",
                 "collections", "history_start", "prepares", "hps", "hcs", "persisted_hps", "persisted_hcs",
                 "persisted_mvs", "topology", "adm", "pdm", "recommitting")

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
                 prepares: Iterable[Prepare] = ()):
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
        self.ht: dict[bytes, Item] = {}
        self.num_items = 0  # live documents
        self.num_deleted = 0  # tombstones held in memory
        self.ops_create = self.ops_update = self.ops_delete = 0
        self._expiry_heap: list[tuple[int, int, bytes]] = []
        # GET_LOCKED locks: key -> (lock CAS, unlock time). Memory only, like Couchbase's: a restart,
        # a state change or a rollback forgets them. Empty on nearly every vbucket, so a write pays
        # one truth test for them.
        self.locks: dict[bytes, tuple[int, float]] = {}
        self.collections = VBCollections()
        self._load(items)
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

    def _load(self, items: Iterable[Item]) -> None:
        """Warm-up (and a rollback's reload): the hash table, and the collections the system
        events on disk describe (documents of collections dropped but not purged yet are left out);
        once the bucket is past its low watermark the values stay on disk (loaded as evicted), so
        warm-up keeps to the quota."""
        ht, heap, mem = self.ht, self._expiry_heap, self._mem
        live = deleted = 0
        meta = values = 0
        room = mem.low_wat - mem.used
        default_high = 0
        events: list[Item] = []
        others: dict[int, list[int]] = {}  # cid -> [live documents, high seqno]
        for item in items:
            key = item.key
            cid = item.cid
            if cid:
                if cid == SYSTEM_CID:
                    events.append(item)
                    continue
                key = (cid, key)
                seen = others.get(cid)
                if seen is None:
                    seen = others[cid] = [0, 0]
                seen[0] += not item.deleted
                seen[1] = item.by_seqno
            else:
                default_high = item.by_seqno
            value = item.value
            meta += len(item.key) + HT_ITEM_OVERHEAD
            if values + meta + len(value) > room and value and not item.deleted:
                item = Item(item.key, NOT_RESIDENT, item.flags, item.expiry, item.cas, item.rev_seqno, item.by_seqno,
                            item.datatype, cid=cid)
            else:
                values += len(value)
            ht[key] = item
            if item.deleted:
                deleted += 1
            else:
                live += 1
                if item.expiry:
                    heap.append((item.expiry, item.by_seqno, key))
        colls = self.collections
        for event in events:
            colls.load_event(SystemEvent.of(event))
        gone = [cid for cid in others if cid not in colls]
        if gone:  # dropped collections whose documents the store still has
            live, deleted = self._drop_from_memory(set(gone), live, deleted)
            heap[:] = [e for e in heap if e[2] in ht]
        heapq.heapify(heap)
        self.num_items, self.num_deleted = live, deleted
        mem.meta += meta
        mem.values += values
        for cid, (n, high) in others.items():
            if cid in colls:
                colls.items[cid] = n
                colls.high[cid] = max(colls.high.get(cid, 0), high)
        colls.default_high = default_high
        colls.other_high = max([e.by_seqno for e in events] + [h for _, h in others.values()], default=0)
        self.checkpoint_manager.history_cids = colls.history

    def forget_memory(self) -> None:
        """Take this vbucket's hash table out of the bucket's memory count (it is being dropped or
        reloaded)."""
        mem = self._mem
        for item in self.ht.values():
            mem.meta -= len(item.key) + HT_ITEM_OVERHEAD
            mem.values -= len(item.value)

    def _drop_from_memory(self, cids: set[int], live: int, deleted: int) -> tuple[int, int]:
        """Forget the documents of these collections (and their locks), and their memory; returns
        the counts left."""
        ht, mem = self.ht, self._mem
        for key in [k for k in ht if k.__class__ is tuple and k[0] in cids]:
            item = ht.pop(key)
            mem.meta -= len(item.key) + HT_ITEM_OVERHEAD
            mem.values -= len(item.value)
            if item.deleted:
                deleted -= 1
            else:
                live -= 1
            self.locks.pop(key, None)
        return live, deleted

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
        prev = self.ht.get(key)
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
        item = self.ht.get(key)
        if item is None or item.deleted:
            return None
        if item.expiry and item.expiry <= now:
            self._tombstone(item, now, DeleteSource.TTL)
            return None
        return item

    def _enoent(self, key: bytes) -> EngineError:
        return EngineError(Status.KEY_ENOENT, f"key {key!r} not found in vbucket {self.id}")

    # -- evicted values ---------------------------------------------------------------------------
    def _resident(self, item: Item) -> Item:
        """`item` (the hash table's current entry for its key) with its value, fetched back from
        the store if it was evicted."""
        if item.value is not NOT_RESIDENT:
            return item
        if self._fetch is None:
            raise EngineError(Status.EINTERNAL, f"the value of {item.key!r} was evicted and there is no store")
        return self.restore(item.key, self._fetch(self.id, item.key))

    def restore(self, key: bytes, stored: Item | None) -> Item:
        """A value fetched from the store (`stored`) for the evicted entry of `key`: put back in
        the hash table if the entry is still that version, and returns the key's entry as it is
        now (resident, or changed meanwhile). The metadata stays the hash table's: GET_LOCKED may
        have given the entry a CAS the store does not have."""
        item = self.ht.get(key)
        if item is None or item.value is not NOT_RESIDENT:
            return item if item is not None else stored
        if stored is None or stored.by_seqno != item.by_seqno:
            raise EngineError(Status.ETMPFAIL, f"the stored version of {key!r} is not the evicted one "
                              f"(seqno {None if stored is None else stored.by_seqno}, expected {item.by_seqno}): retry")
        restored = Item(key, stored.value, item.flags, item.expiry, item.cas, item.rev_seqno, item.by_seqno,
                        item.datatype, item.deleted, item.delete_time, item.delete_source)
        self.ht[key] = restored
        self._mem.values += len(stored.value)
        self._mem.num_bg_fetches += 1
        return restored

    # -- client operations (active only) ------------------------------------------------------
    def get(self, key: bytes, fetch: bool = True) -> Item:
        """The live document (`_live` inlined: the hottest read path; the clock is read only for a
        document with an expiry). An evicted value is fetched back from the store, unless `fetch`
        is False: then the entry is returned with NOT_RESIDENT, for the caller to fetch it off this
        thread and hand it to `restore`."""
        if self.state != _ACTIVE:
            self._check_active()
        if self.recommitting and key in self.recommitting:
            raise _recommitting(key)
        item = self.ht.get(key)
        if item is None or item.deleted:
            raise self._enoent(key)
        if item.expiry:
            now = self._clock()
            if item.expiry <= now:
                self._tombstone(item, now, DeleteSource.TTL)
                raise self._enoent(key)
        if item.value is NOT_RESIDENT and fetch:
            return self._resident(item)
        return item

    def _check_memory(self) -> None:
        mem = self._mem
        if mem.values + mem.meta + mem.checkpoint > mem.mutation_limit or mem.checkpoint >= mem.checkpoint_quota:
            raise mem.refusal()

    def get_meta(self, key: bytes) -> Item:
        """Metadata of the current version, tombstones included (GetMeta reports deleted=1)."""
        self._check_active()
        if self.recommitting and key in self.recommitting:
            raise _recommitting(key)
        self._live(key, self._clock())
        item = self.ht.get(key)
        if item is None:
            raise self._enoent(key)
        return item

    def set(self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0, datatype: int = 0,
            cas: int = 0) -> Item:
        """Store unconditionally, or only over the version with `cas` when cas != 0.

        The hottest write path: `_live`, `_mutate` and `_queue` (for a live version) are inlined
        so the key is looked up once and no call is made that the common case does not need (the
        clock is read only for an expiry or a lock)."""
        if self.state != _ACTIVE:
            self._check_active()
        mem = self._mem
        if mem.values + mem.meta + mem.checkpoint > mem.mutation_limit or mem.checkpoint >= mem.checkpoint_quota:
            raise mem.refusal()
        if key.__class__ is tuple:  # another collection than the default one
            return self._set_other(key, value, flags, expiry, datatype, cas)
        ht = self.ht
        prev = ht.get(key)
        if prev is not None:
            key = prev.key  # one key object for the hash table, the checkpoint's index and the new version
        locks = self.locks
        now = 0.0
        if expiry or locks or (prev is not None and prev.expiry):  # most writes need no clock
            now = self._clock()
            if prev is not None and not prev.deleted and prev.expiry and prev.expiry <= now:
                prev = self._tombstone(prev, now, DeleteSource.TTL)
            if locks:
                self._check_lock(key, cas, now)
        if cas:
            self._check_cas(key, None if prev is None or prev.deleted else prev, cas)
        if expiry:
            expiry = to_absolute(expiry, now)
        seqno = self.high_seqno + 1
        # Item(...) without the class call, which costs more than all the fields together: every
        # field of the dataclass is set, in its order (tests/engine/test_vbucket_set.py compares the
        # result with the constructor's, field by field).
        item = _new_item(Item)
        item.key = key
        item.value = value
        item.flags = flags
        item.expiry = expiry
        item.cas = self.hlc.next()
        item.rev_seqno = prev.rev_seqno + 1 if prev is not None else self.max_deleted_rev_seqno + 1
        item.by_seqno = seqno
        item.datatype = datatype
        item.deleted = False
        item.delete_time = 0
        item.delete_source = _EXPLICIT
        item.cid = 0
        self.checkpoint_manager.queue(item)  # first: it validates the seqno before anything changes
        # _queue's accounting for a live version over `prev`
        if prev is None:
            mem.meta += len(key) + HT_ITEM_OVERHEAD
            mem.values += len(value)
            self.ops_create += 1
            self.num_items += 1
        elif prev.deleted:
            mem.values += len(value) - len(prev.value)
            self.num_deleted -= 1
            self.ops_create += 1
            self.num_items += 1
        else:
            mem.values += len(value) - len(prev.value)
            self.ops_update += 1
        if expiry:
            heapq.heappush(self._expiry_heap, (expiry, seqno, key))
        ht[key] = item
        self.high_seqno = seqno
        if locks:  # (the vbucket's one dict of locks: cleared in place, never replaced)
            locks.pop(key, None)
        if self._dirty is not None:
            self._dirty[self.id] = None
        if self._on_seqno is not None:
            self._on_seqno(self.id, seqno)
        return item

    def _set_other(self, key: tuple, value: bytes, flags: int, expiry: int, datatype: int, cas: int) -> Item:
        """`set` of a document of another collection than the default one: the general path."""
        now = self._clock()
        prev = self.ht.get(key)
        if prev is not None and not prev.deleted and prev.expiry and prev.expiry <= now:
            prev = self._tombstone(prev, now, DeleteSource.TTL)
        if self.locks:
            self._check_lock(key, cas, now)
        if cas:
            self._check_cas(key, None if prev is None or prev.deleted else prev, cas)
        return self._mutate(key, value, flags, self._expiry(key, expiry, now), datatype)

    def add(self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0, datatype: int = 0,
            cas: int = 0) -> Item:
        """Store only if there is no live document (a tombstone does not count)."""
        self._check_active()
        self._check_memory()
        if cas:
            raise EngineError(Status.EINVAL, "add does not take a CAS")
        if self.prepares and key in self.prepares:
            raise _in_progress(key)
        now = self._clock()
        if self._live(key, now) is not None:
            raise EngineError(Status.KEY_EEXISTS, f"key {key!r} already exists")
        return self._mutate(key, value, flags, self._expiry(key, expiry, now), datatype)

    def replace(self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0, datatype: int = 0,
                cas: int = 0) -> Item:
        """Store only over a live document (and its `cas`, when given)."""
        self._check_active()
        self._check_memory()
        now = self._clock()
        self._writable(key, cas, now)
        return self._mutate(key, value, flags, self._expiry(key, expiry, now), datatype)

    def delete(self, key: bytes, *, cas: int = 0) -> Item:
        """Delete the live document, leaving a tombstone; returns the tombstone (its CAS is new)."""
        self._check_active()
        now = self._clock()
        return self._tombstone(self._writable(key, cas, now), now, DeleteSource.EXPLICIT)

    def touch(self, key: bytes, expiry: int) -> Item:
        """Change a live document's expiry (a new version: new seqno, CAS and rev seqno)."""
        self._check_active()
        self._check_memory()
        now = self._clock()
        live = self._resident(self._writable(key, 0, now))  # TOUCH and GAT carry no CAS: a locked one refuses them
        return self._mutate(key, live.value, live.flags, self._expiry(key, expiry, now), live.datatype)

    def get_and_touch(self, key: bytes, expiry: int) -> Item:
        """Touch and return the document with its value."""
        return self.touch(key, expiry)

    def _check_cas(self, key: bytes, live: Item | None, cas: int) -> None:
        if live is None:
            raise self._enoent(key)
        if live.cas != cas:
            raise EngineError(Status.KEY_EEXISTS, f"CAS mismatch for key {key!r}")

    def writable(self, key: bytes, cas: int = 0) -> Item:
        """The live document a write carrying `cas` (0: none) may replace, checked in Couchbase's
        order: KEY_ENOENT, then Locked (GET_LOCKED), then KEY_EEXISTS for another CAS. For writes
        built from a read (INCREMENT, APPEND), which then store with the returned item's CAS; its value
        is resident."""
        self._check_active()
        return self._resident(self._writable(key, cas, self._clock()))

    def _writable(self, key: bytes, cas: int, now: float) -> Item:
        if self.locks and self.locks.get(key) is SYNC_BLOCK:
            raise _in_progress(key)
        live = self._live(key, now)
        if live is None:
            raise self._enoent(key)
        if self.locks:
            self._check_lock(key, cas, now)
        if cas:
            self._check_cas(key, live, cas)
        return live

    # -- read-modify-write of a whole version (sub-document commands: server/subdoc.py) ----------
    def current(self, key) -> Item | None:
        """The key's current version (`key` as everywhere: bytes, or (collection id, bytes)), live
        or tombstone (a due expiry is turned into an expiration first), or None for an unknown key.
        Active only."""
        self._check_active()
        self._live(key, self._clock())
        return self.ht.get(key)

    def write_version(self, key, prev: Item | None, value: bytes, *, flags: int = 0, expiry: int = 0,
                      datatype: int = 0, deleted: bool = False, cas: int = 0,
                      finish: Callable[[int, int], bytes] | None = None) -> Item:
        """Store the version a read-modify-write built from `prev` (what `current` returned; None:
        the key was unknown), live or as a tombstone carrying `value` (xattrs). `cas` is the
        request's, which a GET_LOCKED lock needs. `finish(cas, seqno)` gives the final value once the
        new version's CAS and seqno are known (macro expansion). KEY_EEXISTS if `prev` is no longer
        the current version."""
        self._check_active()
        item, _ = self._next_version(key, prev, value, flags, expiry, datatype, deleted, cas, finish)
        return self._queue(item, prev)

    def _next_version(self, key, prev: Item | None, value: bytes, flags: int, expiry: int, datatype: int,
                      deleted: bool, cas: int, finish: Callable[[int, int], bytes] | None) -> tuple[Item, float]:
        """(the new version, now) of a read-modify-write, after its checks (`prev` still current, the
        lock); shared by `write_version` and `prepare_version`, which queue it or prepare it."""
        if self.ht.get(key) is not prev:
            raise EngineError(Status.KEY_EEXISTS, f"key {key!r} changed during the read-modify-write")
        now = self._clock()
        if self.locks:
            self._check_lock(key, cas, now)
        new_cas, seqno = self.hlc.next(), self.high_seqno + 1
        if finish is not None:
            value = finish(new_cas, seqno)
        rev = self._next_rev(prev)
        cid, doc = key if key.__class__ is tuple else (0, key)
        if deleted:
            item = Item(doc, value, flags, 0, new_cas, rev, seqno, datatype, True, int(now), DeleteSource.EXPLICIT, cid)
        else:
            item = Item(doc, value, flags, self._expiry(key, expiry, now), new_cas, rev, seqno, datatype, cid=cid)
        return item, now

    def replica_version(self, key) -> Item | None:
        """The key's version on a replica vbucket (GET_REPLICA, sub-document replica reads): live
        or tombstone, None if unknown or expired (a replica never expires anything itself)."""
        if self.state != VBucketState.REPLICA:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {self.id} is {self.state.name.lower()}, not a replica")
        item = self.ht.get(key)
        if item is not None and not item.deleted and item.expiry and item.expiry <= self._clock():
            return None
        return item

    # -- GET_LOCKED / UNLOCK_KEY (BinaryProtocol.md#0x94-get-locked) ----------------------------
    def lock_cas(self, key: bytes, now: float | None = None) -> int | None:
        """The CAS of the key's unexpired lock, or None; an expired lock is released here (lazily,
        as the page says Couchbase does)."""
        lock = self.locks.get(key)
        if lock is None or lock is SYNC_BLOCK:
            return None
        if lock[1] <= (self._clock() if now is None else now):
            del self.locks[key]
            return None
        return lock[0]

    def _check_lock(self, key: bytes, cas: int, now: float) -> None:
        """A mutation of a locked document needs the lock's CAS (it then releases the lock); a key
        with a sync write in progress takes no other write until it completes."""
        if self.locks.get(key) is SYNC_BLOCK:
            raise _in_progress(key)
        lock = self.lock_cas(key, now)
        if lock is not None and cas != lock:
            raise EngineError(Status.LOCKED, f"key {key!r} is locked (GET_LOCKED): mutate it with the CAS the "
                              "lock returned, UNLOCK_KEY it, or wait for the lock to expire")

    def get_locked(self, key: bytes, lock_time: float) -> Item:
        """Lock the live document for `lock_time` seconds and return it with a new CAS, the lock's.

        The new CAS is the document's from now on (Document.md: locking hides the old one), but it
        is not a new version: no seqno, nothing queued, nothing for DCP. A restart brings back the
        persisted CAS."""
        self._check_active()
        if self.prepares and key in self.prepares:
            raise _in_progress(key)
        now = self._clock()
        live = self._live(key, now)
        if live is None:
            raise self._enoent(key)
        if self.lock_cas(key, now) is not None:
            raise EngineError(Status.LOCKED, f"key {key!r} is already locked (GET_LOCKED): wait for the lock "
                              "to expire or for its holder to unlock it")
        live = self._resident(live)
        cas = self.hlc.next()
        item = dataclasses.replace(live, cas=cas)
        self.ht[key] = item
        self.locks[key] = (cas, now + lock_time)
        return item

    def unlock(self, key: bytes, cas: int) -> None:
        """UNLOCK_KEY's decision tree: ENOENT, NotLocked, Locked (wrong CAS), or unlocked."""
        self._check_active()
        now = self._clock()
        if self._live(key, now) is None:
            raise self._enoent(key)
        lock = self.lock_cas(key, now)
        if lock is None:
            raise EngineError(Status.NOT_LOCKED, f"key {key!r} is not locked")
        if cas != lock:
            raise EngineError(Status.LOCKED, f"key {key!r} is locked with another CAS: UNLOCK_KEY needs the one "
                              "GET_LOCKED returned")
        del self.locks[key]

    # -- *WithMeta (active only) --------------------------------------------------------------
    def set_with_meta(self, key: bytes, value: bytes, *, cas: int, rev_seqno: int, flags: int = 0,
                      expiry: int = 0, datatype: int = 0, options: int = 0, check_cas: int = 0) -> Item:
        """SetWithMeta (set_with_meta.md): store with the given metadata if it wins conflict
        resolution against the existing version (tombstones included).

        `expiry` is absolute. `check_cas` is the request header's CAS: when non-zero, the
        existing live document must have that CAS (KEY_ENOENT / KEY_EEXISTS otherwise).
        """
        return self._set_with_meta(key, value, cas, rev_seqno, flags, expiry, datatype, options,
                                   check_cas, add=False)

    def add_with_meta(self, key: bytes, value: bytes, *, cas: int, rev_seqno: int, flags: int = 0,
                      expiry: int = 0, datatype: int = 0, options: int = 0, check_cas: int = 0) -> Item:
        """AddWithMeta: as SetWithMeta, but KEY_EEXISTS if a live document exists."""
        return self._set_with_meta(key, value, cas, rev_seqno, flags, expiry, datatype, options,
                                   check_cas, add=True)

    def del_with_meta(self, key: bytes, *, cas: int, rev_seqno: int, flags: int = 0, delete_time: int = 0,
                      options: int = 0, value: bytes = b"", datatype: int = 0, check_cas: int = 0) -> Item:
        """DelWithMeta (del_with_meta.md): store a tombstone with the given metadata.

        A tombstone is stored even if the key is unknown here (so the deletion replicates on);
        conflict resolution compares (rev, cas) or (cas, rev) only. IS_EXPIRATION marks the
        tombstone as a TTL expiry. `delete_time` 0 means now. `value` may carry xattrs.
        """
        regenerate = self._resolve_with_meta(key, DocMeta(cas, rev_seqno, 0, flags, datatype), options,
                                             check_cas, deletion=True)
        source = DeleteSource.TTL if options & WithMetaOption.IS_EXPIRATION else DeleteSource.EXPLICIT
        delete_time = delete_time or int(self._clock())
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._queue(Item(key, value, flags, 0, self._meta_cas(cas, regenerate), rev_seqno,
                                self.high_seqno + 1, datatype, True, delete_time, source, cid))

    def _set_with_meta(self, key: bytes, value: bytes, cas: int, rev_seqno: int, flags: int, expiry: int,
                       datatype: int, options: int, check_cas: int, *, add: bool) -> Item:
        regenerate = self._resolve_with_meta(key, DocMeta(cas, rev_seqno, expiry, flags, datatype), options,
                                             check_cas, deletion=False, add=add)
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._queue(Item(key, value, flags, expiry, self._meta_cas(cas, regenerate), rev_seqno,
                                self.high_seqno + 1, datatype, cid=cid))

    def _resolve_with_meta(self, key: bytes, incoming: DocMeta, options: int, check_cas: int, *,
                           deletion: bool, add: bool = False) -> bool:
        """All checks of a WithMeta write, in order; returns whether to regenerate the CAS."""
        self._check_active()
        if not deletion:
            self._check_memory()
        if self.prepares and key in self.prepares:
            raise _in_progress(key)
        skip, regenerate = self._check_options(options, incoming.cas, deletion=deletion)
        if incoming.rev_seqno > MAX_REV_SEQNO:
            raise EngineError(Status.EINVAL, _rev_too_big(incoming.rev_seqno))
        existing = self.ht.get(key)
        live = existing if existing is not None and not existing.deleted else None
        if check_cas:
            self._check_cas(key, live, check_cas)
        if add and live is not None:
            raise EngineError(Status.KEY_EEXISTS, f"key {key!r} already exists")
        if existing is not None and not skip and not incoming_wins(
                self.conflict_resolution, incoming, DocMeta.of(existing), deletion=deletion):
            raise EngineError(Status.KEY_EEXISTS,
                              f"conflict resolution: the existing version of {key!r} wins")
        return regenerate

    def _meta_cas(self, cas: int, regenerate: bool) -> int:
        if regenerate:
            return self.hlc.next()
        self.hlc.observe(cas)  # keep local CAS above anything accepted from elsewhere
        return cas

    def _check_options(self, options: int, cas: int, *, deletion: bool) -> tuple[bool, bool]:
        """Validate WithMeta options (0x01..0x10); returns (skip conflict resolution, regenerate CAS)."""
        if options & ~_ALL_OPTIONS:
            raise EngineError(Status.EINVAL, f"unknown WithMeta option bits 0x{options & ~_ALL_OPTIONS:x}")
        if options & WithMetaOption.IS_EXPIRATION and not deletion:
            raise EngineError(Status.EINVAL, "IS_EXPIRATION is only valid on DelWithMeta")
        skip = bool(options & _SKIP_CR)
        regenerate = bool(options & WithMetaOption.REGENERATE_CAS)
        if regenerate and not skip:
            raise EngineError(Status.EINVAL, "REGENERATE_CAS requires conflict resolution to be skipped "
                              "(FORCE_WITH_META_OP or SKIP_CONFLICT_RESOLUTION)")
        force_accept = bool(options & WithMetaOption.FORCE_ACCEPT_WITH_META_OPS)
        if self.conflict_resolution == ConflictResolutionMode.LWW:
            if not force_accept and not regenerate:
                raise EngineError(Status.EINVAL, "LWW buckets require FORCE_ACCEPT_WITH_META_OPS")
        elif force_accept:
            raise EngineError(Status.EINVAL, "FORCE_ACCEPT_WITH_META_OPS is refused on rev-seqno buckets")
        if cas == 0 and not regenerate:
            raise EngineError(Status.EINVAL, "a WithMeta write must carry the source's CAS (got 0)")
        if cas > MAX_META_CAS and not regenerate:
            raise EngineError(Status.EINVAL, _cas_too_big(cas))
        return skip, regenerate

    # -- replica application path (DCP consumer) ----------------------------------------------
    def snapshot_marker(self, start: int, end: int, *, disk: bool = False) -> None:
        """Begin a snapshot received over DCP: a new checkpoint with this range and type."""
        self._check_replica()
        if start > end:
            raise EngineError(Status.EINVAL, f"snapshot start {start} is above its end {end}")
        if end < self.high_seqno:
            raise EngineError(Status.ERANGE, f"snapshot end {end} is below the high seqno {self.high_seqno}")
        ctype = CheckpointType.DISK if disk else CheckpointType.MEMORY
        if self.pdm is not None:  # a new marker: everything of the snapshot before it arrived
            self.pdm.snapshot_received(self.high_seqno)
            self.hps = self.pdm.hps
        self.checkpoint_manager.create_checkpoint(start, end, ctype)
        self.snapshot_start, self.snapshot_end = start, end

    def apply_mutation(self, key: bytes, value: bytes, *, by_seqno: int, cas: int, rev_seqno: int,
                       flags: int = 0, expiry: int = 0, datatype: int = 0) -> Item:
        """Store a replicated mutation exactly as given (no conflict resolution, no new CAS)."""
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._apply(Item(key, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, cid=cid))

    def apply_deletion(self, key: bytes, *, by_seqno: int, cas: int, rev_seqno: int, delete_time: int = 0,
                       value: bytes = b"", datatype: int = 0, flags: int = 0,
                       expiration: bool = False) -> Item:
        """Store a replicated deletion (or, with expiration=True, an expiration)."""
        source = DeleteSource.TTL if expiration else DeleteSource.EXPLICIT
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._apply(Item(key, value, flags, 0, cas, rev_seqno, by_seqno, datatype, True,
                                delete_time or int(self._clock()), source, cid))

    def apply_expiration(self, key: bytes, *, by_seqno: int, cas: int, rev_seqno: int,
                         delete_time: int = 0, value: bytes = b"", datatype: int = 0) -> Item:
        return self.apply_deletion(key, by_seqno=by_seqno, cas=cas, rev_seqno=rev_seqno,
                                   delete_time=delete_time, value=value, datatype=datatype, expiration=True)

    def _apply(self, item: Item) -> Item:
        self._check_replica()
        if item.cas > MAX_META_CAS:
            raise EngineError(Status.EINVAL, _cas_too_big(item.cas))
        if item.rev_seqno > MAX_REV_SEQNO:
            raise EngineError(Status.EINVAL, _rev_too_big(item.rev_seqno))
        seqno = item.by_seqno
        self._check_applicable(seqno)
        if self.prepares:
            # A version of a key whose prepare is held completes the prepare: a disk snapshot sends
            # a commit as the version it made.
            held = self.prepares.pop(item.key if not item.cid else (item.cid, item.key), None)
            if held is not None:
                self._completed(held.by_seqno)
        self.hlc.observe(item.cas)
        self._queue(item)
        if seqno >= self.snapshot_end and self.pdm is not None:
            self._snapshot_received(seqno)
        return item

    def _check_applicable(self, seqno: int) -> None:
        self._check_replica()
        if seqno <= self.high_seqno:
            raise EngineError(Status.ERANGE, f"seqno {seqno} is not above the high seqno {self.high_seqno}")
        if not self.snapshot_start <= seqno <= self.snapshot_end:
            raise EngineError(Status.ERANGE, f"seqno {seqno} is outside the current snapshot "
                              f"[{self.snapshot_start}, {self.snapshot_end}]")

    def _snapshot_received(self, seqno: int) -> None:
        if self.pdm.snapshot_received(seqno):
            self.hps = self.pdm.hps

    def apply_prepare(self, key, value: bytes, *, by_seqno: int, cas: int, rev_seqno: int, flags: int = 0,
                      expiry: int = 0, datatype: int = 0, deleted: bool = False, delete_time: int = 0,
                      level: int = Level.MAJORITY) -> Prepare:
        """Store a replicated DCP_PREPARE: queued and tracked, the key's readable version unchanged."""
        self._check_applicable(by_seqno)
        if level not in _LEVELS:
            raise EngineError(Status.DURABILITY_INVALID_LEVEL, f"durability level {level} is not 1..3")
        cid, bkey = key if key.__class__ is tuple else (0, key)
        item = make_prepare(Item(bkey, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, deleted,
                                 delete_time if deleted else 0, DeleteSource.EXPLICIT, cid), level)
        self.hlc.observe(cas)
        self._queue_sync(item)
        self.prepares[key] = item
        self.pdm.received(item)
        if by_seqno >= self.snapshot_end:
            self._snapshot_received(by_seqno)
        return item

    def apply_commit(self, key, *, prepared_seqno: int, commit_seqno: int) -> Commit:
        """A replicated DCP_COMMIT: the prepare it names becomes the key's version at commit_seqno."""
        self._check_applicable(commit_seqno)
        prepare = self._held_prepare(key, prepared_seqno, "DCP_COMMIT")
        commit = make_commit(prepare, commit_seqno)
        del self.prepares[key]
        self._queue(commit)
        self.checkpoint_manager.mark_sync()
        self._completed(prepared_seqno)
        if commit_seqno >= self.snapshot_end:
            self._snapshot_received(commit_seqno)
        return commit

    def apply_abort(self, key, *, prepared_seqno: int, abort_seqno: int) -> Abort:
        """A replicated DCP_ABORT. An abort may name a prepare this replica never received (the
        producer had nothing to send it: see ActiveStream "Sync writes"; KV-Engine accepts these
        too): it is queued all the same, so the seqnos and the high completed seqno go on."""
        self._check_applicable(abort_seqno)
        if key not in self.prepares and prepared_seqno > self.hcs:
            cid, bkey = key if key.__class__ is tuple else (0, key)
            prepare = Item(bkey, b"", 0, 0, 0, 0, prepared_seqno, 0, True, 0, DeleteSource.EXPLICIT, cid)
        else:
            prepare = self._held_prepare(key, prepared_seqno, "DCP_ABORT")
            del self.prepares[key]
        abort = make_abort(prepare, abort_seqno, prepare.cas, int(self._clock()))
        self._queue_sync(abort)
        self._completed(prepared_seqno)
        if abort_seqno >= self.snapshot_end:
            self._snapshot_received(abort_seqno)
        return abort

    def _held_prepare(self, key, prepared_seqno: int, what: str) -> Prepare:
        prepare = self.prepares.get(key)
        if prepare is None or prepare.by_seqno != prepared_seqno:
            held = "none" if prepare is None else f"seqno {prepare.by_seqno}"
            raise EngineError(Status.EINVAL, f"{what} for {key!r} names the prepare at seqno {prepared_seqno}, "
                              f"but this vbucket holds {held}")
        return prepare

    def _completed(self, prepared_seqno: int) -> None:
        if prepared_seqno > self.hcs:
            self.hcs = prepared_seqno
        if self.pdm is not None:
            self.pdm.completed(prepared_seqno)

    # -- sync writes on the active (durability/active_monitor.py) ------------------------------
    def _start_monitor(self) -> None:
        """The monitor of the vbucket's side. A replica that becomes active adopts the prepares it
        holds without deadlines (the old active may have committed them: they are driven to commit)."""
        if self.state == _ACTIVE:
            if self.adm is None:
                self.adm = ActiveDurabilityMonitor(self.topology, self.persisted_seqno)
                self.adm.adopt(sorted(self.prepares.values(), key=lambda p: p.by_seqno))
                self.recommitting = set(self.prepares)
            self.pdm = None
            for key in self.prepares:
                self.locks[key] = SYNC_BLOCK
        else:
            if self.adm is not None:  # writers waiting on this copy will not hear from it: ambiguous
                for sw in list(self.adm.tracked.values()):
                    for callback in sw.waiters:
                        callback(Outcome.ABORTED)
            self.recommitting = set()
            if self.pdm is None:
                self.pdm = PassiveDurabilityMonitor(self.hps, self.hcs)
                self.pdm.snapshot_end_received = self.high_seqno
                self.pdm.persisted_seqno = self.persisted_seqno
                for p in sorted(self.prepares.values(), key=lambda p: p.by_seqno):
                    self.pdm.received(p)
            self.adm = None

    def set_topology(self, chain) -> None:
        """The first replication chain (active name first; None: an unassigned replica), or None."""
        self.topology = None if chain is None else Topology.of(chain)
        if self.adm is not None:
            self.adm.set_topology(self.topology)

    def prepare(self, key, value: bytes = b"", *, level: int, mode: str = "set", flags: int = 0, expiry: int = 0,
                datatype: int = 0, cas: int = 0, timeout: float | None = None) -> Prepare:
        """Begin a sync write: `mode` set / add / replace / delete, checked as that write is.

        The prepare is queued and tracked; the caller learns the outcome with `on_complete`.
        DURABILITY_IMPOSSIBLE when the chain has too few nodes for a majority."""
        self._check_sync_write(key, level)
        now = self._clock()
        deleted = False
        delete_time = 0
        if mode == "set":
            prev = self._live(key, now)
            if self.locks:
                self._check_lock(key, cas, now)
            if cas:
                self._check_cas(key, prev, cas)
            prev = self.ht.get(key)
        elif mode == "add":
            if cas:
                raise EngineError(Status.EINVAL, "add does not take a CAS")
            if self._live(key, now) is not None:
                raise EngineError(Status.KEY_EEXISTS, f"key {key!r} already exists")
            prev = self.ht.get(key)
        elif mode in ("replace", "delete"):
            prev = self._writable(key, cas, now)
            if mode == "delete":
                value, datatype = retain_system_xattrs(prev.value, prev.datatype)
                flags, deleted, delete_time = prev.flags, True, int(now)
        else:
            raise ValueError(f"unknown sync write mode {mode!r}")
        expiry = self._expiry(key, expiry, now) if not deleted else 0
        cid, bkey = key if key.__class__ is tuple else (0, key)
        item = Item(bkey, value, flags, expiry, self.hlc.next(), self._next_rev(prev), self.high_seqno + 1, datatype,
                    deleted, delete_time, DeleteSource.EXPLICIT, cid)
        return self._begin_sync_write(key, item, level, timeout, now)

    def prepare_version(self, key, prev: Item | None, value: bytes, *, level: int, timeout: float | None = None,
                        flags: int = 0, expiry: int = 0, datatype: int = 0, deleted: bool = False, cas: int = 0,
                        finish: Callable[[int, int], bytes] | None = None) -> Prepare:
        """`write_version` as a sync write (a durable sub-document mutation): the version is prepared."""
        self._check_sync_write(key, level)
        item, now = self._next_version(key, prev, value, flags, expiry, datatype, deleted, cas, finish)
        return self._begin_sync_write(key, item, level, timeout, now)

    def _check_sync_write(self, key, level: int) -> None:
        self._check_active()
        if level not in _LEVELS:
            raise EngineError(Status.DURABILITY_INVALID_LEVEL, f"durability level {level} is not 1..3")
        if not self.adm.possible:
            why = ("no replication chain is set for it" if self.topology is None else
                   f"its chain has {1 + len(self.topology.replicas)} of the {self.topology.majority} nodes "
                   "a majority needs")
            raise EngineError(Status.DURABILITY_IMPOSSIBLE, f"vbucket {self.id} cannot meet a durability level: "
                              f"{why}")
        if key in self.prepares:
            raise _in_progress(key)

    def _begin_sync_write(self, key, item: Item, level: int, timeout: float | None, now: float) -> Prepare:
        prepare = make_prepare(item, level)
        self._queue_sync(prepare)
        self.prepares[key] = prepare
        self.locks[key] = SYNC_BLOCK
        self.adm.track(prepare, level, now + (DEFAULT_TIMEOUT if timeout is None else timeout))
        return prepare

    def on_complete(self, prepare: Prepare, callback: Callable[[Outcome], None]) -> None:
        """Call `callback(outcome)` once the prepare is committed or aborted (at once if it is)."""
        sw = self.adm.tracked.get(prepare.by_seqno) if self.adm is not None else None
        if sw is None:
            raise EngineError(Status.EINVAL, f"seqno {prepare.by_seqno} is not a tracked prepare")
        sw.waiters.append(callback)

    def seqno_ack(self, node: str, seqno: int) -> list:
        """A replica acknowledged every prepare up to `seqno` (DCP_SEQNO_ACK); completes what it can."""
        if self.adm is None:
            return []
        self.adm.seqno_ack(node, seqno)
        return self.complete_sync_writes()

    def complete_sync_writes(self, now: float | None = None) -> list:
        """Commit every satisfied prepare and abort every expired one; returns [(prepare, outcome)]."""
        adm = self.adm
        if adm is None or not adm.tracked:
            return []
        adm.persisted(self.persisted_seqno)
        done = []
        for sw in adm.ready():
            adm.forget(sw.prepare.by_seqno)
            self._commit(sw.prepare)
            done.append((sw, Outcome.COMMITTED))
        now = self._clock() if now is None else now
        for sw in adm.expired(now):
            adm.forget(sw.prepare.by_seqno)
            self._abort(sw.prepare)
            done.append((sw, Outcome.ABORTED))
        for sw, outcome in done:
            for callback in sw.waiters:
                callback(outcome)
        return [(sw.prepare, outcome) for sw, outcome in done]

    def next_sync_deadline(self) -> float:
        return self.adm.next_deadline() if self.adm is not None else math.inf

    def _commit(self, prepare: Prepare) -> Commit:
        key = prepare.key if not prepare.cid else (prepare.cid, prepare.key)
        commit = make_commit(prepare, self.high_seqno + 1)
        del self.prepares[key]
        self.locks.pop(key, None)
        self.recommitting.discard(key)
        self._queue(commit)
        self.checkpoint_manager.mark_sync()
        self._completed(prepare.by_seqno)
        return commit

    def _abort(self, prepare: Prepare) -> Abort:
        key = prepare.key if not prepare.cid else (prepare.cid, prepare.key)
        abort = make_abort(prepare, self.high_seqno + 1, self.hlc.next(), int(self._clock()))
        del self.prepares[key]
        self.locks.pop(key, None)
        self.recommitting.discard(key)
        self._queue_sync(abort)
        self._completed(prepare.by_seqno)
        return abort

    def _queue_sync(self, item: Item) -> None:
        """Queue a prepare or an abort: a seqno, the checkpoints, the flusher, no hash table."""
        self.checkpoint_manager.queue_sync(item)
        if item.cid:
            self.collections.note_other(item.by_seqno, self.high_seqno)
        self.high_seqno = item.by_seqno
        if item.__class__ is Prepare and self.state == _ACTIVE:
            self.hps = item.by_seqno  # a replica's moves as it acknowledges (passive_monitor.py)
        if self._dirty is not None:
            self._dirty[self.id] = None
        if self._on_seqno is not None:
            self._on_seqno(self.id, item.by_seqno)

    def persisted(self, seqno: int, hps: int, hcs: int) -> None:
        """The flusher made everything up to `seqno` durable (with these high prepared/completed seqnos)."""
        self.persisted_hps = max(self.persisted_hps, hps)
        self.persisted_hcs = max(self.persisted_hcs, hcs)
        if self.pdm is not None and self.pdm.persisted(seqno):
            self.hps = self.pdm.hps
        elif self.adm is not None:
            self.adm.persisted(seqno)

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
            item = ht.get(key)
            if item is None or item.deleted or item.by_seqno != seqno:
                continue  # superseded since it was scheduled
            if key in self.prepares:
                continue  # its prepare decides what comes next; a read expires it later if need be
            self._tombstone(item, now, DeleteSource.TTL)
            done += 1
        if len(heap) > 2 * self.num_items + 1024:  # drop entries of superseded versions
            self._expiry_heap = [e for e in heap if (i := ht.get(e[2])) is not None and i.by_seqno == e[1]]
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
            colls.apply(change, item.by_seqno)
            if change.collection is not None and change.collection.uid not in colls:
                self.num_items, self.num_deleted = self._drop_from_memory(
                    {change.collection.uid}, self.num_items, self.num_deleted)
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

    def on_purged(self, result: PurgeResult) -> None:
        """Compaction purged tombstones on disk: drop the same versions from memory."""
        self.purge_seqno = result.purge_seqno
        self.max_deleted_rev_seqno = max(self.max_deleted_rev_seqno, result.max_deleted_rev_seqno)
        self.history_start = max(self.history_start, result.history_start)
        ht, mem = self.ht, self._mem
        for key, seqno in result.purged:
            item = ht.get(key)
            if item is not None and item.deleted and item.by_seqno == seqno:
                del ht[key]
                self.num_deleted -= 1
                mem.meta -= len(item.key) + HT_ITEM_OVERHEAD
                mem.values -= len(item.value)

    def reset_to(self, seqno: int, items: Iterable[Item], *, purge_seqno: int,
                 snapshot: tuple[int, int] | None = None, rng=None, prepares: Iterable[Prepare] = (),
                 hps: int = 0, hcs: int = 0) -> None:
        """Reload after the store rolled back to `seqno` (0 = the vbucket was reset); `snapshot`
        is the persisted snapshot that seqno lies in (its end if it is a consistent point)."""
        self.forget_memory()
        self.ht = {}
        self._expiry_heap = []
        self.locks.clear()
        self.collections = VBCollections()
        self._load(items)
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


def _recommitting(key) -> EngineError:
    return EngineError(Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS, f"the sync write of {key!r} this vbucket took over "
                       "(failover or restart) is being committed again; retry")


def _in_progress(key) -> EngineError:
    return EngineError(Status.SYNC_WRITE_IN_PROGRESS, f"a sync write of {key!r} is in progress; retry once it "
                       "completes")


def _cas_too_big(cas: int) -> str:
    return (f"CAS 0x{cas:x} is above 0x{MAX_META_CAS:x}: 0xffffffffffffffff is a locked document's CAS "
            "(Document.md), and a CAS this close to 2^64 would leave the vbucket's clock no room")


def _rev_too_big(rev_seqno: int) -> str:
    return f"rev seqno {rev_seqno} is above {MAX_REV_SEQNO} (48 bits): later writes of the key could not increment it"

