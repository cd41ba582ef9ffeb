"""A Feed: the streams of one read (`events()` or `batches()`), over one DCP connection per node.

What it does (stream-request.md, stream-end.md, rollback.md, protocol-flow.md):

* Routes each vbucket to the node holding its active copy (cluster map), opens one DCP connection
  per node (DCP_OPEN + controls, connection.py), and pipelines STREAM_REQs from each vbucket's
  position with ActiveVbOnly, so a moved vbucket answers NOT_MY_VBUCKET instead of streaming
  from a replica. Every vbucket gets a stream request, even one whose position is at or past its
  end: only the server can say that the position is on a lost branch (rollback.md), so such a
  vbucket asks for start == end == its position (valid, and it ends at once unless the server
  answers ROLLBACK; an end below the start would be ERANGE).
* A read bounded by "now" (`end_now`) never waits past what exists: whenever its streams are
  reopened or rolled back, each end becomes min(end, the high seqno now) (`_now_ends`).
* Stream-request replies: OK -> the stream runs on the newest branch of the returned failover log;
  ROLLBACK(R) -> fetch the failover log, take the newest consistent point at or below R and the
  failover entry covering it (VbTracker.rollback_offset), then
  raise or surface it and reopen from there, per the rollback policy; NOT_MY_VBUCKET -> refresh
  the map and reopen on the right node; TMPFAIL/BUSY -> reopen after a backoff; anything else is
  an error naming the vbucket and the status.
* STREAM_END: OK finishes the vbucket; Closed finishes it when we closed it; every other reason
  reopens from where the stream stood (STATE_CHANGED after a map refresh, SLOW and BACKFILL_FAIL
  after a short backoff). A lost connection reopens all its streams on a new one, with
  exponential backoff, for up to `reconnect_timeout`.
* Dead-connection detection (dead-connections.md): a connection that delivers nothing for
  `dead_timeout` (default 2 x the noop interval + 5 s) is closed and treated as lost
  (feed_conns.py, which keeps the read's connection to each node).

What a snapshot marker, an item, a STREAM_END and a ROLLBACK do to a vbucket's position is decided
by dcpflow.dcp.position (VbTracker, stream_end, stream_request), the rules the server's replica
consumer follows too; the collections the read asks for are feed_filter.py's.

Everything the consumer must see in order - the stream bytes (connection.Segment) and notices
(a stream opened, rolled back, a connection lost) - goes through one queue. Each vbucket has two
VbTrackers: `decoded` moves as messages are decoded (it supplies the snapshot and UUID columns and
the position a stream reopens from), `consumed` replays the same steps once the application has
taken the data (it supplies the offsets the application saves). Both only move in queue order.
"""

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import defaultdict, deque
from typing import NamedTuple

from dcpflow.dcp import position
from dcpflow.dcp.position import FINISH
from dcpflow.protocol.dcp import (
    DcpCloseStream,
    DcpGetFailoverLog,
    DcpStreamRequestResponse,
    FailoverLogResponse,
    StreamEndReason,
    StreamFlag,
)
from dcpflow.protocol.kv import error_context
from dcpflow.protocol.status import Status

from .connection import Connection, Segment
from .errors import (
    ClientError,
    ConnectError,
    ConnectionLostError,
    RollbackError,
    ServerError,
    StreamError,
    status_name,
)
from .events import Rollback, StreamEnd
from .feed_conns import FeedConnections
from .feed_filter import FeedFilter
from .manifest import Filter
from .offsets import U64_MAX, Offset, VbTracker

log = logging.getLogger("dcpflow.client")

OPENING, OPEN, WAITING, DONE = range(4)
TIMEOUT = object()  # what Feed.next returns when its timeout passes
_RETRY_LATER = frozenset({Status.ETMPFAIL, Status.EBUSY, Status.ENOMEM, Status.NOT_INITIALIZED})

# Steps replayed on the `consumed` trackers: (kind, vbucket, argument).
ITEM, SNAPSHOT, ADVANCED, END_OK, OPENED, ROLLED_BACK, MANIFEST = range(7)


