"""Document writes (BinaryProtocol.md): SET / ADD / REPLACE, DELETE, INCREMENT / DECREMENT and APPEND /
PREPEND, with the mutation reply and its token.
"""

from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import Frame, request, response
from ..opcodes import Opcode
from ..rules import MAY, MUST, Shape
from ..status import Status
from .common import (
    _ARITH_EXTRAS,
    _BP,
    _U64,
    STORE_EXTRAS,
    _check_opcode,
    _datatype_problems,
    _mutation_extras,
    _mutation_token,
)

_STORE_PAGE = _BP + "#0x01-set"
_MUTATION_SEQNO_EXTRAS = (0, 16)


class Store(NamedTuple):
    """SET 0x01 / ADD 0x02 / REPLACE 0x03 and SETQ/ADDQ/REPLACEQ (BinaryProtocol.md#0x01-set): extras
    flags u32 + expiry u32. A non-zero CAS makes it conditional on the stored CAS. Durability and
    preserve-TTL requests travel in `framing` (magic 0x08)."""

    key: bytes
    value: bytes = b""
    flags: int = 0
    expiry: int = 0
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    datatype: int = 0
    opcode: int = Opcode.SET
    framing: bytes = b""

    OPCODES = (Opcode.SET, Opcode.ADD, Opcode.REPLACE, Opcode.SET_Q, Opcode.ADD_Q, Opcode.REPLACE_Q)

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, extras=STORE_EXTRAS.pack(self.flags, self.expiry),
                       value=self.value, vbucket=self.vbucket, opaque=self.opaque, cas=self.cas,
                       datatype=self.datatype, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Store":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        flags, expiry = STORE_EXTRAS.unpack(frame.extras)
        return cls(frame.key, frame.value, flags, expiry, frame.cas, frame.vbucket, frame.opaque,
                   frame.datatype, Opcode(frame.opcode), frame.framing)

    @property
    def quiet(self) -> bool:
        return self.opcode >= Opcode.SET_Q


for _op in Store.OPCODES:
    rules.register(_op, Shape(_STORE_PAGE, extras=(8,), key=MUST, value=MAY),
                   Shape(_STORE_PAGE, extras=_MUTATION_SEQNO_EXTRAS, cas=MUST))


