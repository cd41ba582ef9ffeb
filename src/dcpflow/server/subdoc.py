"""Sub-document command handlers: single-path lookups and mutations (0xc5-0xcf, 0xd2, 0xd3) and
SUBDOC_MULTI_LOOKUP / SUBDOC_MULTI_MUTATION (0xd0 / 0xd1).

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/SubDocument.md,
docs/ExtendedAttributes.md. The protocol decoder applies the request rules (protocol/subdoc.py);
here the version is read (from the active vbucket, or with the REPLICA_READ doc flag from a
replica), the doc flags decide what may be read or created, the specs run (engine/subdoc_document.py)
and a mutation stores the new version in the same step as the read (the engine is owned by this
thread, so nothing slips in between), with the request's expiry (or, with the preserve-TTL frame,
the document's), user flags, CAS and GET_LOCKED lock checks, as plain mutations have them.

Doc flags: none = replace semantics (KEY_ENOENT without a document); MKDOC = upsert (a missing
document starts as `{}` or `[]`, whichever the first body path needs); ADD = insert (KEY_EEXISTS
if it exists); ACCESS_DELETED reads a tombstone (its xattrs), and a mutation of one stays a
tombstone (SUBDOC_SUCCESS_DELETED) unless REVIVE_DOCUMENT makes it live again; CREATE_AS_DELETED
creates a missing document as a tombstone. A whole-document DELETE keeps only system xattrs (a
tombstone with them, or a plain deletion if there are none).

Keys take their collection from the key the way every KV handler does (`kv.doc_key`).
"""

import json
import time

from dcpflow.engine.errors import EngineError
from dcpflow.engine.item import Item
from dcpflow.engine.subdoc import SubdocError, check_depth, root_for
from dcpflow.engine.subdoc import apply as apply_path
from dcpflow.engine.subdoc import get as get_path
from dcpflow.engine.subdoc_document import Failure, Meta, expand_macros, has_system_xattrs, lookup, mutate
from dcpflow.engine.vbucket import VBucket, VBucketState
from dcpflow.protocol import subdoc as sdproto
from dcpflow.protocol.datatype import Datatype, xattr_body_offset
from dcpflow.protocol.frame import MAX_VALUE_LEN, Frame
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.protocol.subdoc import DocFlag, SubdocSpec

from . import kv
from .auth import Privilege
from .connection import Connection
from .durable import SyncWrite

_JSON = int(Datatype.JSON)
# Plain ints: IntFlag operators cost on every request.
_MKDOC, _ADD, _ACCESS_DELETED, _CREATE_AS_DELETED, _REVIVE, _REPLICA_READ = (
    int(DocFlag.MKDOC), int(DocFlag.ADD), int(DocFlag.ACCESS_DELETED), int(DocFlag.CREATE_AS_DELETED),
    int(DocFlag.REVIVE_DOCUMENT), int(DocFlag.REPLICA_READ))
_XATTR_PATH, _BINARY_VALUE = int(sdproto.PathFlag.XATTR_PATH), int(sdproto.PathFlag.BINARY_VALUE)
_SYSTEM_READ, _SYSTEM_WRITE = int(Privilege.SYSTEM_XATTR_READ), int(Privilege.SYSTEM_XATTR_WRITE)
_JSON_REPLIES = frozenset((Opcode.SUBDOC_GET, Opcode.SUBDOC_GET_COUNT, Opcode.SUBDOC_COUNTER))


def _check_xattr_negotiated(conn: Connection, specs) -> None:
    if not conn.xattr and any(s.flags & _XATTR_PATH for s in specs):
        raise EngineError(Status.NOT_SUPPORTED, "xattr paths need HELLO Xattr on this connection")


