"""KV command handlers: the engine's operations behind the binary protocol.

Pages: BinaryProtocol.md (#0x00-get, #0x01-set, #0x04-delete, #0x1c-touch, #0x3d-set-vbucket,
#0x96 Get Failover Log), engines/ep/docs/protocol/set_with_meta.md, del_with_meta.md, get_meta.md,
dcp/documentation/commands/get_seqno.md and persist_seqno.md, docs/Collections.md.

Every handler decodes its request with the protocol's typed decoder (which runs the page's rules,
so a malformed request answers EINVAL with a reason); GET and SET skip the decoder only when the
frame has the common valid shape (a strict subset of what the rules accept), which is most of
their cost per request. Handlers let EngineError carry the status of a refusal (KEY_ENOENT,
KEY_EEXISTS for a CAS mismatch or an existing key, NOT_MY_VBUCKET, ETMPFAIL for a pending
vbucket...). The engine decides the bucket-mode rules of *WithMeta. Quiet variants
send nothing on success (mutations) or on a miss (gets).

Evicted values (engine/memory.py): a GET of a document whose value the item pager evicted reads it
back from the store on a worker thread (kv_engine's background fetch), so the event loop keeps
serving; the connection's later requests wait behind it, as replies stay in order. The other
commands that read a value (GAT, GET_LOCKED, APPEND, INCREMENT...) fetch it in the engine.

Keys: with HELLO Collections a key starts with its LEB128 collection id (Collections.md). The
engine's key is the key without the prefix in the default collection (id 0) and (collection id,
key) in any other (engine/vbucket.py); an id the bucket's manifest does not have answers
UNKNOWN_COLLECTION, with the manifest's uid in the reply (connection.py) so the SDKs refresh
their collection ids and retry. A key's own rules (its length, reserved ids) are checked before
the collection exists or not, as kv_engine does.
"""

import asyncio
import contextlib
import functools
import json

from dcpflow.engine.collections import DEFAULT_SCOPE, Manifest, ManifestError
from dcpflow.engine.errors import EngineError
from dcpflow.engine.item import NOT_RESIDENT
from dcpflow.engine.vbucket import VBucket, VBucketState
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol import meta as metaproto
from dcpflow.protocol import snappy
from dcpflow.protocol.datatype import Datatype, check_xattrs, is_json, split_xattrs
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import (
    MAX_VALUE_LEN,
    Frame,
    RequestFrameId,
    decode_frame_infos,
    response,
)
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import MAX_KEY_LEN, check_document_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .connection import Connection
from .durable import SyncWrite

_JSON, _SNAPPY, _XATTR = int(Datatype.JSON), int(Datatype.SNAPPY), int(Datatype.XATTR)  # ints: IntFlag ops are slow
_NUMBER_CHARS = b"0123456789.eE+-"
_JSON_WS = b" \t\r\n"
_JSON_FIRST_BYTES = frozenset(b'{["tfn' + _NUMBER_CHARS + _JSON_WS)
#: How long SEQNO_PERSISTENCE waits before ETMPFAIL (ep-engine's seqno persistence timeout).
SEQNO_PERSISTENCE_TIMEOUT = 30.0


# ---------------------------------------------------------------------------------------------
# helpers


def doc_key(conn: Connection, wire_key: bytes):
    """The engine key of a request's key (module docstring): bytes in the default collection,
    (collection id, key) in another collection of the bucket's manifest. The key's rules come
    first (EINVAL), the collection's existence after (UNKNOWN_COLLECTION), as in kv_engine."""
    cid, key = check_document_key(wire_key, conn.collections)
    if cid != 0:
        if conn.bucket.engine.manifest.by_id(cid) is None:
            raise EngineError(Status.UNKNOWN_COLLECTION, f"unknown collection 0x{cid:x}")
        return (cid, key)
    return key


def active_vbucket(conn: Connection, vbid: int) -> VBucket:
    vb = conn.get_vbucket(vbid)
    if vb is None:
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} is not on this node")
    return vb


_pack_response = kvproto.pack_response  # a reply with no body: the mutation replies without a token
_pack_mutation_reply = kvproto.pack_mutation_response
_pack_get_head = kvproto.pack_get_response_head  # key and value follow


def mutation_reply(conn: Connection, frame: Frame, vb: VBucket, cas: int, seqno: int) -> bytes:
    """Success reply of a mutation: CAS, plus (vbucket uuid, seqno) with HELLO MutationSeqno.

    The hot paths (GET, SET, DELETE) pack whole replies with the protocol's packers
    (pack_response, pack_mutation_response, pack_get_response_head) instead of encoding a typed
    response: same bytes, without building a message per reply."""
    if conn.mutation_seqno:
        return _pack_mutation_reply(frame.opcode, frame.opaque, cas, vb.uuid, seqno)
    return _pack_response(frame.opcode, frame.opaque, cas)