def _ignore_reply(frame) -> None:
    """CLOSE_STREAM of a read that is closing, or of a stream it leaves for a widened one
    (follow.py): whatever the answer, the read has moved on (the stream may have ended by itself
    meanwhile: KEY_ENOENT)."""


class Opened(NamedTuple):
    vbucket: int
    failover_log: tuple


class RolledBack(NamedTuple):
    vbucket: int
    seqno: int
    offset: Offset


class ConnLost(NamedTuple):
    conn: Connection
    error: BaseException


class NewEnd(NamedTuple):
    """A read bounded by "now" lowered a vbucket's end to what exists after a history change."""

    vbucket: int
    end: int


class FilterGone(NamedTuple):
    """Every collection of a read's filter was dropped before its stream could reopen."""

    vbucket: int


class NoActiveCopy(ServerError):
    """The map has no active node for a vbucket (failover in progress): retried."""


class SeqnosUnavailable(ServerError):
    """The high seqnos could not be read while reopening a read bounded by "now": retried."""


class VbStream:
    __slots__ = ("vbucket", "decoded", "consumed", "start", "end", "state", "conn", "closing", "failover_log",
                 "retry_since", "opens", "open_prepares", "held", "discarding")

    def __init__(self, vbucket: int, start: Offset, end: int):
        self.vbucket = vbucket
        self.start = start
        self.decoded = VbTracker(vbucket, start)
        self.consumed = VbTracker(vbucket, start)
        self.end = end
        self.state = WAITING
        self.conn: Connection | None = None
        self.closing = False
        self.failover_log: tuple = ()
        self.retry_since: float | None = None
        self.opens = 0
        # With sync writes: prepares consumed whose commit or abort was not (seqnos), and the
        # committed offset from before the first of them - the safe point while they are open:
        # resuming past a prepare would get its commit without the value it commits.
        self.open_prepares: set[int] = set()
        self.held: Offset | None = None
        # Leaving its stream for a widened one (follow.py): the rest of it is discarded up to its
        # STREAM_END, which reopens the vbucket from the drop of a filtered collection.
        self.discarding = False


def replay(streams: dict[int, VbStream], steps) -> None:
    """Apply decoded steps to the `consumed` trackers: the application has taken that data."""
    for kind, vb, arg in steps:
        tr = streams[vb].consumed
        if kind == ITEM:
            tr.item(arg)
        elif kind == SNAPSHOT:
            tr.snapshot(*arg)
        elif kind == ADVANCED:
            tr.seqno_advanced(arg)
        elif kind == END_OK:
            tr.stream_end_ok()
        elif kind == OPENED:
            tr.opened(arg)
        elif kind == MANIFEST:
            tr.saw_manifest(arg)
        else:
            tr.rolled_back(arg)


class FeedOptions(NamedTuple):
    rollback: str = "resume"  # or "raise"
    filter: Filter | None = None  # scope or collections by name (manifest.py)
    history: bool = False  # change streams: every retained version of collections with history
    ignore_purged_tombstones: bool = False
    send_purge_seqno: bool = True
    buffer_size: int = 20 * 1024 * 1024
    noop_interval: float = 20.0
    dead_timeout: float | None = None
    reconnect_timeout: float = 120.0  # 0 = forever
    max_queued_bytes: int = 0  # pause reading above this (0: 2 x buffer, at least 8 MiB)
    include_xattrs: bool = False  # documents arrive with their xattrs (a replicator copies them)
    sync_writes: bool = False  # DCP_PREPARE / COMMIT / ABORT as well as the committed versions


