"""KV range scans (Couchbase 7.6): RANGE_SCAN_CREATE 0xda, RANGE_SCAN_CONTINUE 0xdb,
RANGE_SCAN_CANCEL 0xdc, and the bodies their replies carry.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/range_scans/range_scan_create.md,
range_scan_continue.md, range_scan_cancel.md.

CREATE: a JSON value (datatype JSON) naming the collection (hex id, default 0), `key_only`,
`include_xattrs`, a `range` (`start`/`excl_start` and `end`/`excl_end`, base64 keys of at most 250
bytes) or a `sampling` (`samples`, `seed`), optional `snapshot_requirements` (`vb_uuid` as a
decimal string, `seqno`, `seqno_exists`, `timeout_ms`) and a `name`; the reply's value is the
scan's 16-byte id. CONTINUE: extras = id, item limit u32, time limit u32 (ms), byte limit u32
(0 = none). Its reply is one or more frames, each with 4-byte extras (0: keys only, 1: documents)
and a value of LEB128-length-prefixed keys, or documents (flags u32, expiry u32, seqno u64,
cas u64, datatype u8, LEB128 key length, key, LEB128 value length, value); the last frame's status
is RANGE_SCAN_MORE or RANGE_SCAN_COMPLETE. CANCEL: extras = the id.
"""

import base64
import binascii
import json
import struct
from typing import NamedTuple

from . import rules
from .datatype import Datatype
from .errors import ProtocolError
from .frame import Frame, Magic, request, response
from .keys import decode_leb128, encode_leb128
from .opcodes import Opcode
from .rules import MAY, MUST, Shape
from .status import Status

_PAGES = "docs/range_scans/"
_CREATE_PAGE = _PAGES + "range_scan_create.md"
_CONTINUE_PAGE = _PAGES + "range_scan_continue.md"
_CANCEL_PAGE = _PAGES + "range_scan_cancel.md"
_CONTINUE_EXTRAS = struct.Struct(">16sIII")
_DOC_META = struct.Struct(">IIQQB")
_U32 = struct.Struct(">I")
MAX_KEY_LEN = 250
MAX_NAME_LEN = 50
#: The flags of a continue reply's extras.
KEYS_ONLY, DOCUMENTS = 0, 1


def _einval(reason: str, page: str = _CREATE_PAGE) -> ProtocolError:
    return ProtocolError(f"{reason} ({page})")


def _check_opcode(frame: Frame, opcode: int, cls: type, response_expected: bool) -> None:
    if frame.magic in (Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE) or frame.opcode != opcode or \
            frame.is_response != response_expected:
        kind = "response" if frame.is_response else "request"
        raise ProtocolError(f"{cls.__name__} cannot decode a {rules.opcode_name(frame.opcode)} {kind}",
                            opcode=frame.opcode, opaque=frame.opaque, magic=frame.magic)


class SnapshotRequirements(NamedTuple):
    vbucket_uuid: int
    seqno: int
    seqno_exists: bool = False
    timeout_ms: int | None = None  # None: fail at once when the seqno is not persisted


class ScanConfig(NamedTuple):
    """A decoded CREATE value. A range has `start` <= keys <= `end` (each bound exclusive when
    its `excl_` flag is set); a sampling scan has `samples` and `seed` instead."""

    collection_id: int = 0
    key_only: bool = False
    include_xattrs: bool = False
    start: bytes | None = None
    end: bytes | None = None
    excl_start: bool = False
    excl_end: bool = False
    samples: int | None = None
    seed: int = 0
    snapshot: SnapshotRequirements | None = None
    name: str | None = None

    @property
    def sampling(self) -> bool:
        return self.samples is not None

    def to_json(self) -> dict:
        doc: dict = {}
        if self.collection_id:
            doc["collection"] = format(self.collection_id, "x")
        if self.key_only:
            doc["key_only"] = True
        if self.include_xattrs:
            doc["include_xattrs"] = True
        if self.sampling:
            doc["sampling"] = {"samples": self.samples, "seed": self.seed}
        else:
            doc["range"] = {"excl_start" if self.excl_start else "start": base64.b64encode(self.start or b"").decode(),
                            "excl_end" if self.excl_end else "end": base64.b64encode(self.end or b"").decode()}
        if self.snapshot is not None:
            snap = {"vb_uuid": str(self.snapshot.vbucket_uuid), "seqno": self.snapshot.seqno}
            if self.snapshot.seqno_exists:
                snap["seqno_exists"] = True
            if self.snapshot.timeout_ms is not None:
                snap["timeout_ms"] = self.snapshot.timeout_ms
            doc["snapshot_requirements"] = snap
        if self.name is not None:
            doc["name"] = self.name
        return doc


