"""Which backfills of a producer connection open next, and how much they may read.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request.md
("Memory vs disk" of the stream request: a stream whose start is no longer in memory first reads
the range from disk) and kv_engine's configuration `dcp_scan_byte_limit`,
`dcp_backfill_byte_limit`, `dcp_backfill_in_progress_per_connection_limit`.

A backfill reads the on-disk store page by page; the server runs the reads on its backfill threads
(server/backfill.py) and this class keeps the books, so memory stays bounded however large the
vbuckets are:

* Streams that need disk wait in a FIFO queue. Queued backfills open in groups: one trip to a
  worker opens up to OPEN_GROUP scans with their first pages, at most OPEN_TRIPS trips of a
  connection in flight, each reading up to OPEN_GROUP_BYTES (its budget) - a vbucket of a few
  hundred items is read whole in that trip. `backfill_order` sequential runs one backfill at a
  time, round-robin up to MAX_BACKFILLS.
* A stream reads its next page only while its ready queue holds less than BACKFILL_QUEUE_BYTES and
  the connection's backfills together hold less than BACKFILL_BYTE_LIMIT - what the streams they
  fed have queued and not yet sent, plus the budgets of the trips in flight (their pages land on
  top). A million-item backfill so holds about one page plus its queue.

A running backfill is recorded with the caller's handle (anything with `cancel()`, such as the
task reading it), or None while its scan opens in a group trip; `retire` hands it back to be
cancelled (outcomes.StopBackfill) rather than cancelling it here.
"""

from collections import OrderedDict

from dcpflow.protocol.dcp import StreamEndReason

from .active_stream import ActiveStream
from .stream_request import purged_under

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
#: Streams whose scans one trip to a worker thread opens, the bytes of first pages after which it
#: stops opening more, and the trips of one connection in flight at once.
OPEN_GROUP = 32
OPEN_GROUP_BYTES = 4 * 1024 * 1024
OPEN_TRIPS = 2


