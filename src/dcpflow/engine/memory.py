"""A bucket's memory: what it holds, its quota, the marks around it, and the item pager.

kv_engine bounds a bucket by its quota (`max_size`) and pushes back near it
(https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/stats.org, "ep_mem_high_wat",
"ep_mutation_mem_ratio", "ep_checkpoint_memory_quota"; defaults in
https://github.com/couchbase/kv_engine/blob/master/engines/ep/configuration.json). dcpflow keeps
the same marks, as fractions of the quota:

* above the high watermark (85%) the item pager evicts values, down to the low watermark (75%);
* above the mutation threshold (93%) a front-end write is refused: ETMPFAIL while eviction can
  still make room (clean values are resident, or dirty ones will be clean once the flusher has
  written them), ENOMEM when it cannot (keys, metadata and checkpoints alone are over it);
* checkpoints may hold at most 30% of the quota (checkpoint_memory_ratio). Above 90% of that
  (checkpoint_memory_recovery_upper_mark) the bucket recovers checkpoint memory down to 60% (the
  lower mark; Bucket.recover_checkpoint_memory, kv_engine's CheckpointMemRecoveryTask); at 100%
  front-end writes get ETMPFAIL, as kv_engine's do when its checkpoint quota is full - which also
  bounds what the flusher may have left to write.

**Checkpoint sizes fit the quota for any number of vbuckets.** An open checkpoint is closed once it
holds `checkpoint_max_size` = checkpoint quota / (vbuckets x MAX_CHECKPOINTS) bytes (kv_engine's
auto-configured checkpoint_max_size, with no floor): all the open checkpoints of a bucket together
hold at most a tenth of the checkpoint quota (plus one item each, the one that took a checkpoint
past its size), so the rest - what recovery can release - is in closed checkpoints. A cursor can
only be dropped for memory from a closed checkpoint (dropping one in the open checkpoint frees
nothing while the open checkpoint stays), and a checkpoint closes on the write after it is full;
so recovery closes full open checkpoints itself (kv_engine's recovery task does the same) and,
when that and dropping cursors from closed checkpoints do not bring memory under the upper mark,
closes open checkpoints holding items some DCP cursor has not read, whatever their size. With a
floor under the size (dcpflow once had 64 KiB), 1024 vbuckets x 64 KiB exceeded a 100 MiB bucket's
30 MiB checkpoint quota: checkpoints never closed, no cursor was ever droppable, and one consumer
that stopped reading stopped every writer.

**What is counted** (`used`): every hash-table entry's key and metadata (`HT_ITEM_OVERHEAD` per
entry: what the table spends on a record beyond its key and value, hashtable.py), its value while resident, and the
checkpoints' items (checkpoint.py, `ITEM_OVERHEAD` each). A version in both the hash table and a
checkpoint is counted twice, as kv_engine counts its hash table and its checkpoints apart: the sum
is an upper bound of what the documents cost. The interpreter, the store's page caches and the
allocator's slack are not counted; docs/server.md states them.

**Value eviction** (kv_engine's value-only policy): the pager replaces a resident value by
NOT_RESIDENT (item.py) in the hash table, keeping the key and metadata, for *clean* versions only
- persisted (seqno at or below the vbucket's persisted seqno), not a tombstone, not locked. Policy:
replica vbuckets first, then active ones, each walked in its hash table's order (the order keys
were first written) from where the last pass stopped, round-robin over the vbuckets; a pass ends
at the low watermark, after a budget of visited entries (the caller runs the next pass later, so
the event loop keeps serving), or once a whole round found nothing to evict. A read of an evicted
value fetches it back from the store (vb_items.py; the server does it off the event loop).
"""

import math
from collections.abc import Callable, Iterable

from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.status import Status

from .errors import EngineError
from .hashtable import ENTRY_OVERHEAD, same_version
from .item import NOT_RESIDENT, Item

