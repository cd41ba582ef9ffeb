"""The collections of one vbucket: what its system events say exists, and counts per collection.

Page: https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/collections.md
("Collections::VB::Manifest"). The bucket's manifest (collections.py) is what the cluster asked
for; a vbucket follows it through system events of its own (`VBucket.apply_collection_changes`),
and what those events say is this: the scopes and collections the vbucket has, the manifest uid
its last event carried, and for DCP and GET_ALL_VB_SEQNOS each collection's high seqno (its
create event's seqno until a document is written). Warm-up rebuilds it from the system events on
disk (`load_event`), so a vbucket that missed an event in a crash is brought up to the bucket's
manifest by the events it is still owed.

The default collection's high seqno costs the write path nothing: every seqno that is not the
default collection's goes through `note_other`, so the vbucket's high seqno is the default
collection's whenever it lies above the last of those, and otherwise the value noted then.
"""

from dcpflow.protocol.dcp import SystemEventId

from .collections import DEFAULT_COLLECTION, DEFAULT_SCOPE, Change, Collection, Manifest, Scope, SystemEvent


class VBCollections:
    __slots__ = ("uid", "collections", "scope_of", "scopes", "items", "high", "other_high", "default_high",
                 "history", "dropped_at")

    def __init__(self) -> None:
        self.uid = 0
        self.collections: dict[int, Collection] = {0: Collection(DEFAULT_COLLECTION, 0)}
        self.scope_of: dict[int, int] = {0: 0}  # collection id -> scope id
        self.scopes: dict[int, str] = {0: DEFAULT_SCOPE}
        self.items: dict[int, int] = {}  # live documents of each collection but the default one
        self.high: dict[int, int] = {}  # high seqno of each collection but the default one
        self.other_high = 0  # the last seqno that is not the default collection's
        self.default_high = 0  # the default collection's high seqno as of other_high
        self.history: frozenset[int] = frozenset()  # collections that keep history
        self.dropped_at: dict[int, int] = {}  # collection id -> seqno of its drop event, since the start

    def __contains__(self, cid: int) -> bool:
        return cid in self.collections

    def max_ttl(self, cid: int) -> int:
        c = self.collections.get(cid)
        return c.max_ttl if c is not None else 0

    def as_manifest(self) -> Manifest:
        """What the vbucket knows, as a manifest (to diff against the bucket's)."""
        scopes = tuple(Scope(name, sid, tuple(c for cid, c in self.collections.items() if self.scope_of[cid] == sid))
                       for sid, name in self.scopes.items())
        return Manifest(self.uid, scopes)

    # -- seqnos ---------------------------------------------------------------------------------
    def note_other(self, seqno: int, high_before: int) -> None:
        """A seqno that is not the default collection's (module docstring)."""
        if high_before > self.other_high:
            self.default_high = high_before  # every seqno above other_high was the default collection's
        self.other_high = seqno

    def high_seqno(self, cid: int, vb_high: int) -> int:
        if cid == 0:
            return vb_high if vb_high > self.other_high else self.default_high
        return self.high.get(cid, 0)

    def count(self, cid: int, vb_items: int) -> int:
        """Live documents of a collection (the default one's: what the others leave of the vbucket's)."""
        if cid == 0:
            return vb_items - sum(self.items.values())
        return self.items.get(cid, 0)

    # -- events -----------------------------------------------------------------------------------
    def apply(self, change: Change, seqno: int) -> None:
        e, c, sid = change.event, change.collection, change.scope.uid
        if e == SystemEventId.CREATE_SCOPE:
            self.scopes[sid] = change.scope.name
        elif e == SystemEventId.DROP_SCOPE:
            self.scopes.pop(sid, None)
        elif e == SystemEventId.END_COLLECTION:
            self.dropped_at[c.uid] = seqno
            self.collections.pop(c.uid, None)
            self.scope_of.pop(c.uid, None)
            self.items.pop(c.uid, None)
            self.high.pop(c.uid, None)
        else:  # BEGIN_COLLECTION, MODIFY_COLLECTION
            if c.uid not in self.collections:
                self.items[c.uid] = 0
            self.collections[c.uid] = c
            self.scope_of[c.uid] = sid
            self.high[c.uid] = max(self.high.get(c.uid, 0), seqno)
        self.history = frozenset(cid for cid, col in self.collections.items() if col.history)

    def load_event(self, event: SystemEvent) -> None:
        """A system event read at warm-up (in seqno order): only the latest of each collection or
        scope is on disk, and a drop is a tombstone."""
        c = event.collection
        scope = Scope(event.scope_name, event.scope_id)
        if event.event in (SystemEventId.BEGIN_COLLECTION, SystemEventId.MODIFY_COLLECTION):
            # the scope's own create event may have been replaced (by nothing: scopes are never
            # modified) - it exists while one of its collections does
            self.scopes.setdefault(event.scope_id, event.scope_name)
        self.apply(Change(event.event, scope, c), event.seqno)
        self.uid = max(self.uid, event.manifest_uid)
