"""The backfill scheduler: DCP backfills read the on-disk store on threads, never on the loop.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request.md
(a stream whose start is no longer in memory reads from disk first). dcp/backfills.py decides which
backfills open and how much they may read; this module runs the reads:

* `BackfillScheduler` - one per server (created by Server, closed by Server.close): the thread pool
  that runs SQLite, the open slots (BACKFILL_OPENS group trips at once in the whole server) and the
  read lock (one continuation page read at a time in the whole server, FIFO, so connections take
  turns page by page). Concurrent reads of large scans cost more CPU per item than they give: the
  loop sends the previous page meanwhile anyway. The open trips have slots of their own: one at a
  time, every trip would wait for the previous one's round trip through the worker, leaving both
  the worker and the loop idle part of the time; with BACKFILL_OPENS queued on the pool's two
  threads, a thread starts the next trip as soon as it finishes one, while the loop handles the
  pages it read (more throughput, the same CPU per item).
* `ConnectionBackfills` - the asyncio side of one producer connection's backfills: `_open_group`
  opens the scans of a group in one trip to a worker, with their first pages (a trip per stream
  would cost the loop more in executor round trips, tasks and slots than its items do, for small
  vbuckets); a stream whose scan has more to read goes
  on in `_continue_backfill`, a page at a time and only while dcp/backfills.py says there is room.
  Plain mutations come as pages SQLite encoded (`BackfillScan.next_chunk`), queued as one entry of
  whole messages each.
"""

import asyncio
import concurrent.futures
import logging
from typing import Protocol

from dcpflow.dcp.active_stream import ActiveStream
from dcpflow.dcp.backfills import (
    BACKFILL_PAGE_BYTES,
    BACKFILL_PAGE_ITEMS,
    ENCODED_PAGE_ITEMS,
    BackfillQueue,
    next_page_size,
    opened,
    read_whole,
)
from dcpflow.dcp.producer import DcpProducer
from dcpflow.engine.store import EncodedPage
from dcpflow.engine.store_rows import VALUE
from dcpflow.protocol.dcp import StreamEndReason

log = logging.getLogger("dcpflow.server.dcp")

#: Trips opening scans at once in the whole server, queued on the pool's two threads.
BACKFILL_OPENS = 4
#: Threads reading the store for backfills.
BACKFILL_THREADS = 2


class BackfillScheduler:
    """See the module docstring. One per server."""

    def __init__(self) -> None:
        # threads start on the first submit: a server that never backfills runs none
        self.executor = concurrent.futures.ThreadPoolExecutor(BACKFILL_THREADS, thread_name_prefix="dcpflow-backfill")
        self.read_lock = asyncio.Lock()  # one continuation page read in flight in the whole server
        self.open_slots = asyncio.Semaphore(BACKFILL_OPENS)  # group trips in flight in the whole server

    def close(self) -> None:
        """Wait for the reads in flight and stop the threads (Server.close)."""
        self.executor.shutdown(wait=True)


# -- on a worker thread ---------------------------------------------------------------------------

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
            items, nbytes = items + len(chunk), nbytes + sum(len(r[VALUE]) + 64 for r in chunk)
        if not encoded:
            break
    return chunks, items, nbytes


def _open_scans(store, work: list[tuple], budget: int) -> list:
    """On a worker thread: open the scan of each (vbid, start, end, encoded, opaque, collections,
    history, room) and read its first page when it has room - one trip, and a vbucket of a few hundred
    items is read whole (the scan closes itself after a short page). Per entry: (scan, page or
    None), the exception that opening or reading raised, or None once the pages read reach
    `budget` (not opened; the caller queues it again)."""
    out: list = []
    used = 0
    for vbid, start, end, encoded, opaque, collections, history, room in work:
        if used >= budget:
            out.append(None)
            continue
        scan = None
        try:
            scan = store.scan(vbid, start, end, page_size=ENCODED_PAGE_ITEMS if encoded else BACKFILL_PAGE_ITEMS,
                              history=history)
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


