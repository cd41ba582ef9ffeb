"""ActiveStream: what one DCP stream sends, as bytes in a ready queue - no sockets, no timers.

Pages (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/): commands/
stream-request.md, commands/snapshot-marker.md ("Implementation notes"), commands/stream-end.md,
rebalance.md (takeover).

A stream starts by registering a checkpoint cursor at its start seqno. If memory still holds
start+1 it streams in-memory checkpoints right away; otherwise (or with DiskOnly) it first needs a
*backfill* of [start+1, min(end, first seqno in memory - 1)] from the on-disk store, sent as one
Disk|Checkpoint snapshot. The owner (server/backfill.py) runs the SQLite scan wherever it likes -
a worker thread - and hands pages to `backfill_page` / `backfill_rows` / `backfill_encoded`; the
stream only turns items into messages. After the backfill the cursor continues exactly where the
disk snapshot ended.

Snapshot-marker start seqnos follow the implementation notes of snapshot-marker.md as the code
behaves: the first marker of a stream starts at min(requested snapshot
start, natural start); a backfill marker otherwise starts at the backfill's first seqno; a memory
marker with the Checkpoint flag at the checkpoint's snapshot start; a memory marker without it at
the seqno of the first item that follows it; a marker of a Disk checkpoint at the checkpoint's
snapshot start. Marker ends are clamped to the stream's end seqno.

Messages are encoded as they are queued (the producer only concatenates bytes), and the ready
queue is bounded by the caller: `fill(max_bytes)` reads the cursor only while fewer than
`max_bytes` are queued, and the producer asks for the next backfill page only then, so a stream
over a million-item vbucket holds one page plus the queue in memory.

The stream ends itself with STREAM_END(OK) at its end seqno (or once a DiskOnly backfill is
done). Other ends come from outside through `set_dead(reason)`: the queued messages are dropped
(kv_engine clears the ready queue for any reason but OK) and STREAM_END(reason) is queued, except
for a client CLOSE_STREAM without `send_stream_end_on_client_close_stream`, which sends nothing.

Collections (filter.py, commands/system_event.md, commands/seqno-advanced.md): a stream sends the
documents and system events its filter admits - a connection without HELLO Collections only the
default collection's documents. Memory's items and backfill pages go through the filter first
(`_admit`) unless they can only be default-collection documents the filter sends anyway (the
common case costs nothing per item); raw backfill rows are filtered in the loop that encodes them
(`backfill_rows`), and plain mutations of any collection are encoded in runs; a snapshot that
ends on items the filter hid is closed for a collection-aware consumer with DCP_SEQNO_ADVANCED
at its end, and a snapshot of memory with nothing for the stream is sent as its marker and a
SEQNO_ADVANCED alone. System events go out in the legacy layouts or, with
`flatbuffers_system_events`, as FlatBuffers (protocol/system_events.py). When the filter is left
empty (its collections or scope dropped), the drop events are sent and
the stream ends with STREAM_END(FILTER_EMPTY).

Change streams (`change_streams`, snapshot-marker.md flags 0x10 History and 0x20 May Duplicate
Keys): the checkpoints keep every version of a collection with history; a memory snapshot holding
such versions is marked History, and May Duplicate Keys when one of its keys repeats. A backfill
that starts where the store still has every version (`vb.history_start`) reads them all, as one
Disk|Checkpoint|History|May Duplicate Keys snapshot; one that starts earlier is an ordinary,
de-duplicated disk snapshot. A stream without `change_streams` keeps the unique-key promise: of
a memory snapshot with repeated keys it sends each key's latest version.

Sync writes (engine/durability/; prepare.md, commit.md, abort.md): a stream whose connection
enabled `enable_sync_writes` gets each prepare as DCP_PREPARE, its commit as DCP_COMMIT and its
abort as DCP_ABORT, one by one (never through the mutation encoder); with a `consumer_name` too its
markers are V2.0, carrying the snapshot's max visible seqno, and on Disk snapshots the vbucket's
persisted high completed seqno. Any other stream sees committed versions only - a commit is the
mutation or deletion it made - and its memory snapshots end at their max visible seqno, so an
offset taken at a marker's end is never a prepare. A backfill reads committed versions from the
store; for a sync-write stream the vbucket's in-flight prepares in the range are merged into it by
seqno (the store keeps them apart).

Takeover (rebalance.md, as KV-Engine's code behaves): once caught up the stream enters TAKEOVER_SEND, in
which markers carry the Ack flag; when everything is sent and acknowledged it sends
SET_VBUCKET_STATE(pending) and waits for the reply; then marks its own vbucket dead, drains what
was written meanwhile, sends SET_VBUCKET_STATE(active), waits for that reply and ends with
STREAM_END(OK).
"""

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from dcpflow.engine.checkpoint import CheckpointType, Cursor, CursorDropped, Snapshot
from dcpflow.engine.collections import SYSTEM_CID, SystemEvent
from dcpflow.engine.durability.items import Abort, Commit, Prepare, is_sync_item
from dcpflow.engine.item import DATATYPE_SNAPPY, DATATYPE_XATTR, Item
from dcpflow.engine.store import ITEM_COLUMNS, LARGE_VALUE, EncodedPage, item_from_row
from dcpflow.protocol import snappy
from dcpflow.protocol.datatype import xattr_body_offset
from dcpflow.protocol.dcp import (
    DcpAbort,
    DcpCommit,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpPrepare,
    DcpSeqnoAdvanced,
    DcpSetVbucketState,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpSystemEvent,
    MarkerVersion,
    SnapshotFlag,
    StreamEndReason,
    StreamFlag,
    SystemEventId,
    VBucketState,
    encode_mutations,
    pack_deletion,
    pack_mutation_head,
    pack_mutation_head_sid,
    whole_messages,
)
from dcpflow.protocol.keys import encode_leb128
from dcpflow.protocol.system_events import event_body