def _looks_like_json(value: bytes) -> bool:
    """Cheap rejections first: most binary values fail on their first byte without a parse."""
    if not value:
        return False
    first = value[0]
    if first in _JSON_WS or value[-1] in _JSON_WS:  # JSON may have whitespace around (rare: only then a copy)
        value = value.strip(_JSON_WS)
        if not value:
            return False
        first = value[0]
    if first in b"{[\"":
        return is_json(value)
    if first in _NUMBER_CHARS:
        if value.strip(_NUMBER_CHARS):
            return False  # not made only of number characters
        return is_json(value)
    return value in (b"true", b"false", b"null")


def incoming_datatype(conn: Connection, datatype: int, value: bytes) -> int:
    """The datatype to store: only bits the client negotiated (a Snappy value is inflated first);
    a client that did not negotiate JSON gets its JSON values detected, as memcached does."""
    allowed = (_JSON if conn.json else 0) | (_XATTR if conn.xattr else 0)
    if datatype & ~allowed:
        raise ProtocolError(f"datatype 0x{datatype:02x} uses bits this connection did not negotiate with HELLO "
                            f"(allowed: 0x{allowed:02x})")
    if datatype & _XATTR:
        try:
            check_xattrs(value)
            _, body = split_xattrs(value)
        except ProtocolError as e:
            raise ProtocolError(f"malformed xattrs: {e.reason}", Status.XATTR_EINVAL) from None
    else:
        body = value
    if not datatype & _JSON and _looks_like_json(body):
        datatype |= _JSON
    return datatype


def inflate(conn: Connection, value: bytes, datatype: int) -> tuple[bytes, int]:
    """A Snappy-compressed value (datatype 0x02) as the engine keeps it: inflated. Values are
    stored and served uncompressed (kv_engine's compression_mode off); a client that negotiated
    HELLO Snappy may send them compressed, and only such a client."""
    if Feature.SNAPPY not in conn.features:
        raise ProtocolError(f"datatype 0x{datatype:02x} has the Snappy bit, which needs HELLO Snappy")
    return snappy.decompress(value), datatype & ~_SNAPPY


def outgoing_value(conn: Connection, value: bytes, datatype: int) -> tuple[bytes, int]:
    """What a GET returns: the body without xattrs, and JSON only if the client negotiated it."""
    if datatype & _XATTR:
        _, value = split_xattrs(value)
        datatype &= ~_XATTR
    if not conn.json:
        datatype &= ~_JSON
    return value, datatype


def has_preserve_ttl(frame: Frame) -> bool:
    return bool(frame.framing) and any(fid == RequestFrameId.PRESERVE_TTL
                                       for fid, _ in decode_frame_infos(frame.framing))


# ---------------------------------------------------------------------------------------------
# documents

_GET_QUIET = frozenset((int(Opcode.GET_Q), int(Opcode.GET_KQ)))  # plain ints, as the frame has them
_GET_WITH_KEY = frozenset((int(Opcode.GET_K), int(Opcode.GET_KQ)))


def get(conn: Connection, frame: Frame) -> bytes | None:
    """GET / GETQ / GETK / GETKQ. The hottest read path: the frame is unpacked in one step (no
    property calls), the common, valid shape skips the typed decoder, and a live, resident
    document without expiry, lock or xattrs is answered with the reply the hash table packs from
    its record (VBucket.get_reply); anything else takes the general path (`_get_reply`)."""
    _, op, _, vbid, opaque, _, _, extras, wire_key, value = frame
    if extras or value or not wire_key:
        kvproto.Get.from_frame(frame)
    counters = conn.bucket.counters
    counters.cmd_get += 1
    vb = conn.get_vbucket(vbid)
    if vb is None:
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} is not on this node")
    key = wire_key
    if conn.collections or len(key) > MAX_KEY_LEN:
        key = doc_key(conn, key)
    reply = vb.get_reply(key, op, opaque, wire_key if op in _GET_WITH_KEY else b"", conn.json)
    if reply is not None:  # the common case, packed from the table (no Item built)
        counters.get_hits += 1
        return reply
    try:
        item = vb.get(key, False)
    except EngineError as e:
        return _missed(counters, op, e)
    if item.value is NOT_RESIDENT:
        return _bg_fetch(conn, vb, key, wire_key, op, opaque)
    counters.get_hits += 1
    return _get_reply(conn, vb, item, key, wire_key, op, opaque)


#: GET, GETQ, GETK, GETKQ: the reads `read_ahead` starts early.
GET_OPS = frozenset((int(Opcode.GET), int(Opcode.GET_Q), int(Opcode.GET_K), int(Opcode.GET_KQ)))
#: The most buffered requests one read-ahead looks at.
READ_AHEAD_MAX = 64


