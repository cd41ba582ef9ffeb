"""KV range scan handlers: RANGE_SCAN_CREATE 0xda, RANGE_SCAN_CONTINUE 0xdb, RANGE_SCAN_CANCEL 0xdc.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/range_scans/range_scan_create.md,
range_scan_continue.md, range_scan_cancel.md. The snapshot and the registry of open scans are the
engine's (engine/range_scan.py); here the request is checked against the vbucket: it must be
active (NOT_MY_VBUCKET), its uuid the required one (VB_UUID_NOT_EQUAL), the required seqno
persisted, waiting up to `timeout_ms` (ETMPFAIL), and still stored with `seqno_exists`
(NOT_STORED); an empty range is KEY_ENOENT. A scan covers one collection: the CREATE's
`collection` (UNKNOWN_COLLECTION if the manifest lacks it, and on a continue once it is dropped).
A continue answers in frames of about FRAME_BYTES, the last one RANGE_SCAN_MORE or
RANGE_SCAN_COMPLETE; one continue returns at most
CONTINUE_BYTES (then MORE), so a scan without limits cannot make one huge reply. A vbucket that
stopped being active cancels its scans (NOT_MY_VBUCKET).

kv_engine scans a disk snapshot, so a scan returns every live document of the range with its
value whatever is in memory. The snapshot (engine/range_scan.py) holds a document whose value
was not resident - evicted, or under full eviction only on disk, whose metadata the create reads
from the store's key index on a worker thread - by its metadata. A continue reads those values
for the page it sends, a window of at most READ_WINDOW items at a time, through the bucket's
BgFetcher (bg_fetch.py: off the event loop, batched with the GETs' reads), by version; what it
reads is sent, never put back into memory (kv_engine's scans do not page documents in, and a
scan must not push the working set out of the quota). A key-only scan reads no value. While a
continue reads, another continue of the same scan answers EBUSY.

A document changed after the create: kv_engine's snapshot still has the version it had, and so
do we while the store does. A resident value was taken with the snapshot. A value read from the
store is the snapshot's version if the store's latest is still that one, or else if the history
kept for rollback still has it (compaction trims it): sent with the snapshot's metadata. Once the
store no longer has that version, the continue sends the key's latest stored version if it is
live (its own value, seqno and CAS: a document that exists is never lost, nor sent with a value
that is not its metadata's), and leaves the key out if it was deleted or expired since. A
document is never sent with an empty value it does not have.

`seqno_exists` is kv_engine's check of the by-seqno index: the store's row with that seqno (its
rowid is the vbucket and seqno, one point lookup on a worker thread) must exist and memory must
hold no newer version of its key.
"""

import asyncio
import functools
import inspect
import time
import weakref

from dcpflow.engine.errors import EngineError
from dcpflow.engine.eviction import FULL_EVICTION
from dcpflow.engine.hashtable import same_version
from dcpflow.engine.item import NOT_RESIDENT, Item
from dcpflow.engine.range_scan import (
    RangeScan,
    RangeScans,
    memory_snapshot,
    sample,
    seqno_exists,
    with_stored,
)
from dcpflow.engine.store_rows import doc_key
from dcpflow.engine.vbucket import VBucket, VBucketState
from dcpflow.protocol import range_scan as rsproto
from dcpflow.protocol.datatype import Datatype, join_xattrs, split_xattrs
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.status import Status

from . import kv
from .auth import Privilege
from .connection import Connection

#: A continue's answer is cut into frames of about this many bytes.
FRAME_BYTES = 64 * 1024
#: The most one continue returns when the client sets no (or a larger) byte limit.
CONTINUE_BYTES = 4 * 1024 * 1024
#: The most items of a page whose values a continue reads in one batch.
READ_WINDOW = 64
_XATTR = int(Datatype.XATTR)

_registries: "weakref.WeakKeyDictionary[object, RangeScans]" = weakref.WeakKeyDictionary()


def scans_of(conn: Connection) -> RangeScans:
    """The open scans of the connection's bucket (one registry per bucket engine)."""
    engine = conn.bucket.engine
    scans = _registries.get(engine)
    if scans is None:
        scans = _registries[engine] = RangeScans()
    return scans


def _active(conn: Connection, vbid: int) -> VBucket:
    vb = conn.get_vbucket(vbid)
    if vb is None or vb.state != VBucketState.ACTIVE:
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} is not active on this node")
    return vb


