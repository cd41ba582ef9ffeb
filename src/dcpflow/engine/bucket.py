"""Bucket: the vbuckets of one bucket, their store and flusher, warm-up and shutdown.

Threading model - one owner thread. Every Bucket/VBucket/CheckpointManager method is called
from a single thread (the server's asyncio loop); the engine holds no locks and never blocks on
another thread, so each KV operation is a few dict operations. Two things may run elsewhere:
`Flusher.write(batch)` (the SQLite commit; see flusher.py) and `BackfillScan` reads (their own
connection). Maintenance that rewrites a vbucket (`rollback`, `compact`, `delete_vbucket`,
`close`) runs on the owner thread between flush batches; it raises RuntimeError if a batch is in
flight. The simplest correct use is to call `bucket.flush()` every `flush_interval` seconds from
the loop; it persists at most `flush_batch_items` items per call.

Warm-up: opening a Bucket on an existing data dir restores every vbucket's documents (tombstones
included), high seqno, failover log, purge seqno and max CAS. A clean shutdown (`close()`)
flushes everything and then writes a "clean" mark. Without the mark (crash, `kill -9`,
`close(clean=False)`), writes acknowledged but not yet flushed are lost, and every active vbucket
starts a new branch of history: a failover entry at the persisted snapshot end if the persisted
high seqno equals it, else at the persisted snapshot start (as KV-Engine's warm-up does: only a
complete snapshot is known to be whole).

Rollback (`rollback(vb, seqno)`): the vbucket is flushed when `seqno` is above its persisted
seqno, then the store rolls back to `seqno` exactly if its history reaches that far back (since
the last compaction trimmed it), else to 0 (a full reset, as Couchbase does when no older disk
snapshot exists); the seqno reached is
returned, and the vbucket's snapshot (`snapshot_start`/`snapshot_end`, what a consumer puts in
its next stream request) is (seqno, seqno) at a snapshot end, else the persisted snapshot the
seqno lies in - de-duplicated versions inside a snapshot were never persisted, so only its end
is a consistent point. Memory is reloaded from disk, failover entries above the seqno are
dropped (a reset gets a fresh failover log) and cursors other than the flusher's are dropped.

Memory (memory.py): `memory_quota` (bytes, None = unlimited) bounds the bucket. Writes near it
are refused (ETMPFAIL, ENOMEM), `evict()` runs the item pager (the owner calls it when
`pager.wanted()`: the engine has no timer), checkpoints are capped at their share of the quota
(`recover_checkpoint_memory`, run from the write path when they pass the upper mark) and warm-up
keeps values on disk once the bucket is past its low watermark.

Eviction policy (eviction.py): `eviction_policy` is "valueOnly" (the pager evicts values; every
key and its metadata stay in memory) or "fullEviction" (cold documents leave memory whole, a key
filter per vbucket answers most misses, warm-up loads counts and filters, not documents). None
opens the bucket with the policy it had (valueOnly for a new one); a policy given is stored, and
`set_eviction_policy` changes it on a live bucket.

Failover (`failover(vb, unclean=...)`, fault injection): an active vbucket starts a new branch of
history as it would after a failover (an entry at the high seqno) or after a crash (unpersisted
writes rolled back, an entry where warm-up would put it), without the process going away.

Collections (collections.py): `change_manifest(fn)` makes the bucket's next manifest, writes it to
the store at once, and has every active vbucket follow it with its system events (vb_collections.py).
A vbucket that becomes active, is created, rolled back or warmed up follows the manifest the same
way, with the events it is still owed - after a crash, those whose events were not persisted yet.
A dropped collection's documents leave memory at once; the store keeps them until
`purge_dropped_collections` (compaction, or the server soon after the drop) deletes them, vbucket
by vbucket once its drop event is persisted. The ids of collections dropped but not purged are kept
in the store too, so a restart purges them.
"""

import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from random import Random

