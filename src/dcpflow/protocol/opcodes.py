"""Opcodes of the memcached binary protocol with Couchbase's extensions.

Values and meanings are KV-Engine's (its headers define them; the opcode table of
https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md
omits some, such as 0x66/0x67).
"""

from enum import IntEnum


class Opcode(IntEnum):
    """Client-initiated opcodes (magic 0x80/0x08 requests, 0x81/0x18 responses)."""
    GET = 0x00
    SET = 0x01
    ADD = 0x02
    REPLACE = 0x03
    DELETE = 0x04
    INCREMENT = 0x05
    DECREMENT = 0x06
    QUIT = 0x07
    FLUSH = 0x08
    GET_Q = 0x09
    NOOP = 0x0a
    VERSION = 0x0b
    GET_K = 0x0c
    GET_KQ = 0x0d
    APPEND = 0x0e
    PREPEND = 0x0f
    STAT = 0x10
    SET_Q = 0x11
    ADD_Q = 0x12
    REPLACE_Q = 0x13
    DELETE_Q = 0x14
    INCREMENT_Q = 0x15
    DECREMENT_Q = 0x16
    QUIT_Q = 0x17
    FLUSH_Q = 0x18
    APPEND_Q = 0x19
    PREPEND_Q = 0x1a
    VERBOSITY = 0x1b
    TOUCH = 0x1c
    GAT = 0x1d
    GAT_Q = 0x1e
    HELLO = 0x1f
    SASL_LIST_MECHS = 0x20
    SASL_AUTH = 0x21
    SASL_STEP = 0x22
    IOCTL_GET = 0x23
    IOCTL_SET = 0x24
    CONFIG_VALIDATE = 0x25
    CONFIG_RELOAD = 0x26
    AUDIT_PUT = 0x27
    AUDIT_CONFIG_RELOAD = 0x28
    SHUTDOWN = 0x29
    SET_BUCKET_THROTTLE_PROPERTIES = 0x2a
    SET_BUCKET_DATA_LIMIT_EXCEEDED = 0x2b
    SET_NODE_THROTTLE_PROPERTIES = 0x2c
    SET_ACTIVE_ENCRYPTION_KEYS = 0x2d
    PRUNE_ENCRYPTION_KEYS = 0x2e
    REGISTER_AUTH_TOKEN = 0x2f
    RGET = 0x30
    RSET = 0x31
    RSETQ = 0x32
    RAPPEND = 0x33
    RAPPENDQ = 0x34
    RPREPEND = 0x35
    RPREPENDQ = 0x36
    RDELETE = 0x37
    RDELETEQ = 0x38
    RINCR = 0x39
    RINCRQ = 0x3a
    RDECR = 0x3b
    RDECRQ = 0x3c
    SET_VBUCKET = 0x3d
    GET_VBUCKET = 0x3e
    DEL_VBUCKET = 0x3f
    TAP_CONNECT = 0x40
    TAP_MUTATION = 0x41
    TAP_DELETE = 0x42
    TAP_FLUSH = 0x43
    TAP_OPAQUE = 0x44
    TAP_VBUCKET_SET = 0x45
    TAP_CHECKPOINT_START = 0x46
    TAP_CHECKPOINT_END = 0x47
    GET_ALL_VB_SEQNOS = 0x48
    GET_EX = 0x49
    GET_EX_REPLICA = 0x4a
    MUTATE_WITH_META = 0x4b
    DCP_OPEN = 0x50
    DCP_ADD_STREAM = 0x51
    DCP_CLOSE_STREAM = 0x52
    DCP_STREAM_REQ = 0x53
    DCP_GET_FAILOVER_LOG = 0x54
    DCP_STREAM_END = 0x55
    DCP_SNAPSHOT_MARKER = 0x56
    DCP_MUTATION = 0x57
    DCP_DELETION = 0x58
    DCP_EXPIRATION = 0x59
    DCP_FLUSH = 0x5a
    DCP_SET_VBUCKET_STATE = 0x5b
    DCP_NOOP = 0x5c
    DCP_BUFFER_ACKNOWLEDGEMENT = 0x5d
    DCP_CONTROL = 0x5e
    DCP_SYSTEM_EVENT = 0x5f
    DCP_PREPARE = 0x60
    DCP_SEQNO_ACKNOWLEDGED = 0x61
    DCP_COMMIT = 0x62
    DCP_ABORT = 0x63
    DCP_SEQNO_ADVANCED = 0x64
    DCP_OSO_SNAPSHOT = 0x65
    DCP_CACHE_TRANSFER = 0x66
    DCP_CACHE_TRANSFER_END = 0x67
    GET_FUSION_STORAGE_SNAPSHOT = 0x70
    RELEASE_FUSION_STORAGE_SNAPSHOT = 0x71
    MOUNT_FUSION_VBUCKET = 0x72
    UNMOUNT_FUSION_VBUCKET = 0x73
    SYNC_FUSION_LOGSTORE = 0x74
    START_FUSION_UPLOADER = 0x75
    STOP_FUSION_UPLOADER = 0x76
    DELETE_FUSION_NAMESPACE = 0x77
    GET_FUSION_NAMESPACES = 0x78
    CREATE_FUSION_NAMESPACE = 0x79
    STOP_PERSISTENCE = 0x80
    START_PERSISTENCE = 0x81
    SET_PARAM = 0x82
    GET_REPLICA = 0x83
    SET_CHRONICLE_AUTH_TOKEN = 0x84
    CREATE_BUCKET = 0x85
    DELETE_BUCKET = 0x86
    LIST_BUCKETS = 0x87
    SELECT_BUCKET = 0x89
    PAUSE_BUCKET = 0x8a
    RESUME_BUCKET = 0x8b
    VALIDATE_BUCKET_CONFIG = 0x8c
    OBSERVE_SEQNO = 0x91
    OBSERVE = 0x92
    EVICT_KEY = 0x93
    GET_LOCKED = 0x94
    UNLOCK_KEY = 0x95
    GET_FAILOVER_LOG = 0x96
    LAST_CLOSED_CHECKPOINT = 0x97
    DEREGISTER_TAP_CLIENT = 0x9e
    RESET_REPLICATION_CHAIN = 0x9f
    GET_META = 0xa0
    GETQ_META = 0xa1
    SET_WITH_META = 0xa2
    SETQ_WITH_META = 0xa3
    ADD_WITH_META = 0xa4
    ADDQ_WITH_META = 0xa5
    SNAPSHOT_VB_STATES = 0xa6
    VBUCKET_BATCH_COUNT = 0xa7
    DEL_WITH_META = 0xa8
    DELQ_WITH_META = 0xa9
    CREATE_CHECKPOINT = 0xaa
    NOTIFY_VBUCKET_UPDATE = 0xac
    ENABLE_TRAFFIC = 0xad
    DISABLE_TRAFFIC = 0xae
    IFCONFIG = 0xaf
    CHANGE_VB_FILTER = 0xb0
    CHECKPOINT_PERSISTENCE = 0xb1
    RETURN_META = 0xb2
    COMPACT_DB = 0xb3
    SET_CLUSTER_CONFIG = 0xb4
    GET_CLUSTER_CONFIG = 0xb5
    GET_RANDOM_KEY = 0xb6
    SEQNO_PERSISTENCE = 0xb7
    GET_KEYS = 0xb8
    COLLECTIONS_SET_MANIFEST = 0xb9
    COLLECTIONS_GET_MANIFEST = 0xba
    COLLECTIONS_GET_ID = 0xbb
    COLLECTIONS_GET_SCOPE_ID = 0xbc
    SET_DRIFT_COUNTER_STATE = 0xc1
    GET_ADJUSTED_TIME = 0xc2
    SUBDOC_GET = 0xc5
    SUBDOC_EXISTS = 0xc6
    SUBDOC_DICT_ADD = 0xc7
    SUBDOC_DICT_UPSERT = 0xc8
    SUBDOC_DELETE = 0xc9
    SUBDOC_REPLACE = 0xca
    SUBDOC_ARRAY_PUSH_LAST = 0xcb
    SUBDOC_ARRAY_PUSH_FIRST = 0xcc
    SUBDOC_ARRAY_INSERT = 0xcd
    SUBDOC_ARRAY_ADD_UNIQUE = 0xce
    SUBDOC_COUNTER = 0xcf
    SUBDOC_MULTI_LOOKUP = 0xd0
    SUBDOC_MULTI_MUTATION = 0xd1
    SUBDOC_GET_COUNT = 0xd2
    SUBDOC_REPLACE_BODY_WITH_XATTR = 0xd3
    RANGE_SCAN_CREATE = 0xda
    RANGE_SCAN_CONTINUE = 0xdb
    RANGE_SCAN_CANCEL = 0xdc
    PREPARE_SNAPSHOT = 0xe0
    SCRUB = 0xf0
    ISASL_REFRESH = 0xf1
    SSL_CERTS_REFRESH = 0xf2
    GET_CMD_TIMER = 0xf3
    SET_CTRL_TOKEN = 0xf4
    UPDATE_EXTERNAL_USER_PERMISSIONS = 0xf6
    RBAC_REFRESH = 0xf7
    AUTH_PROVIDER = 0xf8
    DROP_PRIVILEGE = 0xfb
    ADJUST_TIMEOFDAY = 0xfc
    EWOULDBLOCK_CTL = 0xfd
    GET_ERROR_MAP = 0xfe
    INVALID = 0xff