from .filter import StreamFilter

assert ITEM_COLUMNS[:7] == ("key", "seqno", "rev_seqno", "cas", "flags", "expiry", "datatype")
assert ITEM_COLUMNS[7] == "deleted" and ITEM_COLUMNS[10] == "value" and ITEM_COLUMNS[11] == "cid"
_U64 = 0xFFFFFFFFFFFFFFFF

MAX_SEQNO = 0xFFFFFFFFFFFFFFFF
_MEMORY, _DISK, _CHK, _ACK = (int(SnapshotFlag.MEMORY), int(SnapshotFlag.DISK), int(SnapshotFlag.CHECKPOINT),
                              int(SnapshotFlag.ACK))
_HISTORY, _MAY_DUPLICATE = int(SnapshotFlag.HISTORY), int(SnapshotFlag.MAY_CONTAIN_DUPLICATES)


class _KeyPrefixes(dict):
    """What a key starts with on a connection with HELLO Collections: its collection id in LEB128,
    by id, made on first use (a stream looks one up per document)."""

    def __missing__(self, cid: int) -> bytes:
        prefix = self[cid] = encode_leb128(cid)
        return prefix

#: Plain ints: `int & IntFlag` runs enum's Python __rand__.
_TAKEOVER, _DISK_ONLY = int(StreamFlag.TAKEOVER), int(StreamFlag.DISK_ONLY)


class Frames:
    """A ready-queue entry holding `count` whole messages (a backfill page SQLite encoded). The
    owner may send a prefix of it (`split`), never part of a message."""

    __slots__ = ("data", "count")

    def __init__(self, data: bytes | memoryview, count: int):
        self.data, self.count = data, count

    def __len__(self) -> int:
        return len(self.data)

    def split(self, nbytes: int) -> tuple["Frames", "Frames | None"]:
        """The shortest prefix of whole messages holding at least `nbytes` bytes, and the rest."""
        data = memoryview(self.data)
        pos, n = whole_messages(data, nbytes)
        if pos >= len(data):
            return self, None
        return Frames(data[:pos], n), Frames(data[pos:], self.count - n)


def _latest_versions(items: list[Item]) -> list[Item]:
    """A snapshot's items with only the last version of each key (a stream without change streams)."""
    last: dict = {}
    for i, it in enumerate(items):
        last[(it.cid, it.key)] = i
    keep = set(last.values()) if len(last) < len(items) else None
    return items if keep is None else [it for i, it in enumerate(items) if i in keep or it.cid == SYSTEM_CID]


class StreamState(Enum):
    BACKFILLING = "backfilling"
    IN_MEMORY = "in-memory"
    TAKEOVER_SEND = "takeover-send"
    TAKEOVER_WAIT = "takeover-wait"
    DEAD = "dead"


@dataclass(slots=True)
class StreamOptions:
    """The connection's settings that shape a stream's messages (DCP_OPEN flags, DCP_CONTROL keys,
    HELLO Collections)."""

    include_xattrs: bool = False
    no_value: bool = False
    no_value_underlying_datatype: bool = False
    delete_times: bool = False
    expiry_opcode: bool = False  # effective only with delete_times (as in KV-Engine): the producer checks
    collections: bool = False  # keys carry the LEB128 collection id; SEQNO_ADVANCED may be sent
    sync_replication: bool = False  # enable_sync_writes + consumer_name: markers at least V2.0
    sync_writes: bool = False  # enable_sync_writes: DCP_PREPARE / DCP_COMMIT / DCP_ABORT (module docstring)
    marker_v22: bool = False  # max_marker_version=2.2: Disk markers carry the purge seqno
    skip_deletes_in_initial_backfill: bool = False
    supports_cursor_dropping: bool = False
    send_stream_end_on_close: bool = False
    compress_values: bool = False  # force_value_compression: values go out Snappy-compressed
    flatbuffers_events: bool = False  # flatbuffers_system_events: system event values as FlatBuffers
    change_streams: bool = False  # history of the collections that keep it (module docstring)


@dataclass(frozen=True, slots=True)
class BackfillRange:
    """Read items with start <= seqno <= end from disk (`Store.scan(vb, start - 1, end)`), and
    every older version of the `history` collections."""

    start: int
    end: int
    history: frozenset[int] = frozenset()