#: What one hash-table entry costs besides its key and value bytes: the table's record head, its
#: allocator rounding and its share of the table's arrays (hashtable.py; a dict of Items spent 310).
HT_ITEM_OVERHEAD = ENTRY_OVERHEAD
#: kv_engine's default marks, as fractions of the quota.
MEM_HIGH_WAT = 0.85
MEM_LOW_WAT = 0.75
MUTATION_MEM_THRESHOLD = 0.93
CHECKPOINT_MEMORY_RATIO = 0.3
CHECKPOINT_UPPER_MARK = 0.9
CHECKPOINT_LOWER_MARK = 0.6
#: checkpoint_max_size = checkpoint quota / (vbuckets x MAX_CHECKPOINTS): an open checkpoint is closed
#: at that size, so that what it holds can be released (module docstring).
MAX_CHECKPOINTS = 10
#: Hash-table entries the pager looks at per `ItemPager.run` call.
PAGER_VISIT_BUDGET = 4096
_INF = math.inf
_ACTIVE = VBucketState.ACTIVE


class BucketMemory:
    """The counters and marks of one bucket (see the module docstring). `quota` None: unlimited
    (nothing is evicted or refused, checkpoints are unbounded)."""

    __slots__ = ("quota", "high_wat", "low_wat", "mutation_limit", "checkpoint_quota", "checkpoint_upper",
                 "checkpoint_lower", "values", "meta", "checkpoint", "on_high", "on_checkpoint_pressure",
                 "_recovery_at", "num_value_evictions", "num_bg_fetches", "num_tmp_oom", "num_oom",
                 "num_cursors_dropped", "num_slow_streams", "num_bg_meta_fetches", "num_bg_fetch_avoided",
                 "num_bg_fetch_false_positives")

    def __init__(self, quota: int | None = None):
        self.values = 0  # resident value bytes in the hash tables
        self.meta = 0  # keys and per-entry overhead in the hash tables
        self.checkpoint = 0  # the checkpoints' items (CheckpointManager mirrors its mem_usage here)
        self.on_high: Callable[[], None] | None = None  # used went over the high watermark (wake the pager)
        self.on_checkpoint_pressure: Callable[[], None] | None = None  # over the checkpoint upper mark
        self._recovery_at = _INF
        self.num_value_evictions = self.num_bg_fetches = self.num_tmp_oom = self.num_oom = 0
        self.num_cursors_dropped = self.num_slow_streams = 0
        # full eviction (eviction.py): metadata fetched back, and misses the key filter answered
        # without a store read or sent to one that found nothing
        self.num_bg_meta_fetches = self.num_bg_fetch_avoided = self.num_bg_fetch_false_positives = 0
        self.set_quota(quota)

    def set_quota(self, quota: int | None) -> None:
        if quota is not None and quota <= 0:
            raise ValueError(f"a memory quota must be positive, not {quota}")
        self.quota = quota
        q = _INF if quota is None else quota
        self.high_wat = q * MEM_HIGH_WAT
        self.low_wat = q * MEM_LOW_WAT
        self.mutation_limit = q * MUTATION_MEM_THRESHOLD
        self.checkpoint_quota = q * CHECKPOINT_MEMORY_RATIO
        self.checkpoint_upper = self.checkpoint_quota * CHECKPOINT_UPPER_MARK
        self.checkpoint_lower = self.checkpoint_quota * CHECKPOINT_LOWER_MARK
        self._recovery_at = self.checkpoint_upper

    @property
    def used(self) -> int:
        return self.values + self.meta + self.checkpoint

    def checkpoint_max_bytes(self, num_vbuckets: int) -> float:
        """The size at which an open checkpoint is closed (module docstring): no floor, so that the
        open checkpoints of all `num_vbuckets` together stay a tenth of the checkpoint quota."""
        if self.quota is None:
            return _INF
        return self.checkpoint_quota / (max(num_vbuckets, 1) * MAX_CHECKPOINTS)

    def refuses_writes(self) -> bool:
        return (self.values + self.meta + self.checkpoint > self.mutation_limit
                or self.checkpoint >= self.checkpoint_quota)

    def writes_wait_for_flusher(self) -> bool:
        """Is the bucket past its low watermark (the pager has evicted down to it, and only what the
        flusher writes can be evicted next) or its checkpoint upper mark (the flusher's backlog fills
        the checkpoint quota)? Then writes wait, or soon will, for the flusher, and the server writes
        its batches at its own priority. Not the high watermark: a load into a full quota swings
        between the two marks, and a batch collected on the way up would be written by the niced
        thread."""
        return self.quota is not None and (self.used > self.low_wat or self.checkpoint >= self.checkpoint_upper)

    def refusal(self) -> EngineError:
        """The error of a write refused for memory: ENOMEM when eviction cannot make room (keys,
        metadata and checkpoints alone are over the threshold), else ETMPFAIL (retry shortly).

        With checkpoints full, checkpoint memory is recovered here only if no owner task runs the
        pager (`on_high` None): an owner's task, woken by `on_high`, recovers once for all the
        writes refused meanwhile. A recovery per refused write walked every vbucket's checkpoints
        each time while the flusher was behind, and took the CPU the flusher needed."""
        if self.on_high is not None:
            self.on_high()
        if self.checkpoint >= self.checkpoint_quota:
            self.num_tmp_oom += 1
            if self.on_checkpoint_pressure is not None and self.on_high is None:
                self.on_checkpoint_pressure()
            return EngineError(Status.ETMPFAIL, f"checkpoint memory is full ({self.checkpoint} of "
                               f"{int(self.checkpoint_quota)} bytes): retry once the flusher and DCP consumers "
                               "have caught up")
        if self.meta + self.checkpoint > self.mutation_limit:
            self.num_oom += 1
            return EngineError(Status.ENOMEM, f"out of memory: keys and metadata alone use "
                               f"{self.meta + self.checkpoint} of the bucket's {self.quota} bytes, so no eviction can "
                               "make room (raise the quota, or delete documents)")
        self.num_tmp_oom += 1
        return EngineError(Status.ETMPFAIL, f"the bucket is at {self.used} of its {self.quota} bytes: retry shortly "
                           "(values are being evicted)")

    def checkpoint_grew(self) -> None:
        """Checkpoint memory passed the point where a recovery is due (checked by the caller)."""
        if self.on_checkpoint_pressure is not None and self.checkpoint >= self._recovery_at:
            self.on_checkpoint_pressure()

    def recovered(self) -> None:
        """A checkpoint memory recovery ran: the next one is due above the upper mark again, or, if
        this one could not get below it, once another twentieth of the quota is taken."""
        if self.checkpoint < self.checkpoint_upper:
            self._recovery_at = self.checkpoint_upper
        else:
            self._recovery_at = self.checkpoint + self.checkpoint_quota / 20

    @property
    def recovery_at(self) -> float:
        return self._recovery_at

    def stats(self) -> dict[str, int]:
        """kv_engine's names (stats.org)."""
        q = self.quota or 0
        return {
            "mem_used": self.used,
            "ep_max_size": q,
            "ep_mem_high_wat": int(self.high_wat) if q else 0,
            "ep_mem_low_wat": int(self.low_wat) if q else 0,
            "ep_mutation_mem_threshold": int(self.mutation_limit) if q else 0,
            "ep_kv_size": self.values + self.meta,
            "ep_value_size": self.values,
            "ep_meta_data_memory": self.meta,
            "ep_checkpoint_memory": self.checkpoint,
            "ep_checkpoint_memory_quota": int(self.checkpoint_quota) if q else 0,
            "ep_num_value_ejects": self.num_value_evictions,
            "ep_bg_fetched": self.num_bg_fetches,
            "ep_bg_meta_fetched": self.num_bg_meta_fetches,
            "ep_bg_num_samples": self.num_bg_fetches + self.num_bg_meta_fetches,
            "ep_bfilter_negatives": self.num_bg_fetch_avoided,
            "ep_bfilter_false_positives": self.num_bg_fetch_false_positives,
            "ep_tmp_oom_errors": self.num_tmp_oom,
            "ep_oom_errors": self.num_oom,
            "ep_cursors_dropped": self.num_cursors_dropped,
        }


