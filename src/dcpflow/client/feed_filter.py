"""The collections one read streams, over its life: a Feed's filter (stream-request-value.md).

A read filtered by scope, collection names or ids asks each stream request for the ids its filter
has in the bucket's manifest. They are resolved when the read starts (every name must exist then)
and may only shrink later: a scope or ids read whose stream request meets UNKNOWN_SCOPE or
UNKNOWN_COLLECTION resolves again and goes on with what is left. A read by collection names
follows its names instead (follow.py): a collection made again under a name has a new id, which a
filter resolved now would never send, so the vbucket's stream is *widened* to the names' scope (or
to no filter) and the names are picked out client-side.

The Feed (streams.py) owns the streams and the connections; this class owns the filter's state and
the manifest look-ups, and says what each stream request asks for.
"""

from .errors import ClientError, ServerError
from .follow import NameFollower
from .manifest import Filter, FilterError, Resolved


class FeedFilter:
    """`resolved` is the filter's ids now (None: the read is not filtered), `follow` the name
    follower of a read by collection names, `wide` the filter of its widened streams (None: to be
    looked up again before the next reopen)."""

    __slots__ = ("client", "filter", "resolved", "follow", "wide")

    def __init__(self, client, flt: Filter | None):
        self.client = client
        self.filter = flt
        self.resolved: Resolved | None = None
        self.follow: NameFollower | None = None
        self.wide: dict | None = None

    async def start(self, on_drop) -> None:
        """Resolve the filter (every name must exist); a read by names starts following them, and
        `on_drop(vbucket)` hears of the drop of one of its collections in a vbucket."""
        flt = self.filter
        if flt is None or not flt.active:
            return
        self.resolved = await self.resolve(initial=True)
        if flt.collections:
            self.follow = NameFollower(flt.collections, self.resolved.cids, self.client.names)
            self.follow.on_drop = on_drop

    @property
    def empty(self) -> bool:
        """Every collection of the filter is gone: nothing is left to read."""
        return self.resolved is not None and self.resolved.empty

    def check(self, conn, history: bool) -> str | None:
        """Why `conn` cannot serve this read (None if it can): a filter or history needs HELLO
        Collections."""
        if (self.resolved is not None or history) and not conn.collections:
            return "filter by " + self.filter.describe() if self.resolved is not None else "send history"
        return None

    def request_body(self, vbucket: int) -> dict:
        """What a stream request of `vbucket` filters on: the widened filter, or the ids."""
        if self.follow is not None and vbucket in self.follow.widened:
            return dict(self.wide or {})
        if self.resolved is not None:
            return self.resolved.value()
        return {}

    async def resolve(self, initial: bool = False) -> Resolved:
        """The filter's ids in the bucket's manifest now. At the start every name must exist; later
        (a scope or ids read whose stream request met UNKNOWN_SCOPE/COLLECTION) the ids can only
        shrink. A read by collection names does not come here again: it follows its names through
        the stream itself (follow.py), since a collection made again under a name may hold
        documents before this stream's position, which a filter added now would never send."""
        manifest = await self.client.manifest()
        if initial and not self.client.collections_enabled:
            raise ClientError(f"the server does not support collections (HELLO Collections), so it cannot filter "
                              f"by {self.filter.describe()}")
        got = manifest.resolve(self.filter)
        if initial:
            if got.missing and not self.filter.ids:  # ids resolved earlier may be dropped by now
                raise FilterError(f"bucket {self.client.bucket!r} has no {', '.join(got.missing)} (manifest uid "
                                  f"{manifest.uid:x})")
            return got
        old = self.resolved
        if old.scope_id is not None:
            return got if got.scope_id == old.scope_id else old._replace(uid=got.uid, scope_id=None, cids=frozenset())
        return got._replace(cids=old.cids & got.cids)

    def widen(self, vbucket: int, *, scope_gone: bool = False) -> None:
        """`vbucket`'s stream leaves its id filter for a widened one (follow.py); `scope_gone`: the
        scope the widened streams filtered on may be gone, look it up again."""
        self.follow.widen(vbucket)
        if scope_gone:
            self.wide = None

    async def prepare_reopen(self) -> None:
        """Before widened streams reopen: the filter they ask for, if not known."""
        if self.follow is not None and self.wide is None and self.follow.widened:
            self.wide = await self._widened_filter()

    async def _widened_filter(self) -> dict:
        """The filter of widened streams: the names' scope when they share one that exists now,
        else none (the client then picks the names' collections out of everything)."""
        scopes = {scope for scope, _ in self.filter.collections}
        if len(scopes) != 1:
            return {}
        try:
            manifest = await self.client.manifest()
        except ServerError:
            return {}
        sid = manifest.scopes.get(next(iter(scopes)))
        return {} if sid is None else {"scope": format(sid, "x")}
