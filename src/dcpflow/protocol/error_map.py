"""The error map a server returns to GET_ERROR_MAP, built from status.py rather than loaded from a file.

Format and attribute meanings:
https://github.com/couchbase/kv_engine/blob/master/docs/ErrorMap.md. A client that negotiated XERROR
fetches the map at bootstrap (the official SDKs abort the bootstrap if the command fails) and uses
each code's attributes to decide what to do with a status it does not know: retry now or later,
refresh the cluster map, reconnect, or hand the error to the user.

Names and descriptions come from Status / STATUS_DESCRIPTIONS; the table below adds each code's
attributes, and the wire name where the server's map spells it differently from our enum. Version 2
differs from version 1 only by allowing the newer attributes (`rate-limit`, `system-constraint`).
"""

import json
from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

from .errors import ProtocolError
from .status import STATUS_DESCRIPTIONS, Status

#: Newest error-map format this module builds.
MAX_VERSION = 2
#: Revision of the map's contents; clients keep the highest revision they have seen (ErrorMap.md).
REVISION = 9


class Attr(StrEnum):
    """Error attributes (ErrorMap.md, "Error Attributes")."""

    ITEM_DELETED = "item-deleted"
    ITEM_LOCKED = "item-locked"
    ITEM_ONLY = "item-only"
    INVALID_INPUT = "invalid-input"
    FETCH_CONFIG = "fetch-config"
    CONN_STATE_INVALIDATED = "conn-state-invalidated"
    AUTH = "auth"
    SPECIAL_HANDLING = "special-handling"
    SUPPORT = "support"
    TEMP = "temp"
    INTERNAL = "internal"
    RETRY_NOW = "retry-now"
    RETRY_LATER = "retry-later"
    NO_RETRY = "no-retry"
    SUBDOC = "subdoc"
    DCP = "dcp"
    RATE_LIMIT = "rate-limit"  # version 2
    SYSTEM_CONSTRAINT = "system-constraint"  # version 2
    SUCCESS = "success"


#: Attributes that a version-1 map cannot carry (ErrorMap.md marks them "version 2").
V2_ONLY = frozenset({Attr.RATE_LIMIT, Attr.SYSTEM_CONSTRAINT})

_A = Attr
_ITEM_LIMIT = (_A.ITEM_ONLY, _A.SYSTEM_CONSTRAINT, _A.NO_RETRY)  # a hard limit the item ran into
_THROTTLED = (_A.TEMP, _A.RETRY_LATER, _A.RATE_LIMIT)
_SUBDOC_INPUT = (_A.SUBDOC, _A.INVALID_INPUT)
_SUBDOC_ITEM = (_A.SUBDOC, _A.ITEM_ONLY)