def read_ahead(conn: Connection, frames) -> None:
    """A connection that runs its requests in order waits for a GET of a document on disk
    (`_bg_fetch`); the GETs buffered behind it (`frames`) would each wait their turn for a read of
    their own, so their background fetches start now, in the same batch (bg_fetch.py), and a
    document read comes back into the hash table as soon as it is read (`VBucket.restore`, which
    keeps what changed meanwhile): the GET, when its turn comes, finds it in memory. A pipelined
    read-back of documents on disk then costs a batch per window, not a thread hand-off per GET.
    Only well-formed GETs of this bucket's active vbuckets; anything else waits for its turn."""
    bucket = conn.bucket
    fetcher = bucket.bg_fetcher
    for frame in frames[:READ_AHEAD_MAX]:
        _, op, _, vbid, _, _, _, extras, wire_key, value = frame
        if op not in GET_OPS or extras or value or not wire_key:
            continue
        vb = conn.get_vbucket(vbid)
        if vb is None or vb.state != VBucketState.ACTIVE:
            continue
        key = wire_key
        try:
            if conn.collections or len(key) > MAX_KEY_LEN:
                key = doc_key(conn, key)
        except (EngineError, ProtocolError):
            continue
        if vb.recommitting and key in vb.recommitting:
            continue
        if vb.needs_fetch(key):  # (no side effect: the GET itself counts, expires, answers)
            fetcher.fetch(vb.id, key).add_done_callback(functools.partial(_read_ahead_done, vb, key, vb.evicted))


def _read_ahead_done(vb: VBucket, key, evicted: int, fut) -> None:
    """A read-ahead's document back into the hash table, if it still may (VBucket.restore); a read
    that failed, or a version that changed meanwhile, is left to the GET's own fetch."""
    if fut.cancelled() or fut.exception() is not None:
        return
    with contextlib.suppress(EngineError):
        vb.restore(key, fut.result(), evicted)


def _missed(counters, op: int, e: EngineError) -> None:
    """A GET that found nothing: counted as a miss; a quiet GET answers nothing, others the error."""
    if e.status == Status.KEY_ENOENT:
        counters.get_misses += 1
        if op in _GET_QUIET:
            return None
    raise e


def _get_reply(conn: Connection, vb: VBucket, item, key: bytes, wire_key: bytes, op: int, opaque: int) -> bytes:
    datatype = item.datatype
    if datatype & _XATTR or (datatype and not conn.json):
        value, datatype = outgoing_value(conn, item.value, datatype)
    else:
        value = item.value
    cas = _reported_cas(vb, key, item.cas) if vb.locks else item.cas
    key = wire_key if op in _GET_WITH_KEY else b""
    return b"".join((_pack_get_head(op, opaque, cas, item.flags, datatype, len(key), len(value)), key, value))


async def _bg_fetch(conn: Connection, vb: VBucket, key: bytes, wire_key: bytes, op: int, opaque: int) -> bytes | None:
    """The GET of an evicted value: read on a worker thread with the bucket's other background
    fetches (bg_fetch.py: a pooled read connection that no flush batch holds up), put back into
    the hash table here, then answered as the key stands now (it may have changed meanwhile)."""
    evicted = vb.evicted  # full eviction: whether the read is still current when it is done
    stored = await conn.bucket.bg_fetcher.fetch(vb.id, key)
    vb.restore(key, stored, evicted)
    counters = conn.bucket.counters
    try:
        item = vb.get(key)
    except EngineError as e:
        return _missed(counters, op, e)
    counters.get_hits += 1
    return _get_reply(conn, vb, item, key, wire_key, op, opaque)


_SET, _SET_Q = int(Opcode.SET), int(Opcode.SET_Q)  # plain ints: IntEnum lookups cost on every request
_ADD_OPS = frozenset((int(Opcode.ADD), int(Opcode.ADD_Q)))
_QUIET_STORE_OPS = frozenset((_SET_Q, int(Opcode.ADD_Q), int(Opcode.REPLACE_Q)))
_unpack_store_extras = kvproto.STORE_EXTRAS.unpack


