"""KV range scans over one vbucket: a snapshot of its live keys in a range (or a random sample of
them), handed out in key order by later continues.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/range_scans/range_scan_create.md and
range_scan_continue.md. The engine is memory-first, so the snapshot is taken from the hash table:
the live versions (items are immutable, so holding them costs references, not copies) whose keys
lie in the range, sorted by key as bytes. Writes after the create are not seen by the scan, as a
disk snapshot would not see them. A sampling scan keeps each live key with probability
samples / live keys (all of them when there are no more keys than samples), drawn from a PRNG
seeded with the request's seed, so the same seed over the same keys picks the same sample.

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
from .item import Item
from .vbucket import VBucket

DEFAULT_MAX_LIFETIME = 60.0  # kv_engine's range_scan_max_lifetime
DEFAULT_MAX_SCANS = 128


class RangeScan:
    """One open scan: its snapshot and how far continues have read it."""

    __slots__ = ("id", "vbucket", "items", "position", "key_only", "include_xattrs", "created", "cid")

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


def live_items(vb: VBucket, now: float, cid: int = 0) -> Iterator[Item]:
    """The live versions of collection `cid` in the vbucket (expired documents are left out; the
    pager deletes them). A scan covers one collection, so the range compares the keys' bytes."""
    for item in vb.ht.values():
        if item.cid == cid and not item.deleted and not (item.expiry and item.expiry <= now):
            yield item


def range_snapshot(vb: VBucket, start: bytes, end: bytes, *, cid: int = 0, excl_start: bool = False,
                   excl_end: bool = False, now: float | None = None) -> list[Item]:
    now = time.time() if now is None else now
    chosen = []
    for item in live_items(vb, now, cid):
        key = item.key
        if key < start or key > end or (excl_start and key == start) or (excl_end and key == end):
            continue
        chosen.append(item)
    chosen.sort(key=_by_key)
    return chosen


def sample_snapshot(vb: VBucket, samples: int, seed: int, *, cid: int = 0, now: float | None = None) -> list[Item]:
    now = time.time() if now is None else now
    every = sorted(live_items(vb, now, cid), key=_by_key)
    if len(every) <= samples:
        return every
    rng = random.Random(seed)
    p = samples / len(every)
    return [item for item in every if rng.random() < p]


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
