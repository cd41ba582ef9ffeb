"""KV range scans over one vbucket: a snapshot of its live keys in a range (or a random sample of
them), handed out in key order by later continues.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/range_scans/range_scan_create.md and
range_scan_continue.md. kv_engine scans a disk snapshot, so every live document of the range comes
back with its value whatever is in memory. This engine is memory-first: the snapshot is the hash
table's live versions whose keys lie in the range (`memory_snapshot`; reads of the table build
Items, so holding them costs their metadata and, for resident ones, their values as the table had
them) plus, under full eviction, the store's live versions of the keys memory lacks
(`with_stored`, from `Store.key_range`: metadata only). Sorted by key as bytes. An entry whose
value is not resident (value eviction), and every version taken from the store, is held as
metadata with the value NOT_RESIDENT: a continue reads those values from the store
(server/range_scan.py), and never puts them back into memory (a scan does not page documents in,
as kv_engine's do not). Writes after the create are not seen by the scan, as a disk snapshot
would not see them - except that the store is read just after the hash table (off the event
loop), so a key memory lacked at the create and that was written and evicted in between is taken
as the store has it then.

A sampling scan keeps each live key with probability samples / live keys (all of them when there
are no more keys than samples), drawn from a PRNG seeded with the request's seed, so the same
seed over the same keys picks the same sample.

`RangeScans` is a bucket's registry: ids are random 16 bytes, a scan lives at most
`max_lifetime` seconds, and at most `max_scans` are open at once (EBUSY beyond: the server stays
bounded).
"""

import random
import secrets
import time
from collections.abc import Callable, Iterator

from dcpflow.protocol.status import Status

from .errors import EngineError
from .item import NOT_RESIDENT, Item
from .vbucket import VBucket

DEFAULT_MAX_LIFETIME = 60.0  # kv_engine's range_scan_max_lifetime
DEFAULT_MAX_SCANS = 128


class RangeScan:
    """One open scan: its snapshot and how far continues have read it."""

    __slots__ = ("id", "vbucket", "items", "position", "key_only", "include_xattrs", "created", "cid", "cold",
                 "busy")

    def __init__(self, scan_id: bytes, vbucket: int, items: list[Item], *, key_only: bool, include_xattrs: bool,
                 created: float, cid: int = 0):
        self.id = scan_id
        self.vbucket = vbucket
        self.cid = cid
        self.items = items
        self.position = 0
        self.key_only = key_only
        self.include_xattrs = include_xattrs
        self.created = created
        #: whether any value must be read from the store (values that were not resident)
        self.cold = not key_only and any(item.value is NOT_RESIDENT for item in items)
        self.busy = False  # a continue is reading values for it (server/range_scan.py)

    @property
    def done(self) -> bool:
        return self.position >= len(self.items)

    def take(self, item_limit: int = 0, byte_limit: int = 0, size: Callable[[Item], int] | None = None
             ) -> Iterator[Item]:
        """The next items: at most `item_limit` (0: no limit), and stopping once `byte_limit` bytes
        (by `size`) have been given (0: no limit; at least one item is always given)."""
        given = used = 0
        items = self.items
        while self.position < len(items):
            if item_limit and given >= item_limit:
                return
            if byte_limit and given and used >= byte_limit:
                return
            item = items[self.position]
            self.position += 1
            given += 1
            if size is not None:
                used += size(item)
            yield item

    def peek(self, n: int) -> list[Item]:
        """The next `n` items, still to be taken (`skip`)."""
        return self.items[self.position:self.position + n]

    def skip(self, n: int = 1) -> None:
        self.position += n


def _in_range(key: bytes, start: bytes, end: bytes | None, excl_start: bool, excl_end: bool) -> bool:
    if key < start or (excl_start and key == start):
        return False
    return end is None or not (key > end or (excl_end and key == end))


def memory_snapshot(vb: VBucket, start: bytes = b"", end: bytes | None = None, *, cid: int = 0,
                    excl_start: bool = False, excl_end: bool = False, now: float | None = None
                    ) -> tuple[list[Item], set[bytes]]:
    """The hash table's live versions of collection `cid` in the range (`end` None: no end), and
    the keys of every entry it has there, tombstones and expired ones included: a store version of
    one of those keys is older than memory's (`with_stored` leaves it out)."""
    now = time.time() if now is None else now
    live, seen = [], set()
    for item in vb.ht.values():
        if item.cid != cid or not _in_range(item.key, start, end, excl_start, excl_end):
            continue
        seen.add(item.key)
        if not item.deleted and not (item.expiry and item.expiry <= now):
            live.append(item)
    return live, seen


