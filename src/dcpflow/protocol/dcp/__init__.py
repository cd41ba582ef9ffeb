"""Typed bodies of every DCP message (opcodes 0x50-0x67), with their rules and a fast decoder.

Pages: https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands (one per
opcode, named below by file name). Where a page's example bytes and its field table disagree, the
field table and KV-Engine's validators win, and the rule is stated where it is checked.
Each message is an immutable NamedTuple: cheap to build (the producer makes millions), equal by
value (tests round-trip them), and `encode()` gives its wire bytes. `from_frame()` checks the
page's structural rules first (see rules.py) and raises ProtocolError with the status to answer.

A producer with `enable_stream_id` frames every stream message with magic 0x08 and a stream-id
FrameInfo; messages carry that as `stream_id` (None when absent).

The package is split by page family: flags (enums), layouts (shared structs and encoders), control
(open, control, no-op, buffer-ack), streams (add / request / close / end, failover log), snapshots
(markers, seqno-advanced, OSO), documents (mutation, deletion, expiration and the producer's packers),
events (set-vbucket-state, system events), sync_writes (prepare, seqno-ack, commit, abort),
cache_transfer, and decoder (dispatch, DcpDecoder). Import from the package: it re-exports them all.
"""
from ..system_events import SystemEventId
from .cache_transfer import (
    CacheTransferRecord,
    DcpCacheTransfer,
    DcpCacheTransferEnd,
)
from .control import (
    DcpBufferAck,
    DcpControl,
    DcpNoop,
    DcpOpen,
)
from .decoder import (
    REQUEST_TYPES,
    RESPONSE_TYPES,
    STREAM_OPCODES,
    DcpDecoder,
    charged_size,
    decode_dcp,
    marker_fields,
    stream_end_reason,
)
from .documents import (
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    encode_mutations,
    encode_mutations_py,
    mutations_upto,
    mutations_upto_py,
    pack_deletion,
    pack_mutation_head,
    pack_mutation_head_sid,
    stamp_mutations,
    stamp_mutations_py,
    whole_messages,
)
from .events import (
    DcpSetVbucketState,
    DcpSystemEvent,
)
from .flags import (
    OPEN_FLAGS_KNOWN,
    OPEN_FLAGS_REJECTED,
    STREAM_FLAGS_KNOWN,
    DurabilityLevel,
    MarkerVersion,
    OpenFlag,
    OsoFlag,
    SnapshotFlag,
    StreamEndReason,
    StreamFlag,
    VBucketState,
    spell_flags,
)
from .layouts import (  # noqa: F401 (the layouts test reads them)
    _DELETION_V1_EXTRAS,
    _DELETION_V2_EXTRAS,
    _MUTATION_EXTRAS,
    DELETION_V1_HEAD,
    DELETION_V2_HEAD,
    DOCUMENT_LAYOUTS,
    MARKER_V2_VALUE_BYTES,
    MARKER_V22_SHORT,
    MUTATION_HEAD,
)
from .snapshots import (
    DcpOsoSnapshot,
    DcpSeqnoAdvanced,
    DcpSnapshotMarker,
)
from .streams import (
    DcpAddStream,
    DcpAddStreamResponse,
    DcpCloseStream,
    DcpGetFailoverLog,
    DcpStreamEnd,
    DcpStreamRequest,
    DcpStreamRequestResponse,
    FailoverLogResponse,
    decode_failover_log,
    encode_failover_log,
)
from .sync_writes import (
    DcpAbort,
    DcpCommit,
    DcpPrepare,
    DcpSeqnoAcknowledged,
    sync_seqno,
)

__all__ = [
    "CacheTransferRecord",
    "DELETION_V1_HEAD",
    "DELETION_V2_HEAD",
    "DOCUMENT_LAYOUTS",
    "DcpAbort",
    "DcpAddStream",
    "DcpAddStreamResponse",
    "DcpBufferAck",
    "DcpCacheTransfer",
    "DcpCacheTransferEnd",
    "DcpCloseStream",
    "DcpCommit",
    "DcpControl",
    "DcpDecoder",
    "DcpDeletion",
    "DcpExpiration",
    "DcpGetFailoverLog",
    "DcpMutation",
    "DcpNoop",
    "DcpOpen",
    "DcpOsoSnapshot",
    "DcpPrepare",
    "DcpSeqnoAcknowledged",
    "DcpSeqnoAdvanced",
    "DcpSetVbucketState",
    "DcpSnapshotMarker",
    "DcpStreamEnd",
    "DcpStreamRequest",
    "DcpStreamRequestResponse",
    "DcpSystemEvent",
    "DurabilityLevel",
    "FailoverLogResponse",
    "MARKER_V22_SHORT",
    "MARKER_V2_VALUE_BYTES",
    "MUTATION_HEAD",
    "MarkerVersion",
    "OPEN_FLAGS_KNOWN",
    "OPEN_FLAGS_REJECTED",
    "OpenFlag",
    "OsoFlag",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "STREAM_FLAGS_KNOWN",
    "STREAM_OPCODES",
    "SnapshotFlag",
    "StreamEndReason",
    "StreamFlag",
    "SystemEventId",
    "VBucketState",
    "charged_size",
    "decode_dcp",
    "decode_failover_log",
    "encode_failover_log",
    "encode_mutations",
    "encode_mutations_py",
    "marker_fields",
    "mutations_upto",
    "mutations_upto_py",
    "pack_deletion",
    "pack_mutation_head",
    "pack_mutation_head_sid",
    "spell_flags",
    "stamp_mutations",
    "stamp_mutations_py",
    "stream_end_reason",
    "sync_seqno",
    "whole_messages",
]