#: Status -> attributes, in the order the server lists them.
ATTRIBUTES: dict[int, tuple[Attr, ...]] = {
    Status.SUCCESS: (_A.SUCCESS,),
    Status.KEY_ENOENT: (_A.ITEM_ONLY,),
    Status.KEY_EEXISTS: (_A.ITEM_ONLY,),
    Status.E2BIG: (_A.ITEM_ONLY, _A.INVALID_INPUT),
    Status.EINVAL: (_A.INTERNAL, _A.INVALID_INPUT),
    Status.NOT_STORED: (_A.INTERNAL, _A.ITEM_ONLY),
    Status.DELTA_BADVAL: (_A.ITEM_ONLY, _A.INVALID_INPUT),
    Status.NOT_MY_VBUCKET: (_A.FETCH_CONFIG, _A.INVALID_INPUT),
    Status.NO_BUCKET: (_A.CONN_STATE_INVALIDATED,),
    Status.LOCKED: (_A.ITEM_LOCKED, _A.ITEM_ONLY, _A.RETRY_NOW),
    Status.DCP_STREAM_NOT_FOUND: (_A.CONN_STATE_INVALIDATED,),
    Status.OPAQUE_NO_MATCH: (_A.CONN_STATE_INVALIDATED,),
    Status.EWOULD_THROTTLE: _THROTTLED,
    Status.ECONFIG_ONLY: (_A.FETCH_CONFIG, _A.RETRY_NOW),
    Status.NOT_LOCKED: (_A.ITEM_ONLY,),
    Status.CAS_VALUE_INVALID: (_A.ITEM_ONLY,),
    Status.AUTH_STALE: (_A.CONN_STATE_INVALIDATED, _A.AUTH),
    Status.AUTH_ERROR: (_A.CONN_STATE_INVALIDATED, _A.AUTH),
    Status.AUTH_CONTINUE: (_A.SPECIAL_HANDLING,),
    Status.ERANGE: (_A.INVALID_INPUT,),
    Status.ROLLBACK: (_A.DCP, _A.SPECIAL_HANDLING),
    Status.EACCESS: (_A.SUPPORT,),
    Status.NOT_INITIALIZED: (_A.CONN_STATE_INVALIDATED,),
    Status.ENCRYPTION_KEY_NOT_AVAILABLE: (_A.SPECIAL_HANDLING,),
    Status.CHECKSUM_MISMATCH: (_A.SPECIAL_HANDLING,),
    Status.EXPIRY_OVERFLOW: _ITEM_LIMIT,
    Status.LOCK_EXPIRY_OVERFLOW: _ITEM_LIMIT,
    Status.RATE_LIMITED_NETWORK_INGRESS: _THROTTLED,
    Status.RATE_LIMITED_NETWORK_EGRESS: _THROTTLED,
    Status.RATE_LIMITED_MAX_CONNECTIONS: (_A.CONN_STATE_INVALIDATED, _A.RATE_LIMIT),
    Status.RATE_LIMITED_MAX_COMMANDS: _THROTTLED,
    Status.BUCKET_SIZE_LIMIT_EXCEEDED: _ITEM_LIMIT,
    Status.BUCKET_RESIDENT_RATIO_TOO_LOW: _ITEM_LIMIT,
    Status.BUCKET_DATA_SIZE_TOO_BIG: _ITEM_LIMIT,
    Status.BUCKET_DISK_SPACE_TOO_LOW: _ITEM_LIMIT,
    Status.BUCKET_PAUSED: (_A.SUPPORT,),
    Status.CANCELLED: (_A.ITEM_ONLY, _A.RETRY_NOW),
    Status.UNKNOWN_FRAME_INFO: (_A.SUPPORT,),
    Status.UNKNOWN_COMMAND: (_A.SUPPORT,),
    Status.ENOMEM: (_A.TEMP, _A.RETRY_LATER),
    Status.NOT_SUPPORTED: (_A.SUPPORT,),
    Status.EINTERNAL: (_A.INTERNAL, _A.CONN_STATE_INVALIDATED),
    Status.EBUSY: (_A.TEMP, _A.RETRY_NOW),
    Status.ETMPFAIL: (_A.TEMP, _A.RETRY_NOW),
    Status.XATTR_EINVAL: (_A.INVALID_INPUT,),
    Status.UNKNOWN_COLLECTION: (_A.INVALID_INPUT,),
    Status.CANNOT_APPLY_COLLECTIONS_MANIFEST: (_A.INVALID_INPUT,),
    Status.UNKNOWN_SCOPE: (_A.INVALID_INPUT,),
    Status.DCP_STREAM_ID_INVALID: (_A.INVALID_INPUT,),
    Status.DURABILITY_INVALID_LEVEL: (_A.INVALID_INPUT,),
    Status.DURABILITY_IMPOSSIBLE: (_A.ITEM_ONLY, _A.INVALID_INPUT),
    Status.SYNC_WRITE_IN_PROGRESS: (_A.ITEM_ONLY, _A.RETRY_LATER),
    Status.SYNC_WRITE_AMBIGUOUS: (_A.ITEM_ONLY,),
    Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS: (_A.ITEM_ONLY, _A.RETRY_LATER),
    Status.RANGE_SCAN_CANCELLED: (_A.SUCCESS,),
    Status.RANGE_SCAN_MORE: (_A.SUCCESS,),
    Status.RANGE_SCAN_COMPLETE: (_A.SUCCESS,),
    Status.VB_UUID_NOT_EQUAL: (_A.INVALID_INPUT,),
    Status.SUBDOC_PATH_ENOENT: _SUBDOC_ITEM,
    Status.SUBDOC_PATH_MISMATCH: _SUBDOC_ITEM,
    Status.SUBDOC_PATH_EINVAL: _SUBDOC_INPUT,
    Status.SUBDOC_PATH_E2BIG: _SUBDOC_INPUT,
    Status.SUBDOC_DOC_E2DEEP: _SUBDOC_INPUT,
    Status.SUBDOC_VALUE_CANTINSERT: _SUBDOC_INPUT,
    Status.SUBDOC_DOC_NOT_JSON: _SUBDOC_ITEM,
    Status.SUBDOC_NUM_ERANGE: _SUBDOC_ITEM,
    Status.SUBDOC_DELTA_EINVAL: _SUBDOC_ITEM,
    Status.SUBDOC_PATH_EEXISTS: _SUBDOC_ITEM,
    Status.SUBDOC_VALUE_ETOODEEP: (_A.SUBDOC, _A.INVALID_INPUT, _A.ITEM_ONLY),
    Status.SUBDOC_INVALID_COMBO: _SUBDOC_INPUT,
    Status.SUBDOC_MULTI_PATH_FAILURE: (_A.SUBDOC, _A.SPECIAL_HANDLING),
    Status.SUBDOC_SUCCESS_DELETED: (_A.ITEM_DELETED, _A.SUCCESS, _A.SUBDOC),
    Status.SUBDOC_XATTR_INVALID_FLAG_COMBO: _SUBDOC_INPUT,
    Status.SUBDOC_XATTR_INVALID_KEY_COMBO: _SUBDOC_INPUT,
    Status.SUBDOC_XATTR_UNKNOWN_MACRO: _SUBDOC_INPUT,
    Status.SUBDOC_XATTR_UNKNOWN_VATTR: _SUBDOC_INPUT,
    Status.SUBDOC_XATTR_CANT_MODIFY_VATTR: _SUBDOC_INPUT,
    Status.SUBDOC_MULTI_PATH_FAILURE_DELETED: (_A.ITEM_DELETED, _A.SUBDOC, _A.SPECIAL_HANDLING),
    Status.SUBDOC_INVALID_XATTR_ORDER: _SUBDOC_INPUT,
    Status.SUBDOC_XATTR_UNKNOWN_VATTR_MACRO: _SUBDOC_INPUT,
    Status.SUBDOC_CAN_ONLY_REVIVE_DELETED_DOCUMENTS: _SUBDOC_ITEM,
    Status.SUBDOC_DELETED_DOCUMENT_CANT_HAVE_VALUE: _SUBDOC_ITEM,
    Status.SUBDOC_FIELD_NOT_BINARY_VALUE: _SUBDOC_ITEM,
}