def _vbucket_vattr(vb: VBucket) -> str:
    """`$vbucket`: the vbucket's hybrid logical clock, in seconds, and whether the wall clock
    (real) or the logical counter (a CAS ahead of the clock) leads it."""
    now_ns = time.time_ns()
    hlc_ns = max(now_ns, vb.hlc.max_cas)
    mode = "real" if now_ns >= vb.hlc.max_cas else "logical"
    return json.dumps({"$vbucket": {"HLC": {"now": str(hlc_ns // 1_000_000_000), "mode": mode}}},
                      separators=(",", ":"))


def _meta(vb: VBucket, item: Item) -> Meta:
    return Meta(item.cas, vb.uuid, item.by_seqno, item.rev_seqno, item.expiry, item.flags, item.datatype,
                item.deleted)


# ---------------------------------------------------------------------------------------------
# lookups


def _read(conn: Connection, frame: Frame, wire_key: bytes, doc_flags: int) -> tuple[VBucket, bytes, Item]:
    """The version a lookup reads: KEY_ENOENT for none (or a tombstone without ACCESS_DELETED)."""
    key = kv.doc_key(conn, wire_key)
    if doc_flags & _REPLICA_READ:
        vb = conn.get_vbucket(frame.vbucket)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {frame.vbucket} is not on this node")
        item = vb.replica_version(key)
    else:
        vb = kv.active_vbucket(conn, frame.vbucket)
        item = vb.current(key)
    counters = conn.bucket.counters
    counters.cmd_get += 1
    if item is None or (item.deleted and not doc_flags & _ACCESS_DELETED):
        counters.get_misses += 1
        raise EngineError(Status.KEY_ENOENT, f"key {key!r} not found in vbucket {vb.id}")
    counters.get_hits += 1
    return vb, key, item


def _run_lookups(conn: Connection, frame: Frame, wire_key: bytes, specs, doc_flags: int):
    xattrs = False
    for spec in specs:
        if spec.flags & _XATTR_PATH:
            xattrs = True
            break
    if xattrs:
        _check_xattr_negotiated(conn, specs)
    vb, key, item = _read(conn, frame, wire_key, doc_flags)
    vattr = _vbucket_vattr(vb) if xattrs and any(s.path.startswith(b"$vbucket") for s in specs) else None
    found = lookup(item.value, item.datatype, (lambda: _meta(vb, item)) if xattrs else None, specs,
                   system_xattrs=bool(conn.privileges & _SYSTEM_READ), vbucket_vattr=vattr)
    cas = kv._reported_cas(vb, key, item.cas) if vb.locks else item.cas
    return found, cas, item.deleted


def lookup_single(conn: Connection, frame: Frame) -> bytes:
    """SUBDOC_GET / EXISTS / GET_COUNT: the value at the path, or the spec's status as the reply's."""
    req = sdproto.SubdocRequest.from_frame(frame)
    found, cas, deleted = _run_lookups(conn, frame, req.key, (req.spec,), req.doc_flags)
    result = found.results[0]
    if result.status != Status.SUCCESS:
        raise EngineError(result.status, f"{Opcode(req.opcode).name} on path {req.path[:64]!r} failed")
    datatype = _JSON if conn.json and req.opcode in _JSON_REPLIES and not \
        req.path_flags & _BINARY_VALUE else 0
    status = Status.SUBDOC_SUCCESS_DELETED if deleted else Status.SUCCESS
    return sdproto.SubdocResponse(req.opcode, result.value, cas, status=status, opaque=frame.opaque,
                                  datatype=datatype).encode()


def multi_lookup(conn: Connection, frame: Frame) -> bytes:
    """SUBDOC_MULTI_LOOKUP: every spec's status and value, from one version of the document.

    The commonest request, one GET or EXISTS on a body path of a plain JSON document, is answered
    by `_one_body_lookup` without the decoder and the executor when the frame has the common valid
    shape (a strict subset of what the rules accept, as GET does in kv.py); anything else, or any
    doubt (xattrs, an expiry, a lock, a tombstone...), takes the general path below."""
    _, _, datatype, vbid, opaque, _, framing, extras, wire_key, value = frame
    if not (extras or framing or datatype) and wire_key and len(value) > 4:
        op, flags, path_len = _LOOKUP_SPEC_HEAD.unpack_from(value)
        if not flags and path_len == len(value) - 4 and path_len <= sdproto.MAX_PATH_LEN and op in _BODY_LOOKUPS:
            reply = _one_body_lookup(conn, vbid, opaque, wire_key, op, value[4:])
            if reply is not None:
                return reply
    req = sdproto.SubdocMultiLookup.from_frame(frame)
    found, cas, deleted = _run_lookups(conn, frame, req.key, req.specs, req.doc_flags)
    if found.failed:
        status = Status.SUBDOC_MULTI_PATH_FAILURE_DELETED if deleted else Status.SUBDOC_MULTI_PATH_FAILURE
    else:
        status = Status.SUBDOC_SUCCESS_DELETED if deleted else Status.SUCCESS
    return sdproto.SubdocMultiLookupResponse(found.results, cas, status, frame.opaque).encode()


_LOOKUP_SPEC_HEAD = sdproto.LOOKUP_SPEC_HEAD
_BODY_LOOKUPS = frozenset((int(Opcode.SUBDOC_GET), int(Opcode.SUBDOC_EXISTS)))
_ACTIVE = VBucketState.ACTIVE
_SUBDOC_GET = int(Opcode.SUBDOC_GET)
_MULTI_PATH_FAILURE = int(Status.SUBDOC_MULTI_PATH_FAILURE)


def _one_body_lookup(conn: Connection, vbid: int, opaque: int, wire_key: bytes, op: int, path: bytes) -> bytes | None:
    """One GET / EXISTS on a live, unlocked JSON document without xattrs or expiry; None (take the
    general path) for anything else."""
    key = wire_key if not conn.collections and len(wire_key) <= kv.MAX_KEY_LEN else kv.doc_key(conn, wire_key)
    vb = conn.get_vbucket(vbid)
    if vb is None or vb.state != _ACTIVE or vb.locks:
        return None
    item = vb.ht.get(key)
    if item is None or item.deleted or item.expiry or item.datatype != _JSON:
        return None
    try:
        text = item.value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    counters = conn.bucket.counters
    counters.cmd_get += 1
    counters.get_hits += 1
    try:
        check_depth(text)
        found = get_path(text, path.decode("utf-8", "replace"))
        result, value = 0, (found.encode("utf-8") if op == _SUBDOC_GET else b"")
    except SubdocError as e:
        result, value = e.status, b""
    return sdproto.one_lookup_reply(_MULTI_PATH_FAILURE if result else 0, result, value, opaque, item.cas)


# ---------------------------------------------------------------------------------------------
# mutations


class _Stored:
    __slots__ = ("item", "vb", "returned", "deleted")

    def __init__(self, item: Item, vb: VBucket, returned, deleted: bool):
        self.item, self.vb, self.returned, self.deleted = item, vb, returned, deleted


def _template(specs) -> tuple[bytes, int]:
    """The body a document created by MKDOC / ADD starts from (kv_engine: the root the first body
    path needs; none when only xattrs or whole-document SETs are written)."""
    for spec in specs:
        if not spec.flags & _XATTR_PATH and spec.opcode not in (Opcode.SET, Opcode.DELETE):
            return root_for(spec.opcode, spec.path.decode("utf-8", "replace")).encode(), _JSON
    return b"", 0


def _run_mutations(conn: Connection, frame: Frame, wire_key: bytes, specs: tuple[SubdocSpec, ...], doc_flags: int,
                   cas: int, expiry: int | None, user_flags: int | None, sync: SyncWrite | None) -> _Stored | Failure:
    _check_xattr_negotiated(conn, specs)
    key = kv.doc_key(conn, wire_key)
    vb = kv.active_vbucket(conn, frame.vbucket)
    prev = vb.current(key)
    access_deleted = bool(doc_flags & _ACCESS_DELETED)
    visible = prev if prev is not None and (not prev.deleted or access_deleted) else None
    revive = bool(doc_flags & _REVIVE)
    if visible is not None:
        if doc_flags & _ADD:
            raise EngineError(Status.KEY_EEXISTS, f"key {key!r} already exists (ADD)")
        if revive and not visible.deleted:
            raise EngineError(Status.SUBDOC_CAN_ONLY_REVIVE_DELETED_DOCUMENTS,
                              f"key {key!r} is not deleted: only a tombstone can be revived")
        if vb.locks and vb.lock_cas(key) is not None and cas != visible.cas:
            raise EngineError(Status.LOCKED, f"key {key!r} is locked (GET_LOCKED): mutate it with the lock's CAS")
        if cas and cas != visible.cas:
            raise EngineError(Status.KEY_EEXISTS, f"CAS mismatch for key {key!r}")
        value, datatype, deleted = visible.value, visible.datatype, visible.deleted
        meta = lambda: _meta(vb, visible)  # noqa: E731 - built only for $document and its macros
    else:
        if not doc_flags & (_MKDOC | _ADD) or cas:
            raise EngineError(Status.KEY_ENOENT, f"key {key!r} not found in vbucket {vb.id}")
        if doc_flags & _ADD and doc_flags & _CREATE_AS_DELETED and prev is not None:
            raise EngineError(Status.KEY_EEXISTS, f"key {key!r} has a tombstone (ADD | CREATE_AS_DELETED)")
        deleted = bool(doc_flags & _CREATE_AS_DELETED)
        value, datatype = (b"", 0) if deleted else _template(specs)
        meta = None
    outcome = mutate(value, datatype, meta, specs, system_xattrs=bool(conn.privileges & _SYSTEM_WRITE),
                     mkdir_p=bool(doc_flags & (_MKDOC | _ADD)))
    if isinstance(outcome, Failure):
        return outcome
    new_value, new_datatype = outcome.value, outcome.datatype
    if revive:
        deleted = False
    was_deleted = deleted  # the reply says SUBDOC_SUCCESS_DELETED for a tombstone that stays one
    if deleted and not outcome.delete_document and \
            new_value[xattr_body_offset(new_value) if new_datatype & Datatype.XATTR else 0:]:
        raise EngineError(Status.SUBDOC_DELETED_DOCUMENT_CANT_HAVE_VALUE, "a deleted document cannot have a body")
    if outcome.delete_document:
        deleted = True
        if not has_system_xattrs(new_value, new_datatype):
            new_value, new_datatype = b"", 0
    if len(new_value) > MAX_VALUE_LEN:
        raise EngineError(Status.E2BIG, f"the document would be {len(new_value)} bytes; the limit is {MAX_VALUE_LEN}")
    if kv.has_preserve_ttl(frame) and prev is not None and not prev.deleted:
        expiry = prev.expiry
    flags = user_flags if user_flags is not None else (visible.flags if visible is not None else 0)
    macros = outcome.macros
    finish = (lambda new_cas, seqno: expand_macros(new_value, new_datatype, macros, new_cas, seqno)) if macros \
        else None
    item = (vb if sync is None else sync.writer(vb)).write_version(
        key, prev, new_value, flags=flags, expiry=expiry or 0, datatype=new_datatype, deleted=deleted, cas=cas,
        finish=finish)
    conn.bucket.counters.cmd_set += 1
    return _Stored(item, vb, outcome.returned, was_deleted)


def _token(conn: Connection, stored: _Stored) -> tuple[int | None, int | None]:
    return (stored.vb.uuid, stored.item.by_seqno) if conn.mutation_seqno else (None, None)


def mutation_single(conn: Connection, frame: Frame, sync: SyncWrite | None = None) -> bytes:
    """A single-path mutation: the new CAS (and mutation token); COUNTER also returns the value.
    With `sync`, a durable write (durable.py)."""
    req = sdproto.SubdocRequest.from_frame(frame)
    stored = _run_mutations(conn, frame, req.key, (req.spec,), req.doc_flags, req.cas, req.expiry, req.user_flags,
                            sync)
    if isinstance(stored, Failure):
        raise EngineError(stored.status, stored.reason or f"{Opcode(req.opcode).name} failed")
    uuid, seqno = _token(conn, stored)
    value = stored.returned[0][1] if stored.returned else b""
    status = Status.SUBDOC_SUCCESS_DELETED if stored.deleted else Status.SUCCESS
    return sdproto.SubdocResponse(req.opcode, value, stored.item.cas, uuid, seqno, status, frame.opaque,
                                  _JSON if value and conn.json else 0).encode()


_MUTATION_SPEC_HEAD = sdproto.MUTATION_SPEC_HEAD
_BODY_MUTATIONS = frozenset(int(op) for op in (
    Opcode.SUBDOC_DICT_ADD, Opcode.SUBDOC_DICT_UPSERT, Opcode.SUBDOC_REPLACE, Opcode.SUBDOC_ARRAY_PUSH_LAST,
    Opcode.SUBDOC_ARRAY_PUSH_FIRST, Opcode.SUBDOC_ARRAY_INSERT, Opcode.SUBDOC_ARRAY_ADD_UNIQUE, Opcode.SUBDOC_COUNTER))
_SUBDOC_COUNTER = int(Opcode.SUBDOC_COUNTER)


def _one_body_mutation(conn: Connection, frame: Frame, op: int, flags: int, path: bytes, spec_value: bytes
                       ) -> bytes | None:
    """One path mutation of a live, unlocked JSON document without xattrs or expiry, with no doc
    flags, expiry or CAS other than the document's; None (take the general path) for anything else."""
    wire_key = frame.key
    key = wire_key if not conn.collections and len(wire_key) <= kv.MAX_KEY_LEN else kv.doc_key(conn, wire_key)
    vb = conn.get_vbucket(frame.vbucket)
    if vb is None or vb.state != _ACTIVE or vb.locks:
        return None
    item = vb.ht.get(key)
    if item is None or item.deleted or item.expiry or item.datatype != _JSON or (frame.cas and frame.cas != item.cas):
        return None
    try:
        text, value = item.value.decode("utf-8"), spec_value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        check_depth(text)
        new, returned = apply_path(op, text, path.decode("utf-8", "replace"), value, bool(flags))
    except SubdocError as e:
        return sdproto.SubdocMultiMutationResponse((sdproto.MutationResult(0, e.status),),
                                                   status=Status.SUBDOC_MULTI_PATH_FAILURE,
                                                   opaque=frame.opaque).encode()
    new_value = new.encode("utf-8")
    if len(new_value) > MAX_VALUE_LEN:
        return None
    stored = vb.write_version(key, item, new_value, flags=item.flags, datatype=_JSON, cas=frame.cas)
    conn.bucket.counters.cmd_set += 1
    uuid = vb.uuid if conn.mutation_seqno else None
    return sdproto.one_mutation_reply(frame.opaque, stored.cas, uuid, stored.by_seqno,
                                      returned.encode() if op == _SUBDOC_COUNTER else None)


def multi_mutation(conn: Connection, frame: Frame, sync: SyncWrite | None = None) -> bytes:
    """SUBDOC_MULTI_MUTATION: all specs or none; on failure the first failing spec's index and status.

    The commonest request, one path mutation of a plain JSON document with no doc flags or expiry,
    is done by `_one_body_mutation` without the decoder and the executor when the frame has the
    common valid shape; anything else takes the general path below."""
    _, _, datatype, _, _, _, framing, extras, wire_key, value = frame
    if not (extras or framing or datatype) and wire_key and len(value) > 8:
        op, flags, path_len, value_len = _MUTATION_SPEC_HEAD.unpack_from(value)
        if flags <= 1 and 0 < path_len <= sdproto.MAX_PATH_LEN and value_len and \
                8 + path_len + value_len == len(value) and op in _BODY_MUTATIONS:
            reply = _one_body_mutation(conn, frame, op, flags, value[8:8 + path_len], value[8 + path_len:])
            if reply is not None:
                return reply
    req = sdproto.SubdocMultiMutation.from_frame(frame)
    stored = _run_mutations(conn, frame, req.key, req.specs, req.doc_flags, req.cas, req.expiry, req.user_flags,
                            sync)
    if isinstance(stored, Failure):
        if stored.index is None:
            raise EngineError(stored.status, stored.reason)
        result = sdproto.MutationResult(stored.index, stored.status)
        return sdproto.SubdocMultiMutationResponse((result,), status=Status.SUBDOC_MULTI_PATH_FAILURE,
                                                   opaque=frame.opaque).encode()
    uuid, seqno = _token(conn, stored)
    results = tuple(sdproto.MutationResult(index, Status.SUCCESS, value) for index, value in stored.returned)
    status = Status.SUBDOC_SUCCESS_DELETED if stored.deleted else Status.SUCCESS
    return sdproto.SubdocMultiMutationResponse(results, stored.item.cas, uuid, seqno, status, frame.opaque).encode()
