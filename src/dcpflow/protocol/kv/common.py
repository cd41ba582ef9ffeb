"""What every KV command module shares: extras structs, the opcode and value checks their rules use,
the untyped reply (RawResponse) and the generic error replies (error context, NOT_MY_VBUCKET).
"""

import json
import struct
from enum import IntEnum
from typing import NamedTuple

from .. import rules
from ..datatype import KNOWN_DATATYPE_BITS, Datatype
from ..errors import ProtocolError
from ..frame import Frame, Magic, response
from ..status import Status
from .replies import MUTATION_TOKEN, MutationToken

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
#: SET/ADD/REPLACE extras: flags u32, expiry u32 (Store; the server's SET path unpacks them itself).
STORE_EXTRAS = struct.Struct(">II")
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
    return MUTATION_TOKEN.pack(vbucket_uuid, seqno or 0)


def _mutation_token(extras: bytes) -> tuple[int | None, int | None]:
    token = MutationToken.from_extras(extras)
    return (None, None) if token is None else token


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