def store(conn: Connection, frame: Frame, sync: SyncWrite | None = None) -> bytes | None:
    """SET / ADD / REPLACE and their quiet twins (silent on success); with `sync`, a durable write
    (durable.py).

    The hottest write path: the frame is unpacked in one step, the common valid shape skips the
    typed decoder, and the success reply is packed here (mutation_reply's bytes)."""
    _, op, datatype, vbid, opaque, cas, framing, extras, key, value = frame
    if len(extras) != 8 or not key or datatype > 7:  # the common, valid shape skips the decoder
        kvproto.Store.from_frame(frame)
    flags, expiry = _unpack_store_extras(extras)
    if len(value) > MAX_VALUE_LEN:
        raise EngineError(Status.E2BIG, f"value is {len(value)} bytes; the limit is {MAX_VALUE_LEN}")
    if conn.collections or len(key) > MAX_KEY_LEN:
        key = doc_key(conn, key)
    if datatype:
        if datatype & _SNAPPY:
            value, datatype = inflate(conn, value, datatype)
        datatype = incoming_datatype(conn, datatype, value)
    elif value and value[0] in _JSON_FIRST_BYTES and _looks_like_json(value):
        datatype = _JSON
    vb = conn.get_vbucket(vbid)
    if vb is None:
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {vbid} is not on this node")
    conn.bucket.counters.cmd_set += 1
    w = vb if sync is None else sync.writer(vb)
    if op in (_SET, _SET_Q):
        if framing and has_preserve_ttl(frame):
            expiry = _current_expiry(vb, key, expiry)
        item = w.set(key, value, flags=flags, expiry=expiry, datatype=datatype, cas=cas)
    elif op in _ADD_OPS:
        if cas:
            raise ProtocolError("ADD must not carry a CAS (BinaryProtocol.md#0x01-set)")
        item = w.add(key, value, flags=flags, expiry=expiry, datatype=datatype)
    else:
        if framing and has_preserve_ttl(frame):
            expiry = _current_expiry(vb, key, expiry)
        item = w.replace(key, value, flags=flags, expiry=expiry, datatype=datatype, cas=cas)
    if op in _QUIET_STORE_OPS:
        return None
    if conn.mutation_seqno:
        return _pack_mutation_reply(op, opaque, item.cas, vb.uuid, item.by_seqno)
    return _pack_response(op, opaque, item.cas)


def _current_expiry(vb: VBucket, key: bytes, default: int) -> int:
    """Preserve-TTL: keep the stored document's (absolute) expiry; a new document takes `default`."""
    try:
        return vb.get(key).expiry
    except EngineError as e:
        if e.status == Status.KEY_ENOENT:
            return default
        raise


def delete(conn: Connection, frame: Frame, sync: SyncWrite | None = None) -> bytes | None:
    req = kvproto.Delete.from_frame(frame)
    vb = active_vbucket(conn, frame.vbucket)
    conn.bucket.counters.cmd_delete += 1
    item = (vb if sync is None else sync.writer(vb)).delete(doc_key(conn, req.key), cas=req.cas)
    if req.quiet:
        return None
    return mutation_reply(conn, frame, vb, item.cas, item.by_seqno)


def touch(conn: Connection, frame: Frame) -> bytes:
    """TOUCH replies with the new CAS only (no mutation extras, as memcached does)."""
    req = kvproto.Touch.from_frame(frame)
    item = active_vbucket(conn, frame.vbucket).touch(doc_key(conn, req.key), req.expiry)
    return response(frame.opcode, opaque=frame.opaque, cas=item.cas)


def get_and_touch(conn: Connection, frame: Frame) -> bytes | None:
    req = kvproto.Gat.from_frame(frame)
    try:
        item = active_vbucket(conn, frame.vbucket).get_and_touch(doc_key(conn, req.key), req.expiry)
    except EngineError as e:
        if e.status == Status.KEY_ENOENT and req.quiet:
            return None
        raise
    value, datatype = outgoing_value(conn, item.value, item.datatype)
    return kvproto.GetResponse(item.flags, value, item.cas, datatype, opaque=frame.opaque, opcode=frame.opcode).encode()


#: The CAS a GET reports for a locked document (Document.md: -1).
LOCKED_CAS = 0xFFFF_FFFF_FFFF_FFFF


def _reported_cas(vb: VBucket, key: bytes, cas: int) -> int:
    """The CAS a read tells (GET, GET_META): a locked document's is hidden, as the lock's CAS would
    let anyone past the lock (Document.md)."""
    return LOCKED_CAS if vb.locks and vb.lock_cas(key) is not None else cas
#: GET_LOCKED's lock time when the request gives none (0) or more than the maximum: Couchbase's
#: getl_default_timeout and getl_max_timeout.
GETL_DEFAULT_TIMEOUT = 15
GETL_MAX_TIMEOUT = 30


def get_locked(conn: Connection, frame: Frame) -> bytes:
    """GET_LOCKED (the SDK's get_and_lock): the document, with the lock's CAS."""
    req = kvproto.GetLocked.from_frame(frame)
    lock_time = req.lock_time if 0 < req.lock_time <= GETL_MAX_TIMEOUT else GETL_DEFAULT_TIMEOUT
    item = active_vbucket(conn, frame.vbucket).get_locked(doc_key(conn, req.key), lock_time)
    conn.bucket.counters.cmd_get += 1
    value, datatype = outgoing_value(conn, item.value, item.datatype)
    return kvproto.GetResponse(item.flags, value, item.cas, datatype, opaque=frame.opaque, opcode=frame.opcode).encode()


