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
"""

import asyncio
import weakref

from dcpflow.engine.errors import EngineError
from dcpflow.engine.item import Item
from dcpflow.engine.range_scan import RangeScan, RangeScans, range_snapshot, sample_snapshot
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
    return _create(conn, frame, req)


def _check_collection(conn: Connection, cid: int) -> None:
    """UNKNOWN_COLLECTION for a collection the bucket's manifest lacks (created, or dropped since)."""
    if cid and conn.bucket.engine.manifest.by_id(cid) is None:
        raise EngineError(Status.UNKNOWN_COLLECTION, f"unknown collection 0x{cid:x}")


def _create(conn: Connection, frame: Frame, req: rsproto.RangeScanCreate) -> bytes:
    cfg = req.config
    _check_collection(conn, cfg.collection_id)  # again: it may have been dropped while the create waited
    vb = _active(conn, frame.vbucket)
    snap = cfg.snapshot
    if snap is not None:
        if snap.vbucket_uuid != vb.uuid:
            raise EngineError(Status.VB_UUID_NOT_EQUAL, f"vbucket {vb.id}'s uuid is {vb.uuid}, not {snap.vbucket_uuid}")
        if snap.seqno_exists and not any(item.by_seqno == snap.seqno for item in vb.ht.values()):
            raise EngineError(Status.NOT_STORED, f"no document version with seqno {snap.seqno} is stored")
    if cfg.sampling:
        items = sample_snapshot(vb, cfg.samples, cfg.seed, cid=cfg.collection_id)
    else:
        items = range_snapshot(vb, cfg.start, cfg.end, cid=cfg.collection_id, excl_start=cfg.excl_start,
                               excl_end=cfg.excl_end)
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


def continue_(conn: Connection, frame: Frame) -> bytes:
    req = rsproto.RangeScanContinue.from_frame(frame)
    scans = scans_of(conn)
    scan = scans.get(req.scan_id, frame.vbucket)
    vb = conn.get_vbucket(frame.vbucket)
    if vb is None or vb.state != VBucketState.ACTIVE:
        scans.remove(scan.id)
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {frame.vbucket} is no longer active here: the scan is "
                          "cancelled")
    if scan.cid and conn.bucket.engine.manifest.by_id(scan.cid) is None:
        scans.remove(scan.id)
        raise EngineError(Status.UNKNOWN_COLLECTION, f"collection 0x{scan.cid:x} was dropped: the scan is cancelled")
    byte_limit = min(req.byte_limit or CONTINUE_BYTES, CONTINUE_BYTES)
    frames: list[bytes] = []
    batch: list = []
    batch_bytes = 0
    for item in scan.take(req.item_limit, byte_limit, _size):
        entry = item.key if scan.key_only else _document(conn, item, scan)
        batch.append(entry)
        batch_bytes += _size(item)
        if batch_bytes >= FRAME_BYTES:
            frames.append(_frame(scan, batch, Status.SUCCESS, frame.opaque))
            batch, batch_bytes = [], 0
    if scan.done:
        scans.remove(scan.id)
        status = Status.RANGE_SCAN_COMPLETE
    else:
        status = Status.RANGE_SCAN_MORE
    frames.append(_frame(scan, batch, status, frame.opaque))
    return b"".join(frames)


def _frame(scan: RangeScan, batch: list, status: int, opaque: int) -> bytes:
    if scan.key_only:
        return rsproto.RangeScanContinueResponse(True, tuple(batch), (), status, opaque).encode()
    return rsproto.RangeScanContinueResponse(False, (), tuple(batch), status, opaque).encode()


def cancel(conn: Connection, frame: Frame) -> bytes:
    req = rsproto.RangeScanCancel.from_frame(frame)
    scans = scans_of(conn)
    scans.remove(scans.get(req.scan_id, frame.vbucket).id)
    return response(frame.opcode, opaque=frame.opaque)