def create(conn: Connection, frame: Frame):
    req = rsproto.RangeScanCreate.from_frame(frame)
    cfg = req.config
    _check_collection(conn, cfg.collection_id)
    vb = _active(conn, frame.vbucket)
    snap = cfg.snapshot
    if snap is not None:
        if snap.vbucket_uuid != vb.uuid:
            raise EngineError(Status.VB_UUID_NOT_EQUAL, f"vbucket {vb.id}'s uuid is {vb.uuid}, not {snap.vbucket_uuid}")
        if vb.persisted_seqno < snap.seqno:
            if not snap.timeout_ms:
                raise EngineError(Status.ETMPFAIL, f"seqno {snap.seqno} is not persisted yet (persisted: "
                                  f"{vb.persisted_seqno})")
            return _create_when_persisted(conn, frame, req, vb.id, snap.timeout_ms / 1000)
    return _create(conn, frame, req)


async def _create_when_persisted(conn: Connection, frame: Frame, req: rsproto.RangeScanCreate, vbid: int,
                                 timeout: float) -> bytes:
    fut = conn.bucket.wait_persisted(vbid, req.config.snapshot.seqno)
    try:
        await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        raise EngineError(Status.ETMPFAIL, f"seqno {req.config.snapshot.seqno} was not persisted within "
                          f"{timeout:g} s") from None
    reply = _create(conn, frame, req)
    return await reply if inspect.isawaitable(reply) else reply


def _check_collection(conn: Connection, cid: int) -> None:
    """UNKNOWN_COLLECTION for a collection the bucket's manifest lacks (created, or dropped since)."""
    if cid and conn.bucket.engine.manifest.by_id(cid) is None:
        raise EngineError(Status.UNKNOWN_COLLECTION, f"unknown collection 0x{cid:x}")


def _bounds(cfg: rsproto.ScanConfig) -> dict:
    """The key range a CREATE covers, as memory_snapshot / Store.key_range take it (a sampling
    scan: the whole collection)."""
    if cfg.sampling:
        return {"start": b"", "end": None}
    return {"start": cfg.start, "end": cfg.end, "excl_start": cfg.excl_start, "excl_end": cfg.excl_end}


def _create(conn: Connection, frame: Frame, req: rsproto.RangeScanCreate):
    """The snapshot from memory alone, or (a coroutine) with what the store must tell: whether the
    required seqno is still stored, and under full eviction the documents memory lacks."""
    cfg = req.config
    _check_collection(conn, cfg.collection_id)  # again: it may have been dropped while the create waited
    vb = _active(conn, frame.vbucket)
    snap = cfg.snapshot
    if snap is not None and snap.vbucket_uuid != vb.uuid:
        raise EngineError(Status.VB_UUID_NOT_EQUAL, f"vbucket {vb.id}'s uuid is {vb.uuid}, not {snap.vbucket_uuid}")
    full = conn.bucket.engine.eviction_policy == FULL_EVICTION
    if full or (snap is not None and snap.seqno_exists):
        return _create_reading_store(conn, frame, req, full)
    live, seen = memory_snapshot(vb, cid=cfg.collection_id, **_bounds(cfg))
    return _register(conn, frame, req, vb, with_stored(live, seen, ()))


async def _create_reading_store(conn: Connection, frame: Frame, req: rsproto.RangeScanCreate, full: bool) -> bytes:
    """`_create` with the store's reads, each on a worker thread: the required seqno by its rowid
    (then memory's version of its key), and under full eviction the range's metadata, read after memory's snapshot so
    that a document evicted in between is not missed (engine/range_scan.py)."""
    cfg, vbid = req.config, frame.vbucket
    store = conn.bucket.engine.store
    loop = asyncio.get_running_loop()
    snap = cfg.snapshot
    if snap is not None and snap.seqno_exists:
        key = await loop.run_in_executor(None, store.key_of_seqno, vbid, snap.seqno)
        if not seqno_exists(_active(conn, vbid), snap.seqno, key):
            raise EngineError(Status.NOT_STORED, f"no document version with seqno {snap.seqno} is stored")
    vb = _active(conn, vbid)
    bounds = _bounds(cfg)
    now = time.time()
    live, seen = memory_snapshot(vb, cid=cfg.collection_id, now=now, **bounds)
    rows = ()
    if full:
        rows = await loop.run_in_executor(None, functools.partial(store.key_range, vbid, cfg.collection_id,
                                                                  **bounds))
        _check_collection(conn, cfg.collection_id)
        vb = _active(conn, vbid)
    return _register(conn, frame, req, vb, with_stored(live, seen, rows, cid=cfg.collection_id, now=now))


