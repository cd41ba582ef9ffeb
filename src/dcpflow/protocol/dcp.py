"""Typed bodies of every DCP message (opcodes 0x50-0x67), with their rules and a fast decoder.

Pages: https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands (one per
opcode, named below by file name). Where a page's example bytes and its field table disagree, the
field table and KV-Engine's validators win, and the rule is stated where it is checked.
Each message is an immutable NamedTuple: cheap to build (the producer makes millions), equal by
value (tests round-trip them), and `encode()` gives its wire bytes. `from_frame()` checks the
page's structural rules first (see rules.py) and raises ProtocolError with the status to answer.

A producer with `enable_stream_id` frames every stream message with magic 0x08 and a stream-id
FrameInfo; messages carry that as `stream_id` (None when absent).
"""

import json
import struct
from collections.abc import Sequence
from enum import IntEnum, IntFlag
from typing import NamedTuple

from . import rules
from .datatype import Datatype
from .errors import ProtocolError
from .frame import (
    HEADER,
    HEADER_FIELDS,
    HEADER_LEN,
    Field,
    Frame,
    FrameDecoder,
    Magic,
    RequestFrameId,
    compiled,
    encode_frame,
    stream_id_frame,
    struct_fields,
)
from .keys import FIRST_USER_COLLECTION, encode_leb128
from .kv import RawResponse
from .opcodes import Opcode
from .rules import MAY, MUST, MUST_NOT, Shape
from .status import Status
from .system_events import SystemEventId, decode_event_value  # noqa: F401 (SystemEventId: re-exported, the DCP types live here)

# ---------------------------------------------------------------------------------------------
# Flags and enums: the values KV-Engine's code uses (its headers, not the pages, define them)


class OpenFlag(IntFlag):
    PRODUCER = 0x001
    INVALID_NOTIFIER = 0x002
    INCLUDE_XATTRS = 0x004
    NO_VALUE = 0x008
    UNUSED = 0x010
    INCLUDE_DELETE_TIMES = 0x020
    NO_VALUE_WITH_UNDERLYING_DATATYPE = 0x040
    PITR_REMOVED = 0x080
    INCLUDE_DELETED_USER_XATTRS = 0x100
    SKIP_DELETES_IN_INITIAL_BACKFILL = 0x200


class StreamFlag(IntFlag):
    TAKEOVER = 0x001
    DISK_ONLY = 0x002
    TO_LATEST = 0x004
    NO_VALUE_REMOVED = 0x008
    ACTIVE_VB_ONLY = 0x010
    STRICT_VBUUID = 0x020
    FROM_LATEST = 0x040
    IGNORE_PURGED_TOMBSTONES = 0x080
    CACHE_TRANSFER = 0x100


class SnapshotFlag(IntFlag):
    MEMORY = 0x01
    DISK = 0x02
    CHECKPOINT = 0x04
    ACK = 0x08
    HISTORY = 0x10
    MAY_CONTAIN_DUPLICATES = 0x20


class MarkerVersion(IntEnum):
    """Snapshot-marker encodings. V1 has 20-byte extras; V2.x has a version byte and a value."""

    V1 = -1
    V2_0 = 0x00
    V2_2 = 0x02


class StreamEndReason(IntEnum):
    OK = 0
    CLOSED = 1
    STATE_CHANGED = 2
    DISCONNECTED = 3
    SLOW = 4
    BACKFILL_FAIL = 5
    ROLLBACK = 6
    FILTER_EMPTY = 7
    LOST_PRIVILEGES = 8


class VBucketState(IntEnum):
    ACTIVE = 1
    REPLICA = 2
    PENDING = 3
    DEAD = 4


class DurabilityLevel(IntEnum):
    NONE = 0
    MAJORITY = 1
    MAJORITY_AND_PERSIST_ON_MASTER = 2
    PERSIST_TO_MAJORITY = 3


class OsoFlag(IntFlag):
    START = 0x01
    END = 0x02


def spell_flags(flags: int, enum: type[IntFlag]) -> str:
    """Flags as the reference spells them, e.g. SnapshotFlag 0x05 -> "Memory|Checkpoint".

    Unknown bits are kept as hex so nothing is hidden from the reader.
    """
    names, rest = [], flags
    for member in enum:
        if member.value and flags & member.value == member.value:
            names.append("".join(w.capitalize() for w in member.name.split("_")))
            rest &= ~member.value
    if rest:
        names.append(f"0x{rest:x}")
    return "|".join(names) if names else "0"


# Plain ints: `~` of an IntFlag only complements within the enum's own bits, so a mask built from
# flags would never show an undefined bit.
OPEN_FLAGS_REJECTED = int(OpenFlag.INVALID_NOTIFIER | OpenFlag.UNUSED | OpenFlag.PITR_REMOVED)
OPEN_FLAGS_KNOWN = int(sum(OpenFlag)) & ~OPEN_FLAGS_REJECTED
STREAM_FLAGS_KNOWN = int(sum(StreamFlag)) & ~int(StreamFlag.NO_VALUE_REMOVED)

# ---------------------------------------------------------------------------------------------
# Encoding helpers

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_OPEN_EXTRAS = struct.Struct(">II")
_STREAM_REQ_EXTRAS = struct.Struct(">IIQQQQQ")
_MARKER_V1 = struct.Struct(">QQI")
_MARKER_V20 = struct.Struct(">QQIQQ")
_MARKER_V22 = struct.Struct(">QQIQQQQ")
#: V2.2 without the high prepared seqno: the layout snapshot-marker.md first gave (purge seqno last).
_MARKER_V22_44 = struct.Struct(">QQIQQQ")
#: The value size of each V2.x snapshot marker, by its version byte (snapshot-marker.md):
#: what an encoder writes. A V2.2 value of MARKER_V22_SHORT bytes is accepted too.
MARKER_V2_VALUE_BYTES = {MarkerVersion.V2_0: _MARKER_V20.size, MarkerVersion.V2_2: _MARKER_V22.size}
MARKER_V22_SHORT = _MARKER_V22_44.size
_MUTATION_EXTRAS = struct.Struct(">QQIIIHB")
_DELETION_V1_EXTRAS = struct.Struct(">QQH")
_DELETION_V2_EXTRAS = struct.Struct(">QQIB")
_EXPIRATION_EXTRAS = struct.Struct(">QQI")
_PREPARE_EXTRAS = struct.Struct(">QQIIIBBB")
_TWO_SEQNOS = struct.Struct(">QQ")
_SYSTEM_EVENT_EXTRAS = struct.Struct(">QIB")
_FAILOVER_ENTRY = struct.Struct(">QQ")
_CACHE_RECORD = struct.Struct(">QQQIIIHBB")

# Header + extras in one struct each: the hot path of the decoder here and of the producer
# (the packers below, which dcp/active_stream.py calls per item).
MUTATION_HEAD = struct.Struct(">BBHBBHIIQQQIIIHB")
_MUTATION_HEAD_SID = struct.Struct(">BBBBBBHIIQ3sQQIIIHB")
DELETION_V2_HEAD = struct.Struct(">BBHBBHIIQQQIB")
DELETION_V1_HEAD = struct.Struct(">BBHBBHIIQQQH")
# The same layouts for the producer's packers: magic and opcode as one u16 and the fields that are
# always 0 (lock time, nmeta, nru; the deletion's nmeta / collection length) as pad bytes, because
# struct converts every argument it is given and a producer packs millions of these.
_pack_mutation_head = struct.Struct(">HHBBHIIQQQII7x").pack
_pack_deletion_v1 = struct.Struct(">HHBBHIIQQQ2x").pack
_pack_deletion_v2 = struct.Struct(">HHBBHIIQQQIx").pack
_pack_mutation_head_sid = struct.Struct(">HBBBBHIIQBHQQII7x").pack  # the same with the stream-id FrameInfo
_MUTATION_OP = int(Magic.REQUEST) << 8 | int(Opcode.DCP_MUTATION)
_MUTATION_OP_SID = int(Magic.ALT_REQUEST) << 8 | int(Opcode.DCP_MUTATION)
_SID_TAG = int(RequestFrameId.DCP_STREAM_ID) << 4 | 2  # id 2, 2 bytes
_DELETION_OP = int(Magic.REQUEST) << 8 | int(Opcode.DCP_DELETION)
_body_length = struct.Struct(">I").unpack_from
_MARKER_V1_HEAD = struct.Struct(">BBHBBHIIQQQI")
_MUT_FAST = struct.Struct(">xxHxBHIIQQQIIIxxB").unpack_from
_DEL2_FAST = struct.Struct(">xxHxBHIIQQQIx").unpack_from
_DEL1_FAST = struct.Struct(">xxHxBHIIQQQxx").unpack_from
_MARKER_FAST = struct.Struct(">xxxxxxHIIxxxxxxxxQQI").unpack_from

