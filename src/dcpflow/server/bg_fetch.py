"""Background fetches: the reads of documents that are not in memory (evicted values, and under
full eviction whole entries), batched per bucket as kv_engine's BgFetcher batches them
(https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/stats.org, "ep_bg_fetched",
"ep_bg_num_samples").

A GET of a non-resident document waits for its store read, which runs off the event loop. One
worker-thread job per read cost a thread hand-off each way: a pipelined read-back of 3M documents
after a full eviction load ran at ~2,000 GETs/s with the event loop mostly idle, every read waiting
its turn on a busy 2-core machine. Here a bucket's fetches wait in one queue; one job reads every
key queued so far on one pooled connection (`Store.read_many`), and the keys queued while it runs
make the next batch. A key asked for twice while queued is read once.
"""

import asyncio

from dcpflow.engine.item import Item


class BgFetcher:
    """The queued store reads of one bucket's store (module docstring)."""

    __slots__ = ("_store", "_pending", "_running", "batches", "keys_read")

    def __init__(self, store):
        self._store = store
        self._pending: dict[tuple, asyncio.Future] = {}  # (vb, key) -> the future of its read
        self._running = False
        self.batches = 0  # Store.read_many calls
        self.keys_read = 0

    def fetch(self, vb: int, key) -> "asyncio.Future[Item | None]":
        """The stored version of `key` (the engine's key) of vbucket `vb`, or None, once read."""
        pending = self._pending
        fut = pending.get((vb, key))
        if fut is None:
            fut = pending[(vb, key)] = asyncio.get_running_loop().create_future()
            if not self._running:
                self._running = True
                asyncio.get_running_loop().create_task(self._run())
        return fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                keys = list(batch)
                self.batches += 1
                self.keys_read += len(keys)
                try:
                    found = await loop.run_in_executor(None, self._store.read_many, keys)
                except BaseException as e:  # every waiter gets the error (a closed store, a disk error)
                    for fut in batch.values():
                        if not fut.done():
                            fut.set_exception(e)
                    if not isinstance(e, Exception):
                        raise
                    continue
                for fut, item in zip(batch.values(), found, strict=True):
                    if not fut.done():
                        fut.set_result(item)
        finally:
            self._running = False