# -- on the loop ------------------------------------------------------------------------------------

class BackfillOwner(Protocol):
    """What the backfills of a connection need of it (producer.ProducerShell)."""

    name: str
    engine: object  # the engine Bucket: its store is scanned
    loop: asyncio.AbstractEventLoop
    state: DcpProducer
    closed: bool

    def end_stream(self, stream: ActiveStream, reason: StreamEndReason) -> None: ...

    def backfill_failed(self, stream: ActiveStream) -> None: ...

    def wake(self, stream: ActiveStream) -> None: ...

    def schedule(self) -> None: ...


class ConnectionBackfills:
    """The backfills of one producer connection, run on the server's scheduler. See the module
    docstring."""

    def __init__(self, producer: BackfillOwner, scheduler: BackfillScheduler, queue: BackfillQueue):
        self.producer = producer
        self.scheduler = scheduler
        self.queue = queue
        self.loop = producer.loop
        self._openers: set[asyncio.Task] = set()  # the _open_group tasks
        self._space_waiters: list[asyncio.Future] = []

    def start(self) -> None:
        """Open the queued backfills in groups, as far as dcp/backfills.py allows now."""
        queue = self.queue
        for group in queue.groups(len(self._openers), self.producer.state.settings.backfill_order == "sequential"):
            self._openers.add(self.loop.create_task(self._open_group(group)))

    def cancel(self) -> None:
        """The connection is gone: stop every read (each closes its scan)."""
        for task in [*self.queue.running.values(), *self._openers]:
            if task is not None:
                task.cancel()
        for fut in self._space_waiters:
            fut.cancel()

    def space_freed(self) -> None:
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
        self.queue.fed[stream] = None
        if size:
            scan.page_size = next_page_size(count, size)

    def _fail(self, stream: ActiveStream) -> None:
        self.producer.backfill_failed(stream)

    async def _open_group(self, group: list[ActiveStream]) -> None:
        """Open the scans of several queued backfills, with their first pages, in one trip to a
        worker thread. The trip stops opening once it has read its budget; the rest wait for the
        next one."""
        producer, queue = self.producer, self.queue
        plans = []
        budget = 0
        try:
            async with self.scheduler.open_slots:
                # decided here, on the loop, not in the worker; the trips in flight count as queued
                budget = queue.reserve_trip()
                for stream in group:
                    if queue.running.get(stream, 0) is not None:
                        continue  # retired meanwhile
                    if stream.dead or stream.backfill is None:
                        queue.drop_opening(stream)
                        continue
                    plans.append((stream, stream.backfill, queue.has_queue_room(stream)))
                if budget <= 0:  # other trips took the room meanwhile: all of them wait for the next
                    results = [None] * len(plans)
                else:
                    work = [(stream.vbid, rng.start - 1, min(rng.end, stream.end_seqno), stream.takes_encoded_pages,
                             stream.opaque, stream.opts.collections, rng.history, room) for stream, rng, room in plans]
                    cf = self.scheduler.executor.submit(_open_scans, producer.engine.store, work, budget)
                    queue.trips += 1
                    try:
                        results = await asyncio.wrap_future(cf)
                    except asyncio.CancelledError:
                        cf.add_done_callback(_close_opened)  # it may be running: close what it opens
                        raise
        except asyncio.CancelledError:
            raise
        except Exception:  # the trip itself failed (the pool is shut down...)
            log.exception("opening backfills for %s failed", producer.name)
            plans = results = []
            for stream in group:
                if queue.drop_opening(stream):
                    self._fail(stream)
        finally:
            self._openers.discard(asyncio.current_task())
            queue.release_trip(budget)
            if budget:
                self.space_freed()  # a continuation may have waited only for this reservation
        requeue = []
        for (stream, rng, _), result in zip(plans, results, strict=True):
            if result is None:  # over the trip's budget: back to the head of the queue
                if queue.drop_opening(stream):
                    requeue.append(stream)
                continue
            self._opened(stream, rng, result)
        queue.requeue_first(requeue)
        if not producer.closed:
            self.start()
            producer.schedule()

    def _opened(self, stream: ActiveStream, rng, result) -> None:
        """What a group trip brought back for one stream - (its open scan, its first page or None)
        or the exception opening it raised: the stream begins its backfill, reads on in
        `_continue_backfill` or is complete already; or it ends (purged, failed)."""
        producer, queue = self.producer, self.queue
        scan = None
        try:
            if isinstance(result, BaseException):
                raise result
            scan, page = result
            if stream.dead or producer.closed or stream.backfill is not rng or not queue.is_opening(stream):
                return
            end = opened(stream, scan.purge_seqno)  # dcp/backfills.py decides
            if end is not None:
                log.info("DCP %s: vbucket %d purged tombstones above %d (purge seqno %d) before its backfill "
                         "opened: STREAM_END(%s)", producer.name, stream.vbid, rng.start - 1, scan.purge_seqno,
                         end.name)
                queue.drop_opening(stream)
                producer.end_stream(stream, end)
                return
            stream.backfill_begin(scan.purge_seqno)
            if page is not None:
                self._feed(stream, scan, page)
            if read_whole(page is not None, len(page[0]) if page is not None else 0, scan.closed):
                queue.drop_opening(stream)
                stream.backfill_complete()  # that was the whole range
            else:
                started: list[bool] = []
                task = self.loop.create_task(self._continue_backfill(stream, rng, scan, started))
                # cancelled before its first step (the stream retired meanwhile), the task never
                # runs its own cleanup: close the scan for it
                task.add_done_callback(lambda _, scan=scan, started=started: started or _close_quietly(scan))
                queue.started(stream, task)
                scan = None  # the task owns it now
            producer.wake(stream)
        except Exception as e:
            log.error("backfill of vbucket %d for %s failed", stream.vbid, producer.name,
                      exc_info=(type(e), e, e.__traceback__))
            queue.drop_opening(stream)
            self._fail(stream)
        finally:
            if scan is not None and not scan.closed:
                _close_quietly(scan)

    async def _continue_backfill(self, stream: ActiveStream, rng, scan, started: list[bool]) -> None:
        """The later pages of an open scan, one read in flight in the whole server (read lock),
        each only when the stream and the connection have room for it. `started` says to the
        task's done-callback that this ran (and so closes the scan itself)."""
        started.append(True)
        producer, queue = self.producer, self.queue
        inflight: list[asyncio.Future] = []  # the read running on a worker thread, if any
        encoded, opaque, collections = stream.takes_encoded_pages, stream.opaque, stream.opts.collections
        executor = self.scheduler.executor
        try:
            while True:
                async with self.scheduler.read_lock:  # checked under the lock: one page at most beyond the limits
                    if stream.dead or producer.closed or stream.backfill is not rng:
                        return
                    page = None
                    if queue.room(stream):
                        fut = self.loop.run_in_executor(executor, _read_page, scan, encoded, opaque, collections)
                        inflight[:] = [fut]
                        page = await fut
                if page is None:
                    await self._wait_for_space()
                    continue
                if stream.dead or producer.closed or stream.backfill is not rng:
                    return
                if not page[0]:
                    break
                self._feed(stream, scan, page)
                producer.wake(stream)
                if scan.closed:
                    break  # that was the last page
            stream.backfill_complete()
            producer.wake(stream)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("backfill of vbucket %d for %s failed", stream.vbid, producer.name)
            self._fail(stream)
        finally:
            queue.finished(stream, asyncio.current_task())
            if inflight and not inflight[0].done():  # a cancelled task may leave a read running
                inflight[0].add_done_callback(lambda _: _close_quietly(scan))
            else:
                _close_quietly(scan)
            if not producer.closed:
                self.start()
                producer.schedule()
