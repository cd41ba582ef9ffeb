"""Session setup (BinaryProtocol.md, sasl.md): HELLO and feature negotiation, SASL, SELECT_BUCKET and
LIST_BUCKETS.
"""

import json
from typing import NamedTuple

from .. import rules
from ..errors import ProtocolError
from ..frame import Frame, request, response
from ..hello import RETIRED, Feature, decode_features, encode_features
from ..opcodes import Opcode
from ..rules import MAY, MUST, Shape
from ..status import Status
from .common import _BP, _SASL, _check_opcode

# ---------------------------------------------------------------------------------------------
# Session: HELLO, SASL, SELECT_BUCKET, cluster config, error map, version, noop, quit


class Hello(NamedTuple):
    """HELLO 0x1f (BinaryProtocol.md#0x1f-helo): key = agent name, or JSON {"a": agent, "i": id};
    value = the u16 features asked for."""

    agent: bytes = b""
    features: tuple[int, ...] = ()
    opaque: int = 0

    opcode = Opcode.HELLO

    def encode(self) -> bytes:
        return request(self.opcode, key=self.agent, value=encode_features(self.features), opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Hello":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.key, tuple(decode_features(frame.value)), frame.opaque)

    def _agent_json(self) -> dict | None:
        if not self.agent.startswith(b"{"):
            return None
        try:
            doc = json.loads(self.agent)
        except (ValueError, RecursionError):
            return None
        return doc if isinstance(doc, dict) else None

    @property
    def agent_name(self) -> str:
        doc = self._agent_json()
        if doc is not None and "a" in doc:
            return str(doc["a"])
        return self.agent.decode("utf-8", "replace")

    @property
    def connection_id(self) -> str | None:
        doc = self._agent_json()
        return None if doc is None or "i" not in doc else str(doc["i"])

    @property
    def retired_features(self) -> tuple[int, ...]:
        """Asked-for codes no server grants (0x0001 Datatype and 0x0005 TcpDelay are retired, though
        BinaryProtocol.md's HELO example still sends them)."""
        return tuple(f for f in self.features if f in RETIRED)


class HelloResponse(NamedTuple):
    """The features the server agreed to enable, as u16s in the value."""

    features: tuple[int, ...] = ()
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.HELLO

    def encode(self) -> bytes:
        value = encode_features(self.features) if self.status == Status.SUCCESS else b""
        return response(self.opcode, self.status, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "HelloResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        features = tuple(decode_features(frame.value)) if frame.status == Status.SUCCESS else ()
        return cls(features, frame.opaque, frame.status)


def negotiate(requested, supported) -> tuple[int, ...]:
    """The features a server grants: those asked for that it implements, in request order, once each.

    Retired codes are never granted, and the clustermap push notifications need Duplex granted as
    well (the server pushes maps as duplex requests).
    """
    supported = {int(f) for f in supported} - {int(f) for f in RETIRED}
    granted: list[int] = []
    for f in requested:
        if int(f) in supported and int(f) not in granted:
            granted.append(int(f))
    if Feature.DUPLEX not in granted:
        granted = [f for f in granted if f not in (Feature.CLUSTERMAP_CHANGE_NOTIFICATION,
                                                   Feature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF)]
    return tuple(Feature(f) if f in Feature._value2member_map_ else f for f in granted)


rules.register(Opcode.HELLO, Shape(_BP + "#0x1f-helo", key=MAY, value=MAY),
               Shape(_BP + "#0x1f-helo", value=MAY))


@rules.request_check(Opcode.HELLO)
@rules.response_check(Opcode.HELLO)
def _hello_rules(frame: Frame):
    if frame.is_response and frame.status != Status.SUCCESS:
        return
    if len(frame.value) % 2:
        yield ProtocolError(f"HELLO value must be a list of u16 feature codes; got {len(frame.value)} bytes "
                            f"({_BP}#0x1f-helo)")


class SaslListMechs(NamedTuple):
    """SASL_LIST_MECHS 0x20 (sasl.md): no body."""

    opaque: int = 0

    opcode = Opcode.SASL_LIST_MECHS

    def encode(self) -> bytes:
        return request(self.opcode, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SaslListMechs":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.opaque)


class SaslListMechsResponse(NamedTuple):
    """The mechanisms, space separated in the value (sasl.md)."""

    mechanisms: tuple[str, ...] = ()
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.SASL_LIST_MECHS

    def encode(self) -> bytes:
        value = " ".join(self.mechanisms).encode() if self.status == Status.SUCCESS else b""
        return response(self.opcode, self.status, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SaslListMechsResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls((), frame.opaque, frame.status)
        return cls(tuple(frame.value.decode("ascii", "replace").split()), frame.opaque, frame.status)


class SaslAuth(NamedTuple):
    """SASL_AUTH 0x21 (sasl.md): key = mechanism, value = the client's first message.

    `opcode` may also be SASL_STEP 0x22, whose encoding is identical: the opcode only tells the server
    whether this continues an exchange or starts a new one."""

    mechanism: bytes
    payload: bytes = b""
    opaque: int = 0
    opcode: int = Opcode.SASL_AUTH

    OPCODES = (Opcode.SASL_AUTH, Opcode.SASL_STEP)

    def encode(self) -> bytes:
        return request(self.opcode, key=self.mechanism, value=self.payload, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SaslAuth":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        return cls(frame.key, frame.value, frame.opaque, Opcode(frame.opcode))


def sasl_step(mechanism: bytes, payload: bytes = b"", opaque: int = 0) -> SaslAuth:
    """SASL_STEP 0x22: a SaslAuth with the step opcode (sasl.md)."""
    return SaslAuth(mechanism, payload, opaque, Opcode.SASL_STEP)


class SaslResponse(NamedTuple):
    """Reply to SASL_AUTH / SASL_STEP: the server's message in the value. Status AUTH_CONTINUE (0x21)
    means the value is a challenge and the client must answer with SASL_STEP; SUCCESS may carry the
    final server message (SCRAM's `v=...`); AUTH_ERROR ends the exchange (sasl.md)."""

    payload: bytes = b""
    status: int = Status.SUCCESS
    opaque: int = 0
    opcode: int = Opcode.SASL_AUTH

    OPCODES = SaslAuth.OPCODES

    def encode(self) -> bytes:
        value = self.payload if self.status in (Status.SUCCESS, Status.AUTH_CONTINUE) else b""
        return response(self.opcode, self.status, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SaslResponse":
        _check_opcode(frame, cls.OPCODES, cls, True)
        rules.check(frame)
        keep = frame.status in (Status.SUCCESS, Status.AUTH_CONTINUE)
        return cls(frame.value if keep else b"", frame.status, frame.opaque, Opcode(frame.opcode))

    @property
    def is_continue(self) -> bool:
        return self.status == Status.AUTH_CONTINUE


rules.register(Opcode.SASL_LIST_MECHS, Shape(_SASL + "#0x20-list_mech"),
               Shape(_SASL + "#0x20-list_mech", value=MAY))
for _op in SaslAuth.OPCODES:
    rules.register(_op, Shape(_SASL + "#0x21-sasl_auth", key=MUST, value=MAY),
                   Shape(_SASL + "#0x21-sasl_auth", value=MAY))


@rules.response_check(*SaslAuth.OPCODES)
def _sasl_continue_rules(frame: Frame):
    # AUTH_CONTINUE is not a success, so the shape above is not applied to it; it has the same shape.
    if frame.status == Status.AUTH_CONTINUE and (frame.extras or frame.key):
        yield ProtocolError(f"an AUTH_CONTINUE response must carry only a value ({_SASL}#0x21-sasl_auth)")


class SelectBucket(NamedTuple):
    """SELECT_BUCKET 0x89 (BinaryProtocol.md#0x89-select-bucket): key = bucket name; "@no bucket@"
    unbinds the connection."""

    name: bytes
    opaque: int = 0

    opcode = Opcode.SELECT_BUCKET

    def encode(self) -> bytes:
        return request(self.opcode, key=self.name, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SelectBucket":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.key, frame.opaque)


NO_BUCKET_NAME = b"@no bucket@"

rules.register(Opcode.SELECT_BUCKET, Shape(_BP + "#0x89-select-bucket", key=MUST),
               Shape(_BP + "#0x89-select-bucket", value=MAY))


class ListBuckets(NamedTuple):
    """LIST_BUCKETS 0x87 (BinaryProtocol.md#0x87-list-buckets): no body."""

    opaque: int = 0

    opcode = Opcode.LIST_BUCKETS

    def encode(self) -> bytes:
        return request(self.opcode, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ListBuckets":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.opaque)


class ListBucketsResponse(NamedTuple):
    """Bucket names separated by single spaces in the value."""

    buckets: tuple[str, ...] = ()
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.LIST_BUCKETS

    def encode(self) -> bytes:
        value = " ".join(self.buckets).encode() if self.status == Status.SUCCESS else b""
        return response(self.opcode, self.status, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ListBucketsResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls((), frame.opaque, frame.status)
        return cls(tuple(frame.value.decode("utf-8", "replace").split(" ")) if frame.value else (),
                   frame.opaque, frame.status)


rules.register(Opcode.LIST_BUCKETS, Shape(_BP + "#0x87-list-buckets"),
               Shape(_BP + "#0x87-list-buckets", value=MAY))
