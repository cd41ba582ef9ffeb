"""dcpflow.engine: a memory-first KV engine with a durable store - no sockets, no asyncio.

Bucket -> VBucket (hash table, HLC, CheckpointManager, FailoverTable, purge seqno, expiry);
Flusher -> Store (SQLite, by-key + by-seqno, tombstones, compaction, rollback). Conflict
resolution and the DCP rollback decision are pure functions. See each module's docstring.
"""

from .bucket import Bucket, run_expiry_pager, vbucket_for_key
from .checkpoint import (
    PERSISTENCE_CURSOR,
    Checkpoint,
    CheckpointManager,
    CheckpointType,
    Cursor,
    CursorDropped,
    CursorRegistration,
    Snapshot,
)
from .conflict import ConflictResolutionMode, DocMeta, incoming_wins
from .errors import EngineError
from .expiry import RELATIVE_EXPIRY_LIMIT, is_expired, to_absolute
from .failover import MAX_FAILOVER_ENTRIES, FailoverEntry, FailoverTable, RollbackDecision, rollback_decision
from .flusher import FlushBatch, Flusher
from .hlc import HLC
from .item import DeleteSource, Item
from .store import BackfillScan, RollbackResult, Store, VBucketStateRecord
from .store_compaction import PurgeResult
from .vbucket import VBucket, VBucketState, WithMetaOption

__all__ = [
    "HLC", "MAX_FAILOVER_ENTRIES", "PERSISTENCE_CURSOR", "RELATIVE_EXPIRY_LIMIT", "BackfillScan", "Bucket",
    "Checkpoint", "CheckpointManager", "CheckpointType", "ConflictResolutionMode", "Cursor",
    "CursorDropped", "CursorRegistration", "DeleteSource", "DocMeta", "EngineError", "FailoverEntry",
    "FailoverTable", "FlushBatch", "Flusher", "Item", "PurgeResult", "RollbackDecision", "RollbackResult",
    "Snapshot", "Store", "VBucket", "VBucketState", "VBucketStateRecord", "WithMetaOption",
    "incoming_wins", "is_expired", "rollback_decision", "run_expiry_pager", "to_absolute",
    "vbucket_for_key",
]
