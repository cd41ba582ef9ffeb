"""Typed session and KV commands: what a client sends before and beside DCP, and what a server answers.

Pages (under https://github.com/couchbase/kv_engine/blob/master/): docs/BinaryProtocol.md
(one section per opcode), docs/sasl.md, docs/ErrorMap.md, docs/Collections.md,
docs/dcp/documentation/commands/get_seqno.md and persist_seqno.md. The pattern is dcp.py's: every command is an
immutable NamedTuple with `encode()` and `from_frame()` (which runs the page's rules first, see
rules.py), and REQUEST_TYPES / RESPONSE_TYPES map opcodes to types.

Command families that share one layout (GET/GETQ/GETK/GETKQ, SET/ADD/REPLACE and their quiet
twins, ...) are one type whose `opcode` is a field: a GetQ is a Get that stays silent on a miss, and
keeping the opcode a field means a GetQ never compares equal to a Get. `OPCODES` lists the family.

Response types describe a success (and, for SASL, AUTH_CONTINUE). Any other status decodes as a
`RawResponse`, whose value is free text, a JSON error context, or - for NOT_MY_VBUCKET - a cluster
map (`decode_kv` chooses). Response types with a non-success status encode an empty body.
"""

import json
import struct
from enum import IntEnum
from typing import NamedTuple

from . import rules
from .datatype import KNOWN_DATATYPE_BITS, Datatype
from .errors import ProtocolError
from .frame import HEADER, Frame, Magic, request, response
from .hello import RETIRED, Feature, decode_features, encode_features
from .opcodes import Opcode
from .rules import MAY, MUST, MUST_NOT, Shape
from .status import Status

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
#: SET/ADD/REPLACE extras: flags u32, expiry u32 (Store; the server's SET path unpacks them itself).
STORE_EXTRAS = struct.Struct(">II")
_MUTATION_EXTRAS = struct.Struct(">QQ")
_ARITH_EXTRAS = struct.Struct(">QQI")
_CONFIG_VERSION = struct.Struct(">qq")
_STATE_COLLECTION = struct.Struct(">II")
_VB_SEQNO = struct.Struct(">HQ")
_OBSERVE_SEQNO = struct.Struct(">BHQQQ")
_OBSERVE_SEQNO_FAILOVER = struct.Struct(">BHQQQQQ")

_BP = "docs/BinaryProtocol.md"
_SASL = "docs/sasl.md"
_CMDS = "docs/dcp/documentation/commands/"

#: Valid GET_ALL_VB_SEQNOS state filters: 0 alive (active + replica + pending), 1 active, 2 replica, 3 pending, 4 dead.
VB_STATE_FILTERS = range(0, 5)
#: Valid vbucket states: 1 active, 2 replica, 3 pending, 4 dead.
VB_STATES = range(1, 5)


class VbucketStateFilter(IntEnum):
    """GET_ALL_VB_SEQNOS state filter (get_seqno.md): ALIVE = active + replica + pending."""

    ALIVE = 0
    ACTIVE = 1
    REPLICA = 2
    PENDING = 3
    DEAD = 4


_DUPLEX = (Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE)


def _check_opcode(frame: Frame, opcodes, cls: type, response_expected: bool) -> None:
    """A decoder handed the wrong frame is a caller bug, but it must still fail as a ProtocolError.

    Duplex frames (magic 0x82/0x83) are refused too: their opcodes are another space
    and rules.problems() does not validate them, so unpacking their extras could fail in struct."""
    if frame.magic in _DUPLEX:
        raise ProtocolError(f"magic 0x{frame.magic:02x} is a duplex server command, not a {cls.__name__}",
                            opcode=frame.opcode, opaque=frame.opaque, magic=frame.magic)
    if frame.opcode not in opcodes or frame.is_response != response_expected:
        kind = "response" if frame.is_response else "request"
        raise ProtocolError(f"{cls.__name__} cannot decode a {rules.opcode_name(frame.opcode)} {kind}",
                            opcode=frame.opcode, opaque=frame.opaque, magic=frame.magic)


