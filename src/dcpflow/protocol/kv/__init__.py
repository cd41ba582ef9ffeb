"""Typed session and KV commands: what a client sends before and beside DCP, and what a server answers.

Pages (under https://github.com/couchbase/kv_engine/blob/master/): docs/BinaryProtocol.md
(one section per opcode), docs/sasl.md, docs/ErrorMap.md, docs/Collections.md,
docs/dcp/documentation/commands/get_seqno.md and persist_seqno.md. The pattern is the dcp package's: every command is an
immutable NamedTuple with `encode()` and `from_frame()` (which runs the page's rules first, see
rules.py), and REQUEST_TYPES / RESPONSE_TYPES map opcodes to types.

Command families that share one layout (GET/GETQ/GETK/GETKQ, SET/ADD/REPLACE and their quiet
twins, ...) are one type whose `opcode` is a field: a GetQ is a Get that stays silent on a miss, and
keeping the opcode a field means a GetQ never compares equal to a Get. `OPCODES` lists the family.

Response types describe a success (and, for SASL, AUTH_CONTINUE). Any other status decodes as a
`RawResponse`, whose value is free text, a JSON error context, or - for NOT_MY_VBUCKET - a cluster
map (`decode_kv` chooses). Response types with a non-success status encode an empty body.

The package is split by page family: common (shared structs, checks, RawResponse, error replies),
session (HELLO, SASL, SELECT_BUCKET, LIST_BUCKETS), server_info (cluster config, error map, version,
no-op, quit), stats, reads (GET family, touch, locks, replica), writes (store, delete, arithmetic,
concat), replies (reply headers packed whole, the mutation token), vbuckets (vbucket state, seqnos,
observe, persistence, collection ids) and decoder (dispatch).
Import from the package: it re-exports them all.
"""
from .common import (
    STORE_EXTRAS,
    VB_STATE_FILTERS,
    VB_STATES,
    RawResponse,
    VbucketStateFilter,
    error_context,
    error_response,
    not_my_vbucket,
)
from .decoder import (
    REQUEST_TYPES,
    RESPONSE_TYPES,
    decode_kv,
)
from .reads import (
    Gat,
    Get,
    GetLocked,
    GetReplica,
    GetResponse,
    Touch,
    Unlock,
)
from .replies import (
    GET_RESPONSE_HEAD,
    MUTATION_RESPONSE_WITH_TOKEN,
    MUTATION_TOKEN,
    MutationToken,
    pack_get_response_head,
    pack_mutation_response,
    pack_response,
)
from .server_info import (
    ClusterConfigResponse,
    ErrorMapResponse,
    GetClusterConfig,
    GetErrorMap,
    Noop,
    Quit,
    SetClusterConfig,
    Version,
    VersionResponse,
)
from .session import (
    NO_BUCKET_NAME,
    Hello,
    HelloResponse,
    ListBuckets,
    ListBucketsResponse,
    SaslAuth,
    SaslListMechs,
    SaslListMechsResponse,
    SaslResponse,
    SelectBucket,
    negotiate,
    sasl_step,
)
from .stats import (
    Stat,
    StatResponse,
    StatsCollector,
    encode_stats,
)
from .vbuckets import (
    CollectionIdResponse,
    GetAllVbSeqnos,
    GetAllVbSeqnosResponse,
    GetVbucket,
    GetVbucketResponse,
    ObserveSeqno,
    ObserveSeqnoResponse,
    SeqnoPersistence,
    SetVbucket,
)
from .writes import (
    Arithmetic,
    ArithmeticResponse,
    Concat,
    Delete,
    MutationResponse,
    Store,
)

__all__ = [
    "Arithmetic",
    "ArithmeticResponse",
    "ClusterConfigResponse",
    "CollectionIdResponse",
    "Concat",
    "Delete",
    "ErrorMapResponse",
    "GET_RESPONSE_HEAD",
    "Gat",
    "Get",
    "GetAllVbSeqnos",
    "GetAllVbSeqnosResponse",
    "GetClusterConfig",
    "GetErrorMap",
    "GetLocked",
    "GetReplica",
    "GetResponse",
    "GetVbucket",
    "GetVbucketResponse",
    "Hello",
    "HelloResponse",
    "ListBuckets",
    "ListBucketsResponse",
    "MUTATION_RESPONSE_WITH_TOKEN",
    "MUTATION_TOKEN",
    "MutationToken",
    "MutationResponse",
    "NO_BUCKET_NAME",
    "Noop",
    "ObserveSeqno",
    "ObserveSeqnoResponse",
    "Quit",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "RawResponse",
    "STORE_EXTRAS",
    "SaslAuth",
    "SaslListMechs",
    "SaslListMechsResponse",
    "SaslResponse",
    "SelectBucket",
    "SeqnoPersistence",
    "SetClusterConfig",
    "SetVbucket",
    "Stat",
    "StatResponse",
    "StatsCollector",
    "Store",
    "Touch",
    "Unlock",
    "VB_STATES",
    "VB_STATE_FILTERS",
    "VbucketStateFilter",
    "Version",
    "VersionResponse",
    "decode_kv",
    "encode_stats",
    "error_context",
    "error_response",
    "negotiate",
    "not_my_vbucket",
    "pack_get_response_head",
    "pack_mutation_response",
    "pack_response",
    "sasl_step",
]
