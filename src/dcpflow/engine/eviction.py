"""Full eviction: a bucket whose cold documents leave memory whole - key, metadata and value - so it
can hold more documents than fit in its quota (kv_engine's item_eviction_policy=full_eviction,
ns_server's evictionPolicy=fullEviction; https://docs.couchbase.com/server/current/learn/buckets-memory-and-storage/memory.html).

The rules, as kv_engine has them (https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/stats.org):

* **The pager** (memory.py) removes a clean entry (persisted, not locked) from the hash table
  altogether, tombstones included; the store has its latest version. An entry not persisted yet is
  never removed, so a key absent from memory is on disk as it last was, or nowhere.
* **A key filter per vbucket** (a Bloom filter: `KeyFilter`) holds every key the vbucket may have
  on disk or in memory: a key it does not hold is unknown without a store read (most misses: a
  GET of a key never written, the ADD or SET of a new key). A key it may hold and memory does not
  is fetched from the store (`_fetch_evicted`, kv_engine's background fetch): its metadata, and
  for a read its value, go back into the hash table, and the operation goes on as if it had
  never left - so a CAS, an ADD, a REPLACE, a sub-document command, a DELETE or an expiry of a
  key that is only on disk all see the disk version, and the counts of live documents stay true.
  A filter cannot forget a key: one sized for `BFILTER_KEY_COUNT` keys (or twice what the
  vbucket had) is rebuilt from the store's key index and the hash table, twice as big, once more
  keys than that were added to it (kv_engine rebuilds its filters in compaction).
* **Counts** (`num_items`, `num_deleted`, a collection's items) count documents, resident or not:
  eviction does not change them, and warm-up takes them from the store.
* **Warm-up loads no documents**, only stats and filters: a clean shutdown stores each vbucket's
  counts, collections' counts and high seqnos and expiry times (`warmup_summary`, in the store's
  meta table), and the next warm-up takes them back with the keys of the store's key index for the
  filter (`Store.keys`: an index-only scan). After a crash (or for a vbucket whose high seqno is not
  the summary's) one walk of the vbucket's rows (`Store.load_key_rows`, no value decoded) gives
  the same. Only the collections' system events are loaded as items; reads and writes bring
  documents back as they come.
* **Expiry**: the expiry pager's heap keeps the keys of evicted documents; a due one is fetched
  and expired as a resident one is, and a read of an expired non-resident document expires it.
* **DCP backfill** reads the store, as for any bucket.

Changing the policy of a live bucket (`switch_to_full`, `switch_to_value_only`) does what the
restart ns_server makes of it does: to full eviction each vbucket gets its filter (store keys and
hash table); to value-only the metadata of every evicted key comes back from the store.

The filter is rbloom's Bloom (a Rust extension, Python's own `hash` of the key: a filter lives in
one process, never on disk): adding a key costs about a dict insert, and warm-up adds a vbucket's
keys in one `update` call.

A mixin of VBucket (vbucket.py), whose slots it uses (`_filter`: None under value-only eviction).
"""

import heapq
from collections.abc import Iterable

from rbloom import Bloom

from dcpflow.protocol.status import Status

from .collections import SYSTEM_CID
from .errors import EngineError
from .hashtable import same_version
from .item import NOT_RESIDENT, Item
from .memory import HT_ITEM_OVERHEAD

VALUE_ONLY = "valueOnly"
FULL_EVICTION = "fullEviction"
#: ns_server's names of the policies of a Couchbase bucket, and kv_engine's (its
#: item_eviction_policy, in `ep_item_eviction_policy`).
POLICIES = {VALUE_ONLY: "value_only", FULL_EVICTION: "full_eviction"}
#: kv_engine's bfilter_key_count and bfilter_fp_prob defaults.
BFILTER_KEY_COUNT = 10_000
BFILTER_FP_PROB = 0.01


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"eviction policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    return policy


class KeyFilter:
    """A vbucket's Bloom filter of keys (module docstring): `in` is False only for a key never added."""

    __slots__ = ("bloom", "capacity", "added")

    def __init__(self, keys: Iterable = (), count: int = 0):
        self.capacity = max(BFILTER_KEY_COUNT, 2 * count)
        self.bloom = Bloom(self.capacity, BFILTER_FP_PROB)
        self.bloom.update(keys)
        self.added = count

    def __contains__(self, key) -> bool:
        return key in self.bloom

    @property
    def size_in_bits(self) -> int:
        return self.bloom.size_in_bits


