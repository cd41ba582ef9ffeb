"""Commands that carry a document's metadata explicitly: what XDCR-style replication writes with, and
how it reads metadata back.

Pages: https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/protocol/ (set_with_meta.md,
del_with_meta.md, get_meta.md, addrm.md / setrm.md / delrm.md) and https://github.com/couchbase/kv_engine/blob/master/docs/mutate-with-meta.md.
Their example bytes miscount extras and body lengths; the extras layouts and option bits here are
the ones KV-Engine's code uses.

Only structural rules live here: extras lengths, option combinations that are invalid whatever the
bucket (REGENERATE_CAS without skipping conflict resolution), what a value may hold. Rules that depend
on the bucket's conflict-resolution mode (FORCE_ACCEPT_WITH_META_OPS required on LWW, rejected on
rev-seqno buckets) belong to the engine.

Successful *WithMeta and MutateWithMeta replies are kv.MutationResponse (CAS, plus the mutation token
when HELLO MutationSeqno was granted).
"""

import json
import struct
from enum import IntEnum, IntFlag
from typing import NamedTuple

from . import rules
from .datatype import Datatype, split_xattrs
from .errors import ProtocolError
from .frame import Frame, request, response
from .kv import MutationResponse
from .kv.common import _check_opcode, _datatype_problems
from .opcodes import Opcode
from .rules import MAY, MUST, Shape
from .status import Status

_PAGES = "engines/ep/docs/protocol/"
_SWM_PAGE = _PAGES + "set_with_meta.md"
_DWM_PAGE = _PAGES + "del_with_meta.md"
_GM_PAGE = _PAGES + "get_meta.md"
_RM_PAGE = _PAGES + "setrm.md"
_MWM_PAGE = "docs/mutate-with-meta.md"

_U32 = struct.Struct(">I")
_META_24 = struct.Struct(">IIQQ")
_META_26 = struct.Struct(">IIQQH")
_META_28 = struct.Struct(">IIQQI")
_META_30 = struct.Struct(">IIQQIH")
_GET_META_20 = struct.Struct(">IIIQ")
_GET_META_21 = struct.Struct(">IIIQB")
_RETURN_META_REQ = struct.Struct(">III")
_RETURN_META_RESP = struct.Struct(">IIQ")

#: Valid *WithMeta extras lengths: 24 + optional options u32 + optional nmeta u16.
WITH_META_EXTRAS = (24, 26, 28, 30)


class WithMetaOption(IntFlag):
    """*WithMeta option bits (FORCE_ACCEPT_WITH_META_OPS is 0x02; mutate-with-meta.md says 0x20)."""

    FORCE_WITH_META_OP = 0x01  # only "skip conflict resolution" since MB-67207 (del_with_meta.md still says more)
    FORCE_ACCEPT_WITH_META_OPS = 0x02
    REGENERATE_CAS = 0x04
    SKIP_CONFLICT_RESOLUTION = 0x08
    IS_EXPIRATION = 0x10  # DelWithMeta: the delete is a TTL expiry


WITH_META_OPTIONS_KNOWN = int(sum(WithMetaOption))  # a plain int: ~ of an IntFlag stays inside its bits
_SKIPS_CR = int(WithMetaOption.SKIP_CONFLICT_RESOLUTION | WithMetaOption.FORCE_WITH_META_OP)


def skips_conflict_resolution(options: int | None) -> bool:
    """Both SKIP_CONFLICT_RESOLUTION and (since MB-67207) FORCE_WITH_META_OP skip it."""
    return bool((options or 0) & _SKIPS_CR)


def _pack_meta_extras(flags: int, exptime: int, rev_seqno: int, meta_cas: int, options: int | None,
                      ext_meta: bytes | None) -> bytes:
    if options is None and ext_meta is None:
        return _META_24.pack(flags, exptime, rev_seqno, meta_cas)
    if options is None:
        return _META_26.pack(flags, exptime, rev_seqno, meta_cas, len(ext_meta))
    if ext_meta is None:
        return _META_28.pack(flags, exptime, rev_seqno, meta_cas, options)
    return _META_30.pack(flags, exptime, rev_seqno, meta_cas, options, len(ext_meta))


def _unpack_meta_extras(extras: bytes) -> tuple[int, int, int, int, int | None, int | None]:
    """(flags, exptime, rev seqno, cas, options or None, nmeta or None) by extras length."""
    n = len(extras)
    if n == 24:
        return (*_META_24.unpack(extras), None, None)
    if n == 26:
        flags, exp, rev, cas, nmeta = _META_26.unpack(extras)
        return flags, exp, rev, cas, None, nmeta
    if n == 28:
        return (*_META_28.unpack(extras), None)
    return _META_30.unpack(extras)