from dcpflow.protocol import keys
from dcpflow.protocol.status import Status

from .bucket_compaction import DROPPED_META, BucketCompaction
from .bucket_listeners import BucketListeners, CursorListener, SeqnoListener, VBucketListener
from .bucket_stats import BucketStats
from .collections import Manifest, changes
from .conflict import ConflictResolutionMode
from .durability.items import make_prepare
from .errors import EngineError
from .eviction import FULL_EVICTION, VALUE_ONLY, check_policy
from .failover import FailoverEntry, FailoverTable
from .flusher import Flusher
from .hlc import HLC
from .item import Item
from .memory import BucketMemory, ItemPager
from .store import Store
from .vbucket import VBucket, VBucketState

DEFAULT_NUM_VBUCKETS = 1024
MANIFEST_META = "collections_manifest"  # the store's meta rows of the collections
DEFAULT_PURGE_INTERVAL = 259_200  # persistent_metadata_purge_age, 3 days



#: The store's meta row where a clean shutdown leaves full eviction's warm-up stats (eviction.py).
WARMUP_META = "full_eviction_warmup"


def stored_prepares(rows) -> list:
    """The in-flight prepares the store kept (Store.load_prepares rows) as Prepare items."""
    out = []
    for cid, key, seqno, level, rev, cas, flags, expiry, datatype, deleted, delete_time, value in rows:
        item = Item(key, value, flags, expiry, cas, rev, seqno, datatype, bool(deleted), delete_time, cid=cid)
        out.append(make_prepare(item, level))
    return out


def vbucket_for_key(key: bytes, num_vbuckets: int = DEFAULT_NUM_VBUCKETS) -> int:
    """The vbucket that owns `key` (given without its collection prefix), as clients compute it."""
    return keys.vbucket_for_key(key, num_vbuckets)


def run_expiry_pager(bucket: "Bucket", now: float | None = None, limit: int | None = None) -> int:
    """Expire due documents in every active vbucket; returns how many expirations were made.

    Only active vbuckets expire documents: replicas receive the active's expirations over DCP,
    otherwise the two copies would produce different seqnos for the same event.
    """
    return bucket.run_expiry_pager(now=now, limit=limit)


