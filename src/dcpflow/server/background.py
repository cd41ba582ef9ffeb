"""The server's background work on its event loop: flushing, the item pager, expiry, compaction.

The engine has no timers and is owned by one thread (engine/bucket.py): this event loop. Server
(app.py, whose docstring describes each task) starts the tasks; this class runs them, and holds
what they share - the events that wake them, the flusher's two threads (a niced one, and one at
the server's own priority for batches that writers wait for) and the maintenance lock that keeps
a flush batch, compaction, run sealing and vbucket rewrites (a rollback, a failover) apart. A task
that fails backs off and says so (`failed`), once per interval when it is out of descriptors.
"""

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import logging
import os
import resource
import sqlite3
import sys
import threading
import time
import traceback

from dcpflow.engine import Bucket

log = logging.getLogger("dcpflow.server")

#: Seconds without a flush batch before the flusher seals the store's unfinished runs.
SEAL_AFTER_IDLE = 1.0
#: Vbuckets one sealing transaction covers: after a backlog the store cuts the runs it deferred
#: (store.py, "Runs") in pieces, so a flush batch never waits behind all of them.
SEAL_VBUCKETS = 16
#: Seconds between two looks at whether a bucket is over its high watermark (engine/memory.py).
PAGER_INTERVAL = 0.1
#: The history a compaction for fragmentation keeps, as a fraction of each vbucket's documents:
#: after it, fragmentation is at most about 20%, so the next one waits for new overwrites.
HISTORY_KEPT = 0.25
#: A fragmentation measure counts every stored row (Store.fragmentation): O(rows), so at a fixed
#: interval its share of a worker thread grew with the bucket (22% of one at 2.7M documents, on
#: the way to all of it at 10M). The next measure of a bucket waits this many times the CPU time
#: the last one took: at most a twentieth of a thread's CPU, whatever the size. (CPU, not wall
#: time: on a busy machine a measure of a small store waits for a core, and its wall time would
#: have put compaction off.)
FRAGMENTATION_COST_PACE = 20.0
#: The clock a measure's cost is read on: the measuring thread's CPU time (tests replace it).
fragmentation_clock = time.thread_time


def _timed_measure(store) -> tuple:
    """(store.fragmentation(), the CPU seconds it took), on the worker thread that measures."""
    t0 = fragmentation_clock()
    got = store.fragmentation()
    return got, fragmentation_clock() - t0
#: The longest a failing maintenance task waits before it tries again.
MAINTENANCE_MAX_BACKOFF = 300.0