def _split_ext_meta(value: bytes, nmeta: int | None) -> tuple[bytes, bytes | None]:
    """Strip the legacy extended-meta section from the end of the value (its length is nmeta)."""
    if nmeta is None:
        return value, None
    if not nmeta:
        return value, b""
    return value[:-nmeta], value[-nmeta:]


class SetWithMeta(NamedTuple):
    """SET_WITH_META 0xa2 / SETQ 0xa3 / ADD_WITH_META 0xa4 / ADDQ 0xa5 (set_with_meta.md).

    Extras: flags, expiration (absolute), rev seqno, the document's CAS (`meta_cas`), then optionally
    options u32 and nmeta u16: `options` / `ext_meta` None means the field is absent, which fixes the
    extras length (24/26/28/30), so decoding and re-encoding give the same bytes. `ext_meta` is the
    legacy extended-meta blob that follows the value on the wire (stripped and ignored by the server).
    The header `cas`, when non-zero, must match the stored document's CAS.
    """

    key: bytes
    value: bytes
    flags: int = 0
    expiration: int = 0
    rev_seqno: int = 0
    meta_cas: int = 0
    options: int | None = None
    ext_meta: bytes | None = None
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    datatype: int = 0
    opcode: int = Opcode.SET_WITH_META

    OPCODES = (Opcode.SET_WITH_META, Opcode.SETQ_WITH_META, Opcode.ADD_WITH_META, Opcode.ADDQ_WITH_META)

    def encode(self) -> bytes:
        extras = _pack_meta_extras(self.flags, self.expiration, self.rev_seqno, self.meta_cas, self.options,
                                   self.ext_meta)
        return request(self.opcode, key=self.key, extras=extras, value=self.value + (self.ext_meta or b""),
                       vbucket=self.vbucket, opaque=self.opaque, cas=self.cas, datatype=self.datatype)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SetWithMeta":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        flags, exp, rev, meta_cas, options, nmeta = _unpack_meta_extras(frame.extras)
        value, ext = _split_ext_meta(frame.value, nmeta)
        return cls(frame.key, value, flags, exp, rev, meta_cas, options, ext, frame.cas, frame.vbucket,
                   frame.opaque, frame.datatype, Opcode(frame.opcode))

    @property
    def quiet(self) -> bool:
        return self.opcode in (Opcode.SETQ_WITH_META, Opcode.ADDQ_WITH_META)

    @property
    def is_add(self) -> bool:
        return self.opcode in (Opcode.ADD_WITH_META, Opcode.ADDQ_WITH_META)


class DelWithMeta(NamedTuple):
    """DEL_WITH_META 0xa8 / DELQ_WITH_META 0xa9 (del_with_meta.md): the same extras, with
    the delete time in place of the expiration. The value, if any, may only hold xattrs (a tombstone
    keeps its system/user xattrs); `ext_meta` as for SetWithMeta."""

    key: bytes
    flags: int = 0
    delete_time: int = 0
    rev_seqno: int = 0
    meta_cas: int = 0
    options: int | None = None
    ext_meta: bytes | None = None
    value: bytes = b""
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    datatype: int = 0
    opcode: int = Opcode.DEL_WITH_META

    OPCODES = (Opcode.DEL_WITH_META, Opcode.DELQ_WITH_META)

    def encode(self) -> bytes:
        extras = _pack_meta_extras(self.flags, self.delete_time, self.rev_seqno, self.meta_cas, self.options,
                                   self.ext_meta)
        return request(self.opcode, key=self.key, extras=extras, value=self.value + (self.ext_meta or b""),
                       vbucket=self.vbucket, opaque=self.opaque, cas=self.cas, datatype=self.datatype)

    @classmethod
    def from_frame(cls, frame: Frame) -> "DelWithMeta":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        flags, dtime, rev, meta_cas, options, nmeta = _unpack_meta_extras(frame.extras)
        value, ext = _split_ext_meta(frame.value, nmeta)
        return cls(frame.key, flags, dtime, rev, meta_cas, options, ext, value, frame.cas, frame.vbucket,
                   frame.opaque, frame.datatype, Opcode(frame.opcode))

    @property
    def quiet(self) -> bool:
        return self.opcode == Opcode.DELQ_WITH_META

    @property
    def is_expiration(self) -> bool:
        return bool((self.options or 0) & WithMetaOption.IS_EXPIRATION)


