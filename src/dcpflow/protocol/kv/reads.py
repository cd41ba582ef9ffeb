"""Document reads (BinaryProtocol.md): the GET family, TOUCH / GAT, GET_LOCKED / UNLOCK_KEY and
GET_REPLICA.
"""

from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import Frame, request, response
from ..opcodes import Opcode
from ..rules import MAY, MUST, Shape
from ..status import Status
from .common import _BP, _U32, _check_opcode
from .writes import _MUTATION_SEQNO_EXTRAS

# ---------------------------------------------------------------------------------------------
# Document commands


_GET_PAGE = _BP + "#0x00-get"


class Get(NamedTuple):
    """GET 0x00 / GETQ 0x09 / GETK 0x0c / GETKQ 0x0d (BinaryProtocol.md#0x00-get): key only. The
    quiet forms send nothing on a miss; the K forms return the key (BinaryProtocol.md's GetK example
    reuses opcode 0x00 and miscounts its body)."""

    key: bytes
    vbucket: int = 0
    opaque: int = 0
    opcode: int = Opcode.GET
    framing: bytes = b""

    OPCODES = (Opcode.GET, Opcode.GET_Q, Opcode.GET_K, Opcode.GET_KQ)

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, vbucket=self.vbucket, opaque=self.opaque,
                       framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Get":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        return cls(frame.key, frame.vbucket, frame.opaque, Opcode(frame.opcode), frame.framing)

    @property
    def quiet(self) -> bool:
        return self.opcode in (Opcode.GET_Q, Opcode.GET_KQ)


class GetResponse(NamedTuple):
    """A found document: 4-byte flags extras, the value, its CAS and datatype; GETK/GETKQ add the key.
    Also the reply to GAT/GATQ (BinaryProtocol.md#0x1c-touch)."""

    flags: int = 0
    value: bytes = b""
    cas: int = 0
    datatype: int = 0
    key: bytes = b""
    opaque: int = 0
    status: int = Status.SUCCESS
    opcode: int = Opcode.GET

    OPCODES = Get.OPCODES + (Opcode.GAT, Opcode.GAT_Q, Opcode.GET_LOCKED, Opcode.GET_REPLICA)

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, extras=_U32.pack(self.flags), key=self.key, value=self.value,
                        opaque=self.opaque, cas=self.cas, datatype=self.datatype)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetResponse":
        _check_opcode(frame, cls.OPCODES, cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(opaque=frame.opaque, status=frame.status, opcode=Opcode(frame.opcode))
        return cls(_U32.unpack(frame.extras)[0], frame.value, frame.cas, frame.datatype, frame.key,
                   frame.opaque, frame.status, Opcode(frame.opcode))


for _op in Get.OPCODES:
    rules.register(_op, Shape(_GET_PAGE, key=MUST), Shape(_GET_PAGE, extras=(4,), key=MAY, value=MAY))

@rules.response_check(Opcode.GET_K, Opcode.GET_KQ)
def _getk_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS and not frame.key:
        yield ProtocolError(f"a {rules.opcode_name(frame.opcode)} response must carry the key "
                            f"(that is what the K forms add; {_GET_PAGE})")


_TOUCH_PAGE = _BP + "#0x1c-touch"


class Touch(NamedTuple):
    """TOUCH 0x1c (BinaryProtocol.md#0x1c-touch): set a new expiry (u32 extras) on an existing document.
    The reply is a MutationResponse."""

    key: bytes
    expiry: int
    vbucket: int = 0
    opaque: int = 0
    framing: bytes = b""

    opcode = Opcode.TOUCH

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, extras=_U32.pack(self.expiry), vbucket=self.vbucket,
                       opaque=self.opaque, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Touch":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.key, _U32.unpack(frame.extras)[0], frame.vbucket, frame.opaque, frame.framing)


class Gat(NamedTuple):
    """GAT 0x1d / GATQ 0x1e (BinaryProtocol.md#0x1c-touch): touch and return the document (GetResponse)."""

    key: bytes
    expiry: int
    vbucket: int = 0
    opaque: int = 0
    opcode: int = Opcode.GAT
    framing: bytes = b""

    OPCODES = (Opcode.GAT, Opcode.GAT_Q)

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, extras=_U32.pack(self.expiry), vbucket=self.vbucket,
                       opaque=self.opaque, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Gat":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        return cls(frame.key, _U32.unpack(frame.extras)[0], frame.vbucket, frame.opaque, Opcode(frame.opcode),
                   frame.framing)

    @property
    def quiet(self) -> bool:
        return self.opcode == Opcode.GAT_Q


