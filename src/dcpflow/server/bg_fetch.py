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

A range scan's continue reads the values of the documents its snapshot holds without one
(server/range_scan.py) through the same queue, by version (`fetch_version`: the key's version
with that seqno, `Store.read_versions`), in the same batches as the GETs' reads. What it reads is
not put back into memory.
"""

import asyncio

from dcpflow.engine.item import Item


class BgFetcher:
    """The queued store reads of one bucket's store (module docstring)."""

    __slots__ = ("_store", "_pending", "_versions", "_running", "batches", "keys_read", "versions_read")

    def __init__(self, store):
        self._store = store
        self._pending: dict[tuple, asyncio.Future] = {}  # (vb, key) -> the future of its read
        self._versions: dict[tuple, asyncio.Future] = {}  # (vb, key, seqno) -> the future of its read
        self._running = False
        self.batches = 0  # store jobs (each on one pooled connection)
        self.keys_read = 0  # by key (GETs)
        self.versions_read = 0  # by version (range scans)

    def fetch(self, vb: int, key) -> "asyncio.Future[Item | None]":
        """The stored version of `key` (the engine's key) of vbucket `vb`, or None, once read."""
        return self._queue(self._pending, (vb, key))

    def fetch_version(self, vb: int, key, seqno: int) -> "asyncio.Future[Item | None]":
        """The version of `key` with `seqno` in vbucket `vb` (else the key's latest, else None: see
        `Store.read_versions`), once read."""
        return self._queue(self._versions, (vb, key, seqno))

    def _queue(self, pending: dict, what: tuple) -> asyncio.Future:
        fut = pending.get(what)
        if fut is None:
            fut = pending[what] = asyncio.get_running_loop().create_future()
            if not self._running:
                self._running = True
                asyncio.get_running_loop().create_task(self._run())
        return fut

    def _read(self, keys: list, versions: list) -> list:
        """One job's reads: the keys' latest versions, then the versions (in that order)."""
        return ((self._store.read_many(keys) if keys else [])
                + (self._store.read_versions(versions) if versions else []))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending or self._versions:
                batch, self._pending = self._pending, {}
                versions, self._versions = self._versions, {}
                self.batches += 1
                self.keys_read += len(batch)
                self.versions_read += len(versions)
                waiters = [*batch.values(), *versions.values()]
                try:
                    found = await loop.run_in_executor(None, self._read, list(batch), list(versions))
                except BaseException as e:  # every waiter gets the error (a closed store, a disk error)
                    for fut in waiters:
                        if not fut.done():
                            fut.set_exception(e)
                    if not isinstance(e, Exception):
                        raise
                    continue
                for fut, item in zip(waiters, found, strict=True):
                    if not fut.done():
                        fut.set_result(item)
        finally:
            self._running = False