# An empty value is a valid document: kv_engine checks a *WithMeta value's datatype, never its length.
for _op in SetWithMeta.OPCODES:
    rules.register(_op, Shape(_SWM_PAGE, extras=WITH_META_EXTRAS, key=MUST, value=MAY),
                   Shape(_SWM_PAGE, extras=(0, 16)))
for _op in DelWithMeta.OPCODES:
    rules.register(_op, Shape(_DWM_PAGE, extras=WITH_META_EXTRAS, key=MUST, value=MAY),
                   Shape(_DWM_PAGE, extras=(0, 16)))


@rules.request_check(*SetWithMeta.OPCODES, *DelWithMeta.OPCODES)
def _with_meta_rules(frame: Frame):
    name = rules.opcode_name(frame.opcode)
    is_del = frame.opcode in DelWithMeta.OPCODES
    page = _DWM_PAGE if is_del else _SWM_PAGE
    yield from _datatype_problems(frame, name)
    if len(frame.extras) not in WITH_META_EXTRAS:
        return  # the shape already reports the length
    _, _, _, _, options, nmeta = _unpack_meta_extras(frame.extras)
    if nmeta is not None and nmeta > len(frame.value):
        yield ProtocolError(f"{name} nmeta {nmeta} is longer than the {len(frame.value)}-byte value it is "
                            f"cut from ({page})")
        return
    if options is not None:
        if options & ~WITH_META_OPTIONS_KNOWN:
            yield ProtocolError(f"{name} has unknown option bits 0x{options & ~WITH_META_OPTIONS_KNOWN:x}; "
                                f"the options are 0x01..0x10 (FORCE_ACCEPT_WITH_META_OPS is 0x02)")
        if options & WithMetaOption.REGENERATE_CAS and not options & _SKIPS_CR:
            yield ProtocolError(f"{name} option REGENERATE_CAS requires SKIP_CONFLICT_RESOLUTION ({page})")
    if is_del:
        body, _ = _split_ext_meta(frame.value, nmeta)
        yield from _xattrs_only_problems(frame.datatype, body, name, page)


def _xattrs_only_problems(datatype: int, body: bytes, name: str, page: str):
    """A deletion's value may carry only xattrs (del_with_meta.md)."""
    if not body:
        return
    if not datatype & Datatype.XATTR:
        yield ProtocolError(f"{name} value may only hold xattrs, but the datatype has no XATTR bit ({page})")
        return
    if datatype & Datatype.SNAPPY:
        return  # compressed: the body can only be checked after decompression
    try:
        _, rest = split_xattrs(body)
    except ProtocolError as e:
        yield ProtocolError(f"{name} xattr value is malformed: {e.reason} ({page})")
        return
    if rest:
        yield ProtocolError(f"{name} value may only hold xattrs; it has {len(rest)} bytes of document body "
                            f"after them ({page})")


class GetMeta(NamedTuple):
    """GET_META 0xa0 / GETQ_META 0xa1 (get_meta.md): key, optional 1-byte version extras:
    1 (ignored since 4.6) or 2 (also return the datatype). `version` None = no extras."""

    key: bytes
    version: int | None = None
    vbucket: int = 0
    opaque: int = 0
    opcode: int = Opcode.GET_META

    OPCODES = (Opcode.GET_META, Opcode.GETQ_META)

    def encode(self) -> bytes:
        extras = b"" if self.version is None else bytes([self.version])
        return request(self.opcode, key=self.key, extras=extras, vbucket=self.vbucket, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetMeta":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        return cls(frame.key, frame.extras[0] if frame.extras else None, frame.vbucket, frame.opaque,
                   Opcode(frame.opcode))

    @property
    def wants_datatype(self) -> bool:
        return self.version == 2


