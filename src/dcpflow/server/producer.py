"""DcpProducer: one DCP connection that streams vbuckets to a consumer.

Pages: docs/dcp/documentation/commands/open-connection.md, control.md, stream-request.md,
stream-request-value.md, close-stream.md, failover-log.md, buffer-ack.md, no-op.md; the overview
pages flow-control.md, dead-connections.md, rebalance.md; TABLES.md 5.1-5.5, 5.9 and 7; the
"Behaviour a re-implementer could easily miss" list and errata 12, 13, 17, 36-38 of
reference/README.md.

DCP_OPEN turns a connection into a producer (`conn.dcp`). Each STREAM_REQ that passes the
checks (stream-id, vbucket, noop-mandatory, duplicate stream, ERANGE, THE rollback decision of
engine/failover.py) gets an ActiveStream (dcp/active_stream.py), which queues encoded messages. The
producer moves them to the socket:

* Scheduling - `_step` runs from the event loop (`call_soon`) whenever a stream may have work: a
  write to its vbucket (bucket seqno listener), a backfill page, a BUFFER_ACK, a drained socket
  (`on_resume`), a takeover reply. It takes messages round-robin from the streams with work and
  writes them in one batch - after the replies already queued in the connection's Writer, so
  order is kept - as one buffer, or with one `writelines` when large values travel uncopied
  (dcp/active_stream.py, LARGE_VALUE); at most `set_priority`'s batch per pass, then it yields to the
  loop so reads (acks, new requests) and other connections are served.
* Flow control (flow-control.md, TABLES.md 5.9) - every message but a noop is charged its wire
  size (its encoded length) as it is written; the producer writes while unacknowledged bytes are
  below `connection_buffer_size`, so at most the buffer plus one message is ever outstanding.
  BUFFER_ACK subtracts (any opaque, erratum 38) and gets no reply. Size 0 disables it.
* Backfill - a stream that needs disk runs a `Store.scan` page by page on the server's backfill
  thread pool (SQLite never runs on the loop). Queued backfills open in groups: one trip to a
  worker opens up to OPEN_GROUP scans with their first pages (`_open_group`; a small vbucket is
  read whole), up to BACKFILL_OPENS trips in the whole server; later pages are read one at a time
  in the whole server (`_continue_backfill`), and only once the stream's ready queue is below
  `BACKFILL_QUEUE_BYTES`, so a million-item backfill holds about one page plus that queue. Plain mutations come as pages
  SQLite encoded (`BackfillScan.next_chunk`), queued as one `Frames` entry each and split at the
  flow-control window. `backfill_order` sequential runs one backfill at a time, round-robin all
  of them.
* Noop (erratum 37) - with `enable_noop`, a DCP_NOOP goes out every noop interval while none is
  outstanding, whatever else is sent; the connection is closed when nothing at all has been
  received from the consumer for `dcp_idle_timeout` (360 s by default).
* Replies from the consumer (`conn.response_handler`): noop replies, acks of markers with the Ack
  flag and of SET_VBUCKET_STATE (takeover). Error replies NOT_MY_VBUCKET, STREAM_NOT_FOUND and
  OPAQUE_NO_MATCH (and KEY_EEXISTS/KEY_ENOENT unless `v7_dcp_status_codes`) are tolerated; any
  other error status closes the connection (reference/README.md).
* Cursor dropping - only the streams of a connection that sent `supports_cursor_dropping` before
  requesting them have droppable checkpoint cursors (recommended-apis.md: the client opts in);
  a dropped cursor sends the stream back to disk. Other streams hold their checkpoints however
  slow the consumer is.
* Stream ends - vbucket state change (STATE_CHANGED, except the takeover stream that causes it),
  rollback (ROLLBACK), tombstones purged past the stream's position before its backfill scan
  opened (ROLLBACK, `_purged_under`), privileges lost by re-authentication (LOST_PRIVILEGES),
  server shutdown (DISCONNECTED), a failed scan (BACKFILL_FAIL).
"""

import asyncio
import concurrent.futures
import itertools
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from dcpflow.dcp.active_stream import MAX_SEQNO, ActiveStream, Frames, StreamOptions
from dcpflow.engine.errors import EngineError
from dcpflow.engine.store import EncodedPage
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol.dcp import OpenFlag, StreamEndReason, StreamFlag, VBucketState
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .auth import Privilege
from .dispatch import command

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("dcpflow.server.dcp")

#: Producer noop period until the consumer sets one (TABLES.md 7, dcp_noop_tx_interval).
DEFAULT_NOOP_INTERVAL = 0.1
#: Lower bound of set_noop_interval (connection_manager_interval).
MIN_NOOP_INTERVAL = 0.1
#: Disconnect after this long without receiving anything (dcp_idle_timeout), when noop is enabled.
DEFAULT_IDLE_TIMEOUT = 360.0
#: set_priority -> messages per event-loop pass. kv_engine's 50/5/1 per pass of a C++ worker,
#: scaled by 100 because one pass here costs a loop callback and a send() call; the ratio is kept.
PRIORITY_BATCH = {"high": 5000, "medium": 500, "low": 100}
#: Bytes written per pass at most, whatever the priority (other connections get the loop).
MAX_PASS_BYTES = 1 << 20
#: Transport write-buffer high-water mark for producer connections (asyncio's default is 64 KiB).
WRITE_BUFFER_HIGH = 1024 * 1024
#: A stream's ready queue is refilled from its cursor below this many bytes.
STREAM_QUEUE_BYTES = 256 * 1024
#: The next backfill page is read only when the stream's queue is below this (dcp_scan_byte_limit).
BACKFILL_QUEUE_BYTES = 4 * 1024 * 1024
#: All backfilling streams of a connection together stop reading beyond this (dcp_backfill_byte_limit).
BACKFILL_BYTE_LIMIT = 20 * 1024 * 1024
#: Items in the first backfill page; later pages are sized to about BACKFILL_PAGE_BYTES.
BACKFILL_PAGE_ITEMS = 512
#: The same for a stream that takes pages SQLite encodes: their values are below the store's
#: ENCODED_VALUE_LIMIT, so a page is at most ~17 MB however the documents are sized (usually well
#: under 1 MB: later pages are sized by bytes).
ENCODED_PAGE_ITEMS = 2048
BACKFILL_PAGE_BYTES = 512 * 1024
#: Concurrent backfills per connection (dcp_backfill_in_progress_per_connection_limit).
MAX_BACKFILLS = 64
#: Trips opening scans at once in the whole server (backfill_open_slots), queued on the pool's two
#: threads.
BACKFILL_OPENS = 4
#: Streams whose scans one trip to a worker thread opens (`_open_group`), the bytes of first pages
#: after which it stops opening more, and the trips of one connection in flight at once.
OPEN_GROUP = 32
OPEN_GROUP_BYTES = 4 * 1024 * 1024
OPEN_TRIPS = 2
_U32_MAX = 0xFFFFFFFF
_TOLERATED = frozenset({Status.NOT_MY_VBUCKET, Status.DCP_STREAM_NOT_FOUND, Status.OPAQUE_NO_MATCH})
_TOLERATED_LEGACY = frozenset({Status.KEY_EEXISTS, Status.KEY_ENOENT})
_cursor_ids = itertools.count(1)
# The flags as plain ints: `int & IntFlag` runs enum's __rand__ in Python (~1 us each, about
# twenty per stream request).
_O_INCLUDE_DELETED_USER_XATTRS = int(OpenFlag.INCLUDE_DELETED_USER_XATTRS)
_O_INCLUDE_DELETE_TIMES = int(OpenFlag.INCLUDE_DELETE_TIMES)
_O_INCLUDE_XATTRS = int(OpenFlag.INCLUDE_XATTRS)
_O_NO_VALUE = int(OpenFlag.NO_VALUE)
_O_NO_VALUE_WITH_UNDERLYING_DATATYPE = int(OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE)
_O_SKIP_DELETES_IN_INITIAL_BACKFILL = int(OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL)
_S_ACTIVE_VB_ONLY = int(StreamFlag.ACTIVE_VB_ONLY)
_S_DISK_ONLY = int(StreamFlag.DISK_ONLY)
_S_FROM_LATEST = int(StreamFlag.FROM_LATEST)
_S_IGNORE_PURGED_TOMBSTONES = int(StreamFlag.IGNORE_PURGED_TOMBSTONES)
_S_STRICT_VBUUID = int(StreamFlag.STRICT_VBUUID)
_S_TAKEOVER = int(StreamFlag.TAKEOVER)
_S_TO_LATEST = int(StreamFlag.TO_LATEST)
_memoryview = memoryview