class Feed:
    def __init__(self, client, starts: dict[int, Offset], ends: dict[int, int], options: FeedOptions,
                 purge_seqnos: dict[int, int] | None = None, end_now: bool = False):
        if options.rollback not in ("resume", "raise"):
            raise ValueError(f"rollback policy must be 'resume' or 'raise', not {options.rollback!r}")
        self.client = client
        self.options = options
        self.streams: dict[int, VbStream] = {}
        self.ends = ends  # the reader's dict: NewEnd notices update it in queue order
        self.end_now = end_now
        for vb in sorted(starts):
            vs = VbStream(vb, starts[vb], ends.get(vb, U64_MAX))
            vs.decoded.purge_seqno = vs.consumed.purge_seqno = (purge_seqnos or {}).get(vb, 0)
            self.streams[vb] = vs
        self.name = f"dcpflow:{client.agent}:{os.urandom(6).hex()}"
        self.filter = FeedFilter(client, options.filter)  # the collections it reads (feed_filter.py)
        self._queue: deque = deque()
        self._queued_bytes = 0
        self._held: dict[Connection, int] = {}  # bytes handed to the consumer, not yet done with
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._error: BaseException | None = None
        self.closed = False
        self._done = 0
        self.stats = defaultdict(int)  # stream_end_<reason>, reconnects, rollbacks, max_queued_bytes...
        buffer = options.buffer_size
        self._high_water = options.max_queued_bytes or max(2 * buffer, 8 * 1024 * 1024)
        self._watchdog: asyncio.Task | None = None
        # With the client's shared connections (shared.py): this read's stream-id on them.
        self.shared = client.shared if client.shared is not None and not options.sync_writes else None
        self.sid = self.shared.allocate() if self.shared is not None else None
        self.links = FeedConnections(self)  # one DCP connection per node (feed_conns.py)
        self._conns = self.links.conns

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.filter.start(self._filtered_drop)
        self._watchdog = asyncio.create_task(self.links.watch())
        if self.filter.empty:
            for vs in self.streams.values():  # ids all dropped since they were resolved: nothing to read
                self._push(FilterGone(vs.vbucket))
            return
        if self.streams:
            await self._open(list(self.streams.values()))

    @property
    def finished(self) -> bool:
        return self._done == len(self.streams)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        watchdog = [self._watchdog] if self._watchdog else []
        for task in list(self._tasks) + list(self.links.connecting.values()) + watchdog:
            task.cancel()
        # On a shared connection the window must get back what this read holds: queued, and taken
        # by the consumer but not done with (the producer counts it against every read on it).
        for item in self._queue:
            if type(item) is Segment:
                self._held[item.conn] = self._held.get(item.conn, 0) + item.charged
        self._queue.clear()
        for conn, n in self._held.items():
            if conn.sinks is not None and n > 0:
                conn.consumed(n)
        self._held.clear()
        for conn in list(self._conns.values()):
            if conn.sinks is not None:
                self._leave(conn)
            else:
                self.links.retire(conn)
                conn.close()
        self._conns.clear()
        if self.sid is not None:
            self.shared.free(self.sid)
        self._wake.set()

    def _leave(self, conn: Connection) -> None:
        """Close this read's streams on a shared connection (the others on it go on)."""
        self.shared.detach(conn, self.sid)
        if conn.lost is not None:
            return
        with conn.corked():
            for vs in self.streams.values():
                if vs.conn is conn and self._close_stream(vs):
                    vs.closing = True
        conn.flush_acks()

    def _close_stream(self, vs: VbStream) -> bool:
        """DCP_CLOSE_STREAM for an open (or opening) stream, under this read's stream-id on a
        shared connection (whatever the answer, the caller has moved on: `_ignore_reply`); False
        when there is no such stream to close."""
        conn = vs.conn
        if conn is None or conn.lost is not None or vs.state not in (OPENING, OPEN):
            return False
        sid = self.sid if conn.sinks is not None else None
        with contextlib.suppress(ConnectionLostError):  # if lost, its ConnLost notice handles the stream
            conn.request(DcpCloseStream(vs.vbucket, stream_id=sid), callback=_ignore_reply)
        return True

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake.set()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self.closed:
            exc = task.exception()
            self._fail(exc if isinstance(exc, ClientError) else ClientError(f"internal error: {exc!r}"))

    # -- the queue ---------------------------------------------------------------------------
    def _push(self, item) -> None:
        self._queue.append(item)
        self._wake.set()

    def on_segment(self, seg: Segment) -> None:
        if self.closed:
            return
        self._queue.append(seg)
        self._queued_bytes += seg.charged
        if self._queued_bytes > self.stats["max_queued_bytes"]:
            self.stats["max_queued_bytes"] = self._queued_bytes
        if self._queued_bytes > self._high_water:
            for conn in self._conns.values():
                conn.pause_reading(self.sid)
        self._wake.set()

    async def next(self, timeout: float | None = None):
        """The next Segment or notice, None once every stream is done, or TIMEOUT if `timeout`
        seconds pass first. Raises the feed's error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._error is not None:
                raise self._error
            if self._queue:
                item = self._queue.popleft()
                if type(item) is Segment:
                    self._held[item.conn] = self._held.get(item.conn, 0) + item.charged
                    self._queued_bytes -= item.charged
                    if self._queued_bytes < self._high_water // 2:
                        for conn in self._conns.values():
                            conn.resume_reading(self.sid)
                    if self.filter.follow is not None:
                        seg = self.filter.follow.rewrite(item)
                        if seg is None:  # nothing of it is the read's
                            self.done_with(item)
                            continue
                        item = seg
                return item
            if self.finished or self.closed:
                return None
            for conn in self._conns.values():  # idle: let the producer fill the window again
                conn.flush_acks()
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return TIMEOUT
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)

    def outstanding(self) -> int:
        """The most stream bytes any connection ever held unacknowledged (the flow-control bound
        says: at most the buffer size plus one message)."""
        live = max((c.max_outstanding for c in self._conns.values()), default=0)
        return max(live, self.stats["max_outstanding_bytes"])

    def peek_ready(self) -> bool:
        return bool(self._queue) or self._error is not None

    def done_with(self, seg: Segment) -> None:
        """The consumer has finished with a segment: count it toward the flow-control acks."""
        if self.closed:
            return  # close() acknowledged what the read held
        self._held[seg.conn] -= seg.charged
        seg.conn.consumed(seg.charged)

    # -- notices (consumer side, in queue order) -----------------------------------------------
    def handle_notice(self, notice, steps: list):
        """Apply a notice to the decoded trackers; record its replay step; return the application
        event it causes, if any."""
        t = type(notice)
        if t is Opened:
            vs = self.streams[notice.vbucket]
            vs.decoded.opened(notice.failover_log)
            steps.append((OPENED, notice.vbucket, notice.failover_log))
            return None
        if t is RolledBack:
            vs = self.streams[notice.vbucket]
            vs.decoded.rolled_back(notice.offset)
            steps.append((ROLLED_BACK, notice.vbucket, notice.offset))
            return Rollback(notice.vbucket, notice.seqno, notice.offset)
        if t is ConnLost:
            self._connection_lost(notice.conn, notice.error)
            return None
        if t is NewEnd:
            self.ends[notice.vbucket] = notice.end
            return None
        if t is FilterGone:
            vs = self.streams[notice.vbucket]
            if vs.state == DONE:
                return None
            vs.state = DONE
            self._done += 1
            self.stats["vbuckets_filter_gone"] += 1
            return StreamEnd(notice.vbucket, StreamEndReason.FILTER_EMPTY, vs.decoded.committed)
        raise TypeError(f"unknown notice {notice!r}")

    def stream_end(self, vbucket: int, reason: int, steps: list):
        """STREAM_END for a vbucket (stream-end.md): finish, or reopen from where it stood."""
        vs = self.streams.get(vbucket)
        with contextlib.suppress(ValueError):
            reason = StreamEndReason(reason)
        name = reason.name if isinstance(reason, StreamEndReason) else str(reason)
        self.stats[f"stream_end_{name.lower()}"] += 1
        if vs is None or vs.state == DONE:
            return None
        follow = self.filter.follow
        if vs.discarding or (reason == StreamEndReason.FILTER_EMPTY and follow is not None):
            # Leaving for a widened stream (follow.py), or a widened stream's scope is gone: reopen
            # from the position the read has, which is at most the drop of a filtered collection.
            vs.discarding = False
            self.filter.widen(vbucket, scope_gone=reason == StreamEndReason.FILTER_EMPTY)
            follow.reset(vbucket)
            log.info("vbucket %d: a filtered collection was dropped; following its name from seqno %d",
                     vbucket, vs.decoded.position.seqno)
            self._reopen([vs], remap=position.stream_end(reason).remap, delay=0.0)
            return None
        if reason == StreamEndReason.FILTER_EMPTY and self.filter.resolved is not None:
            # The filter's collections are gone from this vbucket: the manifest says which are
            # left (finish if none, reopen with the rest). A stream without a filter cannot be
            # emptied, so there the reason is handled like any other end (reopen).
            vs.state = WAITING
            vs.conn = None
            self._spawn(self._refilter(vs))
            return None
        action, remap, delay = position.stream_end(reason, closed_by_us=vs.closing)
        if action == FINISH:
            if reason == StreamEndReason.OK:
                vs.decoded.stream_end_ok()
                steps.append((END_OK, vbucket, None))
            vs.state = DONE
            self._done += 1
            return StreamEnd(vbucket, reason, vs.decoded.committed)
        log.info("vbucket %d: stream ended with %s; reopening from seqno %d", vbucket, name,
                 vs.decoded.position.seqno)
        self._reopen([vs], remap=remap, delay=delay)
        return None

    def _connection_lost(self, conn: Connection, error: BaseException) -> None:
        lost = [vs for vs in self.streams.values() if vs.conn is conn and vs.state != DONE]
        for vs in lost:
            if vs.discarding:  # its stream is gone with the connection: reopen it widened
                vs.discarding = False
                self.filter.follow.reset(vs.vbucket)
        self.stats["connections_lost"] += 1
        if lost:
            log.warning("%s: %s; reopening %d stream(s)", conn.label, error, len(lost))
            self._reopen(lost, remap=True, delay=0.0)

    # -- opening streams -----------------------------------------------------------------------
    def _reopen(self, streams: list[VbStream], *, remap: bool, delay: float) -> None:
        for vs in streams:
            vs.state = WAITING
            vs.conn = None
        self._spawn(self._reopen_task(streams, remap, delay))

    async def _reopen_task(self, streams: list[VbStream], remap: bool, delay: float) -> None:
        started = time.monotonic()
        backoff = 0.05
        if delay:
            await asyncio.sleep(delay)
        while not self.closed:
            todo = [vs for vs in streams if vs.state == WAITING]
            if not todo:
                return
            try:
                if remap:
                    await self.client.refresh_map()
                await self.filter.prepare_reopen()
                self._set_ends(await self._now_ends(todo))
                await self._open(todo)
                self.stats["reopens"] += 1
                return
            except (ConnectError, ConnectionLostError, NoActiveCopy, SeqnosUnavailable, TimeoutError, OSError) as e:
                limit = self.options.reconnect_timeout
                if limit and time.monotonic() - started > limit:
                    vbs = ", ".join(str(vs.vbucket) for vs in todo[:8]) + ("..." if len(todo) > 8 else "")
                    raise ConnectionLostError(f"vbuckets {vbs}: could not reopen their streams within {limit:g}s "
                                              f"(last error: {e})") from None
                log.info("reopen of %d stream(s) failed (%s); retrying in %.2fs", len(todo), e, backoff)
                remap = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _open(self, streams: list[VbStream]) -> None:
        by_node: dict[tuple[str, int], list[VbStream]] = defaultdict(list)
        for vs in streams:
            address = self.client.node_for_vbucket(vs.vbucket)
            if address is None:
                raise NoActiveCopy(f"vbucket {vs.vbucket} has no active copy in the cluster map")
            by_node[address].append(vs)
        conns = await asyncio.gather(*(self.links.get(a) for a in by_node))
        for conn, group in zip(conns, by_node.values(), strict=True):
            for vs in group:
                if vs.state == WAITING:
                    self._request(vs, conn)

    async def _now_ends(self, streams: list[VbStream]) -> dict[int, int]:
        """For a read bounded by "now": the ends to lower to the high seqno that exists now.

        The end was the high seqno when the read started. After a history change (kill -9 with
        unpersisted writes, failover) seqnos up to it may be gone: waiting for them would hang on
        an idle bucket, or deliver documents written after the read started. So the end becomes
        min(end, high seqno now). An explicit end is the caller's and is kept (DcpClient.events)."""
        if not self.end_now:
            return {}
        try:
            highs = await self.client.high_seqnos([vs.vbucket for vs in streams])
        except ServerError as e:
            raise SeqnosUnavailable(str(e), e.status) from None
        return {vs.vbucket: highs[vs.vbucket] for vs in streams
                if vs.vbucket in highs and highs[vs.vbucket] < vs.end}

    def _set_ends(self, ends: dict[int, int]) -> None:
        for vb, end in ends.items():
            vs = self.streams[vb]
            if end < vs.end:
                log.info("vbucket %d: end lowered from %d to the high seqno %d (read bounded by 'now')",
                         vb, vs.end, end)
                vs.end = end
                self._push(NewEnd(vb, end))

    def on_conn_lost(self, conn: Connection, error: BaseException | None) -> None:
        self.links.retire(conn)
        if error is None or self.closed:
            return
        self.links.forget(conn)
        self._push(ConnLost(conn, error))

    def _request(self, vs: VbStream, conn: Connection, offset: Offset | None = None) -> None:
        pos = offset if offset is not None else vs.decoded.position
        flags = StreamFlag.ACTIVE_VB_ONLY
        if self.options.ignore_purged_tombstones:
            flags |= StreamFlag.IGNORE_PURGED_TOMBSTONES
        value = b""
        body: dict = {}
        purge = vs.decoded.purge_seqno
        if conn.collections:
            if self.options.send_purge_seqno and purge:
                body["purge_seqno"] = str(purge)
            body.update(self.filter.request_body(vs.vbucket))
            if pos.manifest_uid is not None:
                body["uid"] = format(pos.manifest_uid, "x")  # resumption: the events seen up to pos
        if conn.sinks is not None:
            body["sid"] = self.sid  # a shared connection: this read's stream-id (shared.py)
        if body:
            value = json.dumps(body).encode()
        req = position.stream_request(vs.vbucket, pos, vs.end, int(flags), value)
        vs.state = OPENING
        vs.conn = conn
        vs.opens += 1
        with contextlib.suppress(ConnectionLostError):  # if lost, its ConnLost notice reopens the stream
            conn.request(req, callback=lambda frame: self._on_reply(vs, conn, pos, frame))

    def _retry(self, vs: VbStream, reason: str, *, remap: bool, delay: float) -> None:
        now = time.monotonic()
        if vs.retry_since is None:
            vs.retry_since = now
        limit = self.options.reconnect_timeout
        if limit and now - vs.retry_since > limit:
            self._fail(StreamError(f"vbucket {vs.vbucket}: {reason} for more than {limit:g}s; giving up",
                                   vs.vbucket))
            return
        self._reopen([vs], remap=remap, delay=delay)

    def _on_reply(self, vs: VbStream, conn: Connection, pos: Offset, frame) -> None:
        if frame is None or self.closed or vs.conn is not conn:
            return  # connection lost: its ConnLost notice reopens the stream
        status = frame.status
        vb = vs.vbucket
        if status == Status.SUCCESS:
            resp = DcpStreamRequestResponse.from_frame(frame)
            vs.state = OPEN
            vs.failover_log = resp.failover_log
            vs.retry_since = None
            self._push(Opened(vb, resp.failover_log))
            return
        if status == Status.ROLLBACK:
            seqno = DcpStreamRequestResponse.from_frame(frame).rollback_seqno
            vs.state = WAITING
            self.stats["rollbacks"] += 1
            self._spawn(self._rollback(vs, conn, seqno))
            return
        if status == Status.NOT_MY_VBUCKET:
            self._retry(vs, "NOT_MY_VBUCKET", remap=True, delay=0.05)
            return
        if status in _RETRY_LATER:
            self._retry(vs, status_name(status), remap=False, delay=0.2)
            return
        if status in (Status.UNKNOWN_COLLECTION, Status.UNKNOWN_SCOPE) and self.filter.resolved is not None:
            vs.state = WAITING
            self._spawn(self._refilter(vs))  # dropped since we resolved the names: follow what is left
            return
        ctx = error_context(frame)
        what = {
            Status.ERANGE: (f"the server refused start seqno {pos.seqno} (snapshot {pos.snapshot_start}.."
                            f"{pos.snapshot_end}, end {vs.end}): the offset is beyond the server's data or its "
                            f"snapshot range is invalid"),
            Status.KEY_EEXISTS: "a stream for this vbucket is already open on the connection",
            Status.EACCESS: "this user may not stream the vbucket (needs the DCP reader role)",
            Status.NOT_SUPPORTED: "the server does not support this stream request",
        }.get(status, "stream request failed")
        self._fail(StreamError(f"vbucket {vb}: {what} ({status_name(status)}{': ' + ctx if ctx else ''})", vb,
                               status))

    async def _rollback(self, vs: VbStream, conn: Connection, seqno: int) -> None:
        try:
            reply = await conn.call(DcpGetFailoverLog(vs.vbucket), timeout=30)
        except (ConnectionLostError, TimeoutError):
            return  # ConnLost reopens the stream; the server will tell us to roll back again
        if reply.status != Status.SUCCESS:
            self._retry(vs, f"DCP_GET_FAILOVER_LOG {status_name(reply.status)}", remap=True, delay=0.1)
            return
        offset = vs.decoded.rollback_offset(FailoverLogResponse.from_frame(reply).entries, seqno)
        if self.options.rollback == "raise":
            self._fail(RollbackError(vs.vbucket, offset.seqno, offset))
            return
        try:
            ends = await self._now_ends([vs])
        except (SeqnosUnavailable, ConnectError, ConnectionLostError, TimeoutError, OSError) as e:
            self._retry(vs, f"high seqno after ROLLBACK: {e}", remap=True, delay=0.1)
            return  # the server will tell us to roll back again
        log.warning("vbucket %d: server asked to roll back to seqno %d; resuming from %s", vs.vbucket, seqno,
                    tuple(offset))
        self._push(RolledBack(vs.vbucket, offset.seqno, offset))
        self._set_ends(ends)
        if conn.lost is None and vs.state == WAITING:
            self._request(vs, conn, offset)

    # -- collections ---------------------------------------------------------------------------
    async def _refilter(self, vs: VbStream) -> None:
        """A stream request met UNKNOWN_COLLECTION/SCOPE: resolve again; reopen with what is left,
        or finish the vbucket (FILTER_EMPTY) if nothing is. A read by names widens the vbucket
        instead (follow.py): the names may come back."""
        flt = self.filter
        if flt.follow is not None:
            flt.widen(vs.vbucket, scope_gone=True)
            self._reopen([vs], remap=False, delay=0.0)
            return
        try:
            flt.resolved = await flt.resolve()
        except (ConnectError, ConnectionLostError, ServerError, TimeoutError) as e:
            self._retry(vs, f"collections manifest: {e}", remap=True, delay=0.1)
            return
        if flt.empty:
            self._push(FilterGone(vs.vbucket))
            return
        self._reopen([vs], remap=False, delay=0.0)

    def _filtered_drop(self, vbucket: int) -> None:
        """follow.py saw the drop of a filtered collection in `vbucket`: close its stream (its
        STREAM_END then reopens it widened; the messages up to it are discarded)."""
        vs = self.streams[vbucket]
        vs.discarding = True
        self._close_stream(vs)
