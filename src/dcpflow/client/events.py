"""What `DcpClient.events()` yields: one immutable record per change, plus the few stream events an
application must see (rollback, the end of a stream).

Document events carry everything DCP sends about the change (mutation.md, deletion.md,
expiration.md), the key without its collection prefix and the collection id separately, and where
the change sits: the vbucket UUID of its history branch and the snapshot it arrived in. `cas` and
`vbuuid` are unsigned 64-bit integers here (the Arrow batches store their int64 bit pattern).
"""

import json
from typing import NamedTuple

from dcpflow.protocol.dcp import StreamEndReason

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

    event = "mutation"

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
    """A collections system event (system_event.md): it occupies a seqno."""

    vbucket: int
    seqno: int
    event_id: int
    version: int
    key: bytes
    value: bytes
    vbuuid: int

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