#: Set by the DCP consumer module (issue 7): factory(conn, DcpOpen) -> consumer for DCP_OPEN
#: without the Producer flag. None: opening a consumer answers NOT_SUPPORTED.
consumer_factory = None


def _read_page(scan, encoded: bool, opaque: int, collections: bool) -> tuple[list, int, int]:
    """A page: (chunks, items, bytes), on a worker thread. For a stream taking encoded pages
    (plain mutations encoded by SQLite: no GIL, no object per item; see store.py) the chunks of
    about one page come in one trip, so that tombstones scattered among documents do not cost a
    trip per short run; otherwise one chunk of rows. No chunks at the end."""
    chunks: list = []
    items = nbytes = 0
    while items < scan.page_size and nbytes < BACKFILL_PAGE_BYTES:
        chunk = scan.next_chunk(opaque, collections) if encoded else scan.next_rows()
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.__class__ is EncodedPage:
            items, nbytes = items + chunk.count, nbytes + len(chunk.data)
        else:
            items, nbytes = items + len(chunk), nbytes + sum(len(r[10]) + 64 for r in chunk)
        if not encoded:
            break
    return chunks, items, nbytes


def _open_scans(store, work: list[tuple], budget: int) -> list:
    """On a worker thread: open the scan of each (vbid, start, end, encoded, opaque, collections,
    room) and read its first page when it has room - one trip, and a vbucket of a few hundred
    items is read whole (the scan closes itself after a short page). Per entry: (scan, page or
    None), the exception that opening or reading raised, or None once the pages read reach
    `budget` (not opened; the caller queues it again)."""
    out: list = []
    used = 0
    for vbid, start, end, encoded, opaque, collections, room in work:
        if used >= budget:
            out.append(None)
            continue
        scan = None
        try:
            scan = store.scan(vbid, start, end, page_size=ENCODED_PAGE_ITEMS if encoded else BACKFILL_PAGE_ITEMS)
            scan.page_bytes = BACKFILL_PAGE_BYTES  # rows of large documents: a page is bytes, not items
            page = _read_page(scan, encoded, opaque, collections) if room else None
        except Exception as e:
            if scan is not None:
                _close_quietly(scan)
            out.append(e)
            continue
        if page is not None:
            used += page[2]
        out.append((scan, page))
    return out


def _close_opened(cf: concurrent.futures.Future) -> None:
    """Done-callback of an `_open_scans` trip nobody waits for any more: close what it opened."""
    if cf.cancelled() or cf.exception() is not None:
        return
    for result in cf.result():
        if isinstance(result, tuple):
            _close_quietly(result[0])


def _close_quietly(scan) -> None:
    """Close a scan (ends its read transaction, quick), logging rather than raising."""
    if scan is not None and not scan.closed:
        try:
            scan.close()
        except Exception:
            log.exception("closing a backfill scan failed")


def backfill_executor(server) -> concurrent.futures.ThreadPoolExecutor:
    """The server's backfill thread pool (created on first use, shut down by Server.close)."""
    ex = getattr(server, "backfill_executor", None)
    if ex is None:
        ex = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="dcpflow-backfill")
        server.backfill_executor = ex
    return ex


def backfill_read_lock(server) -> asyncio.Lock:
    """One continuation page (a scan's second and later pages) read in flight in the whole server,
    whichever connection asks (FIFO, so connections take turns page by page). Concurrent reads of
    large scans cost more than they give: two at once took ~0.1 us/item more server CPU for 64
    scans of 15k items (and, with rows instead of encoded pages, 2.4 us instead of 1.4). The loop
    sends the previous page meanwhile anyway. Opening scans have their own slots
    (backfill_open_slots)."""
    lock = getattr(server, "backfill_read_lock", None)
    if lock is None:
        lock = server.backfill_read_lock = asyncio.Lock()
    return lock


def backfill_open_slots(server) -> asyncio.Semaphore:
    """Trips that open scans (`_open_group`, reading first pages) at once in the whole server,
    apart from the read lock's continuation pages. One at a time, every trip waited for the
    previous one's round trip through the worker thread and back, and the server was
    latency-bound (worker ~30% busy, loop ~40%). With BACKFILL_OPENS queued on the pool's two
    threads, a thread starts the next trip as soon as it finishes one, while the loop handles the
    pages it read (measured with a trip per scan, 1024 vbuckets x 293 documents: ~500k items/s
    with one slot per thread, ~580k with four, ~600k with eight; the CPU per item the same)."""
    slots = getattr(server, "backfill_open_slots", None)
    if slots is None:
        slots = server.backfill_open_slots = asyncio.Semaphore(BACKFILL_OPENS)
    return slots