#: Where each field of the document messages lies in classic framing, from the frame's start, by
#: (opcode, extras length): the header's fields and the extras' under the names of the message
#: types (DcpMutation.expiration, DcpDeletion.delete_time...). Taken from the structs that encode
#: and decode them (mutation.md, deletion.md, expiration.md): a reader that addresses fields in
#: place, many frames at once (the client's Arrow decoder), reads them where the codec put them.
DOCUMENT_LAYOUTS: dict[tuple[int, int], dict[str, Field]] = {
    (Opcode.DCP_MUTATION, _MUTATION_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _MUTATION_EXTRAS, ("by_seqno", "rev_seqno", "flags", "expiration", "lock_time", "nmeta", "nru"), HEADER_LEN)},
    (Opcode.DCP_DELETION, _DELETION_V1_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _DELETION_V1_EXTRAS, ("by_seqno", "rev_seqno", "nmeta"), HEADER_LEN)},
    (Opcode.DCP_DELETION, _DELETION_V2_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _DELETION_V2_EXTRAS, ("by_seqno", "rev_seqno", "delete_time", "unused"), HEADER_LEN)},
    (Opcode.DCP_EXPIRATION, _EXPIRATION_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _EXPIRATION_EXTRAS, ("by_seqno", "rev_seqno", "delete_time"), HEADER_LEN)},
}


def pack_mutation_head(vbucket: int, by_seqno: int, rev_seqno: int, flags: int, expiration: int, key: bytes,
                       value_len: int, cas: int, datatype: int, opaque: int) -> bytes:
    """A DCP_MUTATION up to its value: header, extras and key (mutation.md; no stream-id, lock time,
    nmeta and nru 0), for a value of `value_len` bytes that the caller appends or sends after it
    uncopied. With the value, the bytes of `DcpMutation(...).encode()` (tests/protocol/
    test_dcp_packers.py) in one struct call: a producer encodes millions of items, and building a
    message object per item would cost more than the item's whole encoding."""
    return _pack_mutation_head(_MUTATION_OP, len(key), 31, datatype, vbucket, 31 + len(key) + value_len, opaque, cas,
                               by_seqno, rev_seqno, flags, expiration) + key


def pack_mutation_head_sid(vbucket: int, by_seqno: int, rev_seqno: int, flags: int, expiration: int, key: bytes,
                           value_len: int, cas: int, datatype: int, opaque: int, stream_id: int) -> bytes:
    """`pack_mutation_head` for a producer with `enable_stream_id`: magic 0x08 and the stream-id
    FrameInfo (stream-request-value.md, "sid"), the bytes of `DcpMutation(..., stream_id).encode()`
    up to the value. The alternative framing has one byte of key length: a key over 255 bytes
    (none is: 250 and a collection prefix) raises struct.error."""
    return _pack_mutation_head_sid(_MUTATION_OP_SID, 3, len(key), 31, datatype, vbucket, 34 + len(key) + value_len,
                                   opaque, cas, _SID_TAG, stream_id, by_seqno, rev_seqno, flags, expiration) + key


def pack_deletion(vbucket: int, by_seqno: int, rev_seqno: int, key: bytes, value: bytes, cas: int, datatype: int,
                  opaque: int, delete_time: int | None) -> bytes:
    """A whole DCP_DELETION without stream-id (deletion.md): V1 (18-byte extras) when `delete_time`
    is None, else V2 (21 bytes, with the delete time: IncludeDeleteTimes). The bytes of
    `DcpDeletion(...).encode()`, in one struct call (see pack_mutation_head)."""
    if delete_time is None:
        return _pack_deletion_v1(_DELETION_OP, len(key), 18, datatype, vbucket, 18 + len(key) + len(value), opaque,
                                 cas, by_seqno, rev_seqno) + key + value
    return _pack_deletion_v2(_DELETION_OP, len(key), 21, datatype, vbucket, 21 + len(key) + len(value), opaque, cas,
                             by_seqno, rev_seqno, delete_time) + key + value


def whole_messages(data, nbytes: int) -> tuple[int, int]:
    """(length, count) of the shortest run of whole messages at the start of `data` (encoded frames
    back to back) that holds at least `nbytes` bytes and at least one message, or all of `data`.
    A producer sends a prefix of an encoded backfill page up to its flow-control window this way,
    never part of a message."""
    pos = n = 0
    total = len(data)
    while pos < total and (pos < nbytes or n == 0):
        pos += HEADER_LEN + _body_length(data, pos + 8)[0]
        n += 1
    return min(pos, total), n


def encode_mutations_py(items: Sequence, start: int, vbucket: int, opaque: int, collections: bool,
                        large_value: int) -> tuple[bytes, int]:
    """The DCP_MUTATION messages (mutation.md; no stream-id, lock time/nmeta/nru 0) of
    items[start:stop] joined, and stop: the index of the first item that is not a plain mutation
    (deleted, xattrs, a value of `large_value` bytes or more, or not a document of a collection
    this stream may send: with `collections` the default collection (`cid` 0) or a user one (8 or
    more: Collections.md reserves 1-7, and an engine keeps its system events under 1), without
    only the default collection), or len(items).

    Items are anything with the attributes of engine.Item (key, value, cas, by_seqno, rev_seqno,
    flags, expiry, datatype, deleted, cid). With `collections` each key gets its collection id's
    LEB128 prefix (0x00 for the default collection). The specification of the compiled
    `encode_mutations` (_speedups.c), which also stops before an item whose fields do not fit the
    message, where this raises struct.error."""
    parts: list[bytes] = []
    append, pack = parts.append, MUTATION_HEAD.pack
    stop = start
    for stop in range(start, len(items)):
        item = items[stop]
        datatype, value = item.datatype, item.value
        if item.deleted or datatype & Datatype.XATTR or len(value) >= large_value:
            break
        cid = item.cid
        if cid and (not collections or not FIRST_USER_COLLECTION <= cid <= 0xFFFFFFFF):
            break
        key = encode_leb128(cid) + item.key if collections else item.key
        append(pack(0x80, 0x57, len(key), 31, datatype, vbucket, 31 + len(key) + len(value), opaque, item.cas,
                    item.by_seqno, item.rev_seqno, item.flags, item.expiry, 0, 0, 0))
        append(key)
        append(value)
    else:
        stop = len(items)
    return b"".join(parts), stop


#: The run encoder a producer uses: compiled when built (same bytes; tests/protocol/test_speedups.py).
encode_mutations = compiled("encode_mutations") or encode_mutations_py


def stamp_mutations_py(data: bytes, opaque: int, collections: bool) -> bytes:
    """Stored DCP_MUTATION messages (`data`: whole messages as `encode_mutations` makes them with
    opaque 0 and no collection prefix, in strictly increasing seqno order) as a stream sends
    them: with its opaque and, with `collections`, each key prefixed with the default
    collection's 0x00 (key length and body length one more). A store keeps one layout and a
    backfill page is restamped in one pass instead of concatenated per row.

    ValueError if `data` is not such a run (a message that is not a plain DCP_MUTATION with 31
    bytes of extras, a cut message, or a seqno not above the one before): the store's order
    is checked, not assumed. The specification of the compiled `stamp_mutations`."""
    if not 0 <= opaque <= 0xFFFFFFFF:
        raise ValueError(f"stamp_mutations: opaque {opaque} out of range")
    out: list[bytes] = []
    append = out.append
    view = memoryview(data)
    op = opaque.to_bytes(4, "big")
    fixed = MUTATION_HEAD.size  # header and extras
    for pos, klen, body, end, _ in _stored_messages(data, (1 << 64) - 1, "stamp_mutations"):
        if collections:
            append(bytes(view[pos:pos + 2]) + (klen + 1).to_bytes(2, "big") + bytes(view[pos + 4:pos + 8])
                   + (body + 1).to_bytes(4, "big") + op + bytes(view[pos + 16:pos + fixed]) + b"\x00")
        else:
            append(bytes(view[pos:pos + 12]) + op + bytes(view[pos + 16:pos + fixed]))
        append(bytes(view[pos + fixed:end]))
    return b"".join(out)