def _register(conn: Connection, frame: Frame, req: rsproto.RangeScanCreate, vb: VBucket, items: list[Item]) -> bytes:
    cfg = req.config
    if cfg.sampling:
        items = sample(items, cfg.samples, cfg.seed)
    if not items:
        raise EngineError(Status.KEY_ENOENT, "the range holds no document")
    include_xattrs = cfg.include_xattrs and conn.xattr
    scan = scans_of(conn).add(vb.id, items, key_only=cfg.key_only, include_xattrs=include_xattrs,
                              cid=cfg.collection_id)
    return rsproto.RangeScanCreateResponse(scan.id, frame.opaque).encode()


def _document(conn: Connection, item: Item, scan: RangeScan) -> rsproto.ScanDocument:
    value, datatype = item.value, item.datatype
    if datatype & _XATTR and scan.include_xattrs:
        if not conn.privileges & Privilege.SYSTEM_XATTR_READ:
            xattrs, body = split_xattrs(value)
            user = {k: v for k, v in xattrs.items() if not k.startswith("_")}
            value, datatype = (join_xattrs(user, body), datatype) if user else (body, datatype & ~_XATTR)
        if not conn.json:
            datatype &= ~int(Datatype.JSON)
    else:
        value, datatype = kv.outgoing_value(conn, value, datatype)
    return rsproto.ScanDocument(item.key, value, item.flags, item.expiry, item.by_seqno, item.cas, datatype)


def _size(item: Item) -> int:
    return len(item.key) + len(item.value) + 32


def _key_size(item: Item) -> int:
    """What a key-only scan's byte limit counts: the key (its value is neither sent nor read)."""
    return len(item.key) + 32


def _live_scan(conn: Connection, scans: RangeScans, scan_id: bytes, vbid: int) -> RangeScan:
    """The scan, if it is still open (KEY_ENOENT: cancelled, or expired), its vbucket active and its
    collection there; a scan whose vbucket or collection is gone is cancelled."""
    scan = scans.get(scan_id, vbid)
    vb = conn.get_vbucket(vbid)
    if vb is None or vb.state != VBucketState.ACTIVE:
        scans.remove(scan.id)
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} is no longer active here: the scan is cancelled")
    if scan.cid and conn.bucket.engine.manifest.by_id(scan.cid) is None:
        scans.remove(scan.id)
        raise EngineError(Status.UNKNOWN_COLLECTION, f"collection 0x{scan.cid:x} was dropped: the scan is cancelled")
    return scan


def continue_(conn: Connection, frame: Frame):
    """A page of the scan: straight from the snapshot when none of its values must be read (a
    key-only scan reads none), else (a coroutine) `_continue_reading`."""
    req = rsproto.RangeScanContinue.from_frame(frame)
    scans = scans_of(conn)
    scan = _live_scan(conn, scans, req.scan_id, frame.vbucket)
    byte_limit = min(req.byte_limit or CONTINUE_BYTES, CONTINUE_BYTES)
    if scan.cold:
        return _continue_reading(conn, frame, scans, scan, req.item_limit, byte_limit)
    reply = _Reply(scan, frame.opaque)
    size = _key_size if scan.key_only else _size
    for item in scan.take(req.item_limit, byte_limit, size):
        reply.add(item.key if scan.key_only else _document(conn, item, scan), size(item))
    return reply.end(scans)