def unlock_key(conn: Connection, frame: Frame) -> bytes:
    req = kvproto.Unlock.from_frame(frame)
    active_vbucket(conn, frame.vbucket).unlock(doc_key(conn, req.key), req.cas)
    return response(frame.opcode, opaque=frame.opaque)


def get_replica(conn: Connection, frame: Frame) -> bytes:
    """GET_REPLICA 0x83: the document as this node's replica of the vbucket has it (NOT_MY_VBUCKET
    if the copy here is not a replica, KEY_ENOENT for none or a tombstone)."""
    req = kvproto.GetReplica.from_frame(frame)
    key = doc_key(conn, req.key)
    vb = conn.get_vbucket(frame.vbucket)
    if vb is None:
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {frame.vbucket} is not on this node")
    item = vb.replica_version(key)
    counters = conn.bucket.counters
    counters.cmd_get += 1
    if item is None or item.deleted:
        counters.get_misses += 1
        raise EngineError(Status.KEY_ENOENT, f"key {key!r} not found in replica vbucket {vb.id}")
    counters.get_hits += 1
    value, datatype = outgoing_value(conn, item.value, item.datatype)
    return kvproto.GetResponse(item.flags, value, item.cas, datatype, opaque=frame.opaque,
                               opcode=frame.opcode).encode()


# ---------------------------------------------------------------------------------------------
# metadata commands (replication)


def get_meta(conn: Connection, frame: Frame) -> bytes | None:
    """GET_META reports tombstones too (deleted=1); GETQ_META is silent on a miss."""
    req = metaproto.GetMeta.from_frame(frame)
    vb, key = active_vbucket(conn, frame.vbucket), doc_key(conn, req.key)
    try:
        item = vb.get_meta(key)
    except EngineError as e:
        if e.status == Status.KEY_ENOENT and req.opcode == Opcode.GETQ_META:
            return None
        raise
    return metaproto.GetMetaResponse(
        deleted=1 if item.deleted else 0, flags=item.flags, expiry=item.meta_expiry, rev_seqno=item.rev_seqno,
        cas=_reported_cas(vb, key, item.cas), datatype=item.datatype if req.wants_datatype else None,
        opaque=frame.opaque, opcode=frame.opcode).encode()


def _with_meta_value(conn: Connection, value: bytes, datatype: int) -> tuple[bytes, int]:
    if datatype & _SNAPPY:
        value, datatype = inflate(conn, value, datatype)
    if datatype & _XATTR and not conn.xattr:
        raise ProtocolError("a value with xattrs needs HELLO Xattr")
    return value, datatype


def set_with_meta(conn: Connection, frame: Frame) -> bytes | None:
    req = metaproto.SetWithMeta.from_frame(frame)
    key = doc_key(conn, req.key)
    value, datatype = _with_meta_value(conn, req.value, req.datatype)
    vb = active_vbucket(conn, frame.vbucket)
    fn = vb.add_with_meta if req.is_add else vb.set_with_meta
    item = fn(key, value, cas=req.meta_cas, rev_seqno=req.rev_seqno, flags=req.flags, expiry=req.expiration,
              datatype=datatype, options=req.options or 0, check_cas=req.cas)
    if req.quiet:
        return None
    return mutation_reply(conn, frame, vb, item.cas, item.by_seqno)


def del_with_meta(conn: Connection, frame: Frame) -> bytes | None:
    req = metaproto.DelWithMeta.from_frame(frame)
    key = doc_key(conn, req.key)
    value, datatype = _with_meta_value(conn, req.value, req.datatype)
    vb = active_vbucket(conn, frame.vbucket)
    item = vb.del_with_meta(key, cas=req.meta_cas, rev_seqno=req.rev_seqno, flags=req.flags,
                            delete_time=req.delete_time, options=req.options or 0, value=value,
                            datatype=datatype, check_cas=req.cas)
    if req.quiet:
        return None
    return mutation_reply(conn, frame, vb, item.cas, item.by_seqno)


# ---------------------------------------------------------------------------------------------
# vbuckets and seqnos

_ALIVE = (VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.PENDING)