class FullEviction:
    """Full eviction's part of a vbucket (module docstring)."""

    __slots__ = ()

    def _fetch_evicted(self, key, meta_only: bool = False) -> Item | None:
        """The key's version on disk, put back into the hash table, for a key the hash table does
        not have (full eviction only): None without a store read if the filter does not have the
        key, or if the store has no version of it. `meta_only`: the entry comes back without its
        value (NOT_RESIDENT; a write replaces it anyway)."""
        mem = self._mem
        if key not in self._filter:
            mem.num_bg_fetch_avoided += 1
            return None
        stored = self._fetch(self.id, key)
        if stored is None:
            mem.num_bg_fetch_false_positives += 1
            return None
        if meta_only:
            mem.num_bg_meta_fetches += 1
            if stored.value:
                stored = Item(stored.key, NOT_RESIDENT, stored.flags, stored.expiry, stored.cas, stored.rev_seqno,
                              stored.by_seqno, stored.datatype, stored.deleted, stored.delete_time,
                              stored.delete_source, stored.cid)
        else:
            mem.num_bg_fetches += 1
        self._admit(key, stored)
        return stored

    def needs_fetch(self, key) -> bool:
        """Whether a GET of `key` would read the store: its entry's value is evicted, or (full
        eviction) memory lacks the key and the filter may have it. No side effect - no stat, no
        expiry - for a caller that starts reads early (the server's read-ahead)."""
        item = self.ht.get(key)
        if item is None:
            return self._filter is not None and key in self._filter
        return item.value is NOT_RESIDENT

    def _maybe_on_disk(self, key) -> Item:
        """A GET without fetch (`get(key, fetch=False)`: the server reads off the event loop) of a
        key memory lacks: KEY_ENOENT if the filter says so, else a stand-in entry with NOT_RESIDENT
        for the caller to fetch and hand to `restore` (with `evicted` as it was before the read)."""
        if key not in self._filter:
            self._mem.num_bg_fetch_avoided += 1
            raise self._enoent(key)
        cid, doc = key if key.__class__ is tuple else (0, key)
        return Item(doc, NOT_RESIDENT, cid=cid)

    def _restore_evicted(self, key, stored: Item | None, evicted: int | None) -> None:
        """`restore` of a key memory lacks (full eviction): the version read from the store goes
        back into the hash table if nothing was evicted from this vbucket since the read began
        (`evicted`: the vbucket's count then) - else the read may predate a version written and
        evicted meanwhile, and the caller's next `get` reads again."""
        if stored is None or evicted is None or evicted != self.evicted:
            return
        self._admit(key, stored)
        self._mem.num_bg_fetches += 1

    def _admit(self, key, stored: Item) -> None:
        """A version read from the store back into the hash table, with its memory counted."""
        self.ht[key] = stored
        mem = self._mem
        mem.meta += len(stored.key) + HT_ITEM_OVERHEAD
        mem.values += len(stored.value)

    def _lookup(self, key, meta_only: bool = False) -> Item | None:
        """The key's hash-table entry, fetched back from the store under full eviction."""
        item = self.ht.get(key)
        if item is None and self._filter is not None:
            return self._fetch_evicted(key, meta_only)
        return item

    def _note_key(self, key) -> None:
        """A key new to the vbucket (full eviction): into the filter, rebuilt bigger when full."""
        f = self._filter
        f.added += 1
        if f.added > f.capacity:  # (the key is in neither the store nor the hash table yet)
            self.rebuild_filter()
            f = self._filter
            f.added += 1
        f.bloom.add(key)

    def rebuild_filter(self) -> None:
        """A new filter from the store's keys and the hash table's (full eviction)."""
        keys = set(self._disk_keys(self.id)) if self._disk_keys is not None else set()
        keys.update(self.ht)
        self._filter = KeyFilter(keys, len(keys))

    def _load_keys(self, pages: Iterable[list[tuple]]) -> None:
        """Full eviction's warm-up (module docstring): counts, collections, filter and expiry
        times from the store's (cid, key, seqno, deleted, expiry) rows; `_load` has loaded the
        system events already."""
        colls = self.collections
        heap = self._expiry_heap
        keys: list = []
        live = deleted = 0
        default_high = colls.default_high
        others: dict[int, list[int]] = {}  # cid -> [live documents, high seqno]
        for page in pages:
            for cid, key, seqno, is_deleted, expiry in page:
                if cid:
                    if cid == SYSTEM_CID:
                        continue
                    if cid not in colls:
                        continue  # dropped, not purged yet: the bucket purges it from the store
                    key = (cid, key)
                    seen = others.get(cid)
                    if seen is None:
                        seen = others[cid] = [0, 0]
                    seen[0] += not is_deleted
                    seen[1] = seqno
                else:
                    default_high = seqno
                keys.append(key)
                if is_deleted:
                    deleted += 1
                else:
                    live += 1
                    if expiry:
                        heap.append((expiry, seqno, key))
        self._filter = KeyFilter(keys, len(keys))
        self.num_items += live
        self.num_deleted += deleted
        colls.default_high = max(colls.default_high, default_high)
        for cid, (n, high) in others.items():
            colls.items[cid] = colls.items.get(cid, 0) + n
            colls.high[cid] = max(colls.high.get(cid, 0), high)
            colls.other_high = max(colls.other_high, high)
        heapq.heapify(heap)

    def warmup_summary(self) -> list:
        """What the next warm-up takes instead of walking the rows (module docstring), as JSON
        values: [high seqno, live documents, tombstones, default collection's high seqno, the last
        other seqno, {cid: [documents, high seqno]}, [[expiry, seqno, cid, key hex], ...]]. Taken
        at a clean shutdown, when the store has every version."""
        colls = self.collections
        heap = [[e, s, k[0], k[1].hex()] if k.__class__ is tuple else [e, s, 0, k.hex()]
                for e, s, k in self._expiry_heap]
        return [self.high_seqno, self.num_items, self.num_deleted, colls.default_high, colls.other_high,
                {str(cid): [n, colls.high.get(cid, 0)] for cid, n in colls.items.items()}, heap]

    def _load_summary(self, summary: list, keys: Iterable) -> None:
        """Warm-up from a `warmup_summary` and the store's keys (after `_load` of the system events)."""
        _, live, deleted, default_high, other_high, others, heap = summary
        colls = self.collections
        self._filter = KeyFilter(keys := list(keys), len(keys))
        self.num_items += live
        self.num_deleted += deleted
        colls.default_high = max(colls.default_high, default_high)
        colls.other_high = max(colls.other_high, other_high)
        for cid, (n, high) in others.items():
            cid = int(cid)
            if cid in colls:
                colls.items[cid] = n
                colls.high[cid] = max(colls.high.get(cid, 0), high)
        self._expiry_heap += [(e, s, (cid, bytes.fromhex(k)) if cid else bytes.fromhex(k)) for e, s, cid, k in heap]
        heapq.heapify(self._expiry_heap)

    def _evict_keys(self, entries: Iterable[tuple], low_wat: float) -> int:
        """The pager's step under full eviction (memory.py): remove clean entries from the hash
        table, key and metadata with the value, until the bucket is at `low_wat`; returns the bytes
        freed."""
        mem = self._mem
        ht, persisted, locks, prepares = self.ht, self.persisted_seqno, self.locks, self.prepares
        recommitting = self.recommitting
        freed = n = 0
        for key, item in entries:
            if not same_version(ht.get(key), item) or item.by_seqno > persisted or key in locks:
                continue
            if (prepares and key in prepares) or (recommitting and key in recommitting):
                continue
            del ht[key]
            self.evicted += 1
            size = len(item.key) + HT_ITEM_OVERHEAD
            mem.meta -= size
            mem.values -= len(item.value)
            freed += size + len(item.value)
            n += 1
            if mem.values + mem.meta + mem.checkpoint <= low_wat:
                break
        mem.num_value_evictions += n
        return freed

    def evict_key(self, key) -> str:
        """EVICT_KEY (kv_engine's evictKey, cbepctl's and the tests' way to make one document
        cold): its value - under full eviction the whole entry - leaves memory. KEY_ENOENT for an
        unknown key, KEY_EEXISTS for a version not persisted yet (kv_engine's "Can't eject: Dirty
        object."); returns kv_engine's message."""
        item = self.ht.get(key)
        if item is None:
            if self._filter is not None and self._fetch is not None and self._fetch(self.id, key) is not None:
                return "Already ejected."
            raise self._enoent(key)
        if item.by_seqno > self.persisted_seqno or key in self.locks:
            raise EngineError(Status.KEY_EEXISTS, "Can't eject: Dirty object.")
        if self._filter is not None:
            self._evict_keys([(key, item)], -1)
        elif item.value is NOT_RESIDENT:
            return "Already ejected."
        elif item.value:
            self.ht[key] = Item(item.key, NOT_RESIDENT, item.flags, item.expiry, item.cas, item.rev_seqno,
                                item.by_seqno, item.datatype, item.deleted, item.delete_time, item.delete_source,
                                item.cid)
            self._mem.values -= len(item.value)
            self._mem.num_value_evictions += 1
        return "Ejected."

    def switch_to_full(self, disk_keys) -> None:
        """This vbucket becomes fully evictable (module docstring)."""
        self._disk_keys = disk_keys
        self.rebuild_filter()

    def switch_to_value_only(self, stored: Iterable[Item]) -> None:
        """Back to value-only eviction: the metadata of every key only on disk comes back
        (`stored`: the vbucket's stored versions), values left on disk."""
        if self._filter is None:
            return
        ht, mem = self.ht, self._mem
        for item in stored:
            if item.cid == SYSTEM_CID:
                continue
            key = item.key if not item.cid else (item.cid, item.key)
            if key in ht or (item.cid and item.cid not in self.collections):
                continue
            if item.value:
                item = Item(item.key, NOT_RESIDENT, item.flags, item.expiry, item.cas, item.rev_seqno,
                            item.by_seqno, item.datatype, item.deleted, item.delete_time, item.delete_source,
                            item.cid)
            ht[key] = item
            mem.meta += len(item.key) + HT_ITEM_OVERHEAD
        self._filter = None

    def resident_entries(self) -> int:
        """Entries of the hash table (resident documents and tombstones, under full eviction)."""
        return len(self.ht)
