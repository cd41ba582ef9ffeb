"""What a client asks of the server rather than of a document (BinaryProtocol.md): cluster config,
error map, version, no-op and quit.
"""

import json
from typing import NamedTuple

from .. import rules
from ..datatype import Datatype
from ..errors import ProtocolError
from ..frame import Frame, request, response
from ..opcodes import Opcode
from ..rules import MAY, MUST, MUST_NOT, Shape
from ..status import Status
from .common import _BP, _CONFIG_VERSION, _U16, _check_opcode, _json_value_problems


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
