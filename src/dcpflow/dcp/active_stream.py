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
from collections import deque

from dcpflow.engine.checkpoint import CheckpointType, Cursor, CursorDropped, Snapshot
from dcpflow.engine.collections import SYSTEM_CID
from dcpflow.engine.durability.items import is_sync_item
from dcpflow.engine.item import Item
from dcpflow.protocol.dcp import (
    DcpSetVbucketState,
    DcpStreamEnd,
    StreamEndReason,
    StreamFlag,
    VBucketState,
)

from .filter import StreamFilter
from .outcomes import NOTHING, WAKE, WAKE_ONLY, SetVbucketState
from .stream_backfill import StreamBackfill
from .stream_messages import StreamMessages, _KeyPrefixes
from .stream_types import CHK, DISK, HISTORY, MAY_DUPLICATE, MEMORY, BackfillRange, StreamOptions, StreamState

#: Plain ints: `int & IntFlag` runs enum's Python __rand__.
_TAKEOVER, _DISK_ONLY = int(StreamFlag.TAKEOVER), int(StreamFlag.DISK_ONLY)

def _latest_versions(items: list[Item]) -> list[Item]:
    """A snapshot's items with only the last version of each key (a stream without change streams)."""
    last: dict = {}
    for i, it in enumerate(items):
        last[(it.cid, it.key)] = i
    keep = set(last.values()) if len(last) < len(items) else None
    return items if keep is None else [it for i, it in enumerate(items) if i in keep or it.cid == SYSTEM_CID]


class ActiveStream(StreamBackfill, StreamMessages):
    """One vbucket stream of a producer; see the module docstring.

    `vb` is the engine VBucket. What the stream needs done beyond queuing bytes it returns as
    outcomes (outcomes.py): the takeover handshake's `SetVbucketState`, and whether a send pass is
    wanted. When the engine drops the stream's cursor, the stream notes it (`_on_cursor_dropped`,
    the cursor's own callback) and its next `fill` goes on from disk; the connection hears of the
    drop from the engine's cursor listeners and answers with a send pass (producer.cursor_dropped).
    """

    def __init__(self, vb, *, name: str, opaque: int, start_seqno: int, end_seqno: int, snap_start_seqno: int,
                 flags: int = 0, stream_id: int | None = None, options: StreamOptions | None = None,
                 client_purge_seqno: int | None = None, filter: StreamFilter | None = None):
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

    ended = dead  # the name server/conn_handler.py's StreamHandle reads on any stream

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
        """CheckpointManager callback (memory quota): note it; the next `fill` backfills from where
        we are, or ends with SLOW (the connection is woken for it: producer.cursor_dropped)."""
        if cursor is self.cursor:
            self.cursor_dropped = True
            self.cursor_drops += 1

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
                    flags, start = DISK, snap.checkpoint_snap_start
                else:
                    flags = MEMORY
                    start = snap.start if snap.checkpoint_start or not items else items[0].by_seqno
                if snap.checkpoint_start:
                    flags |= CHK
                if snap.history and self.opts.change_streams:
                    flags |= HISTORY | MAY_DUPLICATE if snap.duplicates else HISTORY
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

    def snapshot_acked(self) -> tuple:
        """The consumer answered a marker with the Ack flag: WAKE if one was outstanding."""
        if self.acks_outstanding:
            self.acks_outstanding -= 1
            return WAKE_ONLY
        return NOTHING

    def vbucket_state_acked(self) -> tuple:
        """The consumer answered our SET_VBUCKET_STATE: after PENDING our vbucket goes dead
        (`SetVbucketState`) and what was written meanwhile drains; after ACTIVE the stream ends."""
        waiting = self.takeover_waiting_for
        if self.state is not StreamState.TAKEOVER_WAIT or waiting is None:
            return NOTHING
        self.takeover_waiting_for = None
        if waiting == VBucketState.PENDING:
            self.state = StreamState.TAKEOVER_SEND
            return (SetVbucketState(self.vbid, VBucketState.DEAD), WAKE)
        self._end(StreamEndReason.OK)
        return WAKE_ONLY

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
