"""Which target collection a source document goes to: the one of the same scope and collection
name (goxdcr's "implicit mapping"). Collection ids are per bucket, so a source id is turned into
its names through the source's manifest, and the names into the target's id through the target's
(COLLECTIONS_GET_MANIFEST 0xba, https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md).

Both manifests are read again whenever a source id is not known yet. The read is shared: callers
that need one while a read is under way wait for the next read, which starts after they asked,
so no caller decides on manifests older than its documents (two batches in flight at start-up
both see the collections made before the replication started). The answer for an id is then
kept until the next read:

* a target id: the documents go there;
* None with `names_of(id)` known: the target has no collection of that name (a *broken mapping*
  in goxdcr's words, https://github.com/couchbase/goxdcr/blob/master/parts/router.go). The
  replicator skips those documents, and records the names so that, once the target has the
  collection, the documents skipped are sent again from the source (goxdcr's backfill);
* None with no names: the source no longer has the collection (dropped since the documents were
  read), so there is nothing to route them to.

`recheck(names)` reads both manifests again and says which broken mappings the target now has.
"""

import asyncio
import logging

from dcpflow.client.manifest import DEFAULT
from dcpflow.client.with_meta import MAX_BACKOFF

log = logging.getLogger("dcpflow.xdcr")

Names = tuple[str, str]


class CollectionMapping:
    """`await target_ids(source_ids)` -> {source id: target id, or None}; see the module docstring."""

    def __init__(self, source, target):
        self.source, self.target = source, target  # DcpClients of both buckets
        self._source: dict[int, Names] = {0: (DEFAULT, DEFAULT)}
        self._target: dict[Names, int] = {(DEFAULT, DEFAULT): 0}
        self._ids: dict[int, int | None] = {0: 0}
        self._reading: asyncio.Task | None = None
        self._started = 0  # manifest reads begun
        self._finished = 0  # the newest read whose manifests are in use
        self.reads = 0  # manifest reads done (tests and logs)

    def names_of(self, source_id: int) -> Names | None:
        """(scope, collection) of a source id, as of the last manifest read."""
        return self._source.get(source_id)

    async def refresh(self) -> None:
        """Use manifests read after this call began; callers that ask together share one read."""
        wanted = self._started + 1  # the first read that begins from now on (one not running yet will)
        while self._finished < wanted:
            if self._reading is None:
                self._reading = asyncio.ensure_future(self._read())
            await self._reading

    async def _read(self) -> None:
        self._started += 1
        number = self._started
        try:
            backoff = 0.05
            while True:  # a side that is away is waited for, as the target's writes are (target.py)
                try:
                    source, target = await asyncio.gather(self.source.manifest(), self.target.manifest())
                    break
                except (ConnectionError, TimeoutError) as e:  # a refusal (ServerError) is raised
                    log.warning("collections manifest not read (%s): trying again in %.1f s", e, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            self._reading = None
        self.reads += 1
        self._source = {cid: (c.scope, c.name) for cid, c in source.collections.items()}
        self._target = {(c.scope, c.name): cid for cid, c in target.collections.items()}
        self._ids = {0: 0}
        self._finished = number

    async def target_ids(self, source_ids) -> dict[int, int | None]:
        """The target id of each source id (None: see the module docstring)."""
        if any(cid not in self._ids for cid in source_ids):
            await self.refresh()
        ids = self._ids
        for cid in source_ids:
            if cid not in ids:
                names = self._source.get(cid)
                ids[cid] = None if names is None else self._target.get(names)
        return {cid: ids[cid] for cid in source_ids}

    async def recheck(self, broken) -> list[Names]:
        """Those of the `broken` names that both buckets have now (fresh manifests)."""
        await self.refresh()
        known = set(self._source.values())
        return [n for n in broken if n in known and n in self._target]