def _key(value, what: str) -> bytes:
    if not isinstance(value, str):
        raise _einval(f"range {what} must be a base64 string")
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _einval(f"range {what} is not valid base64") from None
    if len(key) > MAX_KEY_LEN:
        raise _einval(f"range {what} is {len(key)} bytes; a key is at most {MAX_KEY_LEN}")
    return key


def _uint(value, what: str, bits: int = 64) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << bits):
        raise _einval(f"{what} must be an unsigned {bits}-bit number")
    return value


def parse_config(value: bytes) -> ScanConfig:
    """The CREATE value, checked as the page says (EINVAL with the broken rule otherwise)."""
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        raise _einval("the value is not JSON") from None
    if not isinstance(doc, dict):
        raise _einval("the value must be a JSON object")
    collection = doc.get("collection", "0")
    try:
        if not isinstance(collection, str) or not collection:
            raise ValueError
        cid = int(collection, 16)
    except ValueError:
        raise _einval(f"collection {collection!r} must be a hex collection id string") from None
    key_only, xattrs = doc.get("key_only", False), doc.get("include_xattrs", False)
    if not isinstance(key_only, bool) or not isinstance(xattrs, bool):
        raise _einval("key_only and include_xattrs are booleans")
    if key_only and xattrs:
        raise _einval("include_xattrs cannot be combined with key_only")
    name = doc.get("name")
    if name is not None and (not isinstance(name, str) or len(name.encode()) > MAX_NAME_LEN):
        raise _einval(f"name must be a string of at most {MAX_NAME_LEN} bytes")
    fields: dict = {"collection_id": cid, "key_only": key_only, "include_xattrs": xattrs, "name": name}
    has_range, has_sampling = "range" in doc, "sampling" in doc
    if has_range == has_sampling:
        raise _einval("exactly one of range and sampling is required")
    if has_range:
        rng = doc["range"]
        if not isinstance(rng, dict):
            raise _einval("range must be an object")
        if ("start" in rng) == ("excl_start" in rng) or ("end" in rng) == ("excl_end" in rng):
            raise _einval("range needs one of start / excl_start and one of end / excl_end")
        fields["excl_start"], fields["excl_end"] = "excl_start" in rng, "excl_end" in rng
        fields["start"] = _key(rng["excl_start" if fields["excl_start"] else "start"], "start")
        fields["end"] = _key(rng["excl_end" if fields["excl_end"] else "end"], "end")
    else:
        sampling = doc["sampling"]
        if not isinstance(sampling, dict) or "samples" not in sampling:
            raise _einval("sampling must be an object with samples")
        fields["samples"] = _uint(sampling["samples"], "samples")
        if fields["samples"] == 0:
            raise _einval("samples must be above 0")
        fields["seed"] = _uint(sampling.get("seed", 0), "seed")
    snap = doc.get("snapshot_requirements")
    if snap is not None:
        if not isinstance(snap, dict) or "vb_uuid" not in snap or "seqno" not in snap:
            raise _einval("snapshot_requirements needs vb_uuid and seqno")
        uuid = snap["vb_uuid"]
        if not isinstance(uuid, str) or not uuid.isdigit() or int(uuid) >= 1 << 64:
            raise _einval("vb_uuid must be a decimal string of a 64-bit number")
        exists = snap.get("seqno_exists", False)
        if not isinstance(exists, bool):
            raise _einval("seqno_exists is a boolean")
        timeout = snap.get("timeout_ms")
        fields["snapshot"] = SnapshotRequirements(int(uuid), _uint(snap["seqno"], "seqno"), exists,
                                                  None if timeout is None else _uint(timeout, "timeout_ms", 32))
    return ScanConfig(**fields)


