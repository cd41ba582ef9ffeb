"""The collections manifest of a bucket: its scopes and collections, with their ids and uid.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md (ids, names, the
manifest JSON), https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/collections.md
(system events), https://docs.couchbase.com/server/current/rest-api/scopes-and-collections-api.html.

One place knows the manifest, for both sides that show it: the KV port
(COLLECTIONS_GET_MANIFEST / GET_ID / GET_SCOPE_ID) and the REST API
(`GET /pools/default/buckets/<b>/scopes`). Both use the JSON shape ns_server pushes to kv_engine:
ids and the manifest uid are hex strings, and `{"uid": "0", "scopes": [{"name": "_default", "uid":
"0", "collections": [{"name": "_default", "uid": "0"}]}]}` is the manifest of a new bucket.

A `Manifest` never changes: each change (`add_scope`, `drop_scope`, `add_collection`,
`drop_collection`, `update_collection`, `with_scopes`) returns a new one whose uid is one higher.
Ids come from two counters that only grow (scopes and collections, each from 8: 0 is `_default`,
1-7 are reserved), so an id is never reused and a dropped collection's leftovers can never be
mistaken for a newer collection's documents. The `_default` scope and collection cannot be dropped
here, and only collections other than `_default` keep history or have a maxTTL.

What a change means for a vbucket is a list of `Change`s (`changes`, from the manifest a vbucket
knows to the bucket's): each becomes a *system event* in the vbucket, an Item with a seqno of its
own in the system namespace (`SYSTEM_CID`), as kv_engine weaves system events into its checkpoints;
DCP streams send them, the store keeps them (a drop event is a tombstone that replaces the create
event, both keyed by the collection), and a vbucket rebuilds what it knows from them at warm-up
(vb_collections.py).
"""

import json
import re
from dataclasses import dataclass, field, replace

from dcpflow.protocol.dcp import SystemEventId
from dcpflow.protocol.keys import encode_leb128

from .item import DeleteSource, Item

DEFAULT_SCOPE = "_default"
DEFAULT_COLLECTION = "_default"
#: The first id a user's scope or collection gets (Collections.md: 0 is _default, 1-7 are reserved).
FIRST_USER_ID = 8
#: The collection id under which a vbucket keeps its system events (kv_engine's "System" namespace,
#: engines/ep/docs/collections.md): never a user's collection, so their keys never meet documents'.
SYSTEM_CID = 1
MAX_NAME = 251
_NAME = re.compile(r"[A-Za-z0-9_%-]+")
#: Collection maxTTL: -1 is "never expire" (REST), 0 "as the bucket", up to i32 max seconds.
MAX_TTL = 2_147_483_647


