"""The item table of a vbucket: the hash table (`ht`) of its document versions, and what changes
it wholesale - warm-up's load, forgetting a vbucket's or a dropped collection's documents, values
brought back after eviction, tombstones purged by compaction - with the bucket's memory count
(memory.py) kept in step with each entry.

A key of the default collection is its bytes, a key of any other collection is (collection id,
bytes); every entry counts its key's bytes and HT_ITEM_OVERHEAD as metadata, and its value while
resident. An entry whose value the pager evicted holds NOT_RESIDENT: `_resident` fetches the value
back from the store through the vbucket's `fetch` (synchronously), or the caller fetches it off the
owner thread and hands it to `restore`.

This is the one module that builds and walks the table as a whole; the table itself (compact
records rather than a Python object per version, issue 46) is hashtable.py. A mixin of VBucket
(vbucket.py), whose slots it uses.
"""

import heapq
from collections.abc import Iterable

from dcpflow.protocol.status import Status

from .collections import SYSTEM_CID, SystemEvent
from .errors import EngineError
from .item import NOT_RESIDENT, Item
from .memory import HT_ITEM_OVERHEAD
from .store_compaction import PurgeResult


class ItemTable:
    """The hash table's loading, bulk removal and evicted values (module docstring)."""

    __slots__ = ()

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

    def _resident(self, item: Item) -> Item:
        """`item` (the hash table's current entry for its key) with its value, fetched back from
        the store if it was evicted."""
        if item.value is not NOT_RESIDENT:
            return item
        if self._fetch is None:
            raise EngineError(Status.EINTERNAL, f"the value of {item.key!r} was evicted and there is no store")
        return self.restore(item.key, self._fetch(self.id, item.key))

    def restore(self, key: bytes, stored: Item | None, evicted: int | None = None) -> Item:
        """A value fetched from the store (`stored`) for the evicted entry of `key`: put back in
        the hash table if the entry is still that version, and returns the key's entry as it is
        now (resident, or changed meanwhile). The metadata stays the hash table's: GET_LOCKED may
        have given the entry a CAS the store does not have. Under full eviction a key memory lacks
        comes back whole (eviction.py, `_restore_evicted`)."""
        item = self.ht.get(key)
        if item is None and self._filter is not None:
            self._restore_evicted(key, stored, evicted)
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
            elif item is None and self._filter is not None:
                self.num_deleted -= 1  # an evicted tombstone (full eviction: eviction.py)