class ServerOpcode(IntEnum):
    """Server-initiated opcodes (duplex mode, magic 0x82 requests / 0x83 responses)."""

    CLUSTERMAP_CHANGE_NOTIFICATION = 0x01
    AUTHENTICATE = 0x02
    ACTIVE_EXTERNAL_USERS = 0x03
    GET_AUTHORIZATION = 0x04


#: One-line meaning of each client opcode, for `dcpflow inspect` and error messages.
OPCODE_DESCRIPTIONS: dict[int, str] = {
    0x00: 'Get document',
    0x01: 'Store (upsert)',
    0x02: 'Store only if absent',
    0x03: 'Store only if present',
    0x04: 'Delete',
    0x05: 'Counter increment',
    0x06: 'Counter decrement',
    0x07: 'Close connection',
    0x08: 'Unsupported',
    0x09: 'Quiet get (no response on miss)',
    0x0a: 'Ping (non-DCP)',
    0x0b: 'Server version',
    0x0c: 'Get, response includes key',
    0x0d: 'Quiet GetK',
    0x0e: 'Append to value',
    0x0f: 'Prepend to value',
    0x10: 'Statistics (key = group, e.g. `dcp`, `dcpagg`, `vbucket-seqno`, `dcp-vbtakeover`, `failovers`)',
    0x11: 'Quiet set',
    0x12: 'Quiet add',
    0x13: 'Quiet replace',
    0x14: 'Quiet delete',
    0x15: 'Quiet increment',
    0x16: 'Quiet decrement',
    0x17: 'Quiet quit',
    0x18: 'Unsupported',
    0x19: 'Quiet append',
    0x1a: 'Quiet prepend',
    0x1b: 'Set log verbosity',
    0x1c: 'Update expiry',
    0x1d: 'Get and touch',
    0x1e: 'Quiet get-and-touch',
    0x1f: 'Feature negotiation (value = list of u16 feature codes, see section 4)',
    0x20: 'List SASL mechanisms',
    0x21: 'SASL authenticate (first step)',
    0x22: 'SASL continue',
    0x23: 'Internal control get',
    0x24: 'Internal control set',
    0x25: 'Validate memcached config',
    0x26: 'Reload memcached config',
    0x27: 'Submit audit event',
    0x28: 'Reload audit config',
    0x29: 'Shut down the server',
    0x2a: 'Set bucket throttle limits',
    0x2b: 'Toggle bucket data-limit state',
    0x2c: 'Unsupported',
    0x2d: 'Set encryption-at-rest keys',
    0x2e: 'Prune old encryption keys',
    0x2f: 'Register an auth token',
    0x30: 'Unsupported range ops',
    0x31: 'Unsupported range ops',
    0x32: 'Unsupported range ops',
    0x33: 'Unsupported range ops',
    0x34: 'Unsupported range ops',
    0x35: 'Unsupported range ops',
    0x36: 'Unsupported range ops',
    0x37: 'Unsupported range ops',
    0x38: 'Unsupported range ops',
    0x39: 'Unsupported range ops',
    0x3a: 'Unsupported range ops',
    0x3b: 'Unsupported range ops',
    0x3c: 'Unsupported range ops',
    0x3d: 'Set vbucket state (extras 1 byte state; optional JSON value: `topology`, `use_snapshot`, `next_expected_state`)',
    0x3e: 'Get vbucket state (value = u32 state)',
    0x3f: 'Delete vbucket (value `async=0` for synchronous)',
    0x40: 'Unsupported (TAP removed in 5.0)',
    0x41: 'Unsupported (TAP removed in 5.0)',
    0x42: 'Unsupported (TAP removed in 5.0)',
    0x43: 'Unsupported (TAP removed in 5.0)',
    0x44: 'Unsupported (TAP removed in 5.0)',
    0x45: 'Unsupported (TAP removed in 5.0)',
    0x46: 'Unsupported (TAP removed in 5.0)',
    0x47: 'Unsupported (TAP removed in 5.0)',
    0x48: 'High seqno of every vbucket (optional extras: u32 state filter, optionally + u32 collection id)',
    0x49: 'Get with extended info',
    0x4a: 'GetEx from a replica',
    0x4b: 'Add/Set/Delete with explicit metadata + CAS/seqno patching (docs/mutate-with-meta.md)',
    0x50: 'Open a DCP producer or consumer connection',
    0x51: '(to a consumer) create a stream from its producer',
    0x52: 'Close a stream',
    0x53: 'Request a vbucket stream (consumer -> producer)',
    0x54: 'Get failover log (on a DCP connection)',
    0x55: 'Producer -> consumer: stream finished (extras u32 reason)',
    0x56: 'Producer -> consumer: snapshot boundary',
    0x57: 'Document mutation',
    0x58: 'Document deletion',
    0x59: 'Document expiry (only if `enable_expiry_opcode`)',
    0x5a: 'Unsupported',
    0x5b: 'Producer -> consumer during takeover (extras 1 byte state, no value)',
    0x5c: 'Producer -> consumer keep-alive; consumer must respond',
    0x5d: 'Consumer -> producer flow-control ack (extras u32 bytes)',
    0x5e: 'Consumer -> producer: key/value setting',
    0x5f: 'Collection/scope lifecycle event',
    0x60: 'SyncWrite prepare',
    0x61: 'Consumer -> producer: highest prepared seqno',
    0x62: 'SyncWrite commit',
    0x63: 'SyncWrite abort',
    0x64: 'Stream seqno moved past invisible/filtered items',
    0x65: 'Out-of-seqno-order snapshot start/end',
    0x66: 'Batched hash-table items (cache transfer phase)',
    0x67: 'End of cache transfer phase',
    0x70: 'Fusion',
    0x71: 'Fusion',
    0x72: 'Fusion',
    0x73: 'Fusion',
    0x74: 'Fusion',
    0x75: 'Fusion',
    0x76: 'Fusion',
    0x77: 'Fusion',
    0x78: 'Fusion',
    0x79: 'Fusion',
    0x80: 'Stop the flusher',
    0x81: 'Start the flusher',
    0x82: 'Set an engine parameter',
    0x83: 'Read from a replica vbucket',
    0x84: 'ns_server internal',
    0x85: 'Create bucket',
    0x86: 'Delete bucket',
    0x87: 'List buckets (space separated names)',
    0x89: 'Bind connection to a bucket (key = name)',
    0x8a: 'Pause bucket',
    0x8b: 'Resume bucket',
    0x8c: 'Validate a bucket config',
    0x91: 'Observe persistence/replication of a seqno',
    0x92: 'Observe keys',
    0x93: 'Evict a key from memory',
    0x94: 'Get and lock',
    0x95: 'Unlock',
    0x96: 'Failover log on a normal (non-DCP) connection',
    0x97: 'Unsupported',
    0x9e: 'Unsupported',
    0x9f: 'Unsupported',
    0xa0: 'Get document metadata',
    0xa1: 'Quiet GetMeta',
    0xa2: 'Set with explicit metadata (XDCR)',
    0xa3: 'Quiet SetWithMeta',
    0xa4: 'Add with explicit metadata',
    0xa5: 'Quiet AddWithMeta',
    0xa6: 'Unsupported',
    0xa7: 'Unsupported',
    0xa8: 'Delete with explicit metadata',
    0xa9: 'Quiet DelWithMeta',
    0xaa: 'Unsupported',
    0xac: 'Unsupported',
    0xad: 'Enable data traffic after warmup',
    0xae: 'Disable data traffic',
    0xaf: 'Network interface control',
    0xb0: 'Unsupported',
    0xb1: 'Unsupported',
    0xb2: 'Set/Add/Del returning metadata (addrm/setrm/delrm pages)',
    0xb3: 'Trigger compaction',
    0xb4: 'Push cluster map to memcached',
    0xb5: 'Get cached cluster map (optional 16-byte extras: epoch, revision)',
    0xb6: 'Random document',
    0xb7: 'Wait until a seqno is persisted (extras u64 seqno)',
    0xb8: 'List keys of a vbucket',
    0xb9: 'Set collections manifest',
    0xba: 'Get collections manifest',
    0xbb: 'Resolve `scope.collection` to id',
    0xbc: 'Resolve scope to id',
    0xc1: 'Unsupported',
    0xc2: 'Unsupported',
    0xc5: 'Sub-document get a path (docs/SubDocument.md)',
    0xc6: 'Sub-document: does a path exist',
    0xc7: 'Sub-document: add a dictionary entry',
    0xc8: 'Sub-document: add or replace a dictionary entry',
    0xc9: 'Sub-document: remove a path',
    0xca: 'Sub-document: replace the value at a path',
    0xcb: 'Sub-document: append to an array',
    0xcc: 'Sub-document: prepend to an array',
    0xcd: 'Sub-document: insert into an array at an index',
    0xce: 'Sub-document: add a unique primitive to an array',
    0xcf: 'Sub-document: add a delta to an integer',
    0xd0: 'Sub-document: up to 16 lookups on one document',
    0xd1: 'Sub-document: up to 16 mutations applied atomically',
    0xd2: 'Sub-document: number of elements of an array or object',
    0xd3: 'Sub-document: replace the body with an xattr',
    0xda: 'Create a key range scan or random sample (docs/range_scans/range_scan_create.md)',
    0xdb: 'Continue a range scan',
    0xdc: 'Cancel a range scan',
    0xe0: 'File-based snapshot (docs/Snapshots.md)',
    0xf0: 'Unsupported',
    0xf1: 'Reload password database',
    0xf2: 'Unsupported',
    0xf3: 'Command timings',
    0xf4: 'ns_server session token',
    0xf6: 'External RBAC update',
    0xf7: 'Reload RBAC database',
    0xf8: 'Register as external auth provider',
    0xfb: 'Test only',
    0xfc: 'Test only',
    0xfd: 'Test only',
    0xfe: 'Fetch error map (no extras/key; value = u16 max version understood; response = JSON map)',
    0xff: 'Reserved',
}


#: Opcodes the server rejects outright (retired or reserved).
UNSUPPORTED: frozenset[int] = frozenset(
    k for k, d in OPCODE_DESCRIPTIONS.items() if d.startswith("Unsupported")
)
