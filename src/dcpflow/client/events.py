"""What `DcpClient.events()` yields: one immutable record per change, plus the few stream events an
application must see (rollback, the end of a stream).

Document events carry everything DCP sends about the change (mutation.md, deletion.md,
expiration.md), the key without its collection prefix and the collection id separately, and where
the change sits: the vbucket UUID of its history branch, the snapshot it arrived in and that
snapshot's flags (History 0x10: every version of a collection with history is sent; May Duplicate
Keys 0x20: a key may appear more than once in it - snapshot-marker.md). `cas` and `vbuuid` are
unsigned 64-bit integers here (the Arrow batches store their int64 bit pattern).
"""

import json
from typing import NamedTuple

from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.system_events import SystemEventId, decode_event_value

from .offsets import Offset


class Mutation(NamedTuple):
    vbucket: int
    seqno: int
    key: bytes
    value: bytes
    cas: int
    rev_seqno: int
    flags: int
    expiry: int
    datatype: int
    vbuuid: int
    snapshot_start: int
    snapshot_end: int
    collection_id: int = 0
    snapshot_flags: int = 0

    event = "mutation"

    @property
    def history(self) -> bool:
        """The snapshot keeps every version (a collection with history, change_streams on)."""
        return bool(self.snapshot_flags & SnapshotFlag.HISTORY)

    @property
    def may_duplicate_keys(self) -> bool:
        return bool(self.snapshot_flags & SnapshotFlag.MAY_CONTAIN_DUPLICATES)

    def json(self):
        """The value parsed as JSON."""
        return json.loads(self.value)


class Deletion(NamedTuple):
    vbucket: int
    seqno: int
    key: bytes
    cas: int
    rev_seqno: int
    datatype: int
    vbuuid: int
    snapshot_start: int
    snapshot_end: int
    collection_id: int = 0
    delete_time: int = 0
    value: bytes = b""  # xattrs only, and only if the stream asked for them
    snapshot_flags: int = 0

    event = "deletion"


class Expiration(NamedTuple):
    vbucket: int
    seqno: int
    key: bytes
    cas: int
    rev_seqno: int
    datatype: int
    vbuuid: int
    snapshot_start: int
    snapshot_end: int
    collection_id: int = 0
    delete_time: int = 0
    value: bytes = b""
    snapshot_flags: int = 0

    event = "expiration"


class Prepare(NamedTuple):
    """A sync write proposed (prepare.md): not visible to readers until its Commit. Only with
    `events(sync_writes=True)`; `deleted` for a durable delete."""

    vbucket: int
    seqno: int
    key: bytes
    value: bytes
    cas: int
    rev_seqno: int
    flags: int
    expiry: int
    datatype: int
    durability_level: int
    deleted: bool
    vbuuid: int
    collection_id: int = 0

    event = "prepare"


class Commit(NamedTuple):
    """The prepare at `prepared_seqno` became the key's version at `seqno` (commit.md)."""

    vbucket: int
    seqno: int
    key: bytes
    prepared_seqno: int
    vbuuid: int
    collection_id: int = 0

    event = "commit"


class Abort(NamedTuple):
    """The prepare at `prepared_seqno` will never be visible (abort.md)."""

    vbucket: int
    seqno: int
    key: bytes
    prepared_seqno: int
    vbuuid: int
    collection_id: int = 0

    event = "abort"


class SystemEvent(NamedTuple):
    """A collections system event (system_event.md): it occupies a seqno. `kind` says what
    happened ("collection_created", "collection_dropped", "collection_modified", "scope_created",
    "scope_dropped"; "unknown" for an event id or layout this client does not know), and the
    value's fields are decoded from either layout (the legacy structs, or FlatBuffers when the
    client asked for them). `scope` and `collection` are names: from the event for a create, else
    from the manifests the client has seen (ids are never reused); "" when not known."""

    vbucket: int
    seqno: int
    event_id: int
    version: int
    key: bytes
    value: bytes
    vbuuid: int
    kind: str = "unknown"
    manifest_uid: int | None = None
    scope_id: int | None = None
    collection_id: int | None = None
    scope: str = ""
    collection: str = ""
    max_ttl: int | None = None
    history: bool | None = None

    event = "system"


class Rollback(NamedTuple):
    """The server's history of this vbucket diverged from ours (rollback.md). `seqno` is the newest
    consistent point at or below the server's rollback seqno (a completed snapshot, or 0): the
    application must discard what it derived from this vbucket after it; the stream continues
    from `offset`, re-sending what followed."""

    vbucket: int
    seqno: int
    offset: Offset

    event = "rollback"


class StreamEnd(NamedTuple):
    """A vbucket's stream finished for good: it reached its end seqno (reason OK) or was closed
    by us. Transient ends (a slow consumer, a moved vbucket...) are handled by reopening the
    stream and are not reported here."""

    vbucket: int
    reason: StreamEndReason
    offset: Offset

    event = "stream_end"


class SnapshotMarker(NamedTuple):
    """Only with `events(markers=True)`: a snapshot begins."""

    vbucket: int
    start: int
    end: int
    flags: int

    event = "snapshot"


DOCUMENT_EVENTS = (Mutation, Deletion, Expiration)


_KINDS = {SystemEventId.BEGIN_COLLECTION: "collection_created", SystemEventId.END_COLLECTION: "collection_dropped",
          SystemEventId.MODIFY_COLLECTION: "collection_modified", SystemEventId.CREATE_SCOPE: "scope_created",
          SystemEventId.DROP_SCOPE: "scope_dropped"}


def system_event(vbucket: int, seqno: int, event_id: int, version: int, key: bytes, value: bytes, vbuuid: int,
                 names=None) -> SystemEvent:
    """A typed SystemEvent from DCP_SYSTEM_EVENT's fields (either value layout); `names`
    (manifest.Names) supplies the names a drop event does not carry and learns those a create
    event does."""
    try:
        fields = decode_event_value(event_id, version, value)
    except (ProtocolError, ValueError):
        return SystemEvent(vbucket, seqno, event_id, version, key, value, vbuuid)
    kind = _KINDS.get(event_id, "unknown")
    sid = fields.get("scope_id")
    cid = fields.get("collection_id")
    name = key.decode("utf-8", "replace") if key else fields.get("name", "")
    scope = collection = ""
    if kind.startswith("scope"):
        if names is not None and kind == "scope_created":
            names.learn_scope(sid, name)
        scope = name or (names.scopes.get(sid, "") if names is not None else "")
    elif cid is not None:
        if names is not None and kind != "collection_dropped":
            names.learn_collection(cid, sid, name)
        scope, collection = names.of(cid) if names is not None else ("", name)
        if not collection:
            collection = name
    return SystemEvent(vbucket, seqno, event_id, version, key, value, vbuuid, kind, fields.get("manifest_uid"), sid,
                       cid, scope, collection, fields.get("max_ttl"), fields.get("history"))