def _stored_messages(data, upto: int, name: str):
    """(offset, key length, body length, end, seqno) of each message of a stored run while their
    seqnos are at most `upto`, checked as the twins check them (the ValueError names `name`)."""
    pos, n, last = 0, len(data), -1
    fixed = MUTATION_HEAD.size
    while pos < n:
        if n - pos < fixed or data[pos] != 0x80 or data[pos + 1] != 0x57 or data[pos + 4] != 31:
            raise ValueError(f"{name}: no DCP_MUTATION with 31 bytes of extras at offset {pos}")
        klen = int.from_bytes(data[pos + 2:pos + 4], "big")
        body = int.from_bytes(data[pos + 8:pos + 12], "big")
        end = pos + HEADER_LEN + body
        if body < 31 + klen or end > n:
            raise ValueError(f"{name}: the message at offset {pos} is cut or its lengths disagree")
        seqno = int.from_bytes(data[pos + 24:pos + 32], "big")
        if seqno > upto:
            return
        if seqno <= last:
            raise ValueError(f"{name}: seqno {seqno} at offset {pos} does not follow {last}")
        last = seqno
        yield pos, klen, body, end, seqno
        pos = end


#: The backfill's restamping: compiled when built (same bytes; tests/protocol/test_speedups.py).
stamp_mutations = compiled("stamp_mutations") or stamp_mutations_py


def mutations_upto_py(data, upto: int) -> tuple[int, int, int]:
    """The head of a stored run (what `stamp_mutations` takes) up to seqno `upto`: (its length in
    bytes, its number of messages, its last seqno or 0). A backfill that ends inside a run (it stops
    where the checkpoints begin) sends that head rather than reading the same rows one by one.
    ValueError where `stamp_mutations` would refuse the head; the messages after it are not looked
    at. The specification of the compiled `mutations_upto`."""
    if not 0 <= upto < 1 << 64:
        raise OverflowError(f"mutations_upto: seqno {upto} is not an unsigned 64-bit integer")
    nbytes = count = last = 0
    for _, _, _, end, seqno in _stored_messages(data, upto, "mutations_upto"):
        nbytes, count, last = end, count + 1, seqno
    return nbytes, count, last


mutations_upto = compiled("mutations_upto") or mutations_upto_py


def _encode(opcode: int, vbucket: int = 0, opaque: int = 0, *, extras: bytes = b"", key: bytes = b"",
            value: bytes = b"", cas: int = 0, datatype: int = 0, stream_id: int | None = None) -> bytes:
    if stream_id is None:
        return encode_frame(Magic.REQUEST, opcode, key=key, extras=extras, value=value,
                            vbucket_or_status=vbucket, opaque=opaque, cas=cas, datatype=datatype)
    return encode_frame(Magic.ALT_REQUEST, opcode, key=key, extras=extras, value=value,
                        vbucket_or_status=vbucket, opaque=opaque, cas=cas, datatype=datatype,
                        framing=stream_id_frame(stream_id))


def _ok_response(opcode: int, opaque: int, status: int = Status.SUCCESS) -> bytes:
    return encode_frame(Magic.RESPONSE, opcode, vbucket_or_status=status, opaque=opaque)


_PAGES = "docs/dcp/documentation/commands/"

# ---------------------------------------------------------------------------------------------
# Connection-level messages


class DcpOpen(NamedTuple):
    """DCP_OPEN 0x50 (open-connection.md): name in the key, flags in the extras, optional JSON."""

    name: bytes
    flags: int = OpenFlag.PRODUCER
    value: bytes = b""
    opaque: int = 0
    reserved: int = 0

    opcode = Opcode.DCP_OPEN

    @property
    def is_producer(self) -> bool:
        return bool(self.flags & OpenFlag.PRODUCER)

    @property
    def consumer_name(self) -> str | None:
        if not self.value:
            return None
        doc = json.loads(self.value)
        return doc.get("consumer_name") if isinstance(doc, dict) else None

    def encode(self) -> bytes:
        return _encode(self.opcode, 0, self.opaque, extras=_OPEN_EXTRAS.pack(self.reserved, self.flags),
                       key=self.name, value=self.value, datatype=0x01 if self.value else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpOpen":
        rules.check(frame)
        reserved, flags = _OPEN_EXTRAS.unpack(frame.extras)
        return cls(frame.key, flags, frame.value, frame.opaque, reserved)


rules.register(Opcode.DCP_OPEN, Shape(_PAGES + "open-connection.md", extras=(8,), key=MUST, value=MAY),
               Shape(_PAGES + "open-connection.md"))


@rules.request_check(Opcode.DCP_OPEN)
def _open_rules(frame: Frame):
    if len(frame.extras) != 8:
        return
    _, flags = _OPEN_EXTRAS.unpack(frame.extras)
    page = "(open-connection.md)"
    if flags & OPEN_FLAGS_REJECTED:
        yield ProtocolError(f"DCP_OPEN flags {spell_flags(flags & OPEN_FLAGS_REJECTED, OpenFlag)} "
                            f"are invalid {page}")
    unknown = flags & ~(OPEN_FLAGS_KNOWN | OPEN_FLAGS_REJECTED)
    if unknown:
        yield ProtocolError(f"DCP_OPEN has unknown flag bits 0x{unknown:x} {page}")
    if flags & OpenFlag.NO_VALUE and flags & OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE:
        yield ProtocolError(f"DCP_OPEN flags NoValue and NoValueWithUnderlyingDatatype are mutually "
                            f"exclusive {page}")
    if flags & OpenFlag.INCLUDE_DELETED_USER_XATTRS and not flags & OpenFlag.INCLUDE_XATTRS:
        yield ProtocolError(f"DCP_OPEN flag IncludeDeletedUserXattrs requires IncludeXattrs {page}")
    if flags & OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL and not flags & OpenFlag.PRODUCER:
        yield ProtocolError(f"DCP_OPEN flag SkipDeletesInInitialBackfill is for producers only {page}")
    if frame.value:
        if not frame.datatype & 0x01:
            yield ProtocolError(f"DCP_OPEN value must be JSON and flagged with datatype JSON {page}")
        try:
            doc = json.loads(frame.value)
        except (ValueError, RecursionError):
            yield ProtocolError(f"DCP_OPEN value is not valid JSON {page}")
            return
        if not isinstance(doc, dict) or set(doc) - {"consumer_name"}:
            yield ProtocolError(f"DCP_OPEN value may only hold 'consumer_name' {page}")
        elif flags & OpenFlag.PRODUCER and "consumer_name" in doc:
            yield ProtocolError(f"DCP_OPEN 'consumer_name' is only for opening a consumer {page}")


class DcpControl(NamedTuple):
    """DCP_CONTROL 0x5e (control.md): key and value are plain strings. The keys a producer accepts
    are dcpflow.dcp.controls's table."""

    key: bytes
    value: bytes
    opaque: int = 0

    opcode = Opcode.DCP_CONTROL

    def encode(self) -> bytes:
        return _encode(self.opcode, 0, self.opaque, key=self.key, value=self.value)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpControl":
        rules.check(frame)
        return cls(frame.key, frame.value, frame.opaque)


rules.register(Opcode.DCP_CONTROL, Shape(_PAGES + "control.md", key=MUST, value=MUST),
               Shape(_PAGES + "control.md"))


class DcpNoop(NamedTuple):
    """DCP_NOOP 0x5c (no-op.md): the producer's keep-alive; the consumer must answer it."""

    opaque: int = 0

    opcode = Opcode.DCP_NOOP

    def encode(self) -> bytes:
        return _encode(self.opcode, 0, self.opaque)

    def response(self, status: int = Status.SUCCESS) -> bytes:
        return _ok_response(self.opcode, self.opaque, status)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpNoop":
        rules.check(frame)
        return cls(frame.opaque)


rules.register(Opcode.DCP_NOOP, Shape(_PAGES + "no-op.md"), Shape(_PAGES + "no-op.md"))


class DcpBufferAck(NamedTuple):
    """DCP_BUFFER_ACKNOWLEDGEMENT 0x5d (buffer-ack.md): bytes freed by the consumer. No reply."""

    bytes_acked: int
    opaque: int = 0
    vbucket: int = 0

    opcode = Opcode.DCP_BUFFER_ACKNOWLEDGEMENT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.bytes_acked))

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpBufferAck":
        rules.check(frame)
        return cls(_U32.unpack(frame.extras)[0], frame.opaque, frame.vbucket)


rules.register(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, Shape(_PAGES + "buffer-ack.md", extras=(4,)))


# ---------------------------------------------------------------------------------------------
# Stream setup


_NO_VALUE_REMOVED, _CACHE_TRANSFER = int(StreamFlag.NO_VALUE_REMOVED), int(StreamFlag.CACHE_TRANSFER)
_CACHE_TRANSFER_WITH = int(StreamFlag.CACHE_TRANSFER | StreamFlag.TAKEOVER | StreamFlag.ACTIVE_VB_ONLY)


