"""The collections manifest of a bucket: its scopes and collections, with their ids and uid.

One place knows the manifest, for both sides that show it: the KV port
(COLLECTIONS_GET_MANIFEST / GET_ID / GET_SCOPE_ID, kv_engine docs/Collections.md) and the REST
API (`GET /pools/default/buckets/<b>/scopes`,
https://docs.couchbase.com/server/current/rest-api/get-scopes.html). Both use the JSON shape
ns_server pushes to kv_engine: ids and the manifest uid are hex strings, and
`{"uid": "0", "scopes": [{"name": "_default", "uid": "0", "collections": [{"name":
"_default", "uid": "0"}]}]}` is the manifest of a new bucket.

Only that default manifest exists today: the engine stores every document in the default
collection (id 0). The classes already carry what user scopes and collections will need - ids,
maxTTL, history, the manifest uid that every change advances - so the collections work fills in
`add_scope` / `add_collection` / drops and persistence here, and both ports follow.
"""

from dataclasses import dataclass, field

DEFAULT_SCOPE = "_default"
DEFAULT_COLLECTION = "_default"


class ManifestError(Exception):
    """A lookup or change the manifest refuses; `kind` says which ("unknown_scope",
    "unknown_collection", "exists", "unsupported") so each port can answer in its own terms."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Collection:
    name: str
    uid: int
    max_ttl: int = 0  # seconds; 0 = the bucket's maxTTL applies
    history: bool = False

    def to_json(self, *, rest: bool = False) -> dict:
        doc: dict = {"name": self.name, "uid": format(self.uid, "x")}
        if rest:  # the REST answer also carries the settings (get-scopes.html)
            doc["maxTTL"] = self.max_ttl
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
class Manifest:
    uid: int
    scopes: tuple[Scope, ...]

    @classmethod
    def default(cls) -> "Manifest":
        """The manifest of a new bucket: `_default._default`, everything id 0, uid 0."""
        return cls(0, (Scope(DEFAULT_SCOPE, 0, (Collection(DEFAULT_COLLECTION, 0),)),))

    def scope(self, name: str) -> Scope:
        for s in self.scopes:
            if s.name == name:
                return s
        raise ManifestError("unknown_scope", f"Scope with name {name!r} is not found")

    def collection(self, scope: str, name: str) -> Collection:
        return self.scope(scope).collection(name)

    def to_json(self, *, rest: bool = False) -> dict:
        return {"uid": format(self.uid, "x"), "scopes": [s.to_json(rest=rest) for s in self.scopes]}

    # -- changes: the collections work implements these; until then they are refused clearly --
    def add_scope(self, name: str) -> "Manifest":
        if name in {s.name for s in self.scopes}:
            raise ManifestError("exists", f"Scope with name {name!r} already exists")
        raise _unsupported(f"create scope {name!r}")

    def drop_scope(self, name: str) -> "Manifest":
        self.scope(name)  # an unknown scope is "not found" before anything else
        raise _unsupported(f"drop scope {name!r}")

    def add_collection(self, scope: str, name: str, *, max_ttl: int = 0, history: bool = False) -> "Manifest":
        if any(c.name == name for c in self.scope(scope).collections):
            raise ManifestError("exists", f"Collection with name {name!r} in scope {scope!r} already exists")
        raise _unsupported(f"create collection {scope}.{name}")

    def with_scopes(self, wanted: dict[str, list[str]]) -> "Manifest":
        """The manifest with exactly these scopes and their collections (by name), as ns_server's
        "set manifest" asks: this one when it already is."""
        have = {s.name: sorted(c.name for c in s.collections) for s in self.scopes}
        if {name: sorted(cols) for name, cols in wanted.items()} == have:
            return self
        raise _unsupported("set a manifest with other scopes or collections")

    def drop_collection(self, scope: str, name: str) -> "Manifest":
        self.collection(scope, name)
        raise _unsupported(f"drop collection {scope}.{name}")

    def update_collection(self, scope: str, name: str, *, max_ttl: int | None = None,
                          history: bool | None = None) -> "Manifest":
        self.collection(scope, name)
        raise _unsupported(f"update collection {scope}.{name}")


def _unsupported(what: str) -> ManifestError:
    return ManifestError("unsupported", f"cannot {what}: this server stores every document in "
                         f"{DEFAULT_SCOPE}.{DEFAULT_COLLECTION} and does not support user scopes and collections yet")
