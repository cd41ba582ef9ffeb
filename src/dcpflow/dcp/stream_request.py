"""DCP_STREAM_REQ's rules: what a request must satisfy, and where the stream it asks for starts.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request.md,
commands/stream-request-value.md ("Validation"), rollback.md, and the stream flags of
stream-request.md (FromLatest, ToLatest, Takeover, DiskOnly, StrictVbUuid, IgnorePurgedTombstones,
ActiveVbOnly).

The checks run in kv_engine's order, and the first that fails is the answer: the value needs HELLO
Collections and its stream-id must agree with `enable_stream_id` (DCP_STREAM_ID_INVALID); its
fields are validated (`check_value`: their JSON types); the vbucket must be here, not dead, and
active with ActiveVbOnly (NOT_MY_VBUCKET); its collections must have what the filter names
(filter.py: UNKNOWN_COLLECTION / UNKNOWN_SCOPE, and COLLECTIONS_MANIFEST_IS_AHEAD for a `uid`
ahead of the vbucket's); `enable_noop` is mandatory with xattrs or collections (NOT_SUPPORTED);
one live stream per vbucket and stream-id (KEY_EEXISTS). Then the flags fix the range
(`resolve_range`) and THE rollback decision of engine/failover.py says whether the consumer must
roll back first.
"""

from typing import NamedTuple

from dcpflow.engine.failover import RollbackDecision
from dcpflow.protocol.dcp import StreamFlag, VBucketState
from dcpflow.protocol.status import Status

from .active_stream import ActiveStream
from .errors import Refusal
from .stream_types import MAX_SEQNO

# The flags as plain ints: `int & IntFlag` runs enum's __rand__ in Python, about twenty times per
# stream request.
_S_ACTIVE_VB_ONLY = int(StreamFlag.ACTIVE_VB_ONLY)
_S_DISK_ONLY = int(StreamFlag.DISK_ONLY)
_S_FROM_LATEST = int(StreamFlag.FROM_LATEST)
_S_IGNORE_PURGED_TOMBSTONES = int(StreamFlag.IGNORE_PURGED_TOMBSTONES)
_S_STRICT_VBUUID = int(StreamFlag.STRICT_VBUUID)
_S_TAKEOVER = int(StreamFlag.TAKEOVER)
_S_TO_LATEST = int(StreamFlag.TO_LATEST)


class StreamRange(NamedTuple):
    """Where a requested stream starts and ends once its flags are applied."""

    start: int
    end: int
    vb_uuid: int
    snap_start: int
    snap_end: int


def _hex(value) -> int | None:
    try:
        n = int(value, 16) if isinstance(value, str) else None
    except ValueError:
        return None
    return n if n is not None and 0 <= n <= 0xFFFFFFFFFFFFFFFF else None


def check_value(doc: dict) -> Refusal | None:
    """stream-request-value.md "Validation": the types of the value's fields (whether its
    collections and scope exist is the filter's to say, filter.py)."""
    if "uid" in doc and (not isinstance(doc["uid"], str) or _hex(doc["uid"]) is None):
        return Refusal(Status.EINVAL, "'uid' must be a JSON string (the manifest uid in base 16)")
    if "collections" in doc and "scope" in doc:
        return Refusal(Status.EINVAL, "'collections' and 'scope' cannot both be given")
    if "collections" in doc:
        cols = doc["collections"]
        if not isinstance(cols, list):
            return Refusal(Status.EINVAL, "'collections' must be a JSON array of collection ids (base 16 strings)")
        for cid in cols:
            value = _hex(cid)
            if value is None or value > 0xFFFFFFFF:
                return Refusal(Status.EINVAL, f"collection id {cid!r} is not a base 16 string")
    if "scope" in doc:
        scope = doc["scope"]
        if not isinstance(scope, str):
            return Refusal(Status.EINVAL, "'scope' must be a JSON string (a scope id in base 16)")
        scope_id = _hex(scope)
        if scope_id is None or scope_id > 0xFFFFFFFF:
            return Refusal(Status.EINVAL, f"scope id {scope!r} is not a base 16 string")
    if "purge_seqno" in doc:
        ps = doc["purge_seqno"]
        if not isinstance(ps, str) or not ps.isdigit() or int(ps) > MAX_SEQNO:
            return Refusal(Status.EINVAL, "'purge_seqno' must be a JSON string holding an unsigned 64-bit number")
    if "cts" in doc:
        cts = doc["cts"]
        if not isinstance(cts, dict):
            return Refusal(Status.EINVAL, "'cts' must be a JSON object")
        fm = cts.get("free_memory", 0)
        if not isinstance(fm, int) or isinstance(fm, bool) or fm < 0:
            return Refusal(Status.EINVAL, "'cts.free_memory' must be an unsigned integer")
        if not isinstance(cts.get("all_keys", False), bool):
            return Refusal(Status.EINVAL, "'cts.all_keys' must be a JSON boolean")
    return None