def _stream_flag_problems(flags: int, what: str, page: str):
    flags = int(flags)  # plain ints: `int & IntFlag` runs enum's Python __rand__, per request
    if flags & _NO_VALUE_REMOVED:
        yield ProtocolError(f"{what} flag 0x08 (NoValue) is no longer used; use DCP_OPEN flag NoValue ({page})")
    unknown = flags & ~(STREAM_FLAGS_KNOWN | _NO_VALUE_REMOVED)
    if unknown:
        yield ProtocolError(f"{what} has unknown flag bits 0x{unknown:x} ({page})")
    if flags & _CACHE_TRANSFER and flags & ~_CACHE_TRANSFER_WITH:
        yield ProtocolError(f"{what} flag CacheTransfer may only be combined with TakeOver and ActiveVbOnly "
                            f"({page})")


class DcpAddStream(NamedTuple):
    """DCP_ADD_STREAM 0x51 (add-stream.md): sent to a consumer to make it stream a vbucket."""

    vbucket: int
    flags: int = 0
    opaque: int = 0

    opcode = Opcode.DCP_ADD_STREAM

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.flags))

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpAddStream":
        rules.check(frame)
        return cls(frame.vbucket, _U32.unpack(frame.extras)[0], frame.opaque)


class DcpAddStreamResponse(NamedTuple):
    """The reply to ADD_STREAM: the new stream's opaque in 4 bytes of extras (add-stream.md)."""

    stream_opaque: int
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.DCP_ADD_STREAM

    def encode(self) -> bytes:
        extras = _U32.pack(self.stream_opaque) if self.status == Status.SUCCESS else b""
        return encode_frame(Magic.RESPONSE, self.opcode, extras=extras, vbucket_or_status=self.status,
                            opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpAddStreamResponse":
        rules.check(frame)
        stream_opaque = _U32.unpack(frame.extras)[0] if len(frame.extras) == 4 else 0
        return cls(stream_opaque, frame.opaque, frame.status)


rules.register(Opcode.DCP_ADD_STREAM, Shape(_PAGES + "add-stream.md", extras=(4,)),
               Shape(_PAGES + "add-stream.md", extras=(4,)))


@rules.request_check(Opcode.DCP_ADD_STREAM)
def _add_stream_rules(frame: Frame):
    if len(frame.extras) == 4:
        yield from _stream_flag_problems(_U32.unpack(frame.extras)[0], "DCP_ADD_STREAM",
                                         "add-stream.md")


class DcpStreamRequest(NamedTuple):
    """DCP_STREAM_REQ 0x53 (stream-request.md): 48 bytes of extras and an optional JSON value."""

    vbucket: int
    start_seqno: int
    end_seqno: int = 0xFFFFFFFFFFFFFFFF
    vbucket_uuid: int = 0
    snap_start_seqno: int = 0
    snap_end_seqno: int = 0
    flags: int = 0
    value: bytes = b""
    opaque: int = 0
    reserved: int = 0

    opcode = Opcode.DCP_STREAM_REQ

    @property
    def json(self) -> dict:
        """The decoded JSON value (stream-request-value.md), {} when absent."""
        return json.loads(self.value) if self.value else {}

    def encode(self) -> bytes:
        extras = _STREAM_REQ_EXTRAS.pack(self.flags, self.reserved, self.start_seqno, self.end_seqno,
                                         self.vbucket_uuid, self.snap_start_seqno, self.snap_end_seqno)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, value=self.value,
                       datatype=0x01 if self.value else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpStreamRequest":
        rules.check(frame)
        flags, reserved, start, end, uuid, snap_start, snap_end = _STREAM_REQ_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, start, end, uuid, snap_start, snap_end, flags, frame.value, frame.opaque,
                   reserved)

    def seqno_problem(self) -> ProtocolError | None:
        """The ERANGE rule of stream-request.md as the code applies it: only start > end is refused (the
        page says start must be less than end; start == end is accepted and ends at once)."""
        if self.start_seqno > self.end_seqno:
            return ProtocolError(f"start seqno {self.start_seqno} is greater than end seqno {self.end_seqno}",
                                 Status.ERANGE)
        if not self.snap_start_seqno <= self.start_seqno <= self.snap_end_seqno:
            return ProtocolError(f"snapshot range must satisfy snap_start ({self.snap_start_seqno}) <= start "
                                 f"({self.start_seqno}) <= snap_end ({self.snap_end_seqno})", Status.ERANGE)
        return None


rules.register(Opcode.DCP_STREAM_REQ, Shape(_PAGES + "stream-request.md", extras=(48,), value=MAY),
               Shape(_PAGES + "stream-request.md", value=MAY))


@rules.request_check(Opcode.DCP_STREAM_REQ)
def _stream_req_rules(frame: Frame):
    if len(frame.extras) == 48:
        flags = _U32.unpack_from(frame.extras)[0]
        yield from _stream_flag_problems(flags, "DCP_STREAM_REQ", "stream-request.md")
    if frame.value:
        try:
            doc = json.loads(frame.value)
        except (ValueError, RecursionError):
            yield ProtocolError("DCP_STREAM_REQ value is not valid JSON (stream-request-value.md)")
            return
        if not isinstance(doc, dict):
            yield ProtocolError("DCP_STREAM_REQ value must be a JSON object (stream-request-value.md)")
            return
        sid = doc.get("sid")
        # type(...) is int: JSON true/false are Python bools (an int subclass), and null is no id either
        if "sid" in doc and (type(sid) is not int or not 1 <= sid <= 0xFFFF):
            yield ProtocolError(f"stream id 'sid' must be 1..65535, got {sid!r}",
                                Status.DCP_STREAM_ID_INVALID)
        if "collections" in doc and "scope" in doc:
            yield ProtocolError("stream-request value may name 'collections' or 'scope', not both "
                                "(stream-request-value.md)")


def encode_failover_log(entries) -> bytes:
    """N x (u64 vbucket uuid, u64 seqno), newest entry first."""
    return b"".join(_FAILOVER_ENTRY.pack(uuid, seqno) for uuid, seqno in entries)


def decode_failover_log(value: bytes) -> list[tuple[int, int]]:
    if len(value) % 16:
        raise ProtocolError(f"failover log must be a multiple of 16 bytes; got {len(value)}")
    return list(_FAILOVER_ENTRY.iter_unpack(value))


