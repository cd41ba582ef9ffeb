"""Which target collection a source document goes to: the one of the same scope and collection
name (goxdcr's "implicit mapping"). Collection ids are per bucket, so a source id is turned into
its names through the source's manifest, and the names into the target's id through the target's
(COLLECTIONS_GET_MANIFEST 0xba, https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md).

A document of a collection the target does not have is skipped and counted, as goxdcr does
without an explicit mapping. Manifests are read again when an id or a name is not known (a
collection created since), at most once per `refresh_interval` seconds for each side, so a stream
full of one missing collection does not ask for a manifest per document.
"""

import json
import time

from dcpflow.client.connection import RawRequest
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

DEFAULT = ("_default", "_default")


async def manifest_names(client) -> tuple[dict[int, tuple[str, str]], bool]:
    """({collection id: (scope, collection)}, whether the server knows collections at all)."""
    address = client.node_for_vbucket(0)
    conn = await client.kv_connection(address)
    if not conn.collections:
        return {0: DEFAULT}, False
    reply = await conn.call(RawRequest(Opcode.COLLECTIONS_GET_MANIFEST))
    if reply.status != Status.SUCCESS:
        return {0: DEFAULT}, False
    doc = json.loads(reply.value)
    names = {}
    for scope in doc.get("scopes", []):
        for coll in scope.get("collections", []):
            names[int(coll["uid"], 16)] = (scope["name"], coll["name"])
    names.setdefault(0, DEFAULT)
    return names, True


class CollectionMapping:
    """`target_id(source_id)` -> the target collection id, or None when the target has no
    collection of that name (after `refresh` found none)."""

    def __init__(self, source, target, refresh_interval: float = 1.0):
        self.source, self.target = source, target
        self.refresh_interval = refresh_interval
        self._source: dict[int, tuple[str, str]] = {0: DEFAULT}
        self._target: dict[tuple[str, str], int] = {DEFAULT: 0}
        self._ids: dict[int, int | None] = {0: 0}
        self._asked = 0.0

    async def refresh(self) -> None:
        self._asked = time.monotonic()
        self._source = (await manifest_names(self.source))[0]
        self._target = {names: cid for cid, names in (await manifest_names(self.target))[0].items()}
        self._ids = {0: 0}

    async def target_ids(self, source_ids: set[int]) -> dict[int, int | None]:
        """The target id of each source id (None: no such collection on the target now)."""
        if any(cid not in self._ids for cid in source_ids) and \
                time.monotonic() - self._asked >= self.refresh_interval:
            await self.refresh()
        result = {}
        for cid in source_ids:
            if cid not in self._ids:
                names = self._source.get(cid)
                found = self._target.get(names) if names is not None else None
                if found is None:
                    result[cid] = None  # not remembered: the next refresh may find it
                    continue
                self._ids[cid] = found
            result[cid] = self._ids[cid]
        return result
