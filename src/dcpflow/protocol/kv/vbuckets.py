"""Vbucket and seqno commands: SET_VBUCKET, GET_VBUCKET, GET_ALL_VB_SEQNOS (get_seqno.md), OBSERVE_SEQNO,
SEQNO_PERSISTENCE (persist_seqno.md) and the collection-id replies (Collections.md).
"""

import json
import struct
from typing import NamedTuple

from .. import rules
from ..datatype import Datatype
from ..errors import ProtocolError
from ..frame import Frame, request, response
from ..opcodes import Opcode
from ..rules import MAY, MUST, Shape
from ..status import Status
from .common import (
    _BP,
    _CMDS,
    _OBSERVE_SEQNO,
    _OBSERVE_SEQNO_FAILOVER,
    _STATE_COLLECTION,
    _U32,
    _U64,
    _VB_SEQNO,
    VB_STATE_FILTERS,
    VB_STATES,
    _check_opcode,
    _json_value_problems,
)

# ---------------------------------------------------------------------------------------------
# Vbucket commands


class SetVbucket(NamedTuple):
    """SET_VBUCKET 0x3d (BinaryProtocol.md#0x3d-set-vbucket): 1-byte state extras and an optional JSON
    value (`topology`, `use_snapshot`, `next_expected_state`: set-vbucket-state-value.md, which belongs
    to this command and not to DCP_SET_VBUCKET_STATE 0x5b, as that page's title says). Sent by the cluster manager."""

    vbucket: int
    state: int
    value: bytes = b""
    opaque: int = 0

    opcode = Opcode.SET_VBUCKET

    def encode(self) -> bytes:
        return request(self.opcode, extras=bytes([self.state]), value=self.value, vbucket=self.vbucket,
                       opaque=self.opaque, datatype=Datatype.JSON if self.value else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SetVbucket":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.vbucket, frame.extras[0], frame.value, frame.opaque)

    @property
    def json(self) -> dict:
        return json.loads(self.value) if self.value else {}


_SETVB_PAGE = _BP + "#0x3d-set-vbucket"
rules.register(Opcode.SET_VBUCKET, Shape(_SETVB_PAGE, extras=(1,), value=MAY), Shape(_SETVB_PAGE))


@rules.request_check(Opcode.SET_VBUCKET)
def _set_vbucket_rules(frame: Frame):
    if len(frame.extras) == 1 and frame.extras[0] not in VB_STATES:
        yield ProtocolError(f"vbucket state {frame.extras[0]} is not 1 (active), 2 (replica), 3 (pending) or "
                            f"4 (dead) ({_SETVB_PAGE})")
    if frame.value:
        yield from _json_value_problems(frame, "SET_VBUCKET", _SETVB_PAGE, object_only=True)
    elif frame.datatype:
        yield ProtocolError(f"SET_VBUCKET without a value must have datatype 0 ({_SETVB_PAGE})")


class GetVbucket(NamedTuple):
    """GET_VBUCKET 0x3e (BinaryProtocol.md#0x3e-get-vbucket): the state of the header's vbucket."""

    vbucket: int
    opaque: int = 0

    opcode = Opcode.GET_VBUCKET

    def encode(self) -> bytes:
        return request(self.opcode, vbucket=self.vbucket, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetVbucket":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.vbucket, frame.opaque)


class GetVbucketResponse(NamedTuple):
    """The state as a u32 in the value."""

    state: int = 0
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.GET_VBUCKET

    def encode(self) -> bytes:
        value = _U32.pack(self.state) if self.status == Status.SUCCESS else b""
        return response(self.opcode, self.status, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetVbucketResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        state = _U32.unpack(frame.value)[0] if frame.status == Status.SUCCESS else 0
        return cls(state, frame.opaque, frame.status)


_GETVB_PAGE = _BP + "#0x3e-get-vbucket"
rules.register(Opcode.GET_VBUCKET, Shape(_GETVB_PAGE), Shape(_GETVB_PAGE, value=MUST))


@rules.response_check(Opcode.GET_VBUCKET)
def _get_vbucket_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS and frame.value and len(frame.value) != 4:
        yield ProtocolError(f"GET_VBUCKET response value must be a u32 state; got {len(frame.value)} bytes "
                            f"({_GETVB_PAGE})")


_SEQNOS_PAGE = _CMDS + "get_seqno.md"


class GetAllVbSeqnos(NamedTuple):
    """GET_ALL_VB_SEQNOS 0x48 (get_seqno.md): extras none (all alive vbuckets), 4 (a state
    filter, 0 = alive) or 8 (state filter + collection id: the high seqno of that collection)."""

    state: int | None = None
    collection_id: int | None = None
    opaque: int = 0

    opcode = Opcode.GET_ALL_VB_SEQNOS

    def encode(self) -> bytes:
        if self.collection_id is not None:
            extras = _STATE_COLLECTION.pack(self.state or 0, self.collection_id)
        elif self.state is not None:
            extras = _U32.pack(self.state)
        else:
            extras = b""
        return request(self.opcode, extras=extras, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetAllVbSeqnos":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        if len(frame.extras) == 8:
            state, cid = _STATE_COLLECTION.unpack(frame.extras)
            return cls(state, cid, frame.opaque)
        if len(frame.extras) == 4:
            return cls(_U32.unpack(frame.extras)[0], None, frame.opaque)
        return cls(None, None, frame.opaque)


class GetAllVbSeqnosResponse(NamedTuple):
    """N x (u16 vbucket, u64 high seqno), sorted by vbucket (get_seqno.md)."""

    seqnos: tuple[tuple[int, int], ...] = ()
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.GET_ALL_VB_SEQNOS

    def encode(self) -> bytes:
        ok = self.status == Status.SUCCESS
        value = b"".join(_VB_SEQNO.pack(vb, s) for vb, s in self.seqnos) if ok else b""
        return response(self.opcode, self.status, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetAllVbSeqnosResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls((), frame.opaque, frame.status)
        return cls(tuple(_VB_SEQNO.iter_unpack(frame.value)), frame.opaque, frame.status)

    def as_dict(self) -> dict[int, int]:
        return dict(self.seqnos)


# The page says "Must have value on Success", but a filter that matches no vbucket yields an empty list.
rules.register(Opcode.GET_ALL_VB_SEQNOS, Shape(_SEQNOS_PAGE, extras=(0, 4, 8)),
               Shape(_SEQNOS_PAGE, value=MAY))


@rules.request_check(Opcode.GET_ALL_VB_SEQNOS)
def _all_vb_seqnos_rules(frame: Frame):
    if len(frame.extras) in (4, 8):
        state = _U32.unpack_from(frame.extras)[0]
        if state not in VB_STATE_FILTERS:
            yield ProtocolError(f"GET_ALL_VB_SEQNOS state filter {state} is not 0 (alive), 1 (active), "
                                f"2 (replica), 3 (pending) or 4 (dead) ({_SEQNOS_PAGE})")


@rules.response_check(Opcode.GET_ALL_VB_SEQNOS)
def _all_vb_seqnos_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS and len(frame.value) % _VB_SEQNO.size:
        yield ProtocolError(f"GET_ALL_VB_SEQNOS value must be N x 10 bytes (u16 vbucket, u64 seqno); got "
                            f"{len(frame.value)} ({_SEQNOS_PAGE})")


_OBSERVE_PAGE = _BP + " (0x91 Observe seqno)"


class ObserveSeqno(NamedTuple):
    """OBSERVE_SEQNO 0x91: how far the header's vbucket has persisted; value = u64 vbucket UUID the
    client last saw (from a mutation token). BinaryProtocol.md lists the opcode; the layout is the
    memcached protocol's observe-seqno format."""

    vbucket: int
    vbucket_uuid: int
    opaque: int = 0

    opcode = Opcode.OBSERVE_SEQNO

    def encode(self) -> bytes:
        return request(self.opcode, value=_U64.pack(self.vbucket_uuid), vbucket=self.vbucket,
                       opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ObserveSeqno":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.vbucket, _U64.unpack(frame.value)[0], frame.opaque)


class ObserveSeqnoResponse(NamedTuple):
    """Format byte, vbucket u16, vbucket UUID u64, last persisted seqno u64, current seqno u64; format 1
    (the UUID asked about is not current: a hard failover happened) adds the old UUID and the last
    seqno received under it (`old_vbucket_uuid`, `last_received_seqno`, None for format 0)."""

    vbucket: int = 0
    vbucket_uuid: int = 0
    last_persisted_seqno: int = 0
    current_seqno: int = 0
    old_vbucket_uuid: int | None = None
    last_received_seqno: int | None = None
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.OBSERVE_SEQNO

    @property
    def failed_over(self) -> bool:
        return self.old_vbucket_uuid is not None

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        if self.old_vbucket_uuid is None:
            value = _OBSERVE_SEQNO.pack(0, self.vbucket, self.vbucket_uuid, self.last_persisted_seqno,
                                        self.current_seqno)
        else:
            value = _OBSERVE_SEQNO_FAILOVER.pack(1, self.vbucket, self.vbucket_uuid,
                                                 self.last_persisted_seqno, self.current_seqno,
                                                 self.old_vbucket_uuid, self.last_received_seqno or 0)
        return response(self.opcode, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ObserveSeqnoResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(opaque=frame.opaque, status=frame.status)
        if frame.value[0] == 0:
            _, vb, uuid, persisted, current = _OBSERVE_SEQNO.unpack(frame.value)
            return cls(vb, uuid, persisted, current, None, None, frame.opaque, frame.status)
        _, vb, uuid, persisted, current, old, received = _OBSERVE_SEQNO_FAILOVER.unpack(frame.value)
        return cls(vb, uuid, persisted, current, old, received, frame.opaque, frame.status)


rules.register(Opcode.OBSERVE_SEQNO, Shape(_OBSERVE_PAGE, value=MUST), Shape(_OBSERVE_PAGE, value=MUST))


@rules.request_check(Opcode.OBSERVE_SEQNO)
def _observe_seqno_rules(frame: Frame):
    if frame.value and len(frame.value) != 8:
        yield ProtocolError(f"OBSERVE_SEQNO value must be the u64 vbucket UUID; got {len(frame.value)} bytes "
                            f"({_OBSERVE_PAGE})")


@rules.response_check(Opcode.OBSERVE_SEQNO)
def _observe_seqno_response_rules(frame: Frame):
    if frame.status != Status.SUCCESS or not frame.value:
        return
    want = {0: _OBSERVE_SEQNO.size, 1: _OBSERVE_SEQNO_FAILOVER.size}.get(frame.value[0])
    if want is None:
        yield ProtocolError(f"OBSERVE_SEQNO format byte {frame.value[0]} is not 0 or 1 ({_OBSERVE_PAGE})")
    elif len(frame.value) != want:
        yield ProtocolError(f"OBSERVE_SEQNO format {frame.value[0]} value must be {want} bytes; got "
                            f"{len(frame.value)} ({_OBSERVE_PAGE})")


_PERSIST_PAGE = _CMDS + "persist_seqno.md"


class SeqnoPersistence(NamedTuple):
    """SEQNO_PERSISTENCE 0xb7 (persist_seqno.md; its example has a stray second
    seqno): reply once the header's vbucket has
    persisted up to the u64 seqno in the extras (ETMPFAIL on timeout)."""

    vbucket: int
    seqno: int
    opaque: int = 0

    opcode = Opcode.SEQNO_PERSISTENCE

    def encode(self) -> bytes:
        return request(self.opcode, extras=_U64.pack(self.seqno), vbucket=self.vbucket, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SeqnoPersistence":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.vbucket, _U64.unpack(frame.extras)[0], frame.opaque)


rules.register(Opcode.SEQNO_PERSISTENCE, Shape(_PERSIST_PAGE, extras=(8,)), Shape(_PERSIST_PAGE))


_COLLECTIONS_PAGE = "docs/Collections.md"
#: COLLECTIONS_GET_ID / GET_SCOPE_ID reply extras: manifest uid u64, collection or scope id u32.
_MANIFEST_ID = struct.Struct(">QI")


class CollectionIdResponse(NamedTuple):
    """The reply to COLLECTIONS_GET_ID 0xbb / COLLECTIONS_GET_SCOPE_ID 0xbc (Collections.md): 12 bytes
    of extras, the uid of the manifest the lookup used and the collection's (or scope's) id; no key,
    no value."""

    manifest_uid: int = 0
    id: int = 0
    opaque: int = 0
    status: int = Status.SUCCESS
    opcode: int = Opcode.COLLECTIONS_GET_ID

    OPCODES = (Opcode.COLLECTIONS_GET_ID, Opcode.COLLECTIONS_GET_SCOPE_ID)

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, extras=_MANIFEST_ID.pack(self.manifest_uid, self.id), opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "CollectionIdResponse":
        _check_opcode(frame, cls.OPCODES, cls, True)
        if frame.status != Status.SUCCESS:
            return cls(opaque=frame.opaque, status=frame.status, opcode=Opcode(frame.opcode))
        if len(frame.extras) != _MANIFEST_ID.size or frame.key or frame.value:
            raise ProtocolError(f"a {rules.opcode_name(frame.opcode)} reply has {_MANIFEST_ID.size} bytes of "
                                f"extras (manifest uid, id) and no key or value ({_COLLECTIONS_PAGE})",
                                opcode=frame.opcode, opaque=frame.opaque)
        manifest_uid, id_ = _MANIFEST_ID.unpack(frame.extras)
        return cls(manifest_uid, id_, frame.opaque, frame.status, Opcode(frame.opcode))