class ActiveStream:
    """One vbucket stream of a producer; see the module docstring.

    `vb` is the engine VBucket; `set_vbucket_state(vbid, state)` is the bucket's (used by takeover
    to mark the vbucket dead); `wake(stream)` tells the owner the stream has something new to do (it may
    be called from inside another connection's write, so the owner must only schedule work).
    """

    def __init__(self, vb, *, name: str, opaque: int, start_seqno: int, end_seqno: int, snap_start_seqno: int,
                 flags: int = 0, stream_id: int | None = None, options: StreamOptions | None = None,
                 client_purge_seqno: int | None = None, filter: StreamFilter | None = None,
                 set_vbucket_state: Callable[[int, VBucketState], object] | None = None,
                 wake: "Callable[[ActiveStream], None]" = lambda stream: None):
        self.vb = vb
        self.vbid = vb.id
        self.name = name
        self.opaque = opaque
        self.flags = flags
        self.stream_id = stream_id
        self.opts = options or StreamOptions()
        if filter is None:  # what a request without a JSON value gets
            filter = StreamFilter.build({} if self.opts.collections else None, vb.collections)
        self.filter = filter
        self._emptied = False  # the filter was left empty: end with FILTER_EMPTY once queued
        self._prefixes = _KeyPrefixes()
        self.start_seqno = start_seqno
        self.end_seqno = end_seqno
        self.snap_start_seqno = snap_start_seqno
        # the request's JSON `purge_seqno`: the owner re-checks purges with it when a backfill opens
        self.client_purge_seqno = client_purge_seqno
        self.takeover = bool(flags & _TAKEOVER)
        self.disk_only = bool(flags & _DISK_ONLY)
        self._set_vbucket_state = set_vbucket_state
        self._wake = wake
        self.state = StreamState.IN_MEMORY
        self.ready: deque[bytes] = deque()
        self.ready_bytes = 0
        self.cursor: Cursor | None = None
        self.cursor_dropped = False
        self.backfill: BackfillRange | None = None  # wanted or running
        self.backfill_running = False
        self.last_read_seqno = start_seqno  # highest seqno whose fate (sent or skipped) is decided
        self.last_sent_seqno = start_seqno  # highest item seqno queued
        self._first_marker = True
        self._backfill_prepares: list[Item] = []  # in-flight prepares a backfill sends (sync writes)
        # (start, end, prepares sent, high seqno) of each backfill planned with sync writes (_prepare_was_sent)
        self._backfilled: list[tuple[int, int, frozenset, int]] = []
        self._marker_end = start_seqno  # end of the snapshot being sent
        self._backfills = 0
        self._initial_backfill = start_seqno == 0
        self.end_reason: StreamEndReason | None = None
        self.acks_outstanding = 0
        self.takeover_waiting_for: VBucketState | None = None
        self.items_sent = 0
        self.backfill_items = 0
        self.memory_items = 0
        self.cursor_drops = 0
        self.peak_ready_bytes = 0  # the most a backfill ever had queued (bounded memory, tested)

    def __repr__(self) -> str:
        sid = f" sid={self.stream_id}" if self.stream_id is not None else ""
        return f"<ActiveStream vb={self.vbid}{sid} {self.state.value} last={self.last_sent_seqno} end={self.end_seqno}>"

    # -- life cycle ----------------------------------------------------------------------------
    @property
    def dead(self) -> bool:
        return self.state is StreamState.DEAD

    def start(self) -> None:
        """Place the cursor (or plan the backfill); a stream with start == end ends at once."""
        if self.start_seqno >= self.end_seqno:
            self._end(StreamEndReason.OK)
            return
        if self.disk_only:
            self._plan_backfill(self.start_seqno + 1, self.end_seqno)
            return
        self._register_cursor(self.start_seqno)

    def _register_cursor(self, seqno: int) -> None:
        cm = self.vb.checkpoint_manager
        # droppable only if the connection opted in (recommended-apis.md "Cursor Dropping")
        reg = cm.register_cursor(self.name, seqno, droppable=self.opts.supports_cursor_dropping,
                                 on_drop=self._on_cursor_dropped)
        self.cursor, self.cursor_dropped = reg.cursor, False
        if reg.backfill_required:
            self._plan_backfill(reg.backfill_start, min(reg.backfill_end, self.end_seqno))
        else:
            self.state = StreamState.IN_MEMORY

    def _plan_backfill(self, start: int, end: int) -> None:
        self.state = StreamState.BACKFILLING
        history = self.vb.collections.history
        if not self.opts.change_streams or start < self.vb.history_start:
            history = frozenset()
        self.backfill = BackfillRange(start, end, history)
        self.backfill_running = False
        if self.opts.sync_writes:
            # The store keeps in-flight prepares apart from the versions (store.py); a stream with
            # sync writes gets those of the range merged into the backfill by seqno.
            last = min(end, self.end_seqno)
            self._backfill_prepares = sorted((p for p in self.vb.prepares.values() if start <= p.by_seqno <= last),
                                             key=lambda p: p.by_seqno)
            self._backfilled.append((start, last, frozenset(p.by_seqno for p in self._backfill_prepares),
                                     self.vb.high_seqno))

    def _release_cursor(self) -> None:
        if self.cursor is not None:
            if not self.cursor.dropped:
                self.cursor.close()
            self.cursor = None

    def _on_cursor_dropped(self, cursor: Cursor) -> None:
        """CheckpointManager callback (memory quota): note it; the owner wakes us to act on it."""
        if cursor is self.cursor:
            self.cursor_dropped = True
            self.cursor_drops += 1
            self._wake(self)

    def release(self) -> None:
        """The connection is gone: drop the cursor and the queue, send nothing."""
        self._release_cursor()
        self.backfill = None
        self.ready.clear()
        self.ready_bytes = 0
        self.state = StreamState.DEAD

    def set_dead(self, reason: StreamEndReason) -> None:
        """End the stream from outside (close, state change, rollback, disconnect...)."""
        if self.dead:
            return
        self._end(reason)

    def _end(self, reason: StreamEndReason) -> None:
        self._release_cursor()
        self.backfill = None
        if reason != StreamEndReason.OK and reason != StreamEndReason.FILTER_EMPTY:
            self.ready.clear()
            self.ready_bytes = 0
        self.state = StreamState.DEAD
        self.end_reason = reason
        if reason == StreamEndReason.CLOSED and not self.opts.send_stream_end_on_close:
            return
        self._push(DcpStreamEnd(self.vbid, reason, self.opaque, self.stream_id).encode())

    # -- output --------------------------------------------------------------------------------
    def _push(self, data: bytes) -> None:
        self.ready.append(data)
        self.ready_bytes += len(data)

    def pop(self) -> bytes | memoryview | None:
        """The next entry to send (a message, or a message's header followed by a `memoryview`
        continuation holding its value), or None."""
        if not self.ready:
            return None
        data = self.ready.popleft()
        self.ready_bytes -= len(data)
        return data.data if data.__class__ is Frames else data

    def _marker(self, start: int, end: int, flags: int, purge_seqno: int, mvs: int | None = None,
                hcs: int = 0) -> None:
        """`mvs`: the snapshot's max visible seqno when not its end; `hcs`: its high completed
        seqno, which a V2.0 marker carries on Disk snapshots only (snapshot-marker.md)."""
        if self._first_marker:
            start = min(self.snap_start_seqno, start)
            self._first_marker = False
        if end > self.end_seqno:
            end = self.end_seqno
        if self.state is StreamState.TAKEOVER_SEND:
            flags |= _ACK
            self.acks_outstanding += 1
        self._marker_end = end
        opts = self.opts
        mvs = end if mvs is None else min(mvs, end)
        if not flags & _DISK:
            hcs = 0
        if opts.marker_v22 and flags & _DISK:
            msg = DcpSnapshotMarker(self.vbid, start, end, flags, MarkerVersion.V2_2, mvs, hcs, purge_seqno, 0,
                                    self.opaque, self.stream_id)
        elif opts.sync_replication:
            msg = DcpSnapshotMarker(self.vbid, start, end, flags, MarkerVersion.V2_0, mvs, hcs, 0, 0,
                                    self.opaque, self.stream_id)
        else:
            msg = DcpSnapshotMarker(self.vbid, start, end, flags, MarkerVersion.V1, opaque=self.opaque,
                                    stream_id=self.stream_id)
        self._push(msg.encode())

    def _shape_value(self, item: Item) -> tuple[bytes, int]:
        """The value and datatype to ship, per IncludeXattrs / NoValue / NoValueWithUnderlyingDatatype."""
        value, datatype = item.value, item.datatype
        opts = self.opts
        if datatype & DATATYPE_XATTR and not datatype & DATATYPE_SNAPPY:
            xlen = xattr_body_offset(value)
            if not opts.include_xattrs:
                value, datatype = value[xlen:], datatype & ~DATATYPE_XATTR
                xattrs = b""
            else:
                xattrs = value[:xlen]
        else:
            xattrs = b""
        if opts.no_value or opts.no_value_underlying_datatype or item.deleted:
            sent_type = DATATYPE_XATTR if xattrs else 0
            if opts.no_value_underlying_datatype and not item.deleted:
                sent_type = item.datatype & ~DATATYPE_SNAPPY
                if not opts.include_xattrs:
                    sent_type &= ~DATATYPE_XATTR
            return xattrs, sent_type
        return value, datatype

    def _queue_item(self, item: Item) -> None:
        """Encode one item. The common shapes (a mutation, a deletion without stream-id) go through
        the protocol's packers - the same bytes as `DcpMutation(...).encode()` /
        `DcpDeletion(...).encode()` (tested) with no message object per item; everything else
        through the message classes."""
        opts = self.opts
        key = item.key
        if opts.collections:
            key = self._prefixes[item.cid] + key
        deleted, datatype = item.deleted, item.datatype
        if deleted and (not datatype & DATATYPE_XATTR or datatype & DATATYPE_SNAPPY):
            value, datatype = b"", 0  # what _shape_value gives a deletion without readable xattrs
        elif datatype & DATATYPE_XATTR or opts.no_value or opts.no_value_underlying_datatype or deleted:
            value, datatype = self._shape_value(item)
        else:
            value = item.value
        if opts.compress_values and value:
            value, datatype = snappy.compress(value), datatype | DATATYPE_SNAPPY
        seqno = item.by_seqno
        sid = self.stream_id
        if not deleted:
            if sid is None or len(key) < 256:  # the alternative framing has one byte of key length
                vlen = len(value)
                if sid is None:
                    data = pack_mutation_head(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, key, vlen,
                                              item.cas, datatype, self.opaque)
                else:
                    data = pack_mutation_head_sid(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, key,
                                                  vlen, item.cas, datatype, self.opaque, sid)
                if vlen >= LARGE_VALUE:
                    # the value goes out as it is stored (no copy into the message): a continuation
                    ready = self.ready
                    ready.append(data)
                    ready.append(memoryview(value))
                    self.ready_bytes += len(data) + vlen
                    self.last_sent_seqno = seqno
                    self.items_sent += 1
                    return
                data += value
            else:
                data = DcpMutation(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, 0, key, value,
                                   item.cas, datatype, self.opaque, 0, sid).encode()
        elif item.is_expiration and opts.expiry_opcode and opts.delete_times:
            data = DcpExpiration(self.vbid, seqno, item.rev_seqno, key, item.delete_time, value, item.cas,
                                 datatype, self.opaque, sid).encode()
        elif sid is not None:
            data = DcpDeletion(self.vbid, seqno, item.rev_seqno, key, value, item.cas, datatype, self.opaque,
                               item.delete_time if opts.delete_times else None, sid).encode()
        else:
            data = pack_deletion(self.vbid, seqno, item.rev_seqno, key, value, item.cas, datatype, self.opaque,
                                 item.delete_time if opts.delete_times else None)
        self.ready.append(data)
        self.ready_bytes += len(data)
        self.last_sent_seqno = seqno
        self.items_sent += 1

    def _queue_one(self, item: Item) -> None:
        """An admitted item (`_admit`): a system event, a sync-write item, or a document (a commit
        is one for a stream without sync writes)."""
        if item.cid == SYSTEM_CID:
            self._queue_event(item)
        elif item.__class__ is not Item and self.opts.sync_writes:
            self._queue_sync_item(item)
        else:
            self._queue_item(item)

    def _queue_sync_item(self, item: Item) -> None:
        """DCP_PREPARE, DCP_COMMIT or DCP_ABORT (prepare.md, commit.md, abort.md)."""
        cls = item.__class__
        key = item.key
        if self.opts.collections:
            key = self._prefixes[item.cid] + key
        seqno = item.by_seqno
        if cls is Prepare:
            value, datatype = self._shape_value(item) if item.deleted or item.datatype & DATATYPE_XATTR else (
                item.value, item.datatype)
            msg = DcpPrepare(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, 0, key, value, item.cas,
                             item.level, item.deleted, datatype, self.opaque, 0, self.stream_id)
        elif cls is Commit:
            if not self._prepare_was_sent(item.prepared_seqno, seqno):
                self._queue_item(item)  # the consumer never got the prepare: send what it committed
                return
            msg = DcpCommit(self.vbid, item.prepared_seqno, seqno, key, self.opaque, self.stream_id)
        elif cls is Abort:
            msg = DcpAbort(self.vbid, item.prepared_seqno, seqno, key, self.opaque, self.stream_id)
        else:
            self._queue_item(item)
            return
        self._push(msg.encode())
        self.last_sent_seqno = seqno
        self.items_sent += 1

    def _prepare_was_sent(self, prepared_seqno: int, seqno: int) -> bool:
        """Did the consumer get the prepare a commit at `seqno` names? A backfill sends the prepares
        in flight when it was planned, so a prepare of its range completed before that, by a commit
        beyond the range (read from memory), was never sent: that commit goes out as the committed
        mutation or deletion (KV-Engine's backfill reads such prepares from disk; our store keeps
        only committed versions) - and an abort as an abort, which a consumer accepts without its
        prepare (VBucket.apply_abort). Such a completion precedes the plan, so a backfill's entry
        is dropped once the stream reads past the high seqno it was planned at."""
        backfilled = self._backfilled
        while backfilled and backfilled[0][3] < seqno:
            backfilled.pop(0)
        for start, end, sent, _ in backfilled:
            if start <= prepared_seqno <= end:
                return prepared_seqno in sent
        return True

    def _queue_event(self, item: Item) -> None:
        """DCP_SYSTEM_EVENT (system_event.md) in the layout the connection asked for."""
        ev = SystemEvent.of(item)
        c = ev.collection
        version, key, value = event_body(
            ev.event, flatbuffers=self.opts.flatbuffers_events, manifest_uid=ev.manifest_uid, scope_id=ev.scope_id,
            collection_id=c.uid if c else 0, name=c.name if c else ev.scope_name, max_ttl=c.max_ttl if c else 0,
            history=c.history if c else False)
        self._push(DcpSystemEvent(self.vbid, item.by_seqno, int(ev.event), version, key, value, self.opaque,
                                  self.stream_id).encode())
        self.last_sent_seqno = item.by_seqno
        self.items_sent += 1

    def _admit(self, items: list[Item]) -> list[Item]:
        """What the stream's filter sends of these items (filter.py), in order; the filter follows
        their system events. Stops after the event that leaves the filter empty."""
        flt = self.filter
        out = []
        for item in items:
            cid = item.cid
            if cid == SYSTEM_CID:
                ev = flt.event(item)
                if ev is not None and (ev.event != SystemEventId.MODIFY_COLLECTION or self.opts.flatbuffers_events):
                    out.append(item)
                if flt.empty:
                    self._emptied = True
                    break
            elif flt.allows(cid):
                out.append(item)
        return out

    def _queue_items(self, items: list[Item], sync: bool = False) -> None:
        """`_queue_one` for each admitted item, with runs of plain mutations encoded by the
        protocol's `encode_mutations` into one Frames entry (the in-memory hot loop: compiled when
        built, one bytes object per run, not per item)."""
        opts = self.opts
        if self.stream_id is not None or opts.no_value or opts.no_value_underlying_datatype or \
                opts.compress_values or sync:
            for item in items:
                self._queue_one(item)
            return
        vbid, opaque, collections = self.vbid, self.opaque, opts.collections
        i, n = 0, len(items)
        while i < n:
            data, stop = encode_mutations(items, i, vbid, opaque, collections, LARGE_VALUE)
            if stop > i:
                self.ready.append(Frames(data, stop - i))
                self.ready_bytes += len(data)
                self.items_sent += stop - i
                self.last_sent_seqno = items[stop - 1].by_seqno
            if stop < n:  # a deletion, xattrs, a large value, an event: the general path
                self._queue_one(items[stop])
                stop += 1
            i = stop

    def _seqno_advanced_if_needed(self) -> None:
        """A collection-aware consumer learns the snapshot end it did not see an item for."""
        if self.opts.collections and self.last_sent_seqno < self._marker_end and not self.dead:
            self._push(DcpSeqnoAdvanced(self.vbid, self._marker_end, self.opaque, self.stream_id).encode())
            self.last_sent_seqno = self._marker_end

    # -- backfill (pages handed in by the owner) -------------------------------------------------
    def backfill_begin(self, purge_seqno: int) -> None:
        """The scan is open: queue the Disk|Checkpoint marker for the whole backfill range."""
        rng = self.backfill
        self.backfill_running = True
        self._backfills += 1
        self._marker(rng.start, rng.end, _DISK | _CHK | (_HISTORY | _MAY_DUPLICATE if rng.history else 0), purge_seqno,
                     hcs=self.vb.persisted_hcs)

    def _prepares_before(self, seqno: int) -> None:
        """Queue the backfill's in-flight prepares below `seqno`, keeping the snapshot in seqno order."""
        pending = self._backfill_prepares
        while pending and pending[0].by_seqno < seqno:
            self._queue_sync_item(pending.pop(0))

    def backfill_page(self, items: list[Item]) -> None:
        if self.dead:
            return
        end = self.end_seqno
        skip_deletes = self.opts.skip_deletes_in_initial_backfill and self._initial_backfill
        last = items[-1].by_seqno if items else 0
        items = self._admit(items)
        for item in items:
            if item.by_seqno > end:
                break
            if self._backfill_prepares:
                self._prepares_before(item.by_seqno)
            if skip_deletes and item.deleted and item.cid != SYSTEM_CID:
                continue
            self._queue_one(item)
            self.backfill_items += 1
        if last:
            self.last_read_seqno = min(last, end)
        if self.ready_bytes > self.peak_ready_bytes:
            self.peak_ready_bytes = self.ready_bytes
        if self._emptied:
            self._end(StreamEndReason.FILTER_EMPTY)

    def backfill_rows(self, rows: list[tuple]) -> None:
        """A page of raw store rows (`BackfillScan.next_rows`): plain mutations are encoded
        straight from the row - no Item is built - everything else via `backfill_page`."""
        opts = self.opts
        if opts.no_value or opts.no_value_underlying_datatype or opts.compress_values or self._backfill_prepares:
            self.backfill_page([item_from_row(r) for r in rows])
            return
        if self.dead:
            return
        end, vbid, opaque = self.end_seqno, self.vbid, self.opaque
        prefixed = opts.collections
        allows, prefixes = self.filter.allows, self._prefixes
        append = self.ready.append
        sid, system = self.stream_id, SYSTEM_CID
        # with a stream-id, the alternative framing's one byte of key length: longer keys (none
        # is: 250 bytes and a prefix) take the general path
        pack = pack_mutation_head if sid is None else functools.partial(pack_mutation_head_sid, stream_id=sid)
        short_keys = sid is not None
        u64, xattr, large = _U64, DATATYPE_XATTR, LARGE_VALUE  # locals: this loop runs per row
        nbytes = count = 0
        last = self.last_sent_seqno
        for r in rows:
            seqno = r[1]
            if seqno > end:
                break
            datatype = r[6]
            cid = r[11]
            if cid != system and not allows(cid):  # a document the filter hides (as _admit does)
                continue
            # an event, a deletion, a shaped value, or a key too long for the stream-id framing
            if cid == system or r[7] or datatype & xattr or (short_keys and len(r[0]) > 250):
                if nbytes:
                    self.ready_bytes += nbytes
                    self.items_sent += count
                    self.backfill_items += count
                    nbytes = count = 0
                self.last_sent_seqno = last
                self.backfill_page([item_from_row(r)])
                last = self.last_sent_seqno
                if self.dead:  # the filter was left empty
                    return
                continue
            key, value = r[0], r[10]
            if prefixed:
                key = prefixes[cid] + key
            vlen = len(value)
            data = pack(vbid, seqno, r[2] & u64, r[4], r[5], key, vlen, r[3] & u64, datatype, opaque)
            if vlen >= large:
                append(data)
                append(memoryview(value))
                nbytes += len(data) + vlen
            else:
                data += value
                append(data)
                nbytes += len(data)
            count += 1
            last = seqno
        self.ready_bytes += nbytes
        self.items_sent += count
        self.backfill_items += count
        self.last_sent_seqno = last
        if rows:
            self.last_read_seqno = min(rows[-1][1], end)
        if self.ready_bytes > self.peak_ready_bytes:
            self.peak_ready_bytes = self.ready_bytes

    @property
    def takes_encoded_pages(self) -> bool:
        """Does the stream send stored mutations - the default collection's - as they are
        (`BackfillScan.next_chunk`)?"""
        opts = self.opts
        return (self.stream_id is None and not opts.no_value and not opts.no_value_underlying_datatype
                and not opts.compress_values and self.filter.default
                and not (self.backfill is not None and self.backfill.history) and not self._backfill_prepares)

    def backfill_encoded(self, page: EncodedPage) -> None:
        """A page SQLite encoded for this stream (opaque, key layout): queued as it is."""
        if page.last_seqno > self.end_seqno:
            raise ValueError(f"encoded page ends at {page.last_seqno}, past the stream's end {self.end_seqno}")
        self.ready.append(Frames(page.data, page.count))
        self.ready_bytes += len(page.data)
        self.items_sent += page.count
        self.backfill_items += page.count
        self.last_sent_seqno = self.last_read_seqno = page.last_seqno
        if self.ready_bytes > self.peak_ready_bytes:
            self.peak_ready_bytes = self.ready_bytes

    def backfill_complete(self) -> None:
        """The scan reached the end of the range: continue from memory, or end the stream."""
        rng = self.backfill
        self.backfill = None
        self.backfill_running = False
        self._initial_backfill = False
        if rng is None:
            return
        if self._backfill_prepares and not self.dead:
            self._prepares_before(rng.end + 1)
        self.last_read_seqno = rng.end
        self._seqno_advanced_if_needed()
        if self.disk_only or rng.end >= self.end_seqno:
            self._end(StreamEndReason.OK)
        elif self.cursor is None or self.cursor.dropped:
            self._recover_from_drop()
        else:
            self.state = StreamState.IN_MEMORY
        self._wake(self)

    def backfill_failed(self) -> None:
        self.set_dead(StreamEndReason.BACKFILL_FAIL)

    # -- memory --------------------------------------------------------------------------------
    def _recover_from_drop(self) -> None:
        """The cursor was dropped: backfill from where we are. Only an opted-in stream's cursor is
        droppable for memory, so SLOW is a safety net for a cursor lost some other way."""
        self.cursor = None
        self.cursor_dropped = False
        if not self.opts.supports_cursor_dropping:
            self._end(StreamEndReason.SLOW)
            return
        self._register_cursor(self.last_read_seqno)

    def fill(self, max_bytes: int, max_items: int = 512) -> bool:
        """Queue messages from the checkpoints while fewer than `max_bytes` are queued; True if
        anything was queued or the state changed."""
        state = self.state
        if state is StreamState.BACKFILLING or state is StreamState.DEAD or state is StreamState.TAKEOVER_WAIT:
            return False
        if self.cursor_dropped or self.cursor is None or self.cursor.dropped:
            if self.backfill is None:
                self._recover_from_drop()
                return True
            return False
        progressed = False
        while self.ready_bytes < max_bytes and not self.dead:
            try:
                snaps = self.cursor.next_batch(max_items)
            except CursorDropped:
                self._recover_from_drop()
                return True
            if not snaps:
                return self._caught_up() or progressed
            progressed = True
            for snap in snaps:
                if self._queue_snapshot(snap):
                    return True
        return progressed

    def _queue_snapshot(self, snap: Snapshot) -> bool:
        """Queue one cursor Snapshot; True if the stream ended (its end seqno, or FILTER_EMPTY)."""
        items = snap.items
        end = self.end_seqno
        past_end = items[-1].by_seqno > end
        if past_end:
            items = [it for it in items if it.by_seqno <= end]
        hidden = False
        mvs = None
        sync = snap.sync and self.opts.sync_writes  # commits go out as DCP_COMMIT, one by one
        if snap.sync:
            mvs = snap.visible_end
            if not sync:  # prepares and aborts are not for this stream: its snapshot ends where readers see
                visible = [it for it in items if not is_sync_item(it)]
                hidden = len(visible) < len(items)
                items = visible
        if snap.duplicates and not self.opts.change_streams:
            items = _latest_versions(items)
            hidden = True
        if items and (snap.others or not self.filter.default):
            admitted = self._admit(items)
            hidden = hidden or len(admitted) < len(items)
            items = admitted
        read_upto = snap.items[-1].by_seqno  # not cursor.seqno: a batch may hold several snapshots
        if items or (hidden and snap.new_marker and self.opts.collections and read_upto >= snap.end):
            if snap.new_marker:
                if snap.type == CheckpointType.DISK:
                    flags, start = _DISK, snap.checkpoint_snap_start
                else:
                    flags = _MEMORY
                    start = snap.start if snap.checkpoint_start or not items else items[0].by_seqno
                if snap.checkpoint_start:
                    flags |= _CHK
                if snap.history and self.opts.change_streams:
                    flags |= _HISTORY | _MAY_DUPLICATE if snap.duplicates else _HISTORY
                if mvs is not None and not sync and mvs >= start:
                    self._marker(start, mvs, flags, self.vb.purge_seqno)  # a V2.0 marker's end is its MVS
                else:
                    self._marker(start, snap.end, flags, self.vb.purge_seqno, mvs)
            self._queue_items(items, sync)
            self.memory_items += len(items)
        self.last_read_seqno = min(read_upto, end)
        if self._emptied:
            self._end(StreamEndReason.FILTER_EMPTY)
            return True
        if past_end or read_upto >= end:
            self._seqno_advanced_if_needed()
            self._end(StreamEndReason.OK)
            return True
        if hidden and read_upto >= snap.end:
            self._seqno_advanced_if_needed()  # the snapshot ended on what the filter hid
        return False

    def _caught_up(self) -> bool:
        """Nothing more in memory right now: a takeover stream moves towards the vbucket switch."""
        if not self.takeover:
            return False
        if self.state is StreamState.IN_MEMORY:
            # Caught up: takeover-send. With no Ack outstanding, go on at once (a consumer that was
            # already caught up gets SET_VBUCKET_STATE(pending) now, not at the next write).
            self.state = StreamState.TAKEOVER_SEND
        if self.state is StreamState.TAKEOVER_SEND and self.acks_outstanding == 0:
            if self.vb.state != VBucketState.DEAD:
                self._send_vbucket_state(VBucketState.PENDING)
            else:
                self._send_vbucket_state(VBucketState.ACTIVE)
            return True
        return False

    # -- takeover ------------------------------------------------------------------------------
    def _send_vbucket_state(self, state: VBucketState) -> None:
        self.state = StreamState.TAKEOVER_WAIT
        self.takeover_waiting_for = state
        self._push(DcpSetVbucketState(self.vbid, int(state), self.opaque).encode())

    def snapshot_acked(self) -> None:
        """The consumer answered a marker with the Ack flag."""
        if self.acks_outstanding:
            self.acks_outstanding -= 1
            self._wake(self)

    def vbucket_state_acked(self) -> None:
        """The consumer answered our SET_VBUCKET_STATE."""
        waiting = self.takeover_waiting_for
        if self.state is not StreamState.TAKEOVER_WAIT or waiting is None:
            return
        self.takeover_waiting_for = None
        if waiting == VBucketState.PENDING:
            self.state = StreamState.TAKEOVER_SEND
            if self._set_vbucket_state is not None:
                self._set_vbucket_state(self.vbid, VBucketState.DEAD)
        else:
            self._end(StreamEndReason.OK)
        self._wake(self)

    @property
    def takeover_active(self) -> bool:
        """In the takeover handshake: the vbucket state changes it causes must not end it."""
        return self.takeover and self.state in (StreamState.TAKEOVER_SEND, StreamState.TAKEOVER_WAIT)

    # -- stats ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, int | str]:
        return {
            "opaque": self.opaque,
            "flags": self.flags,
            "state": self.state.value,
            "start_seqno": self.start_seqno,
            "end_seqno": self.end_seqno,
            "snap_start_seqno": self.snap_start_seqno,
            "last_sent_seqno": self.last_sent_seqno,
            "last_read_seqno": self.last_read_seqno,
            "items_sent": self.items_sent,
            "backfill_items": self.backfill_items,
            "memory_items": self.memory_items,
            "ready_queue_bytes": self.ready_bytes,
            "ready_queue_peak_bytes": self.peak_ready_bytes,
            "cursor_drops": self.cursor_drops,
            "backfills": self._backfills,
            **self.filter.stats(),
        }