def get_all_vb_seqnos(conn: Connection, frame: Frame) -> bytes:
    """(vbucket, high seqno) of every vbucket in the state filter (none or 0: alive), by vbucket. With a
    collection id (get_seqno.md), that collection's high seqno in each: the seqno of its last
    document or, before any, of its create event."""
    req = kvproto.GetAllVbSeqnos.from_frame(frame)
    states = _ALIVE if not req.state else (VBucketState(req.state),)
    engine = conn.bucket.engine
    vbs = engine.vbuckets
    cid = req.collection_id
    if cid is not None and cid != 0:
        if engine.manifest.by_id(cid) is None:
            raise EngineError(Status.UNKNOWN_COLLECTION, f"unknown collection 0x{cid:x}")
        seqnos = tuple((vbid, vbs[vbid].collection_high_seqno(cid)) for vbid in sorted(vbs)
                       if vbs[vbid].state in states)
    elif cid == 0:
        seqnos = tuple((vbid, vbs[vbid].collection_high_seqno(0)) for vbid in sorted(vbs) if vbs[vbid].state in states)
    else:
        seqnos = tuple((vbid, vbs[vbid].high_seqno) for vbid in sorted(vbs) if vbs[vbid].state in states)
    return kvproto.GetAllVbSeqnosResponse(seqnos, frame.opaque).encode()


def get_failover_log(conn: Connection, frame: Frame) -> bytes:
    """GET_FAILOVER_LOG 0x96: the header's vbucket's log, newest entry first."""
    dcpproto.DcpGetFailoverLog.from_frame(frame)  # same shape as 0x54: no extras, key or value
    vb = active_or_any_vbucket(conn, frame.vbucket)
    entries = tuple((e.uuid, e.seqno) for e in vb.failover.entries)
    return dcpproto.FailoverLogResponse(entries, frame.opaque, opcode=frame.opcode).encode()


def active_or_any_vbucket(conn: Connection, vbid: int) -> VBucket:
    """Seqno/failover queries are answered for a vbucket in any state (DCP streams from replicas)."""
    return conn.bucket.engine.vbucket(vbid)


def observe_seqno(conn: Connection, frame: Frame) -> bytes:
    """How far the vbucket has persisted. If the UUID asked about is an older entry of the failover
    log (a failover happened since the client's write), format 1 adds that UUID and the last seqno of
    its branch, so the client can tell whether its write survived; an unknown UUID is KEY_ENOENT."""
    req = kvproto.ObserveSeqno.from_frame(frame)
    vb = active_or_any_vbucket(conn, frame.vbucket)
    entries = vb.failover.entries
    old_uuid = last_received = None
    if req.vbucket_uuid != entries[0].uuid:
        index = vb.failover.find(req.vbucket_uuid)
        if index is None:
            raise EngineError(Status.KEY_ENOENT, f"vbucket uuid {req.vbucket_uuid} is not in the failover log")
        old_uuid, last_received = req.vbucket_uuid, entries[index - 1].seqno
    return kvproto.ObserveSeqnoResponse(vb.id, vb.uuid, vb.persisted_seqno, vb.high_seqno, old_uuid, last_received,
                                        frame.opaque).encode()


def set_vbucket(conn: Connection, frame: Frame):
    """SET_VBUCKET 0x3d (the cluster manager's command): create the vbucket or change its state. The
    optional JSON value (set-vbucket-state-value.md, which belongs to this command) may carry the
    vbucket's `topology`: its replication chains, node names first the active's (null: a replica
    slot with no node); the first chain is what sync writes need a majority of (engine/durability/).
    Without one an active vbucket refuses durable writes with DURABILITY_IMPOSSIBLE, as kv_engine's
    does before ns_server sets a topology.

    The reply promises the new state (and a new failover entry) is on disk. While a flush batch is
    being written the engine can only queue the state row behind it (the batch carries the older
    row), so then the change waits until no batch is in flight and is written at once."""
    req = kvproto.SetVbucket.from_frame(frame)
    state = VBucketState(req.state)
    engine = conn.bucket.engine
    chain = _first_chain(req)

    def apply() -> bytes:
        vb = engine.set_vbucket_state(req.vbucket, state)
        if chain is not None or state != VBucketState.ACTIVE:
            vb.set_topology(chain)
        conn.server.topology.bump()
        return response(frame.opcode, opaque=frame.opaque)

    return conn.server.when_no_flush(engine, apply)


def _first_chain(req: kvproto.SetVbucket) -> list | None:
    try:
        doc = req.json
    except ValueError:
        raise ProtocolError("the SET_VBUCKET value is not JSON (set-vbucket-state-value.md)") from None
    topology = doc.get("topology") if isinstance(doc, dict) else None
    if topology is None:
        return None
    if (not isinstance(topology, list) or not topology or not all(isinstance(c, list) for c in topology)
            or not topology[0] or not isinstance(topology[0][0], str)
            or not all(n is None or isinstance(n, str) for c in topology for n in c)):
        raise ProtocolError("SET_VBUCKET topology must be a list of chains of node names (null: no node), "
                            "each starting with the active's name (set-vbucket-state-value.md)")
    return topology[0]