class MutationResponse(NamedTuple):
    """Success reply to a mutation: the new CAS in the header and, when HELLO MutationSeqno (0x04) was
    granted, 16 bytes of extras with the vbucket UUID and the mutation's seqno (BinaryProtocol.md
    #0x01-set). Covers SET/ADD/REPLACE, DELETE, APPEND/PREPEND, TOUCH, *WithMeta and MutateWithMeta."""

    cas: int = 0
    vbucket_uuid: int | None = None
    seqno: int | None = None
    opaque: int = 0
    status: int = Status.SUCCESS
    opcode: int = Opcode.SET

    OPCODES = Store.OPCODES + (
        Opcode.DELETE, Opcode.DELETE_Q, Opcode.APPEND, Opcode.PREPEND, Opcode.APPEND_Q, Opcode.PREPEND_Q,
        Opcode.TOUCH, Opcode.SET_WITH_META, Opcode.SETQ_WITH_META, Opcode.ADD_WITH_META,
        Opcode.ADDQ_WITH_META, Opcode.DEL_WITH_META, Opcode.DELQ_WITH_META, Opcode.MUTATE_WITH_META)

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, extras=_mutation_extras(self.vbucket_uuid, self.seqno),
                        opaque=self.opaque, cas=self.cas)

    @classmethod
    def from_frame(cls, frame: Frame) -> "MutationResponse":
        _check_opcode(frame, cls.OPCODES, cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(opaque=frame.opaque, status=frame.status, opcode=Opcode(frame.opcode))
        uuid, seqno = _mutation_token(frame.extras)
        return cls(frame.cas, uuid, seqno, frame.opaque, frame.status, Opcode(frame.opcode))

    @property
    def mutation_token(self) -> tuple[int, int] | None:
        """(vbucket uuid, seqno), what a client needs for read-your-writes or to resume DCP at."""
        return None if self.vbucket_uuid is None else (self.vbucket_uuid, self.seqno or 0)




_DELETE_PAGE = _BP + "#0x04-delete"


class Delete(NamedTuple):
    """DELETE 0x04 / DELETEQ 0x14 (BinaryProtocol.md#0x04-delete): key only; CAS makes it conditional."""

    key: bytes
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    opcode: int = Opcode.DELETE
    framing: bytes = b""

    OPCODES = (Opcode.DELETE, Opcode.DELETE_Q)

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, vbucket=self.vbucket, opaque=self.opaque, cas=self.cas,
                       framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Delete":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        return cls(frame.key, frame.cas, frame.vbucket, frame.opaque, Opcode(frame.opcode), frame.framing)

    @property
    def quiet(self) -> bool:
        return self.opcode == Opcode.DELETE_Q


for _op in Delete.OPCODES:
    rules.register(_op, Shape(_DELETE_PAGE, key=MUST), Shape(_DELETE_PAGE, extras=_MUTATION_SEQNO_EXTRAS))


_ARITH_PAGE = _BP + "#0x05-increment"


class Arithmetic(NamedTuple):
    """INCREMENT 0x05 / DECREMENT 0x06 and their quiet forms (BinaryProtocol.md#0x05-increment): 20-byte
    extras delta u64, initial u64, expiry u32. Expiry 0xffffffff means "fail with KEY_ENOENT rather
    than create the counter"."""

    key: bytes
    delta: int = 1
    initial: int = 0
    expiry: int = 0
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    opcode: int = Opcode.INCREMENT
    framing: bytes = b""

    OPCODES = (Opcode.INCREMENT, Opcode.DECREMENT, Opcode.INCREMENT_Q, Opcode.DECREMENT_Q)
    NO_CREATE = 0xFFFFFFFF

    def encode(self) -> bytes:
        extras = _ARITH_EXTRAS.pack(self.delta, self.initial, self.expiry)
        return request(self.opcode, key=self.key, extras=extras, vbucket=self.vbucket, opaque=self.opaque,
                       cas=self.cas, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Arithmetic":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        delta, initial, expiry = _ARITH_EXTRAS.unpack(frame.extras)
        return cls(frame.key, delta, initial, expiry, frame.cas, frame.vbucket, frame.opaque,
                   Opcode(frame.opcode), frame.framing)

    @property
    def quiet(self) -> bool:
        return self.opcode in (Opcode.INCREMENT_Q, Opcode.DECREMENT_Q)


class ArithmeticResponse(NamedTuple):
    """The counter's new value as a u64 in the value, plus the mutation token extras when enabled."""

    value: int = 0
    cas: int = 0
    vbucket_uuid: int | None = None
    seqno: int | None = None
    opaque: int = 0
    status: int = Status.SUCCESS
    opcode: int = Opcode.INCREMENT

    OPCODES = Arithmetic.OPCODES

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, extras=_mutation_extras(self.vbucket_uuid, self.seqno),
                        value=_U64.pack(self.value), opaque=self.opaque, cas=self.cas)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ArithmeticResponse":
        _check_opcode(frame, cls.OPCODES, cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(opaque=frame.opaque, status=frame.status, opcode=Opcode(frame.opcode))
        uuid, seqno = _mutation_token(frame.extras)
        return cls(_U64.unpack(frame.value)[0], frame.cas, uuid, seqno, frame.opaque, frame.status,
                   Opcode(frame.opcode))


for _op in Arithmetic.OPCODES:
    rules.register(_op, Shape(_ARITH_PAGE, extras=(20,), key=MUST),
                   Shape(_ARITH_PAGE, extras=_MUTATION_SEQNO_EXTRAS, value=MUST))


@rules.response_check(*Arithmetic.OPCODES)
def _arith_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS and frame.value and len(frame.value) != 8:
        yield ProtocolError(f"{rules.opcode_name(frame.opcode)} response value must be the u64 counter; got "
                            f"{len(frame.value)} bytes ({_ARITH_PAGE})")


_CONCAT_PAGE = _BP + "#0x0e-append"


class Concat(NamedTuple):
    """APPEND 0x0e / PREPEND 0x0f and APPENDQ/PREPENDQ (BinaryProtocol.md#0x0e-append): key and the
    bytes to add at the end (append) or the start (prepend) of the stored value."""

    key: bytes
    value: bytes
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    datatype: int = 0
    opcode: int = Opcode.APPEND
    framing: bytes = b""

    OPCODES = (Opcode.APPEND, Opcode.PREPEND, Opcode.APPEND_Q, Opcode.PREPEND_Q)

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, value=self.value, vbucket=self.vbucket, opaque=self.opaque,
                       cas=self.cas, datatype=self.datatype, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Concat":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        return cls(frame.key, frame.value, frame.cas, frame.vbucket, frame.opaque, frame.datatype,
                   Opcode(frame.opcode), frame.framing)

    @property
    def quiet(self) -> bool:
        return self.opcode in (Opcode.APPEND_Q, Opcode.PREPEND_Q)


for _op in Concat.OPCODES:
    rules.register(_op, Shape(_CONCAT_PAGE, key=MUST, value=MUST),
                   Shape(_CONCAT_PAGE, extras=_MUTATION_SEQNO_EXTRAS, cas=MUST))


@rules.request_check(*Store.OPCODES, *Concat.OPCODES)
def _document_datatype_rules(frame: Frame):
    yield from _datatype_problems(frame, rules.opcode_name(frame.opcode))