#: Codes whose name in the server's map is not our enum name (clients may log or match these names).
WIRE_NAMES: dict[int, str] = {
    Status.DCP_STREAM_NOT_FOUND: "STREAM_NOT_FOUND",
    Status.DCP_STREAM_ID_INVALID: "DCP stream-ID invalid",
    Status.DURABILITY_INVALID_LEVEL: "DurabilityInvalidLevel",
    Status.DURABILITY_IMPOSSIBLE: "DurabilityImpossible",
    Status.SYNC_WRITE_IN_PROGRESS: "SyncWriteInProgress",
    Status.SYNC_WRITE_AMBIGUOUS: "SyncWriteAmbiguous",
    Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS: "SyncWriteReCommitInProgress",
    Status.RANGE_SCAN_CANCELLED: "RangeScanCancelled",
    Status.RANGE_SCAN_MORE: "RangeScanMore",
    Status.RANGE_SCAN_COMPLETE: "RangeScanComplete",
    Status.VB_UUID_NOT_EQUAL: "VbUuidNotEqual",
    Status.SUBDOC_DOC_E2DEEP: "SUBDOC_PATH_E2DEEP",
    Status.SUBDOC_DOC_NOT_JSON: "SUBDOC_DOC_NOTJSON",
}


def error_name(code: int) -> str:
    """The name the error map gives a status code."""
    if code in WIRE_NAMES:
        return WIRE_NAMES[code]
    try:
        return Status(code).name
    except ValueError:
        return f"0x{code:04x}"


def attributes(code: int, version: int = MAX_VERSION) -> tuple[str, ...]:
    """A code's attributes as a `version` map carries them (unknown codes: none)."""
    attrs = ATTRIBUTES.get(code, ())
    if version < 2:
        attrs = tuple(a for a in attrs if a not in V2_ONLY)
    return tuple(str(a) for a in attrs)


def build_error_map(version: int = MAX_VERSION) -> dict:
    """The map for a client that understands up to `version` (answered with min(version, 2))."""
    if version < 1:
        raise ProtocolError(f"error map version {version} does not exist; the lowest is 1 (ErrorMap.md)")
    version = min(version, MAX_VERSION)
    errors = {}
    for status in Status:
        errors[format(int(status), "x")] = {
            "name": error_name(status),
            "desc": STATUS_DESCRIPTIONS.get(int(status), status.name),
            "attrs": list(attributes(status, version)),
        }
    return {"version": version, "revision": REVISION, "errors": errors}


@lru_cache(maxsize=4)
def encode_error_map(version: int = MAX_VERSION) -> bytes:
    """The GET_ERROR_MAP response value: compact JSON, built once per version."""
    return json.dumps(build_error_map(version), separators=(",", ":")).encode()


class ErrorInfo(NamedTuple):
    """One code of a map a client received."""

    code: int
    name: str
    description: str
    attributes: frozenset[str]

    def has(self, attr: str) -> bool:
        return str(attr) in self.attributes


class ErrorMap(NamedTuple):
    """A parsed error map (client side). Unknown attributes are kept: clients must ignore, not reject."""

    version: int
    revision: int
    errors: dict[int, ErrorInfo]

    def get(self, code: int) -> ErrorInfo | None:
        return self.errors.get(code)

    def is_newer_than(self, other: "ErrorMap | None") -> bool:
        """Revision decides, not version (ErrorMap.md, protocol step 4)."""
        return other is None or self.revision > other.revision


def parse_error_map(data) -> ErrorMap:
    """Parse a GET_ERROR_MAP value (bytes, str or dict); raises ProtocolError if it is not a map."""
    try:
        doc = json.loads(data) if isinstance(data, bytes | str) else data
        errors = {}
        for key, entry in doc["errors"].items():
            code = int(key, 16)
            errors[code] = ErrorInfo(code, str(entry["name"]), str(entry.get("desc", "")),
                                     frozenset(str(a) for a in entry.get("attrs", ())))
        return ErrorMap(int(doc["version"]), int(doc["revision"]), errors)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ProtocolError(f"error map is malformed: {type(e).__name__}: {e} (ErrorMap.md)") from None