class DcpStreamRequestResponse(NamedTuple):
    """The reply to STREAM_REQ: OK with the failover log, or ROLLBACK (0x23) with only a u64 seqno
    (not the failover log rollback.md mentions), or another error status."""

    status: int = Status.SUCCESS
    failover_log: tuple[tuple[int, int], ...] = ()
    rollback_seqno: int | None = None
    opaque: int = 0
    value: bytes = b""

    opcode = Opcode.DCP_STREAM_REQ

    def encode(self) -> bytes:
        if self.status == Status.SUCCESS:
            value = encode_failover_log(self.failover_log)
        elif self.status == Status.ROLLBACK:
            value = _U64.pack(self.rollback_seqno or 0)
        else:
            value = self.value
        return encode_frame(Magic.RESPONSE, self.opcode, value=value, vbucket_or_status=self.status,
                            opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpStreamRequestResponse":
        rules.check(frame)
        if frame.status == Status.SUCCESS:
            return cls(frame.status, tuple(decode_failover_log(frame.value)), None, frame.opaque)
        if frame.status == Status.ROLLBACK:
            return cls(frame.status, (), _U64.unpack(frame.value)[0], frame.opaque)
        return cls(frame.status, (), None, frame.opaque, frame.value)


@rules.response_check(Opcode.DCP_STREAM_REQ, Opcode.DCP_GET_FAILOVER_LOG, Opcode.GET_FAILOVER_LOG)
def _failover_log_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS and len(frame.value) % 16:
        yield ProtocolError(f"failover log value must be N x 16 bytes; got {len(frame.value)} "
                            f"(failover-log.md)")
    if frame.status == Status.SUCCESS and len(frame.value) >= 32:
        seqnos = [s for _, s in _FAILOVER_ENTRY.iter_unpack(frame.value[: len(frame.value) // 16 * 16])]
        if any(a < b for a, b in zip(seqnos, seqnos[1:], strict=False)):
            yield ProtocolError(f"failover log is not newest-first: seqnos {seqnos} increase")
    if frame.status == Status.ROLLBACK and frame.opcode == Opcode.DCP_STREAM_REQ and len(frame.value) != 8:
        yield ProtocolError(f"ROLLBACK response must carry exactly a u64 rollback seqno; got "
                            f"{len(frame.value)} bytes")


class DcpGetFailoverLog(NamedTuple):
    """DCP_GET_FAILOVER_LOG 0x54 (failover-log.md)."""

    vbucket: int
    opaque: int = 0

    opcode = Opcode.DCP_GET_FAILOVER_LOG

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpGetFailoverLog":
        rules.check(frame)
        return cls(frame.vbucket, frame.opaque)


class FailoverLogResponse(NamedTuple):
    """Reply to DCP_GET_FAILOVER_LOG (and GET_FAILOVER_LOG 0x96): entries newest first."""

    entries: tuple[tuple[int, int], ...]
    opaque: int = 0
    status: int = Status.SUCCESS
    opcode: int = Opcode.DCP_GET_FAILOVER_LOG

    def encode(self) -> bytes:
        value = encode_failover_log(self.entries) if self.status == Status.SUCCESS else b""
        return encode_frame(Magic.RESPONSE, self.opcode, value=value, vbucket_or_status=self.status,
                            opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "FailoverLogResponse":
        rules.check(frame)
        entries = tuple(decode_failover_log(frame.value)) if frame.status == Status.SUCCESS else ()
        return cls(entries, frame.opaque, frame.status, frame.opcode)


rules.register(Opcode.DCP_GET_FAILOVER_LOG, Shape(_PAGES + "failover-log.md"),
               Shape(_PAGES + "failover-log.md", value=MUST))
rules.register(Opcode.GET_FAILOVER_LOG, Shape("docs/BinaryProtocol.md#0x96"),
               Shape("docs/BinaryProtocol.md#0x96", value=MUST))


class DcpCloseStream(NamedTuple):
    """DCP_CLOSE_STREAM 0x52 (close-stream.md)."""

    vbucket: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_CLOSE_STREAM

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCloseStream":
        rules.check(frame)
        return cls(frame.vbucket, frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_CLOSE_STREAM, Shape(_PAGES + "close-stream.md"), Shape(_PAGES + "close-stream.md"))


# ---------------------------------------------------------------------------------------------
# Stream messages (producer -> consumer)


class DcpStreamEnd(NamedTuple):
    """DCP_STREAM_END 0x55 (stream-end.md): u32 reason in the extras."""

    vbucket: int
    reason: int = StreamEndReason.OK
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_STREAM_END

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.reason),
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpStreamEnd":
        rules.check(frame)
        return cls(frame.vbucket, _U32.unpack(frame.extras)[0], frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_STREAM_END, Shape(_PAGES + "stream-end.md", extras=(4,)))


class DcpSnapshotMarker(NamedTuple):
    """DCP_SNAPSHOT_MARKER 0x56 (snapshot-marker.md, whose example bytes disagree with its tables).

    V1: 20-byte extras. V2.0: 1-byte extras (version 0x00) + 36-byte value with max visible seqno
    and high completed seqno. V2.2: version 0x02 + a value adding the purge seqno and the high
    prepared seqno (52 bytes), or the purge seqno alone (44 bytes: the layout clients built from
    the page's first text meet; `high_prepared_seqno` None, and encoded so). Version 0x01 is
    invalid.
    """

    vbucket: int
    start_seqno: int
    end_seqno: int
    flags: int = SnapshotFlag.MEMORY
    version: int = MarkerVersion.V1
    max_visible_seqno: int = 0
    high_completed_seqno: int = 0
    purge_seqno: int = 0
    high_prepared_seqno: int | None = 0
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_SNAPSHOT_MARKER

    def encode(self) -> bytes:
        if self.version == MarkerVersion.V1:
            extras, value = _MARKER_V1.pack(self.start_seqno, self.end_seqno, self.flags), b""
        elif self.version == MarkerVersion.V2_0:
            extras = b"\x00"
            value = _MARKER_V20.pack(self.start_seqno, self.end_seqno, self.flags, self.max_visible_seqno,
                                     self.high_completed_seqno)
        elif self.version == MarkerVersion.V2_2:
            extras = b"\x02"
            if self.high_prepared_seqno is None:
                value = _MARKER_V22_44.pack(self.start_seqno, self.end_seqno, self.flags, self.max_visible_seqno,
                                            self.high_completed_seqno, self.purge_seqno)
            else:
                value = _MARKER_V22.pack(self.start_seqno, self.end_seqno, self.flags, self.max_visible_seqno,
                                         self.high_completed_seqno, self.purge_seqno, self.high_prepared_seqno)
        else:
            raise ValueError(f"snapshot marker version {self.version} is not V1, V2.0 or V2.2")
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, value=value,
                       stream_id=self.stream_id)

    def response(self, status: int = Status.SUCCESS) -> bytes:
        """The consumer's reply, owed only when the Ack flag is set."""
        return _ok_response(self.opcode, self.opaque, status)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSnapshotMarker":
        rules.check(frame)
        sid = frame.stream_id
        if len(frame.extras) == 20:
            start, end, flags = _MARKER_V1.unpack(frame.extras)
            return cls(frame.vbucket, start, end, flags, MarkerVersion.V1, opaque=frame.opaque, stream_id=sid)
        if frame.extras[0] == MarkerVersion.V2_0:
            start, end, flags, mvs, hcs = _MARKER_V20.unpack(frame.value)
            return cls(frame.vbucket, start, end, flags, MarkerVersion.V2_0, mvs, hcs, opaque=frame.opaque,
                       stream_id=sid)
        if len(frame.value) == MARKER_V22_SHORT:
            start, end, flags, mvs, hcs, purge = _MARKER_V22_44.unpack(frame.value)
            hps = None
        else:
            start, end, flags, mvs, hcs, purge, hps = _MARKER_V22.unpack(frame.value)
        return cls(frame.vbucket, start, end, flags, MarkerVersion.V2_2, mvs, hcs, purge, hps, frame.opaque,
                   sid)


rules.register(Opcode.DCP_SNAPSHOT_MARKER,
               Shape(_PAGES + "snapshot-marker.md", extras=(20, 1), value=MAY),
               Shape(_PAGES + "snapshot-marker.md"))


@rules.request_check(Opcode.DCP_SNAPSHOT_MARKER)
def _marker_rules(frame: Frame):
    page = "snapshot-marker.md"
    n = len(frame.extras)
    if n == 20:
        if frame.value:
            yield ProtocolError(f"a V1 snapshot marker (20-byte extras) must not have a value ({page})")
        start, end, flags = _MARKER_V1.unpack(frame.extras)
    elif n == 1:
        version = frame.extras[0]
        want = MARKER_V2_VALUE_BYTES.get(version)
        if want is None:
            yield ProtocolError(f"snapshot marker version 0x{version:02x} is invalid; V2.0 is 0x00 and V2.2 is "
                                f"0x02")
            return
        v22 = version == MarkerVersion.V2_2
        if len(frame.value) != want and not (v22 and len(frame.value) == MARKER_V22_SHORT):
            short = f" (or {MARKER_V22_SHORT}, without the high prepared seqno)" if v22 else ""
            yield ProtocolError(f"a V2.{version} snapshot marker value must be {want} bytes{short}; got "
                                f"{len(frame.value)} ({page})")
            return
        start, end, flags = _MARKER_V1.unpack_from(frame.value)
    else:
        return
    if start > end:
        yield ProtocolError(f"snapshot start {start} is greater than snapshot end {end} ({page})")
    if flags & ~sum(SnapshotFlag):
        yield ProtocolError(f"snapshot marker has unknown flag bits 0x{flags & ~sum(SnapshotFlag):x} ({page})")
    if flags & (SnapshotFlag.MEMORY | SnapshotFlag.DISK) == SnapshotFlag.MEMORY | SnapshotFlag.DISK:
        yield ProtocolError(f"snapshot marker cannot be both Memory and Disk ({page})")


class DcpMutation(NamedTuple):
    """DCP_MUTATION 0x57 (mutation.md): 31-byte extras (nmeta u16 + nru u8 at the end,
    no 'clen' as the page's diagram shows; nmeta must be 0)."""

    vbucket: int
    by_seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    lock_time: int
    key: bytes
    value: bytes
    cas: int = 0
    datatype: int = 0
    opaque: int = 0
    nru: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_MUTATION

    def encode(self) -> bytes:
        if self.stream_id is None:
            head = MUTATION_HEAD.pack(0x80, 0x57, len(self.key), 31, self.datatype, self.vbucket,
                                       31 + len(self.key) + len(self.value), self.opaque, self.cas,
                                       self.by_seqno, self.rev_seqno, self.flags, self.expiration,
                                       self.lock_time, 0, self.nru)
        else:
            head = _MUTATION_HEAD_SID.pack(0x08, 0x57, 3, len(self.key), 31, self.datatype, self.vbucket,
                                           34 + len(self.key) + len(self.value), self.opaque, self.cas,
                                           stream_id_frame(self.stream_id), self.by_seqno, self.rev_seqno,
                                           self.flags, self.expiration, self.lock_time, 0, self.nru)
        return head + self.key + self.value

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpMutation":
        rules.check(frame)
        by_seqno, rev_seqno, flags, expiration, lock_time, _nmeta, nru = _MUTATION_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, by_seqno, rev_seqno, flags, expiration, lock_time, frame.key, frame.value,
                   frame.cas, frame.datatype, frame.opaque, nru, frame.stream_id)


rules.register(Opcode.DCP_MUTATION, Shape(_PAGES + "mutation.md", extras=(31,), key=MUST, value=MAY))


@rules.request_check(Opcode.DCP_MUTATION)
def _mutation_rules(frame: Frame):
    if len(frame.extras) == 31 and _MUTATION_EXTRAS.unpack(frame.extras)[5]:
        yield ProtocolError("DCP_MUTATION nmeta must be 0: extended metadata is rejected")


class DcpDeletion(NamedTuple):
    """DCP_DELETION 0x58 (deletion.md): V1 (18-byte extras) or, with IncludeDeleteTimes, V2
    (21 bytes with delete time). A value may carry xattrs (the page
    says "must not have value"; with IncludeXattrs it may). `delete_time` None = V1."""

    vbucket: int
    by_seqno: int
    rev_seqno: int
    key: bytes
    value: bytes = b""
    cas: int = 0
    datatype: int = 0
    opaque: int = 0
    delete_time: int | None = None
    stream_id: int | None = None

    opcode = Opcode.DCP_DELETION

    def encode(self) -> bytes:
        if self.delete_time is None:
            extras = _DELETION_V1_EXTRAS.pack(self.by_seqno, self.rev_seqno, 0)
        else:
            extras = _DELETION_V2_EXTRAS.pack(self.by_seqno, self.rev_seqno, self.delete_time, 0)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, key=self.key, value=self.value,
                       cas=self.cas, datatype=self.datatype, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpDeletion":
        rules.check(frame)
        if len(frame.extras) == 18:
            by_seqno, rev_seqno, _ = _DELETION_V1_EXTRAS.unpack(frame.extras)
            delete_time = None
        else:
            by_seqno, rev_seqno, delete_time, _ = _DELETION_V2_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, by_seqno, rev_seqno, frame.key, frame.value, frame.cas, frame.datatype,
                   frame.opaque, delete_time, frame.stream_id)


rules.register(Opcode.DCP_DELETION, Shape(_PAGES + "deletion.md", extras=(18, 21), key=MUST, value=MAY))


@rules.request_check(Opcode.DCP_DELETION)
def _deletion_rules(frame: Frame):
    if len(frame.extras) == 18 and _DELETION_V1_EXTRAS.unpack(frame.extras)[2]:
        yield ProtocolError("DCP_DELETION nmeta must be 0: extended metadata is rejected (deletion.md)")


class DcpExpiration(NamedTuple):
    """DCP_EXPIRATION 0x59 (expiration.md): 20-byte extras with the delete time (the page's example
    header says 18)."""

    vbucket: int
    by_seqno: int
    rev_seqno: int
    key: bytes
    delete_time: int = 0
    value: bytes = b""
    cas: int = 0
    datatype: int = 0
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_EXPIRATION

    def encode(self) -> bytes:
        extras = _EXPIRATION_EXTRAS.pack(self.by_seqno, self.rev_seqno, self.delete_time)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, key=self.key, value=self.value,
                       cas=self.cas, datatype=self.datatype, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpExpiration":
        rules.check(frame)
        by_seqno, rev_seqno, delete_time = _EXPIRATION_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, by_seqno, rev_seqno, frame.key, delete_time, frame.value, frame.cas,
                   frame.datatype, frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_EXPIRATION, Shape(_PAGES + "expiration.md", extras=(20,), key=MUST, value=MAY))


