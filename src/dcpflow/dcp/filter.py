"""What one DCP stream sends of a vbucket's collections: its filter.

Page: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request-value.md
(`collections`, `scope`, `uid`); kv_engine's Collections::VB::Filter behaves as follows, and so
does this:

* a connection without HELLO Collections has a *legacy* filter: the default collection only, and
  no system events;
* a collection-aware stream without `collections` or `scope` *passes through* every collection
  and every system event;
* `collections` (ids) sends those collections and their events; `scope` (an id) sends the
  collections of the scope - those created in it later too - their events and the scope's. Each
  id must exist in the vbucket when the stream is requested (UNKNOWN_COLLECTION / UNKNOWN_SCOPE);
  `collections` and `scope` together are EINVAL;
* `uid`, the manifest uid the client last saw, makes a stream skip events the client already
  knows (those stamped with that uid or an older one); a uid above the vbucket's is refused
  (COLLECTIONS_MANIFEST_IS_AHEAD: the client saw a manifest this vbucket has not applied yet);
* once every collection of a `collections` filter is dropped, or the filtered scope is, the
  stream ends with FILTER_EMPTY after sending the drop events (`empty`).

Documents of dropped collections are never sent (`allows` asks the vbucket), though the store and,
for a while, the checkpoints still hold them.
"""

from dcpflow.engine.collections import SystemEvent
from dcpflow.protocol.dcp import SystemEventId
from dcpflow.protocol.status import Status

from .errors import Refusal

#: kv_engine's status for a client whose manifest uid is ahead of the vbucket's (memcached's
#: status.h CollectionsManifestIsAhead); not in the error map it ships, so not in Status.
COLLECTIONS_MANIFEST_IS_AHEAD = 0x8B


class StreamFilter:
    __slots__ = ("legacy", "passthrough", "collections", "scope", "scope_dropped", "uid", "vb_collections",
                 "default")

    def __init__(self, vb_collections, *, legacy: bool = False, passthrough: bool = False,
                 collections: set[int] | None = None, scope: int | None = None, uid: int | None = None):
        self.vb_collections = vb_collections  # the vbucket's VBCollections: which collections are alive
        self.legacy = legacy
        self.passthrough = passthrough
        self.collections: set[int] = collections if collections is not None else set()
        self.scope = scope
        self.scope_dropped = False
        self.uid = uid
        self.default = legacy or passthrough or 0 in self.collections  # default collection's documents

    @classmethod
    def build(cls, doc: dict | None, vb_collections) -> "StreamFilter | Refusal":
        """The filter of a stream request's JSON value (None: a connection without collections);
        the value's types were checked by stream_request.check_value."""
        if doc is None:
            return cls(vb_collections, legacy=True, collections={0})
        uid = int(doc["uid"], 16) if "uid" in doc else None
        if uid is not None and uid > vb_collections.uid:
            return Refusal(COLLECTIONS_MANIFEST_IS_AHEAD, f"the client's manifest uid {uid:x} is ahead of the "
                                                          f"vbucket's {vb_collections.uid:x}")
        if "scope" in doc:
            sid = int(doc["scope"], 16)
            if sid not in vb_collections.scopes:
                return Refusal(Status.UNKNOWN_SCOPE, f"unknown scope 0x{sid:x}")
            members = {cid for cid, s in vb_collections.scope_of.items() if s == sid}
            return cls(vb_collections, collections=members, scope=sid, uid=uid)
        if "collections" in doc:
            cids = {int(c, 16) for c in doc["collections"]}
            for cid in sorted(cids):
                if cid not in vb_collections:
                    return Refusal(Status.UNKNOWN_COLLECTION, f"unknown collection 0x{cid:x}")
            return cls(vb_collections, collections=cids, uid=uid)
        return cls(vb_collections, passthrough=True, uid=uid)

    @property
    def empty(self) -> bool:
        """Nothing this stream could send any more (FILTER_EMPTY)."""
        if self.passthrough or self.legacy:
            return False
        if self.scope is not None:
            return self.scope_dropped
        return not self.collections

    def allows(self, cid: int) -> bool:
        """Send this document of collection `cid` (not a system event)?"""
        if cid == 0:
            return self.default
        if self.legacy or cid not in self.vb_collections:
            return False  # a dropped collection's leftovers
        return self.passthrough or cid in self.collections

    def event(self, item) -> SystemEvent | None:
        """A system event item: the event, if this stream sends it; the filter follows it either way
        (a collection created in the filtered scope joins it; a dropped one leaves)."""
        ev = SystemEvent.of(item)
        e = ev.event
        if e in (SystemEventId.CREATE_SCOPE, SystemEventId.DROP_SCOPE):
            if e == SystemEventId.DROP_SCOPE and ev.scope_id == self.scope:
                self.scope_dropped = True
            if self.legacy or (self.scope is None and not self.passthrough):
                return None
            if self.uid is not None and ev.manifest_uid <= self.uid:
                return None
            return ev if self.passthrough or ev.scope_id == self.scope else None
        cid = ev.collection.uid
        removed = False
        if e == SystemEventId.END_COLLECTION and not self.passthrough and cid in self.collections:
            self.collections.discard(cid)
            removed = True
            if cid == 0:
                self.default = False
        if self.legacy or (self.uid is not None and ev.manifest_uid <= self.uid):
            return None
        if self.passthrough or removed:
            return ev
        if self.scope is not None and ev.scope_id == self.scope:
            if e != SystemEventId.END_COLLECTION:
                self.collections.add(cid)
            return ev
        return ev if cid in self.collections else None

    def stats(self) -> dict[str, int | str]:
        return {"filter_passthrough": int(self.passthrough), "filter_default_allowed": int(self.default),
                "filter_system_allowed": int(not self.legacy), "filter_size": len(self.collections),
                "filter_uid": format(self.uid or 0, "x"),
                **({"filter_scope_id": self.scope, "filter_scope_dropped": int(self.scope_dropped)}
                   if self.scope is not None else {})}