class RangeScanCreate(NamedTuple):
    """RANGE_SCAN_CREATE 0xda: the scan's configuration (ScanConfig) as JSON in the value."""

    vbucket: int
    config: ScanConfig
    opaque: int = 0

    opcode = Opcode.RANGE_SCAN_CREATE

    def encode(self) -> bytes:
        return request(self.opcode, value=json.dumps(self.config.to_json(), separators=(",", ":")).encode(),
                       datatype=Datatype.JSON, vbucket=self.vbucket, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "RangeScanCreate":
        _check_opcode(frame, cls.opcode, cls, False)
        rules.check(frame)
        return cls(frame.vbucket, parse_config(frame.value), frame.opaque)


class RangeScanCreateResponse(NamedTuple):
    """The new scan's 16-byte id (the value)."""

    scan_id: bytes = b""
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.RANGE_SCAN_CREATE

    def encode(self) -> bytes:
        ok = self.status == Status.SUCCESS
        return response(self.opcode, self.status, value=self.scan_id if ok else b"", opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "RangeScanCreateResponse":
        _check_opcode(frame, cls.opcode, cls, True)
        rules.check(frame)
        return cls(frame.value if frame.status == Status.SUCCESS else b"", frame.opaque, frame.status)


class RangeScanContinue(NamedTuple):
    """RANGE_SCAN_CONTINUE 0xdb: return more of the scan; limits of 0 mean none."""

    vbucket: int
    scan_id: bytes
    item_limit: int = 0
    time_limit_ms: int = 0
    byte_limit: int = 0
    opaque: int = 0

    opcode = Opcode.RANGE_SCAN_CONTINUE

    def encode(self) -> bytes:
        extras = _CONTINUE_EXTRAS.pack(self.scan_id, self.item_limit, self.time_limit_ms, self.byte_limit)
        return request(self.opcode, extras=extras, vbucket=self.vbucket, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "RangeScanContinue":
        _check_opcode(frame, cls.opcode, cls, False)
        rules.check(frame)
        scan_id, items, ms, size = _CONTINUE_EXTRAS.unpack(frame.extras)
        return cls(frame.vbucket, scan_id, items, ms, size, frame.opaque)


class RangeScanCancel(NamedTuple):
    """RANGE_SCAN_CANCEL 0xdc: the scan's id in the extras."""

    vbucket: int
    scan_id: bytes
    opaque: int = 0

    opcode = Opcode.RANGE_SCAN_CANCEL

    def encode(self) -> bytes:
        return request(self.opcode, extras=self.scan_id, vbucket=self.vbucket, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "RangeScanCancel":
        _check_opcode(frame, cls.opcode, cls, False)
        rules.check(frame)
        return cls(frame.vbucket, frame.extras, frame.opaque)


class ScanDocument(NamedTuple):
    """One document of a key_only:false scan."""

    key: bytes
    value: bytes = b""
    flags: int = 0
    expiry: int = 0
    seqno: int = 0
    cas: int = 0
    datatype: int = 0


def encode_keys(keys) -> bytes:
    return b"".join(encode_leb128(len(k)) + k for k in keys)


def encode_documents(docs) -> bytes:
    return b"".join(_DOC_META.pack(d.flags, d.expiry, d.seqno, d.cas, d.datatype) + encode_leb128(len(d.key)) + d.key
                    + encode_leb128(len(d.value)) + d.value for d in docs)


def _leb(data: bytes, pos: int) -> tuple[int, int]:
    try:
        value, used = decode_leb128(data, pos)
    except ProtocolError:
        raise _einval("a length is not a valid LEB128 number", _CONTINUE_PAGE) from None
    return value, pos + used


def decode_keys(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        n, pos = _leb(data, pos)
        if pos + n > len(data):
            raise _einval("a key runs past the end of the reply", _CONTINUE_PAGE)
        out.append(data[pos:pos + n])
        pos += n
    return out


def decode_documents(data: bytes) -> list[ScanDocument]:
    out, pos = [], 0
    while pos < len(data):
        if len(data) - pos < _DOC_META.size:
            raise _einval("a document's metadata is truncated", _CONTINUE_PAGE)
        flags, expiry, seqno, cas, datatype = _DOC_META.unpack_from(data, pos)
        pos += _DOC_META.size
        n, pos = _leb(data, pos)
        key = data[pos:pos + n]
        pos += n
        m, pos = _leb(data, pos)
        value = data[pos:pos + m]
        pos += m
        if pos > len(data):
            raise _einval("a document runs past the end of the reply", _CONTINUE_PAGE)
        out.append(ScanDocument(key, value, flags, expiry, seqno, cas, datatype))
    return out


#: Statuses of the frames a continue answers with data.
CONTINUE_DATA_STATUSES = frozenset((Status.SUCCESS, Status.RANGE_SCAN_MORE, Status.RANGE_SCAN_COMPLETE))


class RangeScanContinueResponse(NamedTuple):
    """One frame of a continue's answer: keys (`keys_only`) or documents, and the status
    (SUCCESS for a frame in the middle, RANGE_SCAN_MORE / RANGE_SCAN_COMPLETE for the last)."""

    keys_only: bool = True
    keys: tuple[bytes, ...] = ()
    documents: tuple[ScanDocument, ...] = ()
    status: int = Status.SUCCESS
    opaque: int = 0

    opcode = Opcode.RANGE_SCAN_CONTINUE

    def encode(self) -> bytes:
        if self.status not in CONTINUE_DATA_STATUSES:
            return response(self.opcode, self.status, opaque=self.opaque)
        body = encode_keys(self.keys) if self.keys_only else encode_documents(self.documents)
        return response(self.opcode, self.status, extras=_U32.pack(KEYS_ONLY if self.keys_only else DOCUMENTS),
                        value=body, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "RangeScanContinueResponse":
        _check_opcode(frame, cls.opcode, cls, True)
        rules.check(frame)
        if frame.status not in CONTINUE_DATA_STATUSES:
            return cls(status=frame.status, opaque=frame.opaque)
        keys_only = _U32.unpack(frame.extras)[0] == KEYS_ONLY
        if keys_only:
            return cls(True, tuple(decode_keys(frame.value)), (), frame.status, frame.opaque)
        return cls(False, (), tuple(decode_documents(frame.value)), frame.status, frame.opaque)


def _create_problems(frame: Frame):
    if frame.value and not frame.datatype & Datatype.JSON:
        yield _einval("the value must have datatype JSON")


def _continue_response_problems(frame: Frame):
    if frame.status in CONTINUE_DATA_STATUSES and len(frame.extras) != 4:
        yield _einval(f"a continue reply carries 4 bytes of extras; got {len(frame.extras)}", _CONTINUE_PAGE)
    elif frame.status in CONTINUE_DATA_STATUSES and _U32.unpack(frame.extras)[0] not in (KEYS_ONLY, DOCUMENTS):
        yield _einval("a continue reply's flags are 0 (keys) or 1 (documents)", _CONTINUE_PAGE)


def _create_response_problems(frame: Frame):
    if frame.status == Status.SUCCESS and len(frame.value) != 16:
        yield _einval(f"the scan id is 16 bytes; got {len(frame.value)}")


rules.register(Opcode.RANGE_SCAN_CREATE, Shape(_CREATE_PAGE, value=MUST), Shape(_CREATE_PAGE, value=MUST))
rules.register(Opcode.RANGE_SCAN_CONTINUE, Shape(_CONTINUE_PAGE, extras=(28,)),
               Shape(_CONTINUE_PAGE, extras=None, value=MAY))
rules.register(Opcode.RANGE_SCAN_CANCEL, Shape(_CANCEL_PAGE, extras=(16,)), Shape(_CANCEL_PAGE))
rules.request_check(Opcode.RANGE_SCAN_CREATE)(_create_problems)
rules.response_check(Opcode.RANGE_SCAN_CREATE)(_create_response_problems)
rules.response_check(Opcode.RANGE_SCAN_CONTINUE)(_continue_response_problems)

#: Request opcode -> type, response opcode -> type (messages.decode_message).
REQUEST_TYPES: dict[int, type] = {Opcode.RANGE_SCAN_CREATE: RangeScanCreate,
                                  Opcode.RANGE_SCAN_CONTINUE: RangeScanContinue,
                                  Opcode.RANGE_SCAN_CANCEL: RangeScanCancel}
RESPONSE_TYPES: dict[int, type] = {Opcode.RANGE_SCAN_CREATE: RangeScanCreateResponse,
                                   Opcode.RANGE_SCAN_CONTINUE: RangeScanContinueResponse}