def vbucket_refusal(vb, flags: int) -> Refusal | None:
    """The vbucket must be here and alive; with ActiveVbOnly, active (NOT_MY_VBUCKET: the caller
    answers with the cluster map)."""
    if vb is None or vb.state == VBucketState.DEAD or (flags & _S_ACTIVE_VB_ONLY and vb.state != VBucketState.ACTIVE):
        return Refusal(Status.NOT_MY_VBUCKET)
    return None


def resolve_range(vb, flags: int, start: int, end: int, vb_uuid: int, snap_start: int, snap_end: int,
                  stream_filter=None) -> StreamRange:
    """The flags' meaning (stream-request.md, as KV-Engine's code applies them): FromLatest starts
    at the high seqno (with its uuid if none was given), ToLatest ends there - for a stream
    filtered by collection, at the highest seqno of its collections (not below its start) -
    Takeover never ends by seqno, DiskOnly ends at the persisted seqno whatever was asked (the
    ERANGE checks see this end); a replica stream ends at a complete snapshot."""
    if flags & _S_FROM_LATEST:
        start = snap_start = snap_end = vb.high_seqno
        if vb_uuid == 0:
            vb_uuid = vb.uuid
    if flags & _S_TO_LATEST:
        end = vb.high_seqno
        if stream_filter is not None and not stream_filter.passthrough:
            cids = set(stream_filter.collections) | ({0} if stream_filter.default else set())
            end = max(start, max((vb.collection_high_seqno(c) for c in cids), default=0))
    if flags & _S_TAKEOVER:
        end = MAX_SEQNO
    if flags & _S_DISK_ONLY:
        end = vb.persisted_seqno
    if vb.state == VBucketState.REPLICA and vb.snapshot_start <= end < vb.snapshot_end:
        end = vb.snapshot_end
    return StreamRange(start, end, vb_uuid, snap_start, snap_end)


def rollback_decision(vb, flags: int, client_purge: int | None, rng: StreamRange, purge_seqno: int) -> RollbackDecision:
    """THE rollback decision (engine/failover.py) for a request's flags and JSON `purge_seqno`:
    taken when the stream is requested, and again when a backfill opens its scan."""
    return vb.failover.rollback_decision(
        start_seqno=rng.start, end_seqno=rng.end, vb_uuid=rng.vb_uuid, snap_start_seqno=rng.snap_start,
        snap_end_seqno=rng.snap_end, high_seqno=vb.high_seqno, purge_seqno=purge_seqno,
        client_purge_seqno=client_purge, strict_vb_uuid=bool(flags & _S_STRICT_VBUUID),
        ignore_purged_tombstones=bool(flags & _S_IGNORE_PURGED_TOMBSTONES))


def purged_under(stream: ActiveStream, purge_seqno: int) -> bool:
    """Must the consumer roll back to 0 because tombstones it has not seen were purged?

    The request checked the purge seqno of that moment, but the scan opens later (queued behind
    other backfills, or after a dropped cursor): a compaction in between leaves the purged
    deletions out of the disk snapshot, and the consumer would never learn of them (rollback.md
    "Wild Card 'Purge'"). So the request's purge rule is applied again with the scan's purge
    seqno, from where the backfill starts (what the consumer has by then, on the vbucket's current
    branch, so only the purge rule can ask for a rollback here)."""
    vb, pos = stream.vb, stream.backfill.start - 1
    if pos == 0 or purge_seqno <= pos:
        return False  # the purge rule cannot fire (and nothing else can from the current uuid)
    rng = StreamRange(pos, max(pos, stream.end_seqno), vb.uuid, pos, pos)
    return rollback_decision(vb, stream.flags, stream.client_purge_seqno, rng, purge_seqno).status == Status.ROLLBACK