def get_vbucket(conn: Connection, frame: Frame) -> bytes:
    kvproto.GetVbucket.from_frame(frame)
    vb = active_or_any_vbucket(conn, frame.vbucket)
    return kvproto.GetVbucketResponse(int(vb.state), frame.opaque).encode()


def stop_persistence(conn: Connection, frame: Frame) -> bytes:
    """Pause the flusher of the selected bucket (ep-engine's stop_persistence; tests use it to have
    acknowledged but unpersisted writes). The reply comes once a batch already being written is
    done, so from then on nothing more reaches the disk. A clean shutdown still flushes everything."""
    _check_empty(frame)
    conn.bucket.persistence_paused = True

    async def settled() -> bytes:
        await conn.server.flush_settled()
        return response(frame.opcode, opaque=frame.opaque)

    return settled()


def start_persistence(conn: Connection, frame: Frame) -> bytes:
    _check_empty(frame)
    conn.bucket.persistence_paused = False
    conn.server.wake_flusher()
    return response(frame.opcode, opaque=frame.opaque)


def _check_empty(frame: Frame) -> None:
    if frame.extras or frame.key or frame.value:
        raise ProtocolError(f"{Opcode(frame.opcode).name} takes no extras, key or value")


def seqno_persistence(conn: Connection, frame: Frame):
    """Reply once the vbucket has persisted up to the seqno (persist_seqno.md), or ETMPFAIL after
    SEQNO_PERSISTENCE_TIMEOUT. The connection processes nothing else meanwhile (replies stay in order)."""
    req = kvproto.SeqnoPersistence.from_frame(frame)
    vb = active_or_any_vbucket(conn, frame.vbucket)
    if vb.persisted_seqno >= req.seqno:
        return response(frame.opcode, opaque=frame.opaque)
    if req.seqno > vb.high_seqno:
        raise EngineError(Status.ERANGE, f"seqno {req.seqno} is above the high seqno {vb.high_seqno}")
    bucket = conn.bucket

    async def wait() -> bytes:
        fut = bucket.wait_persisted(vb.id, req.seqno)
        try:
            await asyncio.wait_for(fut, SEQNO_PERSISTENCE_TIMEOUT)
        except TimeoutError:
            raise EngineError(Status.ETMPFAIL, f"seqno {req.seqno} not persisted within "
                              f"{SEQNO_PERSISTENCE_TIMEOUT:g} s") from None
        return response(frame.opcode, opaque=frame.opaque)

    return wait()


# ---------------------------------------------------------------------------------------------
# counters and concatenation (the SDK's binary collection), built from get + compare-and-set: the
# engine is owned by this thread, so nothing can slip in between the two.

_ARITH_QUIET = (Opcode.INCREMENT_Q, Opcode.DECREMENT_Q)
_DECREMENTS = (Opcode.DECREMENT, Opcode.DECREMENT_Q)
_U64_MASK = (1 << 64) - 1


def arithmetic(conn: Connection, frame: Frame, sync: SyncWrite | None = None) -> bytes | None:
    """INCREMENT / DECREMENT (BinaryProtocol.md#0x05-increment): the value is the counter in ASCII
    decimal; a missing counter is created with `initial` unless expiry is 0xffffffff (KEY_ENOENT).
    Increments wrap at 2^64, decrements stop at 0. The reply value is the new counter as a u64."""
    req = kvproto.Arithmetic.from_frame(frame)
    key = doc_key(conn, req.key)
    vb = active_vbucket(conn, frame.vbucket)
    w = vb if sync is None else sync.writer(vb)
    try:
        current = vb.writable(key, req.cas)
    except EngineError as e:
        if e.status != Status.KEY_ENOENT or req.expiry == kvproto.Arithmetic.NO_CREATE:
            raise
        if req.cas:
            raise
        counter = req.initial
        item = w.add(key, str(counter).encode(), expiry=req.expiry, datatype=_JSON)
    else:
        text = current.value if not current.datatype & _XATTR else split_xattrs(current.value)[1]
        if not text.isdigit() or len(text) > 20 or int(text) > _U64_MASK:
            raise EngineError(Status.DELTA_BADVAL, f"the value of {key!r} is not an unsigned 64-bit counter")
        value = int(text)
        counter = max(0, value - req.delta) if req.opcode in _DECREMENTS else (value + req.delta) & _U64_MASK
        item = w.set(key, str(counter).encode(), flags=current.flags, expiry=current.expiry, datatype=_JSON,
                     cas=current.cas)
    conn.bucket.counters.cmd_set += 1
    if req.opcode in _ARITH_QUIET:
        return None
    uuid, seqno = (vb.uuid, item.by_seqno) if conn.mutation_seqno else (None, None)
    return kvproto.ArithmeticResponse(counter, item.cas, uuid, seqno, frame.opaque, opcode=frame.opcode).encode()


