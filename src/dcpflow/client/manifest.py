"""The bucket's collections manifest as a client sees it, and stream filters given by name.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md (the manifest JSON
that GET_COLLECTIONS_MANIFEST 0xba returns: ids and the uid are hex strings) and
https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request-value.md
(the stream filter: `collections` or `scope`, as hex ids, and `uid` to resume).

People name what they want (`shop`, `shop.orders`); streams filter by id. `Filter` keeps the names
and `Manifest.resolve` turns them into the ids of one manifest. Ids change when a collection or
scope is dropped and made again under the same name: a running read by names follows the new ids
through the stream (follow.py), and a new read resolves the names again.
"""

import json
from typing import NamedTuple

DEFAULT = "_default"


class FilterError(ValueError):
    """A filter names something the manifest does not have, or is malformed."""


class CollectionInfo(NamedTuple):
    scope: str
    name: str
    cid: int
    scope_id: int
    max_ttl: int = 0
    history: bool = False


class Manifest:
    """One manifest: its uid and collections, looked up by id or by name."""

    def __init__(self, uid: int, scopes: dict[str, int], collections: list[CollectionInfo]):
        self.uid = uid
        self.scopes = scopes  # name -> id
        self.collections = {c.cid: c for c in collections}
        self._by_name = {(c.scope, c.name): c for c in collections}
        self.scope_names = {sid: name for name, sid in scopes.items()}

    @classmethod
    def default(cls) -> "Manifest":
        """What a server without collections has: `_default._default` only."""
        return cls(0, {DEFAULT: 0}, [CollectionInfo(DEFAULT, DEFAULT, 0, 0)])

    @classmethod
    def from_json(cls, doc) -> "Manifest":
        if isinstance(doc, bytes | bytearray | str):
            doc = json.loads(doc)
        try:
            scopes, colls = {}, []
            for s in doc["scopes"]:
                sid = int(s["uid"], 16)
                scopes[s["name"]] = sid
                for c in s.get("collections", ()):
                    colls.append(CollectionInfo(s["name"], c["name"], int(c["uid"], 16), sid,
                                                int(c.get("maxTTL", 0)), bool(c.get("history", False))))
            return cls(int(doc["uid"], 16), scopes, colls)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"unusable collections manifest ({e!r}): {str(doc)[:200]}") from None

    def collection(self, scope: str, name: str) -> CollectionInfo | None:
        return self._by_name.get((scope, name))

    def names(self, cid: int) -> tuple[str, str] | None:
        """(scope, collection) of a collection id, or None if this manifest does not have it."""
        c = self.collections.get(cid)
        return None if c is None else (c.scope, c.name)

    def resolve(self, flt: "Filter") -> "Resolved":
        """The ids of the filter's names in this manifest. A missing scope or collection is left out
        (`missing` names it): a caller decides whether that is an error (at start) or a drop."""
        if flt.scope is not None:
            sid = self.scopes.get(flt.scope)
            if sid is None:
                return Resolved(self.uid, None, frozenset(), (flt.scope,))
            cids = frozenset(c.cid for c in self.collections.values() if c.scope_id == sid)
            return Resolved(self.uid, sid, cids, ())
        if flt.ids:
            found = flt.ids & self.collections.keys()
            return Resolved(self.uid, None, frozenset(found), tuple(f"0x{i:x}" for i in sorted(flt.ids - found)))
        found, missing = set(), []
        for scope, name in flt.collections:
            c = self._by_name.get((scope, name))
            if c is None:
                missing.append(f"{scope}.{name}")
            else:
                found.add(c.cid)
        return Resolved(self.uid, None, frozenset(found), tuple(missing))


class Filter(NamedTuple):
    """What a read streams, by name: a whole scope, or collections (scope, name); neither is
    everything the connection sees."""

    scope: str | None = None
    collections: tuple[tuple[str, str], ...] = ()
    #: or collection ids, fixed by whoever resolved the names earlier (the Spark source's planner):
    #: ids are never reused, so a collection made again under a name is not one of them
    ids: frozenset = frozenset()

    @property
    def active(self) -> bool:
        return self.scope is not None or bool(self.collections) or bool(self.ids)

    @classmethod
    def build(cls, scope: str | None = None, collections=None, ids=None) -> "Filter":
        """From a scope name and/or collection names (`scope.collection`, or a bare name meaning
        the `scope`'s collection, else `_default`'s). With both, the collections must be in the
        scope and the filter is the collections. `ids` (collection ids) go alone."""
        if ids is not None:
            if scope is not None or collections:
                raise FilterError("collection ids go alone, without a scope or collection names")
            ids = frozenset(int(i) for i in ids)
            if not ids or any(not 0 <= i < 1 << 32 for i in ids):
                raise FilterError(f"collection ids must be 32-bit ids, at least one: {sorted(ids)!r}")
            return cls(None, (), ids)
        if isinstance(collections, str):
            collections = [c for c in collections.split(",") if c.strip()]
        pairs = []
        for text in collections or ():
            text = text.strip()
            if text.count(".") > 1 or not text.strip("."):
                raise FilterError(f"collection {text!r}: expected scope.collection")
            if "." in text:
                s, _, c = text.partition(".")
            else:
                s, c = scope or DEFAULT, text
            if not s or not c:
                raise FilterError(f"collection {text!r}: expected scope.collection")
            if scope is not None and s != scope:
                raise FilterError(f"collection {text!r} is not in scope {scope!r}")
            if (s, c) not in pairs:
                pairs.append((s, c))
        if pairs:
            return cls(None, tuple(pairs))
        if scope is not None and not scope.strip():
            raise FilterError("scope name is empty")
        return cls(scope, ())

    def describe(self) -> str:
        if self.scope is not None:
            return f"scope {self.scope}"
        if self.ids:
            return "collection ids " + ", ".join(f"0x{i:x}" for i in sorted(self.ids))
        return "collections " + ", ".join(f"{s}.{c}" for s, c in self.collections) if self.collections else "all"


class Resolved(NamedTuple):
    """A filter's ids in one manifest (uid)."""

    uid: int
    scope_id: int | None
    cids: frozenset
    missing: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return self.scope_id is None and not self.cids

    def value(self) -> dict:
        """The stream-request value's filter part (hex ids)."""
        if self.scope_id is not None:
            return {"scope": format(self.scope_id, "x")}
        return {"collections": [format(c, "x") for c in sorted(self.cids)]}


class Names:
    """Every collection and scope id a client has seen named, in any manifest or create event.
    Ids are never reused (Collections.md), so a dropped collection keeps its name here: the drop
    event and the last documents of a dropped collection can still be labelled."""

    def __init__(self):
        self.collections: dict[int, tuple[str, str]] = {0: (DEFAULT, DEFAULT)}
        self.scopes: dict[int, str] = {0: DEFAULT}

    def learn(self, manifest: Manifest) -> None:
        self.scopes.update(manifest.scope_names)
        for cid, c in manifest.collections.items():
            self.collections[cid] = (c.scope, c.name)

    def learn_scope(self, sid: int, name: str) -> None:
        if name:
            self.scopes[sid] = name

    def learn_collection(self, cid: int, sid: int, name: str) -> None:
        if name:
            self.collections[cid] = (self.scopes.get(sid, ""), name)

    def of(self, cid: int) -> tuple[str, str]:
        """(scope, collection) names of a collection id; ("", "") if never seen."""
        return self.collections.get(cid, ("", ""))