class GetMetaResponse(NamedTuple):
    """Extras: deleted u32 (1 = soft-deleted), flags u32, expiry u32, rev seqno u64 (20 bytes), plus the
    datatype u8 when version 2 was asked (21 bytes; `datatype` None otherwise). CAS in the header."""

    deleted: int = 0
    flags: int = 0
    expiry: int = 0
    rev_seqno: int = 0
    cas: int = 0
    datatype: int | None = None
    opaque: int = 0
    status: int = Status.SUCCESS
    opcode: int = Opcode.GET_META

    OPCODES = GetMeta.OPCODES

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        if self.datatype is None:
            extras = _GET_META_20.pack(self.deleted, self.flags, self.expiry, self.rev_seqno)
        else:
            extras = _GET_META_21.pack(self.deleted, self.flags, self.expiry, self.rev_seqno, self.datatype)
        return response(self.opcode, extras=extras, opaque=self.opaque, cas=self.cas)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetMetaResponse":
        _check_opcode(frame, cls.OPCODES, cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(opaque=frame.opaque, status=frame.status, opcode=Opcode(frame.opcode))
        if len(frame.extras) == 21:
            deleted, flags, expiry, rev, datatype = _GET_META_21.unpack(frame.extras)
        else:
            (deleted, flags, expiry, rev), datatype = _GET_META_20.unpack(frame.extras), None
        return cls(deleted, flags, expiry, rev, frame.cas, datatype, frame.opaque, frame.status,
                   Opcode(frame.opcode))

    @property
    def is_deleted(self) -> bool:
        return bool(self.deleted & 0x01)


for _op in GetMeta.OPCODES:
    rules.register(_op, Shape(_GM_PAGE, extras=(0, 1), key=MUST), Shape(_GM_PAGE, extras=(20, 21)))


@rules.request_check(*GetMeta.OPCODES)
def _get_meta_rules(frame: Frame):
    if len(frame.extras) == 1 and frame.extras[0] not in (1, 2):
        yield ProtocolError(f"{rules.opcode_name(frame.opcode)} version byte must be 1 or 2; got "
                            f"{frame.extras[0]} ({_GM_PAGE})")


class ReturnMetaType(IntEnum):
    """ReturnMeta op type (setrm.md / addrm.md / delrm.md)."""

    SET = 1
    ADD = 2
    DEL = 3


class ReturnMeta(NamedTuple):
    """RETURN_META 0xb2 (setrm.md, addrm.md, delrm.md): a set/add/delete that returns the
    resulting metadata. Extras: op type u32, flags u32, expiration u32 (unused for delete)."""

    op_type: int
    key: bytes
    value: bytes = b""
    flags: int = 0
    expiration: int = 0
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    datatype: int = 0

    opcode = Opcode.RETURN_META

    def encode(self) -> bytes:
        extras = _RETURN_META_REQ.pack(self.op_type, self.flags, self.expiration)
        return request(self.opcode, key=self.key, extras=extras, value=self.value, vbucket=self.vbucket,
                       opaque=self.opaque, cas=self.cas, datatype=self.datatype)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ReturnMeta":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        op_type, flags, expiration = _RETURN_META_REQ.unpack(frame.extras)
        return cls(ReturnMetaType(op_type), frame.key, frame.value, flags, expiration, frame.cas,
                   frame.vbucket, frame.opaque, frame.datatype)


class ReturnMetaResponse(NamedTuple):
    """Extras: flags u32, expiration u32, seqno u64 (16 bytes); the CAS in the header."""

    flags: int = 0
    expiration: int = 0
    seqno: int = 0
    cas: int = 0
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.RETURN_META

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, extras=_RETURN_META_RESP.pack(self.flags, self.expiration, self.seqno),
                        opaque=self.opaque, cas=self.cas)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ReturnMetaResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(opaque=frame.opaque, status=frame.status)
        flags, expiration, seqno = _RETURN_META_RESP.unpack(frame.extras)
        return cls(flags, expiration, seqno, frame.cas, frame.opaque, frame.status)


rules.register(Opcode.RETURN_META, Shape(_RM_PAGE, extras=(12,), key=MUST, value=MAY),
               Shape(_RM_PAGE, extras=(16,)))


@rules.request_check(Opcode.RETURN_META)
def _return_meta_rules(frame: Frame):
    yield from _datatype_problems(frame, "RETURN_META")
    if len(frame.extras) != 12:
        return
    op_type = _U32.unpack_from(frame.extras)[0]
    if op_type not in ReturnMetaType._value2member_map_:
        yield ProtocolError(f"RETURN_META op type {op_type} is not 1 (set), 2 (add) or 3 (del) ({_RM_PAGE})")
    elif op_type == ReturnMetaType.DEL:
        yield from _xattrs_only_problems(frame.datatype, frame.value, "RETURN_META del", _PAGES + "delrm.md")