async def _continue_reading(conn: Connection, frame: Frame, scans: RangeScans, scan: RangeScan, item_limit: int,
                            byte_limit: int) -> bytes:
    """A page of a scan holding values that were not resident: a window of the next items at a
    time, its missing values read (`_values`), then taken within the limits; a value read for an
    item beyond them is read again by the next continue (a window is at most READ_WINDOW items,
    fewer when the byte limit leaves room for fewer)."""
    if scan.busy:  # only a scan that reads values is ever busy: the one check is here
        raise EngineError(Status.EBUSY, f"range scan {scan.id.hex()} is already being continued")
    scan.busy = True
    try:
        reply = _Reply(scan, frame.opaque)
        given = used = 0
        average = 256  # bytes per document, learned as they are read: how many fit the byte limit
        while not scan.done and not (item_limit and given >= item_limit) and not (given and used >= byte_limit):
            n = min(READ_WINDOW, item_limit - given if item_limit else READ_WINDOW,
                    max(1, -(-(byte_limit - used) // average)))
            window = scan.peek(n)
            docs = await _values(conn, frame.vbucket, window)
            scan = _live_scan(conn, scans, scan.id, frame.vbucket)  # cancelled, or its vbucket gone, meanwhile
            for doc in docs:
                if (item_limit and given >= item_limit) or (given and used >= byte_limit):
                    break
                scan.skip()
                if doc is not None:
                    given += 1
                    used += _size(doc)
                    reply.add(_document(conn, doc, scan), _size(doc))
            average = max(1, used // given) if given else average
        return reply.end(scans)
    finally:
        scan.busy = False


async def _values(conn: Connection, vbid: int, window: list[Item]) -> list[Item | None]:
    """The window's documents with their values: a resident one as the snapshot has it; one whose
    value was not resident from memory if memory has that version resident again, else read from
    the store (batched with the bucket's other background fetches, bg_fetch.py) and judged by
    `_as_snapshot`. Nothing read goes into memory."""
    out: list[Item | None] = list(window)
    vb = conn.get_vbucket(vbid)
    fetcher = conn.bucket.bg_fetcher
    reads: dict[int, asyncio.Future] = {}
    for i, item in enumerate(window):
        if item.value is not NOT_RESIDENT:
            continue
        key = doc_key(item.cid, item.key)
        now = vb.ht.get(key)
        if now is not None and now.value is not NOT_RESIDENT and same_version(now, item):
            out[i] = _with_value(item, now.value)
        else:
            reads[i] = fetcher.fetch_version(vbid, key, item.by_seqno)
    if reads:
        found = await asyncio.gather(*reads.values())
        now = time.time()
        for i, stored in zip(reads, found, strict=True):
            out[i] = _as_snapshot(window[i], stored, now)
    return out


def _with_value(item: Item, value: bytes) -> Item:
    """The snapshot's version with the value read for it (built directly: dataclasses.replace
    re-inspects the fields on every call, the largest cost of a scan read from disk)."""
    return Item(item.key, value, item.flags, item.expiry, item.cas, item.rev_seqno, item.by_seqno, item.datatype,
                item.deleted, item.delete_time, item.delete_source, item.cid)


def _as_snapshot(item: Item, stored: Item | None, now: float) -> Item | None:
    """What a continue sends for a snapshot entry whose value it read (module docstring): the
    snapshot's version (its metadata, the stored value) if the store still has it; else the key's
    later version if it is live; else nothing (deleted or expired since, its old value gone)."""
    if stored is None:
        return None
    if stored.by_seqno == item.by_seqno:
        return _with_value(item, stored.value)
    if stored.deleted or (stored.expiry and stored.expiry <= now):
        return None
    return stored


class _Reply:
    """A continue's answer: its entries cut into frames of about FRAME_BYTES."""

    __slots__ = ("scan", "opaque", "frames", "batch", "batch_bytes")

    def __init__(self, scan: RangeScan, opaque: int):
        self.scan, self.opaque = scan, opaque
        self.frames: list[bytes] = []
        self.batch: list = []
        self.batch_bytes = 0

    def add(self, entry, size: int) -> None:
        self.batch.append(entry)
        self.batch_bytes += size
        if self.batch_bytes >= FRAME_BYTES:
            self.frames.append(self._frame(Status.SUCCESS))
            self.batch, self.batch_bytes = [], 0

    def end(self, scans: RangeScans) -> bytes:
        """The frames, the last one RANGE_SCAN_COMPLETE (the scan is then closed) or RANGE_SCAN_MORE."""
        if self.scan.done:
            scans.remove(self.scan.id)
            self.frames.append(self._frame(Status.RANGE_SCAN_COMPLETE))
        else:
            self.frames.append(self._frame(Status.RANGE_SCAN_MORE))
        return b"".join(self.frames)

    def _frame(self, status: int) -> bytes:
        batch = tuple(self.batch)
        if self.scan.key_only:
            return rsproto.RangeScanContinueResponse(True, batch, (), status, self.opaque).encode()
        return rsproto.RangeScanContinueResponse(False, (), batch, status, self.opaque).encode()


def cancel(conn: Connection, frame: Frame) -> bytes:
    req = rsproto.RangeScanCancel.from_frame(frame)
    scans = scans_of(conn)
    scans.remove(scans.get(req.scan_id, frame.vbucket).id)
    return response(frame.opcode, opaque=frame.opaque)