_PREPENDS = (Opcode.PREPEND, Opcode.PREPEND_Q)


def concat(conn: Connection, frame: Frame, sync: SyncWrite | None = None) -> bytes | None:
    """APPEND / PREPEND (BinaryProtocol.md#0x0e-append): add bytes to an existing document's value
    (NOT_STORED if there is none); flags and expiry stay, the result is JSON only if it parses."""
    req = kvproto.Concat.from_frame(frame)
    key = doc_key(conn, req.key)
    if req.datatype & _SNAPPY:
        req = req._replace(value=inflate(conn, req.value, req.datatype)[0], datatype=req.datatype & ~_SNAPPY)
    incoming_datatype(conn, req.datatype & ~_JSON, req.value)
    vb = active_vbucket(conn, frame.vbucket)
    try:
        current = vb.writable(key, req.cas)
    except EngineError as e:
        if e.status == Status.KEY_ENOENT:
            raise EngineError(Status.NOT_STORED, f"{Opcode(req.opcode).name} needs an existing document") from None
        raise
    if current.datatype & _XATTR:
        raise EngineError(Status.NOT_SUPPORTED, "APPEND/PREPEND on a document with xattrs is not supported")
    value = req.value + current.value if req.opcode in _PREPENDS else current.value + req.value
    if len(value) > MAX_VALUE_LEN:
        raise EngineError(Status.E2BIG, f"the result would be {len(value)} bytes; the limit is {MAX_VALUE_LEN}")
    datatype = _JSON if _looks_like_json(value) else 0
    w = vb if sync is None else sync.writer(vb)
    item = w.set(key, value, flags=current.flags, expiry=current.expiry, datatype=datatype, cas=current.cas)
    conn.bucket.counters.cmd_set += 1
    if req.quiet:
        return None
    return mutation_reply(conn, frame, vb, item.cas, item.by_seqno)


# ---------------------------------------------------------------------------------------------
# collections (docs/Collections.md): the bucket's manifest (engine/collections.py) answers

def _collection_header_check(frame: Frame, path_required: bool) -> bytes:
    """The path of a collections lookup (in the value; older clients put it in the key)."""
    if frame.extras or frame.cas:
        raise ProtocolError(f"{Opcode(frame.opcode).name} must not have extras or a CAS (Collections.md)")
    if frame.key and frame.value:
        raise ProtocolError(f"{Opcode(frame.opcode).name} takes the path in the value only (Collections.md)")
    path = frame.value or frame.key
    if path_required and not path:
        raise ProtocolError(f"{Opcode(frame.opcode).name} needs a path such as '_default._default' (Collections.md)")
    return path


def _unknown(status: Status, what: str, manifest: Manifest) -> EngineError:
    return EngineError(status, f"{what} (manifest uid {manifest.uid:x})")


def get_collections_manifest(conn: Connection, frame: Frame) -> bytes:
    if frame.extras or frame.key or frame.value or frame.cas:
        raise ProtocolError("COLLECTIONS_GET_MANIFEST has no extras, key, value or CAS (Collections.md)")
    return response(frame.opcode, opaque=frame.opaque, datatype=_JSON,
                    value=json.dumps(conn.bucket.engine.manifest.to_json(), separators=(",", ":")).encode())


def get_collection_id(conn: Connection, frame: Frame) -> bytes:
    """`scope.collection`; an empty part means _default (`.` is _default._default)."""
    path = _collection_header_check(frame, True).decode("utf-8", "replace")
    if path.count(".") != 1:
        raise ProtocolError(f"collection path {path!r} must be scope.collection (Collections.md)")
    scope, collection = (part or DEFAULT_SCOPE for part in path.split("."))
    manifest = conn.bucket.engine.manifest
    try:
        cid = manifest.collection(scope, collection).uid
    except ManifestError as e:
        status = Status.UNKNOWN_SCOPE if e.kind == "unknown_scope" else Status.UNKNOWN_COLLECTION
        raise _unknown(status, str(e), manifest) from None
    return kvproto.CollectionIdResponse(manifest.uid, cid, frame.opaque, opcode=frame.opcode).encode()


def get_scope_id(conn: Connection, frame: Frame) -> bytes:
    path = _collection_header_check(frame, False).decode("utf-8", "replace")
    if path.count(".") > 1:
        raise ProtocolError(f"scope path {path!r} has more than one '.' (Collections.md)")
    scope = path.split(".")[0] or DEFAULT_SCOPE
    manifest = conn.bucket.engine.manifest
    try:
        sid = manifest.scope(scope).uid
    except ManifestError as e:
        raise _unknown(Status.UNKNOWN_SCOPE, str(e), manifest) from None
    return kvproto.CollectionIdResponse(manifest.uid, sid, frame.opaque, opcode=frame.opcode).encode()