class MutateWithMeta(NamedTuple):
    """MUTATE_WITH_META 0x4b (mutate-with-meta.md): the document, then a JSON metadata segment
    (`command`, `cas`, `expiration`, `flags`, `rev_seqno`, `options`, `cas_offsets`, `seqno_offsets`)
    at the end of the value; extras = u32 size of that segment. Options use the WithMetaOption bits
    (FORCE_ACCEPT_WITH_META_OPS is 0x02, not the page's 0x20)."""

    key: bytes
    document: bytes
    meta: bytes
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    datatype: int = 0

    opcode = Opcode.MUTATE_WITH_META
    COMMANDS = ("add", "set", "delete")

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, extras=_U32.pack(len(self.meta)),
                       value=self.document + self.meta, vbucket=self.vbucket, opaque=self.opaque,
                       cas=self.cas, datatype=self.datatype)

    @classmethod
    def from_frame(cls, frame: Frame) -> "MutateWithMeta":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        size = _U32.unpack(frame.extras)[0]
        cut = len(frame.value) - size
        return cls(frame.key, frame.value[:cut], frame.value[cut:], frame.cas, frame.vbucket, frame.opaque,
                   frame.datatype)

    @property
    def meta_json(self) -> dict:
        return json.loads(self.meta)

    @property
    def options(self) -> int:
        """The options bitmask; 64-bit-safe hex strings ("0x04") and numbers are both accepted."""
        return _int_field(self.meta_json.get("options", 0))


def _int_field(v) -> int:
    if isinstance(v, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(v, int):
        return v
    return int(str(v), 0)


rules.register(Opcode.MUTATE_WITH_META, Shape(_MWM_PAGE, extras=(4,), key=MUST, value=MUST),
               Shape(_MWM_PAGE, extras=(0, 16), cas=MUST))


@rules.request_check(Opcode.MUTATE_WITH_META)
def _mutate_with_meta_rules(frame: Frame):
    yield from _datatype_problems(frame, "MUTATE_WITH_META")
    if len(frame.extras) != 4:
        return
    size = _U32.unpack(frame.extras)[0]
    if not size or size > len(frame.value):
        yield ProtocolError(f"MUTATE_WITH_META meta size {size} must be 1..{len(frame.value)} (the value "
                            f"length) ({_MWM_PAGE})")
        return
    try:
        doc = json.loads(frame.value[len(frame.value) - size:])
    except (ValueError, RecursionError):
        yield ProtocolError(f"MUTATE_WITH_META metadata segment is not valid JSON ({_MWM_PAGE})")
        return
    if not isinstance(doc, dict):
        yield ProtocolError(f"MUTATE_WITH_META metadata segment must be a JSON object ({_MWM_PAGE})")
        return
    if doc.get("command") not in MutateWithMeta.COMMANDS:
        yield ProtocolError(f"MUTATE_WITH_META 'command' must be add, set or delete; got "
                            f"{doc.get('command')!r} ({_MWM_PAGE})")
    try:
        options = _int_field(doc.get("options", 0))
    except (ValueError, TypeError):
        yield ProtocolError(f"MUTATE_WITH_META 'options' is not a number ({_MWM_PAGE})")
        return
    if options & ~WITH_META_OPTIONS_KNOWN:
        unknown = options & ~WITH_META_OPTIONS_KNOWN
        yield ProtocolError(f"MUTATE_WITH_META has unknown option bits 0x{unknown:x} (the options "
                            f"are 0x01..0x10; FORCE_ACCEPT_WITH_META_OPS is 0x02)")
    if doc.get("cas_offsets") and not options & WithMetaOption.REGENERATE_CAS:
        yield ProtocolError(f"MUTATE_WITH_META 'cas_offsets' requires option REGENERATE_CAS ({_MWM_PAGE})")
    if options & WithMetaOption.REGENERATE_CAS and "cas" in doc:
        yield ProtocolError(f"MUTATE_WITH_META must not send 'cas' with REGENERATE_CAS ({_MWM_PAGE})")
    if options & WithMetaOption.IS_EXPIRATION and doc.get("command") != "delete":
        yield ProtocolError(f"MUTATE_WITH_META option IS_EXPIRATION is only valid for delete ({_MWM_PAGE})")


# ---------------------------------------------------------------------------------------------
# Dispatch

REQUEST_TYPES: dict[int, type] = {ReturnMeta.opcode: ReturnMeta, MutateWithMeta.opcode: MutateWithMeta}
for _cls in (SetWithMeta, DelWithMeta, GetMeta):
    for _op in _cls.OPCODES:
        REQUEST_TYPES[_op] = _cls

RESPONSE_TYPES: dict[int, type] = {ReturnMeta.opcode: ReturnMetaResponse,
                                   Opcode.MUTATE_WITH_META: MutationResponse}
for _op in GetMeta.OPCODES:
    RESPONSE_TYPES[_op] = GetMetaResponse
for _op in SetWithMeta.OPCODES + DelWithMeta.OPCODES:
    RESPONSE_TYPES[_op] = MutationResponse
del _op, _cls
