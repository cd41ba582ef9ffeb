"""Response status codes (header bytes 6-7 of a response).

Values are KV-Engine's: BinaryProtocol.md only references its status header; names and
descriptions match the server's error map (https://github.com/couchbase/kv_engine/blob/master/etc/couchbase/kv/error_maps/error_map_v2.json).
"""

from enum import IntEnum


class Status(IntEnum):
    SUCCESS = 0x0000
    KEY_ENOENT = 0x0001
    KEY_EEXISTS = 0x0002
    E2BIG = 0x0003
    EINVAL = 0x0004
    NOT_STORED = 0x0005
    DELTA_BADVAL = 0x0006
    NOT_MY_VBUCKET = 0x0007
    NO_BUCKET = 0x0008
    LOCKED = 0x0009
    DCP_STREAM_NOT_FOUND = 0x000a
    OPAQUE_NO_MATCH = 0x000b
    EWOULD_THROTTLE = 0x000c
    ECONFIG_ONLY = 0x000d
    NOT_LOCKED = 0x000e
    CAS_VALUE_INVALID = 0x000f
    AUTH_STALE = 0x001f
    AUTH_ERROR = 0x0020
    AUTH_CONTINUE = 0x0021
    ERANGE = 0x0022
    ROLLBACK = 0x0023
    EACCESS = 0x0024
    NOT_INITIALIZED = 0x0025
    ENCRYPTION_KEY_NOT_AVAILABLE = 0x0026
    CHECKSUM_MISMATCH = 0x0027
    EXPIRY_OVERFLOW = 0x0028
    LOCK_EXPIRY_OVERFLOW = 0x0029
    RATE_LIMITED_NETWORK_INGRESS = 0x0030
    RATE_LIMITED_NETWORK_EGRESS = 0x0031
    RATE_LIMITED_MAX_CONNECTIONS = 0x0032
    RATE_LIMITED_MAX_COMMANDS = 0x0033
    BUCKET_SIZE_LIMIT_EXCEEDED = 0x0035
    BUCKET_RESIDENT_RATIO_TOO_LOW = 0x0036
    BUCKET_DATA_SIZE_TOO_BIG = 0x0037
    BUCKET_DISK_SPACE_TOO_LOW = 0x0038
    BUCKET_PAUSED = 0x0050
    CANCELLED = 0x0051
    UNKNOWN_FRAME_INFO = 0x0080
    UNKNOWN_COMMAND = 0x0081
    ENOMEM = 0x0082
    NOT_SUPPORTED = 0x0083
    EINTERNAL = 0x0084
    EBUSY = 0x0085
    ETMPFAIL = 0x0086
    XATTR_EINVAL = 0x0087
    UNKNOWN_COLLECTION = 0x0088
    CANNOT_APPLY_COLLECTIONS_MANIFEST = 0x008a
    UNKNOWN_SCOPE = 0x008c
    DCP_STREAM_ID_INVALID = 0x008d
    DURABILITY_INVALID_LEVEL = 0x00a0
    DURABILITY_IMPOSSIBLE = 0x00a1
    SYNC_WRITE_IN_PROGRESS = 0x00a2
    SYNC_WRITE_AMBIGUOUS = 0x00a3
    SYNC_WRITE_RE_COMMIT_IN_PROGRESS = 0x00a4
    RANGE_SCAN_CANCELLED = 0x00a5
    RANGE_SCAN_MORE = 0x00a6
    RANGE_SCAN_COMPLETE = 0x00a7
    VB_UUID_NOT_EQUAL = 0x00a8
    SUBDOC_PATH_ENOENT = 0x00c0
    SUBDOC_PATH_MISMATCH = 0x00c1
    SUBDOC_PATH_EINVAL = 0x00c2
    SUBDOC_PATH_E2BIG = 0x00c3
    SUBDOC_DOC_E2DEEP = 0x00c4
    SUBDOC_VALUE_CANTINSERT = 0x00c5
    SUBDOC_DOC_NOT_JSON = 0x00c6
    SUBDOC_NUM_ERANGE = 0x00c7
    SUBDOC_DELTA_EINVAL = 0x00c8
    SUBDOC_PATH_EEXISTS = 0x00c9
    SUBDOC_VALUE_ETOODEEP = 0x00ca
    SUBDOC_INVALID_COMBO = 0x00cb
    SUBDOC_MULTI_PATH_FAILURE = 0x00cc
    SUBDOC_SUCCESS_DELETED = 0x00cd
    SUBDOC_XATTR_INVALID_FLAG_COMBO = 0x00ce
    SUBDOC_XATTR_INVALID_KEY_COMBO = 0x00cf
    SUBDOC_XATTR_UNKNOWN_MACRO = 0x00d0
    SUBDOC_XATTR_UNKNOWN_VATTR = 0x00d1
    SUBDOC_XATTR_CANT_MODIFY_VATTR = 0x00d2
    SUBDOC_MULTI_PATH_FAILURE_DELETED = 0x00d3
    SUBDOC_INVALID_XATTR_ORDER = 0x00d4
    SUBDOC_XATTR_UNKNOWN_VATTR_MACRO = 0x00d5
    SUBDOC_CAN_ONLY_REVIVE_DELETED_DOCUMENTS = 0x00d6
    SUBDOC_DELETED_DOCUMENT_CANT_HAVE_VALUE = 0x00d7
    SUBDOC_FIELD_NOT_BINARY_VALUE = 0x00d8