class DcpSetVbucketState(NamedTuple):
    """DCP_SET_VBUCKET_STATE 0x5b (set-vbucket-state.md): takeover; 1-byte state, no value
    (KV-Engine's validator rejects any value; the JSON value the page mentions belongs to SET_VBUCKET
    0x3d). The consumer answers it."""

    vbucket: int
    state: int
    opaque: int = 0

    opcode = Opcode.DCP_SET_VBUCKET_STATE

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=bytes([self.state]))

    def response(self, status: int = Status.SUCCESS) -> bytes:
        return _ok_response(self.opcode, self.opaque, status)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSetVbucketState":
        rules.check(frame)
        return cls(frame.vbucket, frame.extras[0], frame.opaque)


rules.register(Opcode.DCP_SET_VBUCKET_STATE, Shape(_PAGES + "set-vbucket-state.md", extras=(1,)),
               Shape(_PAGES + "set-vbucket-state.md"))


@rules.request_check(Opcode.DCP_SET_VBUCKET_STATE)
def _set_vb_state_rules(frame: Frame):
    if len(frame.extras) == 1 and not 1 <= frame.extras[0] <= 4:
        yield ProtocolError(f"vbucket state {frame.extras[0]} is not 1 (active), 2 (replica), 3 (pending) "
                            f"or 4 (dead)")


class DcpSystemEvent(NamedTuple):
    """DCP_SYSTEM_EVENT 0x5f (system_event.md): 13-byte extras (seqno, event id, version)."""

    vbucket: int
    by_seqno: int
    event: int
    version: int
    key: bytes = b""
    value: bytes = b""
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_SYSTEM_EVENT

    def encode(self) -> bytes:
        extras = _SYSTEM_EVENT_EXTRAS.pack(self.by_seqno, self.event, self.version)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, key=self.key, value=self.value,
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSystemEvent":
        rules.check(frame)
        by_seqno, event, version = _SYSTEM_EVENT_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, by_seqno, event, version, frame.key, frame.value, frame.opaque,
                   frame.stream_id)

    def decode_value(self) -> dict:
        """The value's fields (system_events.py): the legacy structs of system_event.md (version 0
        and 1: scope id before collection id, as its struct says; its example swaps them) or the
        FlatBuffers table (version 2)."""
        return decode_event_value(self.event, self.version, self.value)


rules.register(Opcode.DCP_SYSTEM_EVENT, Shape(_PAGES + "system_event.md", extras=(13,), key=MAY, value=MAY))


class DcpPrepare(NamedTuple):
    """DCP_PREPARE 0x60 (prepare.md): 31-byte extras; CAS must be non-zero (the page's
    example has 0, KV-Engine's validator refuses it)."""

    vbucket: int
    by_seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    lock_time: int
    key: bytes
    value: bytes
    cas: int
    durability_level: int = DurabilityLevel.MAJORITY
    deleted: bool = False
    datatype: int = 0
    opaque: int = 0
    nru: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_PREPARE

    def encode(self) -> bytes:
        extras = _PREPARE_EXTRAS.pack(self.by_seqno, self.rev_seqno, self.flags, self.expiration,
                                      self.lock_time, self.nru, int(self.deleted), self.durability_level)
        return _encode(self.opcode, self.vbucket, self.opaque, extras=extras, key=self.key, value=self.value,
                       cas=self.cas, datatype=self.datatype, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpPrepare":
        rules.check(frame)
        by_seqno, rev, flags, exp, lock, nru, deleted, level = _PREPARE_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, by_seqno, rev, flags, exp, lock, frame.key, frame.value, frame.cas, level,
                   bool(deleted), frame.datatype, frame.opaque, nru, frame.stream_id)


rules.register(Opcode.DCP_PREPARE,
               Shape(_PAGES + "prepare.md", extras=(31,), key=MUST, value=MAY, cas=MUST))


@rules.request_check(Opcode.DCP_PREPARE)
def _prepare_rules(frame: Frame):
    if len(frame.extras) == 31 and not 1 <= frame.extras[30] <= 3:
        yield ProtocolError(f"DCP_PREPARE durability level {frame.extras[30]} is not 1..3",
                            Status.DURABILITY_INVALID_LEVEL)


class DcpSeqnoAcknowledged(NamedTuple):
    """DCP_SEQNO_ACKNOWLEDGED 0x61 (seqno-acknowledged.md): consumer -> producer, CAS 0."""

    vbucket: int
    prepared_seqno: int
    opaque: int = 0

    opcode = Opcode.DCP_SEQNO_ACKNOWLEDGED

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U64.pack(self.prepared_seqno))

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSeqnoAcknowledged":
        rules.check(frame)
        return cls(frame.vbucket, _U64.unpack(frame.extras)[0], frame.opaque)


rules.register(Opcode.DCP_SEQNO_ACKNOWLEDGED,
               Shape(_PAGES + "seqno-acknowledged.md", extras=(8,), cas=MUST_NOT))