def with_stored(live: list[Item], seen: set[bytes], rows, *, cid: int = 0, now: float | None = None) -> list[Item]:
    """`live` (memory's) and the store's live versions (`Store.key_range` rows) of the keys memory
    did not have (`seen`), not expired, held as metadata (value NOT_RESIDENT); sorted by key."""
    now = time.time() if now is None else now
    for key, seqno, rev_seqno, cas, flags, expiry, datatype in rows:
        if key in seen or (expiry and expiry <= now):
            continue
        live.append(Item(key, NOT_RESIDENT, flags, expiry, cas, rev_seqno, seqno, datatype, cid=cid))
    live.sort(key=_by_key)
    return live


def range_snapshot(vb: VBucket, start: bytes, end: bytes | None, *, cid: int = 0, excl_start: bool = False,
                   excl_end: bool = False, now: float | None = None, store=None) -> list[Item]:
    """The snapshot of a range scan; with `store` (full eviction) also the documents memory lacks,
    read from it on this thread (the server reads it off the event loop: server/range_scan.py)."""
    now = time.time() if now is None else now
    live, seen = memory_snapshot(vb, start, end, cid=cid, excl_start=excl_start, excl_end=excl_end, now=now)
    rows = () if store is None else store.key_range(vb.id, cid, start, end, excl_start=excl_start, excl_end=excl_end)
    return with_stored(live, seen, rows, cid=cid, now=now)


def sample_snapshot(vb: VBucket, samples: int, seed: int, *, cid: int = 0, now: float | None = None,
                    store=None) -> list[Item]:
    return sample(range_snapshot(vb, b"", None, cid=cid, now=now, store=store), samples, seed)


def sample(every: list[Item], samples: int, seed: int) -> list[Item]:
    """A Bernoulli sample of `every` (sorted by key), each kept with probability samples / len."""
    if len(every) <= samples:
        return every
    rng = random.Random(seed)
    p = samples / len(every)
    return [item for item in every if rng.random() < p]


def seqno_exists(vb: VBucket, seqno: int, stored_key) -> bool:
    """kv_engine's `seqno_exists` over disk and memory: the version with `seqno` is the latest of
    its key on disk (`Store.key_of_seqno` found its key, `stored_key`; else None) and memory holds
    no other version of that key (one not flushed yet supersedes it; an evicted key is on disk as
    it last was). The create waited for `seqno` to be persisted, so a version current in memory
    with that seqno is on disk too: no walk of the hash table is needed to find it."""
    if stored_key is None:
        return False
    item = vb.ht.get(stored_key)
    return item is None or item.by_seqno == seqno


def _by_key(item: Item) -> bytes:
    return item.key


class RangeScans:
    """A bucket's open scans (see the module docstring)."""

    def __init__(self, *, max_lifetime: float = DEFAULT_MAX_LIFETIME, max_scans: int = DEFAULT_MAX_SCANS,
                 clock: Callable[[], float] = time.monotonic):
        self.max_lifetime = max_lifetime
        self.max_scans = max_scans
        self._clock = clock
        self._scans: dict[bytes, RangeScan] = {}

    def __len__(self) -> int:
        return len(self._scans)

    def _expire(self) -> None:
        oldest = self._clock() - self.max_lifetime
        for scan_id in [s.id for s in self._scans.values() if s.created < oldest]:
            del self._scans[scan_id]

    def add(self, vbucket: int, items: list[Item], *, key_only: bool, include_xattrs: bool, cid: int = 0) -> RangeScan:
        self._expire()
        if len(self._scans) >= self.max_scans:
            raise EngineError(Status.EBUSY, f"{self.max_scans} range scans are open: continue or cancel one first")
        scan_id = secrets.token_bytes(16)
        while scan_id in self._scans:
            scan_id = secrets.token_bytes(16)
        scan = RangeScan(scan_id, vbucket, items, key_only=key_only, include_xattrs=include_xattrs,
                         created=self._clock(), cid=cid)
        self._scans[scan_id] = scan
        return scan

    def get(self, scan_id: bytes, vbucket: int) -> RangeScan:
        """KEY_ENOENT for an unknown, finished, cancelled or expired scan (or one of another vbucket)."""
        self._expire()
        scan = self._scans.get(scan_id)
        if scan is None or scan.vbucket != vbucket:
            raise EngineError(Status.KEY_ENOENT, f"no range scan {scan_id.hex()} on vbucket {vbucket}")
        return scan

    def remove(self, scan_id: bytes) -> None:
        self._scans.pop(scan_id, None)