def _mutation_extras(vbucket_uuid: int | None, seqno: int | None) -> bytes:
    if vbucket_uuid is None:
        return b""
    return _MUTATION_EXTRAS.pack(vbucket_uuid, seqno or 0)


def _mutation_token(extras: bytes) -> tuple[int | None, int | None]:
    if len(extras) == 16:
        return _MUTATION_EXTRAS.unpack(extras)
    return None, None


def _json_value_problems(frame: Frame, what: str, page: str, object_only: bool = False):
    """A value that a page says must be JSON: flagged with datatype JSON and parseable."""
    if not frame.value:
        return
    if not frame.datatype & Datatype.JSON:
        yield ProtocolError(f"{what} value must be JSON and flagged with datatype JSON ({page})")
        return
    try:
        doc = json.loads(frame.value)
    except (ValueError, RecursionError):
        yield ProtocolError(f"{what} value is not valid JSON ({page})")
        return
    if object_only and not isinstance(doc, dict):
        yield ProtocolError(f"{what} value must be a JSON object ({page})")


def _datatype_problems(frame: Frame, what: str):
    if frame.datatype & ~KNOWN_DATATYPE_BITS:
        yield ProtocolError(f"{what} datatype 0x{frame.datatype:02x} has unknown bits "
                            f"(only JSON 0x01, Snappy 0x02 and XATTR 0x04 exist)")


# ---------------------------------------------------------------------------------------------
# Generic error responses


class RawResponse(NamedTuple):
    """A response decoded no further: every error, and successes whose body has no typed meaning.

    An error's value is free text ("Not found"), a JSON error context `{"error": {"context": ...,
    "ref": ...}}` (clients that negotiated XERROR), or, for NOT_MY_VBUCKET, the cluster map the client
    should switch to (ErrorMap.md)."""

    opcode: int
    status: int
    value: bytes = b""
    opaque: int = 0
    datatype: int = 0
    cas: int = 0

    def encode(self) -> bytes:
        return response(self.opcode, self.status, value=self.value, opaque=self.opaque,
                        datatype=self.datatype, cas=self.cas)

    @classmethod
    def from_frame(cls, frame: Frame) -> "RawResponse":
        if not frame.is_response or frame.magic in _DUPLEX:
            raise ProtocolError("RawResponse decodes responses to client requests only", opcode=frame.opcode,
                                opaque=frame.opaque, magic=frame.magic)
        rules.check(frame)
        return cls(frame.opcode, frame.status, frame.value, frame.opaque, frame.datatype, frame.cas)

    def _json(self):
        if not self.value or not self.value.lstrip().startswith(b"{"):
            return None
        try:
            return json.loads(self.value)
        except (ValueError, RecursionError):
            return None

    @property
    def context(self) -> str | None:
        """The human reason: the JSON error context if there is one, else the text of the value."""
        doc = self._json()
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            ctx = doc["error"].get("context")
            return None if ctx is None else str(ctx)
        if doc is None and self.value:
            return self.value.decode("utf-8", "replace")
        return None

    @property
    def cluster_map(self) -> dict | None:
        """The cluster map a NOT_MY_VBUCKET response carries, or None (no map, or deduplicated)."""
        if self.status != Status.NOT_MY_VBUCKET:
            return None
        doc = self._json()
        return doc if isinstance(doc, dict) and "error" not in doc else None


def error_response(opcode: int, status: int, opaque: int = 0, context: str | None = None,
                   ref: str | None = None) -> bytes:
    """An error reply with a JSON context (what a server sends a client that negotiated XERROR)."""
    if context is None and ref is None:
        return response(opcode, status, opaque=opaque)
    err: dict[str, str] = {}
    if context is not None:
        err["context"] = context
    if ref is not None:
        err["ref"] = ref
    return response(opcode, status, opaque=opaque, datatype=Datatype.JSON,
                    value=json.dumps({"error": err}, separators=(",", ":")).encode())


def error_context(frame: Frame) -> str:
    """The reason in an error reply: the XERROR JSON `error.context`, else the value as text."""
    if not frame.value:
        return ""
    try:
        doc = json.loads(frame.value)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            return str(doc["error"].get("context", ""))
    except ValueError:
        pass
    return bytes(frame.value[:200]).decode("utf-8", "replace")