class DcpCommit(NamedTuple):
    """DCP_COMMIT 0x62 (commit.md): prepared and commit seqnos; key; CAS 0."""

    vbucket: int
    prepared_seqno: int
    commit_seqno: int
    key: bytes
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_COMMIT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque,
                       extras=_TWO_SEQNOS.pack(self.prepared_seqno, self.commit_seqno), key=self.key,
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCommit":
        rules.check(frame)
        prepared, commit = _TWO_SEQNOS.unpack(frame.extras)
        return cls(frame.vbucket, prepared, commit, frame.key, frame.opaque, frame.stream_id)


class DcpAbort(NamedTuple):
    """DCP_ABORT 0x63 (abort.md): prepared and abort seqnos; key; CAS 0."""

    vbucket: int
    prepared_seqno: int
    abort_seqno: int
    key: bytes
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_ABORT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque,
                       extras=_TWO_SEQNOS.pack(self.prepared_seqno, self.abort_seqno), key=self.key,
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpAbort":
        rules.check(frame)
        prepared, abort = _TWO_SEQNOS.unpack(frame.extras)
        return cls(frame.vbucket, prepared, abort, frame.key, frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_COMMIT, Shape(_PAGES + "commit.md", extras=(16,), key=MUST, cas=MUST_NOT))
rules.register(Opcode.DCP_ABORT, Shape(_PAGES + "abort.md", extras=(16,), key=MUST, cas=MUST_NOT))


def sync_seqno(msg: "DcpPrepare | DcpCommit | DcpAbort") -> int:
    """The seqno a prepare, commit or abort occupies (commit.md, abort.md: not the prepared seqno)."""
    t = type(msg)
    return msg.by_seqno if t is DcpPrepare else msg.commit_seqno if t is DcpCommit else msg.abort_seqno


class DcpSeqnoAdvanced(NamedTuple):
    """DCP_SEQNO_ADVANCED 0x64 (seqno-advanced.md; its example bytes are wrong): 8-byte seqno."""

    vbucket: int
    by_seqno: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_SEQNO_ADVANCED

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U64.pack(self.by_seqno),
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpSeqnoAdvanced":
        rules.check(frame)
        return cls(frame.vbucket, _U64.unpack(frame.extras)[0], frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_SEQNO_ADVANCED, Shape(_PAGES + "seqno-advanced.md", extras=(8,)))


class DcpOsoSnapshot(NamedTuple):
    """DCP_OSO_SNAPSHOT 0x65 (oso_snapshot.md): u32 flags, 0x01 start / 0x02 end."""

    vbucket: int
    flags: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_OSO_SNAPSHOT

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, extras=_U32.pack(self.flags),
                       stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpOsoSnapshot":
        rules.check(frame)
        return cls(frame.vbucket, _U32.unpack(frame.extras)[0], frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_OSO_SNAPSHOT, Shape(_PAGES + "oso_snapshot.md", extras=(4,)))


@rules.request_check(Opcode.DCP_OSO_SNAPSHOT)
def _oso_rules(frame: Frame):
    if len(frame.extras) == 4:
        flags = _U32.unpack(frame.extras)[0]
        if flags not in (OsoFlag.START, OsoFlag.END):
            yield ProtocolError(f"DCP_OSO_SNAPSHOT flags must be 0x01 (start) or 0x02 (end); got 0x{flags:x} "
                                f"(oso_snapshot.md)")


class CacheTransferRecord(NamedTuple):
    """One item of a DCP_CACHE_TRANSFER batch (cache-transfer.md: the field table's 40-byte header;
    the page's example grid drops 4 bytes)."""

    cas: int
    by_seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    datatype: int
    cache_hint: int
    key: bytes
    value: bytes