class Bucket(BucketCompaction, BucketListeners, BucketStats):
    """A Couchbase-style bucket; see the module docstring.

    Data lives in `data_dir/<name>/store.sqlite3`. `num_vbuckets` and `conflict_resolution`
    ("seqno" or "lww") are fixed when the bucket is first created: None means "as created" (1024
    and seqno for a new bucket); a value that differs from the stored one is an error. Checkpoints close at
    `checkpoint_max_items` items or `checkpoint_max_age` seconds; `checkpoint_memory_quota`
    (bytes, None = unlimited) triggers cursor dropping. `flush_interval` is how often the owner
    should call `flush()` (the engine has no timer), `flush_batch_items` bounds one flush.
    `purge_interval` is the tombstone purge age in seconds (0 purges every persisted tombstone);
    `rollback_history_seqnos` is how far below the persisted seqno compaction keeps rollback
    history; `history_retention_seconds` / `_bytes` how long and how much it keeps of the older
    versions of collections with history (DCP change streams). `synchronous` is SQLite's: FULL
    survives power loss, NORMAL survives `kill -9`.
    `clock` (unix seconds), `hlc_clock` (ns) and `rng` (failover UUIDs) are injectable for tests.
    """

    def __init__(self, name: str, data_dir: str | Path, num_vbuckets: int | None = None,
                 conflict_resolution: ConflictResolutionMode | str | None = None, *,
                 checkpoint_max_items: int = 10_000, checkpoint_max_age: float | None = 5.0,
                 checkpoint_memory_quota: int | None = None, memory_quota: int | None = None,
                 flush_interval: float = 0.1,
                 flush_batch_items: int = 10_000, purge_interval: float = DEFAULT_PURGE_INTERVAL,
                 rollback_history_seqnos: int | None = 1_000_000, synchronous: str = "FULL",
                 history_retention_seconds: float = 0, history_retention_bytes: int = 0,
                 clock: Callable[[], float] = time.time, hlc_clock: Callable[[], int] = time.time_ns,
                 rng: Random | None = None, eviction_policy: str | None = None):
        if num_vbuckets is not None and num_vbuckets < 1:
            raise ValueError("num_vbuckets must be >= 1")
        self.name = name
        self.data_dir = Path(data_dir)
        self.num_vbuckets = num_vbuckets  # settled against the store in _warmup
        self.eviction_policy = None if eviction_policy is None else check_policy(eviction_policy)  # ditto
        self.conflict_resolution = None if conflict_resolution is None else ConflictResolutionMode(conflict_resolution)
        self.checkpoint_max_items = checkpoint_max_items
        self.checkpoint_max_age = checkpoint_max_age
        self.checkpoint_memory_quota = checkpoint_memory_quota
        self.flush_interval = flush_interval
        self.flush_batch_items = flush_batch_items
        self.purge_interval = purge_interval
        self.rollback_history_seqnos = rollback_history_seqnos
        # how long / how much compaction keeps of the older versions of collections with history
        # (0 and 0: only what rollback keeps anyway)
        self.history_retention_seconds = history_retention_seconds
        self.history_retention_bytes = history_retention_bytes
        self._clock = clock
        self._hlc_clock = hlc_clock
        self._rng = rng
        self._seqno_listeners: list[SeqnoListener] = []
        self._persistence_listeners: list[SeqnoListener] = []
        self._vbucket_listeners: list[VBucketListener] = []
        self._cursor_listeners: list[CursorListener] = []
        self._vbuckets: dict[int, VBucket] = {}  # mutated in place, never replaced (get_vbucket holds it)
        # The vbucket, or None if this bucket does not have it. Every KV request calls it, so it is
        # the dict's own C-level get rather than a method around it.
        self.get_vbucket: Callable[[int], VBucket | None] = self._vbuckets.get
        self.memory = BucketMemory(memory_quota)
        self.memory.on_checkpoint_pressure = self.recover_checkpoint_memory
        self.pager = ItemPager(self.memory, self._vbuckets)
        self.store = Store(self.data_dir / name / "store.sqlite3", synchronous=synchronous)
        self.flusher = Flusher(self.store, self._vbuckets, on_persisted=self._notify_persisted,
                               on_complete=self._after_flush)
        self.manifest = Manifest.default()  # scopes and collections (engine/collections.py); from the store
        self.dropped_collections: set[int] = set()  # dropped, not purged from the store yet
        self.closed = False
        self.clean_shutdown = True  # how the previous run ended (True for a new bucket)
        self._warmup()

    # -- warm-up ------------------------------------------------------------------------------
    def _settle_meta(self, name: str, value: str | None, default: str) -> str:
        """A creation-time setting: the given value (stored if new; an error if it differs from
        the stored one), or with None the stored value (the default for a new bucket)."""
        stored = self.store.get_meta(name)
        if value is None:
            value = stored if stored is not None else default
        if stored is None:
            self.store.set_meta(name, value)
        elif stored != value:
            self.store.close()
            raise ValueError(f"bucket {self.name!r} was created with {name}={stored}, not {value}")
        return value

    def _warmup(self) -> None:
        self.num_vbuckets = int(self._settle_meta(
            "num_vbuckets", None if self.num_vbuckets is None else str(self.num_vbuckets), str(DEFAULT_NUM_VBUCKETS)))
        self.conflict_resolution = ConflictResolutionMode(self._settle_meta(
            "conflict_resolution", None if self.conflict_resolution is None else self.conflict_resolution.value,
            ConflictResolutionMode.REV_SEQNO.value))
        stored_policy = self.store.get_meta("eviction_policy") or VALUE_ONLY
        self.eviction_policy = self.eviction_policy or stored_policy
        if self.eviction_policy != stored_policy or self.store.get_meta("eviction_policy") is None:
            self.store.set_meta("eviction_policy", self.eviction_policy)
        full = self.eviction_policy == FULL_EVICTION
        self.clean_shutdown = self.store.get_meta("clean_shutdown") != "0"
        # full eviction's stats as the last clean shutdown left them (eviction.py); used once
        summaries = json.loads(self.store.get_meta(WARMUP_META) or "{}") if full and self.clean_shutdown else {}
        if self.store.get_meta(WARMUP_META) not in (None, "{}"):
            self.store.set_meta(WARMUP_META, "{}")
        self.store.set_meta("clean_shutdown", "0")  # a crash from now on is unclean
        text = self.store.get_meta(MANIFEST_META)
        if text is not None:
            self.manifest = Manifest.loads(text)
        self.dropped_collections = set(json.loads(self.store.get_meta(DROPPED_META) or "[]"))
        changed = []
        for vbid, rec in sorted(self.store.load_vbucket_states().items()):
            failover = FailoverTable.from_json(rec.failover_log, rng=self._rng)
            state = VBucketState(rec.state)
            if not self.clean_shutdown and state == VBucketState.ACTIVE:
                failover.create_entry(rec.snap_end if rec.high_seqno == rec.snap_end else rec.snap_start)
                changed.append(vbid)
            summary = summaries.get(str(vbid))
            if summary is not None and summary[0] != rec.high_seqno:
                summary = None  # not this vbucket's state on disk: walk its rows
            self._vbuckets[vbid] = self._make_vbucket(
                vbid, state, failover=failover, hlc=HLC(rec.max_cas, clock=self._hlc_clock),
                high_seqno=rec.high_seqno, purge_seqno=rec.purge_seqno,
                max_deleted_rev_seqno=rec.max_deleted_rev_seqno, history_start=rec.history_start,
                persisted_snapshot=(rec.snap_start, rec.snap_end),
                items=self.store.load_events(vbid) if full else self.store.load_items(vbid),
                key_rows=self.store.load_key_rows(vbid) if full and summary is None else (),
                warmup_summary=summary,
                hps=rec.hps, hcs=rec.hcs, prepares=stored_prepares(self.store.load_prepares(vbid)))
        if changed:
            self.store.save_vbucket_states([self._vbuckets[v].state_record() for v in changed])
        for vb in self._vbuckets.values():
            self._follow_manifest(vb)

    def _make_vbucket(self, vbid: int, state: VBucketState, **kwargs) -> VBucket:
        vb = VBucket(vbid, state, conflict_resolution=self.conflict_resolution,
                       checkpoint_max_items=self.checkpoint_max_items,
                       checkpoint_max_age=self.checkpoint_max_age,
                       checkpoint_memory_quota=self.checkpoint_memory_quota,
                       checkpoint_max_bytes=self.memory.checkpoint_max_bytes(self.num_vbuckets), clock=self._clock,
                       on_seqno=self._notify_seqno if self._seqno_listeners else None,
                       dirty=self.flusher.dirty, memory=self.memory, fetch=self.store.read,
                       full_eviction=self.eviction_policy == FULL_EVICTION, disk_keys=self.store.keys, **kwargs)
        vb.checkpoint_manager.on_drop = partial(self._notify_cursor_dropped, vbid)
        return vb

    # -- vbuckets -----------------------------------------------------------------------------
    def vbucket_for_key(self, key: bytes) -> int:
        return vbucket_for_key(key, self.num_vbuckets)

    def vbucket(self, vbid: int) -> VBucket:
        """The vbucket, or EngineError(NOT_MY_VBUCKET) if this bucket does not have it."""
        vb = self._vbuckets.get(vbid)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} does not exist in bucket {self.name!r}")
        return vb

    @property
    def vbuckets(self) -> dict[int, VBucket]:
        """Existing vbuckets by id (a copy)."""
        return dict(self._vbuckets)

    def set_vbucket_state(self, vbid: int, state: VBucketState | int, *,
                          by_takeover: bool = False) -> VBucket:
        """Create the vbucket in `state`, or change its state, obeying the failover-log rules.

        A new vbucket gets a failover log with one entry at seqno 0. An existing one becoming
        active gets a new entry unless `by_takeover` (a DCP set-vbucket-state during takeover).
        The state row is persisted before returning, unless a flush batch is in flight: the batch
        carries the older row, so the new one is written when the batch completes. A caller that
        acknowledges the change as durable waits for the batch first (the server's SET_VBUCKET).
        """
        self._check_open()
        if not 0 <= vbid < self.num_vbuckets:
            raise EngineError(Status.EINVAL, f"vbucket {vbid} is out of range 0..{self.num_vbuckets - 1}")
        state = VBucketState(state)
        vb = self._vbuckets.get(vbid)
        if vb is None:
            vb = self._make_vbucket(vbid, state, failover=FailoverTable(rng=self._rng),
                                    hlc=HLC(clock=self._hlc_clock))
            self._vbuckets[vbid] = vb
            self.flusher.persist_state(vb)
            self._follow_manifest(vb)
            return vb
        old = vb.state
        vb.set_state(state, by_takeover=by_takeover)
        self.flusher.persist_state(vb)
        self._follow_manifest(vb)
        if vb.state != old:
            self._notify_vbucket(vbid, "state")
        return vb

    def create_vbuckets(self, vbids, state: VBucketState | int) -> None:
        """Create new vbuckets in `state` (each with a failover log of one entry at seqno 0), their
        state rows written in one store transaction: a new bucket's 1024 vbuckets one by one would
        be 1024 synchronous commits."""
        self._check_open()
        state = VBucketState(state)
        made = []
        for vbid in vbids:
            if not 0 <= vbid < self.num_vbuckets:
                raise EngineError(Status.EINVAL, f"vbucket {vbid} is out of range 0..{self.num_vbuckets - 1}")
            if vbid in self._vbuckets:
                raise EngineError(Status.KEY_EEXISTS, f"vbucket {vbid} already exists in bucket {self.name!r}")
            vb = self._vbuckets[vbid] = self._make_vbucket(vbid, state, failover=FailoverTable(rng=self._rng),
                                                           hlc=HLC(clock=self._hlc_clock))
            made.append(vb)
        self.store.save_vbucket_states([vb.state_record() for vb in made])
        for vb in made:
            self._follow_manifest(vb)

    def delete_vbucket(self, vbid: int) -> None:
        """Drop a vbucket and its data (after it moved away)."""
        self._check_idle()
        vb = self._vbuckets.pop(vbid, None)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} does not exist")
        vb.forget_memory()
        vb.checkpoint_manager.reset(0)
        self.store.delete_vbucket(vbid)
        self._notify_vbucket(vbid, "deleted")

    def reset(self, *, store_cleared: bool = False) -> int:
        """Empty the bucket (Couchbase's bucket flush): every vbucket is created again in its state
        with a new failover log - a new vbucket UUID at seqno 0 - so a DCP client that resumes from
        before the reset is told to roll back to 0. Vbucket listeners hear "deleted" for each (DCP
        streams end). Returns the number of documents removed.

        Emptying the store is one transaction that takes time with a large bucket: a caller that
        serves requests meanwhile runs `store.clear()` on another thread first (no flush batch in
        flight) and passes `store_cleared`; writes made meanwhile went to the old vbuckets and are
        dropped with them."""
        self._check_idle()
        old = dict(self._vbuckets)
        for vb in old.values():
            vb.forget_memory()
            vb.checkpoint_manager.reset(0)
        self._vbuckets.clear()
        if not store_cleared:
            self.store.clear()
        for vbid in old:
            self._notify_vbucket(vbid, "deleted")
        for vbid, vb in old.items():
            self._vbuckets[vbid] = self._make_vbucket(vbid, vb.state, failover=FailoverTable(rng=self._rng),
                                                      hlc=HLC(clock=self._hlc_clock))
        self.store.save_vbucket_states([vb.state_record() for vb in self._vbuckets.values()])
        for vb in self._vbuckets.values():
            self._follow_manifest(vb)
        return sum(vb.num_items for vb in old.values())

    # -- persistence ----------------------------------------------------------------------------
    def flush(self, max_items: int | None = None) -> int:
        """Persist one batch (at most ~max_items items); returns how many were persisted."""
        self._check_open()
        return self.flusher.flush(max_items or self.flush_batch_items)

    def flush_all(self) -> int:
        self._check_open()
        return self.flusher.flush_all(self.flush_batch_items)

    def rollback(self, vbid: int, seqno: int, *, new_branch: bool = False) -> int:
        """Discard a vbucket's changes after `seqno`; returns the seqno actually reached.

        A replica rolled back by its consumer takes the failover log its producer sends next. With
        `new_branch` the vbucket starts a branch of history of its own where it now stands, as an
        active that lost writes in a crash does at warm-up (fault injection: "roll back as an
        unclean restart would"): a failover entry at the seqno reached when it ends a persisted
        snapshot, else at that snapshot's start, so a consumer that saw the lost writes is told to
        roll back. Listeners hear "rollback" once the vbucket is in its new state."""
        self._check_idle()
        vb = self.vbucket(vbid)
        if seqno >= vb.high_seqno:
            return vb.high_seqno
        reached = self._rewind(vb, seqno)
        if new_branch:
            self._branch_after_rewind(vb)
        self._notify_vbucket(vbid, "rollback")
        return reached

    def _rewind(self, vb: VBucket, seqno: int) -> int:
        """The rollback itself: the store goes back to `seqno` (written first if memory holds what
        it needs: seqnos up to it that are not persisted yet) and memory is reloaded from it.
        Nothing is flushed when `seqno` is at or below the persisted seqno: what is above it is
        discarded anyway, and an unclean failover must not persist what a crash would lose."""
        if seqno > vb.persisted_seqno:
            self.flusher.flush_vbucket(vb.id, self.flush_batch_items)
        result = self.store.rollback(vb.id, seqno)
        rec = self.store.load_vbucket_states()[vb.id]
        vb.reset_to(result.seqno, self.store.load_items(vb.id), purge_seqno=rec.purge_seqno,
                    snapshot=(result.snap_start, result.snap_end), rng=self._rng,
                    prepares=stored_prepares(self.store.load_prepares(vb.id)), hps=rec.hps, hcs=rec.hcs)
        self.store.save_vbucket_states([vb.state_record()])
        self._follow_manifest(vb)
        return result.seqno

    def _branch_after_rewind(self, vb: VBucket) -> FailoverEntry:
        """A new failover entry where a rewound vbucket stands, by warm-up's rule (module
        docstring); an active's snapshot is complete from there. A vbucket rewound to 0 already
        has a fresh log (a new UUID at 0)."""
        if vb.high_seqno == 0:
            entry = vb.failover.latest
        else:
            snap_start, snap_end = vb.persisted_snapshot
            entry = vb.failover.create_entry(vb.high_seqno if vb.high_seqno >= snap_end else snap_start)
        if vb.state == VBucketState.ACTIVE:
            vb.snapshot_start = vb.snapshot_end = vb.high_seqno
        self.store.save_vbucket_states([vb.state_record()])
        return entry

    def failover(self, vbid: int, *, unclean: bool = False) -> FailoverEntry:
        """Start a new branch of history on an active vbucket, as a failover does: what a DCP
        consumer meets when a replica is promoted, or when an active comes back from a crash
        (fault injection). Clean: a failover entry at the high seqno; nothing is lost, and a
        consumer at or below it resumes without rolling back. Unclean: the vbucket first loses
        what was not persisted (a rollback to the persisted seqno: memory goes back to what the
        disk holds, and nothing more is written), then the entry goes where warm-up after kill -9
        puts it. Listeners hear "failover": DCP streams of the vbucket end with STATE_CHANGED,
        as kv_engine ends them when a vbucket changes hands. Returns the new entry."""
        self._check_idle()
        vb = self.vbucket(vbid)
        if vb.state != VBucketState.ACTIVE:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} is {vb.state.name.lower()}: only an active "
                                                     "vbucket fails over")
        if unclean and vb.persisted_seqno < vb.high_seqno:
            self._rewind(vb, vb.persisted_seqno)
            entry = self._branch_after_rewind(vb)
        else:
            # As a promoted replica: a new checkpoint on the new branch, and no locks (they belong
            # to the copy that was active).
            entry = vb.failover.create_entry(vb.high_seqno)
            vb.checkpoint_manager.create_checkpoint()
            vb.locks.clear()
            self.store.save_vbucket_states([vb.state_record()])
        self._notify_vbucket(vbid, "failover")
        return entry

    # -- collections ----------------------------------------------------------------------------
    def change_manifest(self, change: Callable[[Manifest], Manifest]) -> Manifest:
        """Make the next manifest with `change` (a Manifest method, e.g. `lambda m:
        m.add_scope("app")`; its ManifestError is raised unchanged), persist it, and have every
        active vbucket follow it (module docstring). Returns the manifest now in force."""
        self._check_open()
        old = self.manifest
        new = change(old)
        if new is old:
            return old
        gone = {c.uid for s in old.scopes for c in s.collections if new.by_id(c.uid) is None}
        self.store.set_meta(MANIFEST_META, new.dumps())
        if gone:
            self.dropped_collections |= gone
            self.store.set_meta(DROPPED_META, json.dumps(sorted(self.dropped_collections)))
        self.manifest = new
        for vb in self._vbuckets.values():
            self._follow_manifest(vb)
        return new

    def _follow_manifest(self, vb: VBucket) -> None:
        """An active vbucket takes the system events that bring it to the bucket's manifest
        (replicas receive theirs from their active, over DCP)."""
        if vb.state == VBucketState.ACTIVE:
            todo = changes(vb.collections.as_manifest(), self.manifest)
            if todo:
                vb.apply_collection_changes(todo, self.manifest.uid)

    # -- memory -------------------------------------------------------------------------------
    def set_memory_quota(self, quota: int | None) -> None:
        """A new quota (bytes; None: unlimited), in force at once: the marks move, open checkpoints
        close at the new checkpoint_max_size, and a lower quota makes `pager.wanted()`."""
        self.memory.set_quota(quota)
        max_bytes = self.memory.checkpoint_max_bytes(self.num_vbuckets)
        for vb in self._vbuckets.values():
            vb.checkpoint_manager.max_bytes = max_bytes

    def set_eviction_policy(self, policy: str) -> None:
        """Change the eviction policy of the live bucket (eviction.py), as a restart with the new
        policy would have it: to full eviction every vbucket builds its key filter; to value-only
        the metadata of every evicted key comes back from the store (a warm-up's worth of reading).
        Stored, so the next open keeps it."""
        policy = check_policy(policy)
        self._check_open()
        if policy == self.eviction_policy:
            return
        for vb in self._vbuckets.values():
            if policy == FULL_EVICTION:
                vb.switch_to_full(self.store.keys)
            else:
                vb.switch_to_value_only(self.store.load_items(vb.id))
        self.eviction_policy = policy
        self.store.set_meta("eviction_policy", policy)

    def evict(self, budget: int | None = None) -> tuple[int, bool]:
        """One pass of the item pager (memory.py): (bytes of values evicted, done)."""
        self._check_open()
        return self.pager.run() if budget is None else self.pager.run(budget)

    def recover_checkpoint_memory(self) -> int:
        """Bring checkpoint memory back under its upper mark (memory.py), down to the lower mark, as
        kv_engine's CheckpointMemRecoveryTask does, the vbuckets with the most checkpoint memory
        first, each step only while memory is still above the lower mark:

        1. what costs no cursor: open checkpoints every cursor has read and the flusher has written
           are released (CheckpointManager.release_open_if_read), full ones are closed
           (close_open_if_full) so that what they hold can be released once read;
        2. the droppable DCP cursors (consumers that support cursor dropping) pinning closed
           checkpoints are dropped: those streams go on from disk;
        3. if memory is still at the upper mark, open checkpoints that such cursors have not read
           are closed too, and those cursors dropped;
        4. if memory is still at the upper mark, the other DCP cursors go the same way: their
           streams end with STREAM_END(SLOW), stream-end.md's "cannot read from the stream fast
           enough" - before the quota refuses a write, so that no consumer can stop the writers.

        The persistence cursor is never dropped: what it pins is released once the flusher has
        written it (writes wait for the flusher meanwhile). Returns the cursors dropped."""
        mem = self.memory
        dropped = 0
        if mem.checkpoint >= mem.checkpoint_upper:
            managers = sorted((vb.checkpoint_manager for vb in self._vbuckets.values()),
                              key=lambda cm: cm.mem_usage, reverse=True)
            above_lower = lambda: mem.checkpoint > mem.checkpoint_lower  # noqa: E731
            for cm in managers:
                if not above_lower():
                    break
                if not cm.release_open_if_read():
                    cm.close_open_if_full()
            # Steps 2-4 drop DCP cursors: a vbucket with none (only the flusher's, never dropped) has
            # nothing for them to release. Under a write storm with no DCP stream, walking its 1,024
            # managers three times at every recovery was most of the event loop's time per write.
            with_dcp = [cm for cm in managers if cm.has_dcp_cursors]
            for undroppable, close_open in ((False, False), (False, True), (True, True)):
                if (close_open and mem.checkpoint < mem.checkpoint_upper) or not above_lower():
                    break
                for cm in with_dcp:
                    if not above_lower():
                        break
                    dropped += cm.release_for_memory(above_lower, undroppable=undroppable, close_open=close_open)
        mem.recovered()
        return dropped

    def run_expiry_pager(self, now: float | None = None, limit: int | None = None) -> int:
        """Expire due documents in active vbuckets; returns the number of expirations."""
        self._check_open()
        now = self._clock() if now is None else now
        done = 0
        for vb in list(self._vbuckets.values()):
            done += vb.expire_due(now, None if limit is None else limit - done)
            if limit is not None and done >= limit:
                break
        return done

    def close(self, clean: bool = True) -> None:
        """Shut down. Clean: flush everything, write state rows and the clean mark.
        Unclean (`clean=False`) simulates a crash: unflushed writes are lost."""
        if self.closed:
            return
        if clean:
            self._check_idle()
            self.flusher.flush_all(self.flush_batch_items)
            self.store.seal_runs(deferred=False)  # the next process backfills what is at rest from runs
            self.store.save_vbucket_states([vb.state_record() for vb in self._vbuckets.values()])
            if self.eviction_policy == FULL_EVICTION:
                self.store.set_meta(WARMUP_META, json.dumps({vb.id: vb.warmup_summary()
                                                             for vb in self._vbuckets.values()}))
            self.store.set_meta("clean_shutdown", "1")
        self.store.close()
        self.closed = True

    def __enter__(self) -> "Bucket":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(clean=exc_type is None)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"bucket {self.name!r} is closed")

    def _check_idle(self) -> None:
        self._check_open()
        if self.flusher.in_flight is not None:
            raise RuntimeError("a flush batch is in flight; complete it first")
