def not_my_vbucket(opcode: int, opaque: int = 0, config: bytes = b"") -> bytes:
    """NOT_MY_VBUCKET with the cluster map in the value (empty when the client already has it, as with
    HELLO DedupeNotMyVbucketClustermap)."""
    return response(opcode, Status.NOT_MY_VBUCKET, opaque=opaque, value=config,
                    datatype=Datatype.JSON if config else 0)


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


class GetClusterConfig(NamedTuple):
    """GET_CLUSTER_CONFIG 0xb5 (BinaryProtocol.md#0xb5-get-cluster-config): optional 16-byte extras
    with the (epoch, revision) the client already has (signed i64s); the server then sends the map only
    if it has a newer one. CAS must be 0."""

    epoch: int | None = None
    revision: int | None = None
    opaque: int = 0

    opcode = Opcode.GET_CLUSTER_CONFIG

    def encode(self) -> bytes:
        if (self.epoch is None) != (self.revision is None):
            raise ValueError("GET_CLUSTER_CONFIG takes both epoch and revision, or neither")
        extras = b"" if self.epoch is None else _CONFIG_VERSION.pack(self.epoch, self.revision)
        return request(self.opcode, extras=extras, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetClusterConfig":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        if frame.extras:
            epoch, revision = _CONFIG_VERSION.unpack(frame.extras)
            return cls(epoch, revision, frame.opaque)
        return cls(None, None, frame.opaque)

    @property
    def known_version(self) -> tuple[int, int] | None:
        return None if self.epoch is None else (self.epoch, self.revision)


class SetClusterConfig(NamedTuple):
    """SET_CLUSTER_CONFIG 0xb4 (KV-Engine: "Push cluster map to memcached"): what a cluster
    manager sends every node. Key = bucket name, value = the map JSON, extras = the map's (epoch,
    revision) as two signed i64s, as GET_CLUSTER_CONFIG carries them."""

    bucket: bytes
    config: bytes
    epoch: int
    revision: int
    opaque: int = 0

    opcode = Opcode.SET_CLUSTER_CONFIG

    def encode(self) -> bytes:
        return request(self.opcode, key=self.bucket, extras=_CONFIG_VERSION.pack(self.epoch, self.revision),
                       value=self.config, datatype=Datatype.JSON, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SetClusterConfig":
        _check_opcode(frame, (cls.opcode,), cls, False)
        if len(frame.extras) != _CONFIG_VERSION.size:
            raise ProtocolError(f"SET_CLUSTER_CONFIG needs {_CONFIG_VERSION.size} bytes of extras (epoch, "
                                f"revision), not {len(frame.extras)}", opcode=frame.opcode, opaque=frame.opaque)
        epoch, revision = _CONFIG_VERSION.unpack(frame.extras)
        return cls(frame.key, frame.value, epoch, revision, frame.opaque)


class ClusterConfigResponse(NamedTuple):
    """The cluster map JSON (see config.py); empty when the client's known version is current."""

    config: bytes = b""
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.GET_CLUSTER_CONFIG

    def encode(self) -> bytes:
        ok = self.status == Status.SUCCESS and self.config
        return response(self.opcode, self.status, value=self.config if ok else b"", opaque=self.opaque,
                        datatype=Datatype.JSON if ok else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ClusterConfigResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        return cls(frame.value if frame.status == Status.SUCCESS else b"", frame.opaque, frame.status)

    @property
    def json(self) -> dict | None:
        return json.loads(self.config) if self.config else None


rules.register(Opcode.GET_CLUSTER_CONFIG,
               Shape(_BP + "#0xb5-get-cluster-config", extras=(0, 16), cas=MUST_NOT),
               Shape(_BP + "#0xb5-get-cluster-config", value=MAY))


@rules.response_check(Opcode.GET_CLUSTER_CONFIG)
def _cluster_config_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS:
        yield from _json_value_problems(frame, "GET_CLUSTER_CONFIG", _BP + "#0xb5-get-cluster-config",
                                        object_only=True)


class GetErrorMap(NamedTuple):
    """GET_ERROR_MAP 0xfe (BinaryProtocol.md#0xfe-get-error-map, ErrorMap.md): value = u16 highest
    error-map version the client understands (the official SDK asks for 2)."""

    version: int = 2
    opaque: int = 0

    opcode = Opcode.GET_ERROR_MAP

    def encode(self) -> bytes:
        return request(self.opcode, value=_U16.pack(self.version), opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "GetErrorMap":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(_U16.unpack(frame.value)[0], frame.opaque)


class ErrorMapResponse(NamedTuple):
    """The error map JSON (see error_map.py), of the version asked for or lower."""

    error_map: bytes = b""
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.GET_ERROR_MAP

    def encode(self) -> bytes:
        ok = self.status == Status.SUCCESS
        return response(self.opcode, self.status, value=self.error_map if ok else b"", opaque=self.opaque,
                        datatype=Datatype.JSON if ok and self.error_map else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "ErrorMapResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        return cls(frame.value if frame.status == Status.SUCCESS else b"", frame.opaque, frame.status)

    @property
    def json(self) -> dict:
        return json.loads(self.error_map)


rules.register(Opcode.GET_ERROR_MAP, Shape(_BP + "#0xfe-get-error-map", value=MUST),
               Shape(_BP + "#0xfe-get-error-map", value=MUST))


@rules.request_check(Opcode.GET_ERROR_MAP)
def _error_map_rules(frame: Frame):
    if frame.value and len(frame.value) != 2:
        yield ProtocolError(f"GET_ERROR_MAP value must be a u16 version; got {len(frame.value)} bytes "
                            f"({_BP}#0xfe-get-error-map)")
    elif frame.value == b"\x00\x00":
        yield ProtocolError("GET_ERROR_MAP version 0 does not exist; the lowest is 1 (ErrorMap.md)")


class Version(NamedTuple):
    """VERSION 0x0b (BinaryProtocol.md#0x0b-version): no body."""

    opaque: int = 0

    opcode = Opcode.VERSION

    def encode(self) -> bytes:
        return request(self.opcode, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Version":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.opaque)


class VersionResponse(NamedTuple):
    """The version string in the value. Clients turn features on by it, so a server should answer an
    `X.Y.Z-...` string such as `7.6.0-0000`."""

    version: str = ""
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.VERSION

    def encode(self) -> bytes:
        value = self.version.encode() if self.status == Status.SUCCESS else b""
        return response(self.opcode, self.status, value=value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "VersionResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        text = frame.value.decode("utf-8", "replace") if frame.status == Status.SUCCESS else ""
        return cls(text, frame.opaque, frame.status)


rules.register(Opcode.VERSION, Shape(_BP + "#0x0b-version"), Shape(_BP + "#0x0b-version", value=MUST))


class Noop(NamedTuple):
    """NOOP 0x0a (BinaryProtocol.md#0x0a-no-op): a client's keep-alive (not DCP_NOOP 0x5c). The reply
    is an empty success; it also marks the end of a pipeline of quiet commands."""

    opaque: int = 0

    opcode = Opcode.NOOP

    def encode(self) -> bytes:
        return request(self.opcode, opaque=self.opaque)

    def response(self, status: int = Status.SUCCESS) -> bytes:
        return response(self.opcode, status, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Noop":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.opaque)


rules.register(Opcode.NOOP, Shape(_BP + "#0x0a-no-op"), Shape(_BP + "#0x0a-no-op"))


class Quit(NamedTuple):
    """QUIT 0x07 / QUITQ 0x17 (BinaryProtocol.md#0x07-quit): close the connection; QUITQ gets no reply."""

    opaque: int = 0
    opcode: int = Opcode.QUIT

    OPCODES = (Opcode.QUIT, Opcode.QUIT_Q)

    def encode(self) -> bytes:
        return request(self.opcode, opaque=self.opaque)

    def response(self, status: int = Status.SUCCESS) -> bytes:
        return response(self.opcode, status, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Quit":
        _check_opcode(frame, cls.OPCODES, cls, False)
        rules.check(frame)
        return cls(frame.opaque, Opcode(frame.opcode))


for _op in Quit.OPCODES:
    rules.register(_op, Shape(_BP + "#0x07-quit"), Shape(_BP + "#0x07-quit"))


# ---------------------------------------------------------------------------------------------
# Statistics


class Stat(NamedTuple):
    """STAT 0x10 (BinaryProtocol.md#0x10-stat): key = group (`dcp`, `vbucket-seqno`, `failovers`, ...;
    empty = default set); optional JSON value with arguments (datatype JSON)."""

    group: bytes = b""
    value: bytes = b""
    opaque: int = 0

    opcode = Opcode.STAT

    def encode(self) -> bytes:
        return request(self.opcode, key=self.group, value=self.value, opaque=self.opaque,
                       datatype=Datatype.JSON if self.value else 0)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Stat":
        _check_opcode(frame, (cls.opcode,), cls, False)
        rules.check(frame)
        return cls(frame.key, frame.value, frame.opaque)


class StatResponse(NamedTuple):
    """One statistic: name in the key, ASCII value in the value. A frame with neither ends the
    sequence (`is_terminator`)."""

    key: bytes = b""
    value: bytes = b""
    opaque: int = 0
    status: int = Status.SUCCESS

    opcode = Opcode.STAT

    def encode(self) -> bytes:
        if self.status != Status.SUCCESS:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, key=self.key, value=self.value, opaque=self.opaque)

    @classmethod
    def from_frame(cls, frame: Frame) -> "StatResponse":
        _check_opcode(frame, (cls.opcode,), cls, True)
        rules.check(frame)
        if frame.status != Status.SUCCESS:
            return cls(b"", b"", frame.opaque, frame.status)
        return cls(frame.key, frame.value, frame.opaque, frame.status)

    @property
    def is_terminator(self) -> bool:
        return self.status != Status.SUCCESS or not self.key


def _b(x) -> bytes:
    return x if isinstance(x, bytes | bytearray | memoryview) else str(x).encode()


def encode_stats(stats, opaque: int = 0) -> bytes:
    """The whole reply to one STAT request: a frame per (name, value) pair, then the empty terminator.

    `stats` is a mapping or an iterable of pairs; names and values may be str, bytes or numbers."""
    pairs = stats.items() if hasattr(stats, "items") else stats
    frames = [response(Opcode.STAT, key=_b(k), value=_b(v), opaque=opaque) for k, v in pairs]
    frames.append(response(Opcode.STAT, opaque=opaque))
    return b"".join(frames)


class StatsCollector:
    """Client side of STAT: feed it the STAT response frames of one request until `feed` returns True.

    `stats` keeps the order the server sent; an error status ends the sequence at once (an unknown
    group answers KEY_ENOENT, for example) and is kept in `status`.
    """

    __slots__ = ("opaque", "stats", "status", "done")

    def __init__(self, opaque: int | None = None):
        self.opaque = opaque
        self.stats: dict[str, str] = {}
        self.status = Status.SUCCESS
        self.done = False

    def feed(self, frame: Frame) -> bool:
        if self.done:
            raise ProtocolError("STAT reply already ended with its empty terminator frame",
                                opcode=frame.opcode, opaque=frame.opaque)
        if self.opaque is not None and frame.opaque != self.opaque:
            raise ProtocolError(f"STAT reply opaque 0x{frame.opaque:08x} does not match the request's "
                                f"0x{self.opaque:08x}", opcode=frame.opcode, opaque=frame.opaque)
        stat = StatResponse.from_frame(frame)
        if stat.is_terminator:
            self.status = Status(stat.status) if stat.status in Status._value2member_map_ else stat.status
            self.done = True
        else:
            self.stats[stat.key.decode("utf-8", "replace")] = stat.value.decode("utf-8", "replace")
        return self.done


rules.register(Opcode.STAT, Shape(_BP + "#0x10-stat", key=MAY, value=MAY),
               Shape(_BP + "#0x10-stat", key=MAY, value=MAY))


@rules.request_check(Opcode.STAT)
def _stat_rules(frame: Frame):
    yield from _json_value_problems(frame, "STAT", _BP + "#0x10-stat")


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

#: A GetResponse's header and flags extras in one struct (key and value follow): (magic, opcode, key
#: length, 4, datatype, 0, body length, opaque, cas, flags). For a server's GET path, which packs
#: the reply without building a GetResponse; the bytes are GetResponse.encode()'s.
GET_RESPONSE_HEAD = struct.Struct(HEADER.format + "I")


@rules.response_check(Opcode.GET_K, Opcode.GET_KQ)
def _getk_response_rules(frame: Frame):
    if frame.status == Status.SUCCESS and not frame.key:
        yield ProtocolError(f"a {rules.opcode_name(frame.opcode)} response must carry the key "
                            f"(that is what the K forms add; {_GET_PAGE})")


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


#: A MutationResponse with its mutation token in one struct: (magic, opcode, 0, 16, 0, 0, 16, opaque,
#: cas, vbucket uuid, seqno). For a server's write paths, which pack the reply without building a
#: MutationResponse (without the token the reply is the bare HEADER); the bytes are encode()'s.
MUTATION_RESPONSE_WITH_TOKEN = struct.Struct(HEADER.format + "QQ")


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


# ---------------------------------------------------------------------------------------------
# Dispatch

#: Request opcode -> command type.
REQUEST_TYPES: dict[int, type] = {}
for _cls in (Hello, SaslListMechs, SelectBucket, ListBuckets, GetClusterConfig, GetErrorMap, Version, Noop,
             Stat, Touch, SetVbucket, GetVbucket, GetAllVbSeqnos, ObserveSeqno, SeqnoPersistence, GetReplica):
    REQUEST_TYPES[_cls.opcode] = _cls
for _cls in (SaslAuth, Quit, Get, Store, Delete, Arithmetic, Concat, Gat):
    for _op in _cls.OPCODES:
        REQUEST_TYPES[_op] = _cls

#: Response opcode -> type of its success (or, for SASL, AUTH_CONTINUE) reply.
RESPONSE_TYPES: dict[int, type] = {}
for _cls in (HelloResponse, SaslListMechsResponse, ListBucketsResponse, ClusterConfigResponse,
             ErrorMapResponse, VersionResponse, StatResponse, GetVbucketResponse, GetAllVbSeqnosResponse,
             ObserveSeqnoResponse):
    RESPONSE_TYPES[_cls.opcode] = _cls
for _cls in (SaslResponse, MutationResponse, ArithmeticResponse, GetResponse):
    for _op in _cls.OPCODES:
        RESPONSE_TYPES[_op] = _cls
del _op, _cls


def decode_kv(frame: Frame, types: tuple[dict[int, type], dict[int, type]] | None = None):
    """The typed message for a frame of this module (raises ProtocolError if malformed or unknown).

    Responses with an error status, and successes without a typed body (NOOP, SELECT_BUCKET, ...),
    decode as RawResponse, except SASL's AUTH_CONTINUE, which is a step of the exchange. `types` lets
    a caller merge other modules' (REQUEST_TYPES, RESPONSE_TYPES).
    """
    req_types, resp_types = types or (REQUEST_TYPES, RESPONSE_TYPES)
    if frame.is_response:
        cls = resp_types.get(frame.opcode)
        if frame.status == Status.SUCCESS and cls is not None:
            return cls.from_frame(frame)
        if frame.status == Status.AUTH_CONTINUE and frame.opcode in SaslAuth.OPCODES:
            return SaslResponse.from_frame(frame)
        return RawResponse.from_frame(frame)
    cls = req_types.get(frame.opcode)
    if cls is None:
        rules.check(frame)
        raise ProtocolError(f"opcode {rules.opcode_name(frame.opcode)} has no typed decoder here",
                            Status.UNKNOWN_COMMAND, opcode=frame.opcode, opaque=frame.opaque)
    return cls.from_frame(frame)