#: What each status means, in words a person can act on.
STATUS_DESCRIPTIONS: dict[int, str] = {
    0x0000: 'Operation succeeded',
    0x0001: 'Key (or, on DCP, stream) not found',
    0x0002: 'Key exists / CAS mismatch / conflict-resolution loss / stream already exists',
    0x0003: 'Value too large',
    0x0004: 'Invalid arguments / malformed packet',
    0x0005: 'Item not stored (catch-all)',
    0x0006: 'Incr/decr on a non-numeric value',
    0x0007: 'This node does not own the vbucket (body may carry a cluster map)',
    0x0008: 'Connection not bound to a bucket',
    0x0009: 'Document is locked',
    0x000a: 'DCP: no stream for this message (sent by a consumer only if the producer enabled `v7_dcp_status_codes`)',
    0x000b: "DCP: message opaque does not match the stream's opaque (same opt-in)",
    0x000c: 'Would have been throttled (non-blocking throttling mode)',
    0x000d: 'Command not allowed in a config-only bucket',
    0x000e: 'Unlock of a document that is not locked',
    0x000f: 'The supplied CAS value is invalid',
    0x001f: 'Authentication context is stale; re-authenticate',
    0x0020: 'Authentication failed',
    0x0021: 'SASL: continue with next step',
    0x0022: 'Value out of range (DCP: bad start/end/snapshot seqnos)',
    0x0023: 'DCP stream-request: consumer must roll back; body = u64 rollback seqno',
    0x0024: 'No access (missing privilege)',
    0x0025: 'Node not yet initialised by the cluster manager',
    0x0026: 'Needed encryption key not available',
    0x0027: 'Data checksum mismatch',
    0x0028: 'Requested expiry does not fit the 32-bit wire time',
    0x0029: 'Requested lock timeout overflows 32-bit lock expiry',
    0x0030: 'Tenant exceeded ingress limit',
    0x0031: 'Tenant exceeded egress limit',
    0x0032: 'Tenant exceeded connection limit',
    0x0033: 'Tenant exceeded command limit',
    0x0035: 'Too much data in bucket',
    0x0036: 'Writes rejected: resident ratio too low',
    0x0037: 'Writes rejected: data size too big',
    0x0038: 'Writes rejected: disk space too low',
    0x0050: 'Bucket is paused',
    0x0051: 'Operation cancelled before completion, no effect',
    0x0080: 'Unknown framing-extras id',
    0x0081: 'Unknown opcode',
    0x0082: 'Out of memory',
    0x0083: 'Command / option not supported',
    0x0084: 'Internal error',
    0x0085: 'Server busy, back off',
    0x0086: 'Temporary failure (warmup, temp OOM, ...); retry',
    0x0087: 'Bad XATTR syntax',
    0x0088: 'Unknown collection',
    0x008a: 'Manifest could not be applied',
    0x008c: 'Unknown scope',
    0x008d: 'Stream-id missing when required, or present when not enabled, or 0',
    0x00a0: 'Invalid durability level',
    0x00a1: 'Durability cannot currently be met (e.g. not enough replicas)',
    0x00a2: 'A SyncWrite is already pending on this key',
    0x00a3: 'SyncWrite outcome unknown (timeout)',
    0x00a4: 'SyncWrite being re-committed after active change',
    0x00a5: 'Range scan cancelled',
    0x00a6: 'Range scan has more data',
    0x00a7: 'Range scan complete',
    0x00a8: 'Range scan create: vbucket UUID mismatch',
    0x00c0: 'Subdoc: path not found',
    0x00c1: 'Subdoc: path type mismatch',
    0x00c2: 'Subdoc: invalid path syntax',
    0x00c3: 'Subdoc: path too long',
    0x00c4: 'Subdoc: document too deep',
    0x00c5: 'Subdoc: value would make invalid JSON',
    0x00c6: 'Subdoc: document is not JSON',
    0x00c7: 'Subdoc: number out of range',
    0x00c8: 'Subdoc: invalid delta',
    0x00c9: 'Subdoc: path already exists',
    0x00ca: 'Subdoc: value too deep',
    0x00cb: 'Subdoc: invalid command combination',
    0x00cc: 'Subdoc multi: one or more paths failed',
    0x00cd: 'Subdoc: success on a deleted document',
    0x00ce: 'Subdoc: bad xattr flag combination',
    0x00cf: 'Subdoc: bad xattr key combination',
    0x00d0: 'Subdoc: unknown macro',
    0x00d1: 'Subdoc: unknown virtual xattr',
    0x00d2: 'Subdoc: virtual xattrs are read-only',
    0x00d3: 'Subdoc multi: path failure on a deleted document',
    0x00d4: 'Subdoc: xattr specs must come first',
    0x00d5: 'Subdoc: unknown vattr macro',
    0x00d6: 'Subdoc: revive of a live document',
    0x00d7: 'Subdoc: deleted doc cannot have a user value',
    0x00d8: 'Subdoc: field is not a binary value',
}


def status_name(status: int) -> str:
    """`KEY_ENOENT`, or the hex code for a status this table does not know (messages, logs)."""
    return Status(status).name if status in Status._value2member_map_ else f"0x{status:04x}"