rules.register(Opcode.TOUCH, Shape(_TOUCH_PAGE, extras=(4,), key=MUST),
               Shape(_TOUCH_PAGE, extras=_MUTATION_SEQNO_EXTRAS))
for _op in Gat.OPCODES:
    rules.register(_op, Shape(_TOUCH_PAGE, extras=(4,), key=MUST),
                   Shape(_TOUCH_PAGE, extras=(4,), key=MAY, value=MAY))


_LOCK_PAGE = _BP + "#0x94-get-locked"
_UNLOCK_PAGE = _BP + "#0x95-unlock-key"


class GetLocked(NamedTuple):
    """GET_LOCKED 0x94 (BinaryProtocol.md#0x94-get-locked): read a document and lock it against
    mutations for `lock_time` seconds (optional u32 extras; 0 or above the server's maximum means
    its default). The reply is a GetResponse whose CAS is the lock's: only a mutation or an
    UNLOCK_KEY carrying it gets through before the lock expires."""

    key: bytes
    lock_time: int = 0
    vbucket: int = 0
    opaque: int = 0
    framing: bytes = b""

    opcode = Opcode.GET_LOCKED

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, extras=_U32.pack(self.lock_time) if self.lock_time else b"",
                       vbucket=self.vbucket, opaque=self.opaque, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetLocked":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        lock_time = _U32.unpack(frame.extras)[0] if frame.extras else 0
        return cls(frame.key, lock_time, frame.vbucket, frame.opaque, frame.framing)


class Unlock(NamedTuple):
    """UNLOCK_KEY 0x95 (BinaryProtocol.md#0x95-unlock-key): release a GET_LOCKED lock early; the CAS
    must be the one GET_LOCKED returned (Locked if not, NotLocked if there is no lock)."""

    key: bytes
    cas: int
    vbucket: int = 0
    opaque: int = 0
    framing: bytes = b""

    opcode = Opcode.UNLOCK_KEY

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, cas=self.cas, vbucket=self.vbucket, opaque=self.opaque,
                       framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Unlock":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.key, frame.cas, frame.vbucket, frame.opaque, frame.framing)


rules.register(Opcode.GET_LOCKED, Shape(_LOCK_PAGE, extras=(0, 4), key=MUST),
               Shape(_LOCK_PAGE, extras=(4,), key=MAY, value=MAY))
# The page lists "MUST have extras" for the UNLOCK_KEY response, but defines none (no flags, no
# mutation token): this server sends none and the official SDKs read none.
rules.register(Opcode.UNLOCK_KEY, Shape(_UNLOCK_PAGE, key=MUST, cas=MUST), Shape(_UNLOCK_PAGE, extras=(0,)))


_REPLICA_PAGE = _BP + " (0x83 Get replica)"


class GetReplica(NamedTuple):
    """GET_REPLICA 0x83: read a document from a replica vbucket of this node (the SDK's
    get_any_replica / get_all_replicas): key only, as GET. The reply is a GetResponse; a vbucket
    that is not a replica here answers NOT_MY_VBUCKET."""

    key: bytes
    vbucket: int = 0
    opaque: int = 0
    framing: bytes = b""

    opcode = Opcode.GET_REPLICA

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, vbucket=self.vbucket, opaque=self.opaque, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetReplica":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.key, frame.vbucket, frame.opaque, frame.framing)


rules.register(Opcode.GET_REPLICA, Shape(_REPLICA_PAGE, key=MUST), Shape(_REPLICA_PAGE, extras=(4,), value=MAY))
