"""Document messages (mutation.md, deletion.md, expiration.md) and the producer's per-item and batch
packers for them: the hot path of a producer, so the packers write whole headers with one struct.
"""

from collections.abc import Sequence
from typing import NamedTuple

from .. import rules
from ..datatype import Datatype
from ..document import Document
from ..errors import ProtocolError
from ..frame import (
    HEADER_LEN,
    Frame,
    compiled,
    stream_id_frame,
)
from ..keys import FIRST_USER_COLLECTION, encode_leb128
from ..opcodes import Opcode
from ..rules import MAY, MUST, Shape
from .layouts import (
    _DELETION_OP,
    _DELETION_V1_EXTRAS,
    _DELETION_V2_EXTRAS,
    _EXPIRATION_EXTRAS,
    _MUTATION_EXTRAS,
    _MUTATION_HEAD_SID,
    _MUTATION_OP,
    _MUTATION_OP_SID,
    _PAGES,
    _SID_TAG,
    MUTATION_HEAD,
    _body_length,
    _encode,
    _pack_deletion_v1,
    _pack_deletion_v2,
    _pack_mutation_head,
    _pack_mutation_head_sid,
)


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

#: Document's constructor: the dataclass's (its twin, kept here) or, when built, the compiled one,
#: which stores the same fields without running Python code (tests/protocol/test_speedups.py). The
#: engine's hash table builds an Item per read through it.
document_init_py = Document.__init__
_document_init_for = compiled("document_init_for")
if _document_init_for is not None:
    Document.__init__ = _document_init_for(document_init_py.__defaults__)


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