def _lower_thread_priority(steps: int) -> None:
    """Make the calling thread `steps` nice levels nicer than it is (Linux: a thread is a task with
    its own nice value; elsewhere setpriority would change the whole process, so nothing is done).

    The flusher runs this: its SQLite work runs outside the GIL, on the cores that also run the
    event loop and the clients on this host. At equal priority the scheduler takes turns between
    them and preempts the loop in the middle of serving requests; a nicer flusher takes what CPU is
    left, and under a write storm checkpoint de-duplication absorbs what it has not written yet."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError as e:  # a sandbox may forbid it: run at the same priority
        log.warning("could not lower the flusher thread's priority: %s", e)


def out_of_files(error: BaseException) -> bool:
    """Whether `error` is the process running out of descriptors (or kernel memory for them), as
    the OS or SQLite ("unable to open database file") reports it."""
    if isinstance(error, OSError):
        return error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS)
    if isinstance(error, sqlite3.OperationalError):
        text = str(error).lower()
        return "unable to open" in text or "too many open files" in text
    return False


class Background:
    """See the module docstring. `open()` inside the event loop, before the tasks start;
    `shutdown()` once they have stopped."""

    def __init__(self, server):
        self.server = server
        self.failures = 0  # runs of maintenance tasks that failed (see periodic)
        self.stopping: asyncio.Event | None = None
        self.flusher_wake: asyncio.Event | None = None
        self.pager_wake: asyncio.Event | None = None
        self.lock: asyncio.Lock | None = None
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.urgent_executor: concurrent.futures.ThreadPoolExecutor | None = None

    def open(self, flusher_nice: int) -> None:
        self.stopping, self.flusher_wake, self.lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
        self.pager_wake = asyncio.Event()
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dcpflow-flusher",
                                                              initializer=_lower_thread_priority,
                                                              initargs=(flusher_nice,))
        # the same work at the server's own priority, for batches that writers wait for (flush_batch)
        self.urgent_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dcpflow-flusher-urgent")

    def stop(self) -> None:
        """The tasks finish what they are doing and end."""
        self.stopping.set()
        self.flusher_wake.set()
        self.pager_wake.set()

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)
        self.urgent_executor.shutdown(wait=True)

    def wake_flusher(self) -> None:
        if self.flusher_wake is not None:
            self.flusher_wake.set()

    async def sleep(self, seconds: float, event: asyncio.Event) -> bool:
        """Sleep up to `seconds` or until `event`; False once the server is stopping."""
        if self.stopping.is_set():
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)
        return not self.stopping.is_set()

    async def flusher_task(self) -> None:
        while await self.sleep(self.server.config.flush_interval, self.flusher_wake):
            self.flusher_wake.clear()
            for bucket in list(self.server.buckets.values()):
                if bucket.persistence_paused:
                    continue
                try:
                    while not bucket.persistence_paused and await self.flush_batch(bucket) \
                            and not self.stopping.is_set():
                        bucket.flushed_at = time.monotonic()
                        if bucket.engine.pager.wanted():
                            self.pager_wake.set()
                    if bucket.engine.dropped_collections and not bucket.persistence_paused:
                        await self.purge_collections(bucket)
                    if time.monotonic() - bucket.flushed_at >= SEAL_AFTER_IDLE and bucket.engine.store.unsealed():
                        await self.seal_runs(bucket)
                except Exception as e:
                    self.failed(f"flushing bucket {bucket.name}", e, self.server.config.flush_interval)

    @contextlib.asynccontextmanager
    async def maintenance(self):
        """Hold off flush batches, compaction and run sealing while the body rewrites a vbucket
        (a rollback, a failover): one of those already running finishes first."""
        async with self.lock:
            yield

    async def flush_settled(self) -> None:
        """Return once no flush batch is in flight (one already writing completes first)."""
        async with self.lock:
            pass

    def when_no_flush(self, engine: Bucket, fn):
        """fn() at once if no flush batch of `engine` is in flight, else an awaitable of fn() run
        once none is. For changes acknowledged as durable (SET_VBUCKET, a takeover's state): a
        batch being written carries the older state row, so the engine could only queue the new
        one behind it. No await between the wait and fn(): no batch can start before its writes."""
        if engine.flusher.in_flight is None:
            return fn()

        async def after_batch():
            await self.flush_settled()
            return fn()

        return after_batch()

    async def flush_batch(self, bucket) -> int:
        """Persist one batch of `bucket`: collect here, write on the flusher thread, complete here.

        The flusher thread is nicer than the server (`flusher_nice`): beside a write storm the
        loop keeps the CPU and checkpoint de-duplication absorbs what is not written yet. Under
        memory pressure that is backwards - writes are refused until the flusher has written what
        the pager may evict, the loop has nothing better to do, and on a busy host a niced thread
        gets a sliver of a core - so then the batch is written by a thread at the server's own
        priority (an unprivileged thread cannot take back the nice levels it gave up)."""
        engine = bucket.engine
        async with self.lock:
            if engine.closed:
                return 0
            batch = engine.flusher.collect(engine.flush_batch_items)
            if batch is None:
                return 0
            mem = engine.memory
            urgent = mem.num_tmp_oom != bucket.tmp_oom_seen or mem.writes_wait_for_flusher()
            bucket.tmp_oom_seen = mem.num_tmp_oom  # writes refused since the last batch: urgent too
            executor = self.urgent_executor if urgent else self.executor
            try:
                await asyncio.get_running_loop().run_in_executor(executor, engine.flusher.write, batch)
            except BaseException:
                engine.flusher.abort(batch)
                raise
            engine.flusher.complete(batch)
            return batch.num_items

    async def purge_collections(self, bucket) -> None:
        """Nothing is left to flush: delete dropped collections' documents from disk
        (Bucket.purge_dropped_collections), between flush batches."""
        engine = bucket.engine
        async with self.lock:
            if not engine.closed and engine.flusher.in_flight is None:
                engine.purge_dropped_collections()

    async def seal_runs(self, bucket) -> None:
        """The flusher has been idle for SEAL_AFTER_IDLE: make runs of the rows it left unfinished
        (store.py "Runs"), on its thread, so data at rest backfills from runs. Not at once: a
        consumer that waited for persistence is likely reading right then, and a trickle of
        writes would cut its runs small."""
        engine = bucket.engine
        async with self.lock:
            if not engine.closed:
                await asyncio.get_running_loop().run_in_executor(
                    self.executor, functools.partial(engine.store.seal_runs, max_vbuckets=SEAL_VBUCKETS))

    def wake_pager(self) -> None:
        if self.pager_wake is not None:
            self.pager_wake.set()

    async def pager_task(self) -> None:
        """Evict values of every bucket over its high watermark, a pass at a time (module docstring)."""
        while await self.sleep(PAGER_INTERVAL, self.pager_wake):
            self.pager_wake.clear()
            for bucket in list(self.server.buckets.values()):
                engine = bucket.engine
                try:
                    mem, now = engine.memory, time.monotonic()
                    if not engine.closed and mem.checkpoint >= mem.checkpoint_quota \
                            and now - bucket.recovered_at >= PAGER_INTERVAL:
                        # writes are refused (BucketMemory.refusal): a recovery walks every vbucket's
                        # checkpoints, so once an interval, not once a wake; after each flush batch
                        # the bucket recovers anyway (Bucket._after_flush)
                        bucket.recovered_at = now
                        engine.recover_checkpoint_memory()
                    while not engine.closed and engine.pager.wanted() and not self.stopping.is_set():
                        _, done = engine.evict()
                        if done:
                            break
                        await asyncio.sleep(0)  # let requests run between passes
                except Exception:
                    self.server.log.error("pager-failure", "evicting values of bucket %s failed:\n%s", bucket.name,
                                          traceback.format_exc(), keep_newlines=True)

    async def periodic(self, interval: float, fn) -> None:
        """fn() every `interval`; after a failure, the wait doubles with each one in a row (up to
        MAINTENANCE_MAX_BACKOFF, never below `interval`) and resets after a success."""
        failures = 0
        while await self.sleep(interval if not failures else
                                max(interval, min(interval * 2 ** failures, MAINTENANCE_MAX_BACKOFF)), self.stopping):
            try:
                await fn()
                failures = 0
            except Exception as e:
                failures += 1
                self.failed(fn.__name__.strip("_"), e,
                                         max(interval, min(interval * 2 ** failures, MAINTENANCE_MAX_BACKOFF)))

    def failed(self, what: str, error: Exception, retry_in: float) -> None:
        """A background task failed: out of descriptors is said in one line (once per interval, no
        traceback: it is the node's state, not a bug); anything else with its traceback, rate-limited too."""
        self.failures += 1
        if out_of_files(error):
            self.server.log.warning("maintenance-descriptors", "%s cannot open a file (%s; the descriptor limit is "
                                    "%d): retrying in %.0f s", what, error,
                                    resource.getrlimit(resource.RLIMIT_NOFILE)[0], retry_in)
        else:
            self.server.log.error("maintenance-failure", "%s failed; retrying in %.0f s:\n%s", what, retry_in,
                                  traceback.format_exc(), keep_newlines=True)

    async def run_expiry(self) -> None:
        for bucket in list(self.server.buckets.values()):
            bucket.engine.run_expiry_pager()

    async def run_compaction(self) -> None:
        for bucket in list(self.server.buckets.values()):
            await self.compact(bucket)

    async def compact(self, bucket, keep_history: float | None = None) -> None:
        """One compaction of `bucket` (Bucket.compact's steps): planned here, the store's part on
        the flusher's thread (no flush batch meanwhile), the engine's part here again."""
        engine = bucket.engine
        async with self.lock:
            if engine.closed:  # dropped meanwhile
                return
            plan = engine.compaction_plan(keep_history=keep_history)
            results = await asyncio.get_running_loop().run_in_executor(self.executor, engine.store.compact, plan)
            engine.finish_compaction(results)
        bucket.compactions += 1

    async def check_fragmentation(self) -> None:
        """Measure each bucket the flusher wrote to since the last look; compact a fragmented one."""
        threshold = self.server.config.fragmentation_threshold
        for bucket in list(self.server.buckets.values()):
            engine = bucket.engine
            bucket.fragmentation_checks += 1  # looks, measured or not (one at a time: tests wait for two)
            if engine.closed or engine.flusher.items_flushed == bucket.checked_at_items:
                continue
            if time.monotonic() < bucket.fragmentation_due:
                continue
            bucket.checked_at_items = engine.flusher.items_flushed
            bucket.fragmentation, took = await asyncio.get_running_loop().run_in_executor(
                None, _timed_measure, engine.store)
            bucket.fragmentation_measures += 1
            bucket.fragmentation_due = time.monotonic() + took * FRAGMENTATION_COST_PACE
            if bucket.fragmentation.fraction > threshold:
                await self.compact(bucket, keep_history=HISTORY_KEPT)
                bucket.fragmentation_compactions += 1
                bucket.fragmentation = await asyncio.get_running_loop().run_in_executor(
                    None, engine.store.fragmentation)