class DcpProducer:
    """See the module docstring. One per DCP producer connection."""

    def __init__(self, conn: "Connection", name: str, flags: int):
        self.conn = conn
        self.server = conn.server
        self.name = name
        self.open_flags = int(flags)
        self.bucket = conn.bucket
        self.engine = conn.bucket.engine
        self.loop = asyncio.get_running_loop()
        self.created = time.time()
        cfg = self.server.config
        self.idle_timeout = float(getattr(cfg, "dcp_idle_timeout", DEFAULT_IDLE_TIMEOUT))
        # controls (TABLES.md 5.3)
        self.buffer_size = 0
        self.unacked = 0
        self.total_acked = 0
        self.noop_enabled = False
        self.noop_interval = DEFAULT_NOOP_INTERVAL
        self.noop_pending = False
        self.noop_opaque = itertools.count(0x10000000)
        self.last_noop = 0.0
        self.last_received = time.monotonic()
        self.priority = "medium"
        self.batch = PRIORITY_BATCH["medium"]
        self.stream_ids = False
        self.sync_writes = False
        self.consumer_name = ""
        self.expiry_opcode = False
        self.send_stream_end_on_close = False
        self.cursor_dropping = False
        self.hifi_mfu = False
        self.v7_status = False
        self.oso = ""
        self.flatbuffers_events = False
        self.marker_v22 = False
        self.backfill_order = "round-robin"
        self.include_deleted_user_xattrs = False
        # streams
        self.streams: dict[tuple[int, int | None], ActiveStream] = {}
        self._by_vb: dict[int, list[ActiveStream]] = {}
        self._draining: list[ActiveStream] = []  # dead, with a STREAM_END still to send
        self._pending: dict[ActiveStream, None] = {}  # streams that may have work (ordered set)
        self._backfill_queue: OrderedDict[ActiveStream, None] = OrderedDict()  # waiting to backfill, FIFO
        self._fed: dict[ActiveStream, None] = {}  # streams backfills handed pages to (_backfill_buffered)
        # running backfills: their task, or None while their scan opens in a group (_open_group)
        self._backfills: dict[ActiveStream, asyncio.Task | None] = {}
        self._openers: set[asyncio.Task] = set()  # the _open_group tasks
        self._trip_bytes = 0  # the budgets of the _open_group trips in flight (counted as queued)
        self.backfill_trips = 0
        self._space_waiters: list[asyncio.Future] = []
        self._read_lock = backfill_read_lock(self.server)
        self._open_slots = backfill_open_slots(self.server)
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.bytes_sent = 0
        self.items_sent = 0
        self.paused_flow_control = 0
        self.engine.add_seqno_listener(self._on_seqno)
        self.engine.add_vbucket_listener(self._on_vbucket_event)
        # A DCP stream is a bulk transfer: let the transport buffer more before pausing us, so a
        # pass of MAX_PASS_BYTES does not pause/resume the connection every time.
        conn.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        conn.response_handler = self.on_response
        conn.writer.on_resume.append(self.schedule)
        conn.on_close.append(self.disconnect)

    def __repr__(self) -> str:
        return f"<DcpProducer {self.name!r} streams={len(self.streams)}>"

    # -- options --------------------------------------------------------------------------------
    def stream_options(self) -> StreamOptions:
        f = self.open_flags
        return StreamOptions(
            include_xattrs=bool(f & _O_INCLUDE_XATTRS),
            no_value=bool(f & _O_NO_VALUE),
            no_value_underlying_datatype=bool(f & _O_NO_VALUE_WITH_UNDERLYING_DATATYPE),
            delete_times=bool(f & _O_INCLUDE_DELETE_TIMES),
            expiry_opcode=self.expiry_opcode and bool(f & _O_INCLUDE_DELETE_TIMES),
            collections=self.conn.collections,
            sync_replication=self.sync_writes and bool(self.consumer_name),
            marker_v22=self.marker_v22,
            skip_deletes_in_initial_backfill=bool(f & _O_SKIP_DELETES_IN_INITIAL_BACKFILL),
            supports_cursor_dropping=self.cursor_dropping,
            send_stream_end_on_close=self.send_stream_end_on_close,
        )

    # -- DCP_CONTROL ----------------------------------------------------------------------------
    def control(self, key: str, value: str) -> tuple[int, str]:
        """Apply one DCP_CONTROL; returns (status, reason). TABLES.md 5.3, errata 12 and 13."""
        ok = (Status.SUCCESS, "")
        true = value == "true"
        if key == "enable_noop":
            self.noop_enabled = true
            self.last_noop = time.monotonic()
            self._arm_timer()
            return ok
        if key == "set_noop_interval":
            try:
                interval = float(value)
            except ValueError:
                return Status.EINVAL, f"set_noop_interval {value!r} is not a number of seconds"
            if not interval >= MIN_NOOP_INTERVAL or interval != interval or interval == float("inf"):
                return Status.EINVAL, f"set_noop_interval must be >= {MIN_NOOP_INTERVAL} s, got {value!r}"
            self.noop_interval = interval
            self._arm_timer()
            return ok
        if key == "connection_buffer_size":
            if not value.isdigit() or int(value) > _U32_MAX:
                return Status.EINVAL, f"connection_buffer_size {value!r} is not an unsigned 32-bit number"
            self.buffer_size = int(value)
            self.schedule()
            return ok
        if key == "stream_buffer_size":
            return Status.NOT_SUPPORTED, "per-stream flow control does not exist; use connection_buffer_size"
        if key == "set_priority":
            if value not in PRIORITY_BATCH:
                return Status.EINVAL, f"set_priority must be high, medium or low, got {value!r}"
            self.priority, self.batch = value, PRIORITY_BATCH[value]
            return ok
        if key == "force_value_compression":
            return Status.EINVAL, "force_value_compression needs HELLO Snappy, which this server does not grant"
        if key in ("supports_cursor_dropping", "supports_cursor_dropping_vulcan"):
            # Streams requested from now on get droppable cursors; existing ones keep theirs (a
            # stream's options are fixed at its request, like every other stream-shaping control).
            self.cursor_dropping = true
            return ok
        if key == "supports_hifi_MFU":
            self.hifi_mfu = true
            return ok
        if key == "send_stream_end_on_client_close_stream":
            if true:
                self.send_stream_end_on_close = True
                for stream in self.streams.values():
                    stream.opts.send_stream_end_on_close = True
            return ok
        if key == "enable_expiry_opcode":
            self.expiry_opcode = true  # effective only with IncludeDeleteTimes (erratum 13)
            return ok
        if key == "enable_stream_id":
            if not true:
                return Status.EINVAL, "enable_stream_id only accepts 'true'"
            if self.sync_writes:
                return Status.NOT_SUPPORTED, "stream-ids and sync writes are mutually exclusive"
            if self.streams and not self.stream_ids:
                return Status.EINVAL, "enable_stream_id must be sent before the first stream-request"
            self.stream_ids = True
            return ok
        if key == "enable_sync_writes":
            if not true:
                return Status.EINVAL, "enable_sync_writes only accepts 'true'"
            if self.stream_ids:
                return Status.NOT_SUPPORTED, "sync writes and stream-ids are mutually exclusive"
            self.sync_writes = True
            return ok
        if key == "consumer_name":
            if not value:
                return Status.EINVAL, "consumer_name must not be empty"
            self.consumer_name = value
            return ok
        if key == "enable_out_of_order_snapshots":
            if value not in ("true", "true_with_seqno_advanced"):
                return Status.EINVAL, "enable_out_of_order_snapshots takes 'true' or 'true_with_seqno_advanced'"
            self.oso = value  # allowed, never required: every backfill here is in seqno order
            return ok
        if key == "include_deleted_user_xattrs":
            if true and self.open_flags & _O_INCLUDE_DELETED_USER_XATTRS:
                self.include_deleted_user_xattrs = True
                return ok
            return Status.EINVAL, "include_deleted_user_xattrs needs DCP_OPEN flag IncludeDeletedUserXattrs"
        if key == "v7_dcp_status_codes":
            if not true:
                return Status.EINVAL, "v7_dcp_status_codes only accepts 'true'"
            self.v7_status = True
            return ok
        if key == "flatbuffers_system_events":
            if not true:
                return Status.EINVAL, "flatbuffers_system_events only accepts 'true'"
            self.flatbuffers_events = True
            return ok
        if key == "change_streams":
            if not true:
                return Status.EINVAL, "change_streams only accepts 'true'"
            return Status.NOT_SUPPORTED, "this store keeps only the latest version of a key: no history"
        if key == "max_marker_version":
            if value != "2.2":
                return Status.EINVAL, "max_marker_version only accepts '2.2'"
            if not self.conn.collections:
                return Status.NOT_SUPPORTED, "max_marker_version=2.2 needs HELLO Collections"
            self.marker_v22 = True
            return ok
        if key == "backfill_order":
            if value not in ("round-robin", "sequential"):
                return Status.EINVAL, "backfill_order must be round-robin or sequential"
            self.backfill_order = value
            return ok
        if key == "cache_transfer":
            return Status.NOT_SUPPORTED, "cache transfer is not enabled on this server"
        return Status.EINVAL, f"unknown DCP_CONTROL key {key!r} (TABLES.md 5.3)"

    # -- STREAM_REQ -----------------------------------------------------------------------------
    def stream_request(self, req: dcpproto.DcpStreamRequest, frame: Frame) -> bytes:
        conn = self.conn
        err = conn.error_reply
        op, opaque, vbid = frame.opcode, frame.opaque, req.vbucket
        doc = {}
        if req.value:
            if not conn.collections:
                return err(op, opaque, Status.EINVAL, "a stream-request value needs HELLO Collections")
            doc = req.json
        sid = doc.get("sid")
        if self.stream_ids and sid is None:
            return err(op, opaque, Status.DCP_STREAM_ID_INVALID, "enable_stream_id is on: the value must carry 'sid'")
        if sid is not None and not self.stream_ids:
            return err(op, opaque, Status.DCP_STREAM_ID_INVALID, "'sid' needs DCP_CONTROL enable_stream_id first")
        problem = self._check_value(doc)
        if problem is not None:
            return err(op, opaque, *problem)
        vb = self.engine.get_vbucket(vbid)
        if vb is None or vb.state == VBucketState.DEAD or (
                req.flags & _S_ACTIVE_VB_ONLY and vb.state != VBucketState.ACTIVE):
            return conn.not_my_vbucket(frame)
        if (self.open_flags & _O_INCLUDE_XATTRS or conn.collections) and not self.noop_enabled:
            return err(op, opaque, Status.NOT_SUPPORTED,
                       "enable_noop is mandatory for streams with xattrs or collections")
        existing = self.streams.get((vbid, sid))
        if existing is not None and not existing.dead:
            return err(op, opaque, Status.KEY_EEXISTS, f"a stream for vbucket {vbid} already exists on this "
                       "connection" + (f" with sid {sid}" if sid is not None else ""))
        flags = int(req.flags)
        start, end, uuid = req.start_seqno, req.end_seqno, req.vbucket_uuid
        snap_start, snap_end = req.snap_start_seqno, req.snap_end_seqno
        if flags & _S_FROM_LATEST:
            start = snap_start = snap_end = vb.high_seqno
            if uuid == 0:
                uuid = vb.uuid
        if flags & _S_TO_LATEST:
            end = vb.high_seqno
        if flags & _S_TAKEOVER:
            end = MAX_SEQNO
        if flags & _S_DISK_ONLY:
            end = vb.persisted_seqno  # forced, whatever was asked (TABLES.md 5.2); ERANGE checks this end
        if vb.state == VBucketState.REPLICA and vb.snapshot_start <= end < vb.snapshot_end:
            end = vb.snapshot_end  # a replica ends at a complete snapshot
        client_purge = int(doc["purge_seqno"]) if "purge_seqno" in doc else None
        decision = self._rollback_decision(vb, flags, client_purge, start=start, end=end, uuid=uuid,
                                           snap_start=snap_start, snap_end=snap_end, purge_seqno=vb.purge_seqno)
        if decision.status == Status.ROLLBACK:
            return dcpproto.DcpStreamRequestResponse(Status.ROLLBACK, rollback_seqno=decision.rollback_seqno,
                                                     opaque=opaque).encode()
        if decision.status != Status.SUCCESS:
            return err(op, opaque, decision.status, decision.reason)
        if existing is not None:
            self._retire(existing)
        stream = ActiveStream(vb, name=f"dcp:{self.name}:{vbid}:{sid}:{next(_cursor_ids)}", opaque=opaque,
                              start_seqno=start, end_seqno=end, snap_start_seqno=snap_start, flags=flags,
                              stream_id=sid, options=self.stream_options(), client_purge_seqno=client_purge,
                              set_vbucket_state=self._set_vbucket_state, wake=self.wake)
        self.streams[(vbid, sid)] = stream
        self._by_vb.setdefault(vbid, []).append(stream)
        stream.start()
        self.wake(stream)
        return dcpproto.DcpStreamRequestResponse(Status.SUCCESS, tuple(vb.failover.entries), opaque=opaque).encode()

    @staticmethod
    def _rollback_decision(vb, flags: int, client_purge: int | None, *, start: int, end: int, uuid: int,
                           snap_start: int, snap_end: int, purge_seqno: int):
        """THE rollback decision (engine/failover.py) for a request's flags and JSON `purge_seqno`:
        taken when the stream is requested, and again when a backfill opens its scan."""
        return vb.failover.rollback_decision(
            start_seqno=start, end_seqno=end, vb_uuid=uuid, snap_start_seqno=snap_start,
            snap_end_seqno=snap_end, high_seqno=vb.high_seqno, purge_seqno=purge_seqno,
            client_purge_seqno=client_purge, strict_vb_uuid=bool(flags & _S_STRICT_VBUUID),
            ignore_purged_tombstones=bool(flags & _S_IGNORE_PURGED_TOMBSTONES))

    def _purged_under(self, stream: ActiveStream, purge_seqno: int) -> bool:
        """Must the consumer roll back to 0 because tombstones it has not seen were purged?

        The request checked the purge seqno of that moment, but the scan opens later (queued
        behind other backfills, or after a dropped cursor): a compaction in between leaves the
        purged deletions out of the disk snapshot, and the consumer would never learn of them
        (rollback.md "Wild Card 'Purge'"). So the request's purge rule is applied again with the
        scan's purge seqno, from where the backfill starts (what the consumer has by then, on the
        vbucket's current branch, so only the purge rule can ask for a rollback here)."""
        vb, pos = stream.vb, stream.backfill.start - 1
        if pos == 0 or purge_seqno <= pos:
            return False  # the purge rule cannot fire (and nothing else can from the current uuid)
        decision = self._rollback_decision(vb, stream.flags, stream.client_purge_seqno, start=pos,
                                           end=max(pos, stream.end_seqno), uuid=vb.uuid, snap_start=pos,
                                           snap_end=pos, purge_seqno=purge_seqno)
        return decision.status == Status.ROLLBACK

    def _check_value(self, doc: dict) -> tuple[int, str] | None:
        """stream-request-value.md "Validation"; only the default collection/scope (id 0) exists."""
        if "uid" in doc and not isinstance(doc["uid"], str):
            return Status.EINVAL, "'uid' must be a JSON string (the manifest uid in base 16)"
        if "collections" in doc:
            cols = doc["collections"]
            if not isinstance(cols, list):
                return Status.EINVAL, "'collections' must be a JSON array of collection ids (base 16 strings)"
            for cid in cols:
                try:
                    value = int(cid, 16) if isinstance(cid, str) else None
                except ValueError:
                    value = None
                if value is None:
                    return Status.EINVAL, f"collection id {cid!r} is not a base 16 string"
                if value != 0:
                    return Status.UNKNOWN_COLLECTION, f"unknown collection 0x{value:x}: only the default " \
                                                      "collection (0) exists"
        if "scope" in doc:
            scope = doc["scope"]
            if not isinstance(scope, str):
                return Status.EINVAL, "'scope' must be a JSON string (a scope id in base 16)"
            try:
                scope_id = int(scope, 16)
            except ValueError:
                return Status.EINVAL, f"scope id {scope!r} is not a base 16 string"
            if scope_id != 0:
                return Status.UNKNOWN_SCOPE, f"unknown scope 0x{scope_id:x}: only the default scope (0) exists"
        if "purge_seqno" in doc:
            ps = doc["purge_seqno"]
            if not isinstance(ps, str) or not ps.isdigit() or int(ps) > MAX_SEQNO:
                return Status.EINVAL, "'purge_seqno' must be a JSON string holding an unsigned 64-bit number"
        if "cts" in doc:
            cts = doc["cts"]
            if not isinstance(cts, dict):
                return Status.EINVAL, "'cts' must be a JSON object"
            fm = cts.get("free_memory", 0)
            if not isinstance(fm, int) or isinstance(fm, bool) or fm < 0:
                return Status.EINVAL, "'cts.free_memory' must be an unsigned integer"
            if not isinstance(cts.get("all_keys", False), bool):
                return Status.EINVAL, "'cts.all_keys' must be a JSON boolean"
        return None

    def _set_vbucket_state(self, vbid: int, state: VBucketState) -> None:
        self.engine.set_vbucket_state(vbid, state)
        self.server.topology.bump()

    # -- CLOSE_STREAM ---------------------------------------------------------------------------
    def close_stream(self, frame: Frame) -> bytes:
        req = dcpproto.DcpCloseStream.from_frame(frame)
        err = self.conn.error_reply
        sid = req.stream_id
        if self.stream_ids and sid is None:
            return err(frame.opcode, frame.opaque, Status.DCP_STREAM_ID_INVALID,
                       "enable_stream_id is on: CLOSE_STREAM must carry a stream-id frame")
        if sid is not None and not self.stream_ids:
            return err(frame.opcode, frame.opaque, Status.DCP_STREAM_ID_INVALID,
                       "a stream-id frame needs DCP_CONTROL enable_stream_id first")
        stream = self.streams.get((req.vbucket, sid))
        if stream is None or stream.dead:
            return err(frame.opcode, frame.opaque, Status.KEY_ENOENT, f"no stream for vbucket {req.vbucket}" +
                       (f" with sid {sid}" if sid is not None else "") + " on this connection")
        self.end_stream(stream, StreamEndReason.CLOSED)
        return response(frame.opcode, opaque=frame.opaque)

    def end_stream(self, stream: ActiveStream, reason: StreamEndReason) -> None:
        stream.set_dead(reason)
        self._retire(stream)
        self.wake(stream)

    def _retire(self, stream: ActiveStream) -> None:
        """Forget a dead stream; keep it until its STREAM_END is written."""
        key = (stream.vbid, stream.stream_id)
        if self.streams.get(key) is stream:
            del self.streams[key]
        peers = self._by_vb.get(stream.vbid)
        if peers and stream in peers:
            peers.remove(stream)
            if not peers:
                del self._by_vb[stream.vbid]
        task = self._backfills.pop(stream, None)
        if task is not None:
            task.cancel()
        self._backfill_queue.pop(stream, None)
        if stream.ready:
            self._draining.append(stream)
            self._pending[stream] = None
        else:
            self._pending.pop(stream, None)

    # -- engine notifications -------------------------------------------------------------------
    def _on_seqno(self, vbid: int, seqno: int) -> None:
        """Called inside every write to the bucket: keep it to a dict lookup when idle."""
        streams = self._by_vb.get(vbid)
        if streams:
            pending = self._pending
            for s in streams:
                pending[s] = None
            if self.buffer_size and self.unacked >= self.buffer_size:
                return  # blocked by flow control: the next BUFFER_ACK schedules us
            if not self._scheduled:
                self._scheduled = True
                self.loop.call_soon(self._step)

    def _on_vbucket_event(self, vbid: int, event: str) -> None:
        streams = self._by_vb.get(vbid)
        if not streams:
            return
        reason = StreamEndReason.ROLLBACK if event == "rollback" else StreamEndReason.STATE_CHANGED
        for stream in list(streams):
            if event == "state" and stream.takeover_active:
                continue  # the takeover stream drives this change itself
            self.end_stream(stream, reason)

    def privileges_changed(self) -> None:
        """Re-authentication or another bucket: streams without DcpProducer on this bucket end."""
        conn = self.conn
        if conn.bucket is self.bucket and conn.privileges & Privilege.DCP_PRODUCER:
            return
        for stream in list(self.streams.values()):
            self.end_stream(stream, StreamEndReason.LOST_PRIVILEGES)

    def wake(self, stream: ActiveStream | None = None) -> None:
        if stream is not None:
            self._pending[stream] = None
        self.schedule()

    def schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self.loop.call_soon(self._step)

    # -- the send loop --------------------------------------------------------------------------
    def _step(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        writer = self.conn.writer
        if writer.paused:
            return  # on_resume schedules us again
        pending = self._pending
        fc = self.buffer_size
        out: list = []
        views = False
        budget_msgs, budget_bytes = self.batch, MAX_PASS_BYTES
        msgs = sent = 0
        blocked = more = False
        while pending and not blocked and not more:
            progress = False
            for stream in list(pending):
                if stream.dead and not stream.ready:
                    self._forget(stream)
                    continue
                if blocked:  # flow control: send nothing more, but let the backfills read ahead
                    if stream.backfill is not None and not stream.backfill_running:
                        self._queue_backfill(stream)
                    continue
                if not stream.ready and not stream.fill(STREAM_QUEUE_BYTES) and not stream.ready:
                    del pending[stream]  # idle until woken
                    if stream.backfill is not None and not stream.backfill_running:
                        self._queue_backfill(stream)
                    continue
                if stream.backfill is not None and not stream.backfill_running:
                    # fill() just planned a backfill (a dropped cursor): start it now, or the stream
                    # waits in `pending` with no pass scheduled and stalls
                    self._queue_backfill(stream)
                if fc and self.unacked >= fc:
                    blocked = True
                    continue
                ready = stream.ready
                turn = 0
                while ready:
                    data = ready.popleft()
                    n = 1
                    if data.__class__ is Frames:  # a backfill page: whole messages, up to the window
                        if fc and self.unacked + len(data) > fc:
                            data, rest = data.split(fc - self.unacked)
                            if rest is not None:
                                ready.appendleft(rest)
                        n, data = data.count, data.data
                    size = len(data)
                    stream.ready_bytes -= size
                    out.append(data)
                    sent += size
                    self.unacked += size
                    if ready and ready[0].__class__ is _memoryview:
                        views = True
                        continue  # the value of this message: never split a message
                    msgs += n
                    turn += n
                    if fc and self.unacked >= fc:
                        blocked = True
                        break
                    if turn >= 256:
                        break
                if turn:
                    progress = True
                if stream.dead and not stream.ready:
                    self._forget(stream)
                if blocked:
                    continue
                if msgs >= budget_msgs or sent >= budget_bytes:
                    more = True
                    break
            if not progress:
                break
        if blocked:
            self.paused_flow_control += 1
        if not fc:
            self.unacked = 0  # flow control off: nothing is outstanding
        if sent:
            self.bytes_sent += sent
            self.items_sent += msgs
            writer.flush()  # replies queued before this pass go first
            transport = self.conn.transport
            if not transport.is_closing():
                if views or sent >= len(out) << 11:
                    # uvloop: one writev, nothing copied - large values, and backfill pages (runs of
                    # ~256 KiB: joining 1M documents of ~400 B cost the loop ~0.05 us each)
                    transport.writelines(out)
                else:
                    transport.write(b"".join(out))  # small messages: one buffer beats many iovecs
            writer.bytes_sent += sent
            self._space_freed()
        if self._backfill_queue:
            self._start_backfills()  # what this pass queued, in groups
        if more and not blocked and not writer.paused:
            self.schedule()

    def _forget(self, stream: ActiveStream) -> None:
        self._pending.pop(stream, None)
        if stream in self._draining:
            self._draining.remove(stream)
        key = (stream.vbid, stream.stream_id)
        if self.streams.get(key) is stream:
            self._retire(stream)

    # -- backfill -------------------------------------------------------------------------------
    def _queue_backfill(self, stream: ActiveStream) -> None:
        """Queue it; `_step` starts the queued backfills at the end of its pass, so the streams a
        burst of requests queued open together (`_open_group`)."""
        if stream not in self._backfills and stream not in self._backfill_queue:
            self._backfill_queue[stream] = None

    def _start_backfills(self) -> None:
        """Start queued backfills in groups (`_open_group`): at most OPEN_TRIPS trips of this
        connection in flight, and none until its backfill bytes leave room for a whole trip's
        pages (the pass that sends them calls again): a trip started at the edge of the limit
        would read one small vbucket."""
        if not self._backfill_queue or len(self._openers) >= OPEN_TRIPS:
            return
        if self._backfill_bytes() > BACKFILL_BYTE_LIMIT - OPEN_GROUP_BYTES:
            return
        limit = 1 if self.backfill_order == "sequential" else MAX_BACKFILLS
        while self._backfill_queue and len(self._openers) < OPEN_TRIPS and len(self._backfills) < limit:
            group: list[ActiveStream] = []
            while self._backfill_queue and len(group) < OPEN_GROUP and len(self._backfills) < limit:
                stream = self._backfill_queue.popitem(last=False)[0]
                if stream.dead or stream.backfill is None or stream.backfill_running:
                    continue
                stream.backfill_running = True
                self._backfills[stream] = None  # opening in a group; its own task once it reads on
                group.append(stream)
            if group:
                self._openers.add(self.loop.create_task(self._open_group(group)))

    def _backfill_buffered(self) -> int:
        """Bytes queued and not yet sent by the streams this connection's backfills fed
        (dcp_backfill_byte_limit): a finished backfill's messages count until they are written.
        Only those streams are summed, and each is forgotten once it has sent everything: summing
        every stream for every page read cost ~0.4 us per item with 1024 streams of ~300 items."""
        for s in [s for s in self._fed if not s.ready_bytes and not s.backfill_running]:
            del self._fed[s]
        return sum(s.ready_bytes for s in self._fed)

    def _backfill_bytes(self) -> int:
        """What counts against dcp_backfill_byte_limit: the bytes queued, and the budgets of the
        open trips in flight (their pages land on top)."""
        return self._backfill_buffered() + self._trip_bytes

    def _backfill_room(self, stream: ActiveStream) -> bool:
        """May the stream read another page (its queue and the connection's backfill bytes)?"""
        return stream.ready_bytes < BACKFILL_QUEUE_BYTES and self._backfill_bytes() < BACKFILL_BYTE_LIMIT

    def _drop_opening(self, stream: ActiveStream) -> bool:
        """Take the stream out of the group opening it (`_open_group`), if it is still there (not
        retired, not handed a task): it no longer counts as a running backfill."""
        if self._backfills.get(stream, 0) is not None:
            return False
        del self._backfills[stream]
        stream.backfill_running = False
        return True

    def _space_freed(self) -> None:
        """Wake the backfills waiting for room (bytes were written, or a trip's budget released)."""
        waiters, self._space_waiters = self._space_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _wait_for_space(self) -> None:
        fut = self.loop.create_future()
        self._space_waiters.append(fut)
        await fut

    def _feed(self, stream: ActiveStream, scan, page: tuple[list, int, int]) -> None:
        """Queue a page read for the stream, and size the scan's next page by what this one held."""
        chunks, count, size = page
        for chunk in chunks:
            if chunk.__class__ is EncodedPage:
                stream.backfill_encoded(chunk)
            else:
                stream.backfill_rows(chunk)
        self._fed[stream] = None
        if size:
            scan.page_size = max(1, min(8192, BACKFILL_PAGE_BYTES * count // size))

    async def _open_group(self, group: list[ActiveStream]) -> None:
        """Open the scans of several queued backfills, with their first pages, in one trip to a
        worker thread. A vbucket of a few hundred items is read whole that way, and a trip per
        stream cost the loop more than its items did (1024 vbuckets of ~1000 documents: the
        executor round trip, task and slot of each stream were a third of the loop's time).
        The trip stops opening once it has read OPEN_GROUP_BYTES; the rest wait for the next one.
        A stream whose scan has more to read goes on in `_continue_backfill`."""
        plans = []
        budget = 0
        try:
            async with self._open_slots:
                # decided here, on the loop, not in the worker; the trips in flight count as queued
                budget = max(0, min(OPEN_GROUP_BYTES, BACKFILL_BYTE_LIMIT - self._backfill_bytes()))
                self._trip_bytes += budget
                for stream in group:
                    if self._backfills.get(stream, 0) is not None:
                        continue  # retired meanwhile
                    if stream.dead or stream.backfill is None:
                        self._drop_opening(stream)
                        continue
                    plans.append((stream, stream.backfill, stream.ready_bytes < BACKFILL_QUEUE_BYTES))
                if budget <= 0:  # other trips took the room meanwhile: all of them wait for the next
                    results = [None] * len(plans)
                else:
                    work = [(stream.vbid, rng.start - 1, min(rng.end, stream.end_seqno), stream.takes_encoded_pages,
                             stream.opaque, stream.opts.collections, room) for stream, rng, room in plans]
                    cf = backfill_executor(self.server).submit(_open_scans, self.engine.store, work, budget)
                    self.backfill_trips += 1
                    try:
                        results = await asyncio.wrap_future(cf)
                    except asyncio.CancelledError:
                        cf.add_done_callback(_close_opened)  # it may be running: close what it opens
                        raise
        except asyncio.CancelledError:
            raise
        except Exception:  # the trip itself failed (the pool is shut down...)
            log.exception("opening backfills for %s failed", self.name)
            plans = results = []
            for stream in group:
                if self._drop_opening(stream) and not stream.dead:
                    self.end_stream(stream, StreamEndReason.BACKFILL_FAIL)
        finally:
            self._openers.discard(asyncio.current_task())
            self._trip_bytes -= budget  # what it read is in the streams' queues from here on
            if budget:
                self._space_freed()  # a continuation may have waited only for this reservation
        requeue = []
        for (stream, rng, _), result in zip(plans, results, strict=True):
            if result is None:  # over the trip's budget: back to the head of the queue
                if self._drop_opening(stream):
                    requeue.append(stream)
                continue
            scan = None
            try:
                if isinstance(result, BaseException):
                    raise result
                scan, page = result
                if stream.dead or self.closed or stream.backfill is not rng or \
                        self._backfills.get(stream, 0) is not None:
                    continue
                if self._purged_under(stream, scan.purge_seqno):
                    log.info("DCP %s: vbucket %d purged tombstones above %d (purge seqno %d) before its backfill "
                             "opened: STREAM_END(Rollback)", self.name, stream.vbid, rng.start - 1, scan.purge_seqno)
                    self._drop_opening(stream)
                    self.end_stream(stream, StreamEndReason.ROLLBACK)
                    continue
                stream.backfill_begin(scan.purge_seqno)
                if page is not None:
                    self._feed(stream, scan, page)
                if page is not None and (scan.closed or not page[0]):
                    self._drop_opening(stream)
                    stream.backfill_complete()  # that was the whole range
                else:
                    started: list[bool] = []
                    task = self.loop.create_task(self._continue_backfill(stream, rng, scan, started))
                    # cancelled before its first step (the stream retired meanwhile), the task never
                    # runs its own cleanup: close the scan for it
                    task.add_done_callback(lambda _, scan=scan, started=started: started or _close_quietly(scan))
                    self._backfills[stream] = task
                    scan = None  # the task owns it now
                self.wake(stream)
            except Exception as e:
                log.error("backfill of vbucket %d for %s failed", stream.vbid, self.name,
                          exc_info=(type(e), e, e.__traceback__))
                self._drop_opening(stream)
                if not stream.dead:
                    self.end_stream(stream, StreamEndReason.BACKFILL_FAIL)
            finally:
                if scan is not None and not scan.closed:
                    _close_quietly(scan)
        for stream in reversed(requeue):
            self._backfill_queue[stream] = None
            self._backfill_queue.move_to_end(stream, last=False)
        if not self.closed:
            self._start_backfills()
            self.schedule()

    async def _continue_backfill(self, stream: ActiveStream, rng, scan, started: list[bool]) -> None:
        """The later pages of an open scan, one read in flight in the whole server (read lock),
        each only when the stream and the connection have room for it. `started` says to the
        task's done-callback that this ran (and so closes the scan itself)."""
        started.append(True)
        inflight: list[asyncio.Future] = []  # the read running on a worker thread, if any
        encoded, opaque, collections = stream.takes_encoded_pages, stream.opaque, stream.opts.collections
        ex = backfill_executor(self.server)
        try:
            while True:
                async with self._read_lock:  # checked under the lock: one page at most beyond the limits
                    if stream.dead or self.closed or stream.backfill is not rng:
                        return
                    page = None
                    if self._backfill_room(stream):
                        fut = self.loop.run_in_executor(ex, _read_page, scan, encoded, opaque, collections)
                        inflight[:] = [fut]
                        page = await fut
                if page is None:
                    await self._wait_for_space()
                    continue
                if stream.dead or self.closed or stream.backfill is not rng:
                    return
                if not page[0]:
                    break
                self._feed(stream, scan, page)
                self.wake(stream)
                if scan.closed:
                    break  # that was the last page
            stream.backfill_complete()
            self.wake(stream)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("backfill of vbucket %d for %s failed", stream.vbid, self.name)
            if not stream.dead:
                self.end_stream(stream, StreamEndReason.BACKFILL_FAIL)
        finally:
            if self._backfills.get(stream) is asyncio.current_task():
                del self._backfills[stream]
            if inflight and not inflight[0].done():  # a cancelled task may leave a read running
                inflight[0].add_done_callback(lambda _: _close_quietly(scan))
            else:
                _close_quietly(scan)
            if not self.closed:
                self._start_backfills()
                self.schedule()

    # -- flow control, noop, replies ------------------------------------------------------------
    def buffer_ack(self, nbytes: int) -> None:
        self.last_received = time.monotonic()
        self.total_acked += nbytes
        self.unacked = max(0, self.unacked - nbytes)
        self.schedule()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.noop_enabled and not self.closed:
            self._timer = self.loop.call_later(self.noop_interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.closed or not self.noop_enabled:
            return
        now = time.monotonic()
        if now - self.last_received > self.idle_timeout:
            log.warning("DCP connection %s: nothing received for %.1f s (dcp_idle_timeout): disconnecting",
                        self.name, now - self.last_received)
            self.conn.close()
            return
        if not self.noop_pending and now - self.last_noop >= self.noop_interval * 0.999:
            self.noop_pending = True
            self.last_noop = now
            self.conn.writer.send(dcpproto.DcpNoop(next(self.noop_opaque)).encode())
        self._timer = self.loop.call_later(self.noop_interval, self._tick)

    def on_response(self, frame: Frame) -> None:
        """A reply from the consumer (connection.response_handler)."""
        self.last_received = time.monotonic()
        status, opcode = frame.status, frame.opcode
        if status != Status.SUCCESS:
            if status in _TOLERATED or (not self.v7_status and status in _TOLERATED_LEGACY):
                log.info("DCP %s: consumer answered %s with status 0x%x (tolerated)", self.name,
                         Opcode(opcode).name if opcode in Opcode._value2member_map_ else hex(opcode), status)
                return None
            log.warning("DCP %s: consumer answered opcode 0x%02x with status 0x%x: disconnecting", self.name,
                        opcode, status)
            self.conn.close()
            return None
        if opcode == Opcode.DCP_NOOP:
            self.noop_pending = False
        elif opcode in (Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_SET_VBUCKET_STATE):
            for stream in list(self.streams.values()):
                if stream.opaque == frame.opaque and stream.takeover:
                    if opcode == Opcode.DCP_SNAPSHOT_MARKER:
                        stream.snapshot_acked()
                    else:
                        stream.vbucket_state_acked()
                    break
        return None

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Server going away: every stream ends with DISCONNECTED, written before the close."""
        if self.closed:
            return
        for stream in list(self.streams.values()):
            stream.set_dead(StreamEndReason.DISCONNECTED)
            data = stream.pop()
            while data is not None:
                self.conn.writer.write(data)
                data = stream.pop()
            self._retire(stream)

    def disconnect(self) -> None:
        """The connection is gone: release cursors, stop backfills and timers."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in [*self._backfills.values(), *self._openers]:
            if task is not None:
                task.cancel()
        for stream in list(self.streams.values()) + self._draining:
            stream.release()
        self.streams.clear()
        self._by_vb.clear()
        self._pending.clear()
        self._draining.clear()
        # Nothing here may keep a stream: the producer and its connection refer to each other, and
        # streams they still held would wait for the cyclic collector with them.
        self._fed.clear()
        self._backfill_queue.clear()
        self._backfills.clear()
        for fut in self._space_waiters:
            fut.cancel()
        try:
            self.engine.remove_seqno_listener(self._on_seqno)
            self.engine.remove_vbucket_listener(self._on_vbucket_event)
        except ValueError:
            pass
        names = getattr(self.server, "dcp_names", None)
        if names is not None and names.get((self.bucket.name, self.name)) is self.conn:
            del names[(self.bucket.name, self.name)]

    # -- stats ----------------------------------------------------------------------------------
    def stats(self) -> dict:
        p = f"eq_dcpq:{self.name}:"
        out = {
            p + "type": "producer",
            p + "created": int(self.created),
            p + "flags": self.open_flags,
            p + "max_buffer_bytes": self.buffer_size,
            p + "unacked_bytes": self.unacked,
            p + "total_acked_bytes": self.total_acked,
            p + "total_bytes_sent": self.bytes_sent,
            p + "items_sent": self.items_sent,
            p + "num_streams": len(self.streams),
            p + "noop_enabled": int(self.noop_enabled),
            p + "noop_interval": self.noop_interval,
            p + "noop_wait": int(self.noop_pending),
            p + "priority": self.priority,
            p + "backfill_order": self.backfill_order,
            p + "cursor_dropping": int(self.cursor_dropping),
            p + "num_backfills_running": len(self._backfills),
            p + "backfill_open_trips": self.backfill_trips,
            p + "flow_control_pauses": self.paused_flow_control,
            p + "enable_stream_id": int(self.stream_ids),
            p + "sync_replication": int(self.sync_writes and bool(self.consumer_name)),
            p + "max_marker_version": "2.2" if self.marker_v22 else ("2.0" if self.sync_writes and
                                                                     self.consumer_name else "1.0"),
        }
        for (vbid, sid), stream in sorted(self.streams.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            sp = f"{p}stream_{vbid}_" if sid is None else f"{p}stream_{vbid}_sid{sid}_"
            out.update({sp + k: v for k, v in stream.stats().items()})
        return out


# ---------------------------------------------------------------------------------------------
# command handlers


def _producer(conn: "Connection", frame: Frame) -> DcpProducer:
    """The connection's producer; anything else is refused (a consumer connection is closed)."""
    p = conn.dcp
    if isinstance(p, DcpProducer):
        return p
    if p is not None:
        conn.close()  # "Disconnect: if this command is sent to a consumer endpoint"
        raise ProtocolError(f"opcode 0x{frame.opcode:02x} is not valid on a DCP consumer connection")
    raise ProtocolError("not a DCP producer connection: send DCP_OPEN with the Producer flag first",
                        Status.EINVAL)


@command(Opcode.DCP_OPEN)
def dcp_open(conn: "Connection", frame: Frame) -> bytes:
    """DCP_OPEN 0x50 (open-connection.md, TABLES.md 5.1, erratum 19)."""
    req = dcpproto.DcpOpen.from_frame(frame)
    if conn.dcp is not None:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, "this connection is already open for DCP")
    try:
        name = req.name.decode("utf-8")
    except UnicodeDecodeError:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, "the connection name must be UTF-8")
    if req.is_producer:
        if not conn.privileges & Privilege.DCP_PRODUCER:
            return conn.error_reply(frame.opcode, frame.opaque, Status.EACCESS,
                                    f"user {conn.user.name!r} lacks DcpProducer on this bucket")
    else:
        if not conn.privileges & Privilege.DCP_CONSUMER:
            return conn.error_reply(frame.opcode, frame.opaque, Status.EACCESS,
                                    f"user {conn.user.name!r} lacks DcpConsumer on this bucket")
        if consumer_factory is None:
            return conn.error_reply(frame.opcode, frame.opaque, Status.NOT_SUPPORTED,
                                    "DCP consumer connections are not available on this server")
    names = getattr(conn.server, "dcp_names", None)
    if names is None:
        names = conn.server.dcp_names = {}
    key = (conn.bucket.name, name)
    older = names.get(key)
    if older is not None and older is not conn:
        log.info("DCP connection name %r reused: disconnecting the older connection %s", name, older.peer)
        if isinstance(older.dcp, DcpProducer):
            older.dcp.shutdown()
        older.close()
    names[key] = conn
    conn.dcp = DcpProducer(conn, name, req.flags) if req.is_producer else consumer_factory(conn, req)
    conn.agent = conn.agent or name
    return response(frame.opcode, opaque=frame.opaque)


@command(Opcode.DCP_CONTROL)
def dcp_control(conn: "Connection", frame: Frame) -> bytes:
    """DCP_CONTROL 0x5e (control.md, TABLES.md 5.3)."""
    req = dcpproto.DcpControl.from_frame(frame)
    p = _producer(conn, frame)
    p.last_received = time.monotonic()
    key = req.key.decode("utf-8", "replace")
    value = req.value.decode("utf-8", "replace")
    status, reason = p.control(key, value)
    if status != Status.SUCCESS:
        return conn.error_reply(frame.opcode, frame.opaque, status, reason)
    return response(frame.opcode, opaque=frame.opaque)


@command(Opcode.DCP_STREAM_REQ, privilege=Privilege.DCP_PRODUCER)
def dcp_stream_req(conn: "Connection", frame: Frame) -> bytes:
    """DCP_STREAM_REQ 0x53 (stream-request.md, stream-request-value.md, rollback.md)."""
    p = _producer(conn, frame)
    p.last_received = time.monotonic()
    req = dcpproto.DcpStreamRequest.from_frame(frame)
    return p.stream_request(req, frame)


@command(Opcode.DCP_CLOSE_STREAM)
def dcp_close_stream(conn: "Connection", frame: Frame) -> bytes:
    """DCP_CLOSE_STREAM 0x52 (close-stream.md). Registered without a privilege because a consumer
    connection receives it too (the consumer module routes those); a producer needs DcpProducer."""
    p = _producer(conn, frame)
    if not conn.privileges & Privilege.DCP_PRODUCER:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EACCESS,
                                f"user {conn.user.name!r} lacks DcpProducer on this bucket")
    p.last_received = time.monotonic()
    return p.close_stream(frame)


@command(Opcode.DCP_GET_FAILOVER_LOG)
def dcp_get_failover_log(conn: "Connection", frame: Frame) -> bytes:
    """DCP_GET_FAILOVER_LOG 0x54 (failover-log.md): entries newest first."""
    req = dcpproto.DcpGetFailoverLog.from_frame(frame)
    if not conn.privileges & (Privilege.DCP_PRODUCER | Privilege.META_READ):
        return conn.error_reply(frame.opcode, frame.opaque, Status.EACCESS,
                                "the failover log needs DcpProducer or MetaRead on this bucket")
    if isinstance(conn.dcp, DcpProducer):
        conn.dcp.last_received = time.monotonic()
    vb = conn.get_vbucket(req.vbucket)
    if vb is None:
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {req.vbucket} is not on this node")
    return dcpproto.FailoverLogResponse(tuple(vb.failover.entries), frame.opaque).encode()


@command(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT)
def dcp_buffer_ack(conn: "Connection", frame: Frame) -> None:
    """DCP_BUFFER_ACKNOWLEDGEMENT 0x5d (buffer-ack.md): no reply on success (erratum 38: any opaque)."""
    req = dcpproto.DcpBufferAck.from_frame(frame)
    _producer(conn, frame).buffer_ack(req.bytes_acked)
    return None


@command(Opcode.DCP_NOOP)
def dcp_noop_request(conn: "Connection", frame: Frame) -> None:
    """A NOOP *request* sent to a producer: no-op.md says the producer disconnects."""
    _producer(conn, frame)
    log.warning("DCP %s: the consumer sent a DCP_NOOP request (a producer only answers replies): "
                "disconnecting", conn.dcp.name)
    conn.close()
    return None


def _dcp_stats(conn: "Connection", vbid: int | None) -> dict:
    """`stats dcp`: every DCP producer connection of the selected bucket."""
    out: dict = {}
    for other in list(conn.server.connections):
        p = other.dcp
        if isinstance(p, DcpProducer) and p.bucket is conn.bucket and not p.closed:
            out.update(p.stats())
    out["ep_dcp_count"] = sum(1 for c in conn.server.connections if isinstance(c.dcp, DcpProducer))
    return out


def _register_stats() -> None:
    from .stats import GROUPS
    GROUPS["dcp"] = _dcp_stats


_register_stats()