class ItemPager:
    """Value eviction over a bucket's vbuckets (module docstring, "Value eviction")."""

    def __init__(self, memory: BucketMemory, vbuckets: dict):
        """`vbuckets` is the bucket's dict of VBuckets (read as it changes; vbucket.py imports
        this module, so the type is not named here)."""
        self.memory = memory
        self._vbuckets = vbuckets
        self._order: list[int] = []  # the vbuckets of this round, replicas first
        self._at = 0  # index into _order
        self._snapshot: list[tuple[bytes, Item]] | None = None  # the current vbucket's entries
        self._pos = 0
        self._freed_this_round = 0

    def wanted(self) -> bool:
        return self.memory.used > self.memory.high_wat

    def run(self, budget: int = PAGER_VISIT_BUDGET) -> tuple[int, bool]:
        """Evict towards the low watermark, visiting at most `budget` entries: (bytes freed, done).
        `done` is True at the low watermark or after a whole round found nothing to evict."""
        mem = self.memory
        freed = 0
        visited = 0
        while visited < budget:
            if mem.used <= mem.low_wat:
                return freed, True
            if self._snapshot is None:
                if not self._next_vbucket():
                    return freed, True
                continue
            vb = self._vbuckets.get(self._order[self._at - 1])
            snapshot, pos = self._snapshot, self._pos
            end = min(len(snapshot), pos + budget - visited)
            if vb is not None:
                if vb._filter is not None:  # full eviction (eviction.py): keys and metadata leave too
                    got = vb._evict_keys(snapshot[pos:end], mem.low_wat)
                    self._freed_this_round += got
                    freed += got
                else:
                    freed += self._evict(vb, snapshot[pos:end])
            visited += end - pos
            self._pos = end
            if end >= len(snapshot):
                self._snapshot = None
        return freed, False

    def _next_vbucket(self) -> bool:
        """Move to the next vbucket; at the end of a round start another one, unless this round
        freed nothing (then False: nothing is evictable now)."""
        if self._at >= len(self._order):
            if self._order and self._freed_this_round == 0:
                self._order, self._at = [], 0
                return False
            self._order = sorted(self._vbuckets, key=lambda v: (self._vbuckets[v].state == _ACTIVE, v))
            self._at = 0
            self._freed_this_round = 0
            if not self._order:
                return False
        vb = self._vbuckets.get(self._order[self._at])
        self._at += 1
        # Only the entries whose values are still in memory: those evicted on an earlier round are
        # not visited again (a bucket mostly on disk would spend each pass's budget on them).
        self._snapshot = [e for e in vb.ht.items() if e[1].value is not NOT_RESIDENT] if vb is not None else []
        self._pos = 0
        return True

    def _evict(self, vb, entries: Iterable[tuple[bytes, Item]]) -> int:
        mem = self.memory
        ht, persisted, locks = vb.ht, vb.persisted_seqno, vb.locks
        freed = 0
        n = 0
        for key, item in entries:
            if not same_version(ht.get(key), item):
                continue  # changed since the snapshot
            value = item.value
            if value is NOT_RESIDENT or item.deleted or item.by_seqno > persisted or not value or key in locks:
                continue
            ht[key] = Item(item.key, NOT_RESIDENT, item.flags, item.expiry, item.cas, item.rev_seqno, item.by_seqno,
                           item.datatype, cid=item.cid)
            freed += len(value)
            n += 1
            if mem.values - freed + mem.meta + mem.checkpoint <= mem.low_wat:
                break
        mem.values -= freed
        mem.num_value_evictions += n
        self._freed_this_round += freed
        return freed
