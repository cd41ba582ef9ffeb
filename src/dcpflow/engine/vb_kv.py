"""The client operations of an active vbucket: get/set/add/replace/delete/touch/get_and_touch/
get_meta, the checks of a write carrying a CAS (`writable`), and the read-modify-write of a whole
version that sub-document commands use (`current`, `write_version`; server/subdoc.py). A pending
vbucket answers ETMPFAIL (it is about to become active, retry), replica and dead ones
NOT_MY_VBUCKET; `replica_version` is the one read of a replica (GET_REPLICA).

Expiry times passed here are what the client sent (<= 30 days is relative, see expiry.py). A write
that would store a value (set, add, replace, touch) is refused with ETMPFAIL or ENOMEM near the
bucket's quota (memory.py); deletions are not. `set` is the hottest write path: the common case is
inlined there. A mixin of VBucket (vbucket.py), whose slots it uses.
"""

import heapq
from collections.abc import Callable

from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.status import Status

from .errors import EngineError
from .expiry import to_absolute
from .hashtable import same_version
from .item import NOT_RESIDENT, DeleteSource, Item
from .memory import HT_ITEM_OVERHEAD
from .vb_locks import SYNC_BLOCK, in_progress
from .vb_sync_writes import recommit_in_progress

_ACTIVE = VBucketState.ACTIVE
_new_item = object.__new__  # VBucket.set builds its Item field by field
_EXPLICIT = DeleteSource.EXPLICIT


class ClientOps:
    """The KV operations of an active vbucket (module docstring)."""

    __slots__ = ()

    def get(self, key: bytes, fetch: bool = True) -> Item:
        """The live document (`_live` inlined: the hottest read path; the clock is read only for a
        document with an expiry). An evicted value is fetched back from the store, unless `fetch`
        is False: then the entry is returned with NOT_RESIDENT, for the caller to fetch it off this
        thread and hand it to `restore`."""
        if self.state != _ACTIVE:
            self._check_active()
        if self.recommitting and key in self.recommitting:
            raise recommit_in_progress(key)
        item = self.ht.get(key)
        if item is None and self._filter is not None:  # full eviction: maybe on disk (eviction.py)
            if not fetch:
                return self._maybe_on_disk(key)
            item = self._fetch_evicted(key)
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

    def get_reply(self, key, opcode: int, opaque: int, reply_key: bytes, json: bool) -> bytes | None:
        """The whole success reply of a GET (`HashTable.reply`: packed from the table's record, no
        Item built, the value copied once) when the document is the common case - an active
        vbucket with no lock or recommit in progress, the key live and resident, no expiry, no
        xattrs - else None, and `get` answers (a miss, a tombstone, an expiry to check against the
        clock, an evicted value, a hidden CAS, an error)."""
        if self.state is not _ACTIVE or self.locks or self.recommitting:
            return None
        return self.ht.reply(key, opcode, opaque, reply_key, json)

    def _check_memory(self) -> None:
        mem = self._mem
        if mem.values + mem.meta + mem.checkpoint > mem.mutation_limit or mem.checkpoint >= mem.checkpoint_quota:
            raise mem.refusal()

    def get_meta(self, key: bytes) -> Item:
        """Metadata of the current version, tombstones included (GetMeta reports deleted=1)."""
        self._check_active()
        if self.recommitting and key in self.recommitting:
            raise recommit_in_progress(key)
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
        locks = self.locks
        if not (cas or expiry or locks):
            version = ht.version(key)  # (rev_seqno, expiry, deleted, value length) or None: no Item built
            if (not version[1]) if version is not None else self._filter is None:
                return self._plain_set(key, value, flags, datatype, version)
        prev = ht.get(key)
        if prev is None and self._filter is not None:  # full eviction: maybe on disk (eviction.py)
            prev = self._fetch_evicted(key, True)
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
        if prev is None:
            self._count_live(key, value, None, 0)
            if self._filter is not None:
                self._note_key(key)
        else:
            self._count_live(key, value, prev.deleted, len(prev.value))
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

    def _plain_set(self, key: bytes, value: bytes, flags: int, datatype: int, version: tuple | None) -> Item:
        """`set`'s plain SET (no CAS, no expiry before or after, no lock, and the key in memory or no
        full eviction): the general path with the previous version's metadata only (`version`, from
        `HashTable.version`), and the new one put into the table field by field: no Item read back."""
        ht = self.ht
        seqno = self.high_seqno + 1
        new_cas = self.hlc.next()
        rev = version[0] + 1 if version is not None else self.max_deleted_rev_seqno + 1
        item = Item(key, value, flags, 0, new_cas, rev, seqno, datatype)  # (Document's compiled constructor)
        self.checkpoint_manager.queue(item)  # first: it validates the seqno before anything changes
        if version is None:
            self._count_live(key, value, None, 0)
        else:
            self._count_live(key, value, version[2], version[3])
        ht.put(key, value, flags, 0, new_cas, rev, seqno, datatype, False, 0, 0)
        self.high_seqno = seqno
        if self._dirty is not None:
            self._dirty[self.id] = None
        if self._on_seqno is not None:
            self._on_seqno(self.id, seqno)
        return item

    def _count_live(self, key: bytes, value: bytes, prev_deleted: bool | None, prev_len: int) -> None:
        """_queue's accounting for a live version of a default-collection key over the previous one
        (`prev_deleted` None: the key is new; `prev_len`: the length of its resident value)."""
        mem = self._mem
        if prev_deleted is None:
            mem.meta += len(key) + HT_ITEM_OVERHEAD
            mem.values += len(value)
            self.ops_create += 1
            self.num_items += 1
        elif prev_deleted:
            mem.values += len(value) - prev_len
            self.num_deleted -= 1
            self.ops_create += 1
            self.num_items += 1
        else:
            mem.values += len(value) - prev_len
            self.ops_update += 1

    def _set_other(self, key: tuple, value: bytes, flags: int, expiry: int, datatype: int, cas: int) -> Item:
        """`set` of a document of another collection than the default one: the general path."""
        now = self._clock()
        prev = self._lookup(key, True)
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
            raise in_progress(key)
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
            raise in_progress(key)
        live = self._live(key, now)
        if live is None:
            raise self._enoent(key)
        if self.locks:
            self._check_lock(key, cas, now)
        if cas:
            self._check_cas(key, live, cas)
        return live

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
        if not same_version(self.ht.get(key), prev):
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
        item = self._lookup(key)
        if item is not None and not item.deleted and item.expiry and item.expiry <= self._clock():
            return None
        return item