def next_page_size(items: int, nbytes: int) -> int:
    """Items to ask for in a scan's next page, from what the last one held: about
    BACKFILL_PAGE_BYTES (rows of large documents make a page of bytes, not of items)."""
    return max(1, min(8192, BACKFILL_PAGE_BYTES * items // nbytes))


def opened(stream: ActiveStream, purge_seqno: int) -> StreamEndReason | None:
    """A backfill's scan opened with the store's `purge_seqno`: the reason to end the stream with
    instead of sending its disk snapshot (ROLLBACK: tombstones the consumer has not seen were
    purged meanwhile, stream_request.purged_under), or None to go on (`backfill_begin`)."""
    return StreamEndReason.ROLLBACK if purged_under(stream, purge_seqno) else None


def read_whole(page_read: bool, chunks: int, scan_closed: bool) -> bool:
    """Was the first page the trip read the whole range (complete the backfill now), rather than
    the start of a scan that reads on? A page with no chunks, or a scan that closed itself after
    a short page, is the end."""
    return page_read and (scan_closed or chunks == 0)


class BackfillQueue:
    """See the module docstring. One per producer connection."""

    __slots__ = ("waiting", "running", "fed", "trip_bytes", "trips")

    def __init__(self) -> None:
        self.waiting: OrderedDict[ActiveStream, None] = OrderedDict()  # to backfill, FIFO
        self.running: dict[ActiveStream, object] = {}  # stream -> its handle, None while opening in a group
        self.fed: dict[ActiveStream, None] = {}  # streams backfills handed pages to (`buffered`)
        self.trip_bytes = 0  # the budgets of the group trips in flight (counted as queued)
        self.trips = 0  # group trips made (stat backfill_open_trips)

    def want(self, stream: ActiveStream) -> None:
        """The stream needs its planned backfill: queue it unless it is queued or running."""
        if stream not in self.running and stream not in self.waiting:
            self.waiting[stream] = None

    def groups(self, trips_in_flight: int, sequential: bool) -> list[list[ActiveStream]]:
        """The groups to open now, each in one trip (marked running, handle None): at most
        OPEN_TRIPS trips in flight, and none until the connection's backfill bytes leave room for a
        whole trip's pages (the send pass that writes them asks again): a trip started at the edge
        of the limit would read one small vbucket."""
        out: list[list[ActiveStream]] = []
        if not self.waiting or trips_in_flight >= OPEN_TRIPS:
            return out
        if self.bytes() > BACKFILL_BYTE_LIMIT - OPEN_GROUP_BYTES:
            return out
        limit = 1 if sequential else MAX_BACKFILLS
        waiting, running = self.waiting, self.running
        while waiting and trips_in_flight + len(out) < OPEN_TRIPS and len(running) < limit:
            group: list[ActiveStream] = []
            while waiting and len(group) < OPEN_GROUP and len(running) < limit:
                stream = waiting.popitem(last=False)[0]
                if stream.dead or stream.backfill is None or stream.backfill_running:
                    continue
                stream.backfill_running = True
                running[stream] = None  # opening in a group; its own handle once it reads on
                group.append(stream)
            if group:
                out.append(group)
        return out

    def is_opening(self, stream: ActiveStream) -> bool:
        """Is the stream still in the group trip that opens its scan (not retired, no handle)?"""
        return self.running.get(stream, 0) is None

    def drop_opening(self, stream: ActiveStream) -> bool:
        """Take the stream out of the group opening it, if it is still there: it no longer counts
        as a running backfill."""
        if self.running.get(stream, 0) is not None:
            return False
        del self.running[stream]
        stream.backfill_running = False
        return True

    def requeue_first(self, streams: list[ActiveStream]) -> None:
        """Streams a trip could not open within its budget: back to the head of the queue, in order."""
        for stream in reversed(streams):
            self.waiting[stream] = None
            self.waiting.move_to_end(stream, last=False)

    def started(self, stream: ActiveStream, handle: object) -> None:
        """The stream's scan is open and reads on under `handle`."""
        self.running[stream] = handle

    def finished(self, stream: ActiveStream, handle: object) -> None:
        if self.running.get(stream) is handle:
            del self.running[stream]

    def retire(self, stream: ActiveStream) -> object | None:
        """The stream is gone: unqueue it; the handle of its running read, if any, for the caller
        to cancel (outcomes.StopBackfill; the handle's owner closes the scan)."""
        self.waiting.pop(stream, None)
        return self.running.pop(stream, None)

    # -- bytes -----------------------------------------------------------------------------------
    def buffered(self) -> int:
        """Bytes queued and not yet sent by the streams this connection's backfills fed
        (dcp_backfill_byte_limit): a finished backfill's messages count until they are written.
        Only those streams are summed, and each is forgotten once it has sent everything: summing
        every stream for every page read would cost time per item that grows with the number of
        streams."""
        fed = self.fed
        for s in [s for s in fed if not s.ready_bytes and not s.backfill_running]:
            del fed[s]
        return sum(s.ready_bytes for s in fed)

    def bytes(self) -> int:
        """What counts against dcp_backfill_byte_limit: the bytes queued, and the budgets of the
        trips in flight."""
        return self.buffered() + self.trip_bytes

    def room(self, stream: ActiveStream) -> bool:
        """May the stream read another page (its queue, and the connection's backfill bytes)?"""
        return stream.ready_bytes < BACKFILL_QUEUE_BYTES and self.bytes() < BACKFILL_BYTE_LIMIT

    def has_queue_room(self, stream: ActiveStream) -> bool:
        """May a trip read the stream's first page (its own queue only: the trip has a budget)?"""
        return stream.ready_bytes < BACKFILL_QUEUE_BYTES

    def reserve_trip(self) -> int:
        """A group trip starts: its budget (0: no room, the group waits for the next trip),
        counted as queued until `release_trip`."""
        budget = max(0, min(OPEN_GROUP_BYTES, BACKFILL_BYTE_LIMIT - self.bytes()))
        self.trip_bytes += budget
        return budget

    def release_trip(self, budget: int) -> None:
        """The trip is back: what it read is in the streams' queues from here on."""
        self.trip_bytes -= budget

    def clear(self) -> None:
        self.waiting.clear()
        self.running.clear()
        self.fed.clear()