class DcpCacheTransfer(NamedTuple):
    """DCP_CACHE_TRANSFER 0x66: batched 40-byte-header records in the value; CAS 0."""

    vbucket: int
    records: tuple[CacheTransferRecord, ...]
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_CACHE_TRANSFER

    def encode(self) -> bytes:
        parts = []
        for r in self.records:
            parts.append(_CACHE_RECORD.pack(r.cas, r.by_seqno, r.rev_seqno, len(r.value), r.flags,
                                            r.expiration, len(r.key), r.datatype, r.cache_hint))
            parts.append(r.key)
            parts.append(r.value)
        return _encode(self.opcode, self.vbucket, self.opaque, value=b"".join(parts), stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCacheTransfer":
        rules.check(frame)
        return cls(frame.vbucket, tuple(_cache_records(frame.value)), frame.opaque, frame.stream_id)


def _cache_records(value: bytes):
    pos, end = 0, len(value)
    while pos < end:
        if end - pos < 40:
            raise ProtocolError(f"cache-transfer record header needs 40 bytes; {end - pos} remain")
        cas, seq, rev, vlen, flags, exp, klen, dt, hint = _CACHE_RECORD.unpack_from(value, pos)
        pos += 40
        if klen < 2:
            raise ProtocolError(f"cache-transfer record key_len must be >= 2 (a collection-aware key); got "
                                f"{klen} (cache-transfer.md)")
        if pos + klen + vlen > end:
            raise ProtocolError(f"cache-transfer record declares key {klen} + value {vlen} bytes but only "
                                f"{end - pos} remain")
        key, val = value[pos:pos + klen], value[pos + klen:pos + klen + vlen]
        pos += klen + vlen
        yield CacheTransferRecord(cas, seq, rev, flags, exp, dt, hint, key, val)


class DcpCacheTransferEnd(NamedTuple):
    """DCP_CACHE_TRANSFER_END 0x67: the end of the cache-transfer phase."""

    vbucket: int
    opaque: int = 0
    stream_id: int | None = None

    opcode = Opcode.DCP_CACHE_TRANSFER_END

    def encode(self) -> bytes:
        return _encode(self.opcode, self.vbucket, self.opaque, stream_id=self.stream_id)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DcpCacheTransferEnd":
        rules.check(frame)
        return cls(frame.vbucket, frame.opaque, frame.stream_id)


rules.register(Opcode.DCP_CACHE_TRANSFER,
               Shape(_PAGES + "cache-transfer.md", value=MUST, cas=MUST_NOT))
rules.register(Opcode.DCP_CACHE_TRANSFER_END, Shape(_PAGES + "cache-transfer-end.md"))


@rules.request_check(Opcode.DCP_CACHE_TRANSFER)
def _cache_transfer_rules(frame: Frame):
    try:
        for _ in _cache_records(frame.value):
            pass
    except ProtocolError as e:
        yield e


rules.register(Opcode.DCP_FLUSH, Shape(_PAGES + "flush.md"))

# ---------------------------------------------------------------------------------------------
# Dispatch

#: Request opcode -> message type, for decoding anything that arrives on a DCP connection.
REQUEST_TYPES: dict[int, type] = {
    cls.opcode: cls for cls in (
        DcpOpen, DcpAddStream, DcpCloseStream, DcpStreamRequest, DcpGetFailoverLog, DcpStreamEnd,
        DcpSnapshotMarker, DcpMutation, DcpDeletion, DcpExpiration, DcpSetVbucketState, DcpNoop,
        DcpBufferAck, DcpControl, DcpSystemEvent, DcpPrepare, DcpSeqnoAcknowledged, DcpCommit, DcpAbort,
        DcpSeqnoAdvanced, DcpOsoSnapshot, DcpCacheTransfer, DcpCacheTransferEnd)
}

#: The messages a producer sends on a stream (stream-end.md .. cache-transfer-end), as opposed to the
#: connection-level ones (noop, buffer acknowledgement, control, seqno acknowledged) and
#: DCP_SET_VBUCKET_STATE, which the consumer answers.
STREAM_OPCODES = frozenset({
    Opcode.DCP_STREAM_END, Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_MUTATION, Opcode.DCP_DELETION,
    Opcode.DCP_EXPIRATION, Opcode.DCP_FLUSH, Opcode.DCP_SYSTEM_EVENT, Opcode.DCP_PREPARE, Opcode.DCP_COMMIT,
    Opcode.DCP_ABORT, Opcode.DCP_SEQNO_ADVANCED, Opcode.DCP_OSO_SNAPSHOT, Opcode.DCP_CACHE_TRANSFER,
    Opcode.DCP_CACHE_TRANSFER_END})

#: Response opcode -> message type, where the response has a body worth typing.
RESPONSE_TYPES: dict[int, type] = {
    Opcode.DCP_STREAM_REQ: DcpStreamRequestResponse,
    Opcode.DCP_GET_FAILOVER_LOG: FailoverLogResponse,
    Opcode.GET_FAILOVER_LOG: FailoverLogResponse,
    Opcode.DCP_ADD_STREAM: DcpAddStreamResponse,
}


def decode_dcp(frame: Frame):
    """The typed message for a frame seen on a DCP connection (raises ProtocolError if malformed)."""
    if frame.magic in (Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE):
        raise ProtocolError(f"magic 0x{frame.magic:02x} is a duplex server command, not a DCP message",
                            Status.UNKNOWN_COMMAND, opcode=frame.opcode, opaque=frame.opaque, magic=frame.magic)
    if frame.is_response:
        return RESPONSE_TYPES.get(frame.opcode, RawResponse).from_frame(frame)
    cls = REQUEST_TYPES.get(frame.opcode)
    if cls is None:
        rules.check(frame)
        raise ProtocolError(f"opcode {rules.opcode_name(frame.opcode)} is not a DCP message",
                            Status.UNKNOWN_COMMAND, opcode=frame.opcode, opaque=frame.opaque)
    return cls.from_frame(frame)


# -- the control frames of a stream, read in place -----------------------------------------------
# Every stream brings a snapshot marker and a stream end, so where vbuckets hold few documents the
# full decode (a Frame, the rules, a typed message) of those two is a sizeable part of a columnar
# reader's work. These read the canonical shape in place and answer None for anything else, which
# decode_dcp then accepts or rejects with its own words: what they accept, it accepts the same.

_HEAD = HEADER.unpack_from
_MARKER_FLAGS = int(sum(SnapshotFlag))
_MEMORY_DISK = int(SnapshotFlag.MEMORY | SnapshotFlag.DISK)


def marker_fields(data, p: int) -> tuple[int, int, int] | None:
    """(start, end, purge seqno) of the snapshot marker whose whole frame is at `p`: classic
    framing, no key, datatype 0, V1 (20-byte extras) or V2.0/V2.2 (version byte and its value;
    the purge seqno is V2.2's, else 0), start <= end, known flags and not both Memory and Disk
    (snapshot-marker.md); else None."""
    magic, opcode, klen, ext, datatype, _, body, _, _ = _HEAD(data, p)
    if magic != Magic.REQUEST or opcode != Opcode.DCP_SNAPSHOT_MARKER or klen or datatype:
        return None
    at = p + HEADER_LEN
    if ext == _MARKER_V1.size and body == ext:
        start, end, flags = _MARKER_V1.unpack_from(data, at)
        purge = 0
    elif ext == 1 and body > 1 and (body - 1 == MARKER_V2_VALUE_BYTES.get(data[at]) or
                                    (data[at] == MarkerVersion.V2_2 and body - 1 == MARKER_V22_SHORT)):
        if data[at] == MarkerVersion.V2_2:
            start, end, flags, _, _, purge = _MARKER_V22_44.unpack_from(data, at + 1)
        else:
            start, end, flags, _, _ = _MARKER_V20.unpack_from(data, at + 1)
            purge = 0
    else:
        return None
    if start > end or flags & ~_MARKER_FLAGS or flags & _MEMORY_DISK == _MEMORY_DISK:
        return None
    return start, end, purge


def stream_end_reason(data, p: int) -> int | None:
    """The reason of the stream end whose whole frame is at `p`: classic framing, 4-byte extras,
    no key or value, datatype 0 (stream-end.md); else None."""
    magic, opcode, klen, ext, datatype, _, body, _, _ = _HEAD(data, p)
    if (magic != Magic.REQUEST or opcode != Opcode.DCP_STREAM_END or klen or datatype or ext != _U32.size
            or body != ext):
        return None
    return _U32.unpack_from(data, p + HEADER_LEN)[0]


_tn = tuple.__new__


class DcpDecoder(FrameDecoder):
    """A FrameDecoder that yields typed DCP messages.

    The three messages that make up nearly all stream traffic (mutation, deletion, V1 snapshot
    marker) in classic framing are decoded straight from the buffer with one fused header+extras
    unpack and no intermediate Frame; everything else goes through Frame and `decode_dcp`, so the
    rules are the same for both paths.
    """

    __slots__ = ()

    def messages(self):
        """Yield every complete message now buffered (same contract as `frames()`)."""
        while True:
            if self._broken is not None:
                raise self._broken
            if self._chunks is None:
                buf, pos = self._buf, self._pos
                end = len(buf)
                limit = HEADER_LEN + self.max_body_len
                mut, del2, del1, marker = _MUT_FAST, _DEL2_FAST, _DEL1_FAST, _MARKER_FAST
                mutation, deletion, snapshot = DcpMutation, DcpDeletion, DcpSnapshotMarker
                while end - pos >= 44 and buf[pos] == 0x80:
                    op, ext = buf[pos + 1], buf[pos + 4]
                    if op == 0x57 and ext == 31 and end - pos >= 55:
                        klen, dt, vb, blen, opaque, cas, seq, rev, flags, exp, lock, nru = mut(buf, pos)
                        k = pos + 55
                        v = k + klen
                        fend = pos + 24 + blen
                        if not (v <= fend <= end and klen and fend - pos <= limit and buf[pos + 52] == 0
                                and buf[pos + 53] == 0):
                            break
                        self._pos = pos = fend
                        yield _tn(mutation, (vb, seq, rev, flags, exp, lock, buf[k:v], buf[v:fend], cas, dt,
                                             opaque, nru, None))
                    elif op == 0x58 and ext == 21 and end - pos >= 45:
                        klen, dt, vb, blen, opaque, cas, seq, rev, dtime = del2(buf, pos)
                        k = pos + 45
                        v = k + klen
                        fend = pos + 24 + blen
                        if not (v <= fend <= end and klen and fend - pos <= limit):
                            break
                        self._pos = pos = fend
                        yield _tn(deletion, (vb, seq, rev, buf[k:v], buf[v:fend], cas, dt, opaque, dtime, None))
                    elif op == 0x58 and ext == 18:
                        klen, dt, vb, blen, opaque, cas, seq, rev = del1(buf, pos)
                        k = pos + 42
                        v = k + klen
                        fend = pos + 24 + blen
                        if not (v <= fend <= end and klen and fend - pos <= limit and buf[pos + 40] == 0
                                and buf[pos + 41] == 0):
                            break
                        self._pos = pos = fend
                        yield _tn(deletion, (vb, seq, rev, buf[k:v], buf[v:fend], cas, dt, opaque, None, None))
                    elif op == 0x56 and ext == 20 and buf[pos + 2] == 0 and buf[pos + 3] == 0:
                        vb, blen, opaque, start, stop, flags = marker(buf, pos)
                        if not (blen == 20 and start <= stop and not flags & ~0x3F and flags & 3 != 3):
                            break
                        self._pos = pos = pos + 44
                        yield _tn(snapshot, (vb, start, stop, flags, -1, 0, 0, 0, 0, opaque, None))
                    else:
                        break
                    if self._buf is not buf:  # fed while suspended: feed() rebased the buffer
                        break
            # Slow path: one generic frame (or the wait for more bytes), then the fast path again.
            frame = next(self._frames(1), None)  # one frame: the fast loop above takes the rest
            if frame is None:
                return
            yield decode_dcp(frame)


#: Fixed part of each stream message's flow-control charge: header + extras (noops are free).
_CHARGE_BASE = {
    DcpMutation: 55, DcpExpiration: 44, DcpPrepare: 57, DcpCommit: 40, DcpAbort: 40, DcpStreamEnd: 28,
    DcpSetVbucketState: 25, DcpOsoSnapshot: 28, DcpSeqnoAdvanced: 32, DcpSystemEvent: 37,
    DcpCacheTransferEnd: 24,
}
_MARKER_CHARGE = {MarkerVersion.V1: 44, MarkerVersion.V2_0: 61, MarkerVersion.V2_2: 77}


def charged_size(message) -> int:
    """Bytes a producer charges against the flow-control buffer for a message.

    The wire size (header, stream-id frame, extras, key, value), computed without encoding, except
    that a Prepare costs 2 bytes more (MB-46634) and noops are free.
    """
    cls = type(message)
    base = _CHARGE_BASE.get(cls)
    if base is not None:
        size = base + len(getattr(message, "key", b"")) + len(getattr(message, "value", b""))
    elif cls is DcpSnapshotMarker:
        size = _MARKER_CHARGE[message.version]
        if message.version == MarkerVersion.V2_2 and message.high_prepared_seqno is None:
            size -= 8
    elif cls is DcpDeletion:
        size = (42 if message.delete_time is None else 45) + len(message.key) + len(message.value)
    elif cls is DcpNoop:
        return 0
    else:
        return len(message.encode())
    return size + 3 if getattr(message, "stream_id", None) is not None else size