class ManifestError(Exception):
    """A lookup or change the manifest refuses; `kind` says which ("unknown_scope",
    "unknown_collection", "exists", "invalid", "unsupported") so each port can answer in its own terms."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Collection:
    name: str
    uid: int
    max_ttl: int = 0  # seconds; 0 = the bucket's maxTTL applies, -1 = never expire
    history: bool = False

    def to_json(self, *, rest: bool = False) -> dict:
        doc: dict = {"name": self.name, "uid": format(self.uid, "x")}
        if rest or self.max_ttl:  # the REST answer always carries the settings (get-scopes.html)
            doc["maxTTL"] = self.max_ttl
        if rest or self.history:
            doc["history"] = self.history
        return doc


@dataclass(frozen=True)
class Scope:
    name: str
    uid: int
    collections: tuple[Collection, ...] = field(default=())

    def collection(self, name: str) -> Collection:
        for c in self.collections:
            if c.name == name:
                return c
        raise ManifestError("unknown_collection", f"Collection with name {name!r} in scope {self.name!r} is not found")

    def to_json(self, *, rest: bool = False) -> dict:
        return {"name": self.name, "uid": format(self.uid, "x"),
                "collections": [c.to_json(rest=rest) for c in self.collections]}


@dataclass(frozen=True)
class Change:
    """One system event a manifest change makes in a vbucket (system_event.md): its id, the scope,
    and the collection it creates, drops or modifies (None for scope events)."""

    event: SystemEventId
    scope: Scope
    collection: Collection | None = None


@dataclass(frozen=True)
class Manifest:
    uid: int
    scopes: tuple[Scope, ...]
    next_scope_uid: int = FIRST_USER_ID
    next_collection_uid: int = FIRST_USER_ID
    _by_id: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {c.uid: (s, c) for s in self.scopes for c in s.collections}
        object.__setattr__(self, "_by_id", by_id)

    @classmethod
    def default(cls) -> "Manifest":
        """The manifest of a new bucket: `_default._default`, everything id 0, uid 0."""
        return cls(0, (Scope(DEFAULT_SCOPE, 0, (Collection(DEFAULT_COLLECTION, 0),)),))

    # -- lookups ----------------------------------------------------------------------------
    def scope(self, name: str) -> Scope:
        for s in self.scopes:
            if s.name == name:
                return s
        raise ManifestError("unknown_scope", f"Scope with name {name!r} is not found")

    def collection(self, scope: str, name: str) -> Collection:
        return self.scope(scope).collection(name)

    def by_id(self, cid: int) -> tuple[Scope, Collection] | None:
        """(scope, collection) of a collection id, or None if no collection has it."""
        return self._by_id.get(cid)

    def to_json(self, *, rest: bool = False) -> dict:
        return {"uid": format(self.uid, "x"), "scopes": [s.to_json(rest=rest) for s in self.scopes]}

    # -- persistence (the bucket's store, meta "collections_manifest") -------------------------
    def dumps(self) -> str:
        doc = self.to_json(rest=True)
        doc["next_scope_uid"], doc["next_collection_uid"] = self.next_scope_uid, self.next_collection_uid
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "Manifest":
        doc = json.loads(text)
        scopes = tuple(Scope(s["name"], int(s["uid"], 16), tuple(
            Collection(c["name"], int(c["uid"], 16), int(c.get("maxTTL", 0)), bool(c.get("history", False)))
            for c in s["collections"])) for s in doc["scopes"])
        return cls(int(doc["uid"], 16), scopes, int(doc["next_scope_uid"]), int(doc["next_collection_uid"]))

    # -- changes: each returns the next manifest (uid + 1) --------------------------------------
    def _next(self, scopes, **kw) -> "Manifest":
        return replace(self, uid=self.uid + 1, scopes=tuple(scopes), **kw)

    def add_scope(self, name: str) -> "Manifest":
        if name in {s.name for s in self.scopes}:
            raise ManifestError("exists", f"Scope with name {name!r} already exists")
        check_name(name, "scope")
        scope = Scope(name, self.next_scope_uid)
        return self._next((*self.scopes, scope), next_scope_uid=self.next_scope_uid + 1)

    def drop_scope(self, name: str) -> "Manifest":
        scope = self.scope(name)  # an unknown scope is "not found" before anything else
        if scope.uid == 0:
            raise ManifestError("invalid", "Deleting _default scope is not allowed")
        return self._next(s for s in self.scopes if s is not scope)

    def add_collection(self, scope: str, name: str, *, max_ttl: int = 0, history: bool = False) -> "Manifest":
        s = self.scope(scope)
        if any(c.name == name for c in s.collections):
            raise ManifestError("exists", f"Collection with name {name!r} in scope {scope!r} already exists")
        check_name(name, "collection")
        _check_ttl(max_ttl)
        new = Collection(name, self.next_collection_uid, max_ttl, history)
        return self._next(self._with_scope(replace(s, collections=(*s.collections, new))),
                          next_collection_uid=self.next_collection_uid + 1)

    def drop_collection(self, scope: str, name: str) -> "Manifest":
        s = self.scope(scope)
        c = s.collection(name)
        if c.uid == 0:
            raise ManifestError("unsupported", "cannot drop the _default collection: this server keeps it")
        return self._next(self._with_scope(replace(s, collections=tuple(x for x in s.collections if x is not c))))

    def update_collection(self, scope: str, name: str, *, max_ttl: int | None = None,
                          history: bool | None = None) -> "Manifest":
        s = self.scope(scope)
        c = s.collection(name)
        if history and c.uid == 0:
            raise ManifestError("unsupported", "history cannot be kept for the _default collection here: "
                                "create a collection with history=true")
        if max_ttl is not None and c.uid == 0 and max_ttl != c.max_ttl:
            raise ManifestError("unsupported", "the _default collection's maxTTL cannot be changed here: "
                                "create a collection with maxTTL")
        if max_ttl is not None:
            _check_ttl(max_ttl)
        new = replace(c, max_ttl=c.max_ttl if max_ttl is None else max_ttl,
                      history=c.history if history is None else history)
        if new == c:
            return self
        cols = tuple(new if x is c else x for x in s.collections)
        return self._next(self._with_scope(replace(s, collections=cols)))

    def with_scopes(self, wanted: dict[str, list[str]]) -> "Manifest":
        """The manifest with exactly these scopes and their collections (by name), as ns_server's
        "set manifest" asks: existing ones keep their ids and settings, new ones get the next
        ids, missing ones are dropped. This one when nothing changes."""
        if DEFAULT_SCOPE not in wanted:
            raise ManifestError("invalid", "The _default scope cannot be dropped")
        if DEFAULT_COLLECTION not in wanted[DEFAULT_SCOPE]:
            raise ManifestError("unsupported", "cannot drop the _default collection: this server keeps it")
        m = self
        for s in list(m.scopes):
            if s.name not in wanted:
                m = m.drop_scope(s.name)
        for name, cols in wanted.items():
            if len(set(cols)) != len(cols):
                raise ManifestError("invalid", f"Duplicate collection names in scope {name!r}")
            try:
                s = m.scope(name)
            except ManifestError:
                m = m.add_scope(name)
                s = m.scope(name)
            for c in s.collections:
                if c.name not in cols:
                    m = m.drop_collection(name, c.name)
            for c in cols:
                if not any(x.name == c for x in m.scope(name).collections):
                    m = m.add_collection(name, c)
        return self if m.scopes == self.scopes else replace(m, uid=self.uid + 1)

    def _with_scope(self, scope: Scope) -> list[Scope]:
        return [scope if s.uid == scope.uid else s for s in self.scopes]

    @property
    def history_collections(self) -> frozenset[int]:
        return frozenset(c.uid for s in self.scopes for c in s.collections if c.history)


def check_name(name: str, what: str) -> None:
    """Collections.md "A name is not valid": 1 to 251 of A-Z a-z 0-9 _ - %, not starting with _
    or % (those are the system's)."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not _NAME.fullmatch(name):
        raise ManifestError("invalid", f"{what.capitalize()} name {name!r} is not valid: 1 to {MAX_NAME} characters "
                            "of A-Z, a-z, 0-9 and _ - %")
    if name[0] in "_%":
        raise ManifestError("invalid", f"{what.capitalize()} name {name!r} is not valid: it cannot start with _ or %")


def _check_ttl(max_ttl: int) -> None:
    if not -1 <= max_ttl <= MAX_TTL:
        raise ManifestError("invalid", f"maxTTL must be an integer from -1 to {MAX_TTL}")


def changes(old: Manifest, new: Manifest) -> list[Change]:
    """The system events that take a vbucket from `old` to `new`, by id, in kv_engine's order:
    collections dropped, scopes dropped, scopes created, collections created, collections
    modified (their maxTTL or history)."""
    out: list[Change] = []
    new_scopes = {s.uid: s for s in new.scopes}
    old_scopes = {s.uid: s for s in old.scopes}
    for s in old.scopes:
        for c in s.collections:
            if new.by_id(c.uid) is None:
                out.append(Change(SystemEventId.END_COLLECTION, s, c))
    out += [Change(SystemEventId.DROP_SCOPE, s) for s in old.scopes if s.uid not in new_scopes]
    out += [Change(SystemEventId.CREATE_SCOPE, s) for s in new.scopes if s.uid not in old_scopes]
    modified = []
    for s in new.scopes:
        for c in s.collections:
            before = old.by_id(c.uid)
            if before is None:
                out.append(Change(SystemEventId.BEGIN_COLLECTION, s, c))
            elif before[1] != c:
                modified.append(Change(SystemEventId.MODIFY_COLLECTION, s, c))
    return out + modified


# -- system events as the vbucket keeps them -----------------------------------------------------

_COLLECTION_EVENT_KEY, _SCOPE_EVENT_KEY = 0, 1
_DROPS = (SystemEventId.END_COLLECTION, SystemEventId.DROP_SCOPE)


def event_key(change: Change) -> bytes:
    """The key of a system event (engines/ep/docs/collections.md "SystemEvent Key", without the
    namespace, which is the item's cid): the kind, 0 for a collection and 1 for a scope, and the
    LEB128 id. A collection's create, modify and drop share it, so the latest replaces the others."""
    if change.collection is not None:
        return bytes((_COLLECTION_EVENT_KEY,)) + encode_leb128(change.collection.uid)
    return bytes((_SCOPE_EVENT_KEY,)) + encode_leb128(change.scope.uid)


def event_item(change: Change, manifest_uid: int, *, seqno: int, cas: int, now: int) -> Item:
    """The Item a vbucket queues for a change: value = what DCP sends of it, as JSON; flags = the
    event id; a drop is a tombstone."""
    doc: dict = {"uid": manifest_uid, "sid": change.scope.uid, "scope": change.scope.name}
    c = change.collection
    if c is not None:
        doc.update(cid=c.uid, name=c.name, maxTTL=c.max_ttl, history=c.history)
    drop = change.event in _DROPS
    return Item(event_key(change), json.dumps(doc, separators=(",", ":")).encode(), int(change.event), 0, cas, 1,
                seqno, 0x01, drop, now if drop else 0, DeleteSource.EXPLICIT, SYSTEM_CID)


@dataclass(frozen=True, slots=True)
class SystemEvent:
    """A system event Item read back: what DCP encodes (protocol/system_events.py) and what warm-up
    rebuilds a vbucket's collections from."""

    event: SystemEventId
    seqno: int
    manifest_uid: int
    scope_id: int
    scope_name: str
    collection: Collection | None

    @classmethod
    def of(cls, item: Item) -> "SystemEvent":
        doc = json.loads(item.value)
        c = None
        if "cid" in doc:
            c = Collection(doc["name"], doc["cid"], doc["maxTTL"], doc["history"])
        return cls(SystemEventId(item.flags), item.by_seqno, doc["uid"], doc["sid"], doc["scope"], c)
